"""``dualdrop prune``: prune a trained network once, from calibration data.

Examples::

    dualdrop prune --list-methods                                          # methods, options
    dualdrop sparsify --method none --out runs/dense                      # a trained network
    dualdrop prune --from runs/dense --method sparsegpt --density 0.1 --out runs/dense-sgpt10
    dualdrop prune --from runs/dense --method wanda --pattern 2:4 --finetune-epochs 1 \\
        --out runs/dense-wanda24
    dualdrop prune --model net.pt --model-class mypkg.nets:Net --model-args '{"width": 64}' \\
        --calib calib.npy --method sparsegpt --density 0.3 --out runs/net-sgpt30
    dualdrop prune --from runs/dense --granularity neuron --method osscar \\
        --target-speedup 1.5 --out runs/dense-osscar15                    # whole neurons

Two sources: ``--from RUN``, the network of a finished ``dualdrop sparsify`` run (calibration
samples drawn from its training split, test error before and after, optional fine-tuning); or
``--model FILE --model-class MODULE:CLASS --calib FILE``, a network of your own
(``dualdrop.train.user_model``: a state_dict or a module saved whole, read with
``torch.load(weights_only=True)``; calibration inputs from a .pt/.npy/.npz tensor or a CSV), with
the change of its outputs on the calibration data reported. The output folder is a run folder
(``config.json``: the settings, written first; ``model.pt``, ``final.json``;
``dualdrop.train.load_run`` reads it) plus ``report.json``, the one-shot report (per layer:
density, layer objective, seconds, memory). A folder is one run: a rerun with the same settings
continues it (the pruned network is kept in ``oneshot.pt`` while it is fine-tuned, the
fine-tuning checkpointed every epoch), a rerun with others is refused.

``--granularity neuron|head|channel`` (or several, ``head+neuron``) removes whole units
instead (``prune_oneshot(..., granularity=...)``, docs/oneshot.md "Smaller and faster:
structured one-shot"), with one budget of ``--density`` (of the prunable parameters),
``--target-params`` or ``--target-speedup`` (measured on the first calibration batch); the run
folder then also holds ``model_compact.pt``, the physically smaller network
(``dualdrop.nn.save_compact``; ``load_run(out, layout="compact")``), and ``final.json`` the
parameters before and after and the units kept per layer.
"""

from __future__ import annotations

import copy
import re
import sys
import time
from pathlib import Path

from dualdrop.cli import (UsageError, add_model_options, doc_summary, fraction, int_at_least,
                          method_list, nonneg_int, out_dir, positive_float)
from dualdrop.cli.sparsify_cmd import parse_hparams

ONESHOT = "oneshot.pt"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prune",
        help="prune a trained network once from calibration data (SparseGPT, Wanda, ...)",
        description="Prune a trained network once: every layer in forward order, on its "
        "calibration inputs through the layers already pruned, by a one-shot method "
        "(docs/oneshot.md); optionally fine-tune with the masks held. The network is a "
        "finished run (--from RUN) or your own (--model FILE --model-class MODULE:CLASS "
        "--calib FILE). Writes a run folder that dualdrop.train.load_run reads.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from", dest="source", default=None, metavar="RUN",
                     help="folder of a finished dualdrop sparsify run whose network is pruned")
    src.add_argument("--model", default=None, metavar="FILE",
                     help="your own trained network: a state_dict (torch.save(model."
                     "state_dict(), FILE)) or a module saved whole, rebuilt on --model-class; "
                     "needs --calib FILE")
    add_model_options(p, "with --model", "rows of a CSV are reshaped to it; recorded for "
                      "load_run's compact layout")
    p.add_argument("--list-methods", action="store_true",
                   help="print the one-shot methods with their options and the allocations, "
                   "and exit")
    p.add_argument("--method", default=None,
                   help="one-shot method: magnitude, wanda, sparsegpt, admm, the penalty "
                   "methods (logsum, mcp, vardrop, hardconcrete, penalty:<name>) and polish "
                   "(default sparsegpt); with --granularity: magnitude, wanda-sp, flap, ziplm, "
                   "osscar, logsum, mcp, penalty:<name> (default osscar); see --list-methods")
    p.add_argument("--density", type=fraction, default=None, metavar="D",
                   help="fraction of weights kept over the pruned layers (0 < D <= 1); with "
                   "--granularity, of the prunable parameters (the units' rows and columns)")
    p.add_argument("--granularity", default=None, metavar="KIND",
                   help="remove whole units instead of single weights: neuron, head, channel "
                   "or several (head+neuron); the run also saves the compact network")
    p.add_argument("--target-params", type=int_at_least(1), default=None, metavar="N",
                   help="with --granularity: parameters of the whole pruned network (instead "
                   "of --density)")
    p.add_argument("--target-speedup", type=positive_float, default=None, metavar="S",
                   help="with --granularity: the speed-up of the pruned network, predicted by "
                   "a latency table measured once on the first calibration batch and cached "
                   "(instead of --density)")
    p.add_argument("--no-bias-compensation", action="store_true",
                   help="with --granularity: do not fold the removed units' mean contribution "
                   "into the consumer's bias")
    p.add_argument("--pattern", default=None, metavar="N:M",
                   help="N:M sparsity in every layer instead of --density, e.g. 2:4 or 4:8")
    p.add_argument("--allocation", default=None,
                   help="how the density is split over layers: uniform (default), global (one "
                   "magnitude threshold), owl (outlier-weighted), penalty (one penalty level); "
                   "with --granularity: penalty (default), uniform, flap")
    p.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE",
                   help="a method option (repeatable), e.g. --hp blocksize=64; see "
                   "--list-methods")
    p.add_argument("--allocation-hp", action="append", default=[], metavar="NAME=VALUE",
                   help="an allocation option (repeatable), e.g. --allocation-hp owl_lambda=0.02")
    p.add_argument("--refit", action="store_true",
                   help="refit the kept weights of every row by least squares on the "
                   "calibration data")
    p.add_argument("--calib", default=None, metavar="N|FILE",
                   help="calibration data: with --from, N examples drawn from the run's "
                   "training split with --seed (default 1024) or a file; with --model, a file "
                   "(required): a .pt/.npy tensor, an .npz of named arrays (keyword inputs) or "
                   "a CSV of numbers, one sample per row")
    p.add_argument("--exclude", action="append", default=None, metavar="PATTERN",
                   help="leave these layers dense (fnmatch on layer names); repeatable")
    p.add_argument("--finetune-epochs", type=nonneg_int, default=0, metavar="E",
                   help="with --from: then fine-tune E epochs on the training split with the "
                   "masks held (Adam, linear decay; default 0)")
    p.add_argument("--lr", type=positive_float, default=1e-4,
                   help="fine-tuning learning rate (default 1e-4)")
    add_heal_options(p)
    p.add_argument("--data-dir", default=None,
                   help="with --from: the run's data, the MNIST folder it was trained on "
                   "(default: the embedded digits); checked against the run's data fingerprint")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the MD5 check of the MNIST files (for custom IDX files)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the calibration draw and the fine-tuning order (default 0)")
    p.add_argument("--out", default=None,
                   help="output folder (required): one run; a rerun with the same settings "
                   "continues it, other settings need another folder")
    p.add_argument("--threads", type=nonneg_int, default=1,
                   help="torch CPU threads (default 1; 0: torch's own choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, parser=p, interrupt_hint="the one-shot pruning had not finished "
                   "(nothing of it is saved); run the same command again")


def add_heal_options(p) -> None:
    """``--heal-steps``, ``--heal-data``, ``--tokenizer``, ``--heal-lr``, ``--heal-batch-size``:
    healing by
    distillation from the dense network after the pruning (``dualdrop.train.heal``)."""
    p.add_argument("--heal-steps", type=nonneg_int, default=0, metavar="N",
                   help="then heal the pruned network: N steps of distillation from the dense "
                   "one (dualdrop.train.heal; masks held, removed units stay removed; default "
                   "0: no healing)")
    add_heal_data_options(p, "--heal-data", dest="heal_data", default="the calibration data")
    p.add_argument("--heal-lr", type=positive_float, default=1e-3,
                   help="healing learning rate (AdamW, warm-up then cosine decay; default 1e-3)")
    p.add_argument("--heal-batch-size", type=int_at_least(1), default=128,
                   help="healing batch size for samples (default 128)")


def add_heal_data_options(p, *flags, dest: str, default: str) -> None:
    """The healing data (``flags``, e.g. ``--heal-data``) and ``--tokenizer`` for a text file,
    shared by ``dualdrop prune`` and ``dualdrop heal``; ``default`` says what heals without it."""
    p.add_argument(*flags, dest=dest, default=None, metavar="FILE",
                   help="unlabeled inputs to heal on: .pt/.npy samples or batches, or "
                   ".txt (one text a line) / .jsonl (a \"text\" field a line) with "
                   f"--tokenizer (default: {default})")
    p.add_argument("--tokenizer", default=None, metavar="NAME_OR_PATH",
                   help=f"the model's tokenizer for text {flags[0]}: a Hugging Face Hub name or "
                   "a folder written by save_pretrained (transformers' AutoTokenizer)")


def _typed(value: str):
    """An option value from the command line: int, float, true/false, else the string."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def list_methods() -> str:
    """``--list-methods``: each one-shot method, what it does, its options; the allocations."""
    from dualdrop.nn.oneshot.allocation.weights import ALLOCATIONS
    from dualdrop.nn.oneshot.registry import METHODS

    rows = []
    for name, cls in METHODS.items():
        opts = ", ".join(f"{k}={v}" for k, v in cls.defaults.items()
                         if k not in ("penalty", "penalty_params"))
        rows.append((name, doc_summary(cls), f"--hp: {opts}" if opts else ""))
    rows.append(("penalty:<name>", "the penalty method on any separable penalty of the "
                 "penalties catalog (dualdrop penalties)", "e.g. --method penalty:scad --hp a=3.7"))
    weights = method_list("one-shot methods (--method NAME; options --hp NAME=VALUE):", rows,
                          f"allocations (--allocation): {', '.join(ALLOCATIONS)}; "
                          "docs/oneshot.md says which method to use")
    return weights + "\n\n" + _list_unit_methods()


def _list_unit_methods() -> str:
    """The structured methods (``--granularity``) and their allocations."""
    from dualdrop.nn.oneshot.methods.structured.base import COMMON_DEFAULTS
    from dualdrop.nn.oneshot.registry import UNIT_METHODS as METHODS
    from dualdrop.nn.oneshot.allocation.units import ALLOCATIONS

    rows = []
    for name, cls in METHODS.items():
        opts = ", ".join(f"{k}={v}" for k, v in {**COMMON_DEFAULTS, **cls.common,
                                                 **cls.defaults}.items()
                         if k not in ("penalty", "penalty_params"))
        own = cls.__dict__.get("__doc__") or ""
        summary = doc_summary(cls if own and "module docstring" not in own
                              else sys.modules[cls.__module__]).split(": ", 1)[-1]
        rows.append((name, summary, f"--hp: {opts}"))
    rows.append(("penalty:<name>", "the group penalty on the units' norms with any separable "
                 "penalty of the penalties catalog", "e.g. --method penalty:scad"))
    return method_list("structured methods (--granularity neuron|head|channel --method NAME; "
                       "default osscar):", rows,
                       f"allocations (--allocation) with --granularity: {', '.join(ALLOCATIONS)}"
                       "; budgets: --density, --target-params, --target-speedup")


def _check_args(args) -> dict:
    """Every option that needs no file, checked; the method's and allocation's options."""
    if (args.source is None) == (args.model is None):
        raise UsageError("give the network to prune: --from RUN (a finished dualdrop sparsify "
                         "run) or --model FILE --model-class MODULE:CLASS --calib FILE")
    if args.out is None:
        raise UsageError("the output folder is required", "--out")
    options = {k: _typed(v) for k, v in parse_hparams(args.hp).items()}
    if args.refit:
        options["refit"] = True
    alloc_options = {k: _typed(v) for k, v in parse_hparams(
        args.allocation_hp, "--allocation-hp", "owl_lambda=0.02").items()}
    if args.granularity is not None:
        _check_structured(args, options, alloc_options)
        args.method = args.method or "osscar"
    else:
        for flag, value in (("--target-params", args.target_params),
                            ("--target-speedup", args.target_speedup),
                            ("--no-bias-compensation", args.no_bias_compensation)):
            if value:
                raise UsageError(f"{flag} is for structured pruning: add --granularity "
                                 "neuron|head|channel (single weights take --density or "
                                 "--pattern)", flag)
        args.method = args.method or "sparsegpt"
        if (args.density is None) == (args.pattern is None):
            raise UsageError("give exactly one of --density D and --pattern N:M")
    job = job_of(args, options, alloc_options)     # the method, budget, allocation: checked
    args.allocation = job.allocation                # the default of its kind, when not given
    if args.model is not None:
        if args.model_class is None:
            raise UsageError("--model needs --model-class MODULE:CLASS, the class to rebuild the "
                             "network on", "--model-class")
        if args.calib is None or _calib_count(args) is not None:
            raise UsageError("--model needs --calib FILE: calibration inputs of your network "
                             "(.pt/.npy/.npz tensor or CSV)", "--calib")
        for flag, value in (("--finetune-epochs", args.finetune_epochs), ("--data-dir",
                                                                          args.data_dir)):
            if value:
                raise UsageError(f"{flag} is for --from RUN (its training split); fine-tune "
                                 "your own network in Python: dualdrop.train.fit(model, "
                                 "result.sparsify(), loader, loss_fn, epochs=...)", flag)
    elif args.model_class is not None or args.input_shape is not None:
        raise UsageError("--model-class and --input-shape are for --model FILE; a run folder "
                         "rebuilds its own network", "--model-class")
    else:
        _calib_count(args)
    if args.heal_steps and args.finetune_epochs:
        raise UsageError("choose one recovery: --heal-steps (distillation from the dense "
                         "network) or --finetune-epochs (the training labels)", "--heal-steps")
    if args.heal_data is not None and not args.heal_steps:
        raise UsageError("--heal-data is the data of --heal-steps N; give both", "--heal-data")
    tokenizer = heal_tokenizer(args.heal_data, args.tokenizer, "--heal-data")
    out = out_dir(args.out, create=False)
    if (out / "final.json").exists():
        raise FileExistsError(f"--out {out} already holds a finished run; choose another "
                              "folder or remove it")
    if args.source is not None and out.resolve() == Path(args.source).resolve():
        raise UsageError("--out must differ from --from (the source run stays as it is)")
    return {"options": options, "allocation_options": alloc_options, "job": job,
            "tokenizer": tokenizer}


def heal_tokenizer(data, name, data_flag: str):
    """The tokenizer of a text healing file (``--tokenizer``), loaded before any work starts;
    None for tensor data. UsageError naming ``--tokenizer``: text without it, it without
    text, transformers missing, a name that does not load."""
    from dualdrop.train.heal_data import TEXT_KINDS, is_text_file, load_tokenizer

    text = data is not None and is_text_file(data)
    if name is None:
        if text:
            raise UsageError(f"{data_flag} {data} is text: give --tokenizer NAME_OR_PATH (the "
                             "model's tokenizer: a Hub name or a save_pretrained folder)",
                             "--tokenizer")
        return None
    if not text:
        raise UsageError(f"--tokenizer is for text data: give {data_flag} FILE "
                         f"({'/'.join(TEXT_KINDS)})", "--tokenizer")
    try:
        return load_tokenizer(name)
    except (ImportError, ValueError) as exc:
        raise UsageError(str(exc), "--tokenizer") from None


def job_of(args, options: dict, alloc_options: dict):
    """The one-shot ``Job`` of these arguments: the one ``prune_oneshot`` builds from the same
    settings (``dualdrop.nn.oneshot.job.make_job``, which checks them)."""
    from dualdrop.nn.oneshot.job import make_job

    units = {} if args.granularity is None else {
        "granularity": args.granularity, "target_params": args.target_params,
        "target_speedup": args.target_speedup,
        "bias_compensation": not args.no_bias_compensation}
    return make_job(args.method, args.density, args.pattern, args.allocation, options=options,
                    allocation_options=alloc_options, exclude=args.exclude,
                    progress=not args.no_progress, **units)


def _check_structured(args, options: dict, alloc_options: dict) -> None:
    """``--granularity``'s method, budget and allocation; the weight-only options refused."""
    from dualdrop.nn.oneshot.job import check_unit_method

    check_unit_method(args.method, args.granularity)
    budgets = [f for f, v in (("--density", args.density), ("--target-params",
                                                             args.target_params),
                              ("--target-speedup", args.target_speedup)) if v is not None]
    if args.pattern is not None:
        raise UsageError("--pattern is N:M sparsity of single weights; with --granularity give "
                         "--density, --target-params or --target-speedup", "--pattern")
    if len(budgets) != 1:
        raise UsageError("give exactly one budget with --granularity: --density D (of the "
                         "prunable parameters), --target-params N or --target-speedup S",
                         budgets[1] if len(budgets) > 1 else "--density")
    if args.target_speedup is not None and args.target_speedup < 1:
        raise UsageError(f"must be at least 1, got {args.target_speedup}", "--target-speedup")
    if args.finetune_epochs:
        raise UsageError("--finetune-epochs is for single weights; a structured run is saved "
                         "compact (heal it: --heal-steps N, or fine-tune load_run(out, "
                         "layout='compact') in Python)", "--finetune-epochs")


def _calib_count(args) -> int | None:
    """``--calib N`` of ``--from`` (default 1024), or None for a file."""
    if args.calib is None:
        return 1024
    if re.fullmatch(r"[-+]?\d+", args.calib.strip()):
        if int(args.calib) < 1:
            raise UsageError(f"must be an integer >= 1 or a file, got {args.calib!r}", "--calib")
        return int(args.calib)
    return None


def _from_run(args) -> dict:
    """The network, calibration data, evaluation and record of ``--from RUN``."""
    import torch

    from dualdrop.data import load_dataset
    from dualdrop.train import load_run
    from dualdrop.train.checkpoint import read_json
    from dualdrop.train.evaluate import error_rate
    from dualdrop.train.user_model import read_calibration

    source = Path(args.source)
    net = load_run(source)
    fix = f"--from {source} must be the folder of a finished dualdrop sparsify run"
    src_cfg = read_json(source / "config.json", fix)
    src_final = read_json(source / "final.json", fix)
    data = load_dataset(args.data_dir, seed=src_cfg.get("seed", 0),
                        val_fraction=src_cfg.get("val_fraction", 0.2), verify=not args.no_verify)
    if src_cfg.get("data_fingerprint") not in (None, data.fingerprint()):
        raise ValueError(f"the data of --data-dir {args.data_dir!r} ({data.name}) is not the "
                         f"data run {source} was trained on ({src_cfg.get('data_summary', '?')});"
                         " pass the same --data-dir")
    Xtr, ytr = torch.from_numpy(data.X_train), torch.from_numpy(data.y_train)
    count = _calib_count(args)
    if count is None:
        calib = read_calibration(args.calib, shape=tuple(Xtr.shape[1:]))
    else:
        if count > len(Xtr):
            raise UsageError(f"--calib {count} exceeds the {len(Xtr)} training examples",
                             "--calib")
        g = torch.Generator().manual_seed(args.seed)
        calib = Xtr[torch.randperm(len(Xtr), generator=g)[:count]]
    Xva, yva = torch.from_numpy(data.X_val), torch.from_numpy(data.y_val)
    Xte, yte = torch.from_numpy(data.X_test), torch.from_numpy(data.y_test)
    return {"net": net, "calib": calib, "train": (Xtr, ytr),
            "evaluate": lambda m: {"val_error": error_rate(m, Xva, yva),
                                   "test_error": error_rate(m, Xte, yte)},
            "record": {"from": str(source), "source_config": src_cfg,
                       "model": src_cfg.get("model"), "n_features": src_cfg.get("n_features"),
                       "data_fingerprint": src_cfg.get("data_fingerprint")},
            "final": {"from": str(source), "architecture": src_final.get("architecture"),
                      "data": data.summary()}}


def _from_model(args) -> dict:
    """The network, calibration data, evaluation and record of ``--model FILE``."""
    from dualdrop.train.user_model import (build_user_model, load_model_file, parse_model_args,
                                           parse_shape, read_calibration)

    kwargs = parse_model_args(args.model_args)
    shape = parse_shape(args.input_shape) if args.input_shape is not None else None
    net = load_model_file(args.model, build_user_model(args.model_class, kwargs),
                          spec=args.model_class)
    dtype = next((p.dtype for p in net.parameters() if p.is_floating_point()), None)
    calib = read_calibration(args.calib, shape=shape, **({"dtype": dtype} if dtype else {}))
    change = _output_change(net, calib)
    arch = {"model_class": args.model_class, "model_args": kwargs,
            "input_shape": list(shape) if shape else None}
    return {"net": net, "calib": calib, "train": None,
            "evaluate": lambda m: {"output_change": change(m)},
            "record": {"model_file": str(Path(args.model).resolve()), **arch},
            "final": {"model_file": str(Path(args.model).resolve()), "architecture": arch}}


def _output_change(net, calib, n: int = 256):
    """``change(model)``: ``||f(x) - f0(x)|| / ||f0(x)||`` over the first ``n`` calibration
    samples, ``f0`` the network as it is now (before pruning)."""
    import torch

    from dualdrop.nn._graph import tensors
    from dualdrop.nn.oneshot.calibration import default_forward
    from dualdrop.train.user_model import calibration_batches

    batches = calibration_batches(calib, 64)[: max(1, n // 64)]

    @torch.no_grad()
    def outputs(model):
        was = model.training
        model.eval()
        try:
            return [t.detach().double() for b in batches
                    for t in tensors(default_forward(model, b)) if t.is_floating_point()]
        finally:
            model.train(was)

    ref = outputs(net)
    ref_norm = sum(float((r ** 2).sum()) for r in ref) ** 0.5

    def change(model) -> float:
        diff = sum(float(((a - r) ** 2).sum()) for a, r in zip(outputs(model), ref)) ** 0.5
        return diff / ref_norm if ref_norm > 0 else diff

    return change


def prune_run(args) -> dict:
    """The work of ``dualdrop prune`` (every argument checked before any file is written)."""
    import torch

    from dualdrop.nn import export_sparse
    from dualdrop.train.checkpoint import (atomic_save, atomic_write_json, claim_run_folder,
                                           release_run_folder)

    checked = _check_args(args)
    options, alloc_options = checked["options"], checked["allocation_options"]
    out = Path(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    src = _from_run(args) if args.source is not None else _from_model(args)
    net, calib = src["net"], src["calib"]
    settings = {"method": f"oneshot:{args.method}", **src["record"], "density": args.density,
                "pattern": args.pattern, "allocation": checked["job"].allocation,
                "allocation_options": alloc_options, "options": options,
                "calib": _calib_count(args) or str(Path(args.calib).resolve()),
                "seed": args.seed,
                "exclude": args.exclude, "finetune_epochs": args.finetune_epochs,
                "lr": args.lr}
    if args.heal_steps:
        settings.update(heal_steps=args.heal_steps, heal_lr=args.heal_lr,
                        heal_batch_size=args.heal_batch_size, heal_data=args.heal_data and str(
                            Path(args.heal_data).resolve()), tokenizer=args.tokenizer)
    teacher = copy.deepcopy(net) if args.heal_steps else None
    if args.granularity is not None:
        settings.update(granularity=args.granularity, target_params=args.target_params,
                        target_speedup=args.target_speedup,
                        bias_compensation=not args.no_bias_compensation)
    existed = out.exists()
    rerun = claim_run_folder(out, settings)
    saved = out / ONESHOT
    try:
        if rerun and saved.is_file():     # the pruning of an interrupted run: not done again
            res, oneshot = _load_oneshot(saved, net)
        else:
            res, oneshot = _prune_once(args, net, calib, checked, src["evaluate"])
            if args.finetune_epochs or (args.heal_steps and args.granularity is None):
                atomic_save({"model": net.state_dict(), "masks": res.masks,
                             "report": res.report.to_dict(), "oneshot": oneshot}, saved)
    except BaseException:                 # refused or interrupted before any work is saved:
        if not rerun and not saved.exists():  # the folder is left as it was
            release_run_folder(out, remove_folder=not existed)
        raise
    final = {"status": "finished", "method": f"oneshot:{args.method}", **src["final"],
             "target": res.report.target, "allocation": res.report.allocation,
             "options": options,
             "allocation_options": alloc_options, "calib": settings["calib"],
             "seed": args.seed, **oneshot, "objective": res.report.objectives(),
             "finetune_epochs": args.finetune_epochs}
    if args.granularity is None:
        final.update(nonzero_total=res.report.density,
                     nonzero={r["layer"]: r["density"] for r in res.report.layers})
    else:
        rep = res.report
        final.update(granularity=args.granularity, params_before=rep.params_before,
                     params_after=rep.params_after, predicted_speedup=rep.predicted_speedup,
                     measured_speedup=rep.measured_speedup,
                     units={r["layer"]: [r["kept"], r["units"]] for r in rep.layers})
    if args.finetune_epochs:
        final["finetune_seconds"] = _finetune(args, net, res, src["train"], out)
        net = export_sparse(net).eval()
    if args.heal_steps:
        from dualdrop.train.heal import heal_in_folder

        args.interrupt_hint = (f"the healing is checkpointed in {out / 'heal'}; run the same "
                               "command again to continue")
        final["heal"] = heal_in_folder(net, teacher, args.heal_data or calib, out / "heal",
                                   steps=args.heal_steps, lr=args.heal_lr,
                                   batch_size=args.heal_batch_size, masks=res.masks,
                                   tokenizer=checked["tokenizer"],
                                   progress=not args.no_progress)
    final.update(src["evaluate"](net))
    atomic_write_json(out / "report.json", res.report.to_dict())
    atomic_save(net.state_dict(), out / "model.pt")
    if args.granularity is not None:
        final["model_files"] = _save_compact(res, out)
    atomic_write_json(out / "final.json", final)
    saved.unlink(missing_ok=True)
    return final


def _save_compact(res, out: Path) -> dict:
    """``out/model_compact.pt``: the network of a structured run with the removed units gone
    (``res.compact()``, its outputs checked against the zeroed network's); the files' record
    (a warning and no compact file when the export fails: ``model.pt`` holds the network)."""
    import warnings

    from dualdrop.nn import save_compact
    from dualdrop.nn._files import atomic_target
    from dualdrop.train.export import MODEL, MODEL_COMPACT

    (out / MODEL_COMPACT).unlink(missing_ok=True)
    try:
        small = res.compact()
    except (ImportError, ValueError, RuntimeError) as exc:
        warnings.warn(f"the compact export failed ({exc}); {out / MODEL} holds the pruned "
                      "network with the removed units zeroed", UserWarning, stacklevel=2)
        return {"dense": MODEL, "compact": None}
    with atomic_target(out / MODEL_COMPACT) as tmp:
        save_compact(small, tmp)
    return {"dense": MODEL, "compact": MODEL_COMPACT,
            "compact_params": sum(p.numel() for p in small.parameters())}


def _prune_once(args, net, calib, checked: dict, evaluate) -> tuple:
    """``(OneShotResult or StructuredResult, record)``: ``net`` pruned by ``prune_oneshot``,
    the seconds it took and its evaluation."""
    from dualdrop.nn.oneshot import run_job
    from dualdrop.train.user_model import calibration_batches

    t0 = time.perf_counter()
    res = run_job(checked["job"], net, calibration_batches(calib))
    return res, {"oneshot_seconds": time.perf_counter() - t0,
                 **{f"{k}_oneshot": v for k, v in evaluate(net).items()}}


def _load_oneshot(path: Path, net):
    """The one-shot result an interrupted run saved: loaded into ``net``."""
    from dualdrop.nn.oneshot.report import OneShotResult, Report
    from dualdrop.train.checkpoint import read_checkpoint

    blob = read_checkpoint(path, fix="remove it to prune again",
                           keys=("model", "masks", "report", "oneshot"))
    net.load_state_dict(blob["model"])
    report = Report(**{k: v for k, v in blob["report"].items() if k != "density"})
    return OneShotResult(net, report, blob["masks"]), blob["oneshot"]


def _finetune(args, net, res, train, out: Path) -> float:
    """Fine-tune ``net`` with the one-shot masks held, checkpointed every epoch; the seconds
    it took."""
    import torch

    from dualdrop.train import fit

    Xtr, ytr = train
    res.sparsify()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(Xtr, ytr), batch_size=128, shuffle=True,
        generator=torch.Generator().manual_seed(args.seed))
    args.interrupt_hint = (f"the pruned network is saved in {out / ONESHOT} and the fine-tuning "
                           f"checkpointed after each epoch in {out / 'finetune'}; run the same "
                           "command again to continue")
    t1 = time.perf_counter()
    fit(net, "magnitude", loader,
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        epochs=args.finetune_epochs, lr=args.lr, hparams=res.hparams,
        checkpoint_dir=out / "finetune", checkpoint_every=len(loader),
        progress=not args.no_progress)
    return time.perf_counter() - t1


def run(args) -> int:
    if args.list_methods:
        print(list_methods())
        return 0
    final = prune_run(args)
    if "test_error" in final:
        tail = (f"; after {final['finetune_epochs']} epoch(s) of fine-tuning "
                f"{100 * final['test_error']:.2f}%" if final["finetune_epochs"] else "")
        what = f"test error {100 * final['test_error_oneshot']:.2f}%"
    else:
        tail = ""
        what = (f"outputs on the calibration data changed by "
                f"{100 * final['output_change']:.2f}% (relative)")
    seconds = final.get("oneshot_seconds")
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    if "granularity" in final:
        sp, ms = final["predicted_speedup"], final.get("measured_speedup")
        size = (f"parameters {final['params_before']:,} -> {final['params_after']:,}"
                + (f" (predicted speed-up {sp:.2f}x" + (f", measured {ms:.2f}x" if ms else "")
                   + ")" if sp else ""))
    else:
        size = f"{final['nonzero_total']:.4f} nonzero"
    print(f"{final['method']} ({final['target']}, allocation {final['allocation']}): "
          f"{size}, {what}{took}{tail}; outputs in {args.out}")
    compact = (final.get("model_files") or {}).get("compact")
    layout = ", layout='compact'" if compact else ""
    print(f"  in Python: dualdrop.train.load_run({str(args.out)!r}{layout})", file=sys.stdout)
    return 0
