"""Non-separable penalties: ARD against a direct minimization, sums, weights."""

import numpy as np
import pytest
from scipy import optimize

import penalties as P


def test_ard_matches_direct_minimization_over_eta():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((6, 4))
    w = np.array([1.0, 0.0, -0.4, 0.0])
    ard = P.ARD(X, sigma2=0.5, max_iter=5000, tol=1e-14)

    def obj(log_eta_nz):
        eta = np.zeros(4)
        eta[[0, 2]] = np.exp(log_eta_nz)
        S = 0.5 * np.eye(6) + (X * eta) @ X.T
        return 0.5 * (np.sum(w[[0, 2]] ** 2 / eta[[0, 2]]) + np.linalg.slogdet(S)[1] - 6 * np.log(0.5))

    res = optimize.minimize(obj, np.zeros(2), method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 20000})
    assert ard.omega(w) == pytest.approx(res.fun, rel=1e-6)
    assert ard.omega(np.zeros(4)) == 0.0
    with pytest.raises(ValueError, match="columns"):
        ard.omega(np.ones(3))


def test_sum_penalty_and_weights():
    s = P.SumPenalty(P.L1(), weights=[1.0, 2.0, 0.0])
    assert s.omega(np.array([1.0, -1.0, 5.0])) == 3.0
    np.testing.assert_allclose(s.prox(np.array([2.0, 2.0, 2.0]), 0.5), [1.5, 1.0, 2.0])
    with pytest.raises(ValueError, match="separable"):
        P.SumPenalty(P.HardThreshold(2))
