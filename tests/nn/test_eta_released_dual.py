"""The eta-trick's ``dual="released"`` option: the released code's dual expression.

The reference below is the released code's formula written out independently,
``2 * [log((s + eps)/2) - (s - eps)^2/(4 eta)]`` with ``s = sqrt(eps^2 + 4 eta)``, differentiated
by autograd; the option must give the same gradients (the value differs only by the constant
``2 log(eps)``, as the default form is shifted to f(0+) = 0).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from scipy.optimize import minimize_scalar

from dualdrop.nn import sparsify
from dualdrop.nn._base import original_of, state_of


def _layer(**hp):
    torch.manual_seed(0)
    holder = nn.Sequential(nn.Linear(5, 4).double())
    sp = sparsify(holder, "eta-trick", **hp)
    return holder[0], sp


def _released_dual(eta, eps):
    s = torch.sqrt(eps ** 2 + 4 * eta)
    return 2 * torch.sum(torch.log((s + eps) / 2) - (s - eps) ** 2 / (4 * eta))


@pytest.mark.parametrize("decay", ["linear", "quadratic"])
def test_released_dual_matches_the_released_formula(decay):
    lam, eps, c = 0.3, 1.5, 0.02
    layer, sp = _layer(lam=lam, eps=eps, eta_weight_decay=c, decay=decay, dual="released")
    w_t, st = original_of(layer, "weight"), state_of(layer, "weight")
    with torch.no_grad():
        st.log_ratio.copy_(torch.randn(4, 5, dtype=torch.float64) * 3)
    reg = sp.regularizer(1)
    reg.backward()
    w = w_t.detach().clone().requires_grad_(True)
    p = st.log_ratio.detach().clone().requires_grad_(True)
    eta = lam * torch.exp(p)
    ref = lam / 2 * ((w * w / eta).sum() + _released_dual(eta, eps))
    if decay == "linear":
        ref = ref + lam / 2 * c * p.sum()
    else:
        ref = ref + c / 2 * ((p + math.log(lam)) ** 2).sum()
    ref.backward()
    torch.testing.assert_close(w_t.grad, w.grad, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(st.log_ratio.grad, p.grad, rtol=1e-9, atol=1e-14)
    shift = lam / 2 * 2 * math.log(eps) * p.numel()  # the default form's f(0+) = 0 shift
    assert reg.item() == pytest.approx(ref.item() - shift, rel=1e-10)
    # the value-free path carries the same gradient
    layer2, sp2 = _layer(lam=lam, eps=eps, eta_weight_decay=c, decay=decay, dual="released")
    st2 = state_of(layer2, "weight")
    with torch.no_grad():
        st2.log_ratio.copy_(st.log_ratio)
    sp2.regularizer(1, value=False).backward()
    torch.testing.assert_close(st2.log_ratio.grad, p.grad, rtol=1e-9, atol=1e-14)


def test_released_dual_is_not_logsum_dual():
    """min over eta of w^2/eta + f(eta): LogSum's 2 log(1 + |w|/eps) with the default dual, a
    much smaller |w|^{3/2}-like penalty with the released one (quadrature-free: 1-D minimization)."""
    eps = 2.0

    def f(eta, released):
        s = math.sqrt(eps * eps + 4 * eta)
        g = (s - eps) ** 2 / (4 * eta)
        return 2 * math.log((s + eps) / (2 * eps)) - (2 * g if released else g)

    for w, ratio_max in ((0.01, 0.2), (0.05, 0.3), (0.1, 0.35)):
        mins = [minimize_scalar(lambda le: w * w / math.exp(le) + f(math.exp(le), rel),
                                bounds=(-30, 10), method="bounded",
                                options={"xatol": 1e-10}).fun for rel in (False, True)]
        assert mins[0] == pytest.approx(2 * math.log1p(w / eps), rel=1e-7)
        # released: value minus its w = 0 limit (0) is well below the LogSum penalty
        assert 0 < mins[1] < ratio_max * mins[0]


def test_dual_is_validated():
    with pytest.raises(ValueError, match="dual"):
        _layer(dual="exact")
    assert np.isfinite(_layer(dual="released")[1].regularizer(1).item())


def test_released_dual_is_not_sent_to_the_fused_path():
    """The fused eta-trick loop implements the exact dual only: with ``dual="released"`` the
    gradient of the value-free path (the one training uses) must still be the released one."""
    lam, eps, c = 0.3, 1.5, 0.02
    grads = {}
    for dual in ("logsum", "released"):
        layer, sp = _layer(lam=lam, eps=eps, eta_weight_decay=c, dual=dual)
        st = state_of(layer, "weight")
        with torch.no_grad():
            st.log_ratio.copy_(torch.linspace(-4, 4, 20, dtype=torch.float64).reshape(4, 5))
        sp.regularizer(1, value=False).backward()
        grads[dual] = st.log_ratio.grad.clone()
        p = st.log_ratio.detach().clone().requires_grad_(True)
        w = original_of(layer, "weight").detach()
        eta = lam * torch.exp(p)
        s = torch.sqrt(eps ** 2 + 4 * eta)
        f = (_released_dual(eta, eps) if dual == "released"
             else torch.sum(2 * torch.log((s + eps) / 2) - (s - eps) ** 2 / (4 * eta)))
        (lam / 2 * ((w * w / eta).sum() + f + c * p.sum())).backward()
        torch.testing.assert_close(grads[dual], p.grad, rtol=1e-9, atol=1e-14)
    assert not torch.allclose(grads["logsum"], grads["released"])
