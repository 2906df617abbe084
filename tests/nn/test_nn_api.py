"""The contract of dualdrop.nn: names, defaults, parameters/buffers, and clear errors."""

import math
import os

import pytest
import torch
import torch.nn as nn

import penalties
from dualdrop.nn import METHODS, Sparsifier, default_hparams, export_sparse, sparsify, \
    sparsity_report, state_of


def test_methods_and_seed_defaults():
    assert METHODS == ("vardrop", "vardrop-lr", "vardrop-lr-ar", "hardconcrete",
                       "hardconcrete-neuron", "magnitude", "eta-trick", "adaprox", "adatikhonov",
                       "logsum")
    # docs/theory.md section 5
    lr = {"vardrop-lr-ar": 1e-4, "logsum": 1e-4, "adatikhonov": 1e-4, "adaprox": 1e-4,
          "vardrop-lr": 1e-3, "vardrop": 1e-3, "eta-trick": 1e-3}
    for m, v in lr.items():
        assert default_hparams(m)["lr"] == v
    for m in ("logsum", "adatikhonov", "adaprox", "eta-trick"):
        hp = default_hparams(m)
        assert hp["lam"] == 1e-3 and hp["eps"] == 2.0 and hp["tol"] == 0.05
    et = default_hparams("eta-trick")
    assert (et["eta_weight_decay"], et["decay"], et["init_log_ratio"], et["eta_init"],
            et["prune_rule"]) == (1e-3, "linear", 5.0, "constant", "eta")
    for m in ("vardrop", "vardrop-lr", "vardrop-lr-ar"):
        assert default_hparams(m)["tol"] == 0.05
    hp = default_hparams("penalty:mcp")
    assert hp["lr"] == 1e-4 and hp["penalty_params"] == {}
    # a fresh dict each time
    default_hparams("penalty:mcp")["penalty_params"]["a"] = 5
    assert default_hparams("penalty:mcp")["penalty_params"] == {}


@pytest.mark.parametrize("method", list(METHODS) + ["penalty:scad"])
def test_defaults_are_accepted_and_stored(method, h):
    model = h.make_mlp()
    hp = default_hparams(method)
    sp = sparsify(model, method, **hp)
    assert isinstance(sp, Sparsifier)
    assert sp.hparams["lr"] == hp["lr"]
    assert [n for n, _ in sp.named_states()] == ["fc1", "fc2", "fc3"]
    # same module objects, new classes, still instances of nn.Linear
    assert isinstance(model.fc1, nn.Linear) and type(model.fc1) is not nn.Linear
    assert "method=" in repr(model.fc1)


def test_new_tensors_are_parameters_state_is_buffers(h):
    pre = "parametrizations.weight"
    m = h.make_mlp()
    sparsify(m, "vardrop-lr-ar")
    assert f"fc1.{pre}.0.log_sigma2" in dict(m.named_parameters())
    assert f"fc1.{pre}.original" in dict(m.named_parameters())
    m = h.make_mlp()
    sparsify(m, "vardrop-lr")
    assert f"fc1.{pre}.0.log_alpha" in dict(m.named_parameters())
    m = h.make_mlp()
    sparsify(m, "hardconcrete")
    assert dict(m.named_parameters())[f"fc1.{pre}.0.gate_logits"].shape == m.fc1.weight.shape
    m = h.make_mlp()
    sparsify(m, "hardconcrete-neuron")
    assert dict(m.named_parameters())[f"fc1.{pre}.0.gate_logits"].shape == (m.fc1.in_features,)
    m = h.make_mlp()
    sparsify(m, "eta-trick")
    assert f"fc2.{pre}.0.log_ratio" in dict(m.named_parameters())
    m = h.make_mlp()
    sparsify(m, "magnitude")
    assert f"fc3.{pre}.0.weight_mask" in dict(m.named_buffers())
    assert f"fc3.{pre}.0.weight_mask" in m.state_dict()


def test_include_exclude(h):
    m = h.make_mlp()
    sp = sparsify(m, "logsum", include=["fc1", "fc3"])
    assert [n for n, _ in sp.named_states()] == ["fc1", "fc3"]
    assert type(m.fc2) is nn.Linear
    assert set(sp.density()) == {"fc1", "fc3", "total"}
    assert sparsify(h.make_mlp(), "logsum", include="fc*.weight", exclude="fc2").targets == \
        ["fc1", "fc3"]
    assert sparsify(h.make_mlp(), "logsum", exclude=[nn.Linear], include="fc1.bias").targets \
        == ["fc1.bias"]  # explicit names reach any tensor
    with pytest.raises(ValueError, match="'fc9' matches no parameter"):
        sparsify(h.make_mlp(), "logsum", include=["fc9"])
    with pytest.raises(TypeError, match="entries must be name patterns"):
        sparsify(h.make_mlp(), "logsum", include=[3])
    with pytest.raises(ValueError, match="nothing to sparsify"):
        sparsify(h.make_mlp(), "logsum", exclude=nn.Linear)
    with pytest.raises(TypeError, match="replaced by include"):
        sparsify(h.make_mlp(), "logsum", layers=["fc1"])


@pytest.mark.parametrize("bad, exc, match", [
    ("dropconnect", ValueError, "unknown method 'dropconnect'"),
    ("penalty:", ValueError, "unknown method"),
    ("penalty:nosuch", ValueError, "unknown penalty in method 'penalty:nosuch'"),
    ("penalty:hard_threshold", ValueError, "not separable"),
    (3, TypeError, "method must be a string"),
])
def test_bad_method(bad, exc, match, h):
    with pytest.raises(exc, match=match):
        sparsify(h.make_mlp(), bad)


@pytest.mark.parametrize("method, kw, exc, match", [
    ("vardrop", {"alpha": 1.0}, TypeError, r"unknown hyperparameter\(s\) \['alpha'\]"),
    ("vardrop", {"tol": 0.0}, ValueError, "tol must be > 0"),
    ("vardrop", {"tol": 1.5}, ValueError, "tol must be < 1"),
    ("vardrop", {"clip": 2.0}, ValueError, "raise clip"),
    ("vardrop-lr", {"lam": -1.0}, ValueError, "lam must be > 0"),
    ("vardrop-lr", {"lam": "big"}, TypeError, "lam must be a real number"),
    ("vardrop-lr-ar", {"init_log_alpha": -3.0}, TypeError, "init_log_alpha"),
    ("hardconcrete", {"gamma": 0.1}, ValueError, "gamma must be < 0"),
    ("hardconcrete", {"zeta": 0.9}, ValueError, "zeta must be > 1"),
    ("hardconcrete", {"droprate_init": 1.0}, ValueError, "droprate_init must be < 1"),
    ("magnitude", {"sparsity": 1.0}, ValueError, "sparsity must be < 1"),
    ("magnitude", {"begin": 0.5, "end": 0.2}, ValueError, "end .* must be greater than begin"),
    ("magnitude", {"prune_every": 0}, ValueError, "prune_every must be >= 1"),
    ("magnitude", {"prune_every": 2.5}, TypeError, "prune_every must be an integer"),
    ("magnitude", {"scope": "model"}, ValueError, "scope must be one of"),
    ("logsum", {"lam": 0.0}, ValueError, "lam must be > 0"),
    ("logsum", {"eps": -2.0}, ValueError, "eps must be > 0"),
    ("logsum", {"lr": 0.0}, ValueError, "lr must be a positive number"),
    ("eta-trick", {"prune_rule": "w"}, ValueError, "prune_rule must be one of"),
    ("penalty:mcp", {"algorithm": "sgd"}, ValueError, "algorithm must be one of"),
    ("penalty:mcp", {"penalty_params": {"b": 1}}, ValueError, "penalty_params"),
    ("penalty:mcp", {"penalty_params": {"a": -1.0}}, ValueError, "cannot build penalty 'mcp'"),
    ("penalty:mcp", {"penalty_params": 3}, TypeError, "penalty_params must be a dict"),
    ("penalty:l1", {"eps": 2.0}, TypeError, "unknown hyperparameter"),
])
def test_bad_hyperparameters(method, kw, exc, match, h):
    m = h.make_mlp()
    with pytest.raises(exc, match=match):
        sparsify(m, method, **kw)
    # nothing was changed on failure
    assert type(m.fc1) is nn.Linear


def test_bad_models_and_calls(h):
    with pytest.raises(TypeError, match="torch.nn.Module"):
        sparsify("model", "logsum")
    with pytest.raises(ValueError, match="nothing to sparsify"):
        sparsify(nn.Sequential(nn.ReLU()), "logsum")
    m = h.make_mlp()
    sp = sparsify(m, "vardrop")
    with pytest.raises(ValueError, match="already sparsified"):
        sparsify(m, "logsum")
    with pytest.raises(ValueError, match="n_train must be >= 1"):
        sp.regularizer(0)
    with pytest.raises(TypeError, match="n_train must be an integer"):
        sp.regularizer(10.0)
    opt = torch.optim.Adam(m.parameters())
    with pytest.raises(ValueError, match="must not exceed total_steps"):
        sp.after_step(opt, 11, 10)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        sp.after_step("adam", 1, 10)
    with pytest.raises(ValueError, match="layout must be one of"):
        export_sparse(m, "coo")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        sparsity_report(None)
    # shape mismatch gives torch's own clear error, unchanged by the wrapper
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        m(torch.randn(3, 7))


def test_adaprox_needs_optimizer_with_the_weights(h):
    m = h.make_mlp()
    sp = sparsify(m, "adaprox")
    with pytest.raises(ValueError, match="needs the optimizer"):
        sp.after_step(None, 1, 10)
    other = torch.optim.Adam([nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match="build the optimizer after sparsify"):
        sp.after_step(other, 1, 10)


def test_state_dict_of_another_method_is_refused(h):
    a = h.make_mlp()
    sparsify(a, "logsum")
    b = h.make_mlp()
    sparsify(b, "adatikhonov")  # same parameter names
    with pytest.raises(ValueError, match="sparsified with method 'logsum'"):
        b.load_state_dict(a.state_dict())
    c = h.make_mlp()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        c.load_state_dict(a.state_dict())


def test_attach_and_report(h):
    m = h.make_mlp()
    sparsify(m, "magnitude")
    sp = Sparsifier.attach(m, "magnitude")
    assert sp.density()["total"] == 1.0
    with pytest.raises(ValueError, match="not 'logsum'"):
        Sparsifier.attach(m, "logsum")
    rows = sp.report()
    assert [r["layer"] for r in rows] == ["fc1", "fc1.bias", "fc2", "fc2.bias", "fc3",
                                          "fc3.bias", "all parameters", "total"]
    assert [r["role"] for r in rows[:2]] == ["sparsified", "other"]
    assert rows[0]["shape"] == (24, 20) and rows[0]["total"] == 480
    assert rows[-1]["total"] == 480 + 24 * 16 + 16 * 4
    assert rows[-1]["role"] == "sparsified weights"
    assert rows[-2]["total"] == 480 + 24 * 16 + 16 * 4 + 24 + 16 + 4
    # the report also reads plain models
    plain = sparsity_report(h.make_mlp())
    assert plain[-1]["fraction"] == 1.0 and plain[-1]["role"] == "weights of weight-bearing layers"
    assert plain[-1]["total"] == rows[-1]["total"]
    from dualdrop.nn import format_report

    assert "fc2" in format_report(rows)


def test_penalties_package_is_used():
    # penalty:<name> resolves through the penalties catalog
    m = nn.Linear(4, 3)
    sp = sparsify(m, "penalty:logsum", penalty_params={"eps": 0.5})
    assert state_of(m).penalty == penalties.get("logsum", eps=0.5)
    assert sp.density()["total"] == 1.0
    # the model itself may be the one layer
    assert type(export_sparse(m, "dense")) is nn.Linear


def test_tune_allocator_opt_out_and_glibc(tmp_path):
    """sparsify() fixes glibc's malloc thresholds once per process unless opted out."""
    import platform
    import subprocess
    import sys

    code = ("import torch, torch.nn as nn\n"
            "from dualdrop.nn import sparsify, tune_allocator\n"
            "from dualdrop.nn import _memory\n"
            "sparsify(nn.Sequential(nn.Linear(3, 2)), 'logsum')\n"
            "print(_memory._state['done'], _memory._state['tuned'], tune_allocator())\n")
    env_off = {**os.environ, "DUALDROP_MALLOC_TUNING": "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env_off, capture_output=True,
                         text=True, check=True).stdout.split()
    assert off == ["True", "False", "False"]
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True).stdout.split()
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert on == ["True", str(glibc), str(glibc)]


from dualdrop.nn import REGISTRY  # noqa: E402

REG_METHODS = [m for m, cls in REGISTRY.items() if cls.loss_term] + ["penalty:mcp"]


@pytest.mark.parametrize("method", REG_METHODS)
def test_one_regularizer_convention(method, h):
    """An explicit lam is a per-example strength for every method: the regularizer does not
    depend on n_train and (the eta-trick aside, whose eta is measured in units of lam) is linear
    in lam; the Bayesian methods' default lam=None is exactly lam = c / n_train."""
    def reg(lam, n):
        torch.manual_seed(0)
        m = h.make_mlp()
        kw = {} if lam is None else {"lam": lam}
        return sparsify(m, method, **kw).regularizer(n).item()

    assert reg(0.02, 10) == reg(0.02, 10_000)
    if method != "eta-trick":
        assert reg(0.04, 10) == pytest.approx(2 * reg(0.02, 10), rel=1e-12)
    c = {"vardrop": 1.0, "vardrop-lr": 1.0, "vardrop-lr-ar": 1.0, "hardconcrete": 0.1,
         "hardconcrete-neuron": 0.1}.get(method)
    if c is not None:
        assert default_hparams(method)["lam"] is None
        for n in (7, 48_000):
            assert reg(None, n) == pytest.approx(reg(c / n, 1), rel=1e-6)  # float32 sums


def test_same_lam_same_per_weight_penalty(h):
    """lam multiplies a per-weight penalty that is O(1) for an unpruned weight and ~0 for a
    pruned one, for every method: the KL of vardrop (log a = -4: 2.0 nats), the gate-open
    probability of hard-concrete, log(1 + |w|/eps) of LogSum (at |w| = eps(e - 1): 1)."""
    from dualdrop.nn._base import original_of
    from dualdrop.nn.methods.vardrop.method import kl_approx

    lin = nn.Linear(5, 4)
    sp = sparsify(nn.Sequential(lin), "vardrop", lam=0.5)
    assert sp.regularizer(3).item() == pytest.approx(
        0.5 * 20 * kl_approx(torch.tensor(-4.0)).item(), rel=1e-6)
    lin = nn.Linear(5, 4)
    sp = sparsify(nn.Sequential(lin), "logsum", lam=0.5, eps=2.0)
    with torch.no_grad():
        original_of(lin, "weight").fill_(2.0 * (math.e - 1.0))
    assert sp.regularizer(3).item() == pytest.approx(0.5 * 20, rel=1e-6)
    lin = nn.Linear(5, 4)
    sp = sparsify(nn.Sequential(lin), "hardconcrete", lam=0.5)
    with torch.no_grad():
        state_of(lin).gate_logits.fill_(30.0)  # every gate open
    assert sp.regularizer(3).item() == pytest.approx(0.5 * 20, rel=1e-6)


def test_regularizer_dominating_the_data_loss_warns(h):
    m = h.make_mlp()
    sp = sparsify(m, "vardrop-lr-ar")  # the ELBO's lam = 1/n_train: strong on tiny data
    with pytest.warns(RuntimeWarning, match="will dominate training"):
        r = sp.check_balance(1.4, n_train=50)
    assert r > 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sp.check_balance(1.4, n_train=1_000_000) < 1


def test_method_records():
    from dualdrop.nn import REGISTRY, describe, method_class
    from dualdrop.nn.registry import paper_table

    assert tuple(REGISTRY) == METHODS
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.family
        d = describe(name)
        assert set(d) == set(default_hparams(name)) and "lr" in d
        assert all(isinstance(text, str) and text for _, text in d.values()), name
    assert method_class("penalty:mcp").name == "penalty:mcp"
    assert method_class("penalty:mcp").family == "penalty"
    assert paper_table()["eta-trick"] == ("eta-Trick", 0.0216, 0.0513)
    assert set(paper_table()) == {"vardrop-lr-ar", "vardrop-lr", "vardrop", "eta-trick",
                                  "adaprox", "adatikhonov", "logsum"}
    assert {n for n, c in REGISTRY.items() if c.has_tol} == {
        "vardrop", "vardrop-lr", "vardrop-lr-ar", "eta-trick", "adaprox", "adatikhonov",
        "logsum"}


@pytest.mark.parametrize("method", ["vardrop-lr", "hardconcrete-neuron", "magnitude",
                                    "eta-trick"])
def test_state_dict_of_the_earlier_layer_classes_loads(method):
    """Keys as dualdrop's earlier layer classes wrote them (``0.weight``, ``0.log_alpha``,
    ``0._extra_state``, eta-trick's ``log_eta``) load into the parametrized model."""
    torch.manual_seed(0)
    kw = {"decay": "quadratic", "eta_init": "eta_hat", "prune_rule": "eta_hat"} \
        if method == "eta-trick" else {}

    def make():
        return nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.Linear(12, 4))

    src = make()
    sparsify(src, method, **kw)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p))
    src.eval()
    x = torch.randn(2, 1, 4, 4)
    old = {}
    for k, v in src.state_dict().items():  # the earlier layout
        layer, _, rest = k.partition(".")
        rest = rest.replace("parametrizations.weight.original", "weight")
        rest = rest.replace("parametrizations.bias.original", "bias")
        if rest.startswith("parametrizations.bias.0."):
            continue  # the gated bias's state is the weight's
        rest = rest.replace("parametrizations.weight.0.", "")
        if rest == "log_ratio":
            rest, v = "log_eta", v + math.log(src[0].parametrizations.weight[0].lam)
        old[f"{layer}.{rest}"] = v
    assert "0.weight" in old and "0._extra_state" in old
    dst = make()
    sparsify(dst, method, **kw)
    dst.load_state_dict(old, strict=True)
    dst.eval()
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-6, atol=1e-7)
