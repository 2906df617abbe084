"""Flat-parameter views of a model, its Hessian, and the two gradient-noise covariances.

Every diagnostic here is about the loss as a function of one flat parameter vector
``theta in R^D`` (the concatenation of the selected parameters, in ``named_parameters`` order):

* the Hessian ``H = d^2 L / d theta^2`` -- dense (from chunks of Hessian-vector products) while
  ``D <= DENSE_LIMIT``, and as a matrix-free operator (Hessian-vector products, ``jvp`` of
  ``grad``) at any size;
* the minibatch (SGD) gradient-noise covariance and the dropout gradient-noise covariance, both
  returned dense while ``D <= DENSE_LIMIT`` and otherwise as a :class:`LowRankCov` factor
  ``Sigma = U U^T`` with ``U`` of shape ``(D, r)``.  Nothing of size ``D x D`` is ever built above
  the limit; ask for such a matrix and a ``ValueError`` says what to use instead.

Losses are evaluated with the model in **eval mode** for ``H`` and the SGD noise (the noiseless
loss ``L``) and in **train mode** for the dropout noise (each forward draws the method's noise);
the model's mode is restored afterwards.  ``loss_fn(output, y)`` must return the mean loss over the
batch, e.g. ``torch.nn.functional.cross_entropy``.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

from dualdrop.nn._base import preserved_noise

#: largest parameter count for which a D x D matrix is materialized (5,000 -> 100 MB in float32)
DENSE_LIMIT = 5000


# --------------------------------------------------------------------------- parameters
def _check_model(model, loss_fn, X, y):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(output, y) -> mean loss")
    for name, v in (("X", X), ("y", y)):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(v).__name__}")
    if X.shape[0] != y.shape[0] or X.shape[0] < 1:
        raise ValueError(f"X and y must have the same positive number of rows, got {X.shape[0]} "
                         f"and {y.shape[0]}")


def select_params(model: nn.Module, params=None) -> list[str]:
    """Names of the parameters the diagnostics differentiate with respect to.

    ``params=None`` takes every parameter with ``requires_grad``; otherwise ``params`` is a list of
    names from ``model.named_parameters()`` (or a callable ``name -> bool``).
    """
    named = dict(model.named_parameters())
    if params is None:
        names = [k for k, v in named.items() if v.requires_grad]
    elif callable(params):
        names = [k for k in named if params(k)]
    else:
        names = list(params)
        bad = [k for k in names if k not in named]
        if bad:
            raise ValueError(f"params: {bad} are not parameters of the model; its parameters are "
                             f"{list(named)}")
    if not names:
        raise ValueError("params selects no parameter of the model")
    return names


class FlatParams:
    """The selected parameters of ``model`` as one vector, and the loss as a function of it."""

    def __init__(self, model: nn.Module, params=None):
        self.model = model
        self.names = select_params(model, params)
        named = dict(model.named_parameters())
        self.shapes = [named[k].shape for k in self.names]
        self.sizes = [named[k].numel() for k in self.names]
        self.theta = torch.cat([named[k].detach().reshape(-1) for k in self.names])
        self.fixed = {k: v.detach() for k, v in named.items() if k not in self.names}
        self.fixed.update(dict(model.named_buffers()))
        self.dim = int(self.theta.numel())

    def unflatten(self, theta: torch.Tensor) -> dict:
        out = dict(self.fixed)
        for k, piece, shape in zip(self.names, torch.split(theta, self.sizes), self.shapes):
            out[k] = piece.reshape(shape)
        return out

    def loss(self, theta, loss_fn, X, y):
        return loss_fn(functional_call(self.model, self.unflatten(theta), (X,)), y)

    def per_sample_grads(self, loss_fn, X, y, chunk: int = 256) -> torch.Tensor:
        """Rows ``g_i = grad_theta loss(f(x_i), y_i)``, shape ``(n, D)`` (``vmap(grad)``)."""

        def one(theta, xi, yi):
            return self.loss(theta, loss_fn, xi.unsqueeze(0), yi.unsqueeze(0))

        g = vmap(grad(one), in_dims=(None, 0, 0))
        return torch.cat([g(self.theta, X[i:i + chunk], y[i:i + chunk])
                          for i in range(0, X.shape[0], chunk)])


@contextmanager
def _mode(model: nn.Module, train: bool):
    was = model.training
    model.train(train)
    try:
        yield
    finally:
        model.train(was)


def _refuse_dense(D: int, what: str, instead: str):
    if D > DENSE_LIMIT:
        raise ValueError(f"{what}: the model has D={D} parameters, above DENSE_LIMIT={DENSE_LIMIT} "
                         f"(a D x D matrix would take {D * D * 4 / 2**20:.0f} MB); use {instead}")


# --------------------------------------------------------------------------- Hessian
def hessian(model, loss_fn, X, y, *, params=None) -> torch.Tensor:
    """Dense Hessian ``(D, D)`` of the noiseless mean loss (model in eval mode).

    Raises ``ValueError`` above ``DENSE_LIMIT`` parameters; use :func:`hessian_eigs` or
    :class:`HessianOperator` there.
    """
    _check_model(model, loss_fn, X, y)
    fp = FlatParams(model, params)
    _refuse_dense(fp.dim, "hessian", "hessian_eigs(model, loss_fn, X, y, k) or HessianOperator")
    op = HessianOperator(model, loss_fn, X, y, params=params)
    eye = torch.eye(fp.dim, dtype=fp.theta.dtype)
    H = op.matvec(eye)               # columns H e_j, computed in vmapped chunks
    return 0.5 * (H + H.T)


class HessianOperator:
    """Matrix-free Hessian of the noiseless mean loss: ``H @ v`` by forward-over-reverse AD.

    ``matvec`` accepts a vector ``(D,)`` or a block ``(D, m)``, vmapped over ``chunk`` columns at a
    time (memory: ``chunk`` copies of the forward pass's activations).  Traces and
    Frobenius norms are Hutchinson estimates with Rademacher probes (``probes`` of them).
    """

    def __init__(self, model, loss_fn, X, y, *, params=None, chunk: int = 32):
        _check_model(model, loss_fn, X, y)
        self.chunk = max(1, int(chunk))
        self.fp = FlatParams(model, params)
        self.model, self.loss_fn, self.X, self.y = model, loss_fn, X, y
        self.shape = (self.fp.dim, self.fp.dim)
        self.n_matvec = 0

    def _grad(self, t):
        return grad(lambda s: self.fp.loss(s, self.loss_fn, self.X, self.y))(t)

    def _hvp(self, v):
        return jvp(self._grad, (self.fp.theta,), (v,))[1]

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        v = v.to(self.fp.theta.dtype)
        with _mode(self.model, False), torch.no_grad():
            if v.ndim == 1:
                self.n_matvec += 1
                return self._hvp(v).detach()
            self.n_matvec += v.shape[1]
            vt = v.T.contiguous()
            hv = vmap(self._hvp)
            rows = [hv(vt[j:j + self.chunk]) for j in range(0, vt.shape[0], self.chunk)]
            return torch.cat(rows).T.detach()

    __matmul__ = matvec

    def _probes(self, probes, seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, 2, (self.fp.dim, probes), generator=g) * 2 - 1).to(
            self.fp.theta.dtype)

    def trace(self, probes: int = 30, seed: int = 0) -> float:
        Z = self._probes(probes, seed)
        return float((Z * self.matvec(Z)).sum() / probes)

    def frob2(self, probes: int = 30, seed: int = 0, basis=None) -> float:
        """Estimate of ``||H||_F^2 = Tr(H^2)``.

        Without ``basis``: Hutchinson, ``E ||H z||^2`` over Rademacher ``z``.  With
        ``basis=(Q, HQ)`` (``Q`` of shape ``(D, m)`` with orthonormal columns, ``HQ = H @ Q``) the
        split ``||H||_F^2 = ||H Q||_F^2 + ||H (I - Q Q^T)||_F^2``: the first part exact, the second
        by Hutchinson on probes projected off ``span(Q)``.  The estimate is then never below
        ``||H Q||_F^2 >= ||Q^T H Q||_F^2``, so for any ``Sigma`` whose range lies in ``span(Q)``
        the Cauchy--Schwarz bound ``|<H, Sigma>_F| <= ||H||_F ||Sigma||_F`` holds with the
        estimate in place of ``||H||_F`` (plain Hutchinson can fall below ``||Q^T H Q||_F`` and
        give cosines above 1); it is unbiased and has a smaller variance when ``span(Q)`` holds
        much of ``H``'s mass.
        """
        if basis is None:
            Z = self._probes(probes, seed)
            return float((self.matvec(Z) ** 2).sum() / probes)
        Q, HQ = basis
        Q = Q.to(self.fp.theta.dtype)
        exact = float((HQ.double() ** 2).sum())
        if probes == 0 or Q.shape[1] >= self.fp.dim:
            return exact
        Z = self._probes(probes, seed)
        Z = Z - Q @ (Q.T @ Z)
        return exact + float((self.matvec(Z).double() ** 2).sum() / probes)


def hessian_eigs(model, loss_fn, X, y, k: int = 5, *, params=None, which: str = "LA",
                 tol: float = 1e-4, seed: int = 0):
    """Top-``k`` eigenpairs of the Hessian by Lanczos (``scipy.sparse.linalg.eigsh``) on HVPs.

    Returns ``(eigenvalues (k,), eigenvectors (D, k))`` sorted by decreasing eigenvalue.
    ``which="LA"`` gives the largest algebraic eigenvalues (sharpness), ``"LM"`` the largest in
    magnitude.  Works at any size; each iteration costs one Hessian-vector product.  ``model``
    may also be a :class:`HessianOperator` already built (``loss_fn, X, y`` are then ignored).
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}; expected a positive int")
    op = model if isinstance(model, HessianOperator) else HessianOperator(
        model, loss_fn, X, y, params=params)
    D = op.fp.dim
    if k >= D:
        raise ValueError(f"k={k} must be below the parameter count D={D}; use hessian() for all "
                         "eigenvalues of a small model")
    dt = op.fp.theta.dtype

    def mv(v):
        return op.matvec(torch.as_tensor(np.asarray(v).reshape(-1), dtype=dt)).double().numpy()

    lin = LinearOperator((D, D), matvec=mv, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(D)
    vals, vecs = eigsh(lin, k=k, which=which, tol=tol, v0=v0)
    order = np.argsort(vals)[::-1]
    return torch.as_tensor(vals[order].copy()), torch.as_tensor(vecs[:, order].copy())


# --------------------------------------------------------------------------- noise covariances
class LowRankCov:
    """A PSD matrix in factor form ``Sigma = U U^T``, ``U`` of shape ``(D, r)``.

    The covariance functions return this above ``DENSE_LIMIT``; the indicators accept it anywhere a
    dense ``Sigma`` is accepted.  ``dense()`` refuses above the limit.
    """

    def __init__(self, U: torch.Tensor):
        if not isinstance(U, torch.Tensor) or U.ndim != 2:
            raise TypeError("U must be a 2-D torch.Tensor of shape (D, r)")
        self.U = U
        self.shape = (U.shape[0], U.shape[0])

    def trace(self) -> float:
        return float((self.U ** 2).sum())

    def frob2(self) -> float:
        G = self.U.T @ self.U
        return float((G ** 2).sum())

    def matvec(self, v):
        return self.U @ (self.U.T @ v)

    def eigh(self):
        """Nonzero spectrum ``(eigenvalues (r,), eigenvectors (D, r))``, decreasing (SVD of U)."""
        Q, s, _ = torch.linalg.svd(self.U, full_matrices=False)
        return s ** 2, Q

    def dense(self) -> torch.Tensor:
        _refuse_dense(self.U.shape[0], "LowRankCov.dense", "the factor U directly")
        return self.U @ self.U.T

    def __repr__(self):
        return f"LowRankCov(D={self.U.shape[0]}, rank<={self.U.shape[1]})"


def _cov_out(U: torch.Tensor, dense):
    """``U U^T`` dense when allowed and asked for, else the factor."""
    D = U.shape[0]
    if dense is None:
        dense = D <= DENSE_LIMIT
    if dense:
        _refuse_dense(D, "dense=True", "dense=False (a LowRankCov factor)")
        return U @ U.T
    return LowRankCov(U)


def sgd_noise_cov(model, loss_fn, X, y, batch_size: int, *, params=None, dense=None,
                  population: int | None = None):
    """Covariance of the minibatch gradient ``g_B = (1/b) sum_{i in B} g_i`` around the full one.

    Convention: the minibatch ``B`` is ``b = batch_size`` points drawn uniformly **without
    replacement** from a population of ``N`` points.  With ``C = (1/N) sum_i (g_i - g)(g_i - g)^T``
    the population's per-sample gradient covariance (``g`` its mean gradient),

        Cov(g_B) = (N - b) / (b (N - 1)) * C,

    which is ``C / b`` for ``b << N`` and ``0`` at ``b = N``.  ``population=None`` takes the
    ``n`` given points as the population (``N = n``).  Otherwise ``(X, y)`` is a uniform sample
    of a training set of ``N = population`` points, e.g. the subset a training run is measured
    on while its minibatches come from all of its training data: ``C`` is then estimated by
    ``(N - 1)/N`` times the unbiased sample covariance ``S^2 = 1/(n - 1) sum (g_i - gbar)(...)^T``
    (finite-population sampling: ``E S^2 = N/(N-1) C``), i.e. ``Cov(g_B) = (N - b)/(b N) S^2``;
    the two forms agree at ``N = n``.  Per-sample gradients come from ``vmap(grad)`` with the
    model in eval mode (no dropout noise: this is the data-sampling noise alone).  Returns a dense
    ``(D, D)`` tensor while ``D <= DENSE_LIMIT`` (unless ``dense=False``), else a
    :class:`LowRankCov` with ``U`` proportional to ``(G - gbar)^T``, of rank ``<= n``.
    """
    _check_model(model, loss_fn, X, y)
    n = X.shape[0]
    N = n if population is None else population
    if isinstance(N, bool) or not isinstance(N, int) or N < n:
        raise ValueError(f"population={population!r}; expected None or an int >= n={n} (the size "
                         "of the training set the given points were drawn from)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= N:
        raise ValueError(f"batch_size={batch_size!r}; expected an int in [1, N={N}]")
    if n < 2:
        raise ValueError("sgd_noise_cov needs at least 2 samples")
    fp = FlatParams(model, params)
    with _mode(model, False):
        G = fp.per_sample_grads(loss_fn, X, y).detach()
    coef = (N - batch_size) / (batch_size * N * (n - 1))  # times sum (g_i - gbar)(...)^T
    U = (G - G.mean(0)).T * float(np.sqrt(coef))
    return _cov_out(U, dense)


def dropout_noise_cov(model, loss_fn, X, y, sampler=None, n_samples: int = 200, *, params=None,
                      dense=None, seed: int | None = 0, batch_size: int | None = None):
    """Covariance of the full-batch gradient over the model's own noise, at fixed data and weights.

    The model is put in train mode and the gradient ``g_s = grad L(theta; noise_s)`` on all of
    ``X`` is computed ``n_samples`` times, each forward drawing fresh noise: Bernoulli masks of
    ``nn.Dropout``, the Gaussian multiplicative noise or local reparameterization of variational
    dropout, hard-concrete gates -- whatever the layers sample in training mode.  ``sampler``, if
    given, is called as ``sampler(model, s)`` before sample ``s`` (e.g. to resample a custom mask);
    ``seed`` seeds torch's global generator and the ``dualdrop.nn`` methods' counter-based noise
    streams for reproducibility (``None`` leaves torch's generator alone and continues the
    methods' streams); either way the methods' streams are as before on return
    (:func:`dualdrop.nn._base.preserved_noise`), so measuring never changes a training run.
    Returns the unbiased sample covariance ``(1/(S-1)) sum_s (g_s - gbar)(g_s - gbar)^T``: dense
    while ``D <= DENSE_LIMIT`` (unless ``dense=False``), else a :class:`LowRankCov` of rank ``< S``.

    ``batch_size``: the noise of a training step's gradient on a minibatch of that size,
    ``E_B Cov_noise(g_B)``, instead of the gradient on all of ``X``: ``X`` is cut into
    ``n // batch_size`` consecutive batches (a remainder is left out, with a warning), the
    covariance over ``n_samples`` draws is taken on each, and they are averaged (factor rank
    ``< S`` per batch).  Noise drawn independently per example (local reparameterization,
    ``nn.Dropout``) averages out over the points, so the covariance on ``n`` points is
    ``batch_size / n`` times a batch's; noise shared by the batch (weight noise, per-weight gates)
    averages out as far as the examples' gradients respond to it differently -- on
    LeNet-300-100 / MNIST the factor at ``batch_size / n = 1/2`` was 1.8-2.0 for VarDrop,
    VarDrop+LR and hard-concrete alike (``benchmarks/RESULTS.md``).
    A ``ValueError`` is raised if the gradient does not change between samples (no noise in train
    mode: an eta-trick method, or no dropout layer).
    """
    _check_model(model, loss_fn, X, y)
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"n_samples={n_samples!r}; expected an int >= 2")
    if sampler is not None and not callable(sampler):
        raise TypeError("sampler must be callable as sampler(model, s) or None")
    n = X.shape[0]
    if batch_size is None:
        bounds = [(0, n)]
    else:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                or not 1 <= batch_size <= n:
            raise ValueError(f"batch_size={batch_size!r}; expected None or an int in [1, n={n}]")
        bounds = [(j, j + batch_size) for j in range(0, n - batch_size + 1, batch_size)]
        if n % batch_size:
            warnings.warn(f"dropout_noise_cov: the last {n % batch_size} of n={n} points are left "
                          f"out (batches of {batch_size})", stacklevel=2)
    fp = FlatParams(model, params)
    named = dict(model.named_parameters())
    ps = [named[k] for k in fp.names]
    if seed is not None:
        torch.manual_seed(seed)
    factors, moved = [], False
    with _mode(model, True), preserved_noise(model, seed):
        for lo, hi in bounds:
            rows = []
            for s in range(n_samples):
                if sampler is not None:
                    sampler(model, s)
                loss = loss_fn(model(X[lo:hi]), y[lo:hi])
                gs = torch.autograd.grad(loss, ps, allow_unused=True)
                rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                                       for p, g in zip(ps, gs)]).detach())
            G = torch.stack(rows)
            moved = moved or float((G - G[0]).abs().max()) > 0.0
            factors.append((G - G.mean(0)).T / float(np.sqrt(n_samples - 1)))
    if not moved:
        raise ValueError("dropout_noise_cov: the gradient is identical across samples -- the model "
                         "draws no noise in train mode (no dropout layer, or a noiseless method "
                         "such as the eta-trick); its dropout-noise covariance is zero")
    U = torch.cat(factors, dim=1) / float(np.sqrt(len(factors)))
    return _cov_out(U, dense)
