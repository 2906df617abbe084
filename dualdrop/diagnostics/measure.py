"""One call that measures a network's noise against its curvature, as plain floats.

``measure`` computes, on a fixed data subset and at the current weights:

* sharpness: the top-``k`` Hessian eigenvalues (Lanczos on Hessian-vector products) and
  Hutchinson estimates of ``Tr(H)`` and ``||H||_F``;
* for the minibatch noise (``sgd_noise_cov`` at ``batch_size``) and for the method's own dropout
  noise (``dropout_noise_cov`` over ``n_samples`` noise draws on the whole subset):
  ``Tr(H Sigma)``, its ratio to isotropic noise of the same trace, the cosine
  ``<H, Sigma>_F / (||H||_F ||Sigma||_F)`` with its random-eigenvector null mean, and the share of
  the noise's variance inside the Hessian's top-``k`` eigenspace.

Derivatives are taken with respect to the network's weights and biases only (a method's own noise
parameters such as ``log_alpha`` are held fixed), with the model in eval mode for ``H`` and the SGD
noise (the method's deterministic test-time network) and in train mode for the dropout noise.
A method that draws no noise in training (the eta-trick family, magnitude pruning, a dense
network) gets ``nan`` dropout entries and ``dropout_noise = 0``.
"""

from __future__ import annotations

import math

import torch

from dualdrop.diagnostics._core import (DENSE_LIMIT, FlatParams, HessianOperator,
                                        dropout_noise_cov, hessian, hessian_eigs, sgd_noise_cov)
from dualdrop.diagnostics.indicators import alignment, escape_indicator


def weights_and_biases(name: str) -> bool:
    """Default parameter selection of :func:`measure`: ``*.weight`` and ``*.bias``, also when a
    ``dualdrop.nn`` method parametrizes them (``*.parametrizations.weight.original``: the tensor
    the optimizer trains)."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] == "original" and parts[-3] == "parametrizations":
        return parts[-2] in ("weight", "bias")
    return parts[-1] in ("weight", "bias")


def measure(model, loss_fn, X, y, sparsifier=None, *, k: int = 5, batch_size: int = 128,
            n_samples: int = 64, probes: int = 20, params=weights_and_biases,
            seed: int = 0) -> dict:
    """Noise-vs-curvature summary of ``model`` on ``(X, y)``; a dict of plain floats.

    ``sparsifier`` (the handle ``dualdrop.nn.sparsify`` returned) only labels the result with its
    method; the noise is whatever the sparsified layers draw in train mode.  Keys: ``D``, ``n``,
    ``lambda_1..lambda_k``, ``trace_h``, ``frob_h``, and for ``p`` in ``sgd`` / ``drop``:
    ``{p}_trace`` (``Tr(H Sigma)``), ``{p}_trace_sigma``, ``{p}_ratio``, ``{p}_cosine``,
    ``{p}_null_cosine``, ``{p}_energy_topk``; ``dropout_noise`` is 1.0 when the model draws noise.
    ``seed`` seeds torch's global generator (the noise draws) and the Lanczos start.
    """
    torch.manual_seed(seed)
    fp = FlatParams(model, params)
    dense = fp.dim <= DENSE_LIMIT
    H = hessian(model, loss_fn, X, y, params=params) if dense else HessianOperator(
        model, loss_fn, X, y, params=params)
    if dense:
        w, V = torch.linalg.eigh(H.double())
        vals, vecs = w.flip(0)[:k], V.flip(1)[:, :k]
        tr_h, frob2 = float(H.trace()), float((H.double() ** 2).sum())
    else:
        vals, vecs = hessian_eigs(H, None, None, None, k, seed=seed)
        tr_h, frob2 = H.trace(probes, seed), H.frob2(probes, seed)
    out = {"D": float(fp.dim), "n": float(X.shape[0]), "trace_h": tr_h, "frob_h": math.sqrt(frob2)}
    out.update({f"lambda_{i + 1}": float(v) for i, v in enumerate(vals)})
    if sparsifier is not None:
        out["method"] = getattr(sparsifier, "method", str(sparsifier))
    covs = {"sgd": sgd_noise_cov(model, loss_fn, X, y, min(batch_size, X.shape[0]),
                                 params=params, dense=False)}
    try:
        covs["drop"] = dropout_noise_cov(model, loss_fn, X, y, n_samples=n_samples, params=params,
                                         dense=False, seed=seed)
        out["dropout_noise"] = 1.0
    except ValueError:
        out["dropout_noise"] = 0.0
        out.update({f"drop_{key}": float("nan") for key in
                    ("trace", "trace_sigma", "ratio", "cosine", "null_cosine", "energy_topk")})
    for name, S in covs.items():
        ind = escape_indicator(H, S, trace_h=tr_h)
        al = alignment(H, S, k=k, null_samples=0, h_eigs=(vals.to(S.U.dtype), vecs.to(S.U.dtype)),
                       h_frob2=frob2, trace_h=tr_h)
        out.update({f"{name}_trace": ind["trace"], f"{name}_trace_sigma": ind["trace_sigma"],
                    f"{name}_ratio": ind["ratio"], f"{name}_cosine": float(al["cosine"]),
                    f"{name}_null_cosine": float(al["null_mean_exact"]),
                    f"{name}_energy_topk": al["energy"]})
    return out
