"""Whole units as the plug-in of the one-shot run (``run``): the consumer steps, their problems
and their budget; ``prune_structured`` (docs/oneshot.md, "Smaller and faster: structured
one-shot") is the entry point.

The units (``units``) are found from the model's graph; each group of units is read by one
*consumer* layer, and the block pipeline (``pipeline``) visits the consumers in forward
order, each on the inputs that come through the units pruned before it. For a consumer the
inputs get a column of ones appended, so that its Gram also holds the inputs' mean (and the
weights the consumer's bias); the method (``methods.structured``) chooses the units to keep
from the Gram, the kept columns are refit, the removed units' mean contribution goes into the
bias (``bias_compensation``), and the removed units' producer rows, bias and BatchNorm entries
are zeroed with their consumer columns. ``res.compact()`` then gives the physically smaller
model (``dualdrop.nn.compact``), which computes what the zeroed one does.

Everything is checked before the model is touched (``job``, ``run``); a failure during the
pipeline puts every weight back.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from dualdrop.nn._layers import is_conv1d
from dualdrop.nn.oneshot.allocation.latency import build_table, measured_speedup, meet_measured
from dualdrop.nn.oneshot.layers import Step
from dualdrop.nn.oneshot.methods.structured import UnitProblem
from dualdrop.nn.oneshot.allocation.units import CostModel, allocate_units, lopsided
from dualdrop.nn.oneshot.allocation.weights import kept_total
from dualdrop.nn.oneshot.units import ParamCount, UnitGroup
from dualdrop.nn.oneshot.calibration import calibration_mode, default_forward, token_mask


class UnitStep(Step):
    """A consumer's walk step with a column of ones appended to its inputs and its bias
    appended to its weight: the Gram then holds ``[[E xx^T, E x], [E x^T, 1]]`` and the
    layer objective accounts for the bias.

    With a dense target (``dense``: the consumer's inputs in the dense model, one tensor of
    rows per calibration batch, in order) the inputs are ``[x, 1, x_d]`` and the weight
    ``[0, b0, W0]``, so that the weight times the inputs is the dense model's output on the
    same tokens: the Gram holds every moment the problem needs (``methods.structured.base``),
    and the pipeline's layer objective is the error against the dense output."""

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
        w = m.weight.T if is_conv1d(m) else m.weight.reshape(m.weight.shape[0], -1)
    return w.detach().to("cpu", torch.float64).numpy()


def model_inputs(batch):
    """What ``default_forward`` passes to the model for ``batch``."""
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    return batch


def unit_budget_counts(job, model, groups, steps, first, fwd, counter: ParamCount,
                       n_params: int, grams) -> tuple:
    """``(counts, description, latency table, measured speed-up)``: the units each consumer
    keeps under the job's budget (``allocation.units``), the budget in words, the latency table
    of a ``target_speedup`` budget and the compact model's measured speed-up (the counts
    corrected toward it: ``allocation.latency.meet_measured``; None unless measured). ``grams()``
    gives the dense model's Grams (asked for only by the allocations that measure the layers:
    ``flap``, ``penalty``).

    The budget is a ceiling on a cost of the kept units: the parameters of the whole model
    (``target_density`` d: what is left when the prunable parameters ``P`` of the unit groups
    keep ``kept_total(d, P) = round(d P)``, the rule of single weights, here a ceiling since
    units come whole; ``target_params``) or the predicted latency (``target_speedup``)."""
    kind, bval = job.budget
    names = [g.name for g in groups]
    sizes = [g.n_units for g in groups]
    prunable = counter.prunable()
    table = None
    if kind == "speedup":
        lat_in = model_inputs(first) if job.latency_inputs is None else job.latency_inputs
        lat_fwd = (lambda m, x: fwd(m, x)) if job.latency_inputs is None \
            and job.forward_fn is not None else (lambda m, x: default_forward(m, x))
        lat_opts = {k: v for k, v in job.latency_options.items() if k != "measure"}
        table = build_table(model, groups, lat_in, lat_fwd, progress=job.progress, **lat_opts)
        cost = CostModel(names, sizes, table.predicted, what="seconds")
        budget = table.dense / bval
        prices = {g.name: np.full(g.n_units, (table.part(g.name, g.n_units)
                                              - table.part(g.name, 0)) / g.n_units)
                  for g in groups}
        desc = f"speed-up {bval:g}x"
    else:
        cost = CostModel(names, sizes, lambda c: n_params - counter.removed(c))
        if kind == "density":
            budget = n_params - prunable + kept_total(bval, prunable)
            desc = f"density {bval:g} of {prunable:,} prunable parameters"
        else:
            if bval < cost.least():
                raise ValueError(f"target_params={bval:,} is below what keeping one unit per "
                                 f"layer leaves ({int(cost.least()):,}: no unit holds the "
                                 "rest)")
            budget = bval
            desc = f"{bval:,} parameters"
        prices = {g.name: g.unit_params() for g in groups}
    problems = None
    if job.allocation in ("flap", "penalty"):
        G = grams()
        problems = {s.group.name: unit_problem(s.group, s.weights()[0], G[s.group.name],
                                               job.bias_compensation) for s in steps}
        del G
    measure = table is not None and job.latency_options["measure"]
    try:
        counts = allocate_units(job.allocation, cost, budget, problems, prices,
                                **job.allocation_options)
    except ValueError:
        if not measure:
            raise
        counts = None  # beyond reach as predicted: the measured correction asks for less
    measured = None
    if measure:
        fit = meet_measured(
            bval, lambda s: counts if s == bval and counts is not None else allocate_units(
                job.allocation, cost, table.dense / s, problems, prices,
                **job.allocation_options),
            table.speedup, lambda c: measured_speedup(
                model, groups, c, lat_in, lat_fwd, threads=lat_opts["threads"],
                clock=lat_opts["clock"], rounds=lat_opts["rounds"]))
        counts, measured = fit.counts, fit.measured
        if not fit.met:
            warnings.warn(f"target_speedup={bval:g}: the closest measured speed-up is "
                          f"{fit.measured:.2f}x (predicted {fit.predicted:.2f}x; tries asked / "
                          "predicted / measured: " + ", ".join(
                              f"{a:.2f}/{p:.2f}/{m:.2f}" for a, p, m in fit.tries) + ")",
                          UserWarning, stacklevel=4)
    note = lopsided(counts, dict(zip(names, sizes)), {g.name: g.kind for g in groups})
    if note:
        warnings.warn(note, UserWarning, stacklevel=4)
    return counts, desc, table, measured


def unit_masks(groups) -> dict:
    """``{name: weight != 0}`` of every weight (2-D or more) the pruning wrote."""
    return {name: p.detach() != 0 for g in groups for name, p in g.parameters() if p.dim() >= 2}


def warn_skipped_units(skipped) -> None:
    notable = [(n, w) for n, w in skipped
               if "residual stream" not in w and "model's output" not in w]
    if notable:
        warnings.warn("structured pruning leaves these layers' units as they are: "
                      + "; ".join(f"{n} ({w})" for n, w in notable), UserWarning, stacklevel=5)
