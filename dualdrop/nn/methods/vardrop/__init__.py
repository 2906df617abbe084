"""The vardrop family: ``method`` (records, state, reference torch forms) and ``fused`` (numba loops)."""
