"""Cox's proportional hazards model (Cox 1972) with Breslow's handling of tied times.

``y`` holds two columns per sample: the observed time ``t_i`` and the event indicator ``s_i``
(1: the event happened at ``t_i``; 0: censored at ``t_i``). The loss is the negative log partial
likelihood, averaged over the samples (skglm's and glmnet's scaling)::

    L(z) = (1/n) sum_i sw_i s_i [ -z_i + log sum_{j : t_j >= t_i} sw_j exp(z_j) - log sw_i ]

the risk set of ``i`` holding every sample still at risk at ``t_i``, tied times included
(Breslow 1974). Sample weights multiply both a sample's own term and its place in the risk
sets, so integer weights are repeated samples (the same gradient, hence the same fit); the
constant ``- log sw_i`` (0 without weights) keeps ``L >= 0`` (the risk set of ``i`` holds ``i``)
and the same for weights multiplied by any constant. A constant shift of ``z`` leaves ``L``
unchanged: the model has no intercept.

With ``S_i = sum_{j : t_j >= t_i} sw_j e^{z_j}`` (one reverse cumulative sum over the samples
sorted by time, O(n) per evaluation after one sort)::

    dL/dz_k = (sw_k / n) [ -s_k + e^{z_k} sum_{i : t_i <= t_k} sw_i s_i / S_i ]

The Hessian is that second term on the diagonal minus a positive semidefinite sum of rank-one
terms (one per event), so its diagonal part ``a_k = (sw_k / n) e^{z_k} sum_{i : t_i <= t_k}
sw_i s_i / S_i`` is an upper bound: the model the proximal Newton solver minimizes, with a
line search on ``L`` (skglm's choice too).
"""

from __future__ import annotations

import numpy as np

from ..datafits import WeightedDatafit


class Cox(WeightedDatafit):
    """Cox's negative log partial likelihood, Breslow's ties (module docstring). ``y`` is an
    ``(n, 2)`` array ``[time, event]``."""

    code = 6
    name = "cox"
    has_intercept = False

    def __init__(self, sample_weight=None):
        super().__init__(sample_weight)
        self._key = None

    def check_target(self, y):
        """``y`` as an ``(n, 2)`` float array ``[time, event]``. Accepts that array, or a
        structured array with a boolean and a float field (scikit-survival's ``Surv``)."""
        return survival_target(y)

    def _setup(self, y):
        """The sort by time and the tie blocks of ``y`` (cached for the same array)."""
        key = (id(y), y.shape, y.ctypes.data)
        if self._key == key:
            return
        t = y[:, 0]
        order = np.argsort(t, kind="stable")
        ts = t[order]
        self._order = order
        self._first = np.searchsorted(ts, ts, side="left")  # start of each sorted tie block
        self._last = np.searchsorted(ts, ts, side="right") - 1
        self._sws = (np.ones(t.shape[0]) if self.sample_weight is None
                     else self.sample_weight)[order]
        self._events = y[order, 1] * self._sws
        self._key = key

    def _risk(self, y, z):
        """Sorted ``(e, S)``: ``sw e^z`` and the risk-set sums ``S_i`` of the sorted samples."""
        self._setup(y)
        zs = z[self._order]
        with np.errstate(over="ignore"):
            e = self._sws * np.exp(zs - np.max(zs))  # shifted: L is invariant, e stays finite
        rev = np.cumsum(e[::-1])[::-1]
        return zs, e, rev[self._first], float(np.max(zs))

    def value(self, y, z):
        zs, e, S, shift = self._risk(y, z)
        ev = self._events
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(ev > 0, -zs + shift + np.log(S) - np.log(self._sws), 0.0)
        return float(ev @ terms) / y.shape[0]

    def grad_hess(self, y, z):
        zs, e, S, _ = self._risk(y, z)
        ev = self._events
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.cumsum(np.where(ev > 0, ev / S, 0.0))[self._last]
        n = y.shape[0]
        a = np.empty(n)
        g = np.empty(n)
        a[self._order] = e * c / n
        g[self._order] = (-ev + e * c) / n
        return g, a

    def raw_grad(self, y, z):
        return self.grad_hess(y, z)[0]

    def raw_hess(self, y, z):
        return self.grad_hess(y, z)[1]

    def intercept_init(self, y):
        return 0.0

    def lipschitz(self, design, y=None):
        """Curvatures of the diagonal bound at ``z = 0``."""
        if y is None:
            return self.lipschitz_at(design, self._weigh(np.ones(design.n)) / design.n)
        return self.lipschitz_at(design, self.raw_hess(y, np.zeros(y.shape[0])))


def survival_target(y, name="y"):
    """Survival data as an ``(n, 2)`` float64 array ``[time, event]``: from that array (the
    event column 0/1 or boolean) or a structured array with one boolean field (the event) and
    one numeric field (the time). ``ValueError`` naming ``y`` otherwise."""
    arr = np.asarray(y)
    if arr.dtype.names is not None:
        names = arr.dtype.names
        if len(names) != 2:
            raise ValueError(f"{name} as a structured array needs two fields (event, time), got "
                             f"{names}")
        kinds = [arr.dtype[f].kind for f in names]
        if "b" not in kinds:
            raise ValueError(f"{name} as a structured array needs a boolean event field, got "
                             f"fields {names} of kinds {kinds}")
        ev = names[kinds.index("b")]
        tm = names[1 - kinds.index("b")]
        arr = np.column_stack([arr[tm].astype(np.float64), arr[ev].astype(np.float64)])
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"{name} must be an (n_samples, 2) array [time, event] for the Cox "
                         f"datafit (or a structured array of event and time), got shape "
                         f"{arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold numbers (time, event), got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinity; remove those samples")
    if not np.all(np.isin(arr[:, 1], (0.0, 1.0))):
        raise ValueError(f"the event column of {name} (its second column) must be 0 (censored) "
                         f"or 1 (event), got {np.unique(arr[:, 1])[:5]}")
    if not np.any(arr[:, 1] == 1.0):
        raise ValueError(f"{name} has no event (every sample censored): the partial likelihood "
                         "is constant")
    return arr
