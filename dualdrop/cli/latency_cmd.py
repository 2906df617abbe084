"""``dualdrop latency``: how fast is a trained network in each export layout.

Examples::

    dualdrop sparsify --method magnitude --granularity neuron --target-density 0.1 --out runs/d
    dualdrop latency runs/d                                 # table; runs/d/latency/*.json|csv|png
    dualdrop latency runs/d --layouts dense csr auto compact --batch-sizes 1 64 --rounds 30
    dualdrop latency small.pt --model-class dualdrop.train.models:LeNet5 --input-shape 784

A run folder of ``dualdrop sparsify`` is loaded with ``dualdrop.train.load_run`` (its test split
gives the inputs and each layout's test error: the embedded digits, or MNIST with ``--data-dir``);
a saved model (a ``state_dict`` or a ``save_compact`` file) is rebuilt on a fresh
``--model-class`` and timed on random inputs of ``--input-shape``. ``dualdrop.nn.latency`` does
the work: every layout checked against the dense outputs, then timed in interleaved rounds.
"""

from __future__ import annotations

from pathlib import Path

from dualdrop.cli import add_model_options


def register(subparsers) -> None:
    from dualdrop.nn.inference import LAYOUTS

    p = subparsers.add_parser(
        "latency",
        help="time a trained network in every export layout (dense, CSR, auto, compact, int8, "
        "onnxruntime)",
        description="Load a trained network (a dualdrop sparsify run folder, or a saved model "
        "with --model-class), build each export layout, check that they compute the dense "
        "outputs, and time them at several batch sizes on a fixed number of threads "
        "(interleaved rounds, medians and quartiles), beside parameters, nonzeros, FLOPs, "
        "size on disk and the ideal speed-up (FLOP ratio). Prints a table and writes "
        "latency.json, latency.csv and latency.png to --out.",
    )
    p.add_argument("run", help="a run folder of dualdrop sparsify or prune, or a saved model "
                   "file (a state_dict, a module saved whole, or a save_compact file) with "
                   "--model-class")
    add_model_options(p, "for a saved model file", "random inputs of it are timed")
    p.add_argument("--layouts", nargs="+", default=None, choices=LAYOUTS, metavar="LAYOUT",
                   help="layouts to time (default: all whose packages are installed): "
                   + ", ".join(LAYOUTS))
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32, 128], metavar="B",
                   help="batch sizes (default 1 32 128)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch and onnxruntime threads while timing (default 1)")
    p.add_argument("--rounds", type=int, default=15,
                   help="interleaved rounds; each figure is the median over them (default 15)")
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="wall: the time a caller waits (default); cpu: the process's CPU time, "
                   "which other work on a loaded machine does not inflate (one thread)")
    p.add_argument("--data-dir", default=None,
                   help="MNIST folder, for a run trained on MNIST: its test split gives the "
                   "inputs and each layout's test error (without it: random inputs)")
    p.add_argument("--out", default=None,
                   help="output folder (default: RUN/latency for a run folder, "
                   "<file>_latency beside a model file)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _from_file(args):
    """``(model, example_inputs)`` of a saved model file rebuilt on ``--model-class``."""
    import torch

    from dualdrop.train.user_model import (build_user_model, load_model_file,
                                           parse_model_args, parse_shape)

    if args.model_class is None or args.input_shape is None:
        raise ValueError(f"{args.run} is a file: pass --model-class MODULE:CLASS and "
                         "--input-shape D1,D2,... to rebuild and feed it (or pass a run folder)")
    shape = parse_shape(args.input_shape)
    fresh = build_user_model(args.model_class, parse_model_args(args.model_args))
    model = load_model_file(args.run, fresh, option="the model file", spec=args.model_class)
    x = torch.randn(8, *shape, generator=torch.Generator().manual_seed(0))
    return model, x, None


def _from_run(args):
    """``(model, example_inputs, eval_data)`` of a run folder."""
    import torch

    from dualdrop.data import load_dataset
    from dualdrop.train import load_run
    from dualdrop.train.checkpoint import read_json
    from dualdrop.train.export import example_batch
    from dualdrop.train.user_model import calibration_batches, read_calibration

    folder = Path(args.run)
    model = load_run(folder)
    fix = "pass the folder of a finished dualdrop sparsify or prune run"
    config = read_json(folder / "config.json", fix) if (folder / "config.json").is_file() else {}
    data = config.get("data")
    if data == "digits" or (data == "mnist" and args.data_dir is not None):
        ds = load_dataset(None if data == "digits" else args.data_dir,
                          seed=config.get("seed", 0), val_fraction=config.get("val_fraction", 0.2))
        X = torch.from_numpy(ds.X_test).float()
        y = torch.from_numpy(ds.y_test).long()
        return model, X[:128], (X, y)
    if config.get("model_class"):  # dualdrop prune --model: its calibration inputs
        shape = config.get("input_shape")
        calib = read_calibration(config["calib"], shape=tuple(shape) if shape else None,
                                 option=f"the calibration file of {folder}")
        print(f"dualdrop latency: {folder} is a network of your own; it is timed on its "
              "calibration inputs and no test error is reported")
        return model, calibration_batches(calib)[0], None
    n = config.get("n_features") or read_json(folder / "final.json", fix).get(
        "architecture", {}).get("n_features")
    if not n:
        raise ValueError(f"{folder}: its records name no input size; {fix}")
    print(f"dualdrop latency: {folder} was trained on {data!r}; without --data-dir it is timed "
          "on random inputs and no test error is reported")
    return model, example_batch(int(n)), None


def run(args) -> int:
    from dualdrop.nn.inference import latency

    path = Path(args.run)
    if not path.exists():
        raise FileNotFoundError(f"{args.run}: no such run folder or model file")
    if path.is_dir():
        if args.model_class is not None or args.input_shape is not None:
            raise ValueError("--model-class and --input-shape are for a saved model file; a "
                             "run folder rebuilds its own network")
        model, x, eval_data = _from_run(args)
        out = Path(args.out) if args.out else path / "latency"
    else:
        model, x, eval_data = _from_file(args)
        out = Path(args.out) if args.out else path.with_name(path.stem + "_latency")
    report = latency(model, x, layouts=args.layouts, batch_sizes=args.batch_sizes,
                     threads=args.threads, rounds=args.rounds, clock=args.clock,
                     eval_data=eval_data,
                     progress=not args.no_progress)
    print(report.table())
    paths = report.save(out)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
