"""How gradient noise sits relative to curvature: the escaping indicator and the alignment.

**Escaping indicator** (Zhu, Wu, Yu, Wu, Ma, "The Anisotropic Noise in Stochastic Gradient Descent",
ICML 2019).  Near a minimum, for ``theta <- theta - lr (grad L + eps)`` with ``eps ~ N(0, Sigma)``,
the expected loss increase per step is ``(lr^2 / 2) Tr(H Sigma)``: the noise escapes a basin in
proportion to ``Tr(H Sigma)``.  Isotropic noise of the same total variance,
``Sigma_bar = Tr(Sigma)/D * I``, gives ``Tr(H Sigma_bar) = Tr(Sigma) Tr(H) / D``; the ratio
``Tr(H Sigma) / Tr(H Sigma_bar)`` measures how much the noise's *structure* helps escaping (1 for
isotropic noise, up to ``D lambda_1 / Tr(H)`` when all variance sits on the top eigenvector).

**Alignment** (as in Zhang, Xu et al., "Stochastic Modified Equations and Dynamics of Dropout
Algorithm", ICLR 2024).  The cosine ``<H, S>_F / (||H||_F ||S||_F)``, and the top-``k`` eigenspace
overlap ``||V_H^T V_S||_F^2 / k`` (1 for equal top-``k`` eigenspaces, about ``k / D`` for random
ones).  Its null model keeps both spectra and draws ``S``'s eigenvectors Haar-uniformly:
``S_0 = Q diag(s) Q^T``; since ``E[Q A Q^T] = Tr(A)/D * I``, the null mean of ``<H, S_0>`` is
``Tr(H) Tr(S) / D``, the same quantity as ``Tr(H Sigma_bar)`` above, and its variance has a closed
form too (``alignment``'s docstring), which gives a p-value bound without sampling D x D rotations.
Above the dense limit ``||H||_F`` is estimated exactly on ``range(Sigma)`` and by Hutchinson off
it, which keeps the cosine in ``[-1, 1]`` (``docs/diagnostics.md``, section 1).

``H`` may be a dense matrix or a :class:`~dualdrop.diagnostics.HessianOperator`; ``Sigma`` a dense
matrix or a :class:`~dualdrop.diagnostics.LowRankCov`. A dense matrix is a ``torch.Tensor`` or any
array-like of numbers (a NumPy array, a SciPy sparse matrix, nested lists), converted once to a
float64 tensor: the computations are torch's either way.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from dualdrop.diagnostics._core import DENSE_LIMIT, HessianOperator, LowRankCov, hessian_eigs


def _as_matrix(M, name):
    """``M`` itself when it is a tensor or an operator, else a float64 tensor of the array-like
    (converted once here, so that the rest of the module sees tensors and operators only)."""
    if isinstance(M, (torch.Tensor, HessianOperator, LowRankCov)):
        return M
    if hasattr(M, "toarray"):  # a SciPy sparse matrix
        M = M.toarray()
    try:
        arr = np.asarray(M, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a square matrix (a torch.Tensor or an array-like of "
                        f"numbers, e.g. a NumPy array), a HessianOperator or a LowRankCov, got "
                        f"{type(M).__name__}") from err
    return torch.from_numpy(np.ascontiguousarray(arr))


def _dim(M, name):
    if isinstance(M, torch.Tensor):
        if M.ndim != 2 or M.shape[0] != M.shape[1]:
            raise ValueError(f"{name} must be a square matrix, got shape {tuple(M.shape)}")
        return M.shape[0]
    if isinstance(M, (HessianOperator, LowRankCov)):
        return M.shape[0]
    raise TypeError(f"{name} must be a torch.Tensor, HessianOperator or LowRankCov, got "
                    f"{type(M).__name__}")


def _check_pair(H, Sigma):
    """``(H, Sigma, D)``: array-likes converted to tensors, kinds and shapes checked."""
    H, Sigma = _as_matrix(H, "H"), _as_matrix(Sigma, "Sigma")
    if isinstance(H, LowRankCov):
        raise TypeError("H must be a dense tensor or a HessianOperator (a LowRankCov is PSD "
                        "noise, not a Hessian)")
    if isinstance(Sigma, HessianOperator):
        raise TypeError("Sigma must be a dense tensor or a LowRankCov")
    D, D2 = _dim(H, "H"), _dim(Sigma, "Sigma")
    if D != D2:
        raise ValueError(f"H is {D} x {D} but Sigma is {D2} x {D2}")
    return H, Sigma, D


def _trace(M, probes=30):
    if isinstance(M, torch.Tensor):
        return float(torch.diagonal(M).sum())
    return float(M.trace(probes) if isinstance(M, HessianOperator) else M.trace())


def _frob2(M, probes=30):
    if isinstance(M, torch.Tensor):
        return float((M.double() ** 2).sum())
    return float(M.frob2(probes) if isinstance(M, HessianOperator) else M.frob2())


def _inner(H, Sigma):
    """``<H, Sigma>_F = Tr(H Sigma)`` for symmetric ``H``, without forming D x D above the limit."""
    if isinstance(Sigma, LowRankCov):
        U = Sigma.U
        HU = H @ U if isinstance(H, torch.Tensor) else H.matvec(U)
        return float((HU.double() * U.double()).sum())
    if isinstance(H, HessianOperator):
        raise ValueError("Tr(H Sigma) with a matrix-free H needs Sigma as a LowRankCov (pass "
                         "dense=False to the covariance function)")
    return float((H.double() * Sigma.double()).sum())


def escape_indicator(H, Sigma, *, probes: int = 30, trace_h: float | None = None,
                     tr_h_sigma: float | None = None) -> dict:
    """``Tr(H Sigma)``, its isotropic counterpart ``Tr(H Sigma_bar)`` and their ratio.

    Returns ``{"trace": Tr(H Sigma), "isotropic": Tr(Sigma) Tr(H) / D, "ratio": trace/isotropic,
    "trace_sigma": Tr(Sigma), "trace_h": Tr(H)}``.  With a :class:`HessianOperator`, ``Tr(H)`` is a
    Hutchinson estimate from ``probes`` probes (so ``isotropic`` and ``ratio`` are estimates);
    pass ``trace_h`` (and ``tr_h_sigma``, e.g. ``alignment(...)["inner"]``) to reuse values already
    computed.
    """
    H, Sigma, D = _check_pair(H, Sigma)
    tr_hs = _inner(H, Sigma) if tr_h_sigma is None else float(tr_h_sigma)
    tr_s = _trace(Sigma)
    tr_h = _trace(H, probes) if trace_h is None else float(trace_h)
    iso = tr_s * tr_h / D
    return {"trace": tr_hs, "isotropic": iso, "ratio": tr_hs / iso if iso != 0 else float("nan"),
            "trace_sigma": tr_s, "trace_h": tr_h}


def _top_eig(M, k):
    """Top-k eigenpairs (decreasing) of a dense symmetric matrix, a LowRankCov or an operator."""
    if isinstance(M, torch.Tensor):
        w, V = torch.linalg.eigh(M.double())
        return w.flip(0)[:k], V.flip(1)[:, :k]
    if isinstance(M, LowRankCov):
        w, V = M.eigh()
        return w[:k].double(), V[:, :k].double()
    return hessian_eigs(M, None, None, None, k)


def _haar(D, r, rng):
    """``r`` columns of a Haar-distributed orthogonal ``D x D`` matrix (QR with the sign fix)."""
    Q, R = np.linalg.qr(rng.standard_normal((D, r)))
    return Q * np.sign(np.diag(R))


def alignment(H, Sigma, *, k: int = 5, null_samples: int = 200, seed: int = 0,
              probes: int = 30, h_eigs=None, h_frob2: float | None = None,
              trace_h: float | None = None) -> dict:
    """Cosine and top-``k`` eigenspace overlap of ``Sigma`` with ``H``, against a spectral null.

    Returns ``{"cosine", "inner" (= Tr(H Sigma)), "overlap", "energy", "null_mean", "null_std",
    "null_cosines", "p_value", "null_mean_exact", "null_std_exact", "p_value_bound"}`` where
    ``energy = Tr(P_k Sigma) / Tr(Sigma)`` is the share of the noise's variance inside ``H``'s
    top-``k`` eigenspace, and the null draws ``null_samples`` matrices ``Q diag(spec(Sigma)) Q^T``
    with Haar ``Q``;
    ``p_value = (1 + #{null cosine >= cosine}) / (1 + null_samples)``.

    Closed forms, at any size: the null mean ``Tr(H) Tr(S) / (D ||H|| ||S||)``, the null standard
    deviation from ``Var <H, Q A Q^T> = 2 (||H||^2 - Tr(H)^2/D)(||A||^2 - Tr(A)^2/D) /
    ((D-1)(D+2))`` (Haar orthogonal ``Q``), and ``p_value_bound``, Cantelli's one-sided bound
    ``var / (var + (cos - mean)^2)`` (1 when the cosine is below the null mean): a valid,
    conservative p-value that needs no sampling.

    The sampled null needs ``H`` dense (``D <= DENSE_LIMIT``); with a matrix-free ``H`` only the
    closed forms are reported and a warning says the sampled null was skipped.  With a
    matrix-free ``H`` and a :class:`LowRankCov` ``Sigma``, ``||H||_F^2`` is estimated by
    :meth:`HessianOperator.frob2` split on ``range(Sigma)`` (exact there, Hutchinson with
    ``probes`` probes off it), which keeps the cosine in ``[-1, 1]`` (``h_frob2`` is then not
    used); a plain Hutchinson estimate of ``||H||_F`` can undershoot and give cosines above 1.
    ``h_eigs=(values, vectors)`` (from :func:`hessian_eigs`), ``h_frob2`` (the exact value) and
    ``trace_h`` reuse quantities of ``H`` already computed.
    """
    H, Sigma, D = _check_pair(H, Sigma)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < D:
        raise ValueError(f"k={k!r}; expected an int in [1, D={D})")
    if isinstance(null_samples, bool) or not isinstance(null_samples, int) or null_samples < 0:
        raise ValueError(f"null_samples={null_samples!r}; expected an int >= 0")
    tr_h = _trace(H, probes) if trace_h is None else float(trace_h)
    tr_s, ns2 = _trace(Sigma), _frob2(Sigma)
    if isinstance(Sigma, LowRankCov):
        # Sigma = Q diag(s) Q^T: <H, Sigma> = sum_j s_j q_j^T H q_j from H Q, which also gives
        # the part of ||H||_F^2 on range(Sigma) exactly (see HessianOperator.frob2)
        s, Qs = Sigma.eigh()
        HQ = H @ Qs.to(H.dtype) if isinstance(H, torch.Tensor) else H.matvec(Qs)
        inner = float((s.double() * (Qs.double() * HQ.double()).sum(0)).sum())
        ws, Vs = s[:k].double(), Qs[:, :k].double()
        if isinstance(H, HessianOperator):
            nh2 = H.frob2(probes, seed, basis=(Qs, HQ))
        else:
            nh2 = _frob2(H) if h_frob2 is None else float(h_frob2)
    else:
        inner = _inner(H, Sigma)
        ws, Vs = _top_eig(Sigma, k)
        nh2 = _frob2(H, probes) if h_frob2 is None else float(h_frob2)
    nh, ns = np.sqrt(nh2), np.sqrt(ns2)
    cos = inner / (nh * ns) if nh * ns > 0 else float("nan")
    if h_eigs is not None:
        wh, Vh = h_eigs
        if Vh.shape != (D, k):
            raise ValueError(f"h_eigs vectors must have shape ({D}, {k}), got {tuple(Vh.shape)}")
    else:
        wh, Vh = _top_eig(H, k)
    overlap = float((Vh.T.double() @ Vs.double()).pow(2).sum()) / k if tr_s > 0 else float("nan")
    if isinstance(Sigma, LowRankCov):
        energy = float((Vh.T.double() @ Sigma.U.double()).pow(2).sum())
    else:
        energy = float((Vh.T.double() @ Sigma.double() @ Vh.double()).diagonal().sum())
    energy = energy / tr_s if tr_s > 0 else float("nan")  # Sigma = 0: no direction to share
    # the null's exact mean and variance (Haar Q, fixed spectra); Cantelli's one-sided bound
    # P(X - mu >= t) <= var / (var + t^2) turns them into a valid p-value without sampling
    null_mean = tr_h * tr_s / (D * nh * ns) if nh * ns > 0 else float("nan")
    var = (2 * max(nh2 - tr_h ** 2 / D, 0.0) * max(ns2 - tr_s ** 2 / D, 0.0)
           / ((D - 1) * (D + 2))) / (nh2 * ns2) if nh * ns > 0 else float("nan")
    t = cos - null_mean
    out = {"cosine": cos, "inner": inner, "overlap": overlap, "energy": energy,
           "null_mean_exact": null_mean,
           "null_std_exact": float(np.sqrt(var)),
           "p_value_bound": (float("nan") if t != t else float(var / (var + t * t)) if t > 0
                             else 1.0),
           "null_mean": float("nan"), "null_std": float("nan"), "null_cosines": [],
           "p_value": float("nan")}
    if null_samples == 0:
        return out
    if isinstance(H, HessianOperator) or D > DENSE_LIMIT:
        warnings.warn(f"alignment: sampled null skipped (D={D}, H matrix-free); only the "
                      "closed forms null_mean_exact, null_std_exact and p_value_bound are "
                      "reported", stacklevel=2)
        return out
    if isinstance(Sigma, LowRankCov):
        spec = s.double().numpy()
    else:
        spec = np.clip(torch.linalg.eigvalsh(Sigma.double()).numpy(), 0, None)[::-1]
    spec = spec[spec > spec.max() * 1e-12] if spec.size and spec.max() > 0 else spec
    Hn = H.double().numpy()
    rng = np.random.default_rng(seed)
    null = np.empty(null_samples)
    for t in range(null_samples):
        Q = _haar(D, len(spec), rng)
        null[t] = np.einsum("ij,ij->j", Q, Hn @ Q) @ spec / (nh * ns)
    out.update(null_mean=float(null.mean()), null_std=float(null.std(ddof=1)) if null_samples > 1
               else float("nan"), null_cosines=null.tolist(),
               p_value=float((1 + np.sum(null >= cos)) / (1 + null_samples)))
    return out
