"""One home per formula: every torch form and fused loop of a formula that ``penalties`` owns is
checked here against ``penalties`` (one parametrized test per formula family):

- the closed-form slopes ``Omega'(w)`` and ``eta_hat(|w|)`` of l1 / logsum / mcp / scad: the fused
  loops' dtype-generic scalars and the torch forms vs ``penalties.kernels``' scalar kernels
  (numbered by the same ``penalties.kernels`` codes);
- LogSum's dual ``f(eta)``: the torch form vs the catalog's ``LogSum.f``;
- hard-concrete's ``P(z != 0)``: the torch form, the fused scalar, vs ``penalties.dropout``
  (its constants and L0 shift from there);
- variational dropout's KL approximation: torch vs ``penalties.dropout.VarDrop.kl``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import penalties
from penalties import dropout as D
from penalties import kernels as K
from dualdrop.nn.methods.hardconcrete import fused as HCF
from dualdrop.nn.methods.penalty import fused as PF
from dualdrop.nn.methods.penalty.torch_forms import TORCH_FORMS, logsum_dual
from dualdrop.nn.methods.vardrop.method import kl_approx

W = np.concatenate([-np.logspace(-6, 1.5, 40), [0.0], np.logspace(-6, 1.5, 40)])
CLOSED = [("l1", {}), ("logsum", {"eps": 0.5}), ("mcp", {"a": 3.0, "lam": 0.2}),
          ("scad", {"a": 3.7, "lam": 0.2})]
RTOL = {np.float64: 1e-13, np.float32: 2e-6}
#: float32 slopes near a kink (mcp, scad: 1 - |w|/(a lam)) cancel to an absolute ulp of 1
ATOL = {np.float64: 1e-15, np.float32: 2e-7}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind,params", CLOSED)
def test_closed_form_slopes_and_eta_hat_match_penalties(kind, params, dtype):
    P = penalties.get(kind, **params)
    code, vec = P.kernel_spec()
    assert PF.PENALTY_KINDS[kind] == code  # one numbering of the kinds
    _, p0, p1 = PF._penalty_args(kind, params)
    T = dtype
    want_d = np.array([K.derivative_scalar(code, vec, float(w)) for w in W.astype(T)])
    want_e = np.array([K.eta_hat_scalar(code, vec, abs(float(w))) for w in W.astype(T)])
    got_d = np.array([PF._slope(code, T(w), T(p0), T(p1)) for w in W])
    got_e = np.array([PF._eta_hat(code, abs(T(w)), T(p0), T(p1)) for w in W])
    np.testing.assert_allclose(got_d, want_d, rtol=RTOL[T], atol=ATOL[T])
    np.testing.assert_allclose(got_e, want_e, rtol=RTOL[T], atol=ATOL[T])
    wt = torch.from_numpy(W.astype(T))
    form = TORCH_FORMS[kind]
    np.testing.assert_allclose(form.deriv(wt, wt.abs(), params).numpy(), want_d,
                               rtol=RTOL[T], atol=ATOL[T])
    np.testing.assert_allclose(form.eta(wt, wt.abs(), params).numpy(), want_e,
                               rtol=RTOL[T], atol=ATOL[T])


@pytest.mark.parametrize("eps", [0.1, 1.0, 2.0])
def test_logsum_dual_matches_the_catalog(eps):
    eta = np.logspace(-8, 4, 61)
    want = penalties.get("logsum", eps=eps).f(eta)
    got = logsum_dual(torch.from_numpy(eta), eps).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("beta,gamma,zeta", [(D.HC_BETA, D.HC_GAMMA, D.HC_ZETA), (0.5, -0.2, 1.3)])
def test_hard_concrete_p_nonzero_matches_penalties(beta, gamma, zeta):
    la = np.linspace(-12, 12, 49)
    want = 1.0 / (1.0 + np.exp(-(la - D.hc_l0_shift(beta, gamma, zeta))))
    if (beta, gamma, zeta) == (D.HC_BETA, D.HC_GAMMA, D.HC_ZETA):
        np.testing.assert_allclose(D._HC.l0(la), want, rtol=1e-13)
    c_l0 = (-gamma / zeta) ** beta
    fused = np.array([HCF._p_nonzero(np.exp(x), c_l0) for x in la])
    np.testing.assert_allclose(fused, want, rtol=1e-13)
    x = torch.ones(la.size, dtype=torch.float64)
    _, l0 = HCF.hard_concrete_gate(x, torch.from_numpy(la), 7, beta, gamma, zeta)
    np.testing.assert_allclose(float(l0), want.sum(), rtol=1e-13)


def test_vardrop_kl_matches_penalties():
    la = np.linspace(-10, 10, 81)
    got = kl_approx(torch.from_numpy(la)).numpy()
    np.testing.assert_allclose(got, D.VarDrop.kl(la), rtol=1e-13, atol=1e-15)
