"""Users' own models: Transformer export, torch.compile, recurrent models after training, and a
weight used through ``F.linear`` without its layer's forward."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn import METHODS, Sparsifier, export_sparse, sparsify
from nn_tiny_models import train_steps

ALL = list(METHODS) + ["penalty:mcp"]
#: methods that act in a forward hook of the layer (Linear / convolution only)
HOOKED = ["vardrop-lr", "vardrop-lr-ar", "hardconcrete-neuron"]


def _quiet_sparsify(model, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # layers a method skips are named; not the point here
        return sparsify(model, method, **kw)


# ---- Transformer encoder: export and inference in both layouts ----------------------------------

class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x, mask=None):
        return self.head(self.enc(x, src_key_padding_mask=mask))


@pytest.mark.parametrize("layout", ["csr", "dense", "auto"])
def test_transformer_encoder_export_runs_and_matches(layout):
    torch.manual_seed(0)
    net = Encoder()
    sp = sparsify(net, "magnitude", sparsity=0.95, prune_every=1, end=0.5)
    x = torch.randn(4, 6, 16)
    train_steps(net, sp, lambda m: m(x).pow(2).mean(), steps=6)
    net.eval()
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, -2:] = True                                 # padding: the nested-tensor fast path
    plain = export_sparse(net, layout=layout)
    if layout == "csr":
        assert any(type(m).__name__ == "CSRLinear" for m in plain.modules())
    with torch.no_grad():                               # torch's fused inference path
        want = net(x)
        got = plain(x)
        want_m = net(x, mask)
        got_m = plain(x, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    keep = ~mask
    torch.testing.assert_close(got_m[keep], want_m[keep], atol=1e-5, rtol=1e-5)
    got_g = plain(x)                                    # with grad enabled too
    torch.testing.assert_close(got_g.detach(), want, atol=1e-5, rtol=1e-5)


# ---- torch.compile: every method, forward and backward -----------------------------------------

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 16, 3)

    def forward(self, x):
        return self.fc(F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1))


class Block(nn.Module):
    """A pre-norm Transformer block written with Linear layers (attention + MLP)."""

    def __init__(self, d=8):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(1, 2) / 8 ** 0.5, -1) @ v
        x = x + self.proj(a)
        return x + self.down(torch.relu(self.up(self.norm(x))))


COMPILE_MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)),
            lambda: torch.randn(5, 6)),
    "cnn": (SmallCNN, lambda: torch.randn(2, 1, 8, 8)),
    "block": (Block, lambda: torch.randn(2, 5, 8)),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(COMPILE_MODELS))
@pytest.mark.parametrize("method", ALL)
def test_compile_forward_backward(method, kind):
    build, make_x = COMPILE_MODELS[kind]
    torch.manual_seed(0)
    model = build()
    sp = _quiet_sparsify(model, method)
    x = make_x()
    compiled = torch.compile(model, backend="aot_eager")
    loss = compiled(x).pow(2).mean() + sp.regularizer(100)
    loss.backward()
    grads = {n: p.grad for n, p in sp.method_parameters().items()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    model.eval()
    with torch.no_grad():                               # deterministic: equal to eager
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["vardrop", "hardconcrete-neuron"])
def test_compile_inductor_cpu(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    sp = sparsify(model, method)
    compiled = torch.compile(model)                     # inductor, C++ on the CPU
    try:
        out = compiled(torch.randn(4, 6))
    except Exception as e:  # pragma: no cover - a machine without a C++ compiler
        if "compiler" in str(e).lower() or "cpp" in str(e).lower():
            pytest.skip(f"inductor cannot build C++ here: {str(e)[:80]}")
        raise
    (out.pow(2).mean() + sp.regularizer(100)).backward()
    assert all(p.grad is not None for p in sp.method_parameters().values())
    torch._dynamo.reset()


# ---- recurrent models after training and after an eval forward with grad on -------------------

class TiedLM(nn.Module):
    def __init__(self, vocab=13, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab)
        self.out.weight = self.emb.weight

    def forward(self, t):
        return self.out(self.rnn(self.emb(t))[0])


class RNNClassifier(nn.Module):
    def __init__(self, vocab=13, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, d, batch_first=True, num_layers=2)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, 3)

    def forward(self, t):
        return self.out(self.gru(self.rnn(self.emb(t))[0])[0][:, -1])


# the hooked methods act on no weight of the tied LM (Embedding, LSTM): refused, tested elsewhere
@pytest.mark.parametrize("method,kind", [(m, k) for k in ("tied", "classifier") for m in ALL
                                         if not (k == "tied" and m in HOOKED)])
def test_recurrent_copy_export_attach_after_training(method, kind):
    torch.manual_seed(0)
    model = TiedLM() if kind == "tied" else RNNClassifier()
    sp = _quiet_sparsify(model, method)
    t = torch.randint(0, 13, (3, 5))
    train_steps(model, sp, lambda m: m(t).float().pow(2).mean())
    for mode in ("train", "eval"):                      # a forward with grad on, in each mode
        getattr(model, mode)()
        model(t).sum()
        clone = copy.deepcopy(model)
        plain = export_sparse(model, layout="dense")
        again = Sparsifier.attach(clone, method)
        assert again.targets == sp.targets
        model.eval()
        clone.eval()
        with torch.no_grad():
            want = model(t)
            torch.testing.assert_close(clone(t), want)
            torch.testing.assert_close(plain(t), want, atol=1e-6, rtol=1e-6)
    # no computed (non-leaf) weight stays cached in a recurrent layer after a forward
    model.train()
    model(t).sum()
    for m in model.modules():
        if isinstance(m, nn.RNNBase):
            assert all(w is None or w.is_leaf for w in m._flat_weights)


def test_recurrent_copy_does_not_draw_noise():
    torch.manual_seed(0)
    model = TiedLM()
    sp = sparsify(model, "vardrop")
    model(torch.randint(0, 13, (2, 4))).sum()
    counts = [st.noise_count for _, st in sp.states()]
    copy.deepcopy(model)
    assert [st.noise_count for _, st in sp.states()] == counts


# ---- a weight used through F.linear without its layer's forward --------------------------------

class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.relu(F.linear(x, self.proj.weight, self.proj.bias)))


@pytest.mark.parametrize("method", HOOKED)
def test_functional_use_of_a_hooked_weight_is_named(method):
    torch.manual_seed(0)
    model = Functional()
    sp = sparsify(model, method)
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match=r"proj was used in training without calling"):
        train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=2)
    assert sp.bypassed == ["proj"]                      # head is called: not named
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # named once, not every step
        train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=2)


@pytest.mark.parametrize("method", HOOKED)
def test_layers_called_normally_are_not_named(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    sp = sparsify(model, method)
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=2)
    assert sp.bypassed == []


@pytest.mark.parametrize("method", ["vardrop", "hardconcrete", "logsum"])
def test_methods_acting_through_the_weight_cover_functional_use(method):
    torch.manual_seed(0)
    model = Functional()
    sp = sparsify(model, method)
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_steps(model, sp, lambda m: m(x).pow(2).mean(), steps=2)
    assert sp.bypassed == []
