"""One-shot methods: one module per method, each a :class:`~.base.OneShotMethod` turning a layer
problem ``(W0, G, budget)`` into a pruned weight; registered by name in
``dualdrop.nn.oneshot.registry``."""
