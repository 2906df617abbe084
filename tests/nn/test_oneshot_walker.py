"""prune_oneshot end to end: every layer type's problem checked against its own forward, the
sequential walk, exact budgets, refused calls that leave the model as given, the held masks."""

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dualdrop.nn import prune_oneshot
from dualdrop.nn.oneshot import Budget, OneShotMethod
from dualdrop.nn.oneshot.methods.magnitude import Magnitude


class ConvNet(nn.Module):
    """Conv2d (reflect padding), Conv2d (stride, dilation, rectangular kernel), Conv1d (an even
    kernel, padding "same": one more on the right), Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect")
        self.c2 = nn.Conv2d(4, 8, (3, 2), stride=2, dilation=(1, 2))
        self.c3 = nn.Conv1d(8, 8, 4, padding="same")
        self.fc = nn.Linear(8 * 9, 5)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))                    # (B, 8, 3, 3)
        x = torch.relu(self.c3(x.flatten(2)))         # (B, 8, 9)
        return self.fc(x.flatten(1))


class AttnNet(nn.Module):
    """Self-attention (batch first) and cross-attention with other key/value widths."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.cross = nn.MultiheadAttention(8, 2, kdim=4, vdim=4, batch_first=True)
        self.mem = nn.Linear(6, 4)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        m = self.mem(x)
        h = h + self.cross(h, m, m, need_weights=False)[0]
        return self.head(h.mean(1))


def attention_context(mha, q, k, v):
    """Multi-head attention's concatenated heads, written out (batch first, no masks)."""
    E, H = mha.embed_dim, mha.num_heads
    if mha._qkv_same_embed_dim:
        Wq, Wk, Wv = mha.in_proj_weight.chunk(3)
    else:
        Wq, Wk, Wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    bq, bk, bv = mha.in_proj_bias.chunk(3)
    Q, K, V = q @ Wq.T + bq, k @ Wk.T + bk, v @ Wv.T + bv
    B, L, S = q.shape[0], q.shape[1], k.shape[1]
    Q = Q.view(B, L, H, E // H).transpose(1, 2)
    K = K.view(B, S, H, E // H).transpose(1, 2)
    V = V.view(B, S, H, E // H).transpose(1, 2)
    A = torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(E // H), -1)
    return (A @ V).transpose(1, 2).reshape(B, L, E)


def rel(num, den):
    return float((num.detach() ** 2).sum() / (den.detach() ** 2).sum())


def capture_inputs(model, calib, modules):
    """Every call's inputs of ``modules`` (by name) on ``calib``."""
    seen = {n: [] for n in modules}
    hs = [dict(model.named_modules())[n].register_forward_pre_hook(
        (lambda n: lambda m, a, kw: seen[n].append((a, kw)))(n), with_kwargs=True)
        for n in modules]
    with torch.no_grad():
        for b in calib:
            model(b)
    for h in hs:
        h.remove()
    return seen


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv_and_linear_objectives_match_their_own_forward():
    torch.manual_seed(0)
    net = ConvNet()
    dense = copy.deepcopy(net)
    calib = [torch.randn(16, 2, 8, 8) for _ in range(3)]
    res = prune_oneshot(net, calib, "sparsegpt", target_density=0.3, progress=False)
    rows = {r["layer"]: r for r in res.report.layers}
    assert list(rows) == ["c1", "c2", "c3", "fc"]             # forward order
    seen = capture_inputs(net, calib, ["c1", "c2", "c3", "fc"])
    for name in ("c1", "c2", "c3"):
        layer, W0 = getattr(net, name), getattr(dense, name).weight
        diff = torch.cat([layer._conv_forward(a[0], layer.weight - W0, None) for a, _ in seen[name]])
        ref = torch.cat([layer._conv_forward(a[0], W0, None) for a, _ in seen[name]])
        assert rows[name]["objective"] == pytest.approx(rel(diff, ref), rel=1e-4)
        assert abs(rows[name]["kept"] - 0.3 * W0.numel()) < 1
    x = torch.cat([a[0] for a, _ in seen["fc"]])
    assert rows["fc"]["objective"] == pytest.approx(
        rel(x @ (net.fc.weight - dense.fc.weight).T, x @ dense.fc.weight.T), rel=1e-4)
    assert res.report.density == pytest.approx(0.3, abs=1e-3)
    for name, mask in res.masks.items():
        assert torch.equal(mask, dict(net.named_parameters())[name] != 0)


def test_attention_projections_match_their_own_forward():
    torch.manual_seed(1)
    net = AttnNet()
    dense = copy.deepcopy(net)
    calib = [torch.randn(4, 5, 6) for _ in range(3)]
    res = prune_oneshot(net, calib, "sparsegpt", target_density=0.5, progress=False)
    rows = {r["layer"]: r for r in res.report.layers}
    assert list(rows) == ["embed", "attn.in_proj.q", "attn.in_proj.k", "attn.in_proj.v",
                          "attn.out_proj", "mem", "cross.in_proj.q", "cross.in_proj.k",
                          "cross.in_proj.v", "cross.out_proj", "head"]
    # the final network's inputs to each projection are those it was pruned on
    with torch.no_grad():
        x = torch.cat(calib)
        h = net.embed(x)
        for attn_name, kv_of in (("attn", None), ("cross", "mem")):
            mha, mha0 = getattr(net, attn_name), getattr(dense, attn_name)
            kv = h if kv_of is None else net.mem(x)
            W = (mha.in_proj_weight.chunk(3) if mha._qkv_same_embed_dim
                 else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight))
            W0 = (mha0.in_proj_weight.chunk(3) if mha0._qkv_same_embed_dim
                  else (mha0.q_proj_weight, mha0.k_proj_weight, mha0.v_proj_weight))
            for c, inp, w, w0 in zip("qkv", (h, kv, kv), W, W0):
                assert rows[f"{attn_name}.in_proj.{c}"]["objective"] == pytest.approx(
                    rel(inp @ (w - w0).T, inp @ w0.T), rel=1e-4)
                assert rows[f"{attn_name}.in_proj.{c}"]["kept"] == w.numel() // 2
            ctx = attention_context(mha, h, kv, kv)
            assert rows[f"{attn_name}.out_proj"]["objective"] == pytest.approx(
                rel(ctx @ (mha.out_proj.weight - mha0.out_proj.weight).T,
                    ctx @ mha0.out_proj.weight.T), rel=1e-4)
            h = h + mha(h, kv, kv, need_weights=False)[0]
    # the module itself computes what the written-out attention computes
    out = net.attn(h, h, h, need_weights=False)[0]
    assert torch.allclose(out, net.attn.out_proj(attention_context(net.attn, h, h, h)),
                          atol=1e-5)


def test_gpt2_conv1d_layers_and_the_tied_head():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2,
                                  n_head=2, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    torch.manual_seed(2)
    net = transformers.GPT2LMHeadModel(cfg).eval()
    dense = copy.deepcopy(net)
    calib = [{"input_ids": torch.randint(0, 40, (4, 16))} for _ in range(2)]
    with pytest.warns(UserWarning, match=r"lm_head \(its weight is shared with "
                                         r"\['transformer.wte.weight'\]"):
        res = prune_oneshot(net, calib, "wanda", pattern="2:4", progress=False)
    names = [r["layer"] for r in res.report.layers]
    assert names == [f"transformer.h.{i}.{n}" for i in range(2)
                     for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert torch.equal(net.lm_head.weight, dense.lm_head.weight)
    mods = dict(net.named_modules())
    dmods = dict(dense.named_modules())
    seen = {n: [] for n in names}
    hs = [mods[n].register_forward_pre_hook((lambda n: lambda m, a: seen[n].append(a[0]))(n))
          for n in names]
    with torch.no_grad():
        for b in calib:
            net(**b)
    for h in hs:
        h.remove()
    for r in res.report.layers:
        x = torch.cat([t.reshape(-1, t.shape[-1]) for t in seen[r["layer"]]])
        W, W0 = mods[r["layer"]].weight, dmods[r["layer"]].weight     # (in, out)
        assert r["objective"] == pytest.approx(rel(x @ (W - W0), x @ W0), rel=1e-4)
        groups = (W.T != 0).reshape(W.shape[1], -1, 4).sum(-1)       # per output row
        assert bool((groups == 2).all())


def test_sequential_inputs_come_through_pruned_layers():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 20), nn.ReLU(),
                        nn.Linear(20, 3))
    dense = copy.deepcopy(net)
    x = torch.randn(300, 10)
    res = prune_oneshot(net, x, "magnitude", target_density=0.2, progress=False)
    # the last layer's objective is measured on the pruned network's features ...
    with torch.no_grad():
        feat = net[:4](x)
        feat_dense = dense[:4](x)
    d = net[4].weight - dense[4].weight
    got = res.report.layers[-1]["objective"]
    assert got == pytest.approx(rel(feat @ d.T, feat @ dense[4].weight.T), rel=1e-6)
    assert got != pytest.approx(rel(feat_dense @ d.T, feat_dense @ dense[4].weight.T), rel=1e-3)


class Recorder(OneShotMethod):
    """Magnitude pruning that records the Grams it is given (a test double)."""

    name = "recorder"
    defaults: dict = {}
    grams: list = []

    def _prune(self, W0, G, budget):
        Recorder.grams.append(G.clone())
        return Magnitude()._prune(W0, G, budget)


def test_a_layer_called_twice_gets_both_inputs():
    torch.manual_seed(4)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.tanh(self.fc(x)))

    net = Twice()
    x = torch.randn(50, 4, dtype=torch.float64)
    net.double()
    with torch.no_grad():
        x2 = torch.tanh(net.fc(x))
    Recorder.grams = []
    prune_oneshot(net, x, Recorder(), target_density=0.5, progress=False)
    X = torch.cat([x, x2])
    assert torch.allclose(Recorder.grams[0], X.T @ X / 100, rtol=1e-12)


def test_attention_selected_by_its_name_or_its_parts():
    net = AttnNet()
    calib = [torch.randn(2, 5, 6)]
    res = prune_oneshot(copy.deepcopy(net), calib, "magnitude", target_density=0.5,
                        include=["attn"], progress=False)
    assert [r["layer"] for r in res.report.layers] == [f"attn.in_proj.{c}" for c in "qkv"] + [
        "attn.out_proj"]
    res = prune_oneshot(copy.deepcopy(net), calib, "magnitude", target_density=0.5,
                        exclude=["*.in_proj", "embed", "mem", "head"], progress=False)
    assert [r["layer"] for r in res.report.layers] == ["attn.out_proj", "cross.out_proj"]
    res = prune_oneshot(copy.deepcopy(net), calib, "magnitude", target_density=0.5,
                        include=[nn.MultiheadAttention], exclude=["cross"], progress=False)
    assert len(res.report.layers) == 4


def test_exact_budgets_and_patterns():
    torch.manual_seed(5)
    net = ConvNet()
    calib = [torch.randn(8, 2, 8, 8)]
    for alloc in ("uniform", "global", "owl"):
        m = copy.deepcopy(net)
        res = prune_oneshot(m, calib, "wanda", target_density=0.1, allocation=alloc,
                            progress=False)
        total = sum(p.numel() for n, p in m.named_parameters() if n.endswith("weight"))
        kept = sum(int((p != 0).sum()) for n, p in m.named_parameters() if n.endswith("weight"))
        assert kept == round(0.1 * total) == sum(r["kept"] for r in res.report.layers)
    m = copy.deepcopy(net)
    with pytest.raises(ValueError, match="c1 has 18"):
        prune_oneshot(m, calib, "sparsegpt", pattern="4:8", progress=False)
    prune_oneshot(m, calib, "sparsegpt", pattern="2:4", exclude=["c1"], progress=False)
    for name in ("c2", "c3", "fc"):
        W = getattr(m, name).weight.reshape(getattr(m, name).weight.shape[0], -1)
        assert bool(((W != 0).reshape(W.shape[0], -1, 4).sum(-1) == 2).all())


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kwargs, err, match", [
    ({"method": "nope", "target_density": 0.5}, ValueError, "nope"),
    ({"method": "sparsegpt", "target_density": 0.5, "options": {"blocksz": 1}}, ValueError,
     "blocksz"),
    ({"method": "sparsegpt"}, ValueError, "exactly one of target_density"),
    ({"method": "sparsegpt", "target_density": 0.5, "pattern": "2:4"}, ValueError, "exactly one"),
    ({"method": "sparsegpt", "target_density": 0.0}, ValueError, "target_density"),
    ({"method": "sparsegpt", "target_density": 1.5}, ValueError, "target_density"),
    ({"method": "sparsegpt", "pattern": "2-4"}, ValueError, "pattern"),
    ({"method": "sparsegpt", "pattern": "2:4", "allocation": "owl"}, ValueError, "uniform"),
    ({"method": "sparsegpt", "target_density": 0.5, "allocation": "best"}, ValueError,
     "allocation"),
    ({"method": "sparsegpt", "target_density": 0.5, "allocation": "owl",
      "allocation_options": {"m": 3}}, ValueError, "unknown option"),
    ({"method": "sparsegpt", "target_density": 0.5, "include": ["nothing*"]}, ValueError,
     "matches no layer"),
    ({"method": "sparsegpt", "target_density": 0.5, "exclude": [3]}, TypeError, "exclude"),
    ({"method": "sparsegpt", "target_density": 0.5, "forward_fn": 3}, TypeError, "forward_fn"),
    ({"method": "sparsegpt", "target_density": 0.5, "refit": "yes"}, TypeError, "refit"),
    ({"method": "sparsegpt", "target_density": 0.5,
      "forward_fn": lambda m, b: m(b[:, :1])}, ValueError, "forward failed.*channels"),
])
def test_refused_calls_leave_the_model_as_given(kwargs, err, match):
    torch.manual_seed(6)
    net = ConvNet().train()
    before = state(net)
    fast = torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(err, match=match):
        prune_oneshot(net, [torch.randn(4, 2, 8, 8)], progress=False, **kwargs)
    assert same(before, state(net)) and net.training
    assert torch.backends.mha.get_fastpath_enabled() == fast


def test_calib_must_be_reiterable():
    net = ConvNet()
    before = state(net)
    with pytest.raises(TypeError, match="re-iterable"):
        prune_oneshot(net, iter([torch.randn(4, 2, 8, 8)]), "magnitude", target_density=0.5)
    with pytest.raises(TypeError, match="re-iterable"):
        prune_oneshot(net, (torch.randn(4, 2, 8, 8) for _ in range(2)), "magnitude",
                      target_density=0.5)
    with pytest.raises(ValueError, match="no batch"):
        prune_oneshot(net, [], "magnitude", target_density=0.5)
    assert same(before, state(net))


class FailSecond(OneShotMethod):
    name = "fail-second"
    defaults: dict = {}
    calls = 0

    def _prune(self, W0, G, budget):
        FailSecond.calls += 1
        if FailSecond.calls == 2:
            raise RuntimeError("boom")
        return Magnitude()._prune(W0, G, budget)


def test_a_failure_during_the_walk_puts_every_weight_back():
    net = ConvNet()
    before = state(net)
    FailSecond.calls = 0
    with pytest.raises(RuntimeError, match="boom"):
        prune_oneshot(net, [torch.randn(4, 2, 8, 8)], FailSecond(), target_density=0.5,
                      progress=False)
    assert same(before, state(net))


def test_other_layers_are_named_in_a_warning():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.lstm = nn.LSTM(8, 8, batch_first=True)
            self.dw = nn.Conv1d(8, 8, 3, groups=8, padding=1)
            self.fc = nn.Linear(8, 2)
            self.unused = nn.Linear(8, 8)

        def forward(self, t):
            h = self.lstm(self.emb(t))[0]
            h = self.dw(h.transpose(1, 2)).transpose(1, 2)
            return self.fc(h.mean(1))

    net = Mixed()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        res = prune_oneshot(net, [torch.randint(0, 10, (4, 5))], "magnitude",
                            target_density=0.5, progress=False)
    msg = " ".join(str(x.message) for x in w)
    for name in ("emb (Embedding", "lstm.weight_ih_l0, lstm.weight_hh_l0 (LSTM",
                 "dw (a grouped convolution", "unused (not called"):
        assert name in msg
    assert [r["layer"] for r in res.report.layers] == ["fc"]
    assert len(res.report.skipped) == 4


def test_forward_fn_and_dict_batches():
    class DictNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, pixel_values, scale=1.0):
            return self.fc(pixel_values * scale)

    net = DictNet()
    calib = [{"pixel_values": torch.randn(5, 6), "scale": 2.0}]
    res = prune_oneshot(net, calib, "wanda", target_density=0.5, progress=False)
    assert res.report.layers[0]["kept"] == 9
    net2 = DictNet()
    res = prune_oneshot(net2, [(torch.randn(5, 6), 0)], "wanda", target_density=0.5,
                        forward_fn=lambda m, b: m(pixel_values=b[0]), progress=False)
    assert res.report.layers[0]["kept"] == 9


def test_held_masks_survive_fine_tuning():
    from dualdrop.train import fit

    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    res = prune_oneshot(net, x, "sparsegpt", target_density=0.25, progress=False)
    zeros = {n: (p == 0).clone() for n, p in net.named_parameters() if n.endswith("weight")}
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    res.sparsify()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    fit(net, "magnitude", loader, lambda m, b: F.cross_entropy(m(b[0]), b[1]), epochs=2,
        lr=1e-2, hparams=res.hparams, progress=False)
    net.eval()
    for n, z in zeros.items():
        name = n.replace(".weight", "")
        w = dict(net.named_modules())[name].weight
        assert bool((w[z] == 0).all()) and bool((w[~z] != 0).all())
        assert not torch.equal(w[~z], before[n][~z])   # the kept weights trained


def test_report_format_and_dict():
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    res = prune_oneshot(net, torch.randn(32, 8), "sparsegpt", target_density=0.5,
                        progress=False)
    text = res.report.format()
    assert "density 0.5" in text and "objective" in text and "0" in text.splitlines()[2]
    d = res.report.to_dict()
    assert d["density"] == pytest.approx(0.5) and len(d["layers"]) == 2
    assert all(r["seconds"] >= 0 and r["peak_mb"] > 0 for r in d["layers"])
    Budget(n_keep=1)


class _Dispatcher:
    """A stand-in for a numba dispatcher: compiled in this process or not, cached or not."""

    def __init__(self, compiled=False, cached=False, readable=True):
        self.signatures = ["sig"] if compiled else []
        index = {"sig": "entry"} if cached else {}

        class CacheFile:
            def _load_index(self):
                if not readable:
                    raise AttributeError("numba moved its internals")
                return index

        self._cache = type("Cache", (), {"_cache_file": CacheFile()})()


def test_first_use_notice_only_when_a_kernel_must_compile():
    from penalties._numba_cache import first_use_notice

    assert first_use_notice([_Dispatcher(compiled=True), _Dispatcher(cached=True)], "x") is None
    assert first_use_notice([_Dispatcher(readable=False)], "x") is None  # cannot tell: silent
    notice = first_use_notice([_Dispatcher(cached=True), _Dispatcher()], "one-shot logsum")
    assert notice.startswith("one-shot logsum: compiling numba kernels for their first use")


def test_prune_oneshot_says_when_its_kernels_compile(capsys):
    class Slow(Magnitude):
        def kernels(self):
            return (_Dispatcher(),)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    x = torch.randn(32, 6)
    # progress bar or not, a first compile is announced (a silent minute looked like a hang)
    prune_oneshot(net, x, Slow(), target_density=0.5, progress=False)
    assert "one-shot magnitude: compiling numba kernels" in capsys.readouterr().err
    prune_oneshot(net, x, Slow(), target_density=0.5, progress=True)
    assert "one-shot magnitude: compiling numba kernels" in capsys.readouterr().err
    prune_oneshot(net, x, "magnitude", target_density=0.5, progress=True)
    assert "compiling" not in capsys.readouterr().err  # no kernels
