"""Block coordinate descent with working sets of groups, for any datafit (``dualdrop.linear.
_groups.GroupProblem``: a penalty on user-given groups of features).

Each outer iteration scores every group by its block gradient mapping (``_groups.
group_scores``), keeps the nonzero groups plus the worst violators, and runs proximal Newton
steps on them (``_newton``'s scheme by blocks): the quadratic model ``G . X d + 1/2 sum_i H_i
(X d + db)_i^2`` of the datafit plus the group penalty is minimized by block coordinate descent,
each block step ``d_g <- prox_{lam_g Psi / L_g}(w_g + d_g - grad_g / L_g) - w_g`` with ``L_g``
the largest eigenvalue of the group's model curvature on its centred columns
(``_groups.block_curvatures``), the intercept kept at its exact minimizer as in the scalar
solver; then the line search of ``_newton.line_search``. For least squares the model is the
objective itself (one Newton step, accepted at ``t = 1``) and the block constants are computed
once; skglm's ``GroupBCD`` is this least-squares case with its own working sets.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._groups import block_curvatures, group_penalty_sum, group_scores
from .._jit import col_dot, group_prox
from ._newton import line_search, working_set_loop


@njit(cache=True)
def group_direction(X, data, indices, indptr, is_sparse, ws, ptr, idx, w, G, H, fit_intercept,
                    lam_g, code, params, c_grp, c_l1, c_ridge, positive, Lc, tol_in, max_cd, d,
                    Xd, hx, u):
    """Minimize the model over the groups ``ws`` by block coordinate descent (the module
    docstring); ``d`` and ``hx`` are feature-length (only the entries of ``ws``'s groups are
    touched), ``Xd`` and ``u`` sample-length work arrays. Returns the intercept step ``db``."""
    n = G.shape[0]
    sH = H.sum()
    elim = fit_intercept and sH > 1e-300
    mmax = 1
    for gg in range(ws.shape[0]):
        g = ws[gg]
        mmax = max(mmax, ptr[g + 1] - ptr[g])
        for k in range(ptr[g], ptr[g + 1]):
            j = idx[k]
            d[j] = 0.0
            hx[j] = col_dot(X, data, indices, indptr, is_sparse, j, H) if elim else 0.0
    v = np.empty(mmax)
    cur = np.empty(mmax)
    new = np.empty(mmax)
    u[:] = G
    Xd[:] = 0.0
    db = -G.sum() / sH if elim else 0.0
    for cd in range(max_cd):
        maxd = 0.0
        for gg in range(ws.shape[0]):
            g = ws[gg]
            L = Lc[g]
            if L <= 1e-300:
                continue
            m = ptr[g + 1] - ptr[g]
            for k in range(m):
                j = idx[ptr[g] + k]
                cur[k] = w[j] + d[j]
                grad = col_dot(X, data, indices, indptr, is_sparse, j, u) + db * hx[j]
                v[k] = cur[k] - grad / L
            lam = lam_g[g]
            if np.isfinite(lam):
                t = lam / L
                group_prox(code, params, v[:m], t * c_grp, t * c_l1, t * c_ridge, positive,
                           new[:m])
            else:
                new[:m] = 0.0
            dn = 0.0
            for k in range(m):
                delta = new[k] - cur[k]
                if delta == 0.0:
                    continue
                j = idx[ptr[g] + k]
                d[j] += delta
                if is_sparse:
                    for q in range(indptr[j], indptr[j + 1]):
                        i = indices[q]
                        Xd[i] += delta * data[q]
                        u[i] += delta * H[i] * data[q]
                else:
                    dc = delta * data[j]  # the dense design's column multiplier
                    for i in range(n):
                        Xd[i] += dc * X[i, j]
                        u[i] += dc * H[i] * X[i, j]
                if elim:
                    db -= delta * hx[j] / sH
                dn += delta * delta
            dd = L * np.sqrt(dn)
            if dd > maxd:
                maxd = dd
        if maxd <= 0.3 * tol_in:
            break
    if db != 0.0:
        for i in range(n):
            Xd[i] += db
    return db


@njit(cache=True)
def ws_gradient(X, data, indices, indptr, is_sparse, ws, ptr, idx, G, grad):
    """``grad_j = x_j . G`` for the features of the groups ``ws``."""
    for gg in range(ws.shape[0]):
        g = ws[gg]
        for k in range(ptr[g], ptr[g + 1]):
            j = idx[k]
            grad[j] = col_dot(X, data, indices, indptr, is_sparse, j, G)


def solve_groups(problem, w, b, tol, max_iter, verbose, working_set, p0, callback,
                 max_newton=50, max_cd=1000):
    """The working-set block solver (module docstring); ``max_iter`` counts outer iterations."""
    des, df, y = problem.design, problem.datafit, problem.y
    arrs = des.arrays
    grp = problem.groups
    ptr, idx = grp.ptr, grp.idx
    code, params = problem.spec
    cs = (problem.c_grp, problem.c_l1, problem.c_ridge)
    lam_g, fi, pos = problem.lam_g, problem.fit_intercept, problem.positive
    n_groups = grp.n_groups
    score = np.zeros(n_groups)
    grad = np.zeros(problem.p)
    d, hx = np.zeros(problem.p), np.zeros(problem.p)
    Xd, u = np.empty(problem.n), np.empty(problem.n)
    sub_scores = np.zeros(n_groups)
    constant_h = df.code == 0  # least squares: the model's curvature never changes
    Lc = np.full(n_groups, np.nan)
    if constant_h:
        block_curvatures(*arrs, ptr, idx, np.arange(n_groups), np.full(problem.n, 1.0 / problem.n),
                         fi, Lc)

    def scores(w, z):
        G = df.raw_grad(y, z)
        m = group_scores(w, des.rmatvec(G), ptr, idx, problem.all_groups, problem.Lg, lam_g, code,
                         params, *cs, pos, score)
        if fi:
            m = max(float(m), abs(float(G.sum())))
        return m, score, problem.groups.norms(w) != 0.0

    def inner(ws, w, z, b, tol_in):
        # no group in the working set: only the intercept is not optimal (its Newton steps
        # still run)
        feats = (np.concatenate([idx[ptr[g]:ptr[g + 1]] for g in ws]) if ws.size
                 else np.empty(0, dtype=np.int64))

        def penalty(w):
            return group_penalty_sum(w, ptr, idx, ws, lam_g, code, params, *cs)

        it = 0
        for it in range(max_newton):
            G, H = df.grad_hess(y, z)
            G = np.ascontiguousarray(G)
            ws_gradient(*arrs, ws, ptr, idx, G, grad)
            viol = group_scores(w, grad, ptr, idx, ws, problem.Lg, lam_g, code, params, *cs, pos,
                                sub_scores)
            if fi:
                viol = max(viol, abs(float(G.sum())))
            if viol <= tol_in:
                break
            if constant_h:
                H = np.full(problem.n, 1.0 / problem.n)
            else:
                H = np.ascontiguousarray(H)
                block_curvatures(*arrs, ptr, idx, ws, H, fi, Lc)
            db = group_direction(*arrs, ws, ptr, idx, w, G, H, fi, lam_g, code, params, *cs,
                                 pos, Lc, tol_in, max_cd, d, Xd, hx, u)
            ok, z, b = line_search(problem, feats, w, d[feats], z, Xd, b, db, penalty)
            if not ok:
                break
        return it + 1, z, b

    return working_set_loop(problem, w, b, tol, max_iter, verbose, working_set, p0, callback,
                            scores, inner, "cd")
