"""Diagnostics against closed forms: Hessians, noise covariances, indicators, modified loss."""

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

import dualdrop.diagnostics as dg
from dualdrop.diagnostics import _core


def half_mse(out, t):
    return 0.5 * ((out.squeeze(-1) - t) ** 2).mean()


def raw_data(n=30, d=4, seed=0):
    """Unstandardized regression data: offsets and scales spanning two orders of magnitude."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(-1, 1, d,
                                                                             dtype=torch.float64)
    X = X + torch.linspace(-3, 5, d, dtype=torch.float64)
    y = X @ torch.randn(d, generator=g, dtype=torch.float64) + 10 + torch.randn(
        n, generator=g, dtype=torch.float64)
    return X, y


def linreg(d, w=None):
    m = nn.Linear(d, 1, bias=False).double()
    if w is not None:
        with torch.no_grad():
            m.weight.copy_(w.reshape(1, -1))
    return m


# ------------------------------------------------------------------ Hessian
def test_hessian_linear_regression_is_gram():
    X, y = raw_data()
    H = dg.hessian(linreg(4), half_mse, X, y)
    torch.testing.assert_close(H, X.T @ X / X.shape[0], rtol=1e-12, atol=1e-10)


def test_hessian_operator_and_lanczos_match_dense():
    torch.manual_seed(1)
    X, y = raw_data(n=25, d=3)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    H = dg.hessian(net, half_mse, X, y)
    op = dg.HessianOperator(net, half_mse, X, y)
    V = torch.randn(H.shape[0], 3, dtype=torch.float64)
    torch.testing.assert_close(op.matvec(V), H @ V, rtol=1e-9, atol=1e-9)
    w, U = dg.hessian_eigs(net, half_mse, X, y, k=3, tol=1e-10)
    ref = torch.linalg.eigvalsh(H).flip(0)[:3]
    torch.testing.assert_close(w, ref, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(H @ U, U * w, rtol=1e-5, atol=1e-6)
    assert abs(op.trace(probes=400) - float(H.trace())) < 0.1 * float(H.abs().diagonal().sum())


def test_dense_refused_above_limit(monkeypatch):
    monkeypatch.setattr(_core, "DENSE_LIMIT", 3)
    X, y = raw_data()
    with pytest.raises(ValueError, match="hessian_eigs"):
        dg.hessian(linreg(4), half_mse, X, y)
    S = dg.sgd_noise_cov(linreg(4), half_mse, X, y, 5)
    assert isinstance(S, dg.LowRankCov)
    with pytest.raises(ValueError, match="DENSE_LIMIT"):
        S.dense()


# ------------------------------------------------------------------ SGD noise
def test_sgd_noise_cov_equals_enumeration_of_minibatches():
    X, y = raw_data(n=7, d=3)
    w = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    model = linreg(3, w)
    b = 3
    G = (X * (X @ w - y)[:, None])          # per-sample gradients of the half squared error
    means = torch.stack([G[list(B)].mean(0) for B in itertools.combinations(range(7), b)])
    ref = torch.cov(means.T, correction=0)
    S = dg.sgd_noise_cov(model, half_mse, X, y, b)
    torch.testing.assert_close(S, ref, rtol=1e-10, atol=1e-10)
    assert float(dg.sgd_noise_cov(model, half_mse, X, y, 7).abs().max()) < 1e-20
    low = dg.sgd_noise_cov(model, half_mse, X, y, b, dense=False)
    torch.testing.assert_close(low.U @ low.U.T, ref, rtol=1e-10, atol=1e-10)


def test_sgd_noise_cov_from_a_subset_of_the_population_is_unbiased():
    """Minibatches of b from N points, the covariance estimated on a subset of n of them: the
    average over all C(N, n) subsets equals the exact covariance over all C(N, b) minibatches."""
    N, n, b = 10, 4, 3
    X, y = raw_data(n=N, d=3, seed=2)
    model = linreg(3, torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64))
    exact = dg.sgd_noise_cov(model, half_mse, X, y, b)
    subsets = list(itertools.combinations(range(N), n))
    mean = sum(dg.sgd_noise_cov(model, half_mse, X[list(B)], y[list(B)], b, population=N)
               for B in subsets) / len(subsets)
    torch.testing.assert_close(mean, exact, rtol=1e-10, atol=1e-12)
    same = dg.sgd_noise_cov(model, half_mse, X, y, b, population=N)
    torch.testing.assert_close(same, exact, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="population"):
        dg.sgd_noise_cov(model, half_mse, X, y, b, population=N - 1)


# ------------------------------------------------------------------ dropout noise
def test_bernoulli_dropout_cov_matches_closed_form():
    """nn.Dropout on the inputs of linear regression: independent masks per sample and feature, so
    Cov(g) = (1/n^2) sum_i Cov_eta[g_i(eta)], each by enumerating the 2^d masks of one sample."""
    n, d, keep = 6, 3, 0.7
    X, y = raw_data(n=n, d=d, seed=3)
    w = torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64)
    model = nn.Sequential(nn.Dropout(1 - keep), linreg(d, w))
    ref = torch.zeros(d, d, dtype=torch.float64)
    for i in range(n):
        gs, ps = [], []
        for m in itertools.product([0.0, 1.0], repeat=d):
            m = torch.tensor(m, dtype=torch.float64)
            xt = X[i] * m / keep
            gs.append(xt * (xt @ w - y[i]))
            ps.append(float(np.prod([keep if v else 1 - keep for v in m.tolist()])))
        gs, ps = torch.stack(gs), torch.tensor(ps, dtype=torch.float64)
        mu = ps @ gs
        ref += ((gs - mu).T * ps) @ (gs - mu) / n ** 2
    S = dg.dropout_noise_cov(model, half_mse, X, y, n_samples=6000, seed=0)
    rel = float(torch.linalg.norm(S - ref) / torch.linalg.norm(ref))
    assert rel < 0.08, rel
    # per minibatch of b: E_B Cov(g_B) = (n/b) * Cov(g) for noise independent per example
    Sb = dg.dropout_noise_cov(model, half_mse, X, y, n_samples=6000, seed=1, batch_size=2)
    rel = float(torch.linalg.norm(Sb - 3 * ref) / torch.linalg.norm(3 * ref))
    assert rel < 0.08, rel
    with pytest.warns(UserWarning, match="last 2 of n=6"):
        dg.dropout_noise_cov(model, half_mse, X, y, n_samples=3, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        dg.dropout_noise_cov(model, half_mse, X, y, n_samples=3, batch_size=7)
    assert model.training  # mode restored (nn.Sequential default is train)


@pytest.mark.parametrize("method", ["vardrop", "vardrop-lr", "hardconcrete"])
def test_dropout_noise_cov_for_dualdrop_methods(method):
    from dualdrop.nn import sparsify

    torch.manual_seed(0)
    X, yc = torch.randn(32, 5), torch.randint(0, 3, (32,))
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    sparsify(net, method)
    net.eval()
    from dualdrop.diagnostics.measure import weights_and_biases

    S = dg.dropout_noise_cov(net, nn.functional.cross_entropy, X, yc, n_samples=30,
                             params=weights_and_biases)
    assert S.shape == (57, 57) and float(S.trace()) > 0
    assert float(torch.linalg.eigvalsh(S.double()).min()) > -1e-6 * float(S.trace())
    assert not net.training


def test_noiseless_method_raises():
    from dualdrop.nn import sparsify

    X, yc = torch.randn(16, 5), torch.randint(0, 3, (16,))
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    sparsify(net, "logsum")
    with pytest.raises(ValueError, match="no noise"):
        dg.dropout_noise_cov(net, nn.functional.cross_entropy, X, yc, n_samples=5)


# ------------------------------------------------------------------ indicators
def test_escape_indicator_isotropic_and_lowrank():
    X, y = raw_data()
    H = dg.hessian(linreg(4), half_mse, X, y)
    out = dg.escape_indicator(H, 2.5 * torch.eye(4, dtype=torch.float64))
    assert math.isclose(out["trace"], 2.5 * float(H.trace()), rel_tol=1e-12)
    assert math.isclose(out["ratio"], 1.0, rel_tol=1e-12)
    model = linreg(4)
    S = dg.sgd_noise_cov(model, half_mse, X, y, 4)
    low = dg.sgd_noise_cov(model, half_mse, X, y, 4, dense=False)
    a, b = dg.escape_indicator(H, S), dg.escape_indicator(H, low)
    assert math.isclose(a["trace"], b["trace"], rel_tol=1e-10)
    assert math.isclose(a["ratio"], b["ratio"], rel_tol=1e-10)
    # all variance on the top eigenvector: ratio D * lambda_1 / Tr(H)
    lam, V = torch.linalg.eigh(H)
    top = dg.escape_indicator(H, torch.outer(V[:, -1], V[:, -1]))
    assert math.isclose(top["ratio"], 4 * float(lam[-1]) / float(H.trace()), rel_tol=1e-10)


def test_alignment_self_and_null_mean():
    g = torch.Generator().manual_seed(0)
    d = 12
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    h = torch.logspace(1, -2, d, dtype=torch.float64)
    H = Q @ torch.diag(h) @ Q.T
    a = dg.alignment(H, H, k=3, null_samples=300)
    assert math.isclose(a["cosine"], 1.0, rel_tol=1e-12)
    assert math.isclose(a["overlap"], 1.0, rel_tol=1e-9)
    assert a["p_value"] == pytest.approx(1 / 301)
    # null model for known spectra: E <H, Q diag(s) Q^T> = Tr(H) Tr(S) / d
    s = torch.linspace(0.5, 3, d, dtype=torch.float64)
    S = torch.diag(s)
    b = dg.alignment(H, S, k=3, null_samples=2000, seed=1)
    exact = float(h.sum() * s.sum() / d / (torch.linalg.norm(h) * torch.linalg.norm(s)))
    assert math.isclose(b["null_mean_exact"], exact, rel_tol=1e-12)
    assert abs(b["null_mean"] - exact) < 4 * b["null_std"] / math.sqrt(2000)
    assert 0.0 < b["p_value"] <= 1.0


# ------------------------------------------------------------------ modified loss
def test_modified_loss_linear_vs_enumeration_and_monte_carlo():
    X, y = raw_data(n=9, d=3)
    w = torch.tensor([0.4, -0.3, 0.2], dtype=torch.float64, requires_grad=True)
    p = 0.6
    LS = dg.modified_loss(w, X, y, p)
    vals, grads = [], []
    for m in itertools.product([0.0, 1.0], repeat=3):
        m = torch.tensor(m, dtype=torch.float64)
        prob = p ** m.sum() * (1 - p) ** (3 - m.sum())
        Ld = dg.dropout_loss(w, X, y, p, m)
        vals.append(prob * Ld)
        grads.append(prob * torch.autograd.grad(Ld, w)[0])
    torch.testing.assert_close(LS, sum(vals), rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.autograd.grad(LS, w)[0], sum(grads), rtol=1e-10, atol=1e-12)
    # per-sample masks, Monte Carlo
    gen = torch.Generator().manual_seed(0)
    masks = (torch.rand(20000, 9, 3, generator=gen, dtype=torch.float64) < p).double()
    mc = dg.dropout_loss(w.detach(), X, y, p, masks, per_sample=True)
    se = float(mc.std() / math.sqrt(len(mc)))
    assert abs(float(mc.mean()) - float(LS.detach())) < 4 * se


def test_modified_loss_two_layer_monte_carlo():
    gen = torch.Generator().manual_seed(2)
    n, d, m, p = 20, 2, 5, 0.8
    X = torch.randn(n, d, generator=gen, dtype=torch.float64) * 3 + 1
    y = torch.sin(X[:, 0])
    W = torch.randn(m, d, generator=gen, dtype=torch.float64)
    a = torch.randn(m, generator=gen, dtype=torch.float64)
    LS = float(dg.modified_loss((W, a), X, y, p, kind="two_layer"))
    L = float(dg.plain_loss((W, a), X, y, kind="two_layer"))
    sig = torch.tanh(X @ W.T)
    assert math.isclose(LS - L, (1 - p) / (2 * n * p) * float(((a * sig) ** 2).sum()),
                        rel_tol=1e-12)
    masks = (torch.rand(40000, m, generator=gen, dtype=torch.float64) < p).double()
    mc = dg.dropout_loss((W, a), X, y, p, masks, kind="two_layer")
    assert abs(float(mc.mean()) - LS) < 4 * float(mc.std()) / 200


# ------------------------------------------------------------------ weak error
def test_weak_error_of_the_mean_is_first_order():
    """Linear regression with input dropout: E theta_k follows m <- m - lr (A_S m - b) exactly
    (the expected dropout gradient is grad L_S, linear in theta), and the SDE's mean solves
    m' = -(A_S m - b).  The weak error of phi(theta) = theta at T is O(lr) (slope 1); the naive SDE
    (drift grad L) misses it by O(1) (slope 0)."""
    X, y = raw_data(n=12, d=3, seed=4)
    n, p, T = 12, 0.7, 1.0
    A = X.T @ X / n
    A_S = A + (1 - p) / p * torch.diag((X ** 2).mean(0))
    b = X.T @ y / n
    m0 = torch.zeros(3, dtype=torch.float64)
    scale = 1.0 / float(torch.linalg.eigvalsh(A_S).max())

    def sde_mean(Am):
        sol = torch.linalg.solve(Am, b)
        return sol + torch.matrix_exp(-Am * T * scale) @ (m0 - sol)

    lrs = [0.1, 0.05, 0.025, 0.0125]
    errs, naive = [], []
    for lr in lrs:
        m = m0.clone()
        for _ in range(round(T / lr)):
            m = m - lr * scale * (A_S @ m - b)
        errs.append(float(torch.linalg.norm(m - sde_mean(A_S))))
        naive.append(float(torch.linalg.norm(m - sde_mean(A))))
    slope = np.polyfit(np.log(lrs), np.log(errs), 1)[0]
    nslope = np.polyfit(np.log(lrs), np.log(naive), 1)[0]
    assert 0.9 < slope < 1.1, slope
    assert abs(nslope) < 0.2, nslope


# ------------------------------------------------------------------ measure and the CLI
def test_measure_dense_and_matrix_free_agree(monkeypatch):
    from dualdrop.nn import sparsify

    torch.manual_seed(0)
    X, yc = torch.randn(40, 4, dtype=torch.float64), torch.randint(0, 3, (40,))
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    sp = sparsify(net, "vardrop")
    lf = nn.functional.cross_entropy
    a = dg.measure(net, lf, X, yc, sp, k=2, batch_size=8, n_samples=20, probes=400)
    monkeypatch.setattr(_core, "DENSE_LIMIT", 10)
    import sys

    monkeypatch.setattr(sys.modules["dualdrop.diagnostics.measure"], "DENSE_LIMIT", 10)
    b = dg.measure(net, lf, X, yc, sp, k=2, batch_size=8, n_samples=20, probes=400)
    assert a["method"] == "vardrop" and a["dropout_noise"] == 1.0
    for key in ("lambda_1", "lambda_2", "sgd_trace", "drop_trace", "sgd_energy_topk"):
        assert math.isclose(a[key], b[key], rel_tol=1e-6), key
    for key in ("trace_h", "sgd_ratio", "drop_cosine"):   # Hutchinson estimates
        assert math.isclose(a[key], b[key], rel_tol=0.25), key
    assert all(isinstance(v, (float, str)) for v in a.values())


def test_diagnose_cli_on_a_saved_run(tmp_path):
    from dualdrop.cli import main
    from dualdrop.nn import sparsify
    from dualdrop.train.models import lenet_300_100

    torch.manual_seed(0)
    net = lenet_300_100(64, 10)
    sparsify(net, "hardconcrete")
    cfg = {"method": "hardconcrete", "hparams": {}, "n_features": 64, "data": "digits",
           "seed": 0, "val_fraction": 0.2, "batch_size": 16}
    run = tmp_path / "run"
    run.mkdir()
    from dualdrop.train.checkpoint import FORMAT_VERSION

    torch.save({"format": FORMAT_VERSION, "config": cfg, "model": net.state_dict(), "epoch": 3,
                "rng": []}, run / "checkpoint.pt")   # the keys every training checkpoint has
    rc = main(["diagnose", str(run), "--out", str(tmp_path / "d"), "--n-samples", "24",
               "--k", "2", "--noise-samples", "4"])
    assert rc == 0
    import json

    rec = json.loads((tmp_path / "d" / "diagnostics.json").read_text())[0]
    assert rec["method"] == "hardconcrete" and rec["epoch"] == 3 and rec["dropout_noise"] == 1.0
    assert rec["sgd_ratio"] > 0 and (tmp_path / "d" / "diagnostics.png").is_file()
    assert main(["diagnose", str(tmp_path / "nope"), "--out", str(tmp_path / "d")]) == 2


# ------------------------------------------------------------------ cosine above the dense limit
def test_cosine_stays_in_unit_interval_above_the_dense_limit():
    """Linear regression with D = 5,100 > DENSE_LIMIT features sharing a large mean: H = X^T X/n
    is dominated by one eigenvalue and the SGD noise lies along it, so the cosine is near 1. A
    plain Hutchinson ||H||_F (one probe) undershoots often and pushes the cosine above 1; the
    split estimate (exact on range(Sigma)) stays in [-1, 1] and matches the closed form."""
    D, n = 5100, 30
    assert D > _core.DENSE_LIMIT
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, D, generator=g, dtype=torch.float64) * 0.3 + 1.0
    y = X @ (torch.randn(D, generator=g, dtype=torch.float64) / D) + torch.randn(
        n, generator=g, dtype=torch.float64)
    net = linreg(D)
    op = dg.HessianOperator(net, half_mse, X, y)
    S = dg.sgd_noise_cov(net, half_mse, X, y, 4)
    assert isinstance(S, dg.LowRankCov)
    # closed form: H = X^T X / n, ||H||_F = ||X X^T||_F / n, <H, S> = sum_j u_j^T H u_j
    XU = X @ S.U
    exact = float((XU ** 2).sum() / n) / (float(torch.linalg.norm(X @ X.T)) / n
                                             * math.sqrt(S.frob2()))
    assert 0.9 < exact <= 1.0
    plain, split = [], []
    for seed in range(10):
        a = dg.alignment(op, S, k=2, null_samples=0, probes=1, seed=seed)
        split.append(a["cosine"])
        plain.append(a["inner"] / math.sqrt(op.frob2(1, seed) * S.frob2()))
    assert max(plain) > 1.0          # the failure mode this estimator removes
    assert all(-1.0 <= c <= 1.0 for c in split)
    assert max(abs(c - exact) for c in split) < 0.01
    m = dg.measure(net, half_mse, X, y, k=2, batch_size=4, probes=1)
    assert -1.0 <= m["sgd_cosine"] <= 1.0 and abs(m["sgd_cosine"] - exact) < 0.01
    assert math.isnan(m["drop_cosine"]) and 0 < m["sgd_p_value"] < 1e-3


def test_null_std_closed_form_and_cantelli_bound():
    g = torch.Generator().manual_seed(3)
    d = 10
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    H = Q @ torch.diag(torch.logspace(1, -1, d, dtype=torch.float64)) @ Q.T
    S = torch.diag(torch.linspace(0.1, 2.0, d, dtype=torch.float64) ** 2)
    b = dg.alignment(H, S, k=2, null_samples=4000, seed=2)
    # sample std of 4000 draws is within ~5% of the truth (4 standard errors of a std)
    assert abs(b["null_std"] / b["null_std_exact"] - 1) < 0.05
    a = dg.alignment(H, H, k=2, null_samples=0)
    t = (a["cosine"] - a["null_mean_exact"]) / a["null_std_exact"]
    assert math.isclose(a["p_value_bound"], 1 / (1 + t * t), rel_tol=1e-12)
    v = Q[:, -1:]                   # the flattest direction: cosine below the null mean
    low = dg.alignment(H, v @ v.T, k=2, null_samples=0)
    assert low["cosine"] < low["null_mean_exact"] and low["p_value_bound"] == 1.0
