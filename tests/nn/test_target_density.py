"""Target density (dualdrop.nn.density): the strength multiplier, the controller, the budget."""

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dualdrop.nn import sparsify
from dualdrop.nn import density
from dualdrop.nn._base import layer_floor
from dualdrop.nn.registry import METHODS

ALL = list(METHODS) + ["penalty:mcp"]
WITH_STRENGTH = [m for m in ALL if m != "magnitude"]


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))


@pytest.fixture(scope="module")
def digits():
    from dualdrop.data.datasets import load_digits_dataset

    d = load_digits_dataset(0)
    return (torch.from_numpy(d.X_train), torch.from_numpy(d.y_train),
            torch.from_numpy(d.X_test), torch.from_numpy(d.y_test))


def _grads(model, sp, x, y, n_train):
    model.zero_grad()
    # the methods' noise: the same draws for both calls
    st_noise = [(st, st.noise_count) for _, st in sp.states() if hasattr(st, "noise_count")]
    loss = F.cross_entropy(model(x), y) + sp.regularizer(n_train)
    loss.backward()
    for st, c in st_noise:
        st.noise_count = c
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method", WITH_STRENGTH)
def test_set_strength_scales_regularizer_gradient(method):
    """grad(m) - grad(1) = (m - 1) * (grad of the regularizer at strength 1): the data part is
    unchanged and the regularizer's gradient scales by m (the eta-trick: lam itself scales, so
    only its p-gradient decay term is linear; checked as a change in the p gradient)."""
    model = _mlp()
    sp = sparsify(model, method)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    model.train()
    g1 = _grads(model, sp, x, y, 1000)
    sp.set_strength(3.0)
    g3 = _grads(model, sp, x, y, 1000)
    if method == "adaprox":  # no regularizer gradient: the prox step scales lr * lam
        assert all(torch.equal(g1[k], g3[k]) for k in g1)
        st = sp.states()[0][1]
        assert st.lam_eff == pytest.approx(3 * st.lam)
        return
    sp.set_strength(5.0)
    g5 = _grads(model, sp, x, y, 1000)
    changed = [k for k in g1 if not torch.allclose(g1[k], g3[k])]
    assert changed, "the multiplier did not change any gradient"
    if method != "eta-trick":
        for k in g1:  # linear in m: g5 - g3 == g3 - g1
            torch.testing.assert_close(g5[k] - g3[k], g3[k] - g1[k], rtol=1e-3, atol=1e-6)


def test_set_strength_validates():
    sp = sparsify(_mlp(), "logsum")
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="multiplier"):
            sp.set_strength(bad)
    with pytest.raises(ValueError, match="magnitude"):
        sparsify(_mlp(), "magnitude").set_strength(2.0)
    with pytest.raises(ValueError, match="target_density"):
        sparsify(_mlp(1), "logsum", target_density=0.0)
    with pytest.raises(TypeError, match="target_density"):
        sparsify(_mlp(2), "logsum", target_density="5%")


def _train(method, digits, D, T, seed=0, stop=None, state=None):
    X, y = digits[:2]
    model = _mlp(seed)
    sp = sparsify(model, method, target_density=D)
    opt = torch.optim.Adam(sp.method_param_groups(1e-2, T))
    g = torch.Generator().manual_seed(seed)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sp.load_state_dict(state["sp"])
        g.set_state(state["gen"])
        start = state["step"]
    for step in range(start + 1, T + 1):
        idx = torch.randint(0, len(y), (32,), generator=g)
        loss = F.cross_entropy(model(X[idx]), y[idx]) + sp.regularizer(len(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sp.after_step(opt, step, T)
        if step == stop:
            return model, sp, {"model": model.state_dict(), "opt": opt.state_dict(),
                               "sp": sp.state_dict(), "gen": g.get_state(), "step": step}
    return model, sp, None


#: test accuracy at 5% density after 200 steps (magnitude pruning: 0.94; the dense net: ~0.97);
#: neuron gates keep 5% of the input units of each layer, which this small MLP cannot afford
MIN_ACCURACY = {"hardconcrete-neuron": 0.25}


@pytest.mark.parametrize("method", ALL)
def test_target_density_reached_on_digits(method, digits):
    """Within a few hundred steps every method ends within 10% (relative) of the target, with a
    network that still works (the schedule prunes by the method's ranking; the held weights are
    exactly zero)."""
    D = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model, sp, _ = _train(method, digits, D, 200)
    reached = sp.density()["total"]
    assert abs(reached / D - 1) <= 0.1, (method, reached)
    assert sp.controller.reached == pytest.approx(reached)
    model.eval()
    with torch.no_grad():
        acc = (model(digits[2]).argmax(1) == digits[3]).float().mean().item()
    assert acc >= MIN_ACCURACY.get(method, 0.85), (method, acc)
    if sp.controller.masks is not None:
        for (t, st), m in zip(sp.states(), sp.controller.masks):
            held = ~st.unit_mask(m, t.param)
            assert held.any() and torch.count_nonzero(t.param.detach()[held]) == 0


def test_magnitude_under_a_target_takes_the_schedules_floor(digits):
    """Magnitude pruning under a target density takes the schedule's floor (0.1%, and one
    weight per two units), not its own per-layer 1% default, which binds every layer at
    D <= 1% (MNIST LeNet-300-100 at 1%: 48% test error) and leaves a classifier 1% of its
    weights."""
    model, sp, _ = _train("magnitude", digits, 0.03, 200)  # 222 weights; floors 82 + 55
    assert sp.hparams["min_layer_density"] == density.MIN_LAYER_DENSITY
    assert sparsify(_mlp(), "magnitude", target_density=0.01,
                    min_layer_density=0.02).hparams["min_layer_density"] == 0.02  # as given
    d = sp.density()
    assert abs(d["total"] / 0.03 - 1) <= 0.1
    head = model[-1].weight
    assert int(torch.count_nonzero(head.detach())) >= (head.shape[0] + head.shape[1]) // 2
    model.eval()
    with torch.no_grad():
        acc = (model(digits[2]).argmax(1) == digits[3]).float().mean().item()
    assert acc >= 0.5, acc


def test_schedule_prunes_gradually_by_the_methods_ranking():
    """The masks shrink along the cubic ramp, and the units kept are the method's best."""

    model = _mlp()
    sp = sparsify(model, "vardrop-lr", target_density=0.1)
    c = sp.controller
    T = 100
    assert c.goal(0, T) == 1.0 and c.goal(T, T) == pytest.approx(0.1)
    assert c.goal(30, T) > c.goal(40, T) > c.goal(50, T)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    (t0, st0), (t1_, st1) = sp.states()
    with torch.no_grad():  # a known ranking: log-alpha increasing along the flattened weights
        st0.log_alpha.copy_(torch.linspace(-6, 6, st0.log_alpha.numel()).view_as(st0.log_alpha))
        st1.log_alpha.fill_(7.0)
    kept = []
    for step in range(1, T + 1):
        opt.step()
        sp.after_step(opt, step, T)
        if c.masks is not None:
            kept.append(sum(int(m.sum()) for m in c.masks))
    assert all(a >= b for a, b in zip(kept, kept[1:])) and kept[0] > kept[-1]
    n = sum(t.param.numel() for t, _ in sp.states())
    assert kept[-1] <= 0.1 * n + 1
    m0 = c.masks[0].flatten()
    # layer 1 (log-alpha 7, the worst) keeps its floor only; layer 0 its lowest log-alpha prefix
    w1 = sp.states()[1][0].param
    floor = max(math.ceil(density.MIN_LAYER_DENSITY * w1.numel()), math.ceil((10 + 100) / 2))
    assert int(c.masks[1].sum()) == floor == layer_floor(w1, w1.numel(), density.MIN_LAYER_DENSITY)
    k = int(m0.sum())
    assert bool(m0[:k].all()) and not bool(m0[k:].any())
    assert abs(k + int(c.masks[1].sum()) - 0.1 * n) <= 1


def test_controller_resume_is_exact(digits):
    """Stopping after k steps and resuming from the state dicts gives the same network."""
    full, sp_full, _ = _train("vardrop-lr", digits, 0.1, 60)
    _, _, state = _train("vardrop-lr", digits, 0.1, 60, stop=25)
    assert state["sp"]["controller"]["log_m"] != 0.0
    resumed, sp_res, _ = _train("vardrop-lr", digits, 0.1, 60, state=state)
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), k
    a, b = sp_full.controller.state_dict(), sp_res.controller.state_dict()
    assert {k: v for k, v in a.items() if k != "masks"} == \
        {k: v for k, v in b.items() if k != "masks"}
    assert all(torch.equal(x, y) for x, y in zip(a["masks"], b["masks"]))


def test_unreachable_target_warns():
    """Magnitude's per-layer floor (1%) keeps more than a 0.1% target: a warning names it."""
    model = _mlp()
    sp = sparsify(model, "magnitude", target_density=0.001, min_layer_density=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.warns(RuntimeWarning, match="not reached"):
        for step in range(1, 11):
            opt.step()
            sp.after_step(opt, step, 10)
    assert sp.controller.reached > 0.0011


def test_method_param_groups_budget_rule():
    sp = sparsify(_mlp(), "vardrop-lr")
    groups = sp.method_param_groups(1e-3, 100)
    rates = sorted(g["lr"] for g in groups)
    assert rates == [1e-3, pytest.approx(12.0 / 50)]
    n = sum(p.numel() for g in groups for p in g["params"])
    assert n == sum(p.numel() for p in sp.model.parameters())
    # a long budget: the rule never goes below lr
    assert {g["lr"] for g in sp.method_param_groups(1e-3, 10 ** 6)} == {1e-3}
    assert math.isclose(max(g["lr"] for g in sparsify(_mlp(), "hardconcrete")
                            .method_param_groups(1e-3, 100)), 6.0 / 50)


@pytest.mark.parametrize("method", ["logsum", "hardconcrete", "vardrop-lr", "eta-trick"])
def test_final_calibration_keeps_every_layer(method):
    """Whole output channels as units (few per layer): the final test-time rule keeps what the
    masks kept, the per-layer floor included, so no layer ends empty."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sp = sparsify(model, method, target_density=0.3, granularity="neuron")
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
        T = 40
        for step in range(1, T + 1):
            loss = F.cross_entropy(model(x), y) + sp.regularizer(100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sp.after_step(opt, step, T)
    dens = sp.density()
    assert all(v > 0 for k, v in dens.items() if k != "total"), dens
    assert sp.controller.reached == pytest.approx(sp.controller._mask_density())


def test_groups_are_allocated_layer_by_layer():
    """With whole output units as units, every layer keeps the target fraction of its units
    (one ranking across layers of rows of 784 and of 300 weights kept 33 and 2 units of
    LeNet-300-100 at 10%)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(200, 60), nn.ReLU(), nn.Linear(60, 20), nn.ReLU(),
                          nn.Linear(20, 3))
    with torch.no_grad():  # the narrow layer's rows have the smaller norms
        model[2].weight.mul_(0.01)
    sp = sparsify(model, "logsum", target_density=0.25, granularity="neuron", exclude=["4"])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for step in range(1, 21):
        opt.step()
        sp.after_step(opt, step, 20)
    rows = {n: (getattr(model, n).weight != 0).any(1) for n in ("0", "2")}
    assert int(rows["0"].sum()) == 15 and int(rows["2"].sum()) == 5
