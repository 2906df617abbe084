"""Iterative prune-heal: reach a high target in ``rounds`` steps, healing after each.

One-shot pruning to a small density makes each layer's problem far from its dense solution at
once, and the errors of the layers compound before anything re-fits them. Pruning a part, healing
by distillation (``dualdrop.train.heal``), then pruning again starts each round from a network
that has re-fit its remaining weights to the dense one's function (the gradual schedules of Zhu &
Gupta, 2017, and the iterative pruning of Minitron, with distillation as the training). Round
``r`` of ``k`` keeps ``D^(r/k)`` of the weights (a geometric schedule: every round removes the
same fraction of what is left), or for structured pruning by parameters ``P0 (P/P0)^(r/k)``
parameters (a structured schedule takes ``target_params``); the last round is the target
itself, so the budget is met exactly at the end.

When it pays: at targets where one-shot pruning loses much (the LeNet-300-100 table of
benchmarks/RESULTS.md: 5% of the weights, or a 2x structured speed-up of MiniLM), at ``k``
times the pruning cost and the healing steps of every round; at mild targets one round with its
healing does as well.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch.nn as nn

from dualdrop.nn.oneshot.entry import prune_oneshot
from dualdrop.train.heal import heal
from penalties.checks import check_float, check_int


@dataclass
class PruneHealResult:
    """The pruned and healed ``model`` (a structured run's compact model), the last round's
    one-shot ``result`` and one record per round (its budget, the one-shot report's target,
    the healing's last logged loss)."""

    model: nn.Module
    result: object
    rounds: list = field(default_factory=list)


def prune_heal(model: nn.Module, calib, method=None, *, rounds: int, heal_steps: int,
               target_density: float | None = None, target_params: int | None = None,
               granularity=None, teacher: nn.Module | None = None, heal_data=None,
               prune_kwargs: dict | None = None, heal_kwargs: dict | None = None,
               progress: bool = True) -> PruneHealResult:
    """Prune ``model`` to ``target_density`` (single weights, or structured by
    ``granularity``) or ``target_params`` (structured) in ``rounds`` rounds, healing
    ``heal_steps`` steps after each (module docstring).

    ``teacher``: the dense model (default: a copy of ``model`` taken before the first round);
    ``heal_data``: the healing data (default ``calib``); ``prune_kwargs`` go to
    ``prune_oneshot``, ``heal_kwargs`` to ``heal``. Single weights are pruned in place (their
    masks held while healing); a structured round continues from the compact model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rounds = check_int("rounds", rounds, low=1)
    heal_steps = check_int("heal_steps", heal_steps, low=1)
    if (target_density is None) == (target_params is None):
        raise ValueError("give exactly one budget: target_density=D or target_params=N "
                         "(structured)")
    if target_params is not None and granularity in (None, "weight"):
        raise ValueError("target_params is a structured budget: give granularity='neuron', "
                         "'head' or 'channel' too")
    if target_density is not None and granularity not in (None, "weight") and rounds > 1:
        raise ValueError("a structured schedule takes target_params=N (parameters of the whole "
                         "model): a density is of the prunable parameters of the model it "
                         "prunes, which shrinks from round to round")
    if granularity == "block":
        raise ValueError("granularity='block' removes blocks at once by their importance; "
                         "prune the depth once (prune_oneshot) and heal")
    for name, d in (("prune_kwargs", prune_kwargs), ("heal_kwargs", heal_kwargs)):
        if d is not None and not isinstance(d, dict):
            raise TypeError(f"{name} must be a dict or None, got {type(d).__name__}")
    pk, hk = dict(prune_kwargs or {}), dict(heal_kwargs or {})
    for k in ("target_density", "target_params", "target_speedup", "pattern", "granularity"):
        if k in pk:
            raise ValueError(f"prune_kwargs[{k!r}]: the budget and granularity are "
                             "prune_heal's own arguments")
    if target_density is not None:
        target_density = check_float("target_density", target_density, low=0.0, high=1.0,
                                     low_open=True)
    else:
        target_params = check_int("target_params", target_params, low=1)
    teacher = copy.deepcopy(model).eval() if teacher is None else teacher
    data = calib if heal_data is None else heal_data
    start = sum(p.numel() for p in model.parameters())
    current, records, res = model, [], None
    for r in range(1, rounds + 1):
        last = r == rounds
        if target_density is not None:
            budget = {"target_density": target_density if last
                      else target_density ** (r / rounds)}
        else:
            budget = {"target_params": target_params if last
                      else int(round(start * (target_params / start) ** (r / rounds)))}
        res = prune_oneshot(current, calib, method, granularity=granularity, progress=progress,
                            **budget, **pk)
        out = heal(res, teacher, data, steps=heal_steps, progress=progress, **hk)
        current = out.model
        loss = out.history[-1]["loss"] if out.history else None
        records.append({"round": r, **budget, "target": res.report.target,
                        "heal_loss": loss})
    return PruneHealResult(current, res, records)
