"""``--model-class mynets:MLP`` from the folder holding ``mynets.py``: the installed ``dualdrop``
command (whose own folder, not the current one, heads ``sys.path``) searches the current folder,
as ``python -m`` does, for ``prune --model`` and for ``latency`` on the run it wrote; a
module that is not there is refused with where Python looked."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

MYNETS = '''
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
'''


def _command():
    found = shutil.which("dualdrop")
    if found is None:
        pytest.skip("the dualdrop console script is not installed")
    return found


def _run(folder, *argv):
    env = dict(os.environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) != str(folder)]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([_command(), *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def test_own_class_from_the_current_folder(tmp_path):
    (tmp_path / "mynets.py").write_text(MYNETS)
    sys.path.insert(0, str(tmp_path))
    try:
        import mynets
        torch.manual_seed(0)
        torch.save(mynets.MLP().state_dict(), tmp_path / "net.pt")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mynets", None)
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).normal(size=(32, 8)).astype("f4"))
    base = ["--model", "net.pt", "--calib", "calib.npy", "--method", "magnitude",
            "--density", "0.5", "--no-progress"]
    done = _run(tmp_path, "prune", *base, "--model-class", "mynets:MLP", "--out", "run")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "final.json").exists()
    timed = _run(tmp_path, "latency", "run", "--batch-sizes", "1", "--rounds", "1",
                 "--layouts", "dense", "--no-progress")
    assert timed.returncode == 0, timed.stderr
    assert (tmp_path / "run" / "latency" / "latency.json").exists()


def test_the_message_names_what_went_wrong(tmp_path, monkeypatch):
    from dualdrop.train.user_model import import_model_class

    (tmp_path / "mynets2.py").write_text(MYNETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="no mynetz.py") as info:
        import_model_class("mynetz:MLP")
    assert f"in the current folder {tmp_path}" in str(info.value)
    with pytest.raises(ValueError, match="check the name") as info:
        import_model_class("mynets2:MLPX")
    assert str(tmp_path / "mynets2.py") in str(info.value)
    sys.modules.pop("mynets2", None)


def test_the_message_says_when_the_current_folder_is_not_searched(tmp_path, monkeypatch):
    from dualdrop.train.user_model import import_model_class

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p and os.path.abspath(p) != str(tmp_path)])
    with pytest.raises(ValueError, match="does not hold the current folder") as info:
        import_model_class("mynets_absent_here:MLP")
    assert str(tmp_path) in str(info.value)
