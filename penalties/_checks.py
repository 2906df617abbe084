"""Input validation shared by every public entry point of ``penalties``.

Nothing is coerced silently: integer and floating arrays are accepted (integers are widened to
float64, which is exact for the magnitudes that matter), everything else raises a ``ValueError``
that names the argument and says what to pass instead.
"""

from __future__ import annotations

import numbers

import numpy as np


def as_real_array(x, name: str, *, allow_inf: bool = False) -> np.ndarray:
    """Return ``x`` as a float64 ndarray, rejecting non-real dtypes, NaN and (by default) inf."""
    if isinstance(x, (str, bytes)) or x is None:
        raise ValueError(f"{name} must be a real number or an array of real numbers, got {type(x).__name__}")
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # ragged nested sequences
        raise ValueError(f"{name} must be a rectangular array of real numbers; got a ragged "
                         f"nested sequence ({exc})") from None
    if arr.dtype == object:
        raise ValueError(
            f"{name} must be a numeric array; got an object array (ragged lists or mixed types?). "
            "Pass a numpy float array."
        )
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(
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
    """Validate a scalar hyperparameter and return it as float (or int when ``integer``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}.")
    if integer:
        if not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}.")
        value = int(value)
    else:
        value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    if low is not None and (value <= low if low_open else value < low):
        op = ">" if low_open else ">="
        raise ValueError(f"{name} must be {op} {low}, got {value!r}.")
    if high is not None and (value >= high if high_open else value > high):
        op = "<" if high_open else "<="
        raise ValueError(f"{name} must be {op} {high}, got {value!r}.")
    return value


def finish(out: np.ndarray, like: np.ndarray):
    """Return a Python float for 0-d inputs, the array otherwise."""
    if np.ndim(like) == 0:
        return float(out)
    return out
