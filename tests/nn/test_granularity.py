"""granularity= for every method: groups of output units (rows, output channels) and heads."""

import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import penalties
from dualdrop.nn import METHODS, default_hparams, describe, sparsify, state_of
from dualdrop.nn.methods.vardrop.method import kl_approx
from nn_tiny_models import TinyCNN, TinyMLP

ALL = list(METHODS) + ["penalty:mcp"]
GROUPED = [m for m in ALL if m != "hardconcrete-neuron"]  # it has its own groups


def _batch(model, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    if isinstance(model, TinyCNN):
        x = torch.randn(n, 2, 6, 6, generator=g)
        return x, torch.randint(0, 3, (n,), generator=g)
    return torch.randn(n, 20, generator=g), torch.randint(0, 4, (n,), generator=g)


def _train(model, sp, steps, lr=1e-2, opt=None):
    opt = opt or torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(1, steps + 1):
        x, y = _batch(model, seed=step)
        loss = F.cross_entropy(model(x), y) + sp.regularizer(200)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, steps)
    return opt


def _rows(w):
    """Output units as rows (Linear rows, convolution output channels)."""
    return w.detach().flatten(1)


# ---- every method prunes whole output units ------------------------------------------------------

@pytest.mark.parametrize("make", [TinyMLP, TinyCNN], ids=["mlp", "cnn"])
@pytest.mark.parametrize("method", GROUPED)
def test_neuron_prunes_whole_rows(method, make):
    torch.manual_seed(0)
    model = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reached density on tiny layers
        sp = sparsify(model, method, granularity="neuron", target_density=0.3)
        _train(model, sp, 30)
    model.eval()
    pruned = 0
    for name, _ in sp.named_states():
        rows = _rows(dict(model.named_modules())[name].weight)
        zeros = (rows == 0).sum(1)
        assert bool(((zeros == 0) | (zeros == rows.shape[1])).all()), (name, zeros)
        pruned += int((zeros == rows.shape[1]).sum())
    assert pruned >= 1
    d = sp.density()["total"]
    assert 0.15 < d < 0.45


@pytest.mark.parametrize("method", ALL)
def test_weight_is_the_default(method):
    outs = []
    for kw in ({}, {"granularity": "weight"}):
        torch.manual_seed(0)
        model = TinyMLP()
        sp = sparsify(model, method, **kw)
        assert sp.hparams["granularity"] == "weight"
        _train(model, sp, 3, lr=1e-3)
        model.eval()
        outs.append((model.state_dict(), model(_batch(model)[0]).detach()))
    (sd0, y0), (sd1, y1) = outs
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        if isinstance(sd0[k], torch.Tensor):
            assert torch.equal(sd0[k], sd1[k]), k
        else:
            assert sd0[k] == sd1[k], k
    assert torch.equal(y0, y1)


def test_channel_is_neuron_and_default_listed():
    assert default_hparams("logsum")["granularity"] == "weight"
    assert "neuron" in describe("vardrop")["granularity"][1]
    torch.manual_seed(0)
    sp = sparsify(TinyMLP(), "logsum", granularity="channel")
    assert sp.hparams["granularity"] == "neuron"


def test_one_vocabulary_for_training_and_oneshot():
    """training and one-shot pruning read ``granularity`` with the same words and meanings:
    "channel" is "neuron" in both, and a wrong word is refused listing the same words."""
    from dualdrop.nn._groups import check_unit_granularity
    from dualdrop.nn.oneshot import prune_structured
    assert check_unit_granularity("channel") == check_unit_granularity("neuron") == ("neuron",)
    assert check_unit_granularity(("head", "channel", "neuron")) == ("head", "neuron")
    assert check_unit_granularity("head+channel") == ("head", "neuron")
    with pytest.raises(ValueError) as train:
        sparsify(TinyMLP(), "logsum", granularity="row")
    with pytest.raises(ValueError) as oneshot:
        prune_structured(TinyMLP(), [torch.randn(4, 20)], "flap", granularity="row",
                         target_density=0.5, progress=False)
    for err in (train, oneshot):
        for word in ("'weight'", "'neuron' or 'channel' (the same)", "'head'"):
            assert word in str(err.value), (word, str(err.value))


# ---- group formulas, checked against the penalties package ---------------------------------------

def _mlp64():
    torch.manual_seed(0)
    model = TinyMLP().double()
    with torch.no_grad():
        model.fc1.weight[3].zero_()  # a zero group: finite gradient
    return model


@pytest.mark.parametrize("method,catalog,params", [
    ("logsum", "logsum", {"eps": 2.0}),
    ("penalty:mcp", "mcp", {}),
    ("penalty:scad", "scad", {}),
    ("penalty:log2sum", "log2sum", {}),
    ("penalty:vardrop", "vardrop", {}),   # tabulated
])
def test_group_penalty_value_and_gradient(method, catalog, params):
    model = _mlp64()
    lam = 3e-2
    sp = sparsify(model, method, granularity="neuron", lam=lam)
    P = penalties.get(catalog, **params)
    want, grads = 0.0, {}
    for name, _ in sp.named_states():
        w = dict(model.named_modules())[name].parametrizations.weight.original
        W = w.detach().numpy()
        n = np.sqrt((W * W).sum(1))
        want += lam * float(np.sum(P.omega(n)))
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.where(n > 0, lam * np.asarray(P.derivative(n)) / n, 0.0)
        grads[name] = (w, scale[:, None] * W)
    reg = sp.regularizer(100)
    assert reg.item() == pytest.approx(want, rel=1e-6)
    reg.backward()
    for name, (w, g) in grads.items():
        assert np.all(np.isfinite(w.grad.numpy()))
        np.testing.assert_allclose(w.grad.numpy(), g, rtol=1e-6, atol=1e-12)


def test_group_adatikhonov_value():
    model = _mlp64()
    lam = 1e-2
    sp = sparsify(model, "adatikhonov", granularity="neuron", lam=lam)
    P = penalties.get("logsum", eps=2.0)
    want = 0.0
    for name, _ in sp.named_states():
        W = dict(model.named_modules())[name].parametrizations.weight.original.detach().numpy()
        n = np.sqrt((W * W).sum(1))
        with np.errstate(invalid="ignore", divide="ignore"):
            want += lam / 2 * float(np.sum(np.where(n > 0, n * n / P.eta_hat(n), 0.0)))
    assert sp.regularizer(100).item() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
def test_adaprox_block_prox(opt_kind):
    model = _mlp64()
    lam, lr = 0.5, 0.05
    sp = sparsify(model, "adaprox", granularity="neuron", lam=lam)
    opt = (torch.optim.SGD(model.parameters(), lr=lr) if opt_kind == "sgd"
           else torch.optim.Adam(model.parameters(), lr=lr))
    P = penalties.get("logsum", eps=2.0)
    x, y = _batch(model)
    F.cross_entropy(model(x.double()), y).backward()
    opt.step()
    want = {}
    for name, _ in sp.named_states():
        w = dict(model.named_modules())[name].parametrizations.weight.original
        W = w.detach().numpy().copy()
        if opt_kind == "sgd":
            rho = np.full_like(W, lr)
        else:
            st = opt.state[w]
            v = st["exp_avg_sq"].numpy()
            bc2 = 1.0 - 0.999 ** float(st["step"])
            rho = lr / (np.sqrt(v) / math.sqrt(bc2) + 1e-8)
        n = np.sqrt((W * W).sum(1))
        eta = np.asarray(P.eta_hat(n))
        factor = eta / (eta + lam * rho.mean(1))
        want[name] = (w, W * factor[:, None])
    sp.after_step(opt, 1, 10)
    for name, (w, W) in want.items():
        np.testing.assert_allclose(w.detach().numpy(), W, rtol=1e-10, atol=1e-15)


def test_eta_trick_one_p_per_group():
    torch.manual_seed(0)
    model = TinyCNN()
    sp = sparsify(model, "eta-trick", granularity="neuron", eta_init="eta_hat")
    assert state_of(model.conv).log_ratio.shape == (4, 1, 1, 1)
    assert state_of(model.fc).log_ratio.shape == (3, 1)
    sp.regularizer(100).backward()
    assert torch.isfinite(state_of(model.fc).log_ratio.grad).all()


@pytest.mark.parametrize("method", ["vardrop", "vardrop-lr", "vardrop-lr-ar"])
def test_vardrop_one_alpha_per_group(method):
    torch.manual_seed(0)
    model = TinyCNN().double()
    lam = 1e-2
    sp = sparsify(model, method, granularity="neuron", lam=lam)
    st = state_of(model.conv)
    own = st.log_sigma2 if method == "vardrop-lr-ar" else st.log_alpha
    assert own.shape == (4, 1, 1, 1)
    want = 0.0
    for name, st in sp.named_states():
        w = dict(model.named_modules())[name].parametrizations.weight.original
        la = st.clipped_log_alpha(w).detach()
        size = w[0].numel()
        if method == "vardrop-lr-ar":  # a = sigma^2 over the group's mean square weight
            ms = (w.detach() ** 2).flatten(1).mean(1).view(la.shape)
            expect = (st.log_sigma2.detach() - torch.log(ms + 1e-8)).clamp(-8, 8)
            torch.testing.assert_close(la, expect)
        want += lam * size * float(kl_approx(la).sum())
    assert sp.regularizer(100).item() == pytest.approx(want, rel=1e-9)
    x, y = _batch(model)
    F.cross_entropy(model(x.double()), y).backward()


def test_hardconcrete_one_gate_per_output_row():
    torch.manual_seed(0)
    model = TinyCNN()
    sp = sparsify(model, "hardconcrete", granularity="neuron", droprate_init=0.5)
    assert state_of(model.fc).gate_logits.shape == (3, 1)
    assert state_of(model.conv).gate_logits.shape == (4, 1, 1, 1)
    model.train()
    w = model.fc.parametrizations.weight.original.detach()
    wt = model.fc.weight.detach()  # one gate sample, broadcast over each row
    ratio = wt / w
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio))
    assert sp.regularizer(100).item() > 0


def test_hardconcrete_neuron_keeps_its_own_groups():
    with pytest.raises(ValueError, match="granularity.*'hardconcrete'"):
        sparsify(TinyMLP(), "hardconcrete-neuron", granularity="neuron")


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_magnitude_keeps_the_largest_rows(scope):
    torch.manual_seed(0)
    model = TinyMLP()
    norms = {}
    with torch.no_grad():
        for name in ("fc1", "fc2", "fc3"):
            lin = getattr(model, name)
            s = torch.rand(lin.out_features) + 0.1
            lin.weight.mul_(s[:, None] / lin.weight.norm(dim=1, keepdim=True))
            norms[name] = s
    sp = sparsify(model, "magnitude", granularity="neuron", sparsity=0.5, scope=scope,
                  min_layer_density=0.0)
    sp.after_step(None, 10, 10)
    model.eval()
    kept_all, pruned_all = [], []
    for name, s in norms.items():
        rows = _rows(getattr(model, name).weight)
        kept = (rows != 0).all(1)
        assert bool((kept | (rows == 0).all(1)).all())
        # groups are pruned per tensor whatever the scope (a ranking across layers of groups
        # of different sizes starves the narrow layers)
        assert int(kept.sum()) == len(s) - round(0.5 * len(s))
        assert s[kept].min() > s[~kept].max()
    assert sp.density()["total"] == pytest.approx(0.5, abs=0.1)


def test_conv_transpose_output_channels():
    torch.manual_seed(0)
    model = nn.Sequential(nn.ConvTranspose2d(4, 6, 3, groups=2), nn.Conv2d(6, 2, 1))
    sp = sparsify(model, "magnitude", granularity="neuron", sparsity=0.5, scope="layer",
                  min_layer_density=0.0)
    sp.after_step(None, 10, 10)
    w = model[0].weight.detach()  # (in, out/groups, k, k); output channel g*3 + j
    per_channel = w.view(2, 2, 3, 9).permute(0, 2, 1, 3).reshape(6, -1)
    zero = (per_channel == 0).all(1)
    assert int(zero.sum()) == 3 and bool(((per_channel != 0).all(1) | zero).all())


# ---- heads ---------------------------------------------------------------------------------------

class _Attn(nn.Module):
    def __init__(self, E=8, H=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.fc = nn.Linear(E, 3)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.fc(a.mean(1))


def test_head_groups_of_attention():
    torch.manual_seed(0)
    E, H = 8, 2
    d = E // H
    model = _Attn(E, H)
    with torch.no_grad():  # head 1 small in q, k, v and in out_proj's columns
        model.attn.in_proj_weight.view(3, H, d, E)[:, 1] *= 0.01
        model.attn.out_proj.weight.view(E, H, d)[:, 1] *= 0.01
    sp = sparsify(model, "magnitude", granularity="head", sparsity=0.5, scope="layer",
                  min_layer_density=0.0)
    sp.after_step(None, 10, 10)
    model.eval()
    w_in = model.attn.in_proj_weight.detach().view(3, H, d, E)
    assert bool((w_in[:, 1] == 0).all()) and bool((w_in[:, 0] != 0).all())
    w_out = model.attn.out_proj.weight.detach().view(E, H, d)
    assert bool((w_out[:, 1] == 0).all()) and bool((w_out[:, 0] != 0).all())
    fc = model.fc.weight.detach()  # other layers: output units
    assert bool(((fc == 0).all(1) | (fc != 0).all(1)).all())
    model(torch.randn(2, 5, E))


def test_head_for_vardrop_and_penalties():
    torch.manual_seed(0)
    model = _Attn()
    sp = sparsify(model, "vardrop", granularity="head", lam=1e-2)
    assert state_of(model.attn, "in_proj_weight").log_alpha.shape == (1, 2, 1, 1)
    assert state_of(model.attn.out_proj).log_alpha.shape == (1, 2, 1)
    _train_attn(model, sp)
    torch.manual_seed(0)
    model = _Attn()
    sp = sparsify(model, "logsum", granularity="head", lam=1e-2)
    _train_attn(model, sp)


def _train_attn(model, sp):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(1, 3):
        loss = model(torch.randn(4, 5, 8)).square().mean() + sp.regularizer(100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, 2)


def test_neuron_skips_attention_projection_with_a_warning():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="in_proj_weight"):
        sp = sparsify(_Attn(), "logsum", granularity="neuron")
    assert "attn.in_proj_weight" in [n for n, _ in sp.skipped]


# ---- errors and skipped weights ------------------------------------------------------------------

def test_bad_granularity():
    with pytest.raises(ValueError, match=r"granularity.*'neuron'.*'row'"):
        sparsify(TinyMLP(), "logsum", granularity="row")
    with pytest.raises(TypeError, match=r"granularity.*'weight'"):
        sparsify(TinyMLP(), "vardrop", granularity=3)


class _Embedded(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, tok):
        return self.fc(self.emb(tok).mean(1))


@pytest.mark.parametrize("method", ["logsum", "vardrop", "hardconcrete", "magnitude"])
def test_embedding_is_skipped_with_a_warning(method):
    torch.manual_seed(0)
    model = _Embedded()
    with pytest.warns(UserWarning, match=r"emb\.weight.*granularity='neuron'"):
        sp = sparsify(model, method, granularity="neuron")
    assert sp.targets == ["fc"] and [n for n, _ in sp.skipped] == ["emb.weight"]
    with pytest.raises(ValueError, match="granularity"):
        sparsify(_Embedded(), method, granularity="neuron", include=["emb"])


# ---- command line --------------------------------------------------------------------------------

def test_cli_granularity_neuron(tmp_path, capsys):
    from dualdrop.cli import main

    out = tmp_path / "run"
    assert main(["sparsify", "--method", "logsum", "--granularity", "neuron", "--epochs", "1",
                 "--no-progress", "--threads", "1", "--target-density", "0.3",
                 "--out", str(out)]) == 0
    final = json.loads((out / "final.json").read_text())
    text = json.dumps(final)
    assert '"granularity": "neuron"' in text
    from dualdrop.train.export import load_run

    net = load_run(out)  # the test-time network: rows whole or zero
    zero_rows = 0
    for lin in [m for m in net.modules() if isinstance(m, nn.Linear)]:
        rows = _rows(lin.weight)
        assert bool(((rows == 0).all(1) | (rows != 0).all(1)).all())
        zero_rows += int((rows == 0).all(1).sum())
    assert zero_rows > 0
    # the classifier's output units are the classes: left whole (not sparsified at all)
    head = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    assert head.out_features == 10 and bool((head.weight != 0).all())
    assert "fc3" not in final["nonzero"] and set(final["nonzero"]) == {"fc1", "fc2"}
    rc = main(["sparsify", "--method", "logsum", "--granularity", "neuron", "--hp",
               "granularity=weight", "--epochs", "1", "--no-progress",
               "--out", str(tmp_path / "twice")])
    assert rc == 2 and "granularity given twice" in capsys.readouterr().err


# ---- state dicts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["logsum", "vardrop-lr-ar", "hardconcrete", "eta-trick"])
def test_state_dict_round_trip_and_granularity_check(method):
    torch.manual_seed(0)
    model = TinyMLP()
    sp = sparsify(model, method, granularity="neuron")
    _train(model, sp, 2, lr=1e-3)
    sd = model.state_dict()
    torch.manual_seed(1)
    other = TinyMLP()
    sparsify(other, method, granularity="neuron")
    other.load_state_dict(sd)
    model.eval()
    other.eval()
    x = _batch(model)[0]
    assert torch.equal(model(x), other(x))
    plain = TinyMLP()
    sparsify(plain, method)
    with pytest.raises((ValueError, RuntimeError), match="granularity|size mismatch"):
        plain.load_state_dict(sd)


def test_attach_takes_the_granularity_of_the_states():
    import copy

    from dualdrop.nn import Sparsifier

    torch.manual_seed(0)
    model = TinyMLP()
    sparsify(model, "magnitude", granularity="channel", sparsity=0.5, scope="layer")
    twin = copy.deepcopy(model)
    sp = Sparsifier.attach(twin, "magnitude", sparsity=0.5, scope="layer")
    assert sp.hparams["granularity"] == "neuron"
    sp.after_step(None, 10, 10)
    rows = _rows(twin.fc1.weight)
    assert bool(((rows == 0).all(1) | (rows != 0).all(1)).all())
    assert int((rows == 0).all(1).sum()) == 12


@pytest.mark.parametrize("method", ["logsum", "vardrop", "hardconcrete", "magnitude"])
def test_pruned_neurons_export_compact(method):
    pytest.importorskip("torch_pruning")
    from dualdrop.nn import compact_report, export_sparse

    torch.manual_seed(0)
    model = TinyMLP()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sp = sparsify(model, method, granularity="neuron", target_density=0.3, exclude=["fc3"])
        _train(model, sp, 30)
    model.eval()
    x = _batch(model)[0]
    small = export_sparse(model, layout="compact", example_inputs=x)
    dense = export_sparse(model, layout="dense")
    zero_rows = {n: int((_rows(getattr(dense, n).weight) == 0).all(1).sum()) for n in ("fc1",
                                                                                      "fc2")}
    report = compact_report(dense, small)
    for n, z in zero_rows.items():
        assert report[n] == (getattr(dense, n).out_features - z, getattr(dense, n).out_features)
    assert sum(zero_rows.values()) > 0
    with torch.no_grad():
        torch.testing.assert_close(small(x), model(x), rtol=0, atol=1e-5)


def test_head_groups_of_separate_projections():
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)
    sp = sparsify(attn, "hardconcrete", granularity="head")
    assert [tuple(st.gate_logits.shape) for _, st in sp.named_states()] == \
        [(2, 1, 1), (2, 1, 1), (2, 1, 1), (1, 2, 1)]
    out, _ = attn(torch.randn(2, 3, 8), torch.randn(2, 4, 6), torch.randn(2, 4, 5))
    out.sum().backward()
    assert all(st.gate_logits.grad is not None for _, st in sp.named_states())


def test_group_norm_gradient_and_hessian_under_torch_func():
    """The group norm's custom gradient (0 at a zero group) holds under torch.func, whose
    Hessian-vector products the noise diagnostics use: away from zero, grad and Hessian equal
    the closed forms x/||x|| and (I - u u^T)/||x||."""
    from dualdrop.nn._groups import Groups

    g = Groups("neuron", (3, 4), (3, 4), (3, 1))
    w = torch.randn(3, 4, dtype=torch.float64)
    w[1] = 0.0
    grad = torch.func.grad(lambda v: g.norm(v).sum())(w)
    n = w.norm(dim=1, keepdim=True)
    expect = torch.where(n > 0, w / n.clamp_min(1e-300), torch.zeros_like(w))
    assert torch.allclose(grad, expect)
    h = torch.func.hessian(lambda v: g.norm(v.reshape(3, 4)).sum())(w[0].repeat(3))
    u = w[0] / w[0].norm()
    block = (torch.eye(4, dtype=w.dtype) - torch.outer(u, u)) / w[0].norm()
    assert torch.allclose(h[:4, :4], block)
    assert torch.count_nonzero(h[:4, 4:]) == 0
