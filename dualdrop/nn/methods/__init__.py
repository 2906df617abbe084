"""The sparsification methods, one family per module or folder.

``vardrop/`` (variational dropout: ``vardrop``, ``vardrop-lr``, ``vardrop-lr-ar``),
``hardconcrete/`` (L0 gates per weight or per neuron), ``penalty/`` (the eta-trick family and
the catalog penalties: ``eta-trick``, ``adaprox``, ``adatikhonov``, ``logsum``,
``penalty:<name>``) and ``magnitude`` (gradual magnitude pruning). A family folder holds
``method.py`` (the ``Method`` records, the per-weight state and the reference implementation in
plain torch) and ``fused.py`` (numba loops drawing the same counter-based noise). Imports run
one way: method -> fused -> shared machinery (``dualdrop.nn._numba``, ``_noise``, ``_gradhook``)
-> ``penalties``. The records by name are ``dualdrop.nn.registry``.
"""

