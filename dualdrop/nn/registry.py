"""The registry of sparsification methods: one ``Method`` record per method.

Each record (a ``dualdrop.nn._base.Method`` subclass, in its family's module under
``dualdrop.nn.methods``) carries the
method's family, what it can act on, its defaults (``lr`` included), a one-line description of
each hyperparameter, its validation, the per-weight state it builds, its post-step hook, whether
it has a test-time tolerance and the paper's LeNet-300-100 numbers. Adding a method is one class
plus one line in ``_RECORDS``. ``"penalty:<name>"`` names any separable penalty of the
``penalties`` catalog; :func:`method_class` is the only place that reads that form.
"""

from __future__ import annotations

import difflib

from dualdrop.nn._base import Method
from dualdrop.nn.methods import magnitude
from dualdrop.nn.methods.hardconcrete import method as hardconcrete
from dualdrop.nn.methods.penalty import method as penalty
from dualdrop.nn.methods.vardrop import method as vardrop

_RECORDS = (
    vardrop.VarDrop,
    vardrop.VarDropLR,
    vardrop.VarDropLRAR,
    hardconcrete.HardConcrete,
    hardconcrete.HardConcreteNeuron,
    magnitude.Magnitude,
    penalty.EtaTrick,
    penalty.AdaProx,
    penalty.AdaTikhonov,
    penalty.LogSum,
)

#: name -> Method class
REGISTRY: dict[str, type[Method]] = {cls.name: cls for cls in _RECORDS}

#: method names accepted by ``sparsify`` (plus ``"penalty:<name>"`` for any catalog penalty)
METHODS = tuple(REGISTRY)

PENALTY_PREFIX = "penalty:"


def method_class(method: str) -> type[Method]:
    """The ``Method`` class of a method name (``"penalty:<name>"`` included)."""
    if isinstance(method, type) and issubclass(method, Method):
        return method
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    if method in REGISTRY:
        return REGISTRY[method]
    if method.startswith(PENALTY_PREFIX) and len(method) > len(PENALTY_PREFIX):
        return penalty.CatalogPenalty.for_catalog(method[len(PENALTY_PREFIX):])
    raise ValueError(f"unknown method {method!r}{_did_you_mean(method)}; choose one of "
                     f"{list(METHODS)} or 'penalty:<name>' with a penalties catalog name "
                     "(e.g. 'penalty:mcp')")


def _did_you_mean(method: str) -> str:
    """`` (did you mean 'vardrop-lr'?)`` for a near miss (case, '_' for '-', a typo), else ''."""
    norm = method.strip().lower().replace("_", "-").replace(" ", "-")
    if norm in REGISTRY:
        return f" (did you mean {norm!r}?)"
    close = difflib.get_close_matches(norm, METHODS, n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def is_method(method) -> bool:
    """Whether ``method`` names a method (without raising)."""
    try:
        method_class(method)
    except (TypeError, ValueError):
        return False
    return True


def get(method: str, **hparams) -> Method:
    """A ``Method`` instance with validated hyperparameters (defaults for those not given)."""
    return method_class(method)(**hparams)


def default_hparams(method: str) -> dict:
    """The default hyperparameters of ``method`` (a fresh dict; ``lr`` is for the optimizer)."""
    return method_class(method).default_hparams()


def describe(method: str) -> dict:
    """``{name: (default, one-line description)}`` of ``method``'s hyperparameters."""
    return method_class(method).describe()


def paper_table() -> dict:
    """``{method: (label, test error, fraction nonzero)}``: the paper's LeNet-300-100 table."""
    return {name: cls.paper for name, cls in REGISTRY.items() if cls.paper is not None}


def compare_defaults() -> tuple[str, ...]:
    """The methods ``dualdrop.train.experiments.compare`` runs by default, in their
    ``compare_rank`` order."""
    ranked = [(cls.compare_rank, name) for name, cls in REGISTRY.items()
              if cls.compare_rank is not None]
    return tuple(name for _, name in sorted(ranked))


def dataset_hparams(dataset: str) -> dict:
    """``{method: {hparam: value}}``: each registered method's defaults for ``dataset``."""
    return {name: dict(cls.dataset_defaults[dataset]) for name, cls in REGISTRY.items()
            if dataset in cls.dataset_defaults}


def stochastic() -> tuple[str, ...]:
    """The registered methods whose training draws noise."""
    return tuple(name for name, cls in REGISTRY.items() if cls.stochastic)
