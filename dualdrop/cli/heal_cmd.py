"""``dualdrop heal``: heal a pruned run by distillation from its dense network.

Examples::

    dualdrop prune --from runs/dense --method sparsegpt --density 0.05 --out runs/sgpt5
    dualdrop heal runs/sgpt5 --steps 750                       # the teacher: runs/dense
    dualdrop heal runs/net-osscar --teacher net.pt --steps 500 --data unlabeled.npy
    dualdrop heal runs/lm-sgpt --teacher lm.pt --steps 300 --data text.txt --tokenizer tok/

The run folder of a finished ``dualdrop prune`` is healed in place (``dualdrop.train.heal``):
the pruned network (``model.pt``, its zeros held: removed weights and units stay removed) is
trained to reproduce the teacher's outputs (KL on its logits), by default the network the run
was pruned from (``--from`` of the prune), or ``--teacher``: another run folder, or a model file
rebuilt on the prune's ``--model-class``. The data: ``--data FILE`` (or ``--heal-data``:
unlabeled inputs, ``.pt``/``.npy`` samples or batches, or ``.txt``/``.jsonl`` texts with
``--tokenizer NAME_OR_PATH``) or the prune's calibration samples. The healing is
checkpointed in ``RUN/heal/`` (a rerun of the same command continues it exactly); when it ends,
the one-shot network is kept as ``model_oneshot.pt``, ``model.pt`` (and ``model_compact.pt`` of
a structured run) hold the healed one, and ``final.json`` records both phases: the one-shot
evaluation and, under ``"heal"``, the healing's settings, losses, seconds and evaluation.
``dualdrop prune ... --heal-steps N`` does both phases in one command.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from dualdrop.cli import UsageError, nonneg_int, positive_float, positive_int
from dualdrop.cli.prune_cmd import _from_run, add_heal_data_options, heal_tokenizer

HEAL_DIR = "heal"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "heal", help="heal a pruned run by distillation from its dense network",
        description="Train the network of a finished dualdrop prune run to reproduce its dense "
        "network (the teacher) on unlabeled data, its pruned weights and units held at 0; "
        "checkpointed, resumable, recorded in the run folder (docs/oneshot.md \"Heal\").")
    p.add_argument("run", metavar="RUN_DIR", help="folder of a finished dualdrop prune run")
    p.add_argument("--teacher", default=None, metavar="RUN|FILE",
                   help="the dense network: a run folder, or a model file rebuilt on the "
                   "prune's --model-class (default: the run the prune started --from)")
    p.add_argument("--steps", type=positive_int, required=True, metavar="N",
                   help="healing steps (batches)")
    add_heal_data_options(p, "--data", "--heal-data", dest="data",
                          default="the prune's calibration samples")
    p.add_argument("--lr", type=positive_float, default=1e-3,
                   help="learning rate (AdamW, warm-up then cosine decay; default 1e-3)")
    p.add_argument("--batch-size", type=positive_int, default=128,
                   help="batch size for samples (default 128)")
    p.add_argument("--data-dir", default=None,
                   help="the data of a --from run (the MNIST folder it was trained on; "
                   "default: the embedded digits): the calibration draw and the test error")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files")
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch CPU threads (default 1; 0: torch's own choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, parser=p, interrupt_hint="the healing is checkpointed in "
                   "RUN_DIR/heal; run the same command again to continue")


def _teacher(args, cfg: dict):
    """The dense network: ``--teacher`` (a run folder or a model file) or the prune's
    ``--from``."""
    from dualdrop.train import load_run
    from dualdrop.train.user_model import build_user_model, load_model_file

    src = args.teacher or cfg.get("from")
    if src is None:
        raise UsageError("the run was pruned from a model file: give the dense network with "
                         "--teacher FILE (or a run folder)", "--teacher")
    if Path(src).is_dir():
        return load_run(src)
    if cfg.get("model_class") is None:
        raise UsageError(f"{src} is a file, but the run records no --model-class to rebuild "
                         "it on; give a run folder", "--teacher")
    return load_model_file(src, build_user_model(cfg["model_class"], cfg.get("model_args") or {}),
                           spec=cfg["model_class"])


def _calibration(args, cfg: dict):
    """``(calibration samples, evaluate(model) -> dict)`` as the prune drew them."""
    from dualdrop.train.user_model import read_calibration

    if cfg.get("from") is not None:
        ns = argparse.Namespace(source=cfg["from"], data_dir=args.data_dir,
                                no_verify=args.no_verify, calib=str(cfg.get("calib", 1024)),
                                seed=cfg.get("seed", 0))
        src = _from_run(ns)
        return src["calib"], src["evaluate"]
    shape = cfg.get("input_shape")
    return read_calibration(cfg["calib"], shape=tuple(shape) if shape else None), \
        lambda m: {}


def run(args) -> int:
    import torch

    from dualdrop.nn import save_compact
    from dualdrop.nn._files import atomic_target
    from dualdrop.nn.compact import compact
    from dualdrop.train import load_run
    from dualdrop.train.checkpoint import atomic_save, atomic_write_json, read_json
    from dualdrop.train.export import MODEL, MODEL_COMPACT
    from dualdrop.train.heal import heal_in_folder

    folder = Path(args.run)
    fix = "give the folder of a finished dualdrop prune run"
    if not (folder / "final.json").is_file():
        raise UsageError(f"{folder} holds no finished run (no final.json); {fix}", "RUN_DIR")
    final = read_json(folder / "final.json", fix)
    cfg = read_json(folder / "config.json", fix)
    if not str(final.get("method", "")).startswith("oneshot:"):
        raise UsageError(f"{folder} is not a dualdrop prune run (method "
                         f"{final.get('method')!r}); {fix}", "RUN_DIR")
    if (final.get("heal") or {}).get("status") == "finished":
        raise FileExistsError(f"{folder} is healed already ({final['heal']['steps']} steps); "
                              "prune again into a new folder to heal otherwise")

    tokenizer = heal_tokenizer(args.data, args.tokenizer, "--data")
    if args.threads:
        torch.set_num_threads(args.threads)
    teacher = _teacher(args, cfg)
    student = load_run(folder)
    calib, evaluate = _calibration(args, cfg)
    data = args.data if args.data is not None else calib
    args.interrupt_hint = (f"the healing is checkpointed in {folder / HEAL_DIR}; run the same "
                           "command again to continue")
    record = heal_in_folder(student, teacher, data, folder / HEAL_DIR, steps=args.steps,
                            lr=args.lr, batch_size=args.batch_size, masks="zeros",
                            tokenizer=tokenizer, progress=not args.no_progress)
    after = evaluate(student)
    record.update(teacher=str(args.teacher or cfg.get("from")), data=args.data or "calibration",
                  **after)
    if not (folder / "model_oneshot.pt").exists():
        shutil.copyfile(folder / MODEL, folder / "model_oneshot.pt")
    atomic_save(student.state_dict(), folder / MODEL)
    if (final.get("model_files") or {}).get("compact"):
        first = calib[:1] if isinstance(calib, torch.Tensor) else calib
        with atomic_target(folder / MODEL_COMPACT) as tmp:
            save_compact(compact(student, first), tmp)
    before = {f"{k}_before_heal": final.get(k) for k in after}
    final.update(heal=record, **before, **after)
    atomic_write_json(folder / "final.json", final)
    what = (f"test error {100 * before['test_error_before_heal']:.2f}% -> "
            f"{100 * after['test_error']:.2f}%"
            if before.get("test_error_before_heal") is not None else
            f"distillation loss {record['loss_first']:.4g} -> {record['loss_last']:.4g}")
    print(f"healed {folder} in {record['steps']} steps ({record['seconds']:.1f} s): {what}; "
          f"the one-shot network kept as model_oneshot.pt")
    return 0
