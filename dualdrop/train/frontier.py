"""The accuracy–sparsity frontier of each method, chosen on validation data only.

One trained network is one point ``(error, fraction of nonzero weights)``; a method is better
described by the set of points it can reach. For a method ``m`` with a sparsity knob ``theta``
(the regularization weight ``lam`` of the penalty methods, the KL weight of variational dropout,
the target sparsity of magnitude pruning), a start ``s`` (random or from a dense network) and,
when the method prunes by a keep-ratio tolerance, the test-time ``tol``, the candidates are

    P_m = { (E_val(theta, s, tol), rho(theta, s, tol)) },

``E_val`` the validation error and ``rho`` the fraction of nonzero weights (biases excluded). The
frontier is the Pareto set of ``P_m`` for minimizing both,

    F_m = { p in P_m : no q in P_m has E_val(q) <= E_val(p), rho(q) <= rho(p), q != p },

and only its members are evaluated on the test set, once each. Choosing among trained networks
by test error would make the reported test error an optimistically biased estimate (the
selection would fit the test set); the validation split is the 20% of the training set held out
by :func:`dualdrop.train.train`.

How it runs:

- every trial trains one network with :func:`dualdrop.train.train` into
  ``OUT/trials/<method>/<trial-id>/`` (the folder of an ordinary ``dualdrop sparsify`` run; the
  trial id spells its knob value and start, e.g. ``lam=0.00316-warm``), so a trial is
  inspectable and resumable on its own. The tolerance is swept after training on the validation
  split (``final.json["val_tol_sweep"]``), without retraining: one trial gives several candidates.
- the trials of each method form a multi-objective Optuna study (objectives: validation error and
  fraction nonzero at the trained tolerance) in a journal file, ``OUT/study.journal``, which Optuna
  recommends for several processes sharing one file (on one machine, or several machines on a
  shared file system); start the command again, or with ``workers > 1``, to add processes. The
  default sampler is Optuna's scrambled Sobol (QMC) sequence: with a one-dimensional knob the goal
  is even coverage of its log range, which a low-discrepancy sequence gives with few trials.
- a trial whose process was killed is detected (same host: its process id is gone; any host: its
  heartbeat file is older than ``stale_after`` seconds), marked failed and re-queued with the same
  parameters; the new trial trains into the same folder and resumes from its last checkpoint.
  Trials that diverge are recorded as failed, with the error, and listed in the report.
- :func:`train` also writes the test error of every trial into its ``final.json``; the frontier
  never reads it (nor ``selected_tol`` or ``exported_test_error``): the test error of a frontier
  point is computed here from the trial's checkpoint at the point's tolerance, once, and cached in
  ``OUT/test_errors.json``.

Outputs: ``frontier.png``/``frontier.pdf`` (test error vs fraction nonzero, log x, one line per
method through its frontier; on MNIST also the paper's table, the published points and the goal
boxes), ``frontier.md`` and ``frontier.csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import multiprocessing
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualdrop.train.compare import DEFAULT_METHODS, PAPER_TABLE, method_label

#: Published LeNet-300-100 MNIST points (label -> (test error, fraction of nonzero weights)):
#: sparse variational dropout (Molchanov, Ashukha & Vetrov, "Variational Dropout Sparsifies Deep
#: Neural Networks", 2017), magnitude pruning with retraining (Han, Pool, Tran & Dally, "Learning
#: both Weights and Connections for Efficient Neural Networks", 2015) and dynamic network surgery
#: (Guo, Yao & Chen, "Dynamic Network Surgery for Efficient DNNs", 2016).
PUBLISHED_POINTS: dict[str, tuple[float, float]] = {
    "sparse VD (Molchanov et al. 2017)": (0.0192, 0.0147),
    "Han et al. 2015": (0.0159, 0.082),
    "DNS (Guo et al. 2016)": (0.0199, 0.018),
}
#: The accuracy goals on MNIST, as (test error, fraction nonzero) upper bounds.
GOALS: tuple[tuple[float, float], ...] = ((0.016, 0.015), (0.014, 0.05))

JOURNAL = "study.journal"
TEST_CACHE = "test_errors.json"
HEARTBEAT = ".frontier-heartbeat"
STUDY_PREFIX = "frontier:"


# ----------------------------------------------------------------------------- search space


@dataclass(frozen=True)
class Knob:
    """One sparsity knob: the hyperparameter ``name`` searched on ``[low, high]``.

    ``log``: sample uniformly in log scale. ``complement``: sample ``1 - value`` in log scale
    instead (for a target sparsity near 1, e.g. magnitude's ``sparsity`` in [0.8, 0.995] is
    searched as a density in [0.005, 0.2]). Values are rounded to 3 significant digits (of the
    complement when ``complement``), which names the trial's folder.
    """

    name: str
    low: float
    high: float
    log: bool = True
    complement: bool = False

    def validate(self, method: str) -> None:
        for which in ("low", "high"):
            v = getattr(self, which)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{method}:{self.name} {which}={v!r}; expected a finite number")
        if not self.low < self.high:
            raise ValueError(f"{method}:{self.name} range [{self.low}, {self.high}] is empty; "
                             "give low < high, e.g. lam=1e-4:1e-2")
        if self.complement and not (0 <= self.low and self.high < 1):
            raise ValueError(f"{method}:{self.name} range [{self.low}, {self.high}]: a "
                             "complement knob (a target sparsity) must lie in [0, 1)")
        if self.log and not self.complement and self.low <= 0:
            raise ValueError(f"{method}:{self.name} low={self.low}: a log-scale range needs "
                             "low > 0")

    @property
    def param(self) -> str:
        """Name of the Optuna parameter."""
        return f"1-{self.name}" if self.complement else self.name

    def bounds(self) -> tuple[float, float]:
        return (1 - self.high, 1 - self.low) if self.complement else (self.low, self.high)

    def value(self, sampled: float) -> float:
        """The hyperparameter value for a sampled parameter (rounded, see the class doc)."""
        q = float(f"{sampled:.3g}")
        return float(f"{1 - q:.6g}") if self.complement else q


def default_knob(method: str, hparams: dict, n_train: int | None = None) -> Knob:
    """The sparsity knob of ``method`` given its default ``hparams``: a decade either side of the
    default ``lam`` (KL weight of variational dropout, L0 weight of hard-concrete, penalty weight
    of the penalty methods; a default ``lam=None`` is the method record's
    ``lam_per_dataset / n_train``), or magnitude's target sparsity in [0.8, 0.995]."""
    from dualdrop.nn import method_class

    spec = method_class(method).knob if method != "none" else None
    if spec is not None:  # the record's own knob (magnitude: its target sparsity)
        name, low, high, options = spec
        return Knob(name, low, high, **options)
    lam = hparams.get("lam")
    if lam is None and n_train and "lam" in hparams:
        per_dataset = method_class(method).lam_per_dataset
        lam = per_dataset / n_train if per_dataset else None
    if isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0:
        return Knob("lam", lam / 10, lam * 10)
    raise ValueError(f"method {method!r} has no default sparsity knob (its hyperparameters: "
                     f"{', '.join(sorted(hparams)) or 'none'}); give one, e.g. "
                     f"knobs={{{method!r}: Knob('name', low, high)}}")


def method_slug(method: str) -> str:
    """Folder name of a method (``penalty:mcp`` -> ``penalty_mcp``)."""
    return method.replace(":", "_").replace("/", "_")


# ----------------------------------------------------------------------------- Pareto set


def pareto_front(points: list[dict], error: str = "val_error",
                 density: str = "nonzero_total") -> list[dict]:
    """Points not dominated in (``error``, ``density``), both minimized, sorted by density.

    ``q`` dominates ``p`` when ``q`` is no worse in both and better in one. Of points equal in
    both values one is kept: the one earlier in the order of the optional key ``"tie"`` (e.g.
    the distance of its tolerance to the trained one), then of the list. Sorting by density then
    error, a point is on the front exactly when its error is below every error before it.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][density], points[i][error],
                                                      points[i].get("tie", 0.0), i))
    front, best = [], math.inf
    for i in order:
        if points[i][error] < best:
            front.append(points[i])
            best = points[i][error]
    return front


# ----------------------------------------------------------------------------- storage


def _optuna():
    try:
        import optuna
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("dualdrop frontier needs optuna: pip install 'dualdrop[frontier]'") \
            from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(out: str | os.PathLike, create: bool = True):
    """The Optuna journal storage of a frontier folder (``OUT/study.journal``)."""
    optuna = _optuna()
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = Path(out) / JOURNAL
    if not create and not path.exists():
        raise FileNotFoundError(f"no frontier study at {path}; run `dualdrop frontier --out "
                                f"{out} ...` first (without --report-only)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # the open(O_EXCL) lock works on NFS too: several machines may share the folder
    return optuna.storages.JournalStorage(
        JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))


class _Heartbeat:
    """Touch ``folder/.frontier-heartbeat`` every ``interval`` seconds while training."""

    def __init__(self, folder: Path, interval: float):
        self.path = folder / HEARTBEAT
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self._stop.wait(self.interval):
            self.path.touch()

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _stale_reason(t, out: Path, stale_after: float) -> str | None:
    """Why the RUNNING trial ``t`` is abandoned (its process is gone), or None."""
    from dualdrop.train.checkpoint import _pid_alive

    host, pid = t.user_attrs.get("host"), t.user_attrs.get("pid")
    if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return f"process {pid} on {host} is gone"
    run_dir = t.user_attrs.get("run_dir")
    beat = out / run_dir / HEARTBEAT if run_dir else None
    if beat is not None and beat.exists():
        last = beat.stat().st_mtime
    elif t.datetime_start is not None:
        last = t.datetime_start.timestamp()
    else:
        return None
    age = time.time() - last
    if age > stale_after:
        return f"no heartbeat for {age:.0f} s (> stale_after={stale_after:g} s)"
    return None


def requeue_stale(study, out: str | os.PathLike, stale_after: float) -> list[int]:
    """Mark abandoned RUNNING trials failed and enqueue each again with the same parameters.

    The new trial trains into the same folder (its id spells its parameters) and resumes from
    the checkpoint there. Returns the numbers of the re-queued trials.
    """
    optuna = _optuna()
    done = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        reason = _stale_reason(t, Path(out), stale_after)
        if reason is None:
            continue
        try:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # another process got there first
            continue
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number,
                                                  "requeue_reason": reason})
        print(f"frontier: trial {t.number} ({t.user_attrs.get('run_dir')}) re-queued: {reason}",
              file=sys.stderr)
        done.append(t.number)
    return done


# ----------------------------------------------------------------------------- study config


@dataclass
class _Plan:
    """Everything one method's trials share (stored in its study; must not change)."""

    method: str
    knob: Knob
    fixed: dict
    lr: float | None
    epochs: int
    seed: int
    val_fraction: float
    batch_size: int
    init_from: str | None
    data_dir: str | None
    data: str
    data_fingerprint: str
    sampler: str

    def record(self) -> dict:
        d = dataclasses.asdict(self)
        d["knob"] = dataclasses.asdict(self.knob)
        return d


def _sampler(name: str, seed: int, rank: int):
    optuna = _optuna()
    if name == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # the same scrambled sequence in every process; the first (independent) draw differs
            return optuna.samplers.QMCSampler(
                seed=seed, scramble=True,
                independent_sampler=optuna.samplers.RandomSampler(seed=seed + 7919 * rank))
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed + 7919 * rank, multivariate=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed + 7919 * rank)
    raise ValueError(f"sampler={name!r}; choose 'qmc', 'tpe' or 'random'")


def _open_study(storage, plan: _Plan, rank: int):
    optuna = _optuna()
    study = optuna.create_study(
        storage=storage, study_name=STUDY_PREFIX + plan.method, load_if_exists=True,
        directions=["minimize", "minimize"], sampler=_sampler(plan.sampler, plan.seed, rank))
    rec = json.loads(json.dumps(plan.record()))
    old = study.user_attrs.get("plan")
    if old is None:
        study.set_user_attr("plan", rec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["val_error", "nonzero_total"])
    elif old != rec:
        diff = "; ".join(f"{k}: study {old.get(k)!r} vs now {rec.get(k)!r}"
                         for k in sorted(set(old) | set(rec)) if old.get(k) != rec.get(k))
        raise ValueError(f"the frontier study of {plan.method!r} in this folder was made with "
                         f"other settings ({diff}); use the same settings to add trials, or "
                         "another --out")
    return study


# ----------------------------------------------------------------------------- one trial


def _suggest(trial, plan: _Plan) -> tuple[dict, bool, str]:
    lo, hi = plan.knob.bounds()
    value = plan.knob.value(trial.suggest_float(plan.knob.param, lo, hi, log=plan.knob.log))
    warm = bool(trial.suggest_categorical("warm", [False, True])) if plan.init_from else False
    tid = f"{plan.knob.name}={value:g}"
    if plan.init_from:
        tid += "-warm" if warm else "-cold"
    return {**plan.fixed, plan.knob.name: value}, warm, tid


def validation_points(report: dict) -> list[dict]:
    """The candidates of one finished run, from validation numbers only.

    With a keep-ratio tolerance: one per entry of ``val_tol_sweep`` (plus the trained tolerance
    if the sweep lacks it); otherwise the trained network alone (``tol`` None). ``tie``: distance
    of the tolerance to the trained one, in log scale (equal networks: prefer the trained tol).
    """
    tol0 = (report.get("hparams") or {}).get("tol")
    sweep = report.get("val_tol_sweep") or []
    pts = [{"tol": float(r["tol"]), "val_error": float(r["error"]),
            "nonzero_total": float(r["nonzero_total"])} for r in sweep]
    if tol0 is None or not any(math.isclose(p["tol"], tol0) for p in pts):
        pts.append({"tol": None if tol0 is None else float(tol0),
                    "val_error": float(report["val_error"]),
                    "nonzero_total": float(report["nonzero_total"])})
    for p in pts:
        p["tie"] = 0.0 if p["tol"] is None or tol0 is None else abs(math.log(p["tol"] / tol0))
    return pts


def _run_trial(study, plan: _Plan, out: Path, data, ctx: dict) -> str:
    """Ask one trial, train it, tell the study; return a one-line summary."""
    optuna = _optuna()
    from dualdrop.train import TrainConfig, train

    trial = study.ask()
    hp, warm, tid = _suggest(trial, plan)
    run_dir = out / "trials" / method_slug(plan.method) / tid
    rel = str(run_dir.relative_to(out))
    for k, v in {"run_dir": rel, "host": socket.gethostname(), "pid": os.getpid(),
                 "hparams": hp, "warm": warm}.items():
        trial.set_user_attr(k, v)
    cfg = TrainConfig(
        method=plan.method, epochs=plan.epochs, out=str(run_dir), data_dir=plan.data_dir,
        seed=plan.seed, device=ctx["device"], lr=plan.lr, hparams=hp,
        batch_size=plan.batch_size, val_fraction=plan.val_fraction, resume=True,
        progress=False, threads=ctx["threads"], init_from=plan.init_from if warm else None)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "sparsify_command.txt").write_text(_sparsify_command(cfg) + "\n")
    try:
        with _Heartbeat(run_dir, ctx["heartbeat"]):
            report = train(cfg, data=data)
    except FloatingPointError as exc:  # diverged: a result of the knob, recorded
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return f"{plan.method} {tid}: failed ({type(exc).__name__})"
    except FileExistsError as exc:  # another live process trains this folder
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return f"{plan.method} {tid}: skipped, folder in use"
    except BaseException as exc:  # interrupted or a bug: re-queue (the checkpoint stays), re-raise
        trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number,
                                                      "requeue_reason": type(exc).__name__})
        raise
    if report.get("status") != "finished":
        raise RuntimeError(f"{run_dir}: train() returned status {report.get('status')!r}")
    points = validation_points(report)  # validation numbers only; the test error is not read
    trial.set_user_attr("points", points)
    trial.set_user_attr("trained_tol", (report.get("hparams") or {}).get("tol"))
    study.tell(trial, [float(report["val_error"]), float(report["nonzero_total"])])
    return (f"{plan.method} {tid}: val {100 * report['val_error']:.2f}% at "
            f"{report['nonzero_total']:.4f}")


def _sparsify_command(cfg) -> str:
    """The ``dualdrop sparsify`` command that continues (or reproduces) a trial's run."""
    import shlex

    args = ["dualdrop", "sparsify", "--method", cfg.method, "--epochs", str(cfg.epochs),
            "--seed", str(cfg.seed), "--batch-size", str(cfg.batch_size), "--out", cfg.out,
            "--resume"]
    if cfg.data_dir:
        args += ["--data-dir", cfg.data_dir]
    if cfg.lr is not None:
        args += ["--lr", repr(cfg.lr)]
    for k, v in cfg.hparams.items():
        args += ["--hp", f"{k}={v}"]
    if cfg.init_from:
        args += ["--init-from", cfg.init_from]
    extra = f"  # and val_fraction={cfg.val_fraction} (Python API)" if cfg.val_fraction != 0.2 \
        else ""
    return shlex.join(args) + extra


def _counts(study) -> tuple[int, int, int]:
    optuna = _optuna()
    S = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    return tuple(sum(t.state == s for t in trials) for s in (S.COMPLETE, S.RUNNING, S.WAITING))


def _worker(spec: dict, rank: int) -> None:
    """One process: add trials to each method's study until each has ``n_trials``."""
    from dualdrop.data import load_dataset

    if spec["threads"] is not None:
        import torch

        torch.set_num_threads(spec["threads"])
    out = Path(spec["out"])
    plans = [_Plan(**{**p, "knob": Knob(**p["knob"])}) for p in spec["plans"]]
    p0 = plans[0]
    data = load_dataset(p0.data_dir, seed=p0.seed, val_fraction=p0.val_fraction,
                        verify=spec["verify_data"])
    storage = open_storage(out)
    n = spec["n_trials"]
    studies = [_open_study(storage, p, rank) for p in plans]
    order = list(range(len(plans)))
    order = order[rank % len(order):] + order[:rank % len(order)]  # workers start apart
    bar = None
    if spec["progress"]:
        from tqdm.auto import tqdm

        # the whole study's progress (all processes), so every worker's bar ends at its total
        bar = tqdm(total=n * len(studies), initial=sum(min(n, _counts(s)[0]) for s in studies),
                   desc=f"frontier worker {rank}", unit="trial", position=rank,
                   file=sys.stderr, dynamic_ncols=True)
    try:
        for i in order:
            study, plan = studies[i], plans[i]
            while True:
                requeue_stale(study, out, spec["stale_after"])
                complete, running, waiting = _counts(study)
                if complete + running >= n and waiting == 0:
                    break
                line = _run_trial(study, plan, out, data, spec)
                if bar is not None:
                    bar.n = sum(min(n, _counts(s)[0]) for s in studies)
                    bar.set_postfix_str(line, refresh=True)
                else:
                    print(f"frontier: {line}", file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()


def _worker_entry(spec: dict, rank: int) -> None:  # pragma: no cover - runs in a child
    try:
        _worker(spec, rank)
    except KeyboardInterrupt:
        sys.exit(130)


# ----------------------------------------------------------------------------- run


def run_frontier(
    methods=DEFAULT_METHODS,
    out: str | os.PathLike = "runs/frontier",
    n_trials: int = 8,
    epochs: int = 200,
    data_dir: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = 1,
    workers: int = 1,
    init_from: str | None = None,
    knobs: dict | None = None,
    fixed: dict | None = None,
    sampler: str = "qmc",
    batch_size: int = 128,
    val_fraction: float = 0.2,
    verify_data: bool = True,
    stale_after: float = 900.0,
    heartbeat: float = 30.0,
    progress: bool = True,
    report_only: bool = False,
) -> dict:
    """Sweep each method's sparsity knob on the validation split; return :func:`frontier_report`.

    ``n_trials``: trials per method in the study (a target: a second call with a larger number
    adds trials, one with the same number only finishes or re-queues unfinished ones; several
    processes may overshoot it by up to one trial each). ``knobs``: ``{method: Knob}`` replacing
    :func:`default_knob`; ``fixed``: ``{method: {hparam: value}}`` for every trial of the method
    (``"lr"`` sets the learning rate). ``init_from``: a finished dense run; each trial then also
    chooses between a random start and a warm start from it. ``workers``: processes started here
    (each with ``threads`` torch threads); run the same call elsewhere to add more. A study made
    with other settings is refused. ``report_only``: train nothing; select, evaluate the
    frontier points not yet evaluated, draw and tabulate (``data_dir`` may then point to where
    the data lives on this machine).

    The trials' ``final.json`` files hold a test error (:func:`dualdrop.train.train` always
    computes one); it takes no part in the selection, see the module docstring.
    """
    if report_only:
        return frontier_report(out, data_dir=data_dir, progress=progress,
                               verify_data=verify_data)
    from dualdrop.data import load_dataset
    from dualdrop.train import check_method, resolve_hparams

    if isinstance(methods, str):
        methods = [methods]
    methods = [check_method(m) for m in methods]
    if not methods:
        raise ValueError("methods is empty; name at least one, e.g. ['vardrop-lr', 'logsum']")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods={methods!r} lists a method twice")
    for name, v in (("n_trials", n_trials), ("workers", workers), ("epochs", epochs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}; expected a positive int")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads={threads!r}; expected a positive int or None")
    for name, v in (("stale_after", stale_after), ("heartbeat", heartbeat)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name}={v!r}; expected a positive number of seconds")
    if not stale_after > 2 * heartbeat:
        raise ValueError(f"stale_after={stale_after} must exceed twice heartbeat={heartbeat}, or "
                         "live trials would be taken for abandoned ones")
    _sampler(sampler, seed, 0)  # validates the name
    knobs, fixed = dict(knobs or {}), {k: dict(v) for k, v in (fixed or {}).items()}
    for name, d in (("knobs", knobs), ("fixed", fixed)):
        extra = set(d) - set(methods)
        if extra:
            raise ValueError(f"{name} names methods not swept: {sorted(extra)}; sweeping "
                             f"{methods}")
    if init_from is not None:
        ck = Path(init_from)
        ck = ck / "checkpoint.pt" if ck.is_dir() else ck
        if not ck.is_file():
            raise FileNotFoundError(f"init_from={init_from!r}: no checkpoint at {ck}; train the "
                                    "dense run first (dualdrop sparsify --method none ...)")
        init_from = str(ck.parent.resolve() if ck.name == "checkpoint.pt" else ck.resolve())
    data_dir = None if data_dir is None else str(Path(data_dir).resolve())
    data = load_dataset(data_dir, seed=seed, val_fraction=val_fraction, verify=verify_data)
    plans = []
    for m in methods:
        f = dict(fixed.get(m, {}))
        lr = f.pop("lr", None)
        lr, hp = resolve_hparams(m, lr, f)  # refuses unknown names
        knob = knobs.get(m) or default_knob(m, hp, len(data.y_train))
        if not isinstance(knob, Knob):
            raise TypeError(f"knobs[{m!r}]={knob!r}; expected a dualdrop.train.frontier.Knob")
        if knob.name not in hp:
            raise ValueError(f"knob {knob.name!r} is not a hyperparameter of {m!r}; valid: "
                             f"{', '.join(sorted(hp)) or '(none)'}")
        if knob.name in f:
            raise ValueError(f"{m}: {knob.name!r} is both the knob and a fixed hyperparameter")
        knob.validate(m)
        plans.append(_Plan(method=m, knob=knob, fixed={k: hp[k] for k in f}, lr=lr,
                           epochs=epochs, seed=seed, val_fraction=val_fraction,
                           batch_size=batch_size, init_from=init_from, data_dir=data_dir,
                           data=data.name, data_fingerprint=data.fingerprint(), sampler=sampler))
    out = Path(out)
    storage = open_storage(out)
    for p in plans:  # refuse a changed study before any process starts
        _open_study(storage, p, 0)
    spec = {"out": str(out), "plans": [p.record() for p in plans], "n_trials": n_trials,
            "device": device, "threads": threads, "progress": progress,
            "verify_data": verify_data, "stale_after": float(stale_after),
            "heartbeat": float(heartbeat)}
    if workers == 1:
        _worker(spec, 0)
    else:
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_worker_entry, args=(spec, r)) for r in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"frontier workers failed (rank, exit code): {bad}; their trials "
                               "were re-queued; run the command again to continue")
    return frontier_report(out, progress=progress, verify_data=verify_data, data=data)


# ----------------------------------------------------------------------------- report


def _test_error(run_dir: Path, tol: float | None, data) -> dict:
    """Test error and density of a finished run's network at tolerance ``tol``: the one place
    where the frontier reads the test set."""
    import torch

    from dualdrop.train import error_rate
    from dualdrop.train.checkpoint import read_checkpoint
    from dualdrop.train.export import training_network

    ck = read_checkpoint(run_dir / "checkpoint.pt", fix="rerun the trial (delete its folder)")
    conf = ck["config"]
    if ck["epoch"] < conf["epochs"]:
        raise ValueError(f"{run_dir}: unfinished run (epoch {ck['epoch']} of {conf['epochs']})")
    if conf.get("data_fingerprint") != data.fingerprint():
        raise ValueError(f"{run_dir} was trained on other data than the data loaded now")
    model, sp = training_network(ck)  # trials are never dense
    if tol is not None:
        sp.set_tol(tol)
    nonzero = float(sp.density()["total"])
    X, y = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    return {"test_error": float(error_rate(model, X, y)), "nonzero_total": nonzero}


def collect(out: str | os.PathLike) -> dict:
    """``{method: {"plan", "points", "failed", "n_complete", "n_running", "n_waiting"}}`` from
    the studies in ``out``; ``points`` are all candidates of the finished trials, each with its
    ``trial``, ``run_dir``, ``hparams``, ``warm``, ``tol``, ``val_error`` and ``nonzero_total``."""
    optuna = _optuna()
    S = optuna.trial.TrialState
    storage = open_storage(out, create=False)
    res = {}
    for name in optuna.get_all_study_names(storage):
        if not name.startswith(STUDY_PREFIX):
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        method = name[len(STUDY_PREFIX):]
        trials = study.get_trials(deepcopy=False)
        points, seen = [], set()
        for t in trials:
            if t.state != S.COMPLETE or t.user_attrs["run_dir"] in seen:
                continue  # a duplicate of the same folder is the same network
            seen.add(t.user_attrs["run_dir"])
            for p in t.user_attrs["points"]:
                points.append({"trial": t.number, "run_dir": t.user_attrs["run_dir"],
                               "hparams": t.user_attrs["hparams"], "warm": t.user_attrs["warm"],
                               **p})
        requeued = {t.user_attrs.get("requeued_from") for t in trials}
        failed = [{"trial": t.number, "run_dir": t.user_attrs.get("run_dir"),
                   "requeued": t.number in requeued,
                   "error": t.user_attrs.get("error", "process gone")}
                  for t in trials if t.state == S.FAIL]
        res[method] = {"plan": study.user_attrs.get("plan", {}), "points": points,
                       "failed": failed, "n_complete": sum(t.state == S.COMPLETE for t in trials),
                       "n_running": sum(t.state == S.RUNNING for t in trials),
                       "n_waiting": sum(t.state == S.WAITING for t in trials)}
    return res


def _cache_key(p: dict) -> str:
    return f"{p['run_dir']}|tol={p['tol']}"


def _cached(cache: dict, p: dict, out: Path) -> dict | None:
    """The cached evaluation of ``p``, unless its checkpoint was written again since."""
    ev = cache.get(_cache_key(p))
    ck = out / p["run_dir"] / "checkpoint.pt"
    if ev is None or not ck.exists() or ev.get("checkpoint_mtime_ns") != ck.stat().st_mtime_ns:
        return None
    return ev


def frontier_report(out: str | os.PathLike, data_dir: str | None = None, progress: bool = True,
                    verify_data: bool = True, data=None) -> dict:
    """Select each method's validation Pareto set, evaluate its points on the test set (once:
    cached in ``OUT/test_errors.json``), write ``frontier.png/.pdf/.md/.csv``.

    Returns ``{"methods": {method: {"frontier": [...], "n_complete", "failed", ...}},
    "files": [...], "dataset": name}``.
    """
    out = Path(out)
    runs = collect(out)
    if not runs:
        raise FileNotFoundError(f"{out / JOURNAL} holds no frontier study")
    plan0 = next(iter(runs.values()))["plan"]
    if data is None:
        from dualdrop.data import load_dataset

        data = load_dataset(data_dir if data_dir is not None else plan0.get("data_dir"),
                            seed=plan0.get("seed", 0), val_fraction=plan0.get("val_fraction", 0.2),
                            verify=verify_data)
    for m, r in runs.items():
        if r["plan"].get("data_fingerprint") != data.fingerprint():
            raise ValueError(f"the study of {m!r} was run on other data ({r['plan'].get('data')}) "
                             f"than the data loaded now ({data.name}); pass its --data-dir")
    cache_path = out / TEST_CACHE
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    selected = {m: pareto_front(r["points"]) for m, r in runs.items()}
    todo = [p for f in selected.values() for p in f if _cached(cache, p, out) is None]
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="frontier: test error of the selected points",
                   unit="point", file=sys.stderr, dynamic_ncols=True)
    for p in todo:
        mtime = (out / p["run_dir"] / "checkpoint.pt").stat().st_mtime_ns
        cache[_cache_key(p)] = {**_test_error(out / p["run_dir"], p["tol"], data),
                                "checkpoint_mtime_ns": mtime}
        _atomic_json(cache_path, cache)  # a kill loses no evaluation
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = {"dataset": data.name, "methods": {}}
    for m, front in selected.items():
        rows = []
        for p in front:
            ev = cache[_cache_key(p)]
            rows.append({**{k: v for k, v in p.items() if k != "tie"},
                         "test_error": ev["test_error"],
                         "test_nonzero_total": ev["nonzero_total"]})
        result["methods"][m] = {**{k: v for k, v in runs[m].items() if k != "points"},
                                "n_candidates": len(runs[m]["points"]), "frontier": rows}
    mnist = data.name == "mnist"
    result["files"] = [str(p) for p in plot_frontier(result, out, mnist=mnist)]
    md = frontier_table(result, out, mnist=mnist)
    result["files"] += [str(out / "frontier.md"), str(out / "frontier.csv")]
    result["markdown"] = md
    return result


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _knob_text(row: dict, plan: dict) -> str:
    name = (plan.get("knob") or {}).get("name")
    return f"{name}={row['hparams'][name]:g}" if name in row["hparams"] else ""


def _label(name: str, r: dict) -> str:
    """Display name of a frontier entry: the method's label plus what distinguishes the entry
    (``eta-trick [dual=released]`` -> ``eta-Trick [dual=released]``)."""
    m = r.get("method", name)
    return method_label(m) + name[len(m):] if name.startswith(m) else name


def plot_frontier(result: dict, out: str | os.PathLike, mnist: bool = False,
                  seeds: bool = False) -> list[Path]:
    """``frontier.png`` and ``frontier.pdf``: test error (%) vs fraction nonzero (log x).

    Lines join each method's validation-selected points in order of density; with ``seeds``
    (points that are means over seeds, :mod:`dualdrop.train.frontier_runs`) each point carries
    its seeds' standard deviation as error bars in both directions. With ``mnist``
    the paper's table (hollow stars in the method's colour), the published points (black) and
    the goal boxes are drawn on the same axes; never for other data. The legend sits outside the
    axes so that it covers no data.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(10.5, 5.2))
    cmap = plt.get_cmap("tab10")
    table = dict(PAPER_TABLE) if mnist else {}
    methods = list(result["methods"])
    colors = {m: cmap(i % 10) for i, m in enumerate(methods + [m for m in table
                                                                if m not in methods])}
    for m in table:  # a paper star takes the colour of its method's first entry
        first = next((n for n, r in result["methods"].items() if r.get("method") == m), None)
        if first is not None:
            colors[m] = colors[first]
    xs, ys, n_ref = [], [], 0
    markers = "osD^v<>ph"
    for i, (m, r) in enumerate(result["methods"].items()):
        rows = sorted(r["frontier"], key=lambda p: p["test_nonzero_total"])
        if not rows:
            continue
        x = [max(p["test_nonzero_total"], 1e-6) for p in rows]
        y = [100 * p["test_error"] for p in rows]
        xs += x
        ys += y
        ns = sorted({p.get("n_seeds", r.get("n_seeds")) for p in rows}) if seeds else []
        what = (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}") + " seeds, " if ns else ""
        ax.plot(x, y, marker=markers[i % len(markers)], color=colors[m], linewidth=1.3,
                markersize=5, label=f"{_label(m, r)} ({what}{len(rows)} pts)")
        if seeds and any(p.get("test_error_std") is not None for p in rows):
            ax.errorbar(x, y, yerr=[100 * (p["test_error_std"] or 0.0) for p in rows],
                        xerr=[p["nonzero_std"] or 0.0 for p in rows], fmt="none",
                        ecolor=colors[m], elinewidth=0.9, capsize=2, alpha=0.8)
    if mnist:
        for m, (label, err, dens) in table.items():
            ax.plot([dens], [100 * err], linestyle="none", marker="*", markersize=12,
                    markerfacecolor="none", markeredgecolor=colors[m], markeredgewidth=1.4,
                    label=f"paper: {label}")
            xs.append(dens)
            ys.append(100 * err)
            n_ref += 1
        for (label, (err, dens)), mk in zip(PUBLISHED_POINTS.items(), "XPd"):
            ax.plot([dens], [100 * err], linestyle="none", marker=mk, color="black",
                    markersize=8, label=f"published: {label}")
            xs.append(dens)
            ys.append(100 * err)
            n_ref += 1
    lo_x = min(xs) / 1.5 if xs else 1e-3
    if mnist:
        for (err, dens), hatch, c in zip(GOALS, ("////", "\\\\\\\\"), ("tab:green", "tab:olive")):
            ax.add_patch(Rectangle((lo_x, 0), dens - lo_x, 100 * err, facecolor=c, alpha=0.12,
                                   edgecolor=c, hatch=hatch, linewidth=1.0,
                                   label=f"goal: <= {100 * err:.1f}% at <= {100 * dens:g}% "
                                         "nonzero"))
    ax.set_xscale("log")
    ax.set_xlim(lo_x, min(1.4, max(xs + [0.01]) * 1.5))  # dense points clear of the frame
    ax.set_xlabel("fraction of nonzero weights (log scale; biases not counted)")
    ax.set_ylabel("test error (%)")
    name = result.get("dataset", "")
    if seeds:
        ax.set_title(f"accuracy–sparsity frontier on {name} over the test-time tolerance: chosen "
                     "on validation, test error read once per seed (mean ± std)"
                     f"{_schedule_text(result, mnist, 'runs per method', 'run')}", fontsize=10)
    else:
        ax.set_title(f"accuracy–sparsity frontier on {name}: points chosen on validation, "
                     f"test error read once each{_schedule_text(result, mnist)}", fontsize=10)
    if ys:
        # zoom: every method's best point and every reference point in view (and the goals on
        # MNIST); the high-error tails of very sparse frontiers may leave the axes, counted below
        best = [min(100 * p["test_error"] for p in r["frontier"])
                for r in result["methods"].values() if r["frontier"]]
        top = min(max(ys), max([1.35 * v for v in best + ys[len(ys) - n_ref:]]
                               + ([4.0] if mnist else [])))
        ax.set_ylim(0, top * 1.08)
        hidden = sum(v > top * 1.08 for v in ys)
        if hidden:
            ax.text(0.99, 0.98, f"{hidden} point(s) above {top * 1.08:.1f}% not shown "
                    "(see frontier.md)", transform=ax.transAxes, ha="right", va="top",
                    fontsize=8)
    else:
        ax.text(0.5, 0.5, "no finished trials yet", transform=ax.transAxes, ha="center")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    out = Path(out)
    paths = [out / "frontier.png", out / "frontier.pdf"]
    for p in paths:
        fig.savefig(p, dpi=130, bbox_inches="tight")  # the legend outside the axes included
    plt.close(fig)
    return paths


def _schedule_text(result: dict, mnist: bool, unit: str = "finished trials per method",
                   per: str = "trial") -> str:
    """A second title line, "<E> epochs per trial, <n> finished trials per method"; on MNIST a
    schedule shorter than the paper's 200 epochs is labelled a *reduced* budget (its points are
    not comparable with the paper's table at face value)."""
    plans = list(result["methods"].values())
    epochs = sorted({int(r["plan"]["epochs"]) for r in plans if r["plan"].get("epochs")})
    if not epochs:
        return ""
    trials = sorted({int(r["n_complete"]) for r in plans})
    e_txt = "/".join(str(e) for e in epochs)
    t_txt = f"{trials[0]}" if len(trials) == 1 else f"{trials[0]}-{trials[-1]}"
    reduced = ("REDUCED budget (the paper's table: 200 epochs): "
               if mnist and max(epochs) < 200 else "")
    return f"\n{reduced}{e_txt} epochs per {per}, {t_txt} {unit}"


def frontier_table(result: dict, out: str | os.PathLike, mnist: bool = False) -> str:
    """``frontier.md`` and ``frontier.csv``: every selected point with its knob, start,
    tolerance, validation error, fraction nonzero and test error; on MNIST also the paper's
    row and the published points. Returns the Markdown."""
    out = Path(out)
    rows = []
    for m, r in result["methods"].items():
        for p in sorted(r["frontier"], key=lambda p: p["nonzero_total"]):
            rows.append({"method": m, "label": method_label(m), "knob": _knob_text(p, r["plan"]),
                         "warm_start": p["warm"], "tol": p["tol"], "val_error": p["val_error"],
                         "nonzero_total": p["test_nonzero_total"], "test_error": p["test_error"],
                         "trial": p["trial"], "run_dir": p["run_dir"]})
    fields = ["method", "label", "knob", "warm_start", "tol", "val_error", "nonzero_total",
              "test_error", "trial", "run_dir"]
    with open(out / "frontier.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    warm_col = any(r["plan"].get("init_from") for r in result["methods"].values())
    lines = [f"Frontier on {result.get('dataset', '')}: each method's Pareto set on "
             "(validation error, fraction nonzero); the test error is read once per point.",
             ""]
    schedule = _schedule_text(result, mnist).strip()
    if schedule:
        lines += [schedule + ".", ""]
    for m, r in result["methods"].items():
        plan = r["plan"]
        knob = plan.get("knob") or {}
        cand = (f" ({r['n_candidates']} candidates with the tolerance sweep)"
                if r["n_candidates"] > r["n_complete"] else "")
        notes = "".join(f"; {f['run_dir']}: "
                        + ("interrupted, re-queued" if f["requeued"] else "failed")
                        + f" ({f['error'][:100]})" for f in r["failed"])
        if r["n_running"] or r["n_waiting"]:
            notes += f"; {r['n_running']} running, {r['n_waiting']} queued"
        lines.append(f"- {method_label(m)}: {r['n_complete']} finished trials{cand}, "
                     f"{plan.get('epochs')} epochs, {knob.get('name')} in "
                     f"[{knob.get('low'):g}, {knob.get('high'):g}]{notes}")
    lines += ["", "| method | knob |" + (" start |" if warm_col else "") +
              " tol | val. error | fraction nonzero | test error |",
              "| --- | --- |" + (" --- |" if warm_col else "") + " --- | --- | --- | --- |"]
    for r in rows:
        tol = "—" if r["tol"] is None else f"{r['tol']:g}"
        start = (" warm |" if r["warm_start"] else " random |") if warm_col else ""
        lines.append(f"| {r['label']} | {r['knob']} |{start} {tol} | "
                     f"{100 * r['val_error']:.2f}% | {r['nonzero_total']:.4f} | "
                     f"{100 * r['test_error']:.2f}% |")
    if mnist:
        lines += reference_rows()
    md = "\n".join(lines) + "\n"
    (out / "frontier.md").write_text(md)
    return md


def reference_rows() -> list[str]:
    """Markdown lines: the paper's table, the published points and the goals (MNIST,
    LeNet-300-100), to print beside a frontier on full MNIST only."""
    return (["", "Reference points (MNIST, LeNet-300-100):", "",
             "| source | test error | fraction nonzero |", "| --- | --- | --- |"]
            + [f"| paper: {label} (200 epochs) | {100 * e:.2f}% | {d:.4f} |"
               for label, e, d in PAPER_TABLE.values()]
            + [f"| published: {label} | {100 * e:.2f}% | {d:.4f} |"
               for label, (e, d) in PUBLISHED_POINTS.items()]
            + [f"| goal {i + 1} | <= {100 * e:.1f}% | <= {d:.3f} |"
               for i, (e, d) in enumerate(GOALS)])


__all__ = ["DEFAULT_METHODS", "GOALS", "Knob", "PUBLISHED_POINTS", "collect", "default_knob",
           "frontier_report", "frontier_table", "pareto_front", "reference_rows",
           "plot_frontier", "requeue_stale", "run_frontier", "validation_points"]
