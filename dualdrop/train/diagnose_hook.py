"""Noise diagnostics during training: ``--diagnose-every K``.

Every ``K`` epochs, and after the last one, :func:`diagnose_row` runs
:func:`dualdrop.diagnostics.measure` on the current weights and returns its numbers as flat
``diag_*`` columns of that epoch's history row (``history.json`` / ``history.csv``): the top
Hessian eigenvalues (sharpness), and for the minibatch (SGD) noise and the method's own dropout
noise ``Tr(H Sigma)``, its ratio to isotropic noise of the same variance, the Hessian--noise
cosine with its random-eigenvector null (mean, standard deviation, Cantelli p-value bound) and
the top-``k`` eigenspace overlap.  The math is in ``docs/diagnostics.md``.

Why the measurement cannot change the run.  ``measure`` seeds torch's global generator (for the
dropout-noise draws), runs forward passes in train mode and reads the weights through
``functional_call``.  The hook saves every random state the training uses (torch's CPU and, on
CUDA, device generator, numpy's and Python's global ones) and restores them afterwards, and
``measure`` restores the model's train/eval mode; the weights, the optimizer and the data order
are never written.  A run with the hook therefore has bit-identical weights to one without, and
since the rows are part of the history stored in each checkpoint, a resumed run writes the same
history as an uninterrupted one.  The hook's options are not part of the run's identity
(``run_config``): a run may be resumed with or without it.

The data: a fixed subset of the *validation* split (never the test set), the first
``diagnose_samples`` points of a permutation drawn from the run's seed, so the same points are
measured at every epoch and across methods trained with that seed.  Cost: about ``n``
Hessian-vector products on ``n`` points for the SGD noise plus ``NOISE_DRAWS`` noisy gradients;
on LeNet-300-100 with ``n = 256`` 20-50 s on one CPU thread of a loaded machine.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from dualdrop.nn._base import preserved_noise
from dualdrop.train.checkpoint import rng_state, set_rng_state

#: dropout-noise draws per measurement (the covariance has rank < NOISE_DRAWS)
NOISE_DRAWS = 64
#: top Hessian eigenpairs (sharpness and the eigenspace of the overlap)
TOP_K = 5
#: prefix of the history columns the hook writes
PREFIX = "diag_"


def check_options(every, samples) -> None:
    """``ValueError`` unless ``every`` is None or an int >= 1 and ``samples`` an int >= 2."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"diagnose_every={every!r}; expected an int >= 1 (measure every K "
                         "epochs) or None (off)")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise ValueError(f"diagnose_samples={samples!r}; expected an int >= 2 (size of the fixed "
                         "validation subset the diagnostics use)")


def due(epoch: int, every: int | None, epochs: int) -> bool:
    """Whether the hook runs after ``epoch`` (1-based): every ``every`` epochs and at the end."""
    return every is not None and (epoch % every == 0 or epoch == epochs)


def subset(n_val: int, samples: int, seed: int) -> np.ndarray:
    """Indices of the fixed validation subset: ``min(samples, n_val)`` of a seeded permutation."""
    rng = np.random.default_rng([int(seed), 0x5EED])
    return np.sort(rng.permutation(n_val)[:min(samples, n_val)])


def diagnose_row(model, sparsifier, X_val: torch.Tensor, y_val: torch.Tensor, *, samples: int,
                 seed: int, batch_size: int, n_train: int, device: torch.device) -> dict:
    """``diag_*`` columns for the current weights; every random state (torch's, numpy's, Python's
    and the methods' noise streams) is left as it was.

    The SGD noise is that of the run's minibatches: ``batch_size`` of ``n_train`` points, its
    per-sample covariance estimated on the subset (``population=n_train``)."""
    from dualdrop.diagnostics import measure

    t0 = time.perf_counter()
    idx = torch.from_numpy(subset(len(y_val), samples, seed)).to(X_val.device)
    X, y = X_val[idx], y_val[idx]
    population = max(n_train, len(idx))
    state = rng_state(device)
    try:
        # a batch as large as the training set is full-batch descent: no SGD noise (nan ratios)
        with preserved_noise(model):  # the methods' noise streams too
            res = measure(model, F.cross_entropy, X, y, sparsifier, k=TOP_K,
                          batch_size=min(batch_size, population), n_samples=NOISE_DRAWS,
                          seed=seed, population=population)
    finally:
        set_rng_state(state, device)
    row = {f"{PREFIX}{k}": float(v) for k, v in res.items() if k != "method"}
    row[f"{PREFIX}seconds"] = time.perf_counter() - t0
    return row
