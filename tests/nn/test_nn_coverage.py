"""Every weight-bearing layer, tied weights, in-place removal and the safety rails, on a model
with Embedding + LSTM + MultiheadAttention + Conv1d + ConvTranspose2d + a tied Embedding/Linear
weight + one Linear registered under two names."""

import copy
import io
import pickle
import warnings

import pytest
import torch
import torch.nn as nn
from torch.nn.utils import parametrize
from torch.nn.utils.stateless import _reparametrize_module

from dualdrop.nn import METHODS, export_sparse, sparsify, sparsity_report, state_of
from dualdrop.nn._base import original_of
from dualdrop.nn.targets import select
from nn_tiny_models import Zoo, same_noise

ALL = list(METHODS) + ["penalty:mcp"]
WEIGHTS = {"emb", "lstm.weight_ih_l0", "lstm.weight_hh_l0", "attn.in_proj_weight",
           "attn.out_proj", "conv", "up", "mid"}
# what each forward-changing method cannot act on, and the words of its reason
SKIPS = {
    "vardrop-lr": {"emb": "Embedding is not", "lstm.weight_ih_l0": "LSTM is not",
                   "lstm.weight_hh_l0": "LSTM is not",
                   "attn.in_proj_weight": "MultiheadAttention is not",
                   "attn.out_proj": "reads this weight directly"},
}
SKIPS["vardrop-lr-ar"] = SKIPS["vardrop-lr"]
SKIPS["hardconcrete-neuron"] = {**SKIPS["vardrop-lr"], "up": "ConvTranspose2d is not"}
TOK = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(0))
HP = {"vardrop": {"init_log_alpha": 0.0}, "vardrop-lr": {"init_log_alpha": 0.0},
      "vardrop-lr-ar": {"init_log_sigma2": -4.0}, "hardconcrete": {"droprate_init": 0.5},
      "hardconcrete-neuron": {"droprate_init": 0.5},
      "magnitude": {"sparsity": 0.5, "prune_every": 1, "end": 0.5},
      "eta-trick": {"eta_init": "eta_hat", "prune_rule": "eta_hat", "lam": 0.05, "tol": 0.3},
      "adaprox": {"lam": 0.05, "tol": 0.3}, "adatikhonov": {"lam": 0.05, "tol": 0.3},
      "logsum": {"lam": 0.05, "tol": 0.3}, "penalty:mcp": {"lam": 0.05, "tol": 0.3}}


def zoo(seed=0):
    torch.manual_seed(seed)
    return Zoo()


def sparsified(method, seed=0, steps=4):
    """A Zoo sparsified with ``method`` and trained a few steps (so every state has moved)."""
    model = zoo(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sp = sparsify(model, method, **HP[method])
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(1, steps + 1):
        loss = model(TOK).logsumexp(-1).mean() + sp.regularizer(50)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, steps)
    return model, sp, opt


def test_default_selection_covers_every_weight_bearing_layer():
    chosen, others = select(zoo())
    assert {t.key for t in chosen} == WEIGHTS
    tied = next(t for t in chosen if t.key == "emb")
    assert tied.aliases == ["emb.weight", "head.weight"]
    mid = next(t for t in chosen if t.key == "mid")
    assert mid.aliases == ["mid.weight", "mid2.weight"] and len(mid.sites) == 1
    # biases and normalization parameters are left alone by default
    assert {t.name for t in others} == {"lstm.bias_ih_l0", "lstm.bias_hh_l0",
                                        "attn.in_proj_bias", "attn.out_proj.bias", "norm.weight",
                                        "norm.bias", "conv.bias", "up.bias", "mid.bias",
                                        "head.bias"}
    # separate q/k/v projections of MultiheadAttention
    kv = nn.MultiheadAttention(8, 2, kdim=4, vdim=4)
    assert {t.name for t in select(kv)[0]} == {"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                              "out_proj.weight"}
    # selection by type and pattern
    assert {t.key for t in select(zoo(), include=nn.LSTM)[0]} == {"lstm.weight_ih_l0",
                                                                  "lstm.weight_hh_l0"}
    assert {t.key for t in select(zoo(), exclude=["lstm", "attn*"])[0]} == \
        {"emb", "conv", "up", "mid"}


@pytest.mark.parametrize("method", ALL)
def test_every_method_acts_on_each_weight_or_says_why(method):
    model = zoo()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sp = sparsify(model, method, **HP[method])
    skips = SKIPS.get(method, {})
    assert set(sp.targets) == WEIGHTS - set(skips)
    assert {k.removesuffix(".weight"): r for k, r in sp.skipped}.keys() == skips.keys()
    msgs = [str(w.message) for w in rec if issubclass(w.category, UserWarning)]
    if skips:
        assert len(msgs) == 1
        for name, words in skips.items():
            line = next(x for x in msgs[0].splitlines() if x.strip().startswith(name))
            assert words in line, line
    else:
        assert msgs == []
    # the report lists every parameter, sparsified or not
    rows = sparsity_report(model)
    roles = {r["layer"]: r["role"] for r in rows}
    assert {k for k, v in roles.items() if v == "sparsified"} == set(sp.targets)
    assert {k for k, v in roles.items() if v == "weight"} == set(skips)
    assert rows[-2]["total"] == sum(p.numel() for p in zoo().parameters())
    if skips:
        with pytest.raises(ValueError, match="cannot act on 5|cannot act on 6"):
            sparsify(zoo(), method, on_unsupported="error", **HP[method])


@pytest.mark.parametrize("method", ALL)
def test_export_round_trip_keeps_ties(method):
    model, sp, _ = sparsified(method)
    model.eval()
    with torch.no_grad():
        ref = model(TOK)
        assert torch.equal(model(TOK), ref)
    plain = export_sparse(model, "dense")
    assert plain.head.weight is plain.emb.weight and plain.mid is plain.mid2
    fresh = zoo(7).eval()
    fresh.load_state_dict(plain.state_dict(), strict=True)
    plain.load_state_dict(plain.state_dict(), strict=True)  # no hook of the states left behind
    with torch.no_grad():
        torch.testing.assert_close(fresh(TOK), ref, rtol=1e-5, atol=1e-6)
    # densities count the exported zeros, a tied weight once
    dens = sp.density()
    tot = sum(p.numel() for n, p in plain.named_parameters()
              if n.removesuffix(".weight") in dens or n in dens)
    nnz = sum(int(torch.count_nonzero(p)) for n, p in plain.named_parameters()
              if n.removesuffix(".weight") in dens or n in dens)
    assert dens["total"] == pytest.approx(nnz / tot)
    assert sparsity_report(model)[-1]["total"] == tot


@pytest.mark.parametrize("method", ["vardrop", "adaprox", "hardconcrete", "magnitude",
                                    "eta-trick"])
def test_tied_weight_has_one_state_and_counts_once(method):
    model, sp, opt = sparsified(method, steps=1)
    st = state_of(model.emb)
    assert st is not None and state_of(model.head) is st
    assert sum(1 for t, _ in sp.states() if t.key == "emb") == 1
    # the optimizer holds the original and the state once
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert model.emb.parametrizations.weight.original is model.head.parametrizations.weight.original
    # counted once in the density and in the regularizer
    numel = {t.key: t.param.numel() for t, _ in sp.states()}
    assert sum(numel.values()) == sum(p.numel() for p in set(t.param for t, _ in sp.states()))
    reg = sum(float(s.regularizer_term(t.param, 50)) for t, s in sp.states())
    assert float(sp.regularizer(50)) == pytest.approx(reg, rel=1e-6)


def test_tied_weight_regularizer_equals_independent_sum():
    """logsum: lam * sum log(1 + |w|/eps) over the distinct weights, tied ones once."""
    model = zoo()
    sp = sparsify(model, "logsum", lam=0.1)
    ws = {id(t.param): t.param.detach() for t, _ in sp.states()}
    expected = sum(0.1 * torch.log1p(w.abs() / 2.0).sum().item() for w in ws.values())
    assert sp.regularizer(10).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("method", ["hardconcrete", "magnitude", "vardrop-lr", "logsum"])
def test_finalize_in_place_and_remove_undo(method):
    model, sp, opt = sparsified(method)
    model.eval()
    with torch.no_grad():
        ref = model(TOK)
    conv_param = model.conv.parametrizations.weight.original
    sp.finalize()
    assert not any(parametrize.is_parametrized(m) for m in model.modules())
    assert type(model.conv) is nn.Conv1d and model.conv.weight is conv_param  # same Parameter
    assert model.head.weight is model.emb.weight
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(TOK), ref, rtol=1e-5, atol=1e-6)
    zoo(3).load_state_dict(model.state_dict(), strict=True)
    with pytest.raises(ValueError, match="removed"):
        sp.density()
    # remove(leave_sparse=False): the trained originals come back unchanged
    model2, sp2, _ = sparsified(method)
    orig = model2.conv.parametrizations.weight.original.detach().clone()
    sp2.remove(leave_sparse=False)
    assert torch.equal(model2.conv.weight, orig)


def test_magnitude_mask_applies_in_the_forward():
    model = zoo()
    sp = sparsify(model, "magnitude")
    st = state_of(model.conv)
    with torch.no_grad():
        st.weight_mask.zero_()
    model.train()
    # whatever the stored weight holds, the forward sees the masked weight (as prune does)
    assert torch.count_nonzero(model.conv.weight) == 0
    assert sp.density()["conv"] == 0.0
    assert torch.count_nonzero(original_of(model.conv, "weight")) > 0


def test_optimizer_built_before_sparsify_is_detected():
    model = zoo()
    opt = torch.optim.Adam(model.parameters())
    sp = sparsify(model, "vardrop", **HP["vardrop"])
    with pytest.raises(ValueError, match=r"does not hold 8 parameter\(s\).*log_alpha"):
        sp.after_step(opt, 1, 10)
    good = torch.optim.Adam(model.parameters())
    sp.after_step(good, 1, 10)
    # a frozen-weight optimizer over the state only names the weights
    part = torch.optim.Adam([p for n, p in model.named_parameters() if "log_alpha" in n])
    with pytest.raises(ValueError, match="emb.parametrizations.weight.original"):
        sp.after_step(part, 2, 10)


@pytest.mark.parametrize("method", ALL)
def test_deepcopy_pickle_state_dict(method):
    model, _, _ = sparsified(method, steps=2)
    model.eval()
    with torch.no_grad():
        ref = model(TOK)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = zoo(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sparsify(fresh, method, **HP[method])
    fresh.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)), fresh):
        other.eval()
        with torch.no_grad():
            assert torch.equal(other(TOK), ref)
        assert other.head.parametrizations.weight.original is \
            other.emb.parametrizations.weight.original if state_of(other.emb) else True


# ---- gradchecks in float64 of every parametrization and hook on the new layer types ----------

@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("train", [True, False])
def test_gradcheck_parametrized_forward(method, train):
    """The weights' parametrizations and the forward hooks on Embedding, LSTM, attention,
    Conv1d and ConvTranspose2d (with output_size): gradients in the originals and the state."""
    torch.manual_seed(0)
    model = Zoo(vocab=5, d=4).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sparsify(model, method, **HP[method])
    model.train(train)
    sub = nn.ModuleDict({"emb": model.emb, "lstm": model.lstm, "conv": model.conv,
                         "up": model.up, "attn": model.attn})
    named = [(n, p) for n, p in sub.named_parameters() if "parametrizations" in n]
    names = [n for n, _ in named]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in named)
    tok = torch.tensor([[0, 3, 1], [4, 2, 2]])

    def f(*tensors):
        same_noise(model, 99)  # the same noise at every evaluation
        with _reparametrize_module(sub, dict(zip(names, tensors))):
            x = sub.emb(tok)
            x, _ = sub.lstm(x)
            a, _ = sub.attn(x, x, x, need_weights=False)
            y = sub.conv(a.transpose(1, 2))
            return y.sum() + sub.up(y.unsqueeze(1), output_size=(10, 8)).pow(2).sum()

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def test_report_roles_of_explicit_and_gated_tensors():
    from dualdrop.nn import format_report

    model = zoo()
    sparsify(model, "logsum", include=["mid.bias", "conv"])
    roles = {r["layer"]: r["role"] for r in sparsity_report(model)}
    assert roles["mid.bias"] == "sparsified" and roles["conv"] == "sparsified"
    assert roles["up"] == "weight" and roles["conv.bias"] == "other"
    cnn = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.Linear(12, 2))
    sparsify(cnn, "hardconcrete-neuron")
    rows = sparsity_report(cnn)
    roles = {r["layer"]: r["role"] for r in rows}
    assert roles == {"0": "sparsified", "0.bias": "other", "2": "sparsified", "2.bias": "other",
                     "all parameters": "every parameter (biases, norms included)",
                     "total": "sparsified weights"}
    assert "tied: emb.weight, head.weight" in format_report(sparsity_report(zoo()))
