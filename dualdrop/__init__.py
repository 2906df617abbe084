"""dualdrop: adaptive dropout as regularized empirical risk minimization.

Subpackages (one per architectural layer):

- ``penalties`` (a separate top-level package): the numeric core, no torch.
- ``dualdrop.linear``: datafits, solvers and scikit-learn estimators.
- ``dualdrop.nn``: wrappers that sparsify an existing ``torch.nn.Module``.
- ``dualdrop.data``: dataset loaders (MNIST IDX files, embedded digits).
- ``dualdrop.train``: training loops, checkpoints, comparisons.
- ``dualdrop.cli``: the ``dualdrop`` command line.

Importing ``dualdrop`` itself does not import torch.
"""

__version__ = "0.2.0"
