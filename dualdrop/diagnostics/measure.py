"""One call that measures a network's noise against its curvature, as plain floats.

``measure`` computes, on a fixed data subset and at the current weights:

* sharpness: the top-``k`` Hessian eigenvalues (Lanczos on Hessian-vector products) and
  Hutchinson estimates of ``Tr(H)`` and ``||H||_F``;
* for the minibatch noise (``sgd_noise_cov`` at ``batch_size``) and for the method's own dropout
  noise (``dropout_noise_cov`` over ``n_samples`` noise draws on the whole subset):
  ``Tr(H Sigma)``, its ratio to isotropic noise of the same trace, the cosine
  ``<H, Sigma>_F / (||H||_F ||Sigma||_F)`` with its random-eigenvector null (closed-form mean,
  standard deviation and Cantelli p-value bound), the top-``k`` eigenspace overlap, and the share
  of the noise's variance inside the Hessian's top-``k`` eigenspace.

Above ``DENSE_LIMIT`` each cosine uses ``||H||_F`` estimated on the split ``range(Sigma)`` (exact)
plus its complement (Hutchinson), which keeps it in ``[-1, 1]``; the reported ``frob_h`` splits
on the top-``k`` eigenspace instead.

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


#: per-noise keys of :func:`measure` (each prefixed ``sgd_`` or ``drop_``)
NOISE_KEYS = ("trace", "trace_sigma", "ratio", "cosine", "null_cosine", "null_std", "p_value",
              "overlap_topk", "energy_topk")


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
            seed: int = 0, population: int | None = None,
            drop_batch_size: int | None = None) -> dict:
    """Noise-vs-curvature summary of ``model`` on ``(X, y)``; a dict of plain floats.

    ``sparsifier`` (the handle ``dualdrop.nn.sparsify`` returned) only labels the result with its
    method; the noise is whatever the sparsified layers draw in train mode.  Keys: ``D``, ``n``,
    ``lambda_1..lambda_k``, ``trace_h``, ``frob_h``, and for ``p`` in ``sgd`` / ``drop``:
    ``{p}_trace`` (``Tr(H Sigma)``), ``{p}_trace_sigma``, ``{p}_ratio``, ``{p}_cosine``,
    ``{p}_null_cosine`` and ``{p}_null_std`` (the random-eigenvector null's mean and standard
    deviation, closed forms), ``{p}_p_value`` (Cantelli's bound on the null's p-value, see
    :func:`~dualdrop.diagnostics.alignment`), ``{p}_overlap_topk`` (top-``k`` eigenspace overlap
    of ``H`` and ``Sigma``), ``{p}_energy_topk``; ``dropout_noise`` is 1.0 when the model draws
    noise.  ``population``: the size of the training set ``(X, y)`` was drawn from, whose
    minibatches of ``batch_size`` the SGD noise describes (:func:`sgd_noise_cov`; ``None``:
    ``(X, y)`` itself, so ``batch_size`` must be below ``n`` for any SGD noise).
    ``drop_batch_size``: measure the dropout noise of the gradient on minibatches of that size
    (:func:`dropout_noise_cov`'s ``batch_size``) instead of on all of ``(X, y)``.
    ``seed`` seeds torch's global generator (the noise draws), the Lanczos start and the
    Hutchinson probes; the caller's RNG state is *not* restored (the training hook,
    ``dualdrop.train.diagnose_hook``, saves and restores it around the call).
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
        # ||H||_F^2 split on the top-k eigenspace (exact there): a lower-variance estimate
        tr_h = H.trace(probes, seed)
        frob2 = H.frob2(probes, seed, basis=(vecs.to(fp.theta.dtype),
                                             H.matvec(vecs.to(fp.theta.dtype))))
    out = {"D": float(fp.dim), "n": float(X.shape[0]), "trace_h": tr_h, "frob_h": math.sqrt(frob2)}
    out.update({f"lambda_{i + 1}": float(v) for i, v in enumerate(vals)})
    if sparsifier is not None:
        out["method"] = getattr(sparsifier, "method", str(sparsifier))
    covs = {"sgd": sgd_noise_cov(model, loss_fn, X, y, batch_size, params=params, dense=False,
                                 population=population)}
    try:
        covs["drop"] = dropout_noise_cov(model, loss_fn, X, y, n_samples=n_samples, params=params,
                                         dense=False, seed=seed, batch_size=drop_batch_size)
        out["dropout_noise"] = 1.0
    except ValueError:
        out["dropout_noise"] = 0.0
        out.update({f"drop_{key}": float("nan") for key in NOISE_KEYS})
    for name, S in covs.items():
        al = alignment(H, S, k=k, null_samples=0, h_eigs=(vals.to(S.U.dtype), vecs.to(S.U.dtype)),
                       h_frob2=frob2 if dense else None, trace_h=tr_h, probes=probes, seed=seed)
        ind = escape_indicator(H, S, trace_h=tr_h, tr_h_sigma=al["inner"])
        out.update({f"{name}_trace": ind["trace"], f"{name}_trace_sigma": ind["trace_sigma"],
                    f"{name}_ratio": ind["ratio"], f"{name}_cosine": float(al["cosine"]),
                    f"{name}_null_cosine": float(al["null_mean_exact"]),
                    f"{name}_null_std": float(al["null_std_exact"]),
                    f"{name}_p_value": float(al["p_value_bound"]),
                    f"{name}_overlap_topk": float(al["overlap"]),
                    f"{name}_energy_topk": al["energy"]})
    return out
