"""``dualdrop fit``: fit a sparse linear model with any effective penalty from the command line."""

from __future__ import annotations

import csv
import time
from pathlib import Path

from dualdrop.cli import (UsageError, fraction, int_at_least, nonneg_float, nonneg_int,
                          out_dir, positive_float, positive_int)


def register(sub):
    from dualdrop.linear import SparseLinearRegression
    from dualdrop.linear.solvers import SOLVERS

    p = sub.add_parser(
        "fit",
        help="fit a sparse linear/logistic model with any penalty (optionally a whole path)",
        description="Fit SparseLinearRegression / SparseLogisticRegression on a data file (.npz "
        "with arrays X and y, .csv with the target in the last column or --target, or svmlight "
        "text) or on a synthetic correlated design; with --cv K, alpha is chosen by K-fold "
        "cross-validation. Prints the fit summary; with --out writes coef.csv (one row per "
        "feature, named by the CSV header, and the intercept), with --cv also cv.csv and cv.png "
        "(the cross-validation curve), and with --path N also path.csv and path.png "
        "(coefficient paths).",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="data file: .npz (X, y), .csv or .svm/.svmlight/.libsvm")
    src.add_argument("--synthetic", metavar="N,P", help="synthetic Toeplitz(0.5) design, e.g. 500,5000")
    p.add_argument("--target", default="-1", metavar="COLUMN",
                   help="CSV: the target column, an index (negative from the end; default -1, "
                   "the last) or a name of the header row")
    p.add_argument("--task", choices=["regression", "classification"], default="regression",
                   help="regression: least squares (SparseLinearRegression); classification: "
                   "logistic, one-vs-rest beyond two classes (SparseLogisticRegression) "
                   "(default regression)")
    p.add_argument("--penalty", default="l1", metavar="SPEC",
                   help="penalty spec name[:k=v,...], e.g. 'logsum:eps=1', 'mcp:a=3,lam=0.1' (default l1)")
    p.add_argument("--alpha", type=nonneg_float, default=None, help="penalty strength lambda")
    p.add_argument("--alpha-ratio", type=positive_float, default=0.05,
                   help="without --alpha or --cv: alpha = ratio * alpha_max (default 0.05)")
    p.add_argument("--cv", type=int_at_least(2), default=None, metavar="K",
                   help="choose alpha by K-fold cross-validation over a grid from alpha_max "
                   "down (stratified folds for classification; scored by the test mean squared "
                   "error, or the log loss); the model is refitted at the chosen alpha")
    p.add_argument("--cv-alphas", type=int_at_least(2), default=50, metavar="N",
                   help="with --cv: the number of alphas on the grid (default 50)")
    p.add_argument("--cv-eps", type=fraction, default=1e-3, metavar="E",
                   help="with --cv: the grid's smallest alpha as a fraction of alpha_max "
                   "(default 1e-3)")
    p.add_argument("--solver", default="auto", choices=["auto", *SOLVERS],
                   help="solver; auto picks cd for penalties with a compiled prox, adaprox "
                   "otherwise (default auto)")
    tol = SparseLinearRegression().get_params()["tol"]  # the estimators' default, one home
    p.add_argument("--tol", type=positive_float, default=tol,
                   help="tolerance on the optimality criterion, the largest coordinate-wise "
                   f"gradient mapping relative to the data's scale (default {tol:g}, as the "
                   "estimators)")
    p.add_argument("--max-iter", type=positive_int, default=None,
                   help="solver iterations (default: the solver's own, e.g. 100 outer "
                   "working-set iterations for cd)")
    p.add_argument("--scaling", choices=["dropout", "none"], default="dropout",
                   help="dropout: penalize the coefficient a column of unit mean square would "
                   "have (the dropout duality); none: penalize the raw coefficient, as "
                   "scikit-learn and skglm do (default dropout)")
    p.add_argument("--no-intercept", action="store_true",
                   help="fit without an intercept (default: an unpenalized intercept)")
    p.add_argument("--path", type=nonneg_int, default=0, metavar="N",
                   help="also fit a path of N alphas (needs --out)")
    p.add_argument("--support", type=fraction, default=0.05,
                   help="synthetic: fraction of nonzeros (0 < S <= 1)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="synthetic: random seed")
    p.add_argument("--out", default=None, help="output directory (created if missing)")
    p.add_argument("--verbose", action="store_true", help="progress bar")
    p.set_defaults(func=run, interrupt_hint="files in --out are written whole or not at all; "
                   "run the same command again")


def _load(args):
    import numpy as np

    if args.synthetic:
        from dualdrop.linear.synthetic import make_sparse_problem

        try:
            n, p = (_whole(v) for v in args.synthetic.split(","))
        except (ValueError, OverflowError):
            raise UsageError(f"takes N,P (two integers, e.g. 500,2000 or 5e2,2e3), got "
                             f"{args.synthetic!r}", "--synthetic") from None
        if n < 2 or p < 2:
            raise UsageError(f"takes N,P with N >= 2 samples and P >= 2 features, got "
                             f"{args.synthetic!r}", "--synthetic")
        _check_memory(n, p, "--synthetic")
        X, y, w = make_sparse_problem(n, p, support=args.support, task=args.task,
                                      random_state=args.seed)
        return X, y, w, [f"x{j}" for j in range(p)]
    path = Path(args.data)
    if not path.is_file():
        raise UsageError(f"--data {path} " + ("is a folder, not a data file" if path.is_dir()
                                              else "does not exist"))
    suffix = path.suffix.lower()
    names = None
    if suffix == ".npz":
        X, y = _read_npz(path)
    elif suffix in (".svm", ".svmlight", ".libsvm"):
        from sklearn.datasets import load_svmlight_file

        try:
            X, y = load_svmlight_file(str(path))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"--data {path} is not a readable svmlight file ({exc})") from None
        X = X.tocsc()
    elif suffix == ".csv":
        X, y, names = _read_csv(path, args.target)
    else:
        raise UsageError(f"--data {path.name}: unsupported file type; use .npz, .csv or "
                         ".svmlight")
    if X.shape[0] < 2:
        raise UsageError(f"--data {path} holds {X.shape[0]} sample(s); a fit needs at least 2")
    if names is None:
        names = [f"x{j}" for j in range(X.shape[1])]
    return X, y, None, names


def _whole(text) -> int:
    """An integer written as one (``500``) or in scientific notation (``5e2``)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise
        return int(value)


def _check_memory(n, p, option):
    """UsageError naming ``option`` when an ``n x p`` float64 design cannot fit in memory (it
    and the fit's working copies take about four times its size): a one-line refusal, not a
    MemoryError traceback after minutes of swapping."""
    import os

    need = 4 * 8 * n * p
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: only the total is known
        avail = None
    if avail is not None and need > avail:
        raise UsageError(f"{n} x {p} needs about {need / 2 ** 30:.3g} GiB (the design and the "
                         f"fit's working copies), more than the {avail / 2 ** 30:.3g} GiB of "
                         "free memory; ask for fewer samples or features", option)


def _read_npz(path):
    """``(X, y)`` of an .npz archive, or a UsageError naming --data."""
    import zipfile

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as f:
            if "X" not in f or "y" not in f:
                raise UsageError(f"--data {path} must hold arrays named X and y, it has "
                                 f"{list(f.keys())}")
            return f["X"], f["y"]
    except UsageError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"--data {path} is not a readable .npz archive of numeric arrays "
                         f"({_first_line(exc)})") from None


def _read_csv(path, target):
    """``(X, y)`` of a CSV of numbers, an optional header row of column names first; the target
    column chosen by ``target`` (an index, negative from the end, or a header name)."""

    import numpy as np

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    except UnicodeDecodeError:
        raise UsageError(f"--data {path} is not a text CSV file") from None
    if not rows:
        raise UsageError(f"--data {path} is empty")
    header = None
    if not all(_is_number(c) for c in rows[0]):
        header, rows = [c.strip() for c in rows[0]], rows[1:]
    width = len(header) if header else len(rows[0]) if rows else 0
    data = np.empty((len(rows), width))
    for i, row in enumerate(rows):
        line = i + 1 + (header is not None)
        if len(row) != width:
            raise UsageError(f"--data {path}: line {line} has {len(row)} fields, expected "
                             f"{width}")
        try:
            data[i] = [float(c) for c in row]
        except ValueError:
            bad = next(c for c in row if not _is_number(c))
            raise UsageError(f"--data {path}: line {line} holds {bad.strip()!r}, not a number "
                             "(only the first line may be a header of column names)") from None
    if width < 2:
        raise UsageError(f"--data {path} has {width} column(s); it needs features and a target")
    t = _target_column(target, header, width, path)
    names = ([h for j, h in enumerate(header) if j != t] if header
             else [f"x{j}" for j in range(width) if j != t])  # x<column index in the file>
    if header:
        print(f"{path.name}: the first line is a header of column names; target column "
              f"{header[t]!r}, features {shorten(names)}")
    return np.delete(data, t, axis=1), data[:, t], names


def shorten(items, first=8, last=2) -> str:
    """``a, b, c, ..., y, z (200 in all)``: a list readable in one line of a message."""
    items = [str(v) for v in items]
    if len(items) <= first + last + 1:
        return ", ".join(items)
    return (", ".join(items[:first]) + ", ..., " + ", ".join(items[-last:])
            + f" ({len(items)} in all)")


def _is_number(text) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _target_column(target, header, width, path) -> int:
    """The index of the target column (``--target``: an index or a header name)."""
    try:
        t = int(target)
    except ValueError:
        if header and target in header:
            return header.index(target)
        if header:
            import difflib

            close = difflib.get_close_matches(target, header, n=3)
            names = ((f"did you mean {' or '.join(repr(c) for c in close)}? " if close else "")
                     + f"the header's {len(header)} names are {shorten(header)}")
        else:
            names = "the file has no header row"
        raise UsageError(f"--target {target!r} is neither a column index nor a column name "
                         f"({names})") from None
    if not -width <= t < width:
        raise UsageError(f"--target {t} is out of range: --data {path} has {width} columns "
                         f"(indices 0..{width - 1}, or -1..-{width} from the end)")
    return t % width


def _first_line(exc) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _write(path, write):
    """Write a file whole or not at all: ``write(tmp)`` then an atomic rename."""
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no partial file left behind
        tmp.unlink(missing_ok=True)
        raise


def run(args) -> int:
    import warnings

    import numpy as np
    from sklearn.exceptions import ConvergenceWarning

    from dualdrop.linear import alpha_max
    from penalties.curves import parse_spec

    if args.path and not args.out:
        raise UsageError("--path writes path.csv and path.png: give --out too", "--path")
    if args.cv is not None and args.alpha is not None:
        raise UsageError("--cv chooses alpha by cross-validation: leave out --alpha (or drop "
                         "--cv to fit at the alpha you give)", "--cv")
    out = out_dir(args.out) if args.out else None
    spec = parse_spec(args.penalty)
    X, y, w_true, names = _load(args)
    datafit = "logistic" if args.task == "classification" else "quadratic"
    fit_intercept = not args.no_intercept
    amax = alpha_max(X, y, spec.name, spec.params, datafit, fit_intercept, args.scaling)
    common = dict(penalty=spec.name, penalty_params=spec.params, solver=args.solver,
                  tol=args.tol, max_iter=args.max_iter, fit_intercept=fit_intercept,
                  scaling=args.scaling, verbose=args.verbose)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t0 = time.perf_counter()
        if args.cv is not None:
            cv = _cross_validate(X, y, datafit, common, args)
            est, alpha = cv.estimator_, cv.alpha_
        else:
            alpha = args.alpha if args.alpha is not None else args.alpha_ratio * amax
            est = _estimator(datafit, alpha=alpha, **common).fit(X, y)
        elapsed = time.perf_counter() - t0
    coef = np.atleast_2d(est.coef_)
    if datafit == "quadratic":
        obj, crit, iters = f"{est.objective_[-1]:.10g}", f"{est.criterion_:.2e}", str(est.n_iter_)
    else:
        obj = " ".join(f"{o[-1]:.10g}" for o in est.objective_)
        crit = " ".join(f"{c:.2e}" for c in est.criterion_)
        iters = " ".join(str(int(i)) for i in est.n_iter_)
    print(f"data: n={X.shape[0]} p={X.shape[1]}  penalty={spec.name}{spec.params or ''}  "
          f"alpha={alpha:.4g} (alpha_max={amax:.4g})  solver={est.solver_}")
    if args.cv is not None:
        print(f"cross-validation: {args.cv} folds x {cv.alphas_.size} alphas in {elapsed:.3f} s; "
              f"chose alpha={alpha:.4g} = {alpha / amax:.3g} alpha_max "
              f"({_score_name(datafit)} {_cv_table(cv, datafit)[1][_best(cv)]:.6g})")
    print(f"{'refit' if args.cv is not None else 'time'} "
          f"{'' if args.cv is not None else f'{elapsed:.3f} s  '}iterations {iters}  objective "
          f"{obj}  criterion {crit}  nonzeros {int(np.count_nonzero(coef))}/{coef.size}")
    print(f"training score ({'accuracy' if datafit == 'logistic' else 'R^2'}): {est.score(X, y):.4f}")
    kept = [names[j] for j in np.flatnonzero(np.any(coef != 0, axis=0))]
    print(f"nonzero features: {shorten(kept) if kept else 'none'}")
    for w in caught:
        print(f"warning: {w.message}")
    if w_true is not None:
        est_c = coef.ravel()
        sup, found = w_true != 0, est_c != 0
        tp = int(np.sum(sup & found))
        print(f"support recovery: precision {tp / max(1, found.sum()):.3f}  "
              f"recall {tp / max(1, sup.sum()):.3f}")
    if out is not None:
        _write_coef(out / "coef.csv", names, est)
        written = [out / "coef.csv"]
        if args.cv is not None:
            _write_cv(out, cv, datafit, amax, spec.name)
            written += [out / "cv.csv", out / "cv.png"]
        print(f"wrote {', '.join(str(f) for f in written)}")
        if args.path:
            _write_path(out, X, y, spec, datafit, fit_intercept, names, est, args)
            print(f"wrote {out / 'path.csv'} and {out / 'path.png'}")
    return 0


def _estimator(datafit, **kw):
    from dualdrop.linear import SparseLinearRegression, SparseLogisticRegression

    return (SparseLogisticRegression if datafit == "logistic" else SparseLinearRegression)(**kw)


def _cross_validate(X, y, datafit, common, args):
    """The CV estimator fitted: ``args.cv`` folds, ``args.cv_alphas`` alphas down to
    ``args.cv_eps`` alpha_max (stratified, log-loss scored folds for classification)."""
    from dualdrop.linear import SparseLinearRegressionCV, SparseLogisticRegressionCV

    cls = SparseLogisticRegressionCV if datafit == "logistic" else SparseLinearRegressionCV
    return cls(alphas=args.cv_alphas, eps=args.cv_eps, cv=args.cv, **common).fit(X, y)


def _score_name(datafit) -> str:
    return "test log loss" if datafit == "logistic" else "test mean squared error"


def _cv_table(cv, datafit):
    """``(per-fold losses (n_alphas, n_folds), mean, std)``: lower is better for both tasks
    (the logistic CV's scores are negative log losses)."""
    import numpy as np

    folds = cv.mse_path_ if datafit == "quadratic" else -cv.scores_.T
    return folds, folds.mean(axis=1), folds.std(axis=1)


def _best(cv) -> int:
    import numpy as np

    return int(np.flatnonzero(cv.alphas_ == cv.alpha_)[0])


def _write_coef(path, names, est):
    """coef.csv: a header, one row per feature by name, then the intercept (one column per
    class beyond two classes)."""
    import numpy as np

    coef = np.atleast_2d(est.coef_)
    intercept = np.atleast_1d(est.intercept_)
    classes = getattr(est, "classes_", None)
    cols = (["coef"] if coef.shape[0] == 1 else [f"coef_{_label(c)}" for c in classes])

    def write(f):
        with open(f, "w", newline="", encoding="utf-8") as fh:
            wr = csv.writer(fh)
            wr.writerow(["feature", *cols])
            for j, name in enumerate(names):
                wr.writerow([name, *(repr(float(v)) for v in coef[:, j])])
            wr.writerow(["(intercept)", *(repr(float(v)) for v in intercept)])

    _write(path, write)


def _label(c) -> str:
    """A class label as written in the file it came from: ``3`` for the float 3.0 that a CSV
    of numbers gives."""
    v = c.item() if hasattr(c, "item") else c
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _write_cv(out, cv, datafit, amax, penalty):
    """cv.csv (alpha, mean and std of the test loss, each fold's) and cv.png (the curve with
    its spread across folds and the chosen alpha)."""
    import numpy as np

    folds, mean, std = _cv_table(cv, datafit)
    kind = "log_loss" if datafit == "logistic" else "mse"

    def write_csv(f):
        with open(f, "w", newline="", encoding="utf-8") as fh:
            wr = csv.writer(fh)
            wr.writerow(["alpha", f"mean_{kind}", f"std_{kind}", "chosen",
                         *(f"fold{k + 1}_{kind}" for k in range(folds.shape[1]))])
            best = _best(cv)
            for i, a in enumerate(cv.alphas_):
                wr.writerow([repr(float(a)), repr(float(mean[i])), repr(float(std[i])),
                             int(i == best), *(repr(float(v)) for v in folds[i])])

    _write(out / "cv.csv", write_csv)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    a = cv.alphas_
    for k in range(folds.shape[1]):
        ax.plot(a, folds[:, k], color="0.75", lw=0.7, label="each fold" if k == 0 else None)
    ax.fill_between(a, mean - std, mean + std, color="C0", alpha=0.15, label="mean +- 1 std")
    ax.plot(a, mean, color="C0", lw=2, label="mean over folds")
    ax.axvline(cv.alpha_, color="C3", ls="--", lw=1.2,
               label=f"chosen alpha = {cv.alpha_:.3g} ({cv.alpha_ / amax:.3g} alpha_max)")
    ax.set_xscale("log")
    if np.min(folds) > 0 and np.max(folds) > 20 * np.min(mean):
        ax.set_yscale("log")  # the losses near alpha_max would flatten the region that matters
    ax.invert_xaxis()
    ax.set_xlabel("alpha (penalty strength lambda), decreasing")
    ax.set_ylabel(_score_name(datafit))
    ax.set_title(f"{penalty}: {folds.shape[1]}-fold cross-validation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _write(out / "cv.png", lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)


def _write_path(out, X, y, spec, datafit, fit_intercept, names, est, args):
    """path.csv (alpha, then one column per feature by name; ``class:feature`` beyond two
    classes) and path.png."""
    import warnings

    import numpy as np
    from sklearn.exceptions import ConvergenceWarning

    from dualdrop.linear import regularization_path

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = regularization_path(X, y, spec.name, spec.params, n_alphas=args.path,
                                  datafit=datafit, solver=args.solver, tol=args.tol,
                                  fit_intercept=fit_intercept, scaling=args.scaling)
    coefs = res["coefs"].reshape(len(res["alphas"]), -1)
    classes = getattr(est, "classes_", None)
    labels = (list(names) if coefs.shape[1] == len(names)
              else [f"{_label(c)}:{n}" for c in classes for n in names])

    def write(f):
        with open(f, "w", newline="", encoding="utf-8") as fh:
            wr = csv.writer(fh)
            wr.writerow(["alpha", *labels])
            for a, row in zip(res["alphas"], coefs):
                wr.writerow([repr(float(a)), *(repr(float(v)) for v in row)])

    _write(out / "path.csv", write)
    _plot_path(_pyplot(), res["alphas"], coefs, spec.name, out / "path.png", labels=labels)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_path(plt, alphas, coefs, name, filename, n_named=10, labels=None):
    """Coefficient paths readable at any width: only coefficients that ever enter the model are
    drawn; the ``n_named`` largest in colour with a legend (``labels``: the features' names),
    the others thin and grey."""
    import numpy as np

    entered = np.flatnonzero(np.any(coefs != 0, axis=0))
    size = np.max(np.abs(coefs[:, entered]), axis=0) if entered.size else np.zeros(0)
    order = entered[np.argsort(-size)]
    named, faint = order[:n_named], order[n_named:]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if faint.size:
        ax.plot(alphas, coefs[:, faint], color="0.75", lw=0.5)
    for j in named:
        ax.plot(alphas, coefs[:, j], lw=1.4, label=labels[j] if labels else f"x{j}")
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("alpha (penalty strength lambda), decreasing")
    ax.set_ylabel("coefficient")
    ax.set_title(f"{name} path: {entered.size} of {coefs.shape[1]} coefficients ever nonzero"
                 + (f" ({faint.size} in grey)" if faint.size else ""))
    if named.size:
        ax.legend(fontsize=7, loc="upper left", ncol=2, title=f"largest {named.size}",
                  title_fontsize=7)
    fig.tight_layout()
    _write(filename, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)
