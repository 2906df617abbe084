"""Target density for every method: a strength multiplier driven by the measured density.

A method's strength ``lam`` maps to a density only through trial runs, and the map moves with the
model, the data size and the budget. Asking for a density ``D`` instead turns the strength into
``lam * m`` with a multiplier ``m = exp(u)`` that the library adjusts during training, the
constrained form of sparse training (as in constrained formulations of L0 training, Gallego-Posada
et al. 2022): minimize the loss subject to ``density <= D``, a Lagrange multiplier on the
constraint, found by dual ascent. Here the ascent is on ``u = log m`` with the constraint in log
form,

    u  <-  clip(u + rate * (log d_t - log D), -U, U),

every ``every`` steps, where ``d_t`` is the density the method's own test-time rule gives now
(``Sparsifier.density()``, default ``tol``). ``m`` grows while the network is denser than asked
and shrinks when it is sparser. ``rate = U / (n_updates * log(1/D))``: a network that stays
fully dense reaches the cap ``m = e^U`` (``U = 12``) at the end of the moving phase.

Schedule (``T`` = total steps given to ``after_step``):

- steps ``1 .. freeze * T`` (``freeze = 0.75``): ``m`` moves every ``every = max(1, T // 200)``
  steps;
- steps after ``freeze * T``: ``m`` is frozen, the network settles under a fixed objective;
- at step ``T``: the test-time rule is set so that exactly ``D`` of the weights are kept (the
  method's own ranking decides which): methods with a keep-ratio tolerance (variational dropout,
  the penalty methods, the eta-trick) get the ``tol`` that keeps ``D`` (bisection: the density is
  monotone in ``tol``); hard-concrete (no tolerance) gets the gate logits at the border moved
  just across the test gate's zero point ``log a = log(-gamma / (zeta - gamma))`` - the gates that
  are open and inside the budget stay untouched; magnitude pruning keeps its own cubic schedule
  with final sparsity ``1 - D`` and no multiplier. ``natural_density`` records the density the
  method's rule gave before this step. A reached density more than 10% (relative) from ``D``
  (e.g. a per-layer floor, or fewer nonzero weights than asked) gives a ``RuntimeWarning`` with
  the reached density; so does a natural density more than 2x from ``D``: the budget was too
  short for the method to choose, and the ranking did.

Budget (``method_param_groups``): Adam moves a parameter by about its learning rate per step, so
a method parameter that must travel a distance ``delta`` (log-alpha from its start to the pruning
threshold, ~12; a gate logit, ~6; the eta-trick's ``p`` from 5 to ``logit(tol)``, ~8) within
half of ``T`` steps needs ``lr_method = max(lr, delta / (T / 2))``; the weights keep ``lr``.

The controller's state (``u``, the step of the last update, ``natural_density``) is in
``Sparsifier.state_dict()``, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
import warnings

import torch

from dualdrop.nn._base import check_float, check_int

#: cap on |log m|
LOG_CAP = 12.0
#: fraction of the budget during which the multiplier moves
FREEZE = 0.75
#: a network that stays fully dense reaches the cap ``e^LOG_CAP`` at the end of the moving phase
RATE = 1.0
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
    """Dual ascent of the strength multiplier of ``sp`` toward density ``target`` (module
    docstring); ``Sparsifier.after_step`` calls :meth:`update`."""

    def __init__(self, sp, target: float, *, freeze: float = FREEZE):
        self.sp = sp
        self.target = check_density(target)
        self.freeze = freeze
        self.log_m = 0.0
        self.last = 0
        self.natural_density = None
        self.reached = None

    @property
    def uses_multiplier(self) -> bool:
        return self.sp.has_strength

    def update(self, step: int, total_steps: int) -> None:
        if not self.uses_multiplier:
            if step == total_steps:
                self._finish()
            return
        every = max(1, total_steps // 200)
        moving_until = int(self.freeze * total_steps)
        if step <= moving_until and step - self.last >= every:
            n_updates = max(1, moving_until // every)
            rate = RATE * LOG_CAP / (n_updates * math.log(1.0 / self.target)
                                    if self.target < 1 else 1.0)
            d = max(self.sp.density()["total"], 1e-12)
            self.log_m = min(LOG_CAP, max(-LOG_CAP, self.log_m + rate * (
                math.log(d) - math.log(self.target))))
            self.last = step
            self.sp.set_strength(math.exp(self.log_m))
        if step == total_steps:
            self._finish()

    @torch.no_grad()
    def _finish(self) -> None:
        sp, D = self.sp, self.target
        self.natural_density = sp.density()["total"]
        if sp.has_tol:
            _calibrate_tol(sp, D)
        elif hasattr(sp.states()[0][1], "gate_logits"):
            _calibrate_gates(sp, D)
        self.reached = sp.density()["total"]
        if abs(self.reached / D - 1.0) > 0.1:
            warnings.warn(f"target_density={D:g} not reached by {sp.method}: the finished network "
                          f"has density {self.reached:.4g}", RuntimeWarning, stacklevel=4)
        elif not (0.5 <= self.natural_density / D <= 2.0):
            warnings.warn(f"{sp.method}: its own test-time rule gave density "
                          f"{self.natural_density:.4g} for target {D:g} within the budget; the "
                          f"threshold was moved to keep {self.reached:.4g} (a longer budget lets "
                          "the method choose)", RuntimeWarning, stacklevel=4)

    def state_dict(self) -> dict:
        return {"target": self.target, "log_m": self.log_m, "last": self.last,
                "natural_density": self.natural_density, "reached": self.reached}

    def load_state_dict(self, state: dict) -> None:
        if float(state["target"]) != self.target:
            raise ValueError(f"controller state was saved for target_density={state['target']} "
                             f"but this run asks {self.target}")
        self.log_m, self.last = float(state["log_m"]), int(state["last"])
        self.natural_density, self.reached = state["natural_density"], state["reached"]
        if self.uses_multiplier:
            self.sp.set_strength(math.exp(self.log_m))


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


def _calibrate_gates(sp, D: float) -> None:
    """Move the hard-concrete gate logits at the border across the test gate's zero point so
    that ``D`` of the weights are kept; open gates inside the budget are not changed.

    The gates are ranked by logit (all layers together, each weighing its number of weights);
    the kept prefix stops before the first gate that would overshoot ``D`` by more than leaving
    it out would undershoot (at least one gate is kept)."""
    states = [st for _, st in sp.states()]
    logits = torch.cat([st.gate_logits.detach().flatten().double() for st in states])
    sizes = torch.cat([torch.full((st.gate_logits.numel(),), float(st.group_size()),
                                  dtype=torch.float64, device=logits.device) for st in states])
    budget = D * float(sizes.sum())
    order = torch.sort(logits, descending=True, stable=True).indices
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
