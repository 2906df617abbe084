"""The frontier's workers: each process asks its studies for trials and trains them.

A trial is one :func:`dualdrop.train.train` run into ``OUT/trials/<method>/<trial-id>/`` (an
ordinary ``dualdrop sparsify`` folder, with the command that continues it in
``sparsify_command.txt``), watched by a heartbeat; its validation points are told to the study,
its test error is never read here. :func:`run_frontier` checks the settings, writes each
method's :class:`~dualdrop.train.experiments.frontier.storage.Plan`, starts the workers and
returns the report of :mod:`~dualdrop.train.experiments.frontier.evaluation`.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
from pathlib import Path

from dualdrop.nn import method_class
from dualdrop.train.experiments.compare import DEFAULT_METHODS
from dualdrop.train.experiments.frontier.evaluation import frontier_report
from dualdrop.train.experiments.frontier.search import (
    TARGET_DENSITY,
    Knob,
    default_knob,
    method_slug,
    suggest,
    validation_points,
)
from dualdrop.train.experiments.frontier.storage import (
    Heartbeat,
    Plan,
    make_sampler,
    open_storage,
    open_study,
    optuna_module,
    requeue_stale,
    trial_counts,
)


def run_trial(study, plan: Plan, out: Path, data, ctx: dict) -> str:
    """Ask one trial, train it, tell the study; return a one-line summary."""
    optuna = optuna_module()
    from dualdrop.train import TrainConfig, train
    from dualdrop.train.command import sparsify_command

    trial = study.ask()
    hp, warm, tid = suggest(trial, plan)
    target_density = hp.get(TARGET_DENSITY)  # not a hyperparameter: sparsify's own argument
    run_dir = out / "trials" / method_slug(plan.method) / tid
    rel = str(run_dir.relative_to(out))
    for k, v in {"run_dir": rel, "host": socket.gethostname(), "pid": os.getpid(),
                 "hparams": hp, "warm": warm}.items():
        trial.set_user_attr(k, v)
    cfg = TrainConfig(
        method=plan.method, epochs=plan.epochs, out=str(run_dir), data_dir=plan.data_dir,
        seed=plan.seed, device=ctx["device"], lr=plan.lr,
        hparams={k: v for k, v in hp.items() if k != TARGET_DENSITY},
        batch_size=plan.batch_size, val_fraction=plan.val_fraction, resume=True,
        progress=False, threads=ctx["threads"], init_from=plan.init_from if warm else None,
        target_density=target_density)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "sparsify_command.txt").write_text(sparsify_command(cfg) + "\n")
    try:
        with Heartbeat(run_dir, ctx["heartbeat"]):
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


def _worker(spec: dict, rank: int) -> None:
    """One process: add trials to each method's study until each has ``n_trials``."""
    from dualdrop.data import load_dataset

    if spec["threads"] is not None:
        import torch

        torch.set_num_threads(spec["threads"])
    out = Path(spec["out"])
    plans = [Plan(**{**p, "knob": Knob(**p["knob"])}) for p in spec["plans"]]
    p0 = plans[0]
    data = load_dataset(p0.data_dir, seed=p0.seed, val_fraction=p0.val_fraction,
                        verify=spec["verify_data"])
    storage = open_storage(out)
    n = spec["n_trials"]
    studies = [open_study(storage, p, rank) for p in plans]
    order = list(range(len(plans)))
    order = order[rank % len(order):] + order[:rank % len(order)]  # workers start apart
    bar = None
    if spec["progress"]:
        from tqdm.auto import tqdm

        # the whole study's progress (all processes), so every worker's bar ends at its total
        bar = tqdm(total=n * len(studies), initial=sum(min(n, trial_counts(s)[0]) for s in studies),
                   desc=f"frontier worker {rank}", unit="trial", position=rank,
                   file=sys.stderr, dynamic_ncols=True)
    try:
        for i in order:
            study, plan = studies[i], plans[i]
            while True:
                requeue_stale(study, out, spec["stale_after"])
                complete, running, waiting = trial_counts(study)
                if complete + running >= n and waiting == 0:
                    break
                line = run_trial(study, plan, out, data, spec)
                if bar is not None:
                    bar.n = sum(min(n, trial_counts(s)[0]) for s in studies)
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


def run_frontier(
    methods=DEFAULT_METHODS,
    out: str | os.PathLike = "runs/frontier",
    n_trials: int = 8,
    epochs: int | None = None,
    data_dir: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = 1,
    workers: int = 1,
    init_from: str | None = None,
    knobs: dict | None = None,
    fixed: dict | None = None,
    sampler: str = "qmc",
    batch_size: int | None = None,
    lr: float | None = None,
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
    (``"lr"`` sets the learning rate). ``epochs``, ``batch_size`` and each method's learning
    rate and hyperparameters default to the data's, as for ``dualdrop sparsify``
    (:data:`dualdrop.train.config.DATASET_DEFAULTS`: the paper's protocol on MNIST, a short
    schedule chosen on validation for the embedded digits); ``lr`` sets every method's learning
    rate (a method's own ``fixed[m]["lr"]`` wins). ``init_from``: a finished dense run; each
    trial then also
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
    from dualdrop.train.config import dataset_defaults, dataset_of, device_of

    if isinstance(methods, str):
        methods = [methods]
    methods = [check_method(m) for m in methods]
    if not methods:
        raise ValueError("methods is empty; name at least one, e.g. ['vardrop-lr', 'logsum']")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods={methods!r} lists a method twice")
    ds = dataset_defaults(dataset_of(data_dir))
    epochs = ds["epochs"] if epochs is None else epochs
    batch_size = ds["batch_size"] if batch_size is None else batch_size
    for name, v in (("n_trials", n_trials), ("workers", workers), ("epochs", epochs),
                    ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r}; expected a positive int")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float))
                           or not lr > 0 or lr == float("inf")):
        raise ValueError(f"lr={lr!r}; expected a positive finite learning rate, or None for "
                         "each method's default")
    device_of(device)  # a device this machine lacks is refused before anything is written
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads={threads!r}; expected a positive int or None")
    for name, v in (("stale_after", stale_after), ("heartbeat", heartbeat)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name}={v!r}; expected a positive number of seconds")
    if not stale_after > 2 * heartbeat:
        raise ValueError(f"stale_after={stale_after} must exceed twice heartbeat={heartbeat}, or "
                         "live trials would be taken for abandoned ones")
    make_sampler(sampler, seed, 0)  # validates the name
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
        m_lr = f.pop("lr", lr)  # None: the method's default on this data, resolved by train()
        _, hp = resolve_hparams(m, m_lr, f, data.name)  # refuses unknown names
        knob = knobs.get(m) or default_knob(m, hp, len(data.y_train))
        if not isinstance(knob, Knob):
            raise TypeError(f"knobs[{m!r}]={knob!r}; expected a "
                            "dualdrop.train.experiments.frontier.Knob")
        if knob.name not in hp and knob.name != TARGET_DENSITY:
            raise ValueError(f"knob {knob.name!r} is not a hyperparameter of {m!r}; valid: "
                             f"{', '.join(sorted(hp)) or '(none)'}, or {TARGET_DENSITY} (any "
                             "method)")
        if knob.name == TARGET_DENSITY and method_class(m).knob is not None \
                and method_class(m).knob[0] in f:
            raise ValueError(f"{m}: {method_class(m).knob[0]!r} is fixed and the knob is "
                             f"{TARGET_DENSITY}; drop one")
        if knob.name in f:
            raise ValueError(f"{m}: {knob.name!r} is both the knob and a fixed hyperparameter")
        knob.validate(m)
        plans.append(Plan(method=m, knob=knob, fixed={k: hp[k] for k in f}, lr=m_lr,
                           epochs=epochs, seed=seed, val_fraction=val_fraction,
                           batch_size=batch_size, init_from=init_from, data_dir=data_dir,
                           data=data.name, data_fingerprint=data.fingerprint(), sampler=sampler))
    out = Path(out)
    storage = open_storage(out)
    for p in plans:  # refuse a changed study before any process starts
        open_study(storage, p, 0)
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


__all__ = ["run_frontier", "run_trial"]
