"""Input checks shared by the linear estimators, the CV estimators and the path functions.

scikit-learn's validation converts ``X`` and a numeric ``y`` with NumPy, whose error for text
(``could not convert string to float: 'a'``) names neither the argument nor what to do. The
checks here run first, on the inputs that can hold text (object, string or bytes dtype), and
raise a ``ValueError`` that names the argument, shows an offending value and says how to fix it;
everything else goes to scikit-learn's ``validate_data`` / ``check_X_y`` unchanged (a NumPy array
of numbers is not converted twice). A non-string, non-numeric entry (a dict, a list) keeps
NumPy's ``TypeError``, which scikit-learn's estimator checks expect.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_array

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sk_validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _sk_validate_data(est, *args, **kwargs):
        return est._validate_data(*args, **kwargs)

__all__ = ["check_numeric", "check_path_data", "validate_data"]

_X_FIX = ("encode text or categorical columns as numbers first (e.g. "
          "sklearn.preprocessing.OneHotEncoder or OrdinalEncoder), or convert X with "
          "X.astype(float) if its entries are numbers stored as text")
_Y_FIX = ("a regression target must hold numbers: convert y with y.astype(float) if its "
          "entries are numbers stored as text; for class labels use SparseLogisticRegression")


def _first_bad(a):
    """The first entry of ``a`` (an object/str array) that ``float()`` refuses, or ``None``."""
    for v in np.asarray(a, dtype=object).ravel():
        if isinstance(v, (str, bytes, np.str_, np.bytes_)):
            try:
                float(v)
            except ValueError:
                return v
    return None


def check_numeric(a, name, fix):
    """``ValueError`` naming ``name`` when ``a`` holds text that is not a number."""
    if a is None or sp.issparse(a):
        return
    kind = getattr(getattr(a, "dtype", None), "kind", None)
    if kind is None:  # a list, a DataFrame (its dtypes): look at the array NumPy would build
        if hasattr(a, "dtypes"):
            if all(getattr(d, "kind", "O") not in "OUS" for d in np.atleast_1d(a.dtypes)):
                return
        try:
            a = np.asarray(a)
        except (TypeError, ValueError):
            return  # ragged or odd input: scikit-learn's own error
        kind = a.dtype.kind
    if kind not in "OUS":
        return
    bad = _first_bad(a)
    if bad is not None:
        raise ValueError(f"{name} must be numeric, got text such as {str(bad)!r} "
                         f"(dtype {np.asarray(a).dtype}); {fix}")


def check_finite_target(y, name="y"):
    """``ValueError`` naming ``y`` for a NaN or infinite target value."""
    bad = ~np.isfinite(y)
    if np.any(bad):
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ValueError(f"{name} contains NaN or infinity (first at index {i}); remove those "
                         f"samples or impute their target before fitting")


def validate_data(est, X, y="no_validation", **kwargs):
    """scikit-learn's ``validate_data`` after the text checks of the module docstring (``y``
    only when ``y_numeric=True``: class labels may be strings)."""
    check_numeric(X, "X", _X_FIX)
    if kwargs.get("y_numeric") and not isinstance(y, str):
        check_numeric(y, "y", _Y_FIX)
    return _sk_validate_data(est, X, y, **kwargs)


def check_path_data(X, y, *, y_numeric):
    """``(X, y)`` for the path functions: ``X`` float64 (CSC when sparse), ``y`` 1-D; a numeric
    ``y`` finite (``ValueError`` naming ``y``), class labels as given."""
    check_numeric(X, "X", _X_FIX)
    y_arr = np.asarray(y)
    if y_arr.ndim != 1:
        raise ValueError(f"y must be 1-D, got an array of shape {y_arr.shape}")
    if y_numeric:
        check_numeric(y_arr, "y", _Y_FIX)
        y_arr = y_arr.astype(np.float64)
        check_finite_target(y_arr)
    X = check_array(X, accept_sparse="csc", dtype=np.float64)
    if X.shape[0] != y_arr.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has {y_arr.shape[0]}; pass one target "
                         "per row of X")
    return X, y_arr
