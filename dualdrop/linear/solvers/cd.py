"""Coordinate descent with the penalty's prox, working sets and Anderson acceleration.

- Least squares: cyclic proximal coordinate descent on the residual ``r = y - X w - b``; the
  coordinate step is ``w_j <- prox_{lam_j Omega / L_j}(w_j + x_j . r / (n L_j))`` with
  ``L_j = ||x_j||^2 / n``; the intercept is re-minimized exactly after each pass.
- Logistic: proximal Newton (the compiled inner solver in ``_cd_logistic``). Each outer step builds
  the quadratic model of the loss at the current point and minimizes it (plus the penalty) by the
  same coordinate descent, then a backtracking line search on the true objective.
- Every other datafit (Poisson, Gamma, Huber, quantile, Cox: ``dualdrop.linear.families``): the
  same proximal Newton with the datafit's own model ``G, H`` (``_newton.newton_inner``).

Both run on a *working set* of features: the outer loop scores every feature by its optimality
violation (gradient mapping), keeps the nonzero ones plus the worst violators (doubling the set
as the support grows), and solves the restricted problem to a fraction of the current violation.
The restricted least-squares solver extrapolates its iterates every ``anderson`` passes (Anderson
acceleration) and keeps the extrapolation only if it lowers the objective; for a convex penalty
the extrapolation is first brought back to the current orthant face (coordinates whose sign it
would change set to 0).

The prox comes from ``penalties.kernels.prox_scalar``: closed form where the penalty has one, the
engine's numeric 1-D prox otherwise; any separable penalty with a kernel works, convex or not.
For a nonconvex penalty the result is a stationary point (coordinate-wise minimum).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._base import BaseSolver, UnsupportedProblem
from ._common import check_tol_iter, progress, single_thread_blas, start_point
from penalties.kernels import L1, LP, MIXED

from .._jit import (_dn_axpy, _dn_dot, _sp_axpy, _sp_dot, col_axpy, csc_rmatvec, penalty_sum,
                    prox_step, prox_steps, score_thresholds, scores_from_grad, select_ws,
                    zero_thresholds)
from ._cd_logistic import inner_logistic
from ._cd_groups import solve_groups
from ._cd_multinomial import solve_multinomial
from ._newton import newton_inner, working_set_loop
from .anderson import weights as anderson_weights

NAME = "cd"

# ----------------------------------------------------------------------------------------------
# compiled inner solvers


# One pass of the least-squares coordinate descent over ``feats[:n_feats]``, for sparse and for
# dense columns: two copies of one loop, with the column kernels chosen outside it. With the
# choice inside (``col_dot(..., is_sparse, ...)``, a branch on an argument, in the body of the
# inner solver) a pass over 1890 sparse columns of 20 nonzeros took ~240 us, against ~170 us
# here (skglm's epoch on the same columns: ~150 us). For the l1 penalty the prox is soft
# thresholding, inline (the generic ``prox_step`` is a call into the penalty catalog: ~15% of
# a sparse pass). ``tin_j = lam_j / Lin_j`` is the prox's step (``prox_steps``). The same
# arithmetic as before, operation for operation: the iterates are unchanged. Returns ``(largest
# scaled move, shift c of the residual, intercept)``: the residual is ``r + c`` afterwards.


@njit(cache=True, inline="always")
def _cd_step(old, g, L, Tj, tj, code, params, positive, l1):
    """The new value of a coordinate with gradient ``g`` (``old`` when the prox keeps it)."""
    if old == 0.0 and abs(g) <= Tj * L:
        return old  # the prox would return 0 (see _jit.zero_threshold)
    v = old - g / L
    if l1:
        if v > tj:
            return v - tj
        if v < -tj and not positive:
            return v + tj
        return 0.0
    return prox_step(code, params, v, tj, positive)


@njit(cache=True)
def _pass_sparse(data, indices, indptr, feats, n_feats, w, r, b, Lin, means, T, tin, code,
                 params, positive, l1):
    n = r.shape[0]
    maxd = 0.0
    c = 0.0
    for jj in range(n_feats):
        j = feats[jj]
        L = Lin[j]
        if L == 0.0:
            continue
        old = w[j]
        g = -(_sp_dot(data, indices, indptr, j, r) + c * n * means[j]) / n
        new = _cd_step(old, g, L, T[j], tin[j], code, params, positive, l1)
        if new != old:
            delta = new - old
            _sp_axpy(data, indices, indptr, j, -delta, r)
            c += delta * means[j]
            b -= delta * means[j]
            w[j] = new
            d = L * abs(delta)
            if d > maxd:
                maxd = d
    return maxd, c, b


@njit(cache=True)
def _pass_dense(X, mult, feats, n_feats, w, r, b, Lin, means, T, tin, code, params, positive,
                l1):
    """One pass over ``feats`` of a dense design ``X[:, j] * mult[j]``."""
    n = r.shape[0]
    maxd = 0.0
    c = 0.0
    for jj in range(n_feats):
        j = feats[jj]
        L = Lin[j]
        if L == 0.0:
            continue
        old = w[j]
        g = -(_dn_dot(X, j, r) * mult[j] + c * n * means[j]) / n
        new = _cd_step(old, g, L, T[j], tin[j], code, params, positive, l1)
        if new != old:
            delta = new - old
            _dn_axpy(X, j, -delta * mult[j], r)
            c += delta * means[j]
            b -= delta * means[j]
            w[j] = new
            d = L * abs(delta)
            if d > maxd:
                maxd = d
    return maxd, c, b


@njit(cache=True)
def _inner_quadratic(X, data, indices, indptr, is_sparse, ws, w, r, b, fit_intercept, Lin, means,
                     T, tin, lam_w, code, params, positive, tol_in, max_epochs, K, convex):
    """CD passes over the working set ``ws`` until the largest scaled coordinate move is below
    ``tol_in``. Updates ``w`` and ``r`` in place; returns ``(epochs, b)``.

    With an intercept, each coordinate moves along ``(e_j, -means_j)`` (``w_j`` and the intercept
    together, the intercept staying at its exact minimizer), i.e. on the centred column, whose
    curvature is ``Lin_j = ||x_j||^2 / n - means_j^2``: this is scikit-learn's centring done
    implicitly (sparse designs stay sparse: the shift of the residual is carried as a scalar
    ``c`` and added once per pass). Updating ``w_j`` and then the intercept one after the other
    instead converges at the rate of the collinearity of raw columns (large means) with the
    intercept: thousands of passes on raw diabetes. ``T_j`` is the zero threshold of the
    coordinate's prox (see ``_jit.zero_threshold``)."""
    n = r.shape[0]
    nws = ws.shape[0]
    hist = np.zeros((K + 1, nws))
    rhist = np.zeros((K + 1, n) if K > 0 else (0, n))
    bhist = np.zeros(K + 1)
    n_hist = 0
    ep = 0
    # Passes alternate between the whole working set and its nonzero part ("active set
    # cycling"): once a full pass has found the support, cheaper passes over the nonzeros converge
    # it, and a full pass confirms (or lets new coordinates in).
    act = np.empty(nws, dtype=ws.dtype)
    n_act = nws
    full = True
    if fit_intercept:
        m = r.mean()
        b += m
        r -= m
    l1 = code == L1
    for ep in range(max_epochs):
        feats = ws if full else act
        n_feats = nws if full else n_act
        if is_sparse:
            maxd, c, b = _pass_sparse(data, indices, indptr, feats, n_feats, w, r, b, Lin,
                                      means, T, tin, code, params, positive, l1)
        else:
            maxd, c, b = _pass_dense(X, data, feats, n_feats, w, r, b, Lin, means, T, tin,
                                     code, params, positive, l1)
        if c != 0.0:
            r += c
        if fit_intercept:
            m = r.mean()
            if m != 0.0:
                b += m
                r -= m
                if abs(m) > maxd:
                    maxd = abs(m)
        if full:
            if maxd <= tol_in:
                break
            n_act = 0
            for jj in range(nws):
                if w[ws[jj]] != 0.0:
                    act[n_act] = ws[jj]
                    n_act += 1
            full = n_act == nws
        elif maxd <= tol_in:
            full = True
        if K > 0:
            for jj in range(nws):
                hist[n_hist, jj] = w[ws[jj]]
            rhist[n_hist] = r
            bhist[n_hist] = b
            n_hist += 1
            if n_hist == K + 1:
                n_hist = 0
                ok, cw = anderson_weights(hist)
                if not ok:
                    continue
                w_acc = cw @ hist[1:]
                if positive and not convex and np.any(w_acc < 0.0):
                    continue
                # r is affine in (w, b): the extrapolated residual is the same combination of
                # the stored ones (O(K n), where recomputing it costs a pass over the columns)
                r_acc = cw @ rhist[1:]
                b_acc = cw @ bhist[1:]
                if convex:
                    # Keep the extrapolation on the current orthant face: a coordinate whose
                    # sign it changes, or that it moves off 0, is set to 0 (its column taken
                    # out of the residual; the intercept is re-centred below). Without this,
                    # when the support is about n (small alpha) the extrapolated point flips
                    # signs of coordinates near 0, its l1 term jumps and it was rejected 95%
                    # of the time; on the face the map is affine and the extrapolation is
                    # kept almost always (passes 2.5-4x fewer, benchmarks/RESULTS.md
                    # 2026-12-04). Convex penalties only: on a nonconvex one the accepted
                    # extrapolations lead to another stationary point (an MCP fit of
                    # tests/linear/test_linear_path.py).
                    for jj in range(nws):
                        j = ws[jj]
                        a = w_acc[jj]
                        if a != 0.0 and (w[j] == 0.0 or (a > 0.0) != (w[j] > 0.0)):
                            col_axpy(X, data, indices, indptr, is_sparse, j, a, r_acc)
                            w_acc[jj] = 0.0
                if fit_intercept:
                    m = r_acc.mean()
                    b_acc += m
                    r_acc -= m
                obj = 0.5 * (r @ r) / n + penalty_sum(w, ws, lam_w, code, params)
                w_old = np.empty(nws)
                for jj in range(nws):
                    w_old[jj] = w[ws[jj]]
                    w[ws[jj]] = w_acc[jj]
                obj_acc = 0.5 * (r_acc @ r_acc) / n + penalty_sum(w, ws, lam_w, code, params)
                if obj_acc < obj:
                    r[:] = r_acc
                    b = b_acc
                else:
                    for jj in range(nws):
                        w[ws[jj]] = w_old[jj]
    return ep + 1, b


@njit(cache=True)
def _criterion_quadratic(X, data, indices, indptr, is_sparse, r, w, F, fit_intercept, lips,
                         lam_w, code, params, positive, Tg, f_null, lbar, grad, score):
    """``(criterion, scale)`` at the point with residual ``r`` and objective ``F``: the largest
    gradient mapping (scores into ``score``) and ``|dL/db|``, divided by ``scale =
    sqrt(2 max(F, 1e-10 f_null) Lbar)`` (``Problem.criterion``, computed here without leaving
    compiled code)."""
    n = r.shape[0]
    if is_sparse:
        csc_rmatvec(data, indices, indptr, r, grad)
    else:
        for j in range(w.shape[0]):
            grad[j] = _dn_dot(X, j, r) * data[j]
    for j in range(w.shape[0]):
        grad[j] = -grad[j] / n
    m = scores_from_grad(grad, w, lips, lam_w, code, params, positive, Tg, score)
    if fit_intercept:
        gb = abs(r.sum()) / n
        if gb > m:
            m = gb
    f = max(F, 1e-10 * f_null)
    scale = np.sqrt(2.0 * f * lbar) if f > 0.0 else 1.0
    return m / scale, scale


_HISTORY_CAP = 10_000  # objective values recorded per fit, whatever max_iter says


@njit(cache=True)
def history_buffer(max_iter):
    """The objective history of one fit: ``min(max_iter, 10,000) + 1`` entries, not
    ``max_iter + 1`` (``max_iter=10**12`` asked for 7 TiB): a fit that runs longer records its
    first 10,000 iterations and its last one in the final entry."""
    return np.empty(min(max_iter, _HISTORY_CAP) + 1)


@njit(cache=True)
def _outer_quadratic(X, data, indices, indptr, is_sparse, y, w, r, b, fit_intercept, lips, Lin,
                     means, lam_w, t_in, Tg, T, code, params, positive, tol, max_iter,
                     max_epochs, K, p0, working_set, f_null, lbar, hist, convex):
    """The working-set outer loop for least squares, from ``(w, b)`` with residual ``r = y - X w
    - b`` (both updated in place): score every feature, stop when the criterion is below ``tol``,
    else solve the working set (nonzeros plus the worst violators, twice the support) with
    :func:`_inner_quadratic` to a fraction of the current violation. ``hist[k]``: the objective
    after ``k`` working-set solves. Returns ``(n_iter, b, criterion, converged, inner passes,
    len(history))``; ``n_iter`` counts the outer iterations, the final check included (as a
    Python ``for it in range(1, max_iter + 1)`` loop that breaks on convergence)."""
    n = y.shape[0]
    p = w.shape[0]
    grad = np.empty(p)
    score = np.empty(p)
    all_feats = np.arange(p)
    F = 0.5 * (r @ r) / n + penalty_sum(w, all_feats, lam_w, code, params)
    hist[0] = F
    n_hist = 1
    total = 0
    crit = np.inf
    for it in range(1, max_iter + 1):
        crit, scale = _criterion_quadratic(X, data, indices, indptr, is_sparse, r, w, F,
                                           fit_intercept, lips, lam_w, code, params, positive,
                                           Tg, f_null, lbar, grad, score)
        if crit <= tol:
            return it, b, crit, True, total, n_hist
        if working_set:
            nnz = 0
            for j in range(p):
                if w[j] != 0.0:
                    nnz += 1
            ws = select_ws(score, w != 0.0, min(p, max(p0, 2 * nnz)))
        else:
            ws = all_feats
        tol_in = max(0.3 * crit, 0.1 * tol) * scale  # in the units of the gradient
        zero_thresholds(code, params, t_in, ws, T)
        n_in, b = _inner_quadratic(X, data, indices, indptr, is_sparse, ws, w, r, b,
                                   fit_intercept, Lin, means, T, t_in, lam_w, code, params,
                                   positive, tol_in, max_epochs, K, convex)
        total += n_in
        F = 0.5 * (r @ r) / n + penalty_sum(w, all_feats, lam_w, code, params)
        if n_hist < hist.shape[0]:
            hist[n_hist] = F
            n_hist += 1
        else:  # a full buffer (history_buffer): the last entry is the current objective
            hist[n_hist - 1] = F
    # max_iter reached: the criterion at the returned point
    crit, scale = _criterion_quadratic(X, data, indices, indptr, is_sparse, r, w, F,
                                       fit_intercept, lips, lam_w, code, params, positive, Tg,
                                       f_null, lbar, grad, score)
    return max_iter, b, crit, crit <= tol, total, n_hist


@njit(cache=True)
def _path_quadratic(X, data, indices, indptr, is_sparse, y, w, b, fit_intercept, lips, Lin,
                    means, weights, alphas, code, params, positive, tol, max_iter, max_epochs, K,
                    p0, working_set, f_null, lbar, W, B, n_iter, crit, converged, convex):
    """:func:`_outer_quadratic` along ``alphas`` (decreasing), each fit warm-started at the
    previous one, from ``(w, b)``; fit ``k`` into ``W[k], B[k], n_iter[k], crit[k],
    converged[k]``. Nothing between two fits leaves compiled code: on small problems the Python
    set-up of a fit (about 1 ms) would cost more than the fit."""
    p = w.shape[0]
    r = y - b
    for j in range(p):
        if w[j] != 0.0:
            col_axpy(X, data, indices, indptr, is_sparse, j, -w[j], r)
    hist = history_buffer(max_iter)
    lam_w = np.empty(p)
    t_in = np.empty(p)
    Tg = np.empty(p)
    T = np.empty(p)
    for k in range(alphas.shape[0]):
        for j in range(p):
            lam_w[j] = alphas[k] * weights[j]
        prox_steps(lam_w, Lin, t_in)
        score_thresholds(code, params, lam_w, lips, Tg)
        T[:] = np.nan
        it, b, c, conv, _, _ = _outer_quadratic(
            X, data, indices, indptr, is_sparse, y, w, r, b, fit_intercept, lips, Lin, means,
            lam_w, t_in, Tg, T, code, params, positive, tol, max_iter, max_epochs, K, p0,
            working_set, f_null, lbar, hist, convex)
        W[k] = w
        B[k] = b
        n_iter[k] = it
        crit[k] = c
        converged[k] = conv


# ----------------------------------------------------------------------------------------------


def _null_objective(problem):
    """Objective of the null model (``w = 0``, best intercept): the floor of the criterion's
    scale (``Problem.criterion_scale``)."""
    return problem.datafit.value(problem.y, np.full(problem.n, problem.initial_intercept()))


class CD(BaseSolver):
    """Working-set coordinate descent (least squares) or proximal Newton (the other datafits).
    ``max_iter`` counts outer (working-set) iterations; ``tol`` applies to
    ``Problem.criterion``. Options: ``anderson=0`` disables extrapolation, ``working_set=False``
    solves on all features at once, ``max_epochs`` bounds the inner passes, ``p0`` is the first
    working-set size (default 10 for least squares and logistic, 30 for the other datafits,
    groups and the multinomial, whose Newton steps over a larger set cost little more than over
    a small one: a Gamma fit with 41 nonzeros in 1000 features took 6 outer iterations from 10,
    5 from 30, and 25% less time), ``callback(w, b)`` runs after each outer iteration,
    ``polish=False`` skips the final exact solve of convex l1 / elastic-net least squares
    (:func:`polish_l1`)."""

    name = NAME
    requires = ("kernel",)
    supports_positive = True
    grouped = True
    multinomial = True
    default_max_iter = 100

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, working_set=True, anderson=5,
               max_epochs=5000, p0=None, callback=None, polish=True):
        if p0 is None:  # see the class docstring
            p0 = 10 if problem.datafit.code in (0, 1) and not getattr(
                problem, "grouped", False) else 30
        out = _solve_cd(problem, w, b, tol, max_iter, verbose, working_set, anderson,
                        max_epochs, p0, callback)
        if polish and out[5] and problem.datafit.code == 0 \
                and not getattr(problem, "grouped", False):
            # the history's last entry is the objective at the returned point
            done = polish_l1(problem, out[0], out[1], float(out[3][-1]) if len(out[3]) else None)
            if done is not None:
                w, b, crit, F = done
                return (w, b, out[2], [*out[3], F], crit, True, {**out[6], "polished": True})
        return out


def _solve_cd(problem, w, b, tol, max_iter, verbose, working_set, anderson, max_epochs, p0,
              callback):
    if getattr(problem, "grouped", False):
        return solve_groups(problem, w, b, tol, max_iter, verbose, working_set, p0, callback)
    if getattr(problem, "multinomial", False):
        return solve_multinomial(problem, w, b, tol, max_iter, verbose, working_set, p0,
                                 callback)
    if problem.datafit.code == 0:
        return _solve_quadratic(problem, w, b, tol, max_iter, verbose, working_set, anderson,
                                max_epochs, p0, callback)
    code, params = problem.spec
    positive = problem.positive
    des = problem.design
    arrs = des.arrays
    y = problem.y
    logistic = problem.datafit.code == 1  # compiled end to end; the others: _newton
    sw = problem.datafit.sample_weight
    sw = np.ones(problem.n) if sw is None else np.ascontiguousarray(sw, dtype=np.float64)
    score = np.zeros(problem.p)
    lips, lam_w = problem.lips, problem.lam_w
    # the interval of gradients the prox maps to 0: lets CD skip prox calls for zeros that stay 0
    Tg = np.empty(problem.p)
    score_thresholds(code, params, lam_w, lips, Tg)

    def scores(w, z):
        G = problem.datafit.raw_grad(y, z)
        m = scores_from_grad(des.rmatvec(G), w, lips, lam_w, code, params, positive, Tg, score)
        if problem.fit_intercept:
            m = max(float(m), abs(float(G.sum())))
        return m, score, w != 0.0

    def inner(ws, w, z, b, tol_in):
        if logistic:
            n_in, b = inner_logistic(*arrs, y, sw, ws, w, z, float(b), problem.fit_intercept,
                                      lips, lam_w, code, params, positive, tol_in, 50, 50)
            return n_in, z, b
        return newton_inner(problem, ws, w, z, float(b), tol_in)

    return working_set_loop(problem, w, b, tol, max_iter, verbose, working_set, p0, callback,
                            scores, inner, NAME)


class _QuadraticSetup:
    """What the compiled least-squares loop needs besides ``alpha``, computed once per problem
    (a path reuses it for every ``alpha``)."""

    def __init__(self, problem):
        self.Lin, self.means = problem.centred_curvatures()
        self.f_null = _null_objective(problem)
        self.lbar = problem._lbar
        self.code, self.params = problem.spec
        # Anderson extrapolation kept on the current orthant face (see _inner_quadratic)
        self.convex = bool(getattr(problem.penalty, "is_convex", False))


def _solve_quadratic(problem, w, b, tol, max_iter, verbose, working_set, anderson, max_epochs, p0,
                     callback):
    """Least squares: the compiled outer loop :func:`_outer_quadratic`, in one call; with a
    ``callback`` or ``verbose``, one outer iteration per call (the loop's state is ``(w, r, b)``,
    so consecutive calls continue it)."""
    st = _QuadraticSetup(problem)
    p = problem.p
    lam_w = problem.lam_w
    t_in, Tg = np.empty(p), np.empty(p)
    prox_steps(lam_w, st.Lin, t_in)
    score_thresholds(st.code, st.params, lam_w, problem.lips, Tg)
    T = np.full(p, np.nan)  # zero thresholds of the inner steps, filled per working set
    r = np.ascontiguousarray(problem.y - problem.z(w, b))
    hist = history_buffer(max_iter)

    def run(n):
        return _outer_quadratic(*problem.design.arrays, problem.y, w, r, float(b),
                                problem.fit_intercept, problem.lips, st.Lin, st.means, lam_w,
                                t_in, Tg, T, st.code, st.params, problem.positive, tol, n,
                                max_epochs, int(anderson), p0, bool(working_set), st.f_null,
                                st.lbar, hist, st.convex)

    if callback is None and not verbose:
        it, b, crit, converged, total, n_hist = run(max_iter)
        return w, b, it, hist[:n_hist].copy(), crit, converged, {"inner_iterations": total}
    history, total, it, converged, crit = [], 0, 0, False, np.inf
    with progress(max_iter, verbose, "cd") as bar:
        for it in range(1, max_iter + 1):
            n_done, b, crit, converged, n_in, n_hist = run(1)
            if not history:
                history.append(float(hist[0]))
            if converged and n_hist == 1:
                break
            total += n_in
            history.append(float(hist[1]))
            if verbose == 2:
                print(f"it {it}: crit {crit:.3e} nnz {np.count_nonzero(w)} inner {n_in}")
            if callback is not None:
                callback(w, b)
            bar.update(1)
            bar.set_postfix(crit=f"{crit:.2e}")
    return w, b, it, np.asarray(history), crit, converged, {"inner_iterations": total}


_POLISH_FLOPS = 2e8  # the largest n |S|^2 the exact solve on the support may cost


def _l1_shares(code, params):
    """``(l1 share, ridge share)`` of a penalty that is l1 or l1 plus ridge, else ``None``."""
    if code == L1 or (code == LP and params[0] == 1.0):
        return 1.0, 0.0
    if code == MIXED:
        inner = int(params[2])
        if inner == L1 or (inner == LP and params[3] == 1.0):
            return float(params[0]), float(params[1])
    return None


def polish_l1(problem, w, b, objective=None):
    """The exact minimizer of convex l1 / elastic-net least squares, from a converged point.

    On the support ``S`` of ``w`` with its signs ``s`` the optimality conditions are linear:
    ``X_S^T (y - X_S w_S - b) / n = lam_S (rho s + (1 - rho) w_S)`` (and the intercept's
    ``mean(y - X_S w_S) = b``), one solve of ``|S|`` equations. The solution is the minimizer
    when its signs are ``s`` and every coefficient off ``S`` satisfies ``|x_j^T r| / n <= rho
    lam_j``; then it replaces ``w`` (machine precision where coordinate descent stopped at
    ``tol``: two fits of the same problem from different data, e.g. weighted against repeated
    rows, then agree to rounding). Returns ``(w, b, criterion, objective)``, or ``None`` when
    the conditions fail, the support is too large (``n |S|^2 > 2e8``, or ``|S| > n`` without a
    ridge term) or the system is singular. ``objective``: the objective at ``(w, b)`` if known.

    Cost: one product with ``X^T`` besides the solve on the support (the new point's objective,
    off-support check and criterion all come from that residual and gradient); on a sparse
    2000 x 10000 Lasso the polish cost more than the coordinate descent before."""
    shares = _l1_shares(*problem.spec) if problem.spec is not None else None
    if shares is None:
        return None
    rho, ridge = shares
    S = np.flatnonzero(w)
    n = problem.n
    if S.size == 0 or (ridge == 0.0 and S.size > n) or n * S.size * S.size > _POLISH_FLOPS:
        return None
    lam = problem.lam_w
    if not np.all(np.isfinite(lam[S])):
        return None
    sgn = np.sign(w[S])
    A, rhs, xm, ym, support_z = _support_system(problem, S)
    A[np.diag_indices_from(A)] += lam[S] * ridge
    rhs = rhs - lam[S] * rho * sgn
    try:
        wS = np.linalg.solve(A, rhs)
    except np.linalg.LinAlgError:
        return None
    held = (lam[S] > 0) | problem.positive  # unpenalized, unconstrained ones may change sign
    if not np.all(np.isfinite(wS)) or np.any(np.sign(wS[held]) != sgn[held]):
        return None
    w_new = np.zeros(problem.p)
    w_new[S] = wS
    b_new = ym - float(xm @ wS) if problem.fit_intercept else 0.0
    z = support_z(wS) + b_new  # X w_new + b_new
    G = problem.datafit.raw_grad(problem.y, z)  # (z - y) / n
    grad = problem.design.rmatvec(G)  # the datafit's gradient, -x_j^T r / n
    off = np.ones(problem.p, dtype=bool)
    off[S] = False
    bound = rho * lam[off]
    gz = -grad[off] if problem.positive else np.abs(grad[off])
    slack = 1e-10 * bound + 1e-14 * float(np.max(np.abs(grad), initial=0.0))
    if np.any(gz > bound + slack):
        return None
    F_new = problem.objective(w_new, b_new, z)
    F_old = problem.objective(w, b) if objective is None else objective
    if F_new > F_old * (1.0 + 1e-12):
        return None
    return w_new, b_new, problem.criterion_from_gradient(w_new, G, grad, F_new), F_new


_CANCEL = 1e4  # the largest mean^2 / variance of a support column centred implicitly


def _support_system(problem, S):
    """``(A, rhs, xm, ym, z_of)``: the least-squares system on the support ``S`` with the
    intercept eliminated, ``A = X_S^T (I - 11^T/n) X_S / n`` and ``rhs = X_S^T (y - ym) / n``,
    the column and target means, and ``z_of(w_S) = X_S w_S``. A sparse design forms them from
    its sparse columns (its Gram matrix ``X_S^T X_S`` costs the columns' nonzeros, not ``n
    |S|^2``), centred implicitly (``- n xm xm^T``) where that cancels at most 4 of the 16
    digits (``mean^2 / variance <= 1e4``), densely otherwise."""
    des, y, n = problem.design, problem.y, problem.n
    fi = problem.fit_intercept
    ym = float(y.mean()) if fi else 0.0
    if des.is_sparse:
        Xs = des.matrix[:, S]  # a sparse design has no column multipliers
        A = np.asarray((Xs.T @ Xs).todense()) / n
        xm = des.col_sums[S] / n if fi else np.zeros(S.size)
        diag = np.diag(A) - xm * xm
        if np.all(diag > 0.0) and np.max(xm * xm / diag) <= _CANCEL:
            A -= np.outer(xm, xm)
            rhs = np.asarray(Xs.T @ y).ravel() / n - xm * ym
            return A, rhs, xm, ym, lambda wS: np.asarray(Xs @ wS).ravel()
    XS = des.columns(S)
    xm = XS.mean(axis=0) if fi else np.zeros(S.size)
    Xc = XS - xm if fi else XS
    A = Xc.T @ Xc / n
    rhs = Xc.T @ (y - ym) / n
    return A, rhs, xm, ym, lambda wS: XS @ wS


def quadratic_path(problem, alphas, w0=None, b0=None, *, tol, max_iter=None, working_set=True,
                   anderson=5, max_epochs=5000, p0=10):
    """The least-squares fits of ``problem`` at every ``alpha`` of ``alphas`` (decreasing),
    warm-started along the grid from ``(w0, b0)`` (``None``: zeros and the best intercept), in
    one compiled call (:func:`_path_quadratic`): the same fits as :meth:`CD.solve` at each
    ``alpha`` from the previous solution. ``problem.alpha`` is not used; its penalty must not
    depend on ``alpha``. Returns ``(W, B, n_iter, criterion, converged)``, one row / entry per
    alpha."""
    reason = SOLVER.supports(problem)
    if reason or problem.datafit.code != 0:
        raise UnsupportedProblem(reason or "quadratic_path solves least-squares problems only")
    tol, max_iter = check_tol_iter(tol, SOLVER.default_max_iter if max_iter is None else max_iter)
    w, b = start_point(problem, w0, b0)
    st = _QuadraticSetup(problem)
    k, p = len(alphas), problem.p
    W, B = np.empty((k, p)), np.empty(k)
    n_iter, crit, conv = np.empty(k, dtype=np.int64), np.empty(k), np.empty(k, dtype=np.bool_)
    _path_quadratic(*problem.design.arrays, problem.y, w, float(b), problem.fit_intercept, problem.lips, st.Lin, st.means,
                    problem.weights, np.ascontiguousarray(alphas, dtype=np.float64), st.code,
                    st.params, problem.positive, float(tol), int(max_iter), int(max_epochs),
                    int(anderson), int(p0), bool(working_set), st.f_null, st.lbar, W, B, n_iter,
                    crit, conv, st.convex)
    return W, B, n_iter, crit, conv


SOLVER = CD()
solve, supports = SOLVER.solve, SOLVER.supports
