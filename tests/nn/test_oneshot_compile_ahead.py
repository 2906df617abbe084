"""The polish's kernels compiled ahead in a second process (``methods._ahead``): the tiny
layer the second process polishes compiles every polish kernel with the argument types of a
real layer (else the call would compile them again), and the switch / launch / wait logic."""

import subprocess

import torch

from dualdrop.nn.oneshot.methods import _ahead, _ahead_job, _moves, _row_kernels
from dualdrop.nn.oneshot.methods.base import Budget
from dualdrop.nn.oneshot.methods.polish import polish


def _dispatchers():
    out = {}
    for mod in (_moves, _row_kernels):
        for name in dir(mod):
            d = getattr(mod, name)
            if hasattr(d, "signatures") and getattr(d, "py_func", None) is not None \
                    and d.py_func.__module__ == mod.__name__:
                out[f"{mod.__name__}.{name}"] = d
    return out


def test_the_tiny_layer_compiles_every_polish_kernel_a_real_layer_uses():
    """After the job, polishing a layer as the one-shot methods do (float32 trained weights,
    a float64 Gram of real-sized calibration, a magnitude start) compiles no new signature of
    any kernel of ``_moves`` / ``_row_kernels``; each kernel Python calls has been compiled."""
    _ahead_job.compile_polish()
    ds = _dispatchers()
    before = {n: len(d.signatures) for n, d in ds.items()}
    # the kernels Python calls (the others are compiled into them, or loaded with them)
    for d in (_moves._swaps, _moves._ladder, _row_kernels._build, _row_kernels._add,
              _row_kernels._remove):
        assert d.signatures, d.py_func.__name__
    g = torch.Generator().manual_seed(3)
    X = torch.randn(200, 30, generator=g)
    W0 = torch.randn(9, 30, generator=g)
    k = 9 * 30 // 3
    W = W0 * (W0.abs() >= W0.abs().flatten().kthvalue(W0.numel() - k).values)
    out = polish(W, W0, (X.T @ X).double(), Budget(n_keep=k))
    assert int(torch.count_nonzero(out)) == k
    assert {n: len(d.signatures) for n, d in ds.items()} == before


def test_start_is_off_by_switch_and_when_compiled(monkeypatch):
    """``DUALDROP_COMPILE_AHEAD=0`` launches nothing; nor do kernels already at hand."""
    launched = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(_ahead, "_PENDING", None)
    monkeypatch.setenv("DUALDROP_COMPILE_AHEAD", "0")
    assert not _ahead.start(_moves.KERNELS)
    monkeypatch.setenv("DUALDROP_COMPILE_AHEAD", "1")
    monkeypatch.setattr(_ahead, "is_compiled", lambda *d: True)
    assert not _ahead.start(_moves.KERNELS)
    assert launched == []


def test_start_launches_the_job_and_wait_waits_for_it(monkeypatch):
    """Kernels not at hand on two cores: one process runs the job module; a second start while
    it runs launches no other; ``wait`` waits for it once and is then a no-op."""
    class Proc:
        def __init__(self, args, **kw):
            self.args, self.env, self.waited = args, kw["env"], 0
            procs.append(self)

        def poll(self):
            return None

        def wait(self, timeout=None):
            self.waited += 1
            return 0

    procs = []
    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setattr(_ahead, "_PENDING", None)
    monkeypatch.setattr(_ahead, "is_compiled", lambda *d: False)
    monkeypatch.setattr(_ahead, "enabled", lambda: True)
    assert _ahead.start(_moves.KERNELS) and _ahead.start(_moves.KERNELS)
    assert len(procs) == 1 and _ahead.JOB in procs[0].args[-1]
    assert procs[0].env["OMP_NUM_THREADS"] == "1"
    _ahead.wait()
    _ahead.wait()
    assert procs[0].waited == 1 and _ahead._PENDING is None
