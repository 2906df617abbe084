"""Sparse linear estimators: dualdrop.linear against skglm, scikit-learn and cvxpy.

Protocol (every method on the same data, same objective, same alpha):

- design: correlated Gaussian, Toeplitz correlation rho^|i-j| (rho = 0.5, an AR(1) across
  columns), centred and standardized (||x_j||^2 / n = 1); truth with a fraction ``--support`` of
  nonzeros (random signs, magnitude 1); y = X w* + noise at signal-to-noise ratio ``--snr`` (std),
  centred; no intercept for anyone;
- alpha = alpha_max / 20 with alpha_max = ||X^T y||_inf / n, for every penalty: Lasso, MCP
  (gamma = a = 3: skglm MCPenalty(alpha, 3) == alpha * penalties.MCP(a=3, lam=alpha)) and LogSum
  (eps: skglm LogSumPenalty(alpha, eps) == alpha * penalties.LogSum(eps));
- objective of every result evaluated by one function; "best" = lowest over all methods and tols;
- each method is run at tol = 1e-2, 1e-3, ..., 1e-10 (a scan stops early past ``--budget`` s);
  "time to best" is the median of ``--repeats`` interleaved runs (each round runs every method
  once, so a change of machine load hits all alike) at the loosest tol whose objective is within
  ``--rtol`` (1e-6, relative) of the best; "time to own limit" the same for the method's own best
  objective (on nonconvex problems solvers stop at different stationary points: this is the time
  to converge, and "own limit vs best" says how good the point is). After a JIT warm-up on a small
  problem. The slow MM/first-order solvers are run once at tol 1e-8 within an iteration cap.
- first-fit overhead: a fresh Python process times its first fit of a small MCP problem (numba
  compilation or cache loading included), for us and for skglm.

Run:  python3 benchmarks/linear/bench_linear.py --sizes 500x5000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

# Every method here is a sequential algorithm whose BLAS calls are memory-bound matrix-vector
# products; on a shared machine multithreaded OpenBLAS oversubscribes the cores and distorts the
# timings (we measured 100x slowdowns of small Cholesky factorizations). One BLAS thread for all.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")


import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import penalties  # noqa: E402
from dualdrop.linear import Problem, Quadratic, get_solver  # noqa: E402
from dualdrop.linear.synthetic import make_sparse_problem  # noqa: E402

TOLS = [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10]


def make_data(n, p, support, snr, rho=0.5, seed=0):
    return make_sparse_problem(n, p, support, snr, rho, random_state=seed)


def penalty_of(kind, alpha, eps):
    if kind == "lasso":
        return penalties.get("l1")
    if kind == "mcp":
        return penalties.get("mcp", a=3.0, lam=alpha)
    return penalties.get("logsum", eps=eps)


# ---- method runners: (X, y, alpha, tol) -> coef ------------------------------------------------
def ours(solver, kind, eps, **opts):
    def run(X, y, alpha, tol):
        pr = Problem(X, y, Quadratic(), penalty_of(kind, alpha, eps), alpha, fit_intercept=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return get_solver(solver).solve(pr, tol=tol, **opts).coef
    return run


def skglm_run(kind, eps):
    import skglm
    from skglm import GeneralizedLinearEstimator
    from skglm.datafits import Quadratic as SQ
    from skglm.penalties import LogSumPenalty
    from skglm.solvers import AndersonCD

    def run(X, y, alpha, tol):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "lasso":
                m = skglm.Lasso(alpha=alpha, tol=tol, fit_intercept=False, max_iter=1000)
            elif kind == "mcp":
                m = skglm.MCPRegression(alpha=alpha, gamma=3.0, tol=tol, fit_intercept=False,
                                        max_iter=1000)
            else:
                m = GeneralizedLinearEstimator(SQ(), LogSumPenalty(alpha, eps),
                                               AndersonCD(tol=tol, fit_intercept=False, max_iter=1000))
            return np.asarray(m.fit(X, y).coef_).ravel()
    return run


def sklearn_run(X, y, alpha, tol):
    from sklearn.linear_model import Lasso

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Lasso(alpha=alpha, tol=tol, fit_intercept=False, max_iter=100000).fit(X, y).coef_


def cvxpy_run(X, y, alpha, tol):
    pr = Problem(X, y, Quadratic(), penalties.get("l1"), alpha, fit_intercept=False)
    return get_solver("cvxpy").solve(pr, tol=max(tol, 1e-10)).coef


def methods_for(kind, eps, with_cvxpy, all_ours):
    """name -> (runner, scan). ``scan=False``: one run at tol 1e-8 within its iteration cap (the
    slow first-order/MM solvers: reported with the gap they reach, not timed to the target)."""
    m = {"dualdrop cd": (ours("cd", kind, eps), True)}
    if kind == "lasso":
        m["skglm Lasso"] = (skglm_run(kind, eps), True)
        m["sklearn Lasso"] = (sklearn_run, True)
        if with_cvxpy:
            m["cvxpy (Clarabel)"] = (cvxpy_run, False)
    elif kind == "mcp":
        m["skglm MCPRegression"] = (skglm_run(kind, eps), True)
        if all_ours:
            m["dualdrop reweighted_l1"] = (ours("reweighted_l1", kind, eps), True)
            m["dualdrop irls (100 it.)"] = (ours("irls", kind, eps, max_iter=100), False)
    else:
        m["skglm LogSum (AndersonCD)"] = (skglm_run(kind, eps), True)
        if all_ours:
            m["dualdrop reweighted_l1"] = (ours("reweighted_l1", kind, eps), True)
            m["dualdrop irls (100 it.)"] = (ours("irls", kind, eps, max_iter=100), False)
            m["dualdrop adaprox (2000 it.)"] = (ours("adaprox", kind, eps, max_iter=2000), False)
            m["dualdrop adaprox eta_at=iterate (2000 it.)"] = (
                ours("adaprox", kind, eps, max_iter=2000, eta_at="iterate"), False)
            m["dualdrop adatikhonov (2000 it.)"] = (ours("adatikhonov", kind, eps, max_iter=2000), False)
            m["dualdrop eta_trick (2000 it.)"] = (ours("eta_trick", kind, eps, max_iter=2000), False)
    return m


def timed(fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def interleaved(configs, run, repeats):
    """``{(method, tol): (median time, times)}``: ``repeats`` rounds, each running every
    configuration once, so that a change of machine load hits every method alike."""
    configs = sorted(configs, key=str)
    times = {c: [] for c in configs}
    for _ in range(repeats):
        for c in configs:
            times[c].append(timed(run, *c)[0])
    return {c: (float(np.median(v)), v) for c, v in times.items()}


def bench_problem(X, y, wtrue, kind, eps, args, with_cvxpy):
    n = X.shape[0]
    alpha = float(np.max(np.abs(X.T @ y)) / n / 20)
    pr = Problem(X, y, Quadratic(), penalty_of(kind, alpha, eps), alpha, fit_intercept=False)
    methods = methods_for(kind, eps, with_cvxpy, args.all_ours)
    scans = {}
    for name, (fn, scan) in methods.items():
        runs = []
        tols = TOLS if scan else [1e-8]
        for tol in tols:
            t, coef = timed(fn, X, y, alpha, tol)
            runs.append((tol, t, pr.objective(coef, 0.0), coef))
            if t > args.budget:
                break
        scans[name] = runs
    best = min(r[2] for runs in scans.values() for r in runs)
    hits = {}
    for name, runs in scans.items():
        own = min(r[2] for r in runs)
        hits[name] = (next((r for r in runs if r[2] <= best + args.rtol * abs(best)), None),
                      next(r for r in runs if r[2] <= own + args.rtol * abs(own)), own)
    med = interleaved({(name, h[0]) for name, hh in hits.items() if methods[name][1]
                       for h in hh[:2] if h is not None},
                      lambda name, tol: methods[name][0](X, y, alpha, tol), args.repeats)
    rows = []
    for name, (hit_best, hit_own, own) in hits.items():
        scan = methods[name][1]
        t_own, times = med[(name, hit_own[0])] if scan else (hit_own[1], [hit_own[1]])
        t_best = (med[(name, hit_best[0])][0] if scan else hit_best[1]) if hit_best else None
        rows.append(dict(method=name, scan=scan, reached=hit_best is not None, time_best=t_best,
                         time_own=t_own, times_own=times, tol_own=hit_own[0],
                         tol_best=hit_best[0] if hit_best else None,
                         gap=(own - best) / abs(best), **quality(hit_own[3], wtrue)))
    return dict(kind=kind, alpha=alpha, best=best, rows=rows)


def quality(coef, wtrue):
    sup, est = wtrue != 0, coef != 0
    tp = int(np.sum(sup & est))
    prec = tp / max(1, int(est.sum()))
    rec = tp / max(1, int(sup.sum()))
    return dict(nnz=int(est.sum()), rel_err=float(np.linalg.norm(coef - wtrue) / np.linalg.norm(wtrue)),
                precision=prec, recall=rec)


def bench_logistic(n, p, support, args):
    """L1-regularized logistic regression with an intercept: ours (prox-Newton CD) vs
    scikit-learn liblinear and skglm SparseLogisticRegression, same protocol (time to best)."""
    from sklearn.linear_model import LogisticRegression

    import skglm
    from dualdrop.linear import Logistic

    X, y01, wtrue = make_sparse_problem(n, p, support, args.snr, task="classification")
    y = 2.0 * y01 - 1.0
    alpha = float(np.max(np.abs(X.T @ (y01 - y01.mean()))) / n / 10)
    pr = Problem(X, y, Logistic(), penalties.get("l1"), alpha, fit_intercept=True)

    def run_ours(tol):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = get_solver("cd").solve(pr, tol=tol)
        return r.coef, r.intercept

    def run_liblinear(tol):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = LogisticRegression(C=1.0 / (alpha * n), l1_ratio=1.0, solver="liblinear", tol=tol,
                                   max_iter=100000, intercept_scaling=1e4).fit(X, y01)
        return m.coef_.ravel(), float(m.intercept_[0])

    def run_skglm(tol):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = skglm.SparseLogisticRegression(alpha=alpha, tol=tol, max_iter=1000,
                                               fit_intercept=True).fit(X, y01)
        return np.asarray(m.coef_).ravel(), float(np.ravel(m.intercept_)[0])

    methods = {"dualdrop cd (prox-Newton)": run_ours, "sklearn liblinear": run_liblinear,
               "skglm SparseLogisticRegression": run_skglm}
    small = make_sparse_problem(50, 100, support, args.snr, task="classification")
    Xs, ys = small[0], small[1]  # JIT warm-up of our kernels and skglm's
    get_solver("cd").solve(Problem(Xs, 2.0 * ys - 1, Logistic(), penalties.get("l1"), 0.01), tol=1e-4)
    skglm.SparseLogisticRegression(alpha=0.01).fit(Xs, ys)
    scans = {}
    for name, fn in methods.items():
        runs = []
        for tol in TOLS[:6]:  # 1e-2 ... 1e-7: liblinear needs minutes at 1e-8
            t0 = time.perf_counter()
            coef, b = fn(tol)
            t = time.perf_counter() - t0
            runs.append((tol, t, pr.objective(coef, b), coef))
            if t > args.budget:
                break
        scans[name] = runs
    best = min(r[2] for runs in scans.values() for r in runs)
    hits = {name: next((r for r in runs if r[2] <= best + args.rtol * abs(best)), None)
            for name, runs in scans.items()}
    med = interleaved({(name, h[0]) for name, h in hits.items() if h is not None},
                      lambda name, tol: methods[name](tol), args.repeats)
    rows = []
    for name, runs in scans.items():
        hit = hits[name]
        if hit is None:
            rows.append(dict(method=name, time=None, tol=runs[-1][0],
                             gap=(min(r[2] for r in runs) - best) / best, **quality(runs[-1][3], wtrue)))
            continue
        rows.append(dict(method=name, time=med[(name, hit[0])][0], tol=hit[0],
                         gap=(hit[2] - best) / best, **quality(hit[3], wtrue)))
    ref = rows[0]["time"]
    lines = [f"#### logistic, L1, n={n}, p={p}, {support:.0%} nonzero truth, alpha = alpha_max/10, intercept",
             "", "| method | time to best (s) | ratio vs dualdrop cd | tol | rel. gap | nnz | precision | recall |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        tt = f"{r['time']:.3f}" if r["time"] is not None else "not reached"
        ratio = f"{r['time'] / ref:.2f}x" if r["time"] is not None and ref else "-"
        lines.append(f"| {r['method']} | {tt} | {ratio} | {r['tol']:.0e} | {r['gap']:+.1e} | {r['nnz']} | "
                     f"{r['precision']:.2f} | {r['recall']:.2f} |")
    return "\n".join(lines)


FIRST_FIT = r"""
import time, warnings, numpy as np
rng = np.random.default_rng(0); X = np.asfortranarray(rng.standard_normal((100, 300))); y = X[:, :5].sum(1)
t0 = time.perf_counter()
if {which!r} == "dualdrop":
    from dualdrop.linear import SparseLinearRegression as M
    M(penalty="mcp", penalty_params={{"a": 3.0, "lam": 0.1}}, alpha=0.1, fit_intercept=False).fit(X, y)
else:
    from skglm import MCPRegression
    MCPRegression(alpha=0.1, gamma=3.0, fit_intercept=False).fit(X, y)
print(time.perf_counter() - t0)
"""


def first_fit(which):
    out = subprocess.run([sys.executable, "-c", FIRST_FIT.format(which=which)], cwd=ROOT,
                         capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), **_env()})
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return float("nan")


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def warmup():
    X, y, _ = make_data(50, 100, 0.05, 5.0, seed=1)
    for kind in ("lasso", "mcp", "logsum"):
        for fn, _ in methods_for(kind, 1.0, False, True).values():
            fn(X, y, 0.05, 1e-4)


def to_markdown(results, cmd):
    lines = [f"Command: `{cmd}`", ""]
    for res in results:
        lines.append(f"#### {res['title']}")
        lines.append("")
        lines.append("| problem | method | time to best (s) | time to own limit (s) | ratio vs dualdrop cd | tol | own limit vs best | nnz | rel. err | precision | recall |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for prob in res["problems"]:
            ref = next(r for r in prob["rows"] if r["method"] == "dualdrop cd")
            for r in prob["rows"]:
                tb = f"{r['time_best']:.3f}" if r["time_best"] is not None else "not reached"
                to = f"{r['time_own']:.3f}" + ("" if r["scan"] else " (1 run, capped)")
                ratio = f"{r['time_own'] / ref['time_own']:.2f}x" if r["scan"] else "-"
                lines.append(
                    f"| {prob['kind']} | {r['method']} | {tb} | {to} | {ratio} | {r['tol_own']:.0e} | "
                    f"{r['gap']:+.1e} | {r['nnz']} | {r['rel_err']:.3f} | {r['precision']:.2f} | "
                    f"{r['recall']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="500x5000", help="comma-separated NxP")
    ap.add_argument("--support", type=float, nargs="+", default=[0.05, 0.01])
    ap.add_argument("--snr", type=float, default=5.0)
    ap.add_argument("--eps", type=float, default=1.0, help="LogSum eps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-6)
    ap.add_argument("--budget", type=float, default=60.0, help="stop a method's tol scan past this many s")
    ap.add_argument("--cvxpy-max-p", type=int, default=5000)
    ap.add_argument("--all-ours", action="store_true", help="LogSum/MCP with every dualdrop solver")
    ap.add_argument("--logistic-only", action="store_true",
                    help="only the L1 logistic comparison (first size, first support)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args(argv)
    cmd = "python3 benchmarks/linear/bench_linear.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"load average: {load}", flush=True)
    if args.logistic_only:
        n, p = (int(v) for v in args.sizes.split(",")[0].lower().split("x"))
        md = (f"Command: `{cmd}`\n\nLoad average at the start: {load}.\n\n"
              + bench_logistic(n, p, args.support[0], args))
        print(md)
        if args.markdown:
            Path(args.markdown).write_text(md)
        return
    warmup()
    results = []
    ff = {"dualdrop": first_fit("dualdrop"), "skglm": first_fit("skglm")}
    print(f"first fit in a fresh process (small MCP problem): dualdrop {ff['dualdrop']:.2f} s, "
          f"skglm {ff['skglm']:.2f} s", flush=True)
    for size in args.sizes.split(","):
        n, p = (int(v) for v in size.lower().split("x"))
        for support in args.support:
            X, y, w = make_data(n, p, support, args.snr)
            title = f"n={n}, p={p}, {support:.0%} nonzero truth, SNR {args.snr:g}"
            probs = []
            for kind in ("lasso", "mcp", "logsum"):
                pr = bench_problem(X, y, w, kind, args.eps, args, with_cvxpy=p <= args.cvxpy_max_p)
                probs.append(pr)
                for r in pr["rows"]:
                    print(f"{title} | {kind:6s} | {r['method']:26s} own {r['time_own']:8.3f} s "
                          f"best {r['time_best']} tol={r['tol_own']:.0e} gap={r['gap']:.1e} "
                          f"nnz={r['nnz']} err={r['rel_err']:.3f}", flush=True)
            results.append(dict(title=title, problems=probs))
    md = to_markdown(results, cmd)
    md = (f"Load average at the start: {load}. First fit in a fresh process (small MCP problem, "
          f"numba cache warm on disk): dualdrop {ff['dualdrop']:.2f} s, skglm {ff['skglm']:.2f} "
          "s.\n\n") + md
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(cmd=cmd, first_fit=ff, results=results), indent=1,
                                              default=float))
    if args.markdown:
        Path(args.markdown).write_text(md)


if __name__ == "__main__":
    main()
