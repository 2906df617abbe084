"""Hugging Face GPT-2 and its ``Conv1D`` (a Linear layer with the weight transposed) as a
first-class layer: coverage by every method, output-unit groups on weight columns, local
reparameterization and neuron gates through its forward, CSR and compact export, Torch-Pruning
coupling; and the weights sparsify leaves dense are always named."""

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn import (METHODS, compact_report, export_sparse, load_compact, save_compact,
                         sparsify, state_of)
from nn_tiny_models import train_steps

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

transformers.logging.set_verbosity_error()  # the tiny config's token ids: not the point here

ALL = list(METHODS) + ["penalty:mcp"]
HOOKED = ["vardrop-lr", "vardrop-lr-ar", "hardconcrete-neuron"]
PROJECTIONS = [f"transformer.h.{i}.{p}" for i in range(2)
               for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]


def gpt2(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=200))


def ids(seed=1, n=2, t=12):
    return torch.randint(0, 200, (n, t), generator=torch.Generator().manual_seed(seed))


def lm_loss(model, x):
    return model(x, labels=x).loss


def sparsify_caught(model, method, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sp = sparsify(model, method, **kw)
    return sp, "\n".join(str(w.message) for w in caught if issubclass(w.category, UserWarning))


def plain_state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_as_given(model, before, keys_order=None):
    """No parametrization, hook or extra tensor left; every tensor as it was."""
    sd = model.state_dict()
    assert list(sd) == (keys_order or list(before))
    for k, v in before.items():
        assert torch.equal(sd[k], v), k
    for m in model.modules():
        assert not hasattr(m, "parametrizations"), m
        assert not m._forward_hooks and not m._forward_pre_hooks, m


# ---- coverage: every Conv1D weight, every method; what is left dense is named ------------------

@pytest.mark.parametrize("method", ALL)
def test_every_gpt2_projection_is_sparsified_and_the_rest_named(method):
    model = gpt2()
    sp, said = sparsify_caught(model, method)
    assert set(PROJECTIONS) <= set(sp.targets)
    assert set(sp.density()) == set(sp.targets) | {"total"}
    if method in HOOKED:  # the tied wte/lm_head and wpe: skipped, named, not refused
        assert set(sp.targets) == set(PROJECTIONS)
        assert "transformer.wte.weight (Embedding+Linear)" in said and "transformer.wpe" in said
    else:
        assert {"transformer.wte", "transformer.wpe"} <= set(sp.targets)
        assert said == ""
    dense = [r["layer"] for r in sp.report() if r["role"] == "weight"]
    assert all(name in said for name in dense)  # nothing weight-like left dense silently


@pytest.mark.parametrize("method", HOOKED)
def test_on_unsupported_error_keeps_the_refusal_and_leaves_the_model(method):
    model = gpt2()
    before = plain_state(model)
    with pytest.raises(ValueError, match=r"transformer\.wte\.weight \(Embedding\+Linear\)"):
        sparsify(model, method, on_unsupported="error")
    assert_as_given(model, before)


# ---- output units are the weight's columns ------------------------------------------------------

def test_neuron_groups_of_a_conv1d_are_its_columns():
    torch.manual_seed(0)
    net = nn.Sequential(Conv1D(16, 6), nn.ReLU(), Conv1D(3, 16))
    sp = sparsify(net, "magnitude", granularity="neuron", sparsity=0.5, prune_every=1, end=0.5)
    st = state_of(net[0])
    assert st.groups.shape == (1, 16) and st.groups.n_groups == 16
    x = torch.randn(8, 6)
    train_steps(net, sp, lambda m: m(x).pow(2).mean(), steps=4)
    mask = st.weight_mask
    cols = mask.amax(0)
    assert torch.equal(mask, cols.expand_as(mask))   # whole columns
    assert int(cols.sum()) == 8                      # half of the 16 output units
    small = export_sparse(net, "compact", example_inputs=x)
    assert compact_report(net, small)["0"] == (8, 16)
    net.eval()
    torch.testing.assert_close(small(x), net(x))


# ---- the forward hooks act through Conv1D's forward: the same numbers as a Linear ----------------

@pytest.mark.parametrize("method", HOOKED)
def test_forward_hook_methods_give_conv1d_what_they_give_the_equal_linear(method):
    torch.manual_seed(0)
    conv = Conv1D(5, 7)
    lin = nn.Linear(7, 5)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        conv.bias.normal_()
        lin.bias.copy_(conv.bias)
    sc, sl = sparsify(conv, method), sparsify(lin, method)
    a, b = state_of(conv), state_of(lin)
    with torch.no_grad():  # the same method state, transposed where it is per weight
        for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
            pa.copy_(torch.randn_like(pa))
            pb.copy_(pa.t() if pa.dim() == 2 else pa)
    b.noise_seed, b.noise_count = a.noise_seed, a.noise_count
    x = torch.randn(4, 3, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no "bypassed its layer's forward" warning
        ya, yb = conv(x), lin(x)
        ra, rb = sc.regularizer(50), sl.regularizer(50)
    assert not torch.allclose(ya, conv.eval()(x).detach())  # noise or gates did act
    conv.train()
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ra, rb)
    (ya.square().sum() + ra).backward()
    (yb.square().sum() + rb).backward()
    torch.testing.assert_close(conv.parametrizations.weight.original.grad,
                               lin.parametrizations.weight.original.grad.t(), atol=1e-4,
                               rtol=1e-4)
    for (_, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pa.grad, pb.grad.t() if pb.dim() == 2 else pb.grad,
                                   atol=1e-4, rtol=1e-4)
    assert sc.bypassed == [] and sl.bypassed == []


# ---- every method on GPT-2: training steps, dense / CSR export, compact export -------------------

@pytest.mark.parametrize("method", ALL)
def test_gpt2_trains_and_exports_in_every_layout(method):
    model, x = gpt2(), ids()
    sp, _ = sparsify_caught(model, method)
    train_steps(model, sp, lambda m: lm_loss(m, x))
    model.eval()
    with torch.no_grad():
        want = model(x).logits
        csr = export_sparse(model, "csr")
        assert sum(type(m).__name__ == "CSRLinear" for m in csr.modules()) == 8
        for plain in (export_sparse(model, "dense"), csr,
                      export_sparse(model, "compact", example_inputs=x)):
            torch.testing.assert_close(plain(x).logits, want, atol=1e-5, rtol=1e-5)
            assert not any(hasattr(m, "parametrizations") for m in plain.modules())


@pytest.mark.parametrize("method,kw", [
    ("magnitude", {"sparsity": 0.5, "prune_every": 1, "end": 0.5}),
    ("logsum", {"target_density": 0.3}),
])
def test_gpt2_units_coupled_by_the_graph_and_removed_by_the_compact_export(method, kw, tmp_path):
    model, x = gpt2(), ids()
    sp, _ = sparsify_caught(model, method, granularity="neuron", example_inputs=x, **kw)
    # the residual stream: every block's attention and MLP output projection, tied
    tied = {frozenset(sp._pairs[i][0].key for i, _, _ in tie) for tie in sp.ties}
    assert frozenset(f"transformer.h.{i}.{p}" for i in range(2)
                     for p in ("attn.c_proj", "mlp.c_proj")) in tied
    train_steps(model, sp, lambda m: lm_loss(m, x), steps=10)
    model.eval()
    small = export_sparse(model, "compact", example_inputs=x)
    rows = compact_report(model, small)
    for i in range(2):  # the MLP's hidden units go; the residual width stays (LayerNorm)
        kept, total = rows[f"transformer.h.{i}.mlp.c_fc"]
        assert total == 256 and kept < 0.75 * total
        assert rows[f"transformer.h.{i}.mlp.c_proj"] == (64, 64)
    with torch.no_grad():
        torch.testing.assert_close(small(x).logits, model(x).logits, atol=1e-5, rtol=1e-5)
    save_compact(small, tmp_path / "small.pt")
    again = load_compact(tmp_path / "small.pt", gpt2(seed=5))
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, small(x).logits)


def test_gpt2_input_gates_remove_mlp_units_in_the_compact_export():
    model, x = gpt2(), ids()
    sp, _ = sparsify_caught(model, "hardconcrete-neuron")
    with torch.no_grad():  # close the gates of half of each MLP's hidden units (c_proj inputs)
        for i in range(2):
            state_of(model.transformer.h[i].mlp.c_proj).gate_logits[::2] = -20.0
    model.eval()
    small = export_sparse(model, "compact", example_inputs=x)
    assert compact_report(model, small)["transformer.h.0.mlp.c_fc"] == (128, 256)
    with torch.no_grad():
        torch.testing.assert_close(small(x).logits, model(x).logits, atol=1e-5, rtol=1e-5)


# ---- the CSR export in half precision -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["csr", "auto"])
def test_csr_export_of_a_half_precision_model_runs(dtype, layout):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), Conv1D(4, 32)).to(dtype)
    sp = sparsify(net, "magnitude", sparsity=0.95, prune_every=1, end=0.5)
    x = torch.randn(5, 12, dtype=dtype)
    opt = torch.optim.SGD(net.parameters(), 1e-2)
    for s in range(1, 3):
        opt.zero_grad()
        net(x).float().pow(2).mean().backward()
        opt.step()
        sp.after_step(opt, s, 2)
    out = export_sparse(net, layout)
    if layout == "csr":  # "auto" keeps a layer dense unless CSR measured faster
        assert sum(type(m).__name__ == "CSRLinear" for m in out.modules()) == 2
    with torch.no_grad():
        got, want = out(x), export_sparse(net, "dense")(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


# ---- what sparsify refuses, and leaves as given --------------------------------------------------

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("method", ["logsum", "magnitude", "vardrop"])
def test_head_granularity_without_attention_is_refused_naming_the_alternatives(method):
    for model in (Mlp(), gpt2()):
        before = plain_state(model)
        with pytest.raises(ValueError, match=r"no selected weight belongs to one.*'neuron'.*"
                                             r"'weight'"):
            sparsify(model, method, granularity="head")
        assert_as_given(model, before)


def test_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        model = Mlp()
    with pytest.raises(ValueError, match="meta device.*to_empty"):
        sparsify(model, "logsum")
    assert not any(hasattr(m, "parametrizations") for m in model.modules())


def test_refused_example_inputs_leave_no_tracing_hooks():
    torch.manual_seed(0)
    model = Mlp()
    before = plain_state(model)
    with pytest.raises(ValueError, match="example_inputs"):
        sparsify(model, "logsum", granularity="neuron", example_inputs=torch.randn(2, 5))
    assert_as_given(model, before)
    assert model.training
    sp = sparsify(model, "logsum", granularity="neuron", example_inputs=torch.randn(2, 6))
    assert len(sp.ties) == 0 and len(sp.states()) == 2   # a later call works as on a fresh model


def test_a_failure_while_acting_puts_parameters_back_in_their_order(monkeypatch):
    model = Mlp()
    before = plain_state(model)
    from dualdrop.nn.methods.penalty import method as penalty

    made = []
    real = penalty.PenaltyState.__init__

    def fail_second(self, *a, **k):  # the second weight's state cannot be made
        made.append(1)
        if len(made) == 2:
            raise RuntimeError("boom")
        real(self, *a, **k)

    monkeypatch.setattr(penalty.PenaltyState, "__init__", fail_second)
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"):
        sparsify(model, "logsum")
    assert_as_given(model, before)   # state_dict keys in their order: weight before bias
    assert list(model.fc1._parameters) == ["weight", "bias"]
    assert torch.equal(torch.get_rng_state(), rng)


class Custom(nn.Module):
    """A layer of a type dualdrop does not know, with a weight matrix."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 6))
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return F.linear(x, self.weight) * self.scale


class WithCustom(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.fc = Custom(), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.proj(x))


def test_a_weight_of_an_unknown_layer_type_is_named():
    _, said = sparsify_caught(WithCustom(), "logsum")
    assert "proj.weight (Custom)" in said and "include=" in said
    assert "scale" not in said                         # 1-D: not a weight matrix
    _, said = sparsify_caught(WithCustom(), "logsum", exclude=["proj"])
    assert said == ""
    _, said = sparsify_caught(WithCustom(), "logsum", exclude=[Custom])
    assert said == ""
    sp, said = sparsify_caught(WithCustom(), "logsum", include=["proj.weight", "fc"])
    assert said == "" and sp.targets == ["proj.weight", "fc"]


# ---- ConvTranspose under magnitude pruning -------------------------------------------------------

class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.up1 = nn.ConvTranspose1d(4, 6, 3, groups=2)
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        u = self.up(torch.relu(self.down(a)))
        y = self.out(torch.cat([a, u], 1))
        return y + self.up1(y.flatten(2)[:, :, :8].expand(-1, 4, -1)).mean()


@pytest.mark.parametrize("kw", [{}, {"granularity": "neuron"}, {"target_density": 0.2},
                                {"scope": "layer"}])
def test_magnitude_prunes_conv_transpose_weights_and_counts_them(kw):
    torch.manual_seed(0)
    model = UNet()
    sp, said = sparsify_caught(model, "magnitude", **kw)
    assert said == "" and {"up", "up1"} <= set(sp.targets)
    x = torch.randn(2, 1, 8, 8)
    train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=60)
    dens = sp.density()
    assert dens["up"] < 1.0 and dens["up1"] < 1.0
    nnz = sum(int(torch.count_nonzero(state_of(getattr(model, k)).eval_weight(
        getattr(model, k).parametrizations.weight.original))) for k in sp.targets)
    total = sum(getattr(model, k).weight.numel() for k in sp.targets)
    assert dens["total"] == pytest.approx(nnz / total)
    rows = {r["layer"]: r for r in sp.report()}
    assert rows["total"]["fraction"] == pytest.approx(dens["total"])
