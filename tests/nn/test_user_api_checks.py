"""The smaller findings of sparsifying users' own networks: tabulated catalog penalties on
torch (speed path, bfloat16), weight_norm and torch.nn.utils.prune'd layers, exclude= matching
nothing, pickling a penalty:<name> handle, one lam rule, near-miss method names, an optimizer
built before sparsify, and code written against the previous API."""

import copy
import pickle
import warnings

import numpy as np
import penalties
import pytest
import torch
import torch.nn as nn
from torch.nn.utils import prune
from torch.nn.utils.parametrizations import weight_norm

from dualdrop.nn import METHODS, export_sparse, sparsify, sparsity_report, state_of
from dualdrop.nn import _table
from dualdrop.nn.methods.penalty.method import penalty_value

TABLED = ["vardrop_exact", "hardconcrete", "vardrop"]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# ---- tabulated catalog penalties: torch interpolation -----------------------------------------

@pytest.mark.parametrize("name", TABLED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_table_matches_the_penalty_kernel(name, dtype):
    """Against the Chebyshev tables of ``penalties`` (float64 numba kernel) on |w| from 1e-14 to
    5e8: both tails and the whole tabulated range, both signs, exact zeros."""
    P = penalties.get(name)
    code, params = P.kernel_spec()
    table = _table.torch_table(P, np.ascontiguousarray(params, dtype=np.float64))
    rng = np.random.default_rng(1)
    w = np.exp(rng.uniform(-32.0, 20.0, 50000)) * rng.choice([-1.0, 1.0], 50000)
    w[:3] = 0.0
    om, d = table.derivative(torch.from_numpy(w).to(dtype), with_omega=True)
    om_ref, d_ref = np.asarray(P.omega(w)), np.asarray(P.derivative(w))
    near_cap = (name == "hardconcrete") & (np.log(np.abs(w) + 1e-300) > table.x_hi - 0.1)
    far = ~near_cap
    np.testing.assert_allclose(om.double().numpy(), om_ref, rtol=1e-5, atol=0)
    np.testing.assert_allclose(d.double().numpy()[far], d_ref[far], rtol=1e-5, atol=0)
    np.testing.assert_allclose(d.double().numpy()[near_cap], d_ref[near_cap], rtol=1e-4, atol=0)
    assert d[:3].eq(0).all() and om[:3].eq(0).all()


@pytest.mark.parametrize("name", TABLED)
def test_float32_penalty_takes_the_torch_table_and_float64_the_exact_kernel(name):
    P = penalties.get(name)
    model = nn.Linear(6, 5)
    sp = sparsify(model, f"penalty:{name}", lam=0.3)
    st = state_of(model)
    w = (torch.randn(5, 6, dtype=torch.float64) * 0.3).requires_grad_(True)
    assert _table.of_kernel(st.penalty, st._kernel, w) is None
    w32 = w.detach().float().requires_grad_(True)
    assert _table.of_kernel(st.penalty, st._kernel, w32) is not None
    v = penalty_value(st, w32)
    v.backward()
    ref = w.detach().numpy()
    assert v.item() == pytest.approx(0.3 * P.omega(ref).sum(), rel=1e-5)
    np.testing.assert_allclose(w32.grad.numpy(), 0.3 * P.derivative(ref), rtol=2e-5)
    g = torch.autograd.grad(sp.regularizer(10, value=False), model.parametrizations.weight.original)
    assert torch.isfinite(g[0]).all()


@pytest.mark.parametrize("name", ["vardrop_exact", "hardconcrete"])
def test_bfloat16_model_with_a_tabulated_penalty_trains(name):
    model = _mlp().to(torch.bfloat16)
    sp = sparsify(model, f"penalty:{name}")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    for s in (1, 2):
        loss = model(x).float().pow(2).mean() + sp.regularizer(100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, s, 2)
    for t, _ in sp.states():
        assert t.param.dtype == torch.bfloat16 and torch.isfinite(t.param).all()
    assert torch.isfinite(sp.regularizer(100)).item()


# ---- layers another tool transforms ---------------------------------------------------------

def test_weight_norm_layer_is_left_alone_and_named_and_reports_work():
    torch.manual_seed(0)
    model = nn.Sequential(weight_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 4))
    rows = {r["layer"] for r in sparsity_report(model)}        # the plain model's report
    assert "0.parametrizations.weight.original1" in rows
    with pytest.warns(UserWarning, match=r"0\.weight \(Linear\): already parametrized "
                                         r"\(_WeightNorm\)"):
        sp = sparsify(model, "logsum")
    assert sp.targets == ["2"]
    x = torch.randn(3, 8)
    model(x).sum().backward()
    rows = {r["layer"]: r for r in sparsity_report(model)}
    assert rows["2"]["method"] == "logsum"
    model.eval()
    plain = export_sparse(model, layout="dense")
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sp2 = sparsify(nn.Sequential(weight_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 4)),
                       "logsum", exclude=["0"])
    assert sp2.targets == ["2"]


def test_a_pruned_layer_is_named_in_a_warning():
    model = _mlp()
    prune.l1_unstructured(model[0], "weight", 0.5)
    with pytest.warns(UserWarning, match=r"0\.weight \(Linear\): pruned with "
                                         r"torch\.nn\.utils\.prune \(L1Unstructured\)"):
        sp = sparsify(model, "logsum")
    assert sp.targets == ["2"]


# ---- selection, names, lam -----------------------------------------------------------------

def test_exclude_matching_nothing_is_refused_like_include():
    with pytest.raises(ValueError, match="exclude: 'fc9' matches no parameter"):
        sparsify(_mlp(), "logsum", exclude=["fc9"])
    with pytest.raises(ValueError, match="include: 'fc9' matches no parameter"):
        sparsify(_mlp(), "logsum", include=["fc9"])


@pytest.mark.parametrize("typo, want", [("vardrop_lr", "'vardrop-lr'"), ("LogSum", "'logsum'"),
                                        ("hardconcrete_neuron", "'hardconcrete-neuron'"),
                                        ("vardorp", "'vardrop'")])
def test_near_miss_method_names_are_suggested(typo, want):
    with pytest.raises(ValueError, match=rf"unknown method '{typo}' \(did you mean {want}"):
        sparsify(_mlp(), typo)


@pytest.mark.parametrize("method", [m for m in METHODS if m != "magnitude"] + ["penalty:mcp"])
@pytest.mark.parametrize("lam", [0, 0.0, -1e-3])
def test_one_lam_rule_for_every_method(method, lam):
    """lam > 0 everywhere (a strength of 0 sparsifies nothing), one wording."""
    with pytest.raises(ValueError, match=rf"lam must be > 0.*got {lam}"):
        sparsify(_mlp(), method, lam=lam)


def test_penalty_handle_pickles_and_keeps_working():
    model = _mlp()
    sp = sparsify(model, "penalty:mcp", lam=0.01)
    model2, sp2 = pickle.loads(pickle.dumps((model, sp)))
    assert sp2.method == "penalty:mcp" and sp2.targets == sp.targets
    torch.testing.assert_close(sp2.regularizer(10), sp.regularizer(10))
    assert copy.deepcopy(sp).method == "penalty:mcp"


# ---- optimizer built before sparsify --------------------------------------------------------

@pytest.mark.parametrize("method", ["hardconcrete", "vardrop-lr", "eta-trick"])
def test_optimizer_built_before_sparsify_is_refused_before_its_first_step(method):
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sp = sparsify(model, method)
    loss = model(torch.randn(3, 8)).pow(2).mean() + sp.regularizer(10)
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="build the optimizer after sparsify"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # no step ran
    good = torch.optim.Adam(model.parameters(), lr=0.1)
    good.step()                                                # the right one is not refused


# ---- code written against the previous API --------------------------------------------------

def test_previous_api_gets_a_pointer_to_the_new_access():
    model = _mlp()
    sp = sparsify(model, "hardconcrete")
    with pytest.warns(DeprecationWarning, match=r"use sp\.named_states\(\)"):
        pairs = sp.layers
    assert pairs == sp.named_states()
    with pytest.raises(AttributeError, match=r"state_of\(module, 'weight'\)\.gate_logits"):
        model[0].gate_logits


# ---- the report's own reproduction of the CSR export of a Transformer layer ------------------

def test_default_export_of_a_bare_transformer_encoder_layer_runs_its_inference():
    """``nn.Sequential(TransformerEncoderLayer, Linear)``: the layer's no-grad fast path reads
    ``linear1.weight`` directly; with CSR layers the exported model must take the module path."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.TransformerEncoderLayer(32, 2, 64, batch_first=True, dropout=0.0),
                        nn.Linear(32, 4))
    sp = sparsify(net, "magnitude", sparsity=0.95, prune_every=1, end=0.5)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(8, 16, 32)
    for s in range(1, 11):
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, s, 10)
    net.eval()
    plain = export_sparse(net, "csr")
    assert type(plain[0].linear1).__name__ == "CSRLinear"
    assert type(plain[0].self_attn.out_proj).__name__ != "CSRLinear"  # read by MHA directly
    with torch.no_grad():
        torch.testing.assert_close(plain(x), net(x), atol=1e-5, rtol=1e-5)
