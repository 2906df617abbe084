"""``prune_structured``: remove whole neurons, attention heads and channels of a trained model,
once, from calibration data (docs/oneshot.md, "Smaller and faster: structured one-shot").

The units (``units``) are found from the model's graph; each group of units is read by one
*consumer* layer, and the walk (``walker`` / the block pipeline) visits the consumers in forward
order, each on the inputs that come through the units pruned before it. For a consumer the
inputs get a column of ones appended, so that its Gram also holds the inputs' mean (and the
weights the consumer's bias); the method (``methods.structured``) chooses the units to keep
from the Gram, the kept columns are refit, the removed units' mean contribution goes into the
bias (``bias_compensation``), and the removed units' producer rows, bias and BatchNorm entries
are zeroed with their consumer columns. ``res.compact()`` then gives the physically smaller
model (``dualdrop.nn.compact``), which computes what the zeroed one does.

Everything is checked before the model is touched; a failure during the walk puts every weight
back.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from dualdrop.nn.oneshot.api import _check_calib, _check_pipeline_options
from dualdrop.nn.oneshot.latency_table import (LatencyTable, build_table, measured_speedup,
                                               meet_measured)
from dualdrop.nn.oneshot.layers import Step
from dualdrop.nn.oneshot.methods.base import layer_objective
from dualdrop.nn.oneshot.methods.structured import UnitProblem, get_unit_method
from dualdrop.nn.oneshot.unit_allocation import (DEFAULT_ALLOCATION, CostModel, allocate_units,
                                                check_allocation, lopsided)
from dualdrop.nn.oneshot.units import ParamCount, UnitGroup, check_granularity, find_units
from dualdrop.nn.oneshot.walker import (collect, default_forward, peak_rss_mb, reset_peak_memory,
                                        trace, walk)
from penalties.checks import check_float, check_int


class UnitStep(Step):
    """A consumer's walk step with a column of ones appended to its inputs and its bias
    appended to its weight: the Gram then holds ``[[E xx^T, E x], [E x^T, 1]]`` and the
    layer objective accounts for the bias.

    With a dense target (``dense``: the consumer's inputs in the dense model, one tensor of
    rows per calibration batch, in order) the inputs are ``[x, 1, x_d]`` and the weight
    ``[0, b0, W0]``, so that the weight times the inputs is the dense model's output on the
    same tokens: the Gram holds every moment the problem needs (``methods.structured.base``),
    and the walker's layer objective is the error against the dense output."""

    def __init__(self, group: UnitGroup):
        base = group.step
        super().__init__(base.module_name, base.module, base.kind, [group.name])
        self.group = group
        self.dense: list | None = None
        self.calls = 0

    def _bias(self):
        m = self.module.out_proj if self.kind == "mha_out" else self.module
        return m.bias

    def weights(self) -> list[torch.Tensor]:
        (W,) = super().weights()
        b = self._bias()
        b = torch.zeros(W.shape[0], dtype=W.dtype, device=W.device) if b is None else \
            b.detach().to(W.dtype)
        if self.dense is not None:
            return [torch.cat([torch.zeros_like(W), b[:, None], W], 1)]
        return [torch.cat([W, b[:, None]], 1)]

    @torch.no_grad()
    def set_weights(self, Ws) -> None:
        (W,) = Ws
        p = self.group.step.weights()[0].shape[1]
        super().set_weights([W[:, :p]])
        b = self._bias()
        if b is not None:
            b.copy_(W[:, p])

    def base_rows(self, args, kwargs, token_mask=None) -> torch.Tensor:
        return super().input_rows(args, kwargs, token_mask)[0]

    def input_rows(self, args, kwargs, token_mask=None) -> list[torch.Tensor]:
        x = self.base_rows(args, kwargs, token_mask)
        cols = [x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)]
        if self.dense:
            xd = self.dense[self.calls % len(self.dense)]
            self.calls += 1
            if xd.shape[0] != x.shape[0]:
                raise RuntimeError(f"{self.group.name}: the dense model's inputs of this batch "
                                   f"have {xd.shape[0]} rows, the pruned model's {x.shape[0]} "
                                   "(target='dense' needs calib to give the same batches in "
                                   "the same order every pass)")
            cols.append(xd.to(x.device, x.dtype))
        return [torch.cat(cols, 1)]

    def input_key(self, args, kwargs):
        return None   # its own stage: the appended column is not another step's input

    def parameters(self):
        return self.group.parameters()


def capture_dense_inputs(model, steps, calib, forward_fn, token_mask_fn=None) -> None:
    """Give every step its inputs in the model as it is (dense), one float32 CPU tensor of
    rows per calibration batch (only real tokens), in ``calib``'s order: ``step.dense``."""
    from dualdrop.nn.oneshot.walker import calibration_mode, token_mask

    store = {id(s): [] for s in steps}
    current = [None]

    def make(step):
        def hook(module, args, kwargs):
            store[id(step)].append(step.base_rows(args, kwargs, current[0]).detach()
                                   .to("cpu", torch.float32))
        return hook

    handles = [s.module.register_forward_pre_hook(make(s), with_kwargs=True) for s in steps]
    try:
        with calibration_mode(model):
            for batch in calib:
                current[0] = token_mask(batch, token_mask_fn)
                forward_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
    for s in steps:
        s.dense, s.calls = store[id(s)], 0


def unit_problem(group: UnitGroup, W_aug: torch.Tensor, G_aug: torch.Tensor,
                 bias_compensation: bool, cost=None) -> UnitProblem:
    """The consumer problem of ``group`` from its augmented weight and Gram (:class:`UnitStep`:
    ``[W0, b0]`` on ``[x, 1]``, or ``[0, b0, W0]`` on ``[x, 1, x_d]`` with a dense target)."""
    W_aug = W_aug.detach().to("cpu", torch.float64).numpy()
    G_aug = G_aug.detach().to("cpu", torch.float64).numpy()
    p = group.step.weights()[0].shape[1]
    dense = W_aug.shape[1] == 2 * p + 1
    has_bias = UnitStep(group)._bias() is not None
    part_sq = np.zeros(group.n_units)
    for part in group.parts:
        if part.role == "bn":
            continue
        W = _rows_of(part)
        for u, idx in enumerate(part.index):
            part_sq[u] += float((W[idx] ** 2).sum())
    G = 0.5 * (G_aug[:p, :p] + G_aug[:p, :p].T)
    extra = {}
    W0 = W_aug[:, :p]
    if dense:
        W0 = W_aug[:, p + 1:]
        D = G_aug[p + 1:, p + 1:]
        extra = {"cross": G_aug[p + 1:, :p].copy(), "dense_gram": 0.5 * (D + D.T),
                 "mu_dense": G_aug[p, p + 1:].copy()}
    return UnitProblem(group.name, W0.copy(), G, G_aug[:p, p].copy(), group.columns,
                       b0=W_aug[:, p].copy() if has_bias else None,
                       centered=bias_compensation and has_bias, part_sq=part_sq, cost=cost,
                       **extra)


def _rows_of(part) -> np.ndarray:
    """A producer's weight as rows of output units (float64 numpy)."""
    m = part.module
    if part.role == "mha_in":
        if m._qkv_same_embed_dim:
            w = m.in_proj_weight
        else:
            w = torch.cat([m.q_proj_weight, m.k_proj_weight, m.v_proj_weight])
    else:
        w = m.weight.T if _is_conv1d(m) else m.weight.reshape(m.weight.shape[0], -1)
    return w.detach().to("cpu", torch.float64).numpy()


def _is_conv1d(m) -> bool:
    from dualdrop.nn._layers import is_conv1d

    return is_conv1d(m)


@dataclass
class StructuredReport:
    """What ``prune_structured`` did: one row per consumer (``layer``, ``kind`` of its units,
    ``units``, ``kept``, ``objective``: the consumer's relative output error ``E||(W - W0) x +
    b - b0||^2 / E||W0 x + b0||^2`` on its calibration inputs, ``seconds``), the layers left
    as they were (``skipped``), the parameters before and after, the predicted speed-up (when a
    latency table was built) and the totals."""

    method: str
    allocation: str
    target: str
    layers: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    params_before: int = 0
    params_after: int = 0
    predicted_speedup: float | None = None
    measured_speedup: float | None = None
    seconds: float = 0.0
    peak_mb: float = 0.0

    def objectives(self) -> dict[str, float]:
        return {r["layer"]: r["objective"] for r in self.layers}

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (
            "method", "allocation", "target", "layers", "skipped", "params_before",
            "params_after", "predicted_speedup", "measured_speedup", "seconds", "peak_mb")}

    def format(self) -> str:
        sp = (f", predicted speed-up {self.predicted_speedup:.2f}x"
              if self.predicted_speedup else "")
        if self.measured_speedup:
            sp += f", measured {self.measured_speedup:.2f}x"

        head = (f"structured one-shot {self.method}, {self.target}, allocation "
                f"{self.allocation}: parameters {self.params_before:,} -> "
                f"{self.params_after:,}{sp}, {self.seconds:.1f} s")
        w = max([len(r["layer"]) for r in self.layers] + [5])
        lines = [head, f"{'layer':<{w}}  {'kind':>7}  {'kept':>11}  {'objective':>10}  "
                       f"{'seconds':>8}"]
        for r in self.layers:
            lines.append(f"{r['layer']:<{w}}  {r['kind']:>7}  {r['kept']:>5}/{r['units']:<5}  "
                         f"{r['objective']:>10.4g}  {r['seconds']:>8.2f}")
        for name, why in self.skipped:
            lines.append(f"{name:<{w}}  not pruned: {why}")
        return "\n".join(lines)

    def __str__(self):
        return self.format()


@dataclass
class StructuredResult:
    """The pruned ``model`` (the same object; removed units zeroed), its ``report``, ``masks``
    (``{parameter name: bool tensor}`` of the kept entries of every weight pruning wrote),
    ``units`` (``{consumer name: kept unit indices}``), ``groups`` (the ``UnitGroup`` of each
    consumer: which producer rows and consumer columns each unit is) and the ``latency`` table
    of a ``target_speedup`` budget."""

    model: nn.Module
    report: StructuredReport
    masks: dict
    units: dict
    groups: list
    example_inputs: object = None
    latency: LatencyTable | None = None

    def compact(self, example_inputs=None, *, verify: bool = True) -> nn.Module:
        """The physically smaller model (``dualdrop.nn.compact``; Hugging Face models by their
        blocks): the removed units gone, the outputs those of the zeroed model. The first
        calibration batch traces it by default (as ``forward_fn`` fed it, when that was the
        default one)."""
        from dualdrop.nn.compact import compact

        inputs = self.example_inputs if example_inputs is None else example_inputs
        if inputs is None:
            raise ValueError("pass example_inputs=...: the inputs of one forward run of the "
                             "model (prune_structured was given a forward_fn, so the first "
                             "calibration batch may not be the model's own inputs)")
        return compact(self.model, inputs, verify=verify)


def _model_inputs(batch):
    """What ``default_forward`` passes to the model for ``batch``."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return batch


def _latency_options(opts) -> dict:
    known = {"threads": 1, "clock": "wall", "rounds": 5, "cache": True, "measure": True}
    if opts is None:
        return known
    if not isinstance(opts, dict):
        raise TypeError("latency_options must be a dict, e.g. {'threads': 1, 'clock': 'cpu'}")
    unknown = sorted(set(opts) - set(known))
    if unknown:
        raise ValueError(f"unknown latency option(s) {unknown}; known: {sorted(known)}")
    out = {**known, **opts}
    if out["clock"] not in ("wall", "cpu"):
        raise ValueError(f"latency_options clock={out['clock']!r}; expected 'wall' or 'cpu'")
    if out["threads"] is not None:
        out["threads"] = check_int("latency_options threads", out["threads"], low=1)
    out["rounds"] = check_int("latency_options rounds", out["rounds"], low=1)
    for k in ("cache", "measure"):
        if not isinstance(out[k], bool):
            raise TypeError(f"latency_options {k} must be True or False")
    return out


def _budget(target_density, target_params, target_speedup):
    given = [(k, v) for k, v in (("target_density", target_density),
                                 ("target_params", target_params),
                                 ("target_speedup", target_speedup)) if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one budget: target_density=D (fraction of the prunable "
                         "parameters kept, e.g. 0.5), target_params=N (parameters of the whole "
                         "pruned model) or target_speedup=S (measured, e.g. 1.5)")
    k, v = given[0]
    if k == "target_density":
        return k, check_float(k, v, low=0.0, high=1.0, low_open=True)
    if k == "target_params":
        return k, check_int(k, v, low=1)
    return k, check_float(k, v, low=1.0)


def prune_structured(model: nn.Module, calib, method, *, granularity,
                     target_density: float | None = None, target_params: int | None = None,
                     target_speedup: float | None = None, allocation: str | None = None,
                     options: dict | None = None, allocation_options: dict | None = None,
                     bias_compensation: bool = True, target: str = "pruned",
                     forward_fn=None, include=None,
                     exclude=None, latency_inputs=None, latency_options: dict | None = None,
                     progress: bool = True, sequential: str = "auto", blocks=None,
                     token_mask_fn=None, gram_precision: str = "auto") -> StructuredResult:
    """Remove whole units of the trained ``model`` in place (module docstring).

    - ``method``: a name of ``methods.structured.available()`` (``magnitude``, ``wanda-sp``,
      ``flap``, ``ziplm``, ``osscar``, ``logsum``, ``mcp``, ``penalty:<catalog name>``) or a
      ``UnitMethod``; ``options`` its options (every method takes ``refit``, ``polish``: exact
      swaps of kept and removed units after the method, ``max_swaps``, ``refit_damp``).
    - ``granularity``: ``"neuron"``, ``"head"``, ``"channel"`` or several (``("head",
      "neuron")``, ``"head+neuron"``).
    - The budget, one of: ``target_density`` (fraction of the prunable parameters kept: the
      units' producer rows and consumer columns), ``target_params`` (parameters of the whole
      pruned model), ``target_speedup`` (the model's time over the pruned model's on
      ``latency_inputs``, default the first calibration batch: predicted by a latency table,
      then measured on the compact model and the allocation corrected until within 5% of the
      target, or the closest try kept with a warning; ``latency_options``: ``threads`` (1),
      ``clock`` (``"wall"``, or ``"cpu"`` on a busy machine), ``rounds`` (5), ``cache``
      (True), ``measure`` (True; False keeps the prediction); ``latency_table``).
    - ``allocation``: ``"penalty"`` (None: the default, the best measured), ``"uniform"`` or
      ``"flap"`` (``unit_allocation``); ``allocation_options`` its options.
    - ``bias_compensation``: fold the removed units' mean contribution into the consumer's
      bias, the kept weights fit on centred inputs (every method; a consumer without a bias
      is pruned without).
    - ``target``: what each consumer reproduces from the inputs that come through the layers
      pruned before it: its own output on them (``"pruned"``, as SparseGPT's and OSSCAR's
      sequential pruning) or the dense model's output on the same tokens (``"dense"``:
      asymmetric calibration, which also corrects the error the earlier layers left; it holds
      every consumer's dense inputs over the calibration data in memory, ``tokens x inputs x
      4`` bytes, released layer by layer).
    - ``calib``, ``forward_fn``, ``token_mask_fn``, ``sequential``, ``blocks``,
      ``gram_precision``: as for ``prune_oneshot``; ``include`` / ``exclude``: fnmatch
      patterns on the names of a unit group's layers.

    Returns a :class:`StructuredResult`.
    """
    t_start = time.perf_counter()
    reset_peak_memory()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict of the method's options, got "
                        f"{type(options).__name__}")
    meth = get_unit_method(method, **dict(options or {}))
    kinds = check_granularity(granularity)
    bkind, bval = _budget(target_density, target_params, target_speedup)
    allocation = DEFAULT_ALLOCATION if allocation is None else allocation
    alloc_opts = check_allocation(allocation, allocation_options)
    lat_opts = _latency_options(latency_options)
    measure = lat_opts.pop("measure")
    if not isinstance(bias_compensation, bool):
        raise TypeError(f"bias_compensation must be True or False, got {bias_compensation!r}")
    if target not in ("pruned", "dense"):
        raise ValueError(f"target={target!r}; expected 'pruned' (each layer reproduces its own "
                         "output) or 'dense' (the dense model's)")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError("forward_fn must be callable as forward_fn(model, batch)")
    for name, items in (("include", include), ("exclude", exclude)):
        if items is not None and (isinstance(items, str) or not all(
                isinstance(i, str) for i in items)):
            raise TypeError(f"{name} must be a list of name patterns (fnmatch), e.g. "
                            "['encoder.layer.*']")
    _check_pipeline_options(sequential, blocks, token_mask_fn, None, None, gram_precision, None)
    fwd = forward_fn or default_forward
    calib = _check_calib(calib)
    first = next(iter(calib), None)
    if first is None:
        raise ValueError("calib gave no batch")
    groups, skipped = find_units(model, first, fwd, kinds, include, exclude)
    if not groups:
        raise ValueError(f"no {' / '.join(kinds)} units to prune in this model"
                         + (": " + "; ".join(f"{n} ({w})" for n, w in skipped[:4])
                            if skipped else "") + " (check granularity and include/exclude)")
    steps = [UnitStep(g) for g in groups]
    steps, unreached, _ = trace(model, steps, calib, fwd)
    skipped += [(s.names[0], "not called by the forward of a calibration batch")
                for s in unreached]
    groups = [s.group for s in steps]
    if not groups:
        raise ValueError("no unit group's consumer is called by the forward of a calibration "
                         "batch; check calib and forward_fn")
    _warn_skipped(skipped, kinds)

    # the budget as a ceiling on a cost of the kept units
    names = [g.name for g in groups]
    sizes = [g.n_units for g in groups]
    unit_params = {g.name: g.unit_params() for g in groups}
    n_params = sum(p.numel() for p in model.parameters())
    counter = ParamCount(groups)
    prunable = counter.prunable()
    table = None
    if bkind == "target_speedup":
        lat_in = _model_inputs(first) if latency_inputs is None else latency_inputs
        lat_fwd = (lambda m, x: fwd(m, x)) if latency_inputs is None and forward_fn is not None \
            else (lambda m, x: default_forward(m, x))
        table = build_table(model, groups, lat_in, lat_fwd, progress=progress,
                            **lat_opts)
        cost = CostModel(names, sizes, table.predicted, what="seconds")
        budget = table.dense / bval
        prices = {g.name: np.full(g.n_units, (table.part(g.name, g.n_units)
                                              - table.part(g.name, 0)) / g.n_units)
                  for g in groups}
        budget_desc = f"speed-up {bval:g}x"
    else:
        cost = CostModel(names, sizes, lambda c: n_params - counter.removed(c))
        if bkind == "target_density":
            budget = n_params - (1.0 - bval) * prunable
            budget_desc = f"density {bval:g} of {prunable:,} prunable parameters"
        else:
            if bval < cost.least():
                raise ValueError(f"target_params={bval:,} is below what keeping one unit per "
                                 f"layer leaves ({int(cost.least()):,}: no unit holds the "
                                 "rest)")
            budget = bval
            budget_desc = f"{bval:,} parameters"
        prices = unit_params
    problems = None
    if allocation in ("flap", "penalty"):
        grams = collect(model, steps, calib, fwd, token_mask_fn, gram_precision)
        problems = {s.group.name: unit_problem(s.group, s.weights()[0], grams[s.group.name],
                                               bias_compensation) for s in steps}
        del grams
    counts = allocate_units(allocation, cost, budget, problems, prices, **alloc_opts)
    measured = None
    if table is not None and measure:
        fit = meet_measured(
            bval, lambda s: counts if s == bval else allocate_units(
                allocation, cost, table.dense / s, problems, prices, **alloc_opts),
            table.speedup, lambda c: measured_speedup(
                model, groups, c, lat_in, lat_fwd, threads=lat_opts["threads"],
                clock=lat_opts["clock"], rounds=lat_opts["rounds"]))
        counts, measured = fit.counts, fit.measured
        if not fit.met:
            warnings.warn(f"target_speedup={bval:g}: the closest measured speed-up is "
                          f"{fit.measured:.2f}x (predicted {fit.predicted:.2f}x; tries asked / "
                          "predicted / measured: " + ", ".join(
                              f"{a:.2f}/{p:.2f}/{m:.2f}" for a, p, m in fit.tries) + ")",
                          UserWarning, stacklevel=2)
    del problems
    note = lopsided(counts, dict(zip(names, sizes)), {g.name: g.kind for g in groups})
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    if target == "dense":
        capture_dense_inputs(model, steps, calib, fwd, token_mask_fn)

    originals = [(p, p.detach().clone()) for g in groups for _, p in g.parameters()]
    info_rows: dict[str, dict] = {}

    def prune_step(step: UnitStep, W0s, Gs):
        t0 = time.perf_counter()
        g = step.group
        problem = unit_problem(g, W0s[0], Gs[0], bias_compensation)
        sol = meth.solve(problem, counts[g.name])
        removed = np.setdiff1d(np.arange(g.n_units), sol.kept)
        g.zero_parts(removed)
        W = torch.from_numpy(sol.W)
        p = W.shape[1]
        b = W0s[0][:, p].cpu() if sol.b is None else torch.from_numpy(sol.b)
        parts = [W, b[:, None]] + ([torch.zeros_like(W)] if step.dense is not None else [])
        W_aug = torch.cat(parts, 1).to(W0s[0].device)
        step.dense = None if step.dense is None else []   # its rows are no longer needed
        info_rows[g.name] = {"kept_units": sol.kept, "info": sol.info,
                             "objective": layer_objective(W_aug, W0s[0], Gs[0])}
        return [W_aug], [time.perf_counter() - t0]

    try:
        rows = walk(model, steps, calib, fwd, None, prune_step, progress,
                    desc=f"structured {meth.name}", sequential=sequential, blocks=blocks,
                    token_mask_fn=token_mask_fn, gram_precision=gram_precision)
    except BaseException:
        with torch.no_grad():
            for p, orig in originals:
                p.copy_(orig)
        raise
    del originals
    secs = {r["layer"]: r["seconds"] for r in rows}
    layers, units = [], {}
    for g in groups:
        ir = info_rows[g.name]
        units[g.name] = [int(u) for u in ir["kept_units"]]
        layers.append({"layer": g.name, "kind": g.kind, "units": g.n_units,
                       "kept": len(units[g.name]), "objective": ir["objective"],
                       "seconds": secs.get(g.name, 0.0), "info": ir["info"]})
    removed_params = counter.removed({n: len(units[n]) for n in names})
    report = StructuredReport(
        method=repr(meth), allocation=allocation, target=budget_desc, layers=layers,
        skipped=skipped, params_before=n_params, params_after=int(n_params - removed_params),
        predicted_speedup=table.speedup({n: len(units[n]) for n in names}) if table else None,
        measured_speedup=measured,
        seconds=time.perf_counter() - t_start, peak_mb=peak_rss_mb())
    masks = _masks(groups)
    return StructuredResult(model, report, masks, units, groups,
                            _model_inputs(first) if forward_fn is None else None, table)


def _masks(groups) -> dict:
    """``{name: weight != 0}`` of every weight (2-D or more) the pruning wrote."""
    return {name: p.detach() != 0 for g in groups for name, p in g.parameters() if p.dim() >= 2}


def _warn_skipped(skipped, kinds) -> None:
    notable = [(n, w) for n, w in skipped
               if "residual stream" not in w and "model's output" not in w]
    if notable:
        warnings.warn("structured pruning leaves these layers' units as they are: "
                      + "; ".join(f"{n} ({w})" for n, w in notable), UserWarning, stacklevel=3)
