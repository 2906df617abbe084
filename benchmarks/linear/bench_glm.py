"""GLMs and groups against skglm (and the multinomial against scikit-learn's saga) at matched
objective: Huber, Poisson, Gamma, Cox (Breslow), group lasso, sparse group lasso, each with the
l1 / group penalty skglm has, and the l1-penalized multinomial logistic model.

Designs: ``dualdrop.linear.synthetic.make_sparse_problem`` (correlated Gaussian columns, AR(1)
correlation 0.5, standardized), a sparse truth; the target drawn from each model (Student t(2)
noise for Huber, Poisson counts, Gamma with shape 2, exponential survival times with 30%
censoring and ties, classes from a softmax). Penalty strengths ``alpha_max / {10, 50}``
(``dualdrop.linear.alpha_max`` of the problem). Both methods solve the same problem
(``scaling="none"``, the intercept fitted but for Cox and the sparse group lasso, whose skglm
solver fails with one), and every objective is computed here by the same code.

Matched objective: ``best`` is the lowest objective over both methods and every tol; each
method is timed at the loosest tol in 1e-2 .. 1e-10 whose objective is within ``--rtol`` (1e-7,
relative) of ``best``. Timings: medians of ``--repeats`` interleaved rounds (one run of each
method per round: a change of load on the shared machine hits both alike), wall and process-CPU
time, one thread (numba, BLAS). Ratio: ours / peer (below 1: we are faster). skglm's Cox
estimator passes its ``method`` string where a boolean is expected (``"breslow"`` selects
Efron), so its datafit ``Cox(use_efron=False)`` and ``ProxNewton`` are called directly.

Run:  nice -n 10 python3 benchmarks/linear/bench_glm.py --repeats 5 --markdown out.md
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dualdrop.linear import (SparseCoxRegression, SparseGammaRegression,  # noqa: E402
                             SparseHuberRegression, SparseLinearRegression,
                             SparseMultinomialRegression, SparsePoissonRegression, alpha_max)
from dualdrop.linear.datafits import get_datafit  # noqa: E402
from dualdrop.linear.synthetic import make_sparse_problem  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matched import fit_time, matched_row  # noqa: E402

GROUP = 10  # group size of the group rows
TAU = 0.5  # the l1 share of the sparse group lasso
DELTA = 1.0  # Huber's threshold


# ---- data -------------------------------------------------------------------------------------

def data(kind, n, p, seed):
    X, _, w = make_sparse_problem(n, p, support=0.02, snr=5.0, rho=0.5, random_state=seed)
    rng = np.random.default_rng(seed)
    z = X @ (0.5 * w / max(1.0, np.sqrt(np.count_nonzero(w)) / 3))
    if kind == "huber":
        return X, X @ w + rng.standard_t(2, n)
    if kind in ("group", "sgl"):
        return X, X @ w + 0.5 * rng.standard_normal(n)
    if kind == "poisson":
        return X, rng.poisson(np.exp(z + 0.5)).astype(float)
    if kind == "gamma":
        return X, rng.gamma(2.0, np.exp(z + 0.5) / 2.0)
    if kind == "cox":
        t = np.round(rng.exponential(np.exp(-z)), 2) + 0.01
        c = rng.exponential(np.quantile(t, 0.8), n)
        return X, np.column_stack([np.minimum(t, c), (t <= c).astype(float)])
    if kind == "multinomial":
        W = rng.standard_normal((p, 4)) * (w != 0)[:, None]
        logits = X @ W
        u = rng.random(n)[:, None]
        P = np.exp(logits - logits.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        return X, (u > np.cumsum(P, axis=1)).sum(1)
    raise ValueError(kind)


# ---- the two methods of each row --------------------------------------------------------------

class _SkglmCox:
    """skglm's Breslow Cox with L1 through its ProxNewton (see the module docstring)."""

    def __init__(self, alpha, tol):
        self.alpha, self.tol = alpha, tol

    def fit(self, X, y):
        from skglm.datafits import Cox
        from skglm.penalties import L1
        from skglm.solvers import ProxNewton

        df = Cox(use_efron=False)
        Xf = np.asfortranarray(X)
        df.initialize(Xf, y)
        self.coef_ = ProxNewton(tol=self.tol, fit_intercept=False, max_iter=1000).solve(
            Xf, y, df, L1(self.alpha))[0]
        self.intercept_ = 0.0
        return self


def _skglm_glm(datafit, penalty, solver):
    from skglm import GeneralizedLinearEstimator

    return GeneralizedLinearEstimator(datafit, penalty, solver)


def methods(kind):
    """``{name: make(alpha, tol)}``: ours first, then the peer."""
    from skglm import GroupLasso
    from skglm.datafits import Gamma, Huber, Poisson, QuadraticGroup
    from skglm.penalties import L1, WeightedL1GroupL2
    from skglm.solvers import AndersonCD, GroupBCD, ProxNewton

    if kind == "huber":
        return {"ours": lambda a, t: SparseHuberRegression(delta=DELTA, alpha=a, tol=t,
                                                           scaling="none", max_iter=1000),
                "skglm": lambda a, t: _skglm_glm(Huber(DELTA), L1(a), AndersonCD(
                    tol=t, fit_intercept=True, max_iter=1000))}
    if kind in ("poisson", "gamma"):
        ours = SparsePoissonRegression if kind == "poisson" else SparseGammaRegression
        df = Poisson if kind == "poisson" else Gamma
        return {"ours": lambda a, t: ours(alpha=a, tol=t, scaling="none", max_iter=1000),
                "skglm": lambda a, t: _skglm_glm(df(), L1(a), ProxNewton(
                    tol=t, fit_intercept=True, max_iter=1000))}
    if kind == "cox":
        return {"ours": lambda a, t: SparseCoxRegression(alpha=a, tol=t, scaling="none",
                                                         max_iter=1000),
                "skglm": lambda a, t: _SkglmCox(a, t)}
    if kind == "group":
        return {"ours": lambda a, t: SparseLinearRegression(alpha=a, tol=t, groups=GROUP,
                                                            scaling="none", max_iter=1000),
                "skglm": lambda a, t: GroupLasso(groups=GROUP, alpha=a, tol=t, max_iter=1000)}
    if kind == "sgl":
        def skglm_sgl(a, t, p):
            ptr = np.arange(0, p + 1, GROUP, dtype=np.int32)
            idx = np.arange(p, dtype=np.int32)
            pen = WeightedL1GroupL2(alpha=a, weights_groups=(1 - TAU) * np.ones(p // GROUP),
                                    weights_features=TAU * np.ones(p), grp_ptr=ptr,
                                    grp_indices=idx)
            return _skglm_glm(QuadraticGroup(ptr, idx), pen, GroupBCD(
                tol=t, max_iter=1000, fit_intercept=False, ws_strategy="fixpoint"))

        return {"ours": lambda a, t: SparseLinearRegression(
                    alpha=a, tol=t, groups=GROUP, group_l1_ratio=TAU, fit_intercept=False,
                    scaling="none", max_iter=1000),
                "skglm": skglm_sgl}
    if kind == "multinomial":
        from sklearn.linear_model import LogisticRegression

        def saga(a, t, n):
            return LogisticRegression(C=1.0 / (a * n), l1_ratio=1.0, solver="saga", tol=t,
                                      max_iter=100000)

        return {"ours": lambda a, t: SparseMultinomialRegression(
                    alpha=a, tol=t, grouped=False, scaling="none", max_iter=1000),
                "sklearn saga": saga}
    raise ValueError(kind)


def objective(kind, X, y, alpha, est):
    """The objective of ``kind`` at a fitted estimator's coefficients (the same code for every
    method)."""
    coef = np.asarray(est.coef_, dtype=np.float64)
    if kind == "multinomial":
        Y = np.eye(coef.shape[0])[np.searchsorted(np.unique(y), y)]
        Z = X @ coef.T + est.intercept_
        return get_datafit("multinomial").value(Y, Z) + alpha * float(np.abs(coef).sum())
    coef = coef.ravel()
    z = X @ coef + float(np.ravel(est.intercept_)[0] if np.ndim(est.intercept_) else
                         est.intercept_)
    if kind in ("group", "sgl"):
        fit = 0.5 * float(np.mean((y - z) ** 2))
        norms = np.linalg.norm(coef.reshape(-1, GROUP), axis=1).sum()
        pen = norms if kind == "group" else (1 - TAU) * norms + TAU * np.abs(coef).sum()
        return fit + alpha * float(pen)
    df = get_datafit(kind, **({"delta": DELTA} if kind == "huber" else {}))
    return df.value(y, z) + alpha * float(np.abs(coef).sum())


def _make(kind, make, a, t, X):
    try:
        return make(a, t)
    except TypeError:  # the peers that need the design's sizes
        return make(a, t, X.shape[1] if kind == "sgl" else X.shape[0])


def row(kind, X, y, alpha, args):
    meths = {name: (lambda t, make=make: _make(kind, make, alpha, t, X))
             for name, make in methods(kind).items()}
    return matched_row(meths, lambda est: objective(kind, X, y, alpha, est), X, y,
                       rtol=args.rtol, repeats=args.repeats, budget=args.budget)


SIZES = {"huber": (1000, 2000), "poisson": (1000, 1000), "gamma": (1000, 1000),
         "cox": (1000, 500), "group": (1000, 2000), "sgl": (1000, 2000),
         "multinomial": (1000, 200)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rtol", type=float, default=1e-7)
    ap.add_argument("--budget", type=float, default=30.0, help="seconds: stop a tol scan there")
    ap.add_argument("--kinds", nargs="+", default=list(SIZES))
    ap.add_argument("--divisors", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply n and p (quick runs)")
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    for kind in args.kinds:  # JIT warm-up of both methods, on small data
        X, y = data(kind, 100, 100, 1)
        a = alpha_max(X, y, **_amax_kw(kind)) / 10
        for make in methods(kind).values():
            fit_time(_make(kind, make, a, 1e-4, X), X, y)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"Command: `python3 benchmarks/linear/bench_glm.py {cmd}`", "",
             f"Load average at the start: {load} (the machine was shared).", "",
             "| problem | n x p | alpha | nnz | ours tol | peer tol | ours s | peer s | "
             "ours/peer (wall) | ours/peer (cpu) |", "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for kind in args.kinds:
        n, p = (max(50, int(v * args.scale)) for v in SIZES[kind])
        p -= p % GROUP
        X, y = data(kind, n, p, args.seed)
        amax = alpha_max(X, y, **_amax_kw(kind))
        for d in args.divisors:
            r = row(kind, X, y, amax / d, args)
            o, s = r["ours"], r[[m for m in r if m not in ("ours", "best")][0]]
            peer = [m for m in r if m not in ("ours", "best")][0]
            nnz = int(np.count_nonzero(_make(kind, methods(kind)["ours"], amax / d, o["tol"],
                                             X).fit(X, y).coef_))
            lines.append(f"| {kind} ({peer}) | {n} x {p} | alpha_max/{d} | {nnz} | "
                         f"{o['tol']:g} | {s['tol']:g} | {o['wall']:.4f} | {s['wall']:.4f} | "
                         f"{o['wall'] / s['wall']:.2f} | {o['cpu'] / s['cpu']:.2f} |")
            print(lines[-1], flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


def _amax_kw(kind):
    """``alpha_max`` arguments of a row's problem."""
    if kind in ("group", "sgl"):
        return {"groups": GROUP, "scaling": "none", "group_l1_ratio": TAU if kind == "sgl" else 0.0,
                "fit_intercept": kind == "group"}
    kw = {"datafit": "quadratic" if kind in ("group", "sgl") else kind, "scaling": "none"}
    if kind == "huber":
        kw["datafit_params"] = {"delta": DELTA}
    return kw


if __name__ == "__main__":
    main()
