"""The trained network out of a run folder: ``model.pt`` and :func:`load_run`.

A sparsified network is only needed in its *test-time* form: every method's deterministic
evaluation rule (keep ratio at least ``tol``, gates at their expected value, magnitude masks)
folded into plain weights, pruned weights exactly 0 (``dualdrop.nn.export_sparse``). A finished
run writes that network as the ``state_dict`` of the plain architecture (``model.pt``), and, when
its Linear layers keep at most ``CSR_FILE_DENSITY`` (10%) of their weights, also its CSR form
(``model_csr.pt``, every Linear layer ``CSRLinear``), and, when torch-pruning is installed (extra
``structured``), its compact form with dead units removed (``model_compact.pt``, written by
``dualdrop.nn.save_compact``). All load with ``weights_only=True``; :func:`load_run` rebuilds
the architecture from the run's record and returns the network in eval mode.
The same test-time network of a checkpoint warm-starts other runs (:func:`init_weights`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from dualdrop.nn._files import atomic_target
from dualdrop.train.checkpoint import CHECKPOINT, atomic_save, read_checkpoint, read_json
from dualdrop.train.config import DENSE, _nn
from dualdrop.train.models import DEFAULT_MODEL, build_model

MODEL = "model.pt"
MODEL_CSR = "model_csr.pt"
MODEL_COMPACT = "model_compact.pt"
CSR_FILE_DENSITY = 0.1  # sparse enough for the CSR products to pay off from a few rows on
_LEGACY_NAMES = {"lenet-300-100": DEFAULT_MODEL}  # records written before --model existed


def architecture(n_features: int, n_classes: int, model: str = DEFAULT_MODEL) -> dict:
    """The record from which :func:`build` rebuilds the network (stored in final.json)."""
    return {"name": model, "n_features": int(n_features), "n_classes": int(n_classes)}


def build(arch: dict) -> nn.Module:
    """A fresh network of the architecture record ``arch``: a ``dualdrop.train.models`` name, or
    a user's ``model_class`` with its ``model_args`` (``dualdrop prune --model``)."""
    if arch.get("model_class"):
        from dualdrop.train.user_model import build_user_model

        return build_user_model(arch["model_class"], arch.get("model_args") or {},
                                option="model_class")
    name = arch.get("name", DEFAULT_MODEL)
    return build_model(_LEGACY_NAMES.get(name, name), int(arch["n_features"]),
                       int(arch.get("n_classes", 10)))


def set_lams(sp, lam: float, layers: dict | None = None, ramp: float = 1.0) -> None:
    """Every sparsified layer's strength: ``lam * layers.get(layer, 1) * ramp``; the test-time
    thresholds follow (a penalty method's keep ratio ``eta/(eta + lam)`` depends on ``lam``).
    The one place where the training loop and a rebuilt network set per-layer strengths."""
    for target, st in sp.states():
        st.lam = float(lam) * float((layers or {}).get(target.key, 1.0)) * ramp
    if sp.has_tol:
        sp.set_tol(sp.hparams["tol"])


def training_network(ck: dict):
    """``(net, sparsifier)``: the network of a training checkpoint (read with
    :func:`~dualdrop.train.checkpoint.read_checkpoint`) as it was trained, i.e. sparsified with
    the run's own method and hyperparameters (``sparsifier`` is None for a dense run), with the
    checkpoint's weights loaded."""
    conf = ck["config"]
    net = build(ck.get("arch") or {"name": conf.get("model", DEFAULT_MODEL),
                                   "n_features": conf["n_features"]})
    sp = None if conf["method"] == DENSE else _nn().sparsify(net, conf["method"], **conf["hparams"])
    if sp is not None and conf.get("lam_layers"):  # the per-layer strengths it was trained with
        set_lams(sp, conf["hparams"]["lam"], conf["lam_layers"])
    net.load_state_dict(ck["model"])
    return net, sp


def test_time_network(ck: dict) -> nn.Module:
    """The plain test-time network of a training checkpoint: :func:`training_network` folded
    with ``export_sparse(layout="dense")``."""
    net, sp = training_network(ck)
    if sp is not None:
        net = _nn().export_sparse(net, layout="dense")
    return net.eval()


def init_weights(source: str | os.PathLike, n_features: int, n_classes: int,
                 model: str = DEFAULT_MODEL):
    """Plain network weights (``model``) from a run folder or checkpoint, and a record of them.

    A sparsified run's checkpoint is rebuilt with its own method and hyperparameters and folded
    with ``export_sparse(layout="dense")`` (its test-time network); a dense run's is used as is.
    """
    path = Path(source)
    if path.is_dir():
        path = path / CHECKPOINT
    ck = read_checkpoint(path, fix=f"init_from={str(source)!r} needs a run folder written by "
                         "dualdrop sparsify, or its checkpoint.pt")
    conf = ck["config"]
    if conf.get("n_features") != n_features:
        raise ValueError(f"init_from={str(source)!r}: that run had {conf.get('n_features')} input "
                         f"features, this data has {n_features}")
    if conf.get("model", DEFAULT_MODEL) != model:
        raise ValueError(f"init_from={str(source)!r}: that run trained "
                         f"{conf.get('model', DEFAULT_MODEL)!r}, this one {model!r}")
    src = test_time_network(ck)
    sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
    nnz = sum(int(torch.count_nonzero(v)) for k, v in sd.items() if k.endswith("weight"))
    tot = sum(v.numel() for k, v in sd.items() if k.endswith("weight"))
    info = {"path": str(path.resolve()), "method": conf["method"], "epoch": int(ck["epoch"]),
            "nonzero_total": nnz / tot}
    return sd, info


def example_batch(n_features: int) -> torch.Tensor:
    """A fixed random batch ``(4, n_features)``: the forward run that traces a network of
    ``dualdrop.train.models`` for the compact export (random, so that a unit's constant output
    is checked across distinct samples)."""
    return torch.randn(4, int(n_features), generator=torch.Generator().manual_seed(0))


def save_model(model: nn.Module, sparsified: bool, out: Path,
               n_features: int | None = None) -> dict:
    """Write ``out/model.pt`` (and ``out/model_csr.pt`` when the Linear layers' density is at
    most ``CSR_FILE_DENSITY``) of the trained ``model``; with ``n_features`` (the input size)
    and torch-pruning installed, also ``out/model_compact.pt`` of a sparsified model (dead units removed, ``dualdrop.nn.compact``).
    Return the record of the files for final.json."""
    dnn = _nn()
    plain = dnn.export_sparse(model, layout="dense") if sparsified else model
    atomic_save({k: v.detach().cpu() for k, v in plain.state_dict().items()}, out / MODEL)
    files = {"dense": MODEL, "csr": None, "compact": None}
    if sparsified and dnn.linear_density(plain) <= CSR_FILE_DENSITY:
        csr = dnn.export_sparse(plain, layout="csr")
        atomic_save({k: v.detach().cpu() for k, v in csr.state_dict().items()}, out / MODEL_CSR)
        files["csr"] = MODEL_CSR
    else:
        (out / MODEL_CSR).unlink(missing_ok=True)
    (out / MODEL_COMPACT).unlink(missing_ok=True)
    if sparsified and n_features is not None:
        try:
            small = dnn.compact(plain.cpu(), example_batch(n_features))
        except ImportError:  # torch-pruning (extra "structured") is optional
            small = None
        if small is not None:
            with atomic_target(out / MODEL_COMPACT) as tmp:
                dnn.save_compact(small, tmp)
            files["compact"] = MODEL_COMPACT
    return files


def _runs_below(folder: Path, depth: int = 3) -> list[Path]:
    """Finished runs (folders with a ``final.json``) up to ``depth`` levels below ``folder``:
    ``compare``'s ``OUT/runs/<method>[/seed<k>]``, ``frontier``'s ``OUT/trials/<method>/<id>``."""
    found = []
    for k in range(1, depth + 1):
        found += [p.parent for p in folder.glob("/".join(["*"] * k) + "/final.json")]
    return sorted(found)


def load_run(run: str | os.PathLike, layout: str = "dense") -> nn.Module:
    """The test-time network of a finished ``dualdrop sparsify`` run, ready for ``model(x)``.

    ``run``: the run's output folder. ``layout="dense"``: the plain architecture with pruned
    weights exactly 0 (``nn.Linear`` layers); ``"csr"``: the Linear layers as ``CSRLinear``
    (sparse CSR weights; from ``model_csr.pt`` when the run wrote one, else converted);
    ``"compact"``: dead units removed (``dualdrop.nn.compact``, needs torch-pruning; from
    ``model_compact.pt`` when the run wrote one, else compacted from the dense network). The
    network is in eval mode, on the CPU, loaded with ``weights_only=True``. A run finished by an
    older dualdrop (no ``model.pt``) is rebuilt from its checkpoint.
    """
    if layout not in ("dense", "csr", "compact"):
        raise ValueError(f"layout={layout!r}; expected 'dense', 'csr' or 'compact'")
    folder = Path(run)
    final_path = folder / "final.json"
    if not final_path.is_file():
        if not folder.exists():
            raise FileNotFoundError(f"load_run({str(run)!r}): the folder does not exist; pass the --out "
                                    "folder of a finished dualdrop sparsify run")
        state = "it has no final.json"
        if (folder / CHECKPOINT).is_file():
            history = folder / "history.json"
            done = len(json.loads(history.read_text())) if history.is_file() else "some"
            state = f"the run is unfinished ({done} epochs checkpointed)"
        elif folder.is_dir() and (below := _runs_below(folder)):
            shown = ", ".join(repr(str(r)) for r in below[:4]) + (", ..." if len(below) > 4
                                                                   else "")
            raise FileNotFoundError(
                f"load_run({str(run)!r}): this folder holds {len(below)} finished run"
                f"{'s' if len(below) > 1 else ''} (a compare or frontier folder), not one run; "
                f"load one of them, e.g. load_run({str(below[0])!r}) (runs: {shown})")
        raise FileNotFoundError(f"load_run({str(run)!r}): {state}; finish it with "
                                "dualdrop sparsify ... --resume (same options), or pass the "
                                "folder of a finished run")
    fix = "run dualdrop sparsify again into a new folder"
    final = read_json(final_path, fix)
    if MODEL in os.listdir(folder):
        arch = final.get("architecture") or {"n_features": _n_features(folder, fix)}
        net = build(arch)
        sd = _read_state(folder / MODEL, fix)
        try:
            net.load_state_dict(sd)
        except RuntimeError as exc:
            raise ValueError(f"{folder / MODEL} does not fit {arch}: {str(exc).splitlines()[0]}; "
                             f"{fix}") from None
    else:
        ck = read_checkpoint(folder / CHECKPOINT, fix=fix)
        arch = {"n_features": ck["config"]["n_features"]}
        net = test_time_network(ck)
    net.eval()
    if layout == "dense":
        return net
    dnn = _nn()
    if layout == "compact":
        compact_path = folder / MODEL_COMPACT
        if compact_path.is_file() and MODEL in os.listdir(folder):
            return dnn.load_compact(compact_path, build(arch))
        return dnn.compact(net, _example_inputs(arch, folder))
    csr_path = folder / MODEL_CSR
    if not csr_path.is_file():
        return dnn.export_sparse(net, layout="csr")
    sd = _read_state(csr_path, fix)
    for name, module in list(net.named_children()):
        if isinstance(module, nn.Linear):
            setattr(net, name, dnn.CSRLinear(sd[f"{name}.weight"], sd.get(f"{name}.bias")))
    return net.eval()


def _example_inputs(arch: dict, folder: Path) -> torch.Tensor:
    """The batch that traces a run's network for the compact layout: its ``n_features``, or
    the ``input_shape`` a ``dualdrop prune --model`` run recorded."""
    if arch.get("n_features"):
        return example_batch(arch["n_features"])
    if arch.get("input_shape"):
        return torch.randn(4, *arch["input_shape"], generator=torch.Generator().manual_seed(0))
    raise ValueError(f"load_run({str(folder)!r}, layout='compact'): the run records no input "
                     "shape to trace its network with; compact it in Python: "
                     "dualdrop.nn.compact(load_run(folder), example_inputs)")


def _read_state(path: Path, fix: str) -> dict:
    try:
        with warnings.catch_warnings():  # torch flags its (stable enough) CSR support as beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} cannot be read ({str(exc).strip().splitlines()[0][:120]}); "
                         f"{fix}") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"{path} is not a state_dict of tensors; {fix}")
    return sd


def _n_features(folder: Path, fix: str) -> int:
    return int(read_checkpoint(folder / CHECKPOINT, fix=fix)["config"]["n_features"])
