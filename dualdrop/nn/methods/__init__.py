"""The sparsification methods, one family per module or folder.

``vardrop/`` (variational dropout: ``vardrop``, ``vardrop-lr``, ``vardrop-lr-ar``),
``hardconcrete/`` (L0 gates per weight or per neuron), ``penalty/`` (the eta-trick family and
the catalog penalties: ``eta-trick``, ``adaprox``, ``adatikhonov``, ``logsum``,
``penalty:<name>``) and ``magnitude`` (gradual magnitude pruning). A family folder holds
``method.py`` (the ``Method`` records, the per-weight state and the reference implementation in
plain torch) and ``fused.py`` (numba loops drawing the same counter-based noise). Imports run
one way: method -> fused -> shared machinery (``dualdrop.nn._numba``, ``_noise``, ``_gradhook``)
-> ``penalties``. The records by name are ``dualdrop.nn.registry``; the names this module had
when it was the registry still resolve here (with a DeprecationWarning).
"""

from __future__ import annotations

import importlib
import warnings

_MOVED = ("REGISTRY", "METHODS", "PENALTY_PREFIX", "method_class", "is_method", "get",
          "default_hparams", "describe", "paper_table")


def __getattr__(name):
    """The registry's names under their old module path ``dualdrop.nn.methods``."""
    if name in _MOVED:
        warnings.warn(f"dualdrop.nn.methods.{name} moved to dualdrop.nn.registry.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("dualdrop.nn.registry"), name)
    raise AttributeError(f"module 'dualdrop.nn.methods' has no attribute {name!r}")
