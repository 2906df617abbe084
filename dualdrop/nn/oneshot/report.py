"""What a one-shot prune did: one :class:`Report` for single weights and for whole units, and the
results ``prune_oneshot`` / ``prune_structured`` return (the model, the report, the masks)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dualdrop.nn.compact import compact
from dualdrop.nn.sparsifier import Sparsifier, sparsify

#: the magnitude-pruning hyperparameters that hold the masks while fine-tuning: no schedule
#: (target sparsity 0 keeps every weight still alive; pruned weights never regrow)
HOLD_HPARAMS = {"sparsity": 0.0}


@dataclass
class Report:
    """One row per pruned problem (``layers``), the layers left as they were (``skipped``:
    ``(name, why)``) and the totals; ``what`` says which rows: ``"weights"`` or ``"units"``.

    A weight row: ``layer``, ``kind`` (linear, conv, hf_conv1d, mha_in, mha_out), ``shape``
    (out, in), ``rows`` (of its calibration input ``X``: samples, tokens or image patches),
    ``kept`` and ``density`` (nonzeros of the pruned weight), ``objective`` (the layer
    objective ``||X (W - W0)^T||^2 / ||X W0^T||^2`` on the layer's calibration inputs, which
    come through the layers pruned before it), ``seconds``, ``gram_mb`` and ``peak_mb`` (the
    process's peak resident memory since the call began, or the GPU's peak allocation in the
    step).

    A unit row: ``layer`` (the consumer), ``kind`` of its units, ``units``, ``kept``,
    ``objective`` (the consumer's relative output error ``E||(W - W0) x + b - b0||^2 /
    E||W0 x + b0||^2`` on its calibration inputs), ``seconds``, ``info`` (the method's).

    Totals: ``seconds`` (the whole call), ``peak_mb`` and ``start_mb`` (the resident memory
    when the call began: the model, the data, the libraries; ``peak_mb - start_mb`` is what
    pruning added), ``density`` (the fraction kept of the prunable weights of the pruned
    layers, the set ``target_density`` counts); for units also the model's parameters before
    and after, the prunable ones (``prunable``), and the speed-up a latency table predicted
    and the one measured on the compact model (``measured_speedup``, when measured)."""

    method: str
    allocation: str
    target: str
    layers: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0
    peak_mb: float = 0.0
    start_mb: float = 0.0
    pipeline: dict = field(default_factory=dict)
    what: str = "weights"
    params_before: int = 0
    params_after: int = 0
    prunable: int = 0
    predicted_speedup: float | None = None
    measured_speedup: float | None = None

    @property
    def density(self) -> float:
        """The fraction kept of the prunable weights of the pruned layers."""
        if self.what == "units":
            removed = self.params_before - self.params_after
            return 1.0 - removed / self.prunable if self.prunable else 1.0
        total = sum(r["shape"][0] * r["shape"][1] for r in self.layers)
        return sum(r["kept"] for r in self.layers) / total if total else 1.0

    def objectives(self) -> dict[str, float]:
        return {r["layer"]: r["objective"] for r in self.layers}

    def to_dict(self) -> dict:
        out = {"what": self.what, "method": self.method, "allocation": self.allocation,
               "target": self.target, "density": self.density, "seconds": self.seconds,
               "peak_mb": self.peak_mb, "start_mb": self.start_mb,
               "layers": [dict(r) for r in self.layers],
               "skipped": [list(s) for s in self.skipped]}
        if self.what == "units":
            out.update(params_before=self.params_before, params_after=self.params_after,
                       prunable=self.prunable, predicted_speedup=self.predicted_speedup,
                       measured_speedup=self.measured_speedup)
        else:
            out["pipeline"] = dict(self.pipeline)
        return out

    def format(self) -> str:
        """The report as a plain-text table."""
        return self._format_units() if self.what == "units" else self._format_weights()

    def _format_weights(self) -> str:
        head = (f"one-shot {self.method}, {self.target}, allocation {self.allocation}: density "
                f"{self.density:.4f}, {self.seconds:.2f} s, peak {self.peak_mb:.0f} MB "
                f"({self.peak_mb - self.start_mb:+.0f} MB over the start)")
        if self.pipeline.get("mode") == "block":
            head += (f"; block by block over {self.pipeline['blocks']} "
                     f"({len(self.pipeline.get('block_info', []))} blocks)")
        w = max([len(r["layer"]) for r in self.layers] + [5])
        lines = [head, f"{'layer':<{w}}  {'shape':>11}  {'density':>8}  {'objective':>10}  "
                       f"{'seconds':>8}"]
        for r in self.layers:
            shape = "x".join(str(s) for s in r["shape"])
            lines.append(f"{r['layer']:<{w}}  {shape:>11}  {r['density']:>8.4f}  "
                         f"{r['objective']:>10.4g}  {r['seconds']:>8.3f}")
        for name, why in self.skipped:
            lines.append(f"{name:<{w}}  left dense: {why}")
        return "\n".join(lines)

    def _format_units(self) -> str:
        sp = (f", predicted speed-up {self.predicted_speedup:.2f}x"
              if self.predicted_speedup else "")
        if self.measured_speedup:
            sp += f", measured {self.measured_speedup:.2f}x"
        head = (f"structured one-shot {self.method}, {self.target}, allocation "
                f"{self.allocation}: parameters {self.params_before:,} -> "
                f"{self.params_after:,}{sp}, {self.seconds:.1f} s")
        # a row is named after the layer that reads its units (an FFN's neurons: its output
        # projection); a skipped name is a layer whose own output units stay
        w = max([len(r["layer"]) for r in self.layers] + [14])
        lines = [head, f"{'input units of':<{w}}  {'kind':>7}  {'kept':>11}  {'objective':>10}  "
                       f"{'seconds':>8}"]
        for r in self.layers:
            lines.append(f"{r['layer']:<{w}}  {r['kind']:>7}  {r['kept']:>5}/{r['units']:<5}  "
                         f"{r['objective']:>10.4g}  {r['seconds']:>8.2f}")
        for name, why in self.skipped:
            lines.append(f"{name:<{w}}  its output units not pruned: {why}")
        return "\n".join(lines)

    def __str__(self):
        return self.format()


#: the report of single weights and of units: one class (the former names, kept as names)
OneShotReport = StructuredReport = Report


@dataclass
class OneShotResult:
    """The pruned ``model`` (the same object, exact zeros in its weights), its ``report``, and
    ``masks``: ``{parameter name: bool tensor}`` of the kept weights, in the parameter's layout.

    Fine-tune with the masks held: ``sp = result.sparsify()`` puts magnitude pruning's 0/1
    masks on the pruned weights, with no schedule (``HOLD_HPARAMS``), so a pruned weight stays
    0 whatever the optimizer does; then your own loop (``sp.after_step(opt, step, total)`` after
    each step) or ``dualdrop.train.fit(model, "magnitude", loader, loss_fn, epochs=1,
    hparams=result.hparams)``."""

    model: nn.Module
    report: Report
    masks: dict

    @property
    def hparams(self) -> dict:
        """Magnitude pruning's hyperparameters that hold the masks (pass them to ``fit``)."""
        return dict(HOLD_HPARAMS)

    def sparsify(self, **kwargs) -> Sparsifier:
        """``dualdrop.nn.sparsify(model, "magnitude")`` on the pruned weights, its masks set to
        the one-shot masks and held (``kwargs`` go to ``sparsify``, e.g. ``example_inputs``)."""
        for k in ("include", "exclude", "target_density"):
            if k in kwargs:
                raise ValueError(f"{k}= is fixed by the one-shot masks; leave it out")
        sp = sparsify(self.model, "magnitude", include=list(self.masks), **HOLD_HPARAMS,
                      **kwargs)
        with torch.no_grad():
            for target, state in sp.states():
                mask = next(self.masks[a] for a in target.aliases if a in self.masks)
                state.weight_mask.copy_(mask.to(state.weight_mask))
        return sp


@dataclass
class StructuredResult:
    """What a prune of whole units returns: the pruned ``model`` (removed units zeroed), its
    ``report``, ``masks`` (the kept entries of every weight pruning wrote), ``units``
    (``{consumer name: kept unit indices}``), ``groups`` (the ``UnitGroup`` of each consumer:
    which producer rows and consumer columns each unit is) and the ``latency`` table of a
    ``target_speedup`` budget."""

    model: nn.Module
    report: Report
    masks: dict
    units: dict = field(default_factory=dict)
    groups: list = field(default_factory=list)
    example_inputs: object = None
    latency: object = None

    def compact(self, example_inputs=None, *, verify: bool = True) -> nn.Module:
        """The physically smaller model (``dualdrop.nn.compact``; Hugging Face models by their
        blocks): the removed units gone, the outputs those of the zeroed model. The first
        calibration batch traces it by default (as ``forward_fn`` fed it, when that was the
        default one). The unit groups the prune found are handed to it (``groups=``): the units
        are not found a second time."""
        inputs = self.example_inputs if example_inputs is None else example_inputs
        if inputs is None:
            raise ValueError("pass example_inputs=...: the inputs of one forward run of the "
                             "model (prune_structured was given a forward_fn, so the first "
                             "calibration batch may not be the model's own inputs)")
        return compact(self.model, inputs, groups=self.groups, verify=verify)
