"""Evaluation of a trained network: error rates, fractions of nonzero weights, tolerances.

Every error is of the deterministic test-time network (``model.eval()``: no noise, masks and
gates at their test-time values). Fractions of nonzero count the *weights* of the ``nn.Linear``
layers; biases are not counted. Methods with a keep-ratio tolerance ``tol`` define a whole
trade-off curve with one trained network: :func:`tol_sweep` traces it on *validation* data, and
:func:`select_tol` picks a point from validation numbers alone, then reads the test set once.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def dense_density(model: nn.Module) -> dict:
    """Fraction of nonzero weights of every ``nn.Linear`` / ``nn.Conv2d`` (biases excluded) and
    in total: the weights ``dualdrop.nn.sparsify`` acts on in these networks."""
    out, nz, tot = {}, 0, 0
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.Conv2d)):
            w = mod.weight.detach()
            k = int(torch.count_nonzero(w))
            out[name] = k / w.numel()
            nz += k
            tot += w.numel()
    out["total"] = nz / max(tot, 1)
    return out


@torch.no_grad()
def error_rate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    """Misclassification rate of ``model`` in eval mode (the deterministic test-time network)."""
    was = model.training
    model.eval()
    wrong = 0
    for i in range(0, len(y), batch):
        wrong += int((model(X[i:i + batch]).argmax(1) != y[i:i + batch]).sum())
    model.train(was)
    return wrong / max(len(y), 1)


#: keep-ratio tolerances of the validation sweep in ``final.json`` (the trained default is 0.05)
SWEEP_TOLS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)


@torch.no_grad()
def tol_sweep(sp, model: nn.Module, X: torch.Tensor, y: torch.Tensor,
              tols=SWEEP_TOLS, batch: int = 4096) -> list[dict]:
    """Density and error of the trained network at other test-time tolerances ``tol``.

    The trade-off curve of one trained network, free of retraining: for each ``tol`` the fraction
    of nonzero weights and the error on ``(X, y)``, which must be *validation* data (select on
    it; report the test error of the chosen ``tol`` once: :func:`select_tol`). Values
    the method cannot express are skipped. The Sparsifier's own ``tol`` is restored afterwards.
    """
    if not sp.has_tol:
        return []
    was_training = model.training
    own = sp.hparams["tol"]
    rows = []
    try:
        for tol in tols:
            try:
                sp.set_tol(tol)
            except ValueError:  # e.g. below what vardrop's log-alpha clip can express
                continue
            rows.append({"tol": float(tol), "nonzero_total": float(sp.density()["total"]),
                         "error": error_rate(model, X, y, batch)})
    finally:
        sp.set_tol(own)
        model.train(was_training)
    return rows


@torch.no_grad()
def select_tol(sp, model: nn.Module, sweep: list[dict], val_error: float, margin: float,
               X_test: torch.Tensor, y_test: torch.Tensor, batch: int = 4096) -> dict:
    """The sparsest ``tol`` of a validation ``sweep`` (see :func:`tol_sweep`) whose validation
    error is at most ``val_error + margin``, with its test error and densities. The choice sees
    validation numbers only; the test set is evaluated once, at the chosen ``tol``."""
    ok = [r for r in sweep if r["error"] <= val_error + margin + 1e-12]
    if not ok:  # the trained tol itself is always admissible; keep it
        return {"tol": sp.hparams["tol"], "margin": margin, "note": "no sweep point qualified"}
    own = sp.hparams["tol"]
    # ties in density (the same network): the tolerance closest to the trained one
    best = min(ok, key=lambda r: (r["nonzero_total"], abs(math.log(r["tol"] / own))))
    try:
        sp.set_tol(best["tol"])
        dens = sp.density()
        test = error_rate(model, X_test, y_test, batch)
    finally:
        sp.set_tol(own)
    return {"tol": best["tol"], "margin": margin, "val_error": best["error"],
            "test_error": test, "nonzero_total": float(dens["total"]),
            "nonzero": {k: float(v) for k, v in dens.items() if k != "total"}}


#: a keep-ratio tolerance below every nonzero weight's keep ratio: "prune nothing"
KEEP_ALL_TOL = 1e-300


@torch.no_grad()
def unpruned_error(sp, model: nn.Module, X: torch.Tensor, y: torch.Tensor,
                   batch: int = 4096) -> float | None:
    """Error of the trained network *without* its test-time pruning step.

    The paper's released code evaluates its MaskedLinear methods (LogSum, AdaTikhonov, AdaProx,
    eta-Trick) this way: at test time its mask is all ones, so weights whose keep ratio is below
    ``tol`` still take part, while the fraction nonzero is counted from ``keep ratio < tol``. Its
    variational-dropout layers do zero them. Here: for a method with a keep-ratio tolerance, the
    error at ``tol`` = :data:`KEEP_ALL_TOL` (every nonzero weight kept); ``None`` when the method
    cannot express that (variational dropout's clipped log-alpha); for methods without a
    test-time pruning step (dense, hard-concrete, magnitude: their zeros come from training) the
    pruned network itself. The Sparsifier's own ``tol`` is restored afterwards.
    """
    if sp is None or not sp.has_tol:
        return error_rate(model, X, y, batch)
    own = sp.hparams["tol"]
    try:
        sp.set_tol(KEEP_ALL_TOL)
    except ValueError:
        return None
    try:
        return error_rate(model, X, y, batch)
    finally:
        sp.set_tol(own)
