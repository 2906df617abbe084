"""Data parallel training: 2 gloo processes launched by torchrun equal one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dualdrop.data import load_mnist
from dualdrop.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(args, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "dualdrop", "sparsify", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_two_gloo_processes_match_one(tmp_path, tiny_mnist):
    folder, _ = tiny_mnist
    common = ["--method", "none", "--epochs", "2", "--data-dir", str(folder), "--no-verify",
              "--no-progress", "--threads", "1", "--seed", "0"]
    _torchrun(common + ["--out", str(tmp_path / "ddp")], tmp_path)
    # the same run stopped after epoch 1 and resumed, both times with 2 processes
    _torchrun(common + ["--out", str(tmp_path / "ddp2"), "--stop-after", "1"], tmp_path)
    _torchrun(common + ["--out", str(tmp_path / "ddp2"), "--resume"], tmp_path)

    data = load_mnist(folder, seed=0, verify=False)
    train(TrainConfig(method="none", epochs=2, out=str(tmp_path / "single"), seed=0,
                      progress=False, threads=1), data=data)

    def load(name):
        ck = torch.load(tmp_path / name / "checkpoint.pt", map_location="cpu", weights_only=True)
        return ck, json.loads((tmp_path / name / "final.json").read_text())

    (ck_d, fin_d), (ck_r, fin_r), (ck_s, fin_s) = load("ddp"), load("ddp2"), load("single")
    assert fin_d["world_size"] == 2 and fin_s["world_size"] == 1
    assert len(ck_d["rng"]) == 2  # one RNG state per process
    for k, v in ck_s["model"].items():
        # same global batches, gradients summed across processes: the same steps up to
        # floating-point summation order
        torch.testing.assert_close(ck_d["model"][k], v, rtol=1e-4, atol=1e-5)
        # resume under data parallel is exact
        assert torch.equal(ck_r["model"][k], ck_d["model"][k]), k
    assert fin_r["test_error"] == fin_d["test_error"]
    assert abs(fin_d["test_error"] - fin_s["test_error"]) <= 0.02


@pytest.mark.slow
def test_two_gloo_processes_stochastic_method_stays_in_sync(tmp_path, tiny_mnist):
    pytest.importorskip("dualdrop.nn")
    folder, _ = tiny_mnist
    # per-process noise differs; the loop checks every epoch that the weights agree bit for bit
    _torchrun(["--method", "vardrop-lr", "--epochs", "1", "--data-dir", str(folder),
               "--no-verify", "--no-progress", "--threads", "1", "--out", str(tmp_path / "v")],
              tmp_path)
    ck = torch.load(tmp_path / "v" / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert len(ck["rng"]) == 2
    assert not torch.equal(ck["rng"][0]["torch"], ck["rng"][1]["torch"])
    assert json.loads((tmp_path / "v" / "final.json").read_text())["world_size"] == 2


def _desync_worker(rank, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank))
    from dualdrop.train.distributed import Dist

    d = Dist(torch.device("cpu"))
    try:
        net = torch.nn.Linear(3, 2)
        d.broadcast_module(net)
        d.check_in_sync(net)  # in sync after the broadcast
        with torch.no_grad():
            net.weight[0, 0] += rank  # drift on rank 1 only
        try:
            d.check_in_sync(net)
            results[rank] = "no error"
        except RuntimeError as exc:
            results[rank] = str(exc)
    finally:
        d.close()


def test_desync_detected():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_desync_worker, args=(port, results), nprocs=2, join=True)
        assert all("different weights" in results[r] for r in (0, 1)), dict(results)
