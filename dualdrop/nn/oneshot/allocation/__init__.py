"""How much of the network each layer keeps: the allocations of one-shot pruning.

- :mod:`~dualdrop.nn.oneshot.allocation.weights`: single weights. The one density-to-count rule
  (``kept_total``: ``round(density * total)`` over the prunable weights of the pruned layers,
  split exactly) and each layer's share of it (``"uniform"``, ``"global"``, ``"owl"``,
  ``"penalty"``).
- :mod:`~dualdrop.nn.oneshot.allocation.units`: whole units (neurons, channels, heads): how many
  units each consumer keeps under a ceiling on a cost of the kept units (``"uniform"``,
  ``"flap"``, ``"penalty"``).
- :mod:`~dualdrop.nn.oneshot.allocation.latency`: the measured latency table behind
  ``target_speedup`` (the cost the units' allocation prices), and the correction of the
  predicted speed-up against the compact model's measured one.

This package imports none of its modules on purpose (each pulls in the methods it allocates
with); import the one you need.
"""
