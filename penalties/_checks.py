"""Input validation shared by every public entry point of ``penalties``.

Nothing is coerced silently: integer and floating arrays are accepted (integers are widened to
float64, which is exact for the magnitudes that matter), everything else raises a ``ValueError``
that names the argument and says what to pass instead.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import checks
from .checks import ArgumentTypeError


def as_real_array(x, name: str, *, allow_inf: bool = False) -> np.ndarray:
    """Return ``x`` as a float64 ndarray, rejecting non-real dtypes (an
    :class:`~penalties.checks.ArgumentTypeError`, both a ``TypeError`` and a ``ValueError``), NaN
    and (by default) inf (``ValueError``), each naming ``name``."""
    if isinstance(x, (str, bytes)) or x is None:
        raise ArgumentTypeError(f"{name} must be a real number or an array of real numbers, got {type(x).__name__}")
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} must be a rectangular array of real numbers; got a ragged "
                         f"nested sequence ({exc})") from None
    if arr.dtype == object:
        raise ArgumentTypeError(
            f"{name} must be a numeric array; got an object array (ragged lists or mixed types?). "
            "Pass a numpy float array."
        )
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ArgumentTypeError(
            f"{name} must have a real integer or floating dtype, got dtype {arr.dtype}. "
            "Convert it explicitly, e.g. np.asarray(x, dtype=float)."
        )
    arr = arr.astype(np.float64, copy=False)
    if np.isnan(arr).any():
        idx = np.argwhere(np.isnan(arr))[0]
        raise ValueError(f"{name} contains NaN (first at index {tuple(int(i) for i in idx)}); remove or impute it.")
    if not allow_inf and np.isinf(arr).any():
        idx = np.argwhere(np.isinf(arr))[0]
        raise ValueError(
            f"{name} contains inf (first at index {tuple(int(i) for i in idx)}); only finite values are allowed."
        )
    return arr


def as_positive_array(x, name: str) -> np.ndarray:
    """Float64 array of finite, strictly positive values."""
    arr = as_real_array(x, name)
    if (arr <= 0).any():
        bad = arr[arr <= 0].flat[0]
        raise ValueError(f"{name} must be > 0 everywhere, got {bad!r}.")
    return arr


def check_param(value, name: str, *, low=None, high=None, low_open=True, high_open=True, integer=False):
    """A scalar hyperparameter as float (or int when ``integer``): :mod:`penalties.checks` with
    this package's conventions (bounds of a penalty's parameter are open unless said otherwise;
    every bad input is a ``ValueError``)."""
    check = checks.check_int if integer else checks.check_float
    if integer and isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    return check(name, value, low=low, high=high, low_open=low_open, high_open=high_open,
                 type_error=ValueError)


def finish(out: np.ndarray, like: np.ndarray):
    """Return a Python float for 0-d inputs, the array otherwise."""
    if np.ndim(like) == 0:
        return float(out)
    return out
