"""Input and parameter checks shared by the linear estimators, the CV estimators and the path
functions: one validation path for all of them.

Parameters. :data:`PARAMETERS` is the one declarative table (scikit-learn's
``_parameter_constraints`` form): every estimator's ``_parameter_constraints`` and every path
function's ``@validate_params`` take their entries from it (:func:`constraints`), so
``alpha_max(fit_intercept="no")`` is refused exactly as ``SparseLinearRegression(
fit_intercept="no").fit`` is, with an ``InvalidParameterError`` (a ``ValueError``) naming the
parameter and what it accepts. Numbers are :class:`NumberInterval` s, which refuse ``True`` /
``False`` (scikit-learn's ``Interval`` takes a bool for the number 1 or 0). A new estimator or
function adds its own entries to the table.

Refused calls. :func:`fit_context` is scikit-learn's ``_fit_context`` plus the rule that a
refused (or interrupted) fit leaves the estimator as it was: its attributes are restored when
``fit`` raises (:func:`unchanged_on_error`), so ``classes_``, ``n_features_in_`` or a previous fit
survive a call that fails halfway.

Data. scikit-learn's validation converts ``X`` and a numeric ``y`` with NumPy, whose error for
text (``could not convert string to float: 'a'``) names neither the argument nor what to do. The
checks here run first, on the inputs that can hold text (object, string or bytes dtype), and
raise a ``ValueError`` that names the argument, shows an offending value and says how to fix it;
everything else goes to scikit-learn's ``validate_data`` / ``check_X_y`` unchanged (a NumPy array
of numbers is not converted twice). A non-string, non-numeric entry (a dict, a list) keeps
NumPy's ``TypeError``, which scikit-learn's estimator checks expect. Class labels are checked in
one place (:func:`class_labels`) for the classifiers and the path functions.
"""

from __future__ import annotations

import contextlib
import functools
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import _fit_context
from sklearn.utils import check_array
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets

from .solvers import SOLVERS

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sk_validate_data
except ImportError:  # pragma: no cover - older scikit-learn
    def _sk_validate_data(est, *args, **kwargs):
        return est._validate_data(*args, **kwargs)

__all__ = ["PARAMETERS", "NumberInterval", "check_numeric", "check_path_data", "class_labels",
           "constraints", "fit_context", "unchanged_on_error", "validate_data"]


class NumberInterval(Interval):
    """scikit-learn's ``Interval`` that refuses bools: ``alpha=True`` is a mistake, not 1.0."""

    def is_satisfied_by(self, val):
        return not isinstance(val, (bool, np.bool_)) and super().is_satisfied_by(val)


def _real(left, right, closed):
    return NumberInterval(Real, left, right, closed=closed)


def _int(left, right, closed):
    return NumberInterval(Integral, left, right, closed=closed)


#: The parameters of the linear estimators and path functions and what each accepts.
PARAMETERS: dict = {
    "penalty": [str, HasMethods(["omega", "prox"])],
    "penalty_params": [dict, None],
    "alpha": [_real(0, None, "left")],
    "solver": [StrOptions({"auto", *SOLVERS})],
    "tol": [_real(0, None, "neither")],
    "max_iter": [_int(1, 2 ** 53, "both"), None],
    "fit_intercept": ["boolean"],
    "warm_start": ["boolean"],
    "scaling": [StrOptions({"dropout", "none"})],
    "solver_params": [dict, None],
    "verbose": ["verbose"],
    "positive": ["boolean"],
    "penalty_weights": ["array-like", None],
    "l1_ratio": [_real(0, 1, "both")],
    # groups of features, the start of nonconvex fits (dualdrop.linear._groups, ._start)
    "groups": [_int(1, None, "left"), "array-like", None],
    "group_l1_ratio": [_real(0, 1, "both")],
    "start": [StrOptions({"best", "convex", "zero"})],
    # the GLM estimators (dualdrop.linear.glm, .multinomial)
    "datafit": [str, HasMethods(["value", "raw_grad", "raw_hess"])],
    "datafit_params": [dict, None],
    "delta": [_real(0, None, "neither")],
    "quantile": [_real(0, 1, "neither")],
    "smoothing": [_real(0, None, "neither"), None],
    "grouped": ["boolean"],
    # cross-validation and paths
    "alphas": [_int(1, None, "left"), "array-like"],
    "eps": [_real(0, 1, "neither")],
    "cv": ["cv_object"],
    # joblib's convention: None (1), a positive count, or -1, -2, ... (all cores, all but one)
    "n_jobs": [_int(1, None, "left"), _int(None, -1, "right"), None],
    "n_alphas": [_int(1, None, "left")],
    "alpha_min_ratio": [_real(0, 1, "neither")],
    "X": ["array-like", "sparse matrix"],
    "y": ["array-like"],
    "Y": ["array-like"],
    "sample_weight": ["array-like", _real(0, None, "left"), None],
}


def constraints(*names, **extra) -> dict:
    """The entries ``names`` of :data:`PARAMETERS`, plus ``extra`` (``{name: [constraint,
    ...]}`` for a parameter of one caller only)."""
    return {**{n: PARAMETERS[n] for n in names}, **extra}


@contextlib.contextmanager
def unchanged_on_error(obj):
    """Restore ``obj``'s attributes if the block raises (any exception, Ctrl-C included): a
    refused call leaves the object as given. The copy is shallow: the block must replace
    attributes, never change their contents in place (fits set new arrays)."""
    saved = dict(vars(obj))
    try:
        yield obj
    except BaseException:
        vars(obj).clear()
        vars(obj).update(saved)
        raise


def fit_context(fit):
    """Decorator of ``fit``: scikit-learn's ``_fit_context`` (every parameter validated against
    ``_parameter_constraints`` before anything runs) and :func:`unchanged_on_error`."""
    checked = _fit_context(prefer_skip_nested_validation=True)(fit)

    @functools.wraps(fit)
    def wrapper(est, *args, **kwargs):
        with unchanged_on_error(est):
            return checked(est, *args, **kwargs)

    return wrapper


def class_labels(y, name="y", sample_weight=None):
    """The sorted classes of ``y`` for a logistic fit; ``ValueError`` naming ``y`` for a
    continuous target or a single class, and naming ``sample_weight`` for a class whose samples
    all weigh 0 (its intercept would run to minus infinity: +-460 came back, silently)."""
    try:
        check_classification_targets(y)
    except ValueError as exc:
        raise ValueError(
            f"{name} must hold class labels for a logistic (classification) fit: {exc}. For a "
            "numeric target use SparseLinearRegression (datafit='quadratic')") from None
    classes = np.unique(y)
    if classes.size < 2:
        raise ValueError(f"{name} has only one class ({classes[0]!r}); a logistic fit needs "
                         "samples of at least 2 classes")
    if sample_weight is not None:
        from .datafits import real_sample_weight

        sw = real_sample_weight(sample_weight)
        yy = np.asarray(y)
        if sw.ndim == 1 and sw.shape == yy.shape[:1]:
            for c in classes:
                if not np.any(sw[yy == c] > 0):
                    raise ValueError(
                        f"sample_weight is 0 on every sample of class "
                        f"{(c.item() if isinstance(c, np.generic) else c)!r}: a class the fit "
                        "cannot see (its intercept would run to minus infinity); drop that "
                        f"class's samples from X and {name}, or give them a positive weight")
    return classes

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
    ``y`` finite, class labels checked by :func:`class_labels` (``ValueError`` naming ``y``)."""
    check_numeric(X, "X", _X_FIX)
    y_arr = np.asarray(y)
    if y_arr.ndim != 1:
        raise ValueError(f"y must be 1-D, got an array of shape {y_arr.shape}")
    if y_numeric:
        check_numeric(y_arr, "y", _Y_FIX)
        y_arr = y_arr.astype(np.float64)
        check_finite_target(y_arr)
    else:
        class_labels(y_arr)
    X = check_array(X, accept_sparse="csc", dtype=np.float64, input_name="X")
    if X.shape[0] != y_arr.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples but y has {y_arr.shape[0]}; pass one target "
                         "per row of X")
    return X, y_arr
