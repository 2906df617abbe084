"""lam warm-up: epoch e trains with lam * min(1, e/W), exactly (the same weights as a run with
that lam), resumes exactly, and refuses methods without a numeric lam."""

from __future__ import annotations

import pytest
import torch

from dualdrop.train import TrainConfig, train
from dualdrop.train.checkpoint import read_checkpoint

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
])
def test_bad_warmup_refused_before_data(tmp_path, cfg, word):
    cfg = {"lam_warmup": 1, "epochs": 2, **cfg}
    with pytest.raises(ValueError, match=word):
        train(TrainConfig(out=str(tmp_path / "x"), **FAST, **cfg))
    assert not (tmp_path / "x").exists()
