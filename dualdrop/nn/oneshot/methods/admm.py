"""ADMM on the L0-constrained (or N:M-constrained) layer problem.

The layer problem (``_layer``: unit-diagonal Gram ``Gs``, scaled weights ``u``) is

    min_U  1/2 sum_r (u_r - u0_r)^T Gs (u_r - u0_r)   subject to  U in C,

``C`` the weights with ``n_keep`` nonzeros in the whole layer (or at most ``N`` in every ``M``
consecutive inputs of each row). ALPS (Meng, Behdin, Wang & Mazumder, "ALPS: Improved
Optimization for Highly Sparse One-Shot Pruning for Large Language Models", NeurIPS 2024) splits
it as ``U = D`` with ``D in C`` and runs scaled ADMM with a growing penalty parameter ``rho``:

    U <- (Gs + rho I)^-1 (Gs u0 + rho (D - V))      (each row; one eigendecomposition of Gs
                                                     serves every rho)
    D <- P_C(U + V)                                  (keep the largest |u + v|: the projection)
    V <- V + U - D

(``V`` the scaled dual; when ``rho`` grows, ``V`` is divided by the same factor so the dual
``rho V`` is unchanged). As ``rho`` grows, ``U`` is pulled onto ``D`` and the support of ``D``
freezes; the support found is then refit by least squares (ALPS uses preconditioned conjugate
gradients for this step; on narrow layers each row's system is solved exactly by Cholesky,
``_layer.ScaledLayer.refit_rows``, on wide ones by 10 CG steps from ADMM's last point for all
rows at once, ``refit_cg``; the refit that scores a run's support is the one returned).

**At width** (:data:`WIDE`, settings :data:`AT_WIDTH`) three more things bring the iteration
near its floor of matrix products: a row whose support has not changed for 5 iterations leaves
the iteration (most rows settle well before the last; under an N:M pattern every row is its
own problem, under a layer count the settled rows' count is fixed and the others share the
rest), the CG refit above, and, while the rows outnumber the inputs, the U-step as one product
``u0 + (D - V - u0) M`` with ``M = rho (G + rho I)^-1`` formed by a ``q x q`` rank-``q``
update. On all-MiniLM-L6-v2's layers this took ADMM from 24-82x to 12-20x SparseGPT's CPU time
at the same objective to 1e-4 (benchmarks/RESULTS.md, "One-shot at width").
Boža ("Fast and Effective Weight Update for Pruned Large Language Models", 2024) uses the same
ADMM weight update, with the inverse ``(Gs + rho I)^-1`` precomputed.

The result depends on how ``rho`` grows. Two schedules:

- ``"slow"``: ``rho`` multiplied by ``growth`` every iteration, run until the support has not
  changed for ``patience`` iterations (a stable support);
- ``"alps"``: ALPS's adaptive rule with early stop: every ``rho_every`` iterations ``rho`` is
  multiplied by 1.3, 1.2 or 1.1 when the support changed in at least 10%, 0.5% or one of the
  ``k`` kept places over that window, and the iteration stops once the support has not changed
  over a whole window.

... and on the coordinates it runs in. In the scale-free ``u`` (``"scaled"``) the penalty
``rho ||u - d||^2`` weighs each input by its energy and the projection keeps the largest
``|w| ||x_j||`` (Wanda's score); in the weights' own coordinates (``"weights"``) it is ``rho ||w -
d||^2`` with ``rho`` in units of ``mean(diag G)``, and the projection keeps the largest ``|w|``.
Neither wins on every layer: on the 83 layer problems of the MNIST benchmark networks at
20/10/5% and 2:4 the slow schedule (``growth`` 1.02) in ``u`` from the layer's largest scores
was up to 7% above the plain one (``growth`` 1.05, ``w``, from the Wanda support: the reference
``tests/nn/oneshot_reference.py``) on some layers and below it on most. The default runs both
(:data:`RUNS`) and keeps the better support by its least-squares error (row by row for an N:M
pattern, where the rows are independent): never above either, the two runs' iterations
costing about what the slow one alone cost in double precision, since their matrix products
run in single precision (``precision="float32"``; the refit of the support in double: the
same objective on 81 of those layers, lower on 2).

Projections are by ``|u + v|`` in the scale-free coordinates, i.e. by ``|w| sqrt(G_jj)`` in
the original ones (the scale of an input does not change what is kept), and by ``|w + v|`` in
the weights' coordinates.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from penalties.checks import check_choice, check_float, check_int

from .base import Budget, OneShotMethod
from ._layer import ScaledLayer
from .polish import KERNELS as POLISH_KERNELS, check_effort, polish_support

__all__ = ["ADMM", "SCHEDULES", "WIDE", "admm_support", "at_width", "check_sized", "sized"]

SCHEDULES = ("alps", "slow")

# ALPS's rho rule: (fraction of the kept places that changed over a window, factor), in order
ALPS_STEPS = ((0.1, 1.3), (0.005, 1.2), (0.0, 1.1))


def _top_count(A, k):
    """The ``k`` largest entries of ``A`` (``|Z|``, any shape): a partial selection of the
    threshold, then the entries above it and the first (lowest flat index) equal to it."""
    mask = np.zeros(A.shape, dtype=bool)
    n = A.size
    if k >= n:
        mask[:] = True
    elif k > 0:
        flat = A.ravel()
        thr = np.partition(flat, n - k)[n - k]
        mask = A > thr
        short = k - int(np.count_nonzero(mask))
        if short:
            mask.ravel()[np.flatnonzero(flat == thr)[:short]] = True
    return mask


def _top_groups(A, sl, pattern):
    """The ``N`` largest ``A`` of every group of ``M`` consecutive inputs of each row (ties to
    the lower index, as ``base.select_mask``), rows ``(r, q)`` of live inputs: each entry's rank
    in its group by ``M (M - 1)`` elementwise comparisons (ten times faster than a sort along
    groups of four); dead inputs count as ``-inf``."""
    N, M = pattern
    r = A.shape[0]
    full = A
    if sl.q < sl.p:
        full = np.full((r, sl.p), -np.inf, dtype=A.dtype)
        full[:, sl.live] = A
    g = full.reshape(r, -1, M)
    rank = np.zeros(g.shape, dtype=np.int16)
    for i in range(M):
        for j in range(M):
            if i != j:  # i outranks j: larger, or equal at a lower index
                rank[..., j] += (g[..., i] >= g[..., j]) if i < j else (g[..., i] > g[..., j])
    keep = (rank < N).reshape(r, sl.p)
    return keep if sl.q == sl.p else keep[:, sl.live]


def _project(Z, sl, k, budget):
    """The live support of ``P_C(Z)``: the ``k`` largest ``|Z|`` of the rows (a partial
    selection: this runs every iteration), or the ``N`` largest of each group."""
    if budget.pattern is not None:
        return _top_groups(np.abs(Z), sl, budget.pattern)
    return _top_count(np.abs(Z), k)


def admm_support(sl: ScaledLayer, budget: Budget, *, schedule="slow", rho0=0.1, growth=1.02,
                 rho_every=3, patience=20, max_iter=1000, coordinates="scaled", start="top",
                 precision="float64", callback=None, shrink=None, freeze=False, fold=False,
                 max_row_iterations=None):
    """Run ADMM (module docstring) on ``sl`` in the ``coordinates`` ``"scaled"`` (``u``) or
    ``"weights"`` (``w``), from ``start`` (``"top"``: the layer's largest ``|u0|``; ``"wanda"``:
    each row's; or ``(mask, values)``: a live support that meets the budget and its scaled
    values, e.g. another run's result), the matrix products in ``precision``; returns ``(mask, D, info)``: the live
    support ``(R, q)``, ADMM's last projected point ``D`` (scaled, on that support) and
    ``{"iterations", "rho", "seconds", "stopped", "row_iterations"}``. ``callback(t, mask)``
    runs after each iteration. ``shrink(Z, mask, rho)``, if given, returns the D-step (0 off
    ``mask``; the projection keeps ``Z`` itself on it, a penalty's prox shrinks it:
    ``_split.split_support``).

    ``freeze`` (slow schedule): a row whose support has not changed for ``patience`` iterations
    leaves the iteration with that support (its share of a layer count fixed; the other rows
    share the rest), so the products shrink as rows settle; without it the whole layer stops
    once its support has not changed for ``patience`` iterations. Under an N:M pattern the rows
    are independent problems and the frozen row ends where its own stopping rule ends it.
    ``max_row_iterations``: stop before the rows' iterations (each iterating row counts one
    per iteration) would pass it, the supports where they are (every one meets the budget).
    ``fold``: while the iterating rows outnumber the inputs, the U-step as one product (the
    loop's comment): about 0.6x the products' time on a layer of four times more outputs than
    inputs."""
    t0 = time.perf_counter()
    k = sl.live_target(budget)
    dtype = np.float32 if precision == "float32" else np.float64
    if coordinates == "weights":  # w_j = s u_j / d_j, the live Gram d_j G_s d_j
        to_w = sl.scale / sl.d
        U0 = sl.U0 * to_w
        Gl = sl.Gs * np.outer(sl.d, sl.d)
        rho_unit = float(np.sum(sl.d ** 2)) / sl.p  # mean(diag G) over every input
    else:
        to_w = None
        U0, Gl, rho_unit = sl.U0, sl.Gs, 1.0
    key = ("eigh", coordinates, dtype)
    if key not in sl.cache:  # one eigendecomposition per coordinate system, shared by runs
        lam, Q = np.linalg.eigh(Gl)
        sl.cache[key] = (np.clip(lam, 0.0, None).astype(dtype), Q.astype(dtype))
    lam, Q = sl.cache[key]
    A = ((U0 @ Q) * lam).astype(dtype)  # G u0_r in the eigenbasis, every row
    U0d = U0.astype(dtype)
    if isinstance(start, tuple):  # a support meeting the budget and its (scaled) values
        mask, D = np.array(start[0], dtype=bool), start[1]  # a copy: frozen rows write into it
        D = np.where(mask, D if to_w is None else D * to_w, 0.0).astype(dtype)
    else:
        if start == "wanda":  # each row's best |w| ||x_j|| (= |u0|), the count split evenly
            mask = _row_top(sl.U0, k, sl, budget)
        else:
            mask = _project(sl.U0, sl, k, budget)
        D = np.where(mask, U0, 0.0).astype(dtype)
    V = np.zeros_like(D)
    freeze = freeze and schedule == "slow"
    rows = np.arange(sl.R)  # the rows still iterating (all of them without freeze)
    full_mask, full_D = mask, D  # every row's support and D (frozen rows: final)
    k_live = k  # the count the iterating rows share
    row_stable = np.zeros(sl.R, dtype=np.int64)
    row_iterations = 0
    rho = float(rho0) * rho_unit
    window_changes = 0
    stable = 0
    stopped = "max_iter"
    t = 0
    for t in range(1, max_iter + 1):
        if max_row_iterations is not None and row_iterations + rows.size > max_row_iterations:
            stopped, t = "budget", t - 1
            break
        row_iterations += rows.size
        if fold and rows.size > Q.shape[0]:
            # U = u0 + (D - V - u0) M with M = rho (Gl + rho I)^-1 = Q diag(rho / (lam + rho))
            # Q^T: one (r x q)(q x q) product and a q x q one (numpy's symmetric rank-k
            # update) instead of two (r x q)(q x q) products, when the rows outnumber the inputs
            Qc = Q * np.sqrt(dtype(rho) / (lam + dtype(rho)))
            U = (D - V - U0d) @ (Qc @ Qc.T)
            U += U0d
        else:
            T = (D - V) @ Q
            T *= dtype(rho)
            T += A
            T /= lam + dtype(rho)
            U = T @ Q.T
        Z = U + V
        new = _project(Z, sl, k_live, budget)
        diff = new != mask
        mask = new
        D = np.where(mask, Z, 0.0) if shrink is None else shrink(Z, mask, rho)
        V = Z - D
        if callback is not None:
            if freeze:
                full_mask[rows] = mask
            callback(t, full_mask if freeze else mask)
        if schedule == "alps":
            window_changes += int(np.count_nonzero(diff)) // 2
            if t % rho_every == 0:
                if window_changes == 0:
                    stopped = "stable"
                    break
                for frac, factor in ALPS_STEPS:
                    if window_changes > frac * k:
                        break
                rho *= factor
                V /= dtype(factor)
                window_changes = 0
            continue
        if freeze:
            row_stable[rows] = np.where(diff.any(axis=1), 0, row_stable[rows] + 1)
            going = row_stable[rows] < patience
            if not going.any():
                stopped = "stable"
                break
            if np.count_nonzero(~going) * 8 >= rows.size:  # drop settled rows (in batches:
                # each drop copies the iterating rows' arrays)
                done = ~going
                full_mask[rows[done]], full_D[rows[done]] = mask[done], D[done]
                if budget.pattern is None:
                    k_live -= int(np.count_nonzero(mask[done]))
                rows = rows[going]
                mask, D, V, A, U0d = mask[going], D[going], V[going], A[going], U0d[going]
        else:
            stable = 0 if diff.any() else stable + 1
            if stable >= patience:
                stopped = "stable"
                break
        rho *= growth
        V /= dtype(growth)
    if freeze:
        full_mask[rows], full_D[rows] = mask, D
        mask, D = full_mask, full_D
    D = D.astype(np.float64)
    if to_w is not None:
        D = D / to_w
    info = {"iterations": t, "rho": rho, "seconds": time.perf_counter() - t0,
            "stopped": stopped, "row_iterations": row_iterations}
    return mask, D, info


def _row_top(U0, k, sl, budget):
    """Wanda's support in scaled coordinates: each row's largest ``|u0|`` (Wanda's score
    ``|w| ||x_j||`` up to the layer's scale), ``k`` in all split as evenly as the rows allow
    (a pattern: the N largest of each group, as :func:`_project`)."""
    if budget.pattern is not None:
        return sl.top_mask(np.abs(U0), budget)
    R, q = U0.shape
    counts = np.full(R, min(q, k // R))
    extra = k - int(counts.sum())
    counts[:extra] += 1  # k <= R q: room in every row
    order = np.argsort(-np.abs(U0), axis=1, kind="stable")
    mask = np.zeros((R, q), dtype=bool)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(q)[None, :].repeat(R, 0), axis=1)
    mask[rank < counts[:, None]] = True
    return mask


#: Layers at least this wide in both outputs and live inputs (all-MiniLM-L6-v2's width; the
#: small benchmark networks' layers, LeNet-300-100's 300 x 784 the widest, are below it) get the
#: settings of :data:`AT_WIDTH` by default: measured on MiniLM's layers, the same objective to
#: 1e-4 (relative) at 0.5-0.6x the time (benchmarks/RESULTS.md, "One-shot at width")
WIDE = 384
#: rows leave the iteration once their support has not changed for 5 iterations, each run's
#: support is refit by 10 conjugate-gradient steps from its last point (ALPS's refit), the
#: U-step is one product while the rows outnumber the inputs (``admm_support``'s ``fold``)
AT_WIDTH = {"patience": 5, "freeze": True, "cg_steps": 10, "fold": True}
NARROW = {"patience": 20, "freeze": False, "cg_steps": 0, "fold": False}


def at_width(sl: ScaledLayer) -> bool:
    """Whether ``sl`` is a wide layer (:data:`WIDE`)."""
    return min(sl.R, sl.q) >= WIDE


#: the default run of each coordinate system: its start, growth of rho and iteration cap
RUNS = {"scaled": {"start": "top", "growth": 1.02, "max_iter": 1000},
        "weights": {"start": "wanda", "growth": 1.05, "max_iter": 400}}


def pick_better(sl: ScaledLayer, budget: Budget, runs, cg_steps=0, errors=False):
    """The better of several ADMM results ``(mask, D, info)`` by the least-squares error of
    their supports (:meth:`ScaledLayer.refit_rows`, or with ``cg_steps`` that many conjugate
    gradient steps from the run's ``D``, :meth:`ScaledLayer.refit_cg`): row by row for a
    pattern (the rows are independent there), the whole layer otherwise (one count shared by
    the rows). Returns ``(mask, U, D, index of the run that won the most rows)``, ``U`` the
    support's least-squares weights (scaled), the refit the scores came from, ``D`` the runs'
    own values there; with ``errors``, the rows' errors at ``U`` after them."""
    seen = {}  # runs that ended on the same support share its refit
    for m, D, _ in runs:
        if m.tobytes() not in seen:
            seen[m.tobytes()] = sl.refit_cg(m, D, cg_steps) if cg_steps else sl.refit_rows(m)
    fits = [seen[m.tobytes()] for m, _, _ in runs]
    errs = np.array([e for _, e in fits])
    if budget.pattern is None:
        best = int(np.argmin(errs.sum(axis=1)))
        out = runs[best][0], fits[best][0], runs[best][1], best
        return (*out, errs[best]) if errors else out
    pick = np.argmin(errs, axis=0)  # ties to the first run
    mask = np.stack([runs[i][0][r] for r, i in enumerate(pick)])
    U = np.stack([fits[i][0][r] for r, i in enumerate(pick)])
    D = np.stack([runs[i][1][r] for r, i in enumerate(pick)])
    out = mask, U, D, int(np.bincount(pick, minlength=len(runs)).argmax())
    return (*out, errs[pick, np.arange(sl.R)]) if errors else out


def sized(options, sl: ScaledLayer) -> dict:
    """``patience``, ``freeze``, ``cg_steps`` and ``fold`` for the layer ``sl``: the
    ``options`` given,
    the others from :data:`AT_WIDTH` or :data:`NARROW` (:func:`at_width`)."""
    base = AT_WIDTH if at_width(sl) else NARROW
    return {k: base[k] if options.get(k) is None else options[k] for k in base}


def check_sized(opts):
    """Check the options of :func:`sized` in ``opts`` (in place): ``None`` or a valid value."""
    if opts["patience"] is not None:
        opts["patience"] = check_int("patience", opts["patience"], low=1)
    for key in ("freeze", "fold"):
        if opts[key] is not None and not isinstance(opts[key], bool):
            raise TypeError(f"{key} must be True, False or None, got {opts[key]!r}")
    if opts["cg_steps"] is not None:
        opts["cg_steps"] = check_int("cg_steps", opts["cg_steps"], low=0)


class ADMM(OneShotMethod):
    """ADMM on the L0- or N:M-constrained layer problem (module docstring).

    Options: ``coordinates`` (``"both"``, default: the two runs of :data:`RUNS`, the better
    support kept by its least-squares error, row by row for a pattern; ``"scaled"``: the
    scale-free coordinates, projections by ``|w| ||x_j||``, from the layer's largest such
    scores; ``"weights"``: the weights' own coordinates, projections by ``|w|``, from the Wanda
    support), ``schedule`` (``"slow"``, default: rho times ``growth`` every iteration until the
    support is stable for ``patience`` iterations; ``"alps"``: ALPS's adaptive rule with early
    stop, checked every ``rho_every`` iterations), ``rho0`` (the first rho, in units of the
    mean of ``diag G``), ``growth``, ``start`` (``"top"`` or ``"wanda"``) and ``max_iter``
    (``None``: each run's own, :data:`RUNS`; alps 300), ``patience``, ``freeze`` (rows leave
    the iteration once their own support has settled, :func:`admm_support`), ``cg_steps``
    (each run's support refit by that many conjugate-gradient steps from its last point; 0:
    exactly, by Cholesky) and ``fold`` (the U-step as one product while the rows outnumber the
    inputs, :func:`admm_support`), each ``None`` by default: :data:`AT_WIDTH` on layers of at least
    :data:`WIDE` outputs and live inputs, :data:`NARROW` below; ``precision``
    (``"float32"``, default: the iterations' matrix products in single precision, the supports'
    refit in double; ``"float64"``), ``refit`` (default True: the support's least squares,
    ALPS's last step; False returns ADMM's projected point ``D``) and ``polish`` (default False;
    True or ``"full"``, ``"swaps"``: the support polish of ``polish.py`` after it)."""

    name = "admm"
    refits_itself = True
    defaults = {"coordinates": "both", "schedule": "slow", "rho0": 0.1, "growth": None,
                "rho_every": 3, "patience": None, "max_iter": None, "start": None,
                "precision": "float32", "refit": True, "polish": False, "freeze": None,
                "cg_steps": None, "fold": None}

    def _validate(self, opts):
        opts["coordinates"] = check_choice("coordinates", opts["coordinates"],
                                           {"both", "weights", "scaled"})
        opts["schedule"] = check_choice("schedule", opts["schedule"], set(SCHEDULES))
        opts["rho0"] = check_float("rho0", opts["rho0"], low=0.0, low_open=True)
        if opts["growth"] is not None:
            opts["growth"] = check_float("growth", opts["growth"], low=1.0, low_open=True)
        opts["rho_every"] = check_int("rho_every", opts["rho_every"], low=1)
        check_sized(opts)
        if opts["max_iter"] is not None:
            opts["max_iter"] = check_int("max_iter", opts["max_iter"], low=1)
        if opts["start"] is not None:
            opts["start"] = check_choice("start", opts["start"], {"wanda", "top"})
        opts["precision"] = check_choice("precision", opts["precision"],
                                         {"float64", "float32"})
        opts["polish"] = check_effort("polish", opts["polish"])
        if opts["polish"] and not opts["refit"]:
            raise ValueError("polish=True scores supports by their least-squares refit; it "
                             "needs refit=True")
        return opts

    def kernels(self) -> tuple:
        return POLISH_KERNELS if self.options["polish"] else ()

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        sl = ScaledLayer(W0, G)
        o = self.options
        coords = ("scaled", "weights") if o["coordinates"] == "both" else (o["coordinates"],)
        size = sized(o, sl)
        runs = []
        for c in coords:
            run = RUNS[c]
            max_iter = o["max_iter"] or (300 if o["schedule"] == "alps" else run["max_iter"])
            runs.append(admm_support(
                sl, budget, schedule=o["schedule"], rho0=o["rho0"],
                growth=o["growth"] or run["growth"], rho_every=o["rho_every"],
                patience=size["patience"], max_iter=max_iter, coordinates=c,
                start=o["start"] or run["start"], precision=o["precision"],
                freeze=size["freeze"], fold=size["fold"]))
        if len(runs) > 1 or (o["refit"] and not o["polish"]):
            mask, U, D, won = pick_better(sl, budget, runs, size["cg_steps"])
        else:
            (mask, D, _), won = runs[0], 0
        self.info = {**runs[won][2], "runs": {c: r[2] for c, r in zip(coords, runs)},
                     "kept": coords[won]}
        if not o["refit"]:
            return sl.finish(mask, budget, values=D, refit=False)
        if o["polish"]:
            return sl.finish(polish_support(sl, mask, budget, o["polish"]), budget)
        # the least squares on the support that scored it (the dead weights the budget needs
        # keep their trained values: they do not reach the output)
        return sl.finish(mask, budget, values=U, refit=False)
