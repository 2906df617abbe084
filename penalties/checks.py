"""Scalar argument checks, the one home for every package (torch-free, numpy-free).

Nothing is coerced silently: a wrong type or a value out of range raises an error that names the
argument, says what it must be and shows what was given. One rule for bounds: ``low`` / ``high``
are *closed* unless ``low_open`` / ``high_open`` say otherwise (a caller states an open bound
where the mathematics needs one, e.g. a strength ``lam > 0``). Type errors raise ``type_error``
(``TypeError``, the Python convention; ``penalties``' array entry points pass ``ValueError``,
their documented error for any bad input).
"""

from __future__ import annotations

import math
import numbers


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (text, a complex number, an object): a ``TypeError`` by
    Python's convention, and a ``ValueError`` too, the documented error of ``penalties``' array
    entry points for any bad input (so either ``except`` clause catches it)."""


def check_float(name: str, value, *, low=None, high=None, low_open: bool = False,
                high_open: bool = False, type_error: type[Exception] = TypeError) -> float:
    """``value`` as a finite float in ``[low, high]`` (ends open where asked)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise type_error(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    _check_bounds(name, value, low, high, low_open, high_open)
    return value


def check_int(name: str, value, *, low=None, high=None, low_open: bool = False,
              high_open: bool = False, type_error: type[Exception] = TypeError) -> int:
    """``value`` as an int in ``[low, high]`` (ends open where asked); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise type_error(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    _check_bounds(name, value, low, high, low_open, high_open)
    return value


def check_choice(name: str, value, choices):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def _check_bounds(name, value, low, high, low_open, high_open) -> None:
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value!r}")
