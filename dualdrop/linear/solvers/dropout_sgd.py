"""Adaptive dropout itself: SGD on least squares with real random masks whose keep ratios follow
the penalty's rule, the demonstration of Theorem 1 (docs/theory.md sections 1-2).

At each step, for a minibatch ``B``, every sample draws its own mask ``s_i`` (unbiased:
``E s = 1``, ``E s^2 = 1/alpha``) with keep ratios

    ``alpha_j = c_j eta_j / (c_j eta_j + lam_j)``, ``eta_j = eta_hat(w_j)``, ``c_j = ||x_j||^2 / n``

(``alpha = eta / (eta + lam)`` for standardized columns, clipped to ``[alpha_min, 1]``) and takes a
step along ``-(1/|B|) sum_i (y_i - b - x_i . (s_i * w)) (s_i * x_i)``. In expectation over the masks
the step is ``-(grad L(w) + sum_j c_j (1/alpha_j - 1) w_j) = -(grad L(w) + lam w / eta_hat(w))``,
the gradient of ``L + lam Omega``: the fixed points of the mean dynamics are the stationary points
of the regularized ERM problem, and the Polyak-Ruppert average of the iterates approaches its
solution (Theorem 1: exact for linear regression).

Masks: ``"bernoulli"`` (keep with probability alpha, scale ``1/alpha``) or ``"gaussian"``
(``N(1, (1 - alpha)/alpha)``). Step ``lr / sqrt(1 + epoch)``; the average runs over the second half of
the steps. ``max_iter`` counts epochs. The history holds ``F`` at the running average after each
epoch. A stochastic method: the criterion rarely reaches a tight ``tol``.
"""

from __future__ import annotations

import numpy as np

from .._problem import Problem
from ._base import BaseSolver
from ._common import progress

NAME = "dropout_sgd"


def keep_ratios(problem: Problem, w, alpha_min):
    """``alpha_j = c_j eta_j / (c_j eta_j + lam_j)`` clipped to ``[alpha_min, 1]``."""
    eta = np.asarray(problem.penalty.eta_hat(w), dtype=np.float64)
    c = problem.design.col_norms2 / problem.n
    lam = problem.lam_w
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.where(np.isinf(eta) | (lam == 0), 1.0, c * eta / (c * eta + lam))
    a[np.isnan(a)] = 1.0
    return np.clip(a, alpha_min, 1.0)


class DropoutSGD(BaseSolver):
    """Least squares only (Theorem 1). Options: ``lr``, ``batch_size``, ``mask``
    (``"bernoulli"`` or ``"gaussian"``), ``alpha_min`` (smallest keep ratio), ``random_state``."""

    name = NAME
    requires = ("quadratic", "separable")
    default_max_iter = 200

    def _solve(self, problem, w, b, *, tol, max_iter, verbose, lr=None, batch_size=32,
               mask="bernoulli", alpha_min=1e-3, random_state=0):
        return _dropout_sgd(problem, w, b, tol, max_iter, verbose, lr, batch_size, mask,
                            alpha_min, random_state)


def _dropout_sgd(problem, w, b, tol, max_iter, verbose, lr, batch_size, mask, alpha_min,
                 random_state):
    if mask not in ("bernoulli", "gaussian"):
        raise ValueError(f"mask must be 'bernoulli' or 'gaussian', got {mask!r}")
    if not (0.0 < alpha_min <= 1.0):
        raise ValueError(f"alpha_min must be in (0, 1], got {alpha_min!r}")
    rng = np.random.default_rng(random_state)
    des, y = problem.design, problem.y
    X = des.matrix.tocsr() if des.is_sparse else des.toarray(order="C")
    n, p = des.n, des.p
    m = int(min(max(1, batch_size), n))
    if lr is None:
        row2 = float(np.mean(np.asarray(X.multiply(X).sum(axis=1)).ravel() if des.is_sparse
                             else np.einsum("ij,ij->i", X, X)))
        lr = 0.5 / max(row2 + 1.0, 1e-12)
    w_avg, b_avg, n_avg = np.zeros(p), 0.0, 0
    steps_per_epoch = int(np.ceil(n / m))
    total = max_iter * steps_per_epoch
    history = [problem.objective(w, b)]
    t = 0
    with progress(max_iter, verbose, NAME) as bar:
        for epoch in range(max_iter):
            step = lr / np.sqrt(1.0 + epoch)
            perm = rng.permutation(n)
            for k in range(steps_per_epoch):
                B = perm[k * m:(k + 1) * m]
                XB = X[B].toarray() if des.is_sparse else X[B]
                alpha = keep_ratios(problem, w, alpha_min)
                if mask == "bernoulli":
                    S = (rng.random((B.size, p)) < alpha) / alpha
                else:
                    S = 1.0 + np.sqrt((1.0 - alpha) / alpha) * rng.standard_normal((B.size, p))
                XS = XB * S
                e = y[B] - b - XS @ w
                w = w + step * (XS.T @ e) / B.size
                if problem.fit_intercept:
                    b = b + step * float(e.mean())
                t += 1
                if t > total // 2:
                    n_avg += 1
                    w_avg += (w - w_avg) / n_avg
                    b_avg += (b - b_avg) / n_avg
            cur_w, cur_b = (w_avg, b_avg) if n_avg else (w, b)
            history.append(problem.objective(cur_w, cur_b))
            bar.update(1)
    crit = problem.criterion(w_avg, b_avg)
    return (w_avg.copy(), b_avg, max_iter, history, crit, crit <= tol,
            {"last_iterate": w.copy(), "lr": lr, "n_averaged": n_avg})


SOLVER = DropoutSGD()
solve, supports = SOLVER.solve, SOLVER.supports
