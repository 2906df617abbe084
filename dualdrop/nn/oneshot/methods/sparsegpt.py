"""SparseGPT (Frantar & Alistarh, "SparseGPT: Massive language models can be accurately pruned
in one-shot", ICML 2023): the Optimal Brain Surgeon update, swept over the columns.

With ``H = G + damp * mean(diag G) I`` (the damped input Gram), removing weight ``q`` of a row
``w`` and letting the other weights of a set ``F`` absorb the loss is Optimal Brain Surgeon
(Hassibi & Stork 1993) on ``F``:

    dw_F = -(w_q / [H_F^{-1}]_qq) (H_F^{-1})_{:, q},    loss  w_q^2 / [H_F^{-1}]_qq.

SparseGPT visits the columns in order and lets only the columns not yet visited absorb each
loss, so every row sees the same sequence of sets ``F = {j, ..., in - 1}`` and the inverses
``H_F^{-1}`` all come from one upper Cholesky factor ``U`` of ``H^{-1}`` (``H^{-1} = U^T U``):
``[H_F^{-1}]_jj = U_jj^2`` and ``(H_F^{-1})_{j, F} = U_jj U_{j, F}``, so the update of column ``j``
is ``W[:, F] -= (W[:, j] / U_jj) U_{j, F}``, for all rows at once. Two devices of the paper:

- *lazy batch updates*: columns are processed in blocks of ``blocksize``; inside a block the
  updates touch the block only, and the rest of the matrix gets the block's accumulated errors
  in one product (same result, fewer passes over memory);
- *adaptive mask selection*: the weights to remove are chosen block by block from the OBS
  loss ``w^2 / U_jj^2`` of the weights as updated so far: at the start of each block over its
  ``out x blocksize`` weights (each block removes its share of the layer's budget, exactly,
  in proportion to its columns), and for N:M at the start of each group of M columns (the M-N
  lowest of the group in each row).

Inputs never seen on the calibration data (``G_jj = 0``) get ``H_jj = 1`` and are removed first
(their weights cost nothing on these data); at full density nothing is removed and ``W0`` is
returned. ``damp=0`` takes ``G`` as it is (it must then be positive definite).
"""

from __future__ import annotations

import torch

from dualdrop.nn.oneshot.methods.base import (Budget, OneShotMethod, check_damp, select_mask,
                                              split_count)
from penalties.checks import check_int


class SparseGPT(OneShotMethod):
    """OBS sweep over the columns with lazy batch updates and block-wise mask selection."""

    name = "sparsegpt"
    defaults = {"blocksize": 128, "damp": 0.01}

    def _validate(self, opts):
        opts["blocksize"] = check_int("blocksize", opts["blocksize"], low=1)
        opts["damp"] = check_damp(opts["damp"])
        return opts

    def _prune(self, W0: torch.Tensor, G: torch.Tensor, budget: Budget) -> torch.Tensor:
        out, inp = W0.shape
        W = W0.clone()
        if budget.keep_count(W0.shape) == out * inp:
            return W
        U = inverse_cholesky(G, self.options["damp"])
        dead = G.diagonal() <= 0
        bs = self.options["blocksize"]
        if budget.pattern is not None and bs % budget.pattern[1]:
            bs = max(budget.pattern[1], bs - bs % budget.pattern[1])  # blocks of whole groups
        starts = list(range(0, inp, bs))
        if budget.n_keep is not None:
            widths = [min(bs, inp - s) for s in starts]
            prune_counts = split_count(out * inp - budget.n_keep, [out * c for c in widths])
        for b, i1 in enumerate(starts):
            i2 = min(i1 + bs, inp)
            W1, U1 = W[:, i1:i2], U[i1:i2, i1:i2]
            err = torch.zeros_like(W1)
            if budget.n_keep is not None:
                keep = ~_lowest(_obs_loss(W1, U1.diagonal(), dead[i1:i2]), prune_counts[b])
            else:
                keep = torch.ones_like(W1, dtype=torch.bool)
            m = budget.pattern[1] if budget.pattern is not None else None
            for j in range(i2 - i1):
                if m is not None and j % m == 0:
                    loss = _obs_loss(W1[:, j:j + m], U1.diagonal()[j:j + m], dead[i1 + j:i1 + j + m])
                    keep[:, j:j + m] = select_mask(loss, budget)
                w = W1[:, j]
                e = torch.where(keep[:, j], torch.zeros_like(w), w) / U1[j, j]
                W1[:, j:] -= e.unsqueeze(1) * U1[j, j:].unsqueeze(0)
                W1[:, j] = torch.where(keep[:, j], W1[:, j], torch.zeros_like(w))
                err[:, j] = e
            W[:, i2:] -= err @ U[i1:i2, i2:]
        return W


def inverse_cholesky(G: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor ``U`` of ``H^{-1}`` (``H^{-1} = U^T U``), ``H = G + damp *
    mean(diag G) I`` with unseen inputs' diagonal set to 1."""
    H = G.clone()
    diag = H.diagonal()
    live = diag > 0
    mean = float(diag[live].mean()) if bool(live.any()) else 1.0
    diag[~live] = 1.0
    diag += damp * mean
    try:
        L = torch.linalg.cholesky(H)
    except RuntimeError:
        raise ValueError("the input Gram is singular (inputs collinear on the calibration "
                         "data): use damp > 0 (the default 0.01) or more calibration samples") \
            from None
    del H, diag  # one in^2 matrix alive at a time besides G (a 5632-wide layer: 254 MB each)
    Hinv = torch.cholesky_inverse(L)
    del L
    return torch.linalg.cholesky(Hinv, upper=True)


def _obs_loss(W1, d, dead):
    """OBS loss of removing each weight, ``w^2 / d^2``; unseen inputs -1 (removed first)."""
    loss = W1 ** 2 / d.unsqueeze(0) ** 2
    return torch.where(dead.unsqueeze(0), torch.full_like(loss, -1.0), loss)


def _lowest(loss, k):
    """Boolean mask of the ``k`` lowest entries of ``loss`` (ties to the lower index)."""
    flat = loss.reshape(-1)
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=loss.device)
    mask[torch.sort(flat, stable=True).indices[:k]] = True
    return mask.view_as(loss)
