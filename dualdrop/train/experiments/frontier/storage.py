"""Where the frontier's trials live: the Optuna journal, its studies, heartbeats, stale trials.

Each method's trials form one multi-objective study (validation error, fraction nonzero) in the
journal file ``OUT/study.journal``, which several processes (on one machine, or on several
sharing a file system) append to. A study stores its :class:`Plan` (what every trial of the
method shares) and refuses a second call made with other settings. A trial whose process is gone
(same host: its process id; any host: a heartbeat file older than ``stale_after`` seconds) is
marked failed and re-queued with the same parameters.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from dualdrop.train.checkpoint import CheckpointError, pid_alive
from dualdrop.train.experiments.frontier.search import Knob

#: the journal file of a frontier folder, shared by every process that adds trials
JOURNAL = "study.journal"
#: touched by a training trial every few seconds; an old one marks the trial abandoned
HEARTBEAT = ".frontier-heartbeat"
#: study names are STUDY_PREFIX + method
STUDY_PREFIX = "frontier:"


def optuna_module():
    """Optuna, its log quieted, or an ImportError naming the extra that installs it."""
    try:
        import optuna
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("dualdrop frontier needs optuna: pip install 'dualdrop[frontier]'") \
            from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def open_storage(out: str | os.PathLike, create: bool = True):
    """The Optuna journal storage of a frontier folder (``OUT/study.journal``)."""
    optuna = optuna_module()
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = Path(out) / JOURNAL
    if not create and not path.exists():
        raise FileNotFoundError(f"no frontier study at {path}; run `dualdrop frontier --out "
                                f"{out} ...` first (without --report-only)")
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_journal(path)
    # the open(O_EXCL) lock works on NFS too: several machines may share the folder
    try:
        storage = optuna.storages.JournalStorage(
            JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
        storage.get_all_studies()  # replays the journal: a corrupt one fails here, not later
    except (OSError, KeyboardInterrupt):
        raise
    except Exception as exc:  # optuna's replay raises KeyError, AssertionError, JSON errors...
        raise CheckpointError(
            f"{path} is not a readable study journal ({type(exc).__name__}: {exc}); move it "
            "away to start a new study there, or restore it from a copy") from None
    return storage


def _check_journal(path: Path) -> None:
    """``CheckpointError`` unless ``path`` (if present) is Optuna's journal: lines of JSON
    records, each with an ``op_code``, the last one complete (Optuna appends after it)."""
    if not path.exists():
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        text = None
    problem = "it is not text" if text is None else None
    if text and problem is None:
        if not text.endswith("\n"):
            problem = "its last record is incomplete"
        for i, line in enumerate(text.splitlines(), 1):
            if problem is not None:
                break
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not (isinstance(record, dict) and "op_code" in record):
                problem = f"line {i} is not a journal record"
    if problem is not None:
        raise CheckpointError(
            f"{path} is not a readable study journal ({problem}); move it away to start a new "
            "study there, or restore it from a copy")


class Heartbeat:
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
    host, pid = t.user_attrs.get("host"), t.user_attrs.get("pid")
    if host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
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
    optuna = optuna_module()
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


@dataclass
class Plan:
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


def make_sampler(name: str, seed: int, rank: int):
    """The sampler ``name`` (qmc, tpe, random) of process ``rank``."""
    optuna = optuna_module()
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


def open_study(storage, plan: Plan, rank: int):
    """The study of ``plan.method`` in ``storage`` (created, or loaded and checked against
    ``plan``: a study made with other settings is refused by name) with process ``rank``\'s sampler."""
    optuna = optuna_module()
    study = optuna.create_study(
        storage=storage, study_name=STUDY_PREFIX + plan.method, load_if_exists=True,
        directions=["minimize", "minimize"], sampler=make_sampler(plan.sampler, plan.seed, rank))
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


def trial_counts(study) -> tuple[int, int, int]:
    """Numbers of complete, running and waiting trials of ``study``."""
    optuna = optuna_module()
    S = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    return tuple(sum(t.state == s for t in trials) for s in (S.COMPLETE, S.RUNNING, S.WAITING))


__all__ = ["HEARTBEAT", "JOURNAL", "STUDY_PREFIX", "Heartbeat", "Plan", "make_sampler",
           "open_storage", "open_study", "optuna_module", "requeue_stale", "trial_counts"]
