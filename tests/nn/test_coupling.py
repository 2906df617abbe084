"""Coupled units (dualdrop.nn._coupling): a residual stream's channels pruned together, their
BatchNorm entries held at zero, so that the compact export removes them."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip("torch_pruning")

from dualdrop.nn import compact_report, export_sparse, sparsify  # noqa: E402
from dualdrop.nn._coupling import coupled_units, tie_keeps  # noqa: E402

torch.set_num_threads(1)


class Res(nn.Module):
    """A stem and two residual blocks on one 8-channel stream, a widening block with a 1x1
    shortcut (12 channels), pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.a1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.a2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.w = nn.Conv2d(8, 12, 3, padding=1, bias=False)
        self.bnw = nn.BatchNorm2d(12)
        self.s = nn.Conv2d(8, 12, 1, bias=False)
        self.bns = nn.BatchNorm2d(12)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        h = F.relu(self.bn0(self.stem(x)))
        h = F.relu(h + self.bn1(self.a1(h)))
        h = F.relu(h + self.bn2(self.a2(h)))
        h = F.relu(self.bnw(self.w(h)) + self.bns(self.s(h)))
        return self.fc(h.mean((2, 3)))


def names(model, sets):
    by_id = {id(m): n for n, m in model.named_modules()}
    return sorted(sorted(by_id[id(m)] for m, _, _ in g["layers"]) for g in sets
                  if len(g["layers"]) > 1)


def test_the_dependency_graph_finds_the_residual_streams():
    m = Res().train()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    sets = coupled_units(m, torch.zeros(2, 1, 6, 6))
    assert names(m, sets) == [["a1", "a2", "stem"], ["s", "w"]]
    stream = next(g for g in sets if len(g["layers"]) == 3)
    by_id = {id(mod): n for n, mod in m.named_modules()}
    assert sorted(by_id[id(n)] for n, _, _ in stream["norms"]) == ["bn0", "bn1", "bn2"]
    # left as it was: training mode, requires_grad flags, BatchNorm statistics
    assert m.training and all(p.requires_grad for p in m.parameters())
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_tie_keeps_makes_coupled_layers_agree():
    keeps = [torch.tensor([1, 1, 0, 0], dtype=torch.bool), torch.tensor([0, 0, 1, 1],
                                                                         dtype=torch.bool)]
    scores = [torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([0.1, 0.2, 0.9, 0.3])]
    # layer 1's units are the root's in reverse order
    tie_keeps(keeps, scores, [[(0, [0, 1, 2, 3], [0, 1, 2, 3]), (1, [3, 2, 1, 0],
                                                                  [0, 1, 2, 3])]])
    # joint rank of root r: mean of layer 0's rank of unit r and layer 1's of unit 3 - r
    # root 0: (1 + 1/3)/2, root 1: (2/3 + 1)/2, root 2: (1/3 + 0)/2, root 3: (0 + 2/3)/2
    assert keeps[0].tolist() == [True, True, False, False]
    assert keeps[1].tolist() == [False, False, True, True]


def train(model, sp, steps=40):
    torch.manual_seed(1)
    x, y = torch.randn(32, 1, 6, 6), torch.randint(0, 3, (32,))
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, steps))
    for step in range(1, steps + 1):
        loss = F.cross_entropy(model(x), y) + sp.regularizer(32)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, steps)
    return model.eval()


def dead_channels(conv):
    return set(torch.nonzero((conv.weight.detach().flatten(1) == 0).all(1)).flatten().tolist())


@pytest.mark.parametrize("method, kw", [("magnitude", {"target_density": 0.5}),
                                        ("magnitude", {"sparsity": 0.5, "begin": 0.0,
                                                       "end": 0.5, "prune_every": 1}),
                                        ("hardconcrete", {"target_density": 0.5}),
                                        ("vardrop-lr", {"target_density": 0.5})])
def test_coupled_channels_pruned_together_and_removed(method, kw):
    torch.manual_seed(0)
    model = Res()
    x = torch.zeros(2, 1, 6, 6)
    with pytest.warns(RuntimeWarning) if method != "magnitude" else _nothing():
        train(model, sparsify(model, method, granularity="channel", exclude=["fc"],
                              example_inputs=x, **kw))
    dense = export_sparse(model, layout="dense")
    stream = [dead_channels(dense.get_submodule(n)) for n in ("stem", "a1", "a2")]
    assert stream[0] == stream[1] == stream[2] and len(stream[0]) == 4
    assert dead_channels(dense.w) == dead_channels(dense.s) and len(dead_channels(dense.w)) == 6
    for bn, dead in (("bn0", stream[0]), ("bnw", dead_channels(dense.w))):
        norm = dense.get_submodule(bn)
        assert torch.all(norm.weight[list(dead)] == 0) and torch.all(norm.bias[list(dead)] == 0)
    small = export_sparse(model, layout="compact", example_inputs=torch.randn(2, 1, 6, 6))
    report = compact_report(dense, small)
    assert [report[n][0] for n in ("stem", "a1", "a2", "w", "s")] == [4, 4, 4, 6, 6]
    z = torch.randn(5, 1, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(small(z), dense(z), rtol=0, atol=1e-5)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_without_example_inputs_layers_choose_alone():
    torch.manual_seed(0)
    model = Res()
    sp = sparsify(model, "magnitude", granularity="channel", exclude=["fc"], target_density=0.5)
    train(model, sp)
    assert sp.ties == [] and sp.norm_holds == []
    dense = export_sparse(model, layout="dense")
    small = export_sparse(model, layout="compact", example_inputs=torch.randn(2, 1, 6, 6))
    kept = compact_report(dense, small)["stem"][0]
    assert kept > 4  # the stream keeps what any of its layers keeps


def test_example_inputs_errors(monkeypatch):
    with pytest.raises(ValueError, match="example_inputs couples whole units.*granularity"):
        sparsify(Res(), "magnitude", example_inputs=torch.zeros(2, 1, 6, 6))
    with pytest.raises(ValueError, match="example_inputs: torch-pruning cannot trace"):
        sparsify(Res(), "magnitude", granularity="channel", example_inputs=torch.zeros(2, 5))
    import builtins

    real = builtins.__import__

    def no_tp(name, *a, **k):
        if name == "torch_pruning":
            raise ImportError("no")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tp)
    with pytest.raises(ImportError, match=r"dualdrop\[structured\]"):
        sparsify(Res(), "magnitude", granularity="channel", example_inputs=torch.zeros(2, 1, 6, 6))


@pytest.mark.parametrize("method", ["magnitude", "hardconcrete"])
def test_an_attention_heads_qkv_and_output_columns_are_pruned_together(method):
    """Head h's q/k/v rows (in_proj) and its out_proj columns are one unit: at half the heads
    every attention keeps exactly half, and no nonzero weight is left in a removed head."""
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer, nn.Linear(32, 3))
    sp = sparsify(model, method, granularity="head", target_density=0.5,
                  exclude=["0.linear*", "1.*"])
    assert len(sp.ties) == 1 and len(sp.ties[0]) == 2
    x, y = torch.randn(16, 5, 32), torch.randint(0, 3, (16, 5))
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, 30))
    with pytest.warns(RuntimeWarning) if method != "magnitude" else _nothing():
        for step in range(1, 31):
            loss = F.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1)) + sp.regularizer(16)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sp.after_step(opt, step, 30)
    model.eval()
    dense = export_sparse(model, layout="dense")
    small = export_sparse(model, layout="compact", example_inputs=x)
    assert compact_report(dense, small)["0.self_attn"] == (2, 4)
    att = dense[0].self_attn
    nonzero = int(torch.count_nonzero(att.in_proj_weight)) + int(torch.count_nonzero(
        att.out_proj.weight))
    kept = small[0].self_attn
    assert nonzero == kept.q_proj.weight.numel() * 3 + kept.out_proj.weight.numel()
