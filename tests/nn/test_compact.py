"""Compact export: dead units removed physically, outputs unchanged (dualdrop.nn.compact)."""

import sys

import pytest
import torch
import torch.nn as nn

pytest.importorskip("torch_pruning")

from dualdrop.nn import (compact, compact_report, export_sparse, load_compact,  # noqa: E402
                         save_compact, sparsify)

torch.set_num_threads(1)


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def assert_same(a, b, x):
    with torch.no_grad():
        ya, yb = a.eval()(x), b.eval()(x)
    assert ya.shape == yb.shape
    torch.testing.assert_close(yb, ya, rtol=0, atol=1e-5)


def round_trip(small, fresh, x, tmp_path):
    path = tmp_path / "compact.pt"
    save_compact(small, path)
    blob = torch.load(path, weights_only=True)  # plain tensors, ints and strings
    assert set(blob) >= {"state_dict", "shapes"}
    back = load_compact(path, fresh)
    assert_same(small, back, x)
    assert compact_report(small, back) == compact_report(small, small)


# ------------------------------------------------------------------------------------- MLP
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.ReLU(),
                         nn.Linear(5, 3))


def test_mlp_dead_rows_removed_biases_folded(tmp_path):
    m = mlp()
    with torch.no_grad():
        m[0].weight[[1, 3, 6]] = 0
        m[0].bias[[1, 3, 6]] = torch.tensor([0.7, -0.4, 1.3])  # relu(b) feeds the next layer
        m[2].weight[[0, 2]] = 0
        m[2].bias[[0, 2]] = torch.tensor([0.9, 0.2])
        m[4].weight[1] = 0  # the model's output keeps its width
    x = torch.randn(7, 6)
    small = compact(m, x)
    assert compact_report(m, small) == {"0": (5, 8), "2": (3, 5), "4": (3, 3)}
    assert small[2].in_features == 5 and small[4].in_features == 3
    assert n_params(small) < n_params(m)
    assert not small.training
    assert_same(m, small, torch.randn(50, 6))
    assert_same(m, m, x)  # the input model is unchanged
    assert m[0].out_features == 8
    round_trip(small, mlp(), x, tmp_path)


def test_unread_units_go_even_if_their_layer_computes_them():
    """A unit whose every reader has a zero column (input-unit gates) contributes nothing."""
    m = mlp()
    with torch.no_grad():
        m[2].weight[:, [0, 4]] = 0
    small = compact(m, torch.randn(4, 6))
    assert compact_report(m, small)["0"] == (6, 8)
    assert_same(m, small, torch.randn(20, 6))


class NoBiasNext(nn.Module):
    """A dead unit with relu(b) > 0 read by a layer without bias cannot be folded."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 5, bias=False)
        self.out = nn.Linear(5, 2)

    def forward(self, x):
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class RawSkip(nn.Module):
    """fc1's units are added to the raw input: never constant."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x) + x))


class Normed(nn.Module):
    """A LayerNorm mixes the units: removing a constant one changes its mean and variance."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)))


class Twice(nn.Module):
    """One layer called twice: one graph node in two roles."""

    def __init__(self):
        super().__init__()
        self.fc1, self.mid, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.mid(torch.relu(self.mid(torch.relu(self.fc1(x))))))


@pytest.mark.parametrize("cls, want", [(NoBiasNext, 7), (RawSkip, 6), (Normed, 8), (Twice, 8)])
def test_units_stay_when_removing_them_would_not_be_exact(cls, want):
    torch.manual_seed(6)
    m = cls()
    with torch.no_grad():
        m.fc1.weight[[1, 3]] = 0
        m.fc1.bias[[1, 3]] = torch.tensor([0.8, -0.8])  # relu: 0.8 and 0 (the latter can go)
    small = compact(m, torch.randn(5, 6))
    assert compact_report(m, small)["fc1"][0] == want
    assert_same(m, small, torch.randn(9, 6))


# ------------------------------------------------------------------------- residual CNN + BN
class ResCNN(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.pool, self.head = nn.AdaptiveAvgPool2d(1), nn.Linear(c, 4)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return self.head(self.pool(torch.relu(x + y)).flatten(1))


def res_cnn():
    torch.manual_seed(1)
    m = ResCNN()
    with torch.no_grad():
        for bn in (m.bn0, m.b1, m.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return m.eval()


def kill(conv, bn, idx, const):
    """Zero the filters ``idx``; the BN output of those channels is then ``const``."""
    conv.weight[idx] = 0
    bn.running_mean[idx] = conv.bias[idx]
    bn.bias[idx] = torch.as_tensor(const, dtype=bn.bias.dtype)


def test_residual_cnn_both_branches_must_be_dead(tmp_path):
    m = res_cnn()
    with torch.no_grad():
        # the residual stream: channels 0, 1 dead in both branches of the add (go), 2 in the
        # stem only and 5 in the block only (stay)
        kill(m.stem, m.bn0, [0, 1, 2], -5.0)          # relu(-5) = 0 reaches c1 (zero padding)
        kill(m.c2, m.b2, [0, 1, 5], [1.0, 0.5, 0.3])  # relu(0 + 1.0) folds into head's bias
        # inside the block: channel 3 is 0 after relu (goes); channel 4 is relu(2) = 2, read by
        # the zero-padded c2, where a constant is not constant at the borders (stays)
        kill(m.c1, m.b1, [3, 4], [-5.0, 2.0])
    x = torch.randn(2, 3, 6, 6)
    small = compact(m, x)
    assert compact_report(m, small) == {"stem": (6, 8), "c1": (7, 8), "c2": (6, 8),
                                        "head": (4, 4)}
    assert small.bn0.num_features == small.b2.num_features == 6 and small.b1.num_features == 7
    assert small.head.in_features == 6
    assert n_params(small) < n_params(m)
    assert_same(m, small, torch.randn(3, 3, 7, 5))
    round_trip(small, ResCNN(), x, tmp_path)


def test_unpadded_conv_takes_the_constant_into_its_bias():
    torch.manual_seed(2)
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 3, 1),
                      nn.ReLU(), nn.Conv2d(3, 2, 3, padding=1)).eval()
    with torch.no_grad():
        kill(m[0], m[1], [1, 2], [0.8, 1.5])
    small = compact(m, torch.randn(2, 2, 6, 6))
    assert compact_report(m, small)["0"] == (2, 4)
    assert_same(m, small, torch.randn(2, 2, 9, 8))


def test_flattened_channels_fold_into_the_linear_head():
    """conv -> relu -> maxpool -> flatten -> Linear: a channel is a block of Linear inputs."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(5 * 3 * 3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        m[0].weight[[0, 3]] = 0
        m[0].bias[[0, 3]] = torch.tensor([0.6, -0.2])
    small = compact(m, torch.randn(2, 2, 6, 6))
    assert compact_report(m, small) == {"0": (3, 5), "4": (4, 4), "6": (2, 2)}
    assert small[4].in_features == 3 * 3 * 3
    assert_same(m, small, torch.randn(5, 2, 6, 6))


class CatDW(nn.Module):
    """A concatenation under one BatchNorm, a depthwise and a grouped convolution."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(10)
        self.dw = nn.Conv2d(10, 10, 3, padding=1, groups=10)
        self.pw = nn.Conv2d(10, 6, 1)
        self.g = nn.Conv2d(6, 6, 3, padding=1, groups=2)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.relu(self.bn(torch.cat([self.a(x), self.b(x)], 1)))
        h = torch.relu(self.pw(torch.relu(self.dw(h))))
        return self.head(torch.relu(self.g(h)).mean((2, 3)))


def test_concatenation_depthwise_and_grouped(tmp_path):
    torch.manual_seed(7)
    m = CatDW().eval()
    with torch.no_grad():
        m.a.weight[[0, 1]] = 0      # cat channels 0, 1
        m.b.weight[[0, 5]] = 0      # cat channels 4, 9
        m.dw.weight[[0, 4, 6]] = 0  # 0 and 4 dead on both sides of the depthwise conv: go;
        m.pw.weight[[2, 3]] = 0     # 1, 9 and 6 on one side only: stay; pw's units are read by
    x = torch.randn(2, 3, 5, 5)     # a grouped convolution: stay
    small = compact(m, x)
    assert compact_report(m, small) == {"a": (3, 4), "b": (5, 6), "dw": (8, 10), "pw": (6, 6),
                                        "g": (6, 6), "head": (2, 2)}
    assert small.dw.groups == 8 and small.bn.num_features == 8
    assert_same(m, small, torch.randn(3, 3, 6, 4))
    round_trip(small, CatDW(), x, tmp_path)


# ------------------------------------------------------------------------------ transformer
class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.enc(x))


def test_transformer_feedforward_units_removed(tmp_path):
    torch.manual_seed(3)
    m = TinyTransformer().eval()
    dead = [0, 5, 9, 40, 63]
    with torch.no_grad():
        m.enc.linear1.weight[dead] = 0
        m.enc.linear1.bias[5] = 0.5  # relu(0.5) folds into linear2's bias
    x = torch.randn(2, 5, 32)
    small = compact(m, x)
    report = compact_report(m, small)
    assert report["enc.linear1"] == (59, 64)
    assert report["enc.linear2"] == (32, 32) and report["head"] == (3, 3)  # residual + LayerNorm
    assert n_params(small) < n_params(m)
    assert_same(m, small, torch.randn(3, 4, 32))
    with torch.enable_grad():  # the non-fused path too
        torch.testing.assert_close(small(x), m(x), rtol=0, atol=1e-5)
    round_trip(small, TinyTransformer(), x, tmp_path)


class HeadsTransformer(nn.Module):
    def __init__(self, batch_first=True):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
        self.head = nn.Linear(32, 3)

    def forward(self, x, mask=None, pad=None):
        return self.head(self.enc(x, src_mask=mask, src_key_padding_mask=pad))


def kill_heads(mha, v_dead=(), out_dead=()):
    """Head groups as granularity='head' zeroes them: q, k, v rows of a head (its value bias
    left nonzero: its constant output must fold into out_proj's bias), or its out_proj columns."""
    E, d = mha.embed_dim, mha.embed_dim // mha.num_heads
    with torch.no_grad():
        for h in v_dead:
            for i in range(3):
                mha.in_proj_weight[i * E + h * d:i * E + (h + 1) * d] = 0
            mha.in_proj_bias[2 * E + h * d:2 * E + (h + 1) * d].uniform_(0.5, 1.0)
        for h in out_dead:
            mha.out_proj.weight[:, h * d:(h + 1) * d] = 0


@pytest.mark.parametrize("batch_first", [True, False])
def test_dead_attention_heads_removed_value_bias_folded(batch_first, tmp_path):
    torch.manual_seed(5)
    m = HeadsTransformer(batch_first).eval()
    kill_heads(m.enc.self_attn, v_dead=[1], out_dead=[3])
    shape = (2, 6, 32) if batch_first else (6, 2, 32)
    x = torch.randn(*shape)
    small = compact(m, x)
    attn = small.enc.self_attn
    assert type(attn).__name__ == "HeadPrunedAttention"
    assert compact_report(m, small)["enc.self_attn"] == (2, 4)
    assert attn.head_index.tolist() == [0, 2]
    assert n_params(small) < n_params(m) - 2 * 3 * 8 * 32  # two heads' q, k, v rows
    y = torch.randn(*shape)
    assert_same(m, small, y)
    causal = nn.Transformer.generate_square_subsequent_mask(6)  # additive float mask
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    with torch.no_grad():
        torch.testing.assert_close(small(y, causal), m(y, causal), rtol=0, atol=1e-5)
        torch.testing.assert_close(small(y, causal.isinf(), pad), m(y, causal.isinf(), pad),
                                   rtol=0, atol=1e-5)  # boolean masks
    with torch.enable_grad():  # the encoder layer's non-fused path, gradients flow
        small.train()
        out = small(y)
        out.sum().backward()
        assert attn.q_proj.weight.grad is not None
        small.eval()
    fresh = HeadsTransformer(batch_first)
    round_trip(small, fresh, x, tmp_path)
    assert compact_report(m, fresh)["enc.self_attn"] == (2, 4)


def test_attention_alone_per_head_masks_and_weights():
    """``nn.MultiheadAttention`` itself: a per-(batch, head) mask is read at the kept heads and
    the kept heads' attention weights are the original's."""
    torch.manual_seed(6)
    E, H, B, L, S = 16, 4, 3, 5, 7
    mha = nn.MultiheadAttention(E, H, kdim=10, vdim=12).eval()
    d = E // H
    with torch.no_grad():
        mha.v_proj_weight[2 * d:3 * d] = 0
    net = nn.ModuleDict({"att": mha})
    q, k, v = torch.randn(L, B, E), torch.randn(S, B, 10), torch.randn(S, B, 12)
    from dualdrop.nn._heads import remove_dead_heads
    assert remove_dead_heads(net) == {"att": (3, 4)}
    small = net["att"]
    mask = torch.randn(B * H, L, S)
    with torch.no_grad():
        y0, w0 = mha(q, k, v, attn_mask=mask, average_attn_weights=False)
        y1, w1 = small(q, k, v, attn_mask=mask, average_attn_weights=False)
        torch.testing.assert_close(y1, y0, rtol=0, atol=1e-5)
        torch.testing.assert_close(w1, w0[:, [0, 1, 3]], rtol=0, atol=1e-6)
        yu0, _ = mha(q[:, 0], k[:, 0], v[:, 0])  # unbatched
        yu1, _ = small(q[:, 0], k[:, 0], v[:, 0])
        torch.testing.assert_close(yu1, yu0, rtol=0, atol=1e-5)


def test_heads_that_cannot_go_stay():
    torch.manual_seed(7)
    from dualdrop.nn._heads import remove_dead_heads
    every = HeadsTransformer().eval()
    kill_heads(every.enc.self_attn, v_dead=[0, 1, 2, 3])
    x = torch.randn(2, 5, 32)
    small = compact(every, x)  # an attention keeps one head, its live constant included
    assert compact_report(every, small)["enc.self_attn"] == (1, 4)
    assert_same(every, small, torch.randn(2, 5, 32))
    extra_key = nn.ModuleDict({"att": nn.MultiheadAttention(16, 4, add_bias_kv=True)})
    with torch.no_grad():
        extra_key["att"].in_proj_weight[32:36] = 0
    assert remove_dead_heads(extra_key) == {}  # its extra key makes o_h input dependent
    assert type(extra_key["att"]) is nn.MultiheadAttention


def test_head_granularity_training_exports_fewer_heads():
    """granularity='head' end to end: the heads the method prunes leave the compact network."""
    torch.manual_seed(8)
    model = HeadsTransformer()
    sp = sparsify(model, "magnitude", granularity="head", sparsity=0.5, begin=0.0, end=0.5,
                  prune_every=1, exclude=["head.weight"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 6, 32), torch.randint(0, 3, (16, 6))
    for step in range(1, 11):
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, 10)
    model.eval()
    dense = export_sparse(model, layout="dense")
    small = export_sparse(model, layout="compact", example_inputs=x)
    kept, total = compact_report(dense, small)["enc.self_attn"]
    assert total == 4 and kept <= 3
    assert compact_report(dense, small)["enc.linear1"][0] <= 40
    assert_same(dense, small, torch.randn(4, 6, 32))


# ------------------------------------------------------------------------------ end to end
def test_sparsified_model_exports_compact():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(),
                          nn.Linear(12, 3))
    sp = sparsify(model, "hardconcrete-neuron", droprate_init=0.2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    for step in range(1, 6):
        loss = nn.functional.cross_entropy(model(x), y) + sp.regularizer(64)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, 5)
    states = dict(sp.named_states())
    with torch.no_grad():  # gates a longer run would have closed: inputs 2, 7, 11 of layer 2
        states["2"].gate_logits[[2, 7, 11]] = -20.0
    model.eval()
    small = export_sparse(model, layout="compact", example_inputs=x)
    dense = export_sparse(model, layout="dense")
    assert compact_report(dense, small)["0"] == (13, 16)
    assert n_params(small) < n_params(dense)
    assert_same(dense, small, torch.randn(30, 10))
    with torch.no_grad():
        torch.testing.assert_close(small(x), model(x), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------- errors
def test_example_inputs_required():
    with pytest.raises(TypeError, match="example_inputs is required.*forward run"):
        compact(mlp(), None)
    with pytest.raises(TypeError, match="example_inputs is required"):
        export_sparse(mlp(), layout="compact")
    with pytest.raises(ValueError, match="example_inputs is only used by layout='compact'"):
        export_sparse(mlp(), layout="dense", example_inputs=torch.randn(2, 6))
    with pytest.raises(ValueError, match="example_inputs must be valid inputs"):
        compact(mlp(), torch.randn(2, 7))


def test_missing_torch_pruning_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_pruning", None)
    with pytest.raises(ImportError, match=r'pip install "dualdrop\[structured\]"'):
        compact(mlp(), torch.randn(2, 6))


class NotTraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x).sum().item()


def test_untraceable_model_suggests_dense():
    with pytest.raises(ValueError, match='cannot trace.*layout="dense"'):
        compact(NotTraceable(), torch.randn(2, 4))


def test_corrupt_or_mismatched_file(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot be read as a compact model") as e:
        load_compact(bad, mlp())
    assert "\n" not in str(e.value)
    plain = tmp_path / "plain.pt"
    torch.save(mlp().state_dict(), plain)
    with pytest.raises(ValueError, match="is not a compact model file"):
        load_compact(plain, mlp())
    m = mlp()
    with torch.no_grad():
        m[0].weight[[1, 3]] = 0
    good = tmp_path / "good.pt"
    save_compact(compact(m, torch.randn(2, 6)), good)
    with pytest.raises(ValueError, match="does not fit") as e:
        load_compact(good, ResCNN())
    assert "\n" not in str(e.value)
    other = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.Tanh(),
                          nn.LayerNorm(5))
    with pytest.raises(ValueError, match="does not fit"):
        load_compact(good, other)
