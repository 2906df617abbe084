"""The registry of methods, ``sparsify`` and the ``Sparsifier`` handle it returns."""

from __future__ import annotations

import numbers

import torch
import torch.nn as nn

from dualdrop.nn import hardconcrete, magnitude, penalty, vardrop
from dualdrop.nn._alloc import tune_allocator
from dualdrop.nn._base import check_int, iter_sparse_layers, select_layers, swap_class
from dualdrop.nn.export import export_sparse, sparsity_report

#: method names accepted by ``sparsify`` (plus ``"penalty:<name>"`` for any catalog penalty)
METHODS = ("vardrop", "vardrop-lr", "vardrop-lr-ar", "hardconcrete", "hardconcrete-neuron",
           "magnitude", "eta-trick", "adaprox", "adatikhonov", "logsum")

# learning rates of the seed (DUALITY.md section 5); for methods the seed did not run, the
# usual values of their papers (Louizos et al. 2018: 1e-3; Zhu & Gupta: the dense net's 1e-3)
_LR = {"vardrop": 1e-3, "vardrop-lr": 1e-3, "vardrop-lr-ar": 1e-4, "hardconcrete": 1e-3,
       "hardconcrete-neuron": 1e-3, "magnitude": 1e-3, "eta-trick": 1e-3, "adaprox": 1e-4,
       "adatikhonov": 1e-4, "logsum": 1e-4, "penalty": 1e-4}


def _family(method: str):
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    if method in vardrop.LAYER_CLASSES:
        return "vardrop"
    if method in hardconcrete.LAYER_CLASSES:
        return "hardconcrete"
    if method == "magnitude":
        return "magnitude"
    if method in ("eta-trick", "adaprox", "adatikhonov", "logsum"):
        return "penalty"
    if method.startswith("penalty:") and len(method) > len("penalty:"):
        name = method.split(":", 1)[1]
        available = penalty._import_penalties().available()
        if name.strip().lower().replace("-", "_") not in available:
            raise ValueError(f"unknown penalty in method {method!r}; catalog names are "
                             f"{available}")
        return "penalty"
    raise ValueError(f"unknown method {method!r}; choose one of {list(METHODS)} or "
                     "'penalty:<name>' with a penalties catalog name (e.g. 'penalty:mcp')")


def _base_hparams(method: str) -> dict:
    fam = _family(method)
    key = "penalty" if method.startswith("penalty:") else method
    if fam == "vardrop":
        hp = vardrop.HPARAMS[method]
    elif fam == "hardconcrete":
        hp = hardconcrete.HPARAMS
    elif fam == "magnitude":
        hp = magnitude.HPARAMS
    else:
        hp = penalty.HPARAMS[key]
    out = {"lr": _LR[key]}
    out.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in hp.items()})
    return out


def default_hparams(method: str) -> dict:
    """The default hyperparameters of ``method`` (a fresh dict; ``lr`` is for the optimizer).

    Defaults are the seed's (DUALITY.md section 5): ``tol = 0.05``; LogSum ``eps = 2``,
    ``lam = 1e-3`` for logsum/adatikhonov/adaprox/eta-trick (and ``eta_decay = 1e-3`` for
    eta-trick); learning rates 1e-4 (vardrop-lr-ar, logsum, adatikhonov, adaprox) and 1e-3
    (vardrop-lr, vardrop, eta-trick). Other methods use their papers' values.
    """
    return _base_hparams(method)


def _validate(method: str, hparams: dict) -> dict:
    hp = _base_hparams(method)
    unknown = sorted(set(hparams) - set(hp))
    if unknown:
        raise TypeError(f"unknown hyperparameter(s) {unknown} for method {method!r}; valid ones "
                        f"are {sorted(hp)} (see default_hparams({method!r}))")
    hp.update(hparams)
    lr = hp.pop("lr")
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    fam = _family(method)
    if fam == "vardrop":
        hp = vardrop.validate(hp)
    elif fam == "hardconcrete":
        hp = hardconcrete.validate(hp)
    elif fam == "magnitude":
        hp = magnitude.validate(hp)
    else:
        hp = penalty.validate(method, hp)
    hp["lr"] = float(lr)
    return hp


def _layer_classes(method: str):
    fam = _family(method)
    if fam == "vardrop":
        return vardrop.LAYER_CLASSES[method]
    if fam == "hardconcrete":
        return hardconcrete.LAYER_CLASSES[method]
    if fam == "magnitude":
        return magnitude.LAYER_CLASSES[method]
    return penalty.LAYER_CLASSES


class Sparsifier:
    """Handle on a sparsified model: regularizer, post-step hook, densities, export.

    It holds the method, the validated hyperparameters and a reference to the model; all numeric
    state lives in the model (parameters and buffers), so ``model.state_dict()`` plus the
    optimizer's state dict describe a run completely. ``Sparsifier.attach(model, method, ...)``
    re-creates a handle for a model that is already sparsified (e.g. a deep copy).
    """

    def __init__(self, model: nn.Module, method: str, hparams: dict):
        self.model = model
        self.method = method
        self.hparams = hparams
        self._family = _family(method)

    @classmethod
    def attach(cls, model: nn.Module, method: str, **hparams) -> "Sparsifier":
        found = {layer.sparse_method for _, layer in iter_sparse_layers(model)}
        if found != {method}:
            raise ValueError(f"model's sparsified layers use methods {sorted(found)}, not "
                             f"{method!r}")
        return cls(model, method, _validate(method, hparams))

    @property
    def layers(self) -> list[tuple[str, nn.Module]]:
        """``(name, layer)`` of every sparsified layer of the model."""
        return list(iter_sparse_layers(self.model))

    def regularizer(self, n_train: int, *, value: bool = True) -> torch.Tensor:
        """Scalar to add to the mean-over-batch data loss.

        vardrop: ``lam sum KL / n_train``; hard-concrete: ``lam E[L0] / n_train`` (expected
        number of nonzero weights); logsum / penalty:<name>: ``lam sum Omega(w)``; adatikhonov:
        ``lam/2 sum w^2/eta_hat(w)`` (eta held fixed); eta-trick: ``lam sum 1/2 (w^2/eta +
        f(eta)) + eta_decay/2 sum log(eta)^2``; adaprox and magnitude: 0.

        ``value=False`` is for training loops that do not log the regularizer: the returned
        scalar is exactly 0 but its gradient is the regularizer's, and the per-weight work that
        only the value needs (the logs of LogSum, the KL, the eta-trick dual, table lookups) is
        skipped. Log the value when needed with ``regularizer(n_train)`` under ``torch.no_grad()``.
        """
        n_train = check_int("n_train", n_train, low=1)
        if not isinstance(value, bool):
            raise TypeError(f"value must be True or False, got {type(value).__name__}")
        terms = [layer.regularizer_term(n_train, value) for _, layer in self.layers]
        total = torch.stack(terms).sum()
        return total if value else total - total.detach()

    def after_step(self, optimizer, step: int, total_steps: int) -> None:
        """Call after every ``optimizer.step()``; ``step`` counts the steps taken (1-based)."""
        total_steps = check_int("total_steps", total_steps, low=1)
        step = check_int("step", step, low=0)
        if step > total_steps:
            raise ValueError(f"step ({step}) must not exceed total_steps ({total_steps})")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if self._family == "magnitude":
            magnitude.after_step(self, optimizer, step, total_steps)
        elif self._family == "penalty":
            penalty.after_step(self, optimizer, step, total_steps)

    @property
    def has_tol(self) -> bool:
        """Whether the method's test-time rule is a keep-ratio tolerance (see ``set_tol``)."""
        return self._family in ("vardrop", "penalty")

    def set_tol(self, tol: float) -> None:
        """Change the test-time pruning tolerance ``tol`` of every layer (keep ratio < tol is
        pruned) without retraining: the density/accuracy trade-off of a trained network.
        ``hparams["tol"]`` follows. Choose it on validation data, never on the test set."""
        if not self.has_tol:
            raise ValueError(f"method {self.method!r} has no keep-ratio tolerance: hard-concrete "
                             "uses its deterministic test gate and magnitude its masks")
        for _, layer in self.layers:
            layer.set_tol(tol)
        self.hparams["tol"] = self.layers[0][1].tol

    @torch.no_grad()
    def density(self) -> dict:
        """``{layer_name: fraction of nonzero test-time weights, ..., "total": fraction}``."""
        out, nnz, tot = {}, 0, 0
        for name, layer in self.layers:
            k, n = layer.weight_nonzero(), layer.weight.numel()
            out[name] = k / n
            nnz += k
            tot += n
        if tot == 0:
            raise ValueError("the model has no sparsified layer (was it exported, or "
                             "sparsified under another name?)")
        out["total"] = nnz / tot
        return out

    def report(self) -> list[dict]:
        return sparsity_report(self.model)

    def export(self, layout: str = "auto", **kwargs) -> nn.Module:
        return export_sparse(self.model, layout, **kwargs)

    def __repr__(self):
        hp = {k: v for k, v in self.hparams.items() if k != "penalty"}
        return f"Sparsifier(method={self.method!r}, layers={len(self.layers)}, hparams={hp})"


def sparsify(model: nn.Module, method: str, *, layers=None, **hparams) -> Sparsifier:
    """Sparsify ``model`` in place with ``method``; returns the ``Sparsifier`` handle.

    Every ``nn.Linear`` and ``nn.Conv2d`` (exact types; or the modules named in ``layers``) is
    turned into the method's layer class in place; new learnable tensors become parameters of
    the model, so build the optimizer *after* this call. Hyperparameters not given take
    ``default_hparams(method)``; unknown names raise ``TypeError``. ``lr`` is validated and kept in
    ``Sparsifier.hparams`` for the caller's optimizer; the layers do not use it. The global torch
    RNG initializes stochastic parameters (hard-concrete gate logits): seed it first for
    reproducibility. On glibc it also fixes malloc's mmap/trim thresholds once per process
    (``dualdrop.nn._alloc``; ``DUALDROP_MALLOC_TUNING=0`` opts out): without that, torch's
    elementwise ops ran ~8x slower after the penalties' numba kernels were loaded.

    Training loop::

        sp = sparsify(model, "vardrop-lr")
        opt = torch.optim.Adam(model.parameters(), lr=sp.hparams["lr"])
        for step, (x, y) in enumerate(batches, 1):
            loss = F.cross_entropy(model(x), y) + sp.regularizer(n_train)
            opt.zero_grad(); loss.backward(); opt.step()
            sp.after_step(opt, step, total_steps)
        sp.density()          # deterministic test-time densities
        plain = export_sparse(model, layout="dense")
    """
    method_family = _family(method)  # noqa: F841 - validates the name first
    tune_allocator()  # see dualdrop.nn._alloc: numba in this process would slow torch ~8x
    hp = _validate(method, hparams)
    chosen = select_layers(model, layers)
    linear_cls, conv_cls = _layer_classes(method)
    layer_hp = {k: v for k, v in hp.items() if k != "lr"}
    if method_family == "magnitude":
        layer_hp = {}
    elif method_family == "penalty":
        layer_hp.pop("penalty_params", None)
    for _, module in chosen:
        swap_class(module, linear_cls, conv_cls, method, layer_hp)
    return Sparsifier(model, method, hp)
