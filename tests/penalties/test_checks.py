"""The one scalar argument checker (``penalties.checks``): closed bounds unless asked, bools and
non-numbers refused with the error type the caller chose."""

import pytest

from penalties.checks import check_choice, check_float, check_int


@pytest.mark.parametrize("kw, value, ok", [
    ({"low": 0.0}, 0.0, True), ({"low": 0.0, "low_open": True}, 0.0, False),
    ({"high": 1.0}, 1.0, True), ({"high": 1.0, "high_open": True}, 1.0, False),
    ({"low": 0.0}, -1e-300, False), ({}, float("inf"), False)])
def test_bounds_are_closed_unless_open(kw, value, ok):
    if ok:
        assert check_float("x", value, **kw) == value
    else:
        with pytest.raises(ValueError, match="x must be"):
            check_float("x", value, **kw)


@pytest.mark.parametrize("bad", [True, "1", None, 1j])
def test_type_errors_name_the_argument(bad):
    with pytest.raises(TypeError, match="x must be a real number"):
        check_float("x", bad)
    with pytest.raises(ValueError, match="x must be a real number"):
        check_float("x", bad, type_error=ValueError)


def test_int_and_choice():
    assert check_int("n", 3, low=1) == 3
    with pytest.raises(TypeError, match="n must be an integer"):
        check_int("n", 2.5)
    with pytest.raises(ValueError, match="n must be >= 1"):
        check_int("n", 0, low=1)
    with pytest.raises(ValueError, match="mode must be one of"):
        check_choice("mode", "c", ("a", "b"))
