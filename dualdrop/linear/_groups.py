"""Penalties on user-given groups of features: the group lasso and its relatives.

``groups=`` on the single-output estimators partitions the features into groups ``g`` (sizes of
consecutive blocks, one size for equal blocks, or a list of index arrays; overlapping or missing
features are refused). The penalty then acts on each group's norm, the form ``dualdrop.nn``
prunes neurons, channels and heads with (docs/theory.md, section 6), for any penalty ``Omega``
of the catalog::

    alpha * sum_g v_g [ rho (1 - tau) Omega(||u_g||_2) + rho tau ||u_g||_1 + (1 - rho)/2 ||u_g||^2 ]

with ``u = s w`` the scaled coefficients (``scaling``), ``v_g`` the group's weight
(``penalty_weights``, one per group, default 1; ``sqrt(|g|)`` gives Yuan & Lin's weighting),
``rho = l1_ratio`` (a ridge term, as everywhere) and ``tau = group_l1_ratio`` (an l1 term on
the coefficients: the sparse group lasso of Simon, Friedman, Hastie & Tibshirani 2013 for
``Omega = |.|``). ``Omega = |.|`` is the group lasso (Yuan & Lin 2006); ``"mcp"`` with
``lam`` following alpha the group MCP of grpreg (Breheny & Huang 2015); any other penalty of
the catalog (log-sum, the dropout penalties) its own group form. Its prox is
``_jit.group_prox``, shared with the multi-output row penalty.

:class:`GroupProblem` is the :class:`~dualdrop.linear._problem.Problem` of such a fit: the same
interface (objective, relative criterion) with block constants ``Lg`` and the block gradient
mapping as the criterion; the solver is block coordinate descent with working sets of groups
(``solvers._cd_groups``).
"""

from __future__ import annotations

import numbers

import numpy as np
from numba import njit

from penalties.kernels import omega_scalar

from ._jit import group_prox
from ._penalty import kernel_spec, smallest_zero_alpha
from ._problem import Problem

__all__ = ["GroupStructure", "check_groups", "GroupProblem"]


class GroupStructure:
    """A partition of ``p`` features: group ``g`` holds ``idx[ptr[g]:ptr[g + 1]]``."""

    def __init__(self, ptr, idx, p):
        self.ptr = np.ascontiguousarray(ptr, dtype=np.int64)
        self.idx = np.ascontiguousarray(idx, dtype=np.int64)
        self.p = int(p)
        self.n_groups = self.ptr.shape[0] - 1
        self.sizes = np.diff(self.ptr)
        self.group_of = np.empty(p, dtype=np.int64)
        for g in range(self.n_groups):
            self.group_of[self.idx[self.ptr[g]:self.ptr[g + 1]]] = g

    def with_extra_feature(self):
        """The partition of ``p + 1`` features with the new last one as a group of its own (the
        intercept column of sparse weighted least squares)."""
        return GroupStructure(np.append(self.ptr, self.ptr[-1] + 1), np.append(self.idx, self.p),
                              self.p + 1)

    def norms(self, w):
        out = np.empty(self.n_groups)
        _group_norms(self.ptr, self.idx, np.ascontiguousarray(w, dtype=np.float64), out)
        return out

    def __repr__(self):
        return f"GroupStructure({self.n_groups} groups of {self.p} features)"


def check_groups(groups, p, name="groups"):
    """``groups`` as a :class:`GroupStructure` of ``p`` features, or a ``ValueError`` naming it:

    - an integer ``k``: consecutive groups of ``k`` features (``p`` a multiple of ``k``);
    - a list of integers: the sizes of consecutive groups (summing to ``p``);
    - a list of index arrays: the features of each group (disjoint, covering every feature).
    """
    fix = (f"pass one size for equal consecutive groups, a list of sizes summing to {p}, or a "
           f"list of index arrays that covers each of the {p} features once")
    if isinstance(groups, bool):
        raise ValueError(f"{name} must be an integer, a list of sizes or a list of index arrays, "
                         f"got {groups!r}")
    if isinstance(groups, numbers.Integral):
        k = int(groups)
        if k < 1 or p % k:
            raise ValueError(f"{name}={k} does not split the {p} features into equal groups; "
                             + fix)
        return GroupStructure(np.arange(0, p + 1, k), np.arange(p), p)
    try:
        items = list(groups)
    except TypeError:
        raise ValueError(f"{name} must be an integer, a list of sizes or a list of index arrays, "
                         f"got {type(groups).__name__}") from None
    if not items:
        raise ValueError(f"{name} is empty; " + fix)
    if all(isinstance(g, numbers.Integral) and not isinstance(g, bool) for g in items):
        sizes = np.asarray(items, dtype=np.int64)
        if np.any(sizes < 1) or int(sizes.sum()) != p:
            raise ValueError(f"{name} as sizes must be positive and sum to the {p} features, got "
                             f"sizes summing to {int(sizes.sum())} (smallest {int(sizes.min())}); "
                             + fix)
        return GroupStructure(np.concatenate([[0], np.cumsum(sizes)]), np.arange(p), p)
    parts = []
    for k, g in enumerate(items):
        a = np.asarray(g)
        if a.ndim == 0:
            a = a.reshape(1)
        if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu":
            raise ValueError(f"{name}[{k}] must be a non-empty 1-D array of feature indices, got "
                             f"{g!r}; " + fix)
        if a.min() < 0 or a.max() >= p:
            bad = int(a.max() if a.max() >= p else a.min())
            raise ValueError(f"{name}[{k}] holds feature index {bad}, outside 0..{p - 1}")
        if np.unique(a).size != a.size:
            raise ValueError(f"{name}[{k}] lists a feature twice")
        parts.append(a.astype(np.int64))
    idx = np.concatenate(parts)
    counts = np.bincount(idx, minlength=p)
    if np.any(counts > 1):
        j = int(np.flatnonzero(counts > 1)[0])
        owners = [k for k, a in enumerate(parts) if j in a]
        raise ValueError(f"{name} overlap: feature {j} is in groups {owners[:2]}; overlapping "
                         "groups are not supported (for the overlapping group lasso, duplicate "
                         "the shared columns so that each copy is in one group)")
    if np.any(counts == 0):
        missing = np.flatnonzero(counts == 0)
        raise ValueError(f"{name} leaves features {missing[:5].tolist()}"
                         f"{' ...' if missing.size > 5 else ''} ({missing.size} in all) in no "
                         "group; give each a group (a group of one is an ordinary "
                         "coefficient; penalty_weights=0 for a group leaves it unpenalized)")
    ptr = np.concatenate([[0], np.cumsum([a.size for a in parts])])
    return GroupStructure(ptr, idx, p)


@njit(cache=True)
def _group_norms(ptr, idx, w, out):
    for g in range(ptr.shape[0] - 1):
        s = 0.0
        for k in range(ptr[g], ptr[g + 1]):
            s += w[idx[k]] * w[idx[k]]
        out[g] = np.sqrt(s)


@njit(cache=True)
def group_penalty_sum(w, ptr, idx, groups, lam_g, code, params, c_grp, c_l1, c_ridge):
    """``sum_{g in groups} lam_g [c_grp Omega(||w_g||) + c_l1 ||w_g||_1 + c_ridge/2 ||w_g||^2]``
    (zero groups contribute nothing)."""
    s = 0.0
    for gg in range(groups.shape[0]):
        g = groups[gg]
        lam = lam_g[g]
        if lam == 0.0:
            continue
        q = 0.0
        a = 0.0
        for k in range(ptr[g], ptr[g + 1]):
            v = w[idx[k]]
            q += v * v
            a += abs(v)
        if q == 0.0:
            continue
        t = 0.0
        if c_grp != 0.0:
            t += c_grp * omega_scalar(code, params, np.sqrt(q))
        s += lam * (t + c_l1 * a + 0.5 * c_ridge * q)
    return s


@njit(cache=True)
def group_step(w, grad, ptr, idx, g, L, lam, code, params, c_grp, c_l1, c_ridge, positive, v,
               out):
    """The block prox-gradient step of group ``g`` with constant ``L``: ``out = prox_{lam Psi /
    L}(w_g - grad_g / L)`` (the group's entries in ``ptr`` order, ``Psi`` the group penalty);
    ``v``, ``out``: work arrays of at least the group's size. ``L = 0``: ``out = w_g``."""
    m = ptr[g + 1] - ptr[g]
    if L <= 0.0:
        for k in range(m):
            out[k] = w[idx[ptr[g] + k]]
        return
    for k in range(m):
        j = idx[ptr[g] + k]
        v[k] = w[j] - grad[j] / L
    if not np.isfinite(lam):
        out[:m] = 0.0
        return
    t = lam / L
    group_prox(code, params, v[:m], t * c_grp, t * c_l1, t * c_ridge, positive, out[:m])


@njit(cache=True)
def group_scores(w, grad, ptr, idx, groups, Lg, lam_g, code, params, c_grp, c_l1, c_ridge,
                 positive, out):
    """The block gradient mapping ``L_g ||w_g - prox_{lam_g Psi / L_g}(w_g - grad_g / L_g)||`` of
    the groups ``groups`` into ``out[g]`` (the groups' analogue of ``_jit.scores_from_grad``);
    returns the max."""
    mmax = 0
    for gg in range(groups.shape[0]):
        g = groups[gg]
        mmax = max(mmax, ptr[g + 1] - ptr[g])
    v = np.empty(mmax)
    new = np.empty(mmax)
    m = 0.0
    for gg in range(groups.shape[0]):
        g = groups[gg]
        L = Lg[g]
        if L <= 0.0:
            out[g] = 0.0
            continue
        group_step(w, grad, ptr, idx, g, L, lam_g[g], code, params, c_grp, c_l1, c_ridge,
                   positive, v, new)
        s = 0.0
        for k in range(ptr[g + 1] - ptr[g]):
            dlt = w[idx[ptr[g] + k]] - new[k]
            s += dlt * dlt
        s = L * np.sqrt(s)
        out[g] = s
        if s > m:
            m = s
    return m


@njit(cache=True)
def weighted_gram(X, data, indices, indptr, is_sparse, cols, h, out):
    """``out = X_c^T diag(h) X_c`` for the columns ``cols`` (dense or sparse design)."""
    m = cols.shape[0]
    n = h.shape[0]
    if is_sparse:
        dense = np.zeros((n, m))
        for a in range(m):
            j = cols[a]
            for k in range(indptr[j], indptr[j + 1]):
                dense[indices[k], a] = data[k]
        for a in range(m):
            for c in range(a, m):
                s = 0.0
                for i in range(n):
                    s += h[i] * dense[i, a] * dense[i, c]
                out[a, c] = s
                out[c, a] = s
        return
    for a in range(m):
        ja = cols[a]
        for c in range(a, m):
            jc = cols[c]
            s = 0.0
            for i in range(n):
                s += h[i] * X[i, ja] * X[i, jc]
            s *= data[ja] * data[jc]  # the dense design's column multipliers
            out[a, c] = s
            out[c, a] = s


@njit(cache=True)
def block_curvatures(X, data, indices, indptr, is_sparse, ptr, idx, groups, h, centred, out):
    """The largest eigenvalue of each group's ``X_g^T diag(h) X_g`` (minus ``hx hx^T / sum h``
    with ``hx = X_g^T h`` when ``centred``: the curvature of the group on its ``h``-weighted
    centred columns, see ``solvers._newton.newton_direction``) into ``out[g]`` for the ``g`` in
    ``groups``: the block constants of block coordinate descent. A group of one feature has the
    closed form; larger ones an eigenvalue of their small Gram matrix."""
    sh = h.sum()
    for gg in range(groups.shape[0]):
        g = groups[gg]
        m = ptr[g + 1] - ptr[g]
        cols = idx[ptr[g]:ptr[g + 1]]
        A = np.empty((m, m))
        weighted_gram(X, data, indices, indptr, is_sparse, cols, h, A)
        if centred and sh > 1e-300:
            hx = np.zeros(m)
            for a in range(m):
                j = cols[a]
                s = 0.0
                if is_sparse:
                    for k in range(indptr[j], indptr[j + 1]):
                        s += h[indices[k]] * data[k]
                else:
                    for i in range(h.shape[0]):
                        s += h[i] * X[i, j]
                    s *= data[j]
                hx[a] = s
            for a in range(m):
                for c in range(m):
                    A[a, c] -= hx[a] * hx[c] / sh
        if m == 1:
            out[g] = max(A[0, 0], 0.0)
        else:
            out[g] = max(np.linalg.eigvalsh(A)[-1], 0.0)


class GroupProblem(Problem):
    """``min L(y, X w + b) + sum_g lam_g Psi(w_g)`` with ``lam_g = alpha * weights_g`` and
    ``Psi(u) = c_grp Omega(||u||) + c_l1 ||u||_1 + c_ridge / 2 ||u||^2`` (module docstring:
    ``c_grp = rho (1 - tau)``, ``c_l1 = rho tau``, ``c_ridge = 1 - rho``). ``penalty`` is the
    plain ``Omega`` (with a compiled kernel); ``weights`` one per group."""

    grouped = True

    def __init__(self, X, y, datafit, penalty, alpha, groups: GroupStructure, fit_intercept=True,
                 weights=None, positive=False, l1_ratio=1.0, group_l1_ratio=0.0,
                 ridge_scale=1.0):
        self.groups = groups
        rho, tau = float(l1_ratio), float(group_l1_ratio)
        self.c_grp, self.c_l1 = rho * (1.0 - tau), rho * tau
        self.c_ridge = (1.0 - rho) * float(ridge_scale)  # see _penalty.WithRidge.rescaled
        self.l1_ratio, self.group_l1_ratio, self.ridge_scale = rho, tau, float(ridge_scale)
        gw = np.ones(groups.n_groups) if weights is None else np.asarray(weights, np.float64)
        super().__init__(X, y, datafit, penalty, alpha, fit_intercept, None, positive)
        if self.spec is None:
            raise ValueError(f"groups need a penalty with a compiled kernel (every name of "
                             f"penalties.available() but 'hard_threshold'), got {penalty!r}")
        self.group_weights = gw
        self.lam_g = self.alpha * gw
        # block constants of the criterion: at the curvatures lipschitz() uses (the Lipschitz
        # bound, or the null model's), per group
        h = self._criterion_h()
        self.Lg = np.empty(groups.n_groups)
        block_curvatures(*self.design.arrays, groups.ptr, groups.idx,
                         np.arange(groups.n_groups), h, False, self.Lg)
        pos = self.Lg[self.Lg > 0]
        self._lbar = float(pos.mean()) if pos.size else 1.0
        self.all_groups = np.arange(groups.n_groups, dtype=np.int64)

    def _rescale(self, scale):
        self.group_weights = self.group_weights * scale
        self.lam_g = self.alpha * self.group_weights

    def with_penalty(self, penalty, scale=1.0):
        """A copy with another penalty of the group norms; the ridge share of ``penalty`` (a
        ``WithRidge``) replaces this problem's."""
        from ._penalty import WithRidge

        ridged = isinstance(penalty, WithRidge)
        rho = penalty.l1_ratio if ridged else 1.0
        new = super().with_penalty(penalty.penalty if ridged else penalty, scale)
        tau = self.group_l1_ratio
        new.c_grp, new.c_l1 = rho * (1.0 - tau), rho * tau
        new.c_ridge = (1.0 - rho) * (penalty.ridge_scale if ridged else 1.0)
        return new

    def _criterion_h(self):
        """Per-sample curvatures whose weighted column norms are ``lips`` (what the scalar
        criterion uses), recovered from the datafit: ``raw_hess`` at the null model where the
        datafit has no global constant, else ``curvature * sw / n``."""
        df = self.datafit
        n = self.n
        if df.code in (2, 3, 6):  # Poisson, Gamma, Cox: the null model's curvatures
            return np.ascontiguousarray(df.raw_hess(self.y, np.full(n, df.intercept_init(self.y)
                                                                    if df.has_intercept else 0.0)))
        sw = df.sample_weight
        h = np.full(n, df.curvature / n)
        return h if sw is None else h * sw

    def penalty_value(self, w):
        g = self.groups
        return float(group_penalty_sum(np.ascontiguousarray(w, dtype=np.float64), g.ptr, g.idx,
                                       self.all_groups, self.lam_g, *self.spec, self.c_grp,
                                       self.c_l1, self.c_ridge))

    def raw_criterion(self, w, b, z):
        G = self.datafit.raw_grad(self.y, z)
        gb = abs(float(G.sum())) if self.fit_intercept else 0.0
        grad = self.design.rmatvec(G)
        out = np.empty(self.groups.n_groups)
        m = group_scores(np.ascontiguousarray(w, dtype=np.float64), grad, self.groups.ptr,
                         self.groups.idx, self.all_groups, self.Lg, self.lam_g, *self.spec,
                         self.c_grp, self.c_l1, self.c_ridge, self.positive, out)
        return max(float(m), gb)


def group_alpha_max(grad, Lg, groups: GroupStructure, weights, penalty, l1_ratio=1.0,
                    group_l1_ratio=0.0, pen_at=None):
    """Smallest ``alpha`` for which every group's block prox-gradient step from ``w = 0`` is 0
    (``grad`` the datafit's gradient at the null model, ``Lg`` the block constants): the group
    analogue of ``path.alpha_max_from_gradient``, by bracketing and bisection on that
    condition (exact for convex penalties, the first-order threshold for the others).
    ``pen_at(alpha)`` gives the penalty at ``alpha`` when it follows alpha (MCP/SCAD with
    ``lam="alpha"``)."""
    rho, tau = float(l1_ratio), float(group_l1_ratio)
    c = (rho * (1 - tau), rho * tau, 1 - rho)
    gw = np.ones(groups.n_groups) if weights is None else np.asarray(weights, np.float64)
    keep = (Lg > 0) & (gw > 0) & np.isfinite(gw)
    norms = groups.norms(grad)
    if not np.any(norms[keep] > 0):
        return 0.0
    zero = np.zeros(groups.p)
    out = np.empty(groups.n_groups)
    all_groups = np.arange(groups.n_groups, dtype=np.int64)

    def all_zero(a):
        P = penalty if pen_at is None else pen_at(a)
        code, params = kernel_spec(P)
        lam = a * gw
        m = group_scores(zero, grad, groups.ptr, groups.idx, all_groups,
                         np.where(keep, Lg, 0.0), lam, code, params, c[0], c[1], c[2], False, out)
        return m == 0.0

    return smallest_zero_alpha(all_zero, float(np.max(norms[keep] / gw[keep])))
