"""A finished run's exported network: model.pt (+ model_csr.pt), load_run."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from dualdrop.train import TrainConfig, lenet_300_100, load_run, train
from dualdrop.train.export import save_model

dnn = pytest.importorskip("dualdrop.nn")


def _has_tp():
    return importlib.util.find_spec("torch_pruning") is not None


def _cfg(tmp_path, method, **kw):
    base = dict(method=method, epochs=1, out=str(tmp_path / method), seed=0, progress=False,
                threads=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("method, csr", [("magnitude", True), ("logsum", False),
                                         ("none", False)])
def test_load_run_matches_sparsified_network(tmp_path, tiny_data, method, csr):
    rep = train(_cfg(tmp_path, method), data=tiny_data)
    out = tmp_path / method
    assert (out / "model.pt").is_file() and (out / "model_csr.pt").is_file() == csr
    compact = "model_compact.pt" if method != "none" and _has_tp() else None
    assert rep["model_files"] == {"dense": "model.pt", "csr": "model_csr.pt" if csr else None,
                                  "compact": compact}
    assert (out / "model_compact.pt").is_file() == (compact is not None)
    # the reference: the trained network rebuilt from its checkpoint, in eval mode
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    ref = lenet_300_100(784)
    if method != "none":
        dnn.sparsify(ref, method, **rep["hparams"])
    ref.load_state_dict(ck["model"])
    ref.eval()
    X = torch.from_numpy(tiny_data.X_test)
    with torch.no_grad():
        want = ref(X)
        net = load_run(out)
        assert type(net) is type(lenet_300_100(784)) and not net.training
        assert all(type(m) in (torch.nn.Linear, torch.nn.ReLU, torch.nn.Flatten)
                   for m in net.modules() if m is not net)
        torch.testing.assert_close(net(X), want, rtol=0, atol=1e-5)
        sparse = load_run(out, layout="csr")
        assert any(isinstance(m, dnn.CSRLinear) for m in sparse.modules())
        torch.testing.assert_close(sparse(X), want, rtol=0, atol=1e-5)
        if _has_tp():
            small = load_run(out, layout="compact")
            torch.testing.assert_close(small(X), want, rtol=0, atol=1e-5)
            assert sum(p.numel() for p in small.parameters()) <= sum(
                p.numel() for p in net.parameters())
    # pruned weights are exactly zero; the density is the run's
    w = [p for n, p in net.named_parameters() if n.endswith("weight")]
    nnz = sum(int(torch.count_nonzero(p)) for p in w) / sum(p.numel() for p in w)
    assert nnz == pytest.approx(rep["nonzero_total"])
    err = float((net(X).argmax(1) != torch.from_numpy(tiny_data.y_test)).float().mean())
    assert err == pytest.approx(rep["test_error"])
    sd = torch.load(out / "model.pt", weights_only=True)
    assert set(sd) == set(lenet_300_100(784).state_dict())


def test_load_run_unfinished_and_missing(tmp_path, tiny_data):
    train(_cfg(tmp_path, "logsum", epochs=3, stop_after=1), data=tiny_data)
    with pytest.raises(FileNotFoundError, match=r"unfinished \(1 epochs checkpointed\).*--resume"):
        load_run(tmp_path / "logsum")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
    with pytest.raises(ValueError, match="layout"):
        load_run(tmp_path / "logsum", layout="coo")


def test_load_run_of_a_run_without_model_file(tmp_path, tiny_data):
    """A run finished before model.pt existed is rebuilt from its checkpoint."""
    rep = train(_cfg(tmp_path, "logsum"), data=tiny_data)
    out = tmp_path / "logsum"
    net_file = load_run(out)
    (out / "model.pt").unlink()
    final = json.loads((out / "final.json").read_text())
    del final["architecture"]
    (out / "final.json").write_text(json.dumps(final))
    net_ck = load_run(out)
    sd_file, sd_ck = net_file.state_dict(), net_ck.state_dict()
    assert set(sd_file) == set(sd_ck)
    for k in sd_file:  # by name: removing a parametrization may re-register weight after bias
        assert torch.equal(sd_file[k], sd_ck[k]), k
    assert rep["status"] == "finished"


def _raw_weights_network(sd: dict, n_features: int) -> torch.nn.Module:
    """The plain network with the trained (unmasked) weights of a checkpoint's model state."""
    net = lenet_300_100(n_features)
    plain = {}
    for key in net.state_dict():
        layer, _, kind = key.rpartition(".")
        plain[key] = next(v for k, v in sd.items()
                          if k in (key, f"{layer}.parametrizations.{kind}.original"))
    net.load_state_dict(plain)
    return net.eval()


def test_unpruned_test_error(tmp_path, tiny_data):
    from dualdrop.data import load_dataset

    digits = load_dataset(None, seed=0)  # harder than the tiny blocks: errors differ
    X, y = torch.from_numpy(digits.X_test), torch.from_numpy(digits.y_test)
    # a high tol after 2 epochs at a larger lam prunes weights that still matter
    rep = train(_cfg(tmp_path, "logsum", epochs=2, lr=3e-3,
                     hparams={"tol": "0.8", "lam": "0.005"}), data=digits)
    ck = torch.load(tmp_path / "logsum" / "checkpoint.pt", weights_only=True)
    with torch.no_grad():
        net = _raw_weights_network(ck["model"], digits.n_features)
        want = int((net(X).argmax(1) != y).sum()) / len(y)
    assert rep["test_error_unpruned"] == pytest.approx(want, abs=1e-12)
    assert rep["nonzero_total"] < 0.7 and rep["test_error_unpruned"] != rep["test_error"]
    # without a test-time pruning step both are the same network
    for method in ("none", "hardconcrete"):
        r = train(_cfg(tmp_path, method), data=tiny_data)
        assert r["test_error_unpruned"] == r["test_error"]


def test_save_model_without_torch_pruning_skips_the_compact_file(tmp_path, monkeypatch):
    net = lenet_300_100(64)
    dnn.sparsify(net, "magnitude")
    (tmp_path / "model_compact.pt").write_bytes(b"stale")
    monkeypatch.setitem(sys.modules, "torch_pruning", None)
    files = save_model(net, True, tmp_path, n_features=64)
    assert files["compact"] is None and not (tmp_path / "model_compact.pt").exists()
    assert (tmp_path / "model.pt").is_file()
    with pytest.raises(ImportError, match=r"dualdrop\[structured\]"):
        dnn.compact(net, torch.zeros(2, 64))


@pytest.mark.skipif(not _has_tp(), reason="torch-pruning not installed")
@pytest.mark.parametrize("model, granularity, unit", [("resnet", "channel", "layer1.conv1"),
                                                       ("transformer", "head",
                                                        "encoder.0.self_attn")])
def test_resnet_and_transformer_runs_export_compact(tmp_path, tiny_data, model, granularity,
                                                    unit):
    """The structured-sparsity networks end to end: whole channels / heads pruned to a target
    density, a compact network with fewer of them that computes what the masked one does."""
    from dualdrop.nn import compact_report
    from dualdrop.train.models import build_model

    with pytest.warns(UserWarning, match="classifier fc is not sparsified"):
        rep = train(_cfg(tmp_path, "magnitude", epochs=2, model=model, target_density=0.3,
                         hparams={"granularity": granularity}), data=tiny_data)
    out = tmp_path / "magnitude"
    assert rep["model_files"]["compact"] == "model_compact.pt"
    X = torch.from_numpy(tiny_data.X_test)
    net, small = load_run(out), load_run(out, layout="compact")
    with torch.no_grad():
        torch.testing.assert_close(small(X), net(X), rtol=0, atol=1e-5)
    report = compact_report(build_model(model, 784, 10), small)
    kept, total = report[unit]
    assert kept < total
    if model == "resnet":  # the residual stream's channels were pruned together, and removed
        assert report["stem"] == report["layer1.conv2"] == (5, 16)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in net.parameters())


def test_exclude_leaves_weights_alone(tmp_path, tiny_data):
    rep = train(_cfg(tmp_path, "magnitude", exclude=["fc1.*"], target_density=0.3),
                data=tiny_data)
    assert "fc1" not in rep["nonzero"] and set(rep["nonzero"]) == {"fc2", "fc3"}
    ck = torch.load(tmp_path / "magnitude" / "checkpoint.pt", weights_only=True)
    assert ck["config"]["exclude"] == ["fc1.*"]  # part of the run's identity
    with pytest.raises(ValueError, match="exclude.*matches no"):
        train(_cfg(tmp_path / "b", "magnitude", exclude=["conv9.*"]), data=tiny_data)
    with pytest.raises(TypeError, match="exclude=.*list of parameter name patterns"):
        train(_cfg(tmp_path / "c", "magnitude", exclude="fc1.*"), data=tiny_data)
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_target_density_replaces_magnitudes_default_sparsity_and_floor(tmp_path, tiny_data,
                                                                        monkeypatch):
    """The run's magnitude defaults (98% sparsity, a 1% floor per layer) yield to the target;
    values the user gives do not."""
    import dualdrop.train.loop as loop

    seen = []
    real = loop._nn().sparsify

    def spy(model, method, **kw):
        sp = real(model, method, **kw)
        seen.append(dict(sp.hparams))
        return sp

    monkeypatch.setattr(loop._nn(), "sparsify", spy)
    train(_cfg(tmp_path / "a", "magnitude", target_density=0.01), data=tiny_data)
    assert seen[-1]["sparsity"] == pytest.approx(0.99)
    assert seen[-1]["min_layer_density"] == dnn.density.MIN_LAYER_DENSITY
    train(_cfg(tmp_path / "b", "magnitude", target_density=0.01,
               hparams={"min_layer_density": 0.005}), data=tiny_data)
    assert seen[-1]["min_layer_density"] == 0.005
