"""Target density for every method: a schedule pruned by the method's own ranking, and a strength
multiplier driven by the measured density.

A method's strength ``lam`` maps to a density only through trial runs, and the map moves with the
model, the data size and the budget; in a short budget it barely moves at all (Adam moves
log-alpha, a gate logit or ``p`` by about its learning rate per step). And a strength raised until
the density responds overshoots: under Adam every weight whose regularizer gradient dominates
its data gradient shrinks at the same speed, so a layer collapses in a few steps once ``lam`` is
large enough, and the density is measured only after the fact. Asking for a density ``D``
therefore does two things, both driven by ``Sparsifier.after_step(optimizer, step, T)``:

1. **A pruning schedule ranked by the method.** The allowed density follows the cubic ramp of
   gradual pruning (Zhu & Gupta 2017) from 1 at ``t0 = BEGIN * T`` to ``D`` at ``t1 = END * T``,

       d*(t) = 1 - (1 - D) (1 - (1 - (t - t0)/(t1 - t0))^3),

   and every ``every = max(1, T // 100)`` steps the units the method ranks lowest are pruned so
   that at most ``d*(t)`` of the weights remain. The ranking is the method's own test-time
   quantity (``WeightState.keep_score``): log-alpha for variational dropout, the gate logit for
   hard-concrete (whole groups for neuron gates), the keep ratio (monotone in ``|w|``) for the
   penalty methods, ``p`` for the eta-trick's ``eta`` rule, each per group with a
   ``granularity`` other than ``"weight"``; ties (e.g. a constant initial log-alpha) are broken
   by ``|w|`` (by the group's norm ``||w_g||``). Single weights: one ranking over all layers,
   each layer keeping at least ``MIN_LAYER_DENSITY`` of its weights and ``(fan_out + fan_in) /
   2`` of them (one per two units, so that a small classifier keeps a connection per class);
   groups: each layer keeps ``d*(t)`` of its units (a ranking across layers of groups of
   different sizes starves the narrow layers), and units that only leave the network together
   (a residual stream's channels, when ``sparsify`` got ``example_inputs``) are ranked
   together and kept or pruned in every layer alike (``dualdrop.nn._coupling``). Pruned units
   stay pruned (masks only shrink): after every step they are held at zero
   (``WeightState.hold_pruned``; variational dropout's additive variant also silences their
   noise) and the optimizer's first moments there are zeroed. From ``t1`` to ``T`` the masks
   are fixed, the regularizer is released (``m = e^-12``) and the kept weights fine-tune on the
   data alone, as after gradual pruning: the method has chosen the units, and its shrinkage of
   the kept weights no longer helps (on MNIST from a dense LeNet-300-100 at 5% in 10 epochs:
   test error 2.90 -> 2.70% for LogSum, 2.60 -> 2.48% for the eta-trick, unchanged for
   VarDrop+LR and hard-concrete).

2. **A strength multiplier** ``m = exp(u)`` on ``lam`` so that the method's *own* rule agrees with
   the schedule (the constrained form of sparse training, as in constrained formulations of L0
   training, Gallego-Posada et al. 2022: a Lagrange multiplier on ``density <= d*(t)``), by a
   proportional-integral update on the log-density error ``e = log d_t - log d*(t)``,

       I <- clip(I + K_I k e, -U, U),   u = clip(I + K_P e, -U, U),   k = U / (n log(1/D)),

   every ``every`` steps up to ``t1`` (``n`` updates in all, ``U = 12``), where ``d_t`` is the
   density the method's own rule gives now (``Sparsifier.density()``, the held units counted
   as pruned). Then ``m`` is released (above).
   The schedule, not ``m``, guarantees the density: a multiplier that lags or overshoots costs
   accuracy, never the target.

At step ``T`` the test-time rule is set so that it keeps what the masks keep (their density, ``D``
up to a group-sized border unit; exactly ``D`` where no mask was made): methods with a keep-ratio
tolerance (variational dropout, the penalty methods, the eta-trick) get the ``tol`` that keeps it
(bisection: the density is monotone in ``tol``); hard-concrete (no tolerance) gets the gate logits
at the border moved just across the test gate's zero point
``log a = log(-gamma / (zeta - gamma))``, gates outside the masks ranked last; magnitude pruning
keeps its own cubic schedule with final sparsity ``1 - D`` and no multiplier. ``natural_density``
records the density the method's rule gave before this step. A reached density more than 10%
(relative) from ``D`` gives a ``RuntimeWarning`` with the reached density; so does a natural
density more than 2x from ``D`` (the ranking chose, not the method's rule).

Budget (``method_param_groups``): Adam moves a parameter by about its learning rate per step, so
a method parameter that must travel a distance ``delta`` (log-alpha from its start to the pruning
threshold, ~12; a gate logit, ~6; the eta-trick's ``p`` from 5 to ``logit(tol)``, ~8) within
half of ``T`` steps needs ``lr_method = max(lr, delta / (T / 2))``; the weights keep ``lr``.

The controller's state (``u``, the integral, the masks, the step of the last update,
``natural_density``) is in ``Sparsifier.state_dict()``, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
import warnings

import torch

from dualdrop.nn._base import check_float, check_int, layer_floor, mask_first_moments
from dualdrop.nn._coupling import tie_keeps

#: cap on |log m|
LOG_CAP = 12.0
#: the pruning ramp runs from BEGIN * T to END * T; the masks are fixed after END * T
BEGIN, END = 0.05, 0.6
#: log multiplier after END * T: the regularizer released for the fine-tuning
RELEASED = -LOG_CAP
#: every layer keeps at least this fraction of its units (and at least one)
MIN_LAYER_DENSITY = 0.001
#: proportional and integral gains of the multiplier (module docstring)
K_P, K_I = 0.5, 0.5
#: hyperparameters a target density sets itself (magnitude pruning's final sparsity and its
#: per-layer floor, ``sparsify``): a default of them yields to the target, a value given does not
SET_BY_TARGET = ("sparsity", "min_layer_density")
#: distance each kind of method parameter must travel within half of the budget (see above)
TRAVEL = {"log_alpha": 12.0, "log_sigma2": 12.0, "gate_logits": 6.0, "log_ratio": 8.0}


def check_density(target_density) -> float:
    """``target_density`` as a float in (0, 1] (the fraction of nonzero weights)."""
    return check_float("target_density", target_density, low=0.0, high=1.0, low_open=True)


def method_param_groups(sp, lr: float, total_steps: int) -> list[dict]:
    """Optimizer param groups for ``sp.model``: the method's own parameters (log-alpha, gate
    logits, ``p``) at ``max(lr, delta / (total_steps / 2))`` (module docstring), every other
    trainable parameter at ``lr``. Pass the list to any ``torch.optim`` optimizer."""
    lr = check_float("lr", lr, low=0.0, low_open=True)
    total_steps = check_int("total_steps", total_steps, low=1)
    fast: dict[float, list] = {}
    ids = set()
    for _, st in sp.states():
        for name, p in st.named_parameters():
            if not p.requires_grad or id(p) in ids:
                continue
            ids.add(id(p))
            delta = TRAVEL.get(name.rsplit(".", 1)[-1], 0.0)
            fast.setdefault(max(lr, delta / (total_steps / 2.0)), []).append(p)
    rest = [p for p in sp.model.parameters() if p.requires_grad and id(p) not in ids]
    groups = [{"params": rest, "lr": lr}] if rest else []
    groups += [{"params": ps, "lr": r} for r, ps in fast.items()]
    return groups


class DensityController:
    """Target density ``target`` for ``sp`` (module docstring): the pruning schedule ranked by the
    method and the strength multiplier; ``Sparsifier.after_step`` calls :meth:`update`."""

    def __init__(self, sp, target: float):
        self.sp = sp
        self.target = check_density(target)
        self.log_m = 0.0
        self.ramp_log_m = None  # log m at the end of the ramp, before the release
        self.integral = 0.0
        self.last = 0
        self.masks = None  # one bool tensor per state (over its keep_score units), once pruning began
        self.natural_density = None
        self.reached = None

    @property
    def uses_multiplier(self) -> bool:
        return self.sp.has_strength

    def goal(self, step: int, total_steps: int) -> float:
        """The allowed density ``d*(step)`` of the ramp."""
        t0, t1 = BEGIN * total_steps, END * total_steps
        if step <= t0:
            return 1.0
        frac = min(1.0, (step - t0) / max(t1 - t0, 1e-12))
        return 1.0 - (1.0 - self.target) * (1.0 - (1.0 - frac) ** 3)

    def update(self, step: int, total_steps: int, optimizer=None) -> None:
        if not self.uses_multiplier:  # magnitude pruning: its own schedule does it all
            if step == total_steps:
                self._finish()
            return
        every = max(1, total_steps // 100)
        t1 = max(1, round(END * total_steps))
        if self.masks is not None:  # before measuring: the step may have moved held weights
            self._hold(optimizer)
        if step > t1:  # the masks are final: the kept weights fine-tune on the data alone
            if self.log_m != RELEASED:
                self.ramp_log_m = self.log_m
                self.log_m = RELEASED
                self.sp.set_strength(math.exp(RELEASED))
        elif step - self.last >= every or step == t1:
            self.last = step
            goal = self.goal(step, total_steps)
            d = max(self.sp.density()["total"], 1e-12)
            e = math.log(d) - math.log(goal)
            n_updates = max(1, t1 // every)
            k = LOG_CAP / (n_updates * math.log(1.0 / self.target)) if self.target < 1 else 0.0
            self.integral = _clip(self.integral + K_I * k * e)
            self.log_m = _clip(self.integral + K_P * e)
            self.sp.set_strength(math.exp(self.log_m))
            if goal < 1.0:
                self._prune_to(goal)
                self._hold(optimizer)
        if step == total_steps:
            self._finish()

    @torch.no_grad()
    def _prune_to(self, goal: float) -> None:
        """Masks keeping at most ``goal`` of the weights, the method's lowest-ranked units out:
        single weights in one ranking over all layers; groups (a gate's or a ``granularity``'s)
        layer by layer, each layer keeping ``goal`` of its units (a ranking across layers of
        groups of different sizes starves the narrow layers)."""
        pairs = [(t.param, st) for t, st in self.sp.states()]
        old = self.masks
        scores, shapes, sizes, floors = [], [], [], []
        for i, (w, st) in enumerate(pairs):
            sc = st.keep_score(w).double()
            shapes.append(sc.shape)
            # ties (e.g. a constant initial log-alpha) broken by the unit's magnitude
            mag = st.unit_magnitude(w).double().reshape(sc.shape)
            sc = (sc + 1e-9 * mag / float(mag.max().clamp(min=1e-30))).flatten()
            if old is not None:
                sc = torch.where(old[i].flatten(), sc, torch.full_like(sc, -math.inf))
            scores.append(sc.cpu())
            sizes.append(w.numel() // sc.numel())
            floors.append(layer_floor(w, sc.numel(), MIN_LAYER_DENSITY))
        keeps = [None] * len(pairs)
        single = [i for i, n in enumerate(sizes) if n == 1]
        for i in (i for i, n in enumerate(sizes) if n > 1):
            sc = scores[i]
            k = max(floors[i], round(goal * sc.numel()))
            keeps[i] = torch.zeros(sc.numel(), dtype=torch.bool)
            keeps[i][torch.topk(sc, k, sorted=False).indices] = True
        tie_keeps(keeps, scores, self.sp.ties)  # coupled units together (dualdrop.nn._coupling)
        if single:
            # each layer's own best `floor` weights first, then one ranking over all of them
            forced = []
            for i in single:
                sc = scores[i].clone()
                sc[torch.topk(sc, floors[i], sorted=False).indices] = math.inf
                forced.append(sc)
            allsc = torch.cat(forced)
            order = torch.sort(allsc, descending=True, stable=True).indices
            n_keep = max(round(goal * allsc.numel()), int(torch.isposinf(allsc).sum()))
            keep = torch.zeros(allsc.numel(), dtype=torch.bool)
            keep[order[:n_keep]] = True
            for i, part in zip(single, torch.split(keep, [scores[i].numel() for i in single])):
                keeps[i] = part
        masks = []
        for i, keep in enumerate(keeps):
            m = keep.to(pairs[i][0].device).view(shapes[i])
            masks.append(m if old is None else m & old[i])
        self.masks = masks

    @torch.no_grad()
    def _hold(self, optimizer) -> None:
        for (t, st), m in zip(self.sp.states(), self.masks):
            w = t.param
            mask = st.unit_mask(m.to(w.device), w)
            st.hold_pruned(w, mask)
            mask_first_moments(optimizer, w, mask)

    @torch.no_grad()
    def _finish(self) -> None:
        sp, D = self.sp, self.target
        self.natural_density = sp.density()["total"]
        # with masks the network that fine-tuned is the masked one: the rule keeps every unit the
        # masks keep (calibrated to their density) and prunes none of them, floors included
        goal = D if self.masks is None else self._mask_density()
        if sp.has_tol:
            _calibrate_tol(sp, goal)
        elif hasattr(sp.states()[0][1], "gate_logits"):
            _calibrate_gates(sp, goal, self.masks)
        self.reached = sp.density()["total"]
        if abs(self.reached / D - 1.0) > 0.1:
            warnings.warn(f"target_density={D:g} not reached by {sp.method}: the finished network "
                          f"has density {self.reached:.4g}", RuntimeWarning, stacklevel=4)
        elif not (0.5 <= self.natural_density / D <= 2.0):
            warnings.warn(f"{sp.method}: its own test-time rule gave density "
                          f"{self.natural_density:.4g} for target {D:g} within the budget; the "
                          f"threshold was moved to keep {self.reached:.4g} (a longer budget lets "
                          "the method choose)", RuntimeWarning, stacklevel=4)

    def _mask_density(self) -> float:
        kept = total = 0
        for (t, _), m in zip(self.sp.states(), self.masks):
            kept += int(m.sum()) * (t.param.numel() // m.numel())
            total += t.param.numel()
        return kept / total

    def state_dict(self) -> dict:
        return {"target": self.target, "log_m": self.log_m, "ramp_log_m": self.ramp_log_m,
                "integral": self.integral,
                "last": self.last, "masks": self.masks,
                "natural_density": self.natural_density, "reached": self.reached}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output; checked whole before anything is assigned
        (TypeError/ValueError naming what does not fit)."""
        if not isinstance(state, dict):
            raise TypeError(f"controller state must be a dict (DensityController.state_dict()), "
                            f"got {type(state).__name__}")
        missing = sorted({"target", "log_m", "last", "natural_density", "reached"} - set(state))
        if missing:
            raise ValueError(f"controller state lacks {missing}: not a DensityController state")
        try:
            target, log_m, last = float(state["target"]), float(state["log_m"]), int(state["last"])
            integral = float(state.get("integral", log_m))
        except (TypeError, ValueError):
            raise ValueError("controller state holds non-numeric target/log_m/last/integral: "
                             "not a DensityController state") from None
        if target != self.target:
            raise ValueError(f"controller state was saved for target_density={state['target']} "
                             f"but this run asks {self.target}")
        masks = state.get("masks")
        if masks is not None:
            shapes = [tuple(st.keep_score(t.param).shape) for t, st in self.sp.states()]
            if not isinstance(masks, (list, tuple)) or len(masks) != len(shapes) or any(
                    not isinstance(m, torch.Tensor) or tuple(m.shape) != s
                    for m, s in zip(masks, shapes)):
                raise ValueError("controller state has masks for another model (their shapes "
                                 "differ from this model's sparsified weights)")
            masks = [m.to(torch.bool) for m in masks]
        self.log_m, self.last, self.integral = log_m, last, integral
        self.ramp_log_m = state.get("ramp_log_m")
        self.masks = masks
        self.natural_density, self.reached = state["natural_density"], state["reached"]
        if self.uses_multiplier:
            self.sp.set_strength(math.exp(self.log_m))


def _clip(u: float) -> float:
    return min(LOG_CAP, max(-LOG_CAP, u))


def _density_at(sp, x: float):
    """The density with ``tol = sigmoid(x)``, or None where the method refuses that tol
    (variational dropout: a tol whose log-alpha cut lies beyond ``clip``)."""
    try:
        sp.set_tol(1.0 / (1.0 + math.exp(-x)))
    except ValueError:
        return None
    return sp.density()["total"]


def _calibrate_tol(sp, D: float) -> None:
    """Bisection on ``logit(tol)`` (the density falls as tol rises) for the tol keeping ``D``;
    the closer of the two brackets wins."""
    lo, hi = -14.0, 14.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        d = _density_at(sp, mid)
        if d is None or d > D:
            lo = mid
        else:
            hi = mid
    cand = [(abs(d - D), x) for x in (lo, hi) if (d := _density_at(sp, x)) is not None]
    _density_at(sp, min(cand)[1])


def _calibrate_gates(sp, D: float, masks=None) -> None:
    """Move the hard-concrete gate logits at the border across the test gate's zero point so
    that ``D`` of the weights are kept; open gates inside the budget are not changed.

    The gates are ranked by logit (all layers together, each weighing its number of weights);
    the kept prefix stops before the first gate that would overshoot ``D`` by more than leaving
    it out would undershoot (at least one gate is kept). ``masks`` (the target-density
    controller's, one per state over its gates): gates outside them rank last."""
    states = [st for _, st in sp.states()]
    logits = torch.cat([st.gate_logits.detach().flatten().double() for st in states])
    rank = logits if masks is None else torch.where(
        torch.cat([m.flatten().to(logits.device) for m in masks]), logits,
        torch.full_like(logits, -math.inf))
    sizes = torch.cat([torch.full((st.gate_logits.numel(),), float(st.group_size()),
                                  dtype=torch.float64, device=logits.device) for st in states])
    budget = D * float(sizes.sum())
    order = torch.sort(rank, descending=True, stable=True).indices
    after = torch.cumsum(sizes[order], 0)
    before = after - sizes[order]
    stop = (after > budget) & (before > 0) & ((after - budget).abs() > (before - budget).abs())
    n_keep = int(stop.nonzero()[0]) if bool(stop.any()) else logits.numel()
    keep = torch.zeros_like(logits, dtype=torch.bool)
    keep[order[:n_keep]] = True
    start = 0
    for st in states:
        flat = st.gate_logits.data.view(-1)
        mask = keep[start:start + flat.numel()].to(flat.device)
        start += flat.numel()
        zero = math.log(-st.gamma / st.zeta)  # sigmoid(zero) (zeta - gamma) + gamma = 0
        flat.copy_(torch.where(mask, flat.clamp(min=zero + 0.05), flat.clamp(max=zero - 0.05)))
