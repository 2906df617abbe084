"""lam warm-up and per-layer lam: epoch e trains with lam * min(1, e/W) * factor[layer],
exactly (the same weights as a run with that lam), resumes exactly, is rebuilt with its
per-layer strengths, and refuses methods without a numeric lam or unknown layers."""

from __future__ import annotations

import pytest
import torch

from dualdrop.train import TrainConfig, train
from dualdrop.train.checkpoint import read_checkpoint
from dualdrop.train.export import training_network

FAST = dict(progress=False, threads=1)


def _weights(out):
    """The tensors of a run's checkpointed network (the methods' extra states left out)."""
    sd = read_checkpoint(out / "checkpoint.pt", fix="-")["model"]
    return {k: v for k, v in sd.items() if torch.is_tensor(v)}


@pytest.mark.parametrize("method", ["logsum", "adaprox", "eta-trick"])
def test_first_epoch_trains_with_the_ramped_lam(tmp_path, method):
    # epoch 1 of a 4-epoch warm-up of lam = 4e-3 is epoch 1 of a run with lam = 1e-3
    # (same seed, data order and learning-rate schedule): bit for bit the same weights
    warm = tmp_path / "warm"
    train(TrainConfig(method=method, epochs=4, stop_after=1, out=str(warm), lam_warmup=4,
                      hparams={"lam": 4e-3}, **FAST))
    plain = tmp_path / "plain"
    train(TrainConfig(method=method, epochs=4, stop_after=1, out=str(plain),
                      hparams={"lam": 1e-3}, **FAST))
    other = tmp_path / "other"  # the warm-up changes something: not the lam = 4e-3 run
    train(TrainConfig(method=method, epochs=4, stop_after=1, out=str(other),
                      hparams={"lam": 4e-3}, **FAST))
    a, b, c = _weights(warm), _weights(plain), _weights(other)
    w = next(k for k in a if k.endswith("original") or k.endswith("weight"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a[w], c[w])


def test_resume_is_exact_and_lam_ends_at_its_value(tmp_path):
    cfg = dict(method="logsum", epochs=3, lam_warmup=2, hparams={"lam": 3e-3}, **FAST)
    full = train(TrainConfig(out=str(tmp_path / "full"), **cfg))
    train(TrainConfig(out=str(tmp_path / "cut"), stop_after=1, **cfg))
    cut = train(TrainConfig(out=str(tmp_path / "cut"), resume=True, **cfg))
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert cut["test_error"] == full["test_error"]
    assert cut["nonzero_total"] == full["nonzero_total"]
    # the checkpoint records the warm-up: resuming without it is another run
    with pytest.raises(ValueError, match="lam_warmup"):
        train(TrainConfig(out=str(tmp_path / "cut"), resume=True,
                          **{**cfg, "lam_warmup": None}))


@pytest.mark.parametrize("cfg, word", [
    (dict(method="vardrop"), "set one"),          # its KL weight is per dataset, lam None
    (dict(method="none"), "dense baseline"),
    (dict(method="logsum", lam_warmup=0), "lam_warmup=0"),
    (dict(method="logsum", lam_warmup=9), "1..epochs=2"),
    (dict(method="logsum", lam_warmup=1.5), "lam_warmup=1.5"),
    (dict(method="logsum", lam_warmup=None, lam_layers={"fc9": 2.0}), "fc1, fc2, fc3"),
    (dict(method="logsum", lam_warmup=None, lam_layers={"fc1": -1.0}), "positive finite"),
    (dict(method="vardrop", lam_warmup=None, lam_layers={"fc1": 2.0}), "--lam-layer"),
])
def test_bad_warmup_refused_before_data(tmp_path, cfg, word):
    cfg = {"lam_warmup": 1, "epochs": 2, **cfg}
    with pytest.raises(ValueError, match=word):
        train(TrainConfig(out=str(tmp_path / "x"), **FAST, **cfg))
    assert not (tmp_path / "x").exists()


def test_per_layer_lam_is_one_layer_s_lam(tmp_path):
    # a factor on fc1 alone: fc2/fc3 train as under plain lam only through the coupling of the
    # network, so compare with a network whose every layer has the factor: lam_layers on all
    # three layers with one factor equals lam times that factor, bit for bit
    cfg = dict(method="logsum", epochs=2, stop_after=1, **FAST)
    train(TrainConfig(out=str(tmp_path / "a"), hparams={"lam": 1e-3},
                      lam_layers={"fc1": 3.0, "fc2": 3.0, "fc3": 3.0}, **cfg))
    train(TrainConfig(out=str(tmp_path / "b"), hparams={"lam": 3e-3}, **cfg))
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_per_layer_lam_is_kept_by_the_rebuilt_network(tmp_path):
    out = tmp_path / "r"
    rep = train(TrainConfig(method="logsum", epochs=2, out=str(out), hparams={"lam": 1e-3},
                            lam_layers={"fc1": 4.0, "fc3": 0.5}, lam_warmup=2, **FAST))
    ck = read_checkpoint(out / "checkpoint.pt", fix="-")
    assert ck["config"]["lam_layers"] == {"fc1": 4.0, "fc3": 0.5}
    _, sp = training_network(ck)
    lams = {t.key: st.lam for t, st in sp.states()}
    assert lams == pytest.approx({"fc1": 4e-3, "fc2": 1e-3, "fc3": 5e-4})
    # the test-time pruning of the rebuilt network is the trained one's
    assert float(sp.density()["total"]) == pytest.approx(rep["nonzero_total"])


def test_cli_options(tmp_path):
    import json
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dualdrop", "sparsify", "--method", "logsum",
                               "--epochs", "1", "--no-progress", *args],
                              capture_output=True, text=True)

    p = cli("--lam-layer", "fc1=x", "--out", str(tmp_path / "bad"))
    assert p.returncode == 2 and "expected LAYER=FACTOR" in p.stderr
    p = cli("--lam-layer", "fc1=2", "--lam-layer", "fc3=0.5", "--lam-warmup", "1",
            "--out", str(tmp_path / "ok"))
    assert p.returncode == 0, p.stderr
    conf = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert conf["lam_layers"] == {"fc1": 2.0, "fc3": 0.5} and conf["lam_warmup"] == 1
