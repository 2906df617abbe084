"""The polish's kernels compiled ahead in a second process (``methods._ahead``): the job
compiles every kernel the polish calls with the argument types of a real layer (else the call
would compile them again), each once; run as the second process runs it, it imports no torch;
and the switch / launch / wait logic."""

import json
import subprocess
import sys

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


def test_the_job_compiles_every_polish_kernel_a_real_layer_uses():
    """After the job, polishing layers as the one-shot methods do (float32 trained weights, a
    float64 Gram of real-sized calibration, a magnitude start; both efforts, and an N:M
    pattern) compiles no new signature of any kernel of ``_moves`` / ``_row_kernels``: the
    job's signatures are the calls' own, and each kernel the polish calls from Python (the
    others are compiled into them) has exactly one."""
    _ahead_job.compile_polish()
    ds = _dispatchers()
    before = {n: len(d.signatures) for n, d in ds.items()}
    assert {d for d, _ in _ahead_job.signatures()} == set(_moves.KERNELS)
    for d in _moves.KERNELS:
        assert len(d.signatures) == 1, d.py_func.__name__
    g = torch.Generator().manual_seed(3)
    for effort, budget in (("full", None), ("swaps", None), ("full", Budget(pattern=(2, 4)))):
        X = torch.randn(200, 32, generator=g)
        W0 = torch.randn(9, 32, generator=g)
        k = 9 * 32 // 3
        W = W0 * (W0.abs() >= W0.abs().flatten().kthvalue(W0.numel() - k).values)
        out = polish(W, W0, (X.T @ X).double(), budget or Budget(n_keep=k), effort=effort)
        assert int(torch.count_nonzero(out)) == (k if budget is None else 9 * 16)
    assert {n: len(d.signatures) for n, d in ds.items()} == before


def test_the_job_as_a_script_imports_neither_torch_nor_the_packages():
    """Run as the second process runs it (a script), the job reads numpy, numba and the two
    kernel modules alone (the packages above them stand empty: no torch) and leaves every
    kernel of its list compiled, here loaded from the cache the test above filled."""
    _ahead_job.compile_polish()
    code = (f"import runpy, sys, json; runpy.run_path({_ahead.JOB!r}, run_name='__main__'); "
            "K = sys.modules['dualdrop.nn.oneshot.methods._moves']; "
            "print(json.dumps(['torch' in sys.modules, hasattr(sys.modules['dualdrop'], "
            "'__version__'), [len(d.signatures) for d in K.KERNELS]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    torch_in, package_read, counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert not torch_in and not package_read
    assert counts == [1] * len(_moves.KERNELS)


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


def test_wait_for_some_kernels_returns_once_they_are_cached(monkeypatch):
    """``wait(kernels)`` returns as soon as those kernels are in the cache, the process still
    running (the swaps need not wait for the ladder's step, which the job compiles last); a
    plain ``wait`` then waits for the process; a process that ends (or fails) first ends the
    waiting for kernels too."""
    class Proc:
        def __init__(self, ends):
            self.ends, self.waited = ends, 0

        def poll(self):
            return 0 if self.ends else None

        def wait(self, timeout=None):
            self.waited += 1
            return 0

    looks = []
    monkeypatch.setattr(_ahead, "is_compiled", lambda *d: looks.append(d) or len(looks) >= 3)
    monkeypatch.setattr(_ahead, "POLL", 0.0)
    proc = Proc(ends=False)
    monkeypatch.setattr(_ahead, "_PENDING", proc)
    _ahead.wait(_moves.SWAP_KERNELS)
    assert len(looks) == 3 and proc.waited == 0 and _ahead._PENDING is proc
    _ahead.wait()
    assert proc.waited == 1 and _ahead._PENDING is None
    failed = Proc(ends=True)
    monkeypatch.setattr(_ahead, "_PENDING", failed)
    _ahead.wait(_moves.SWAP_KERNELS)
    assert failed.waited == 1 and _ahead._PENDING is None
    order = [d for d, _ in _ahead_job.signatures()]
    assert order[:len(_moves.SWAP_KERNELS)] == list(_moves.SWAP_KERNELS)


def test_each_kernel_the_polish_reaches_compiles_for_one_signature():
    """Compiled anew (uncached copies of the kernels the polish calls, so that numba types
    every call inside them again), the kernels they call are asked for one signature each: no
    literal argument makes numba compile a callee a second time (a literal ``0`` or ``-1``, or
    a module constant, typed ``Literal[int]``)."""
    import numba

    for d, sig in _ahead_job.signatures():
        if d in (_moves._swap_loop, _moves._step, _row_kernels._add):  # they reach every callee
            numba.njit(d.py_func).compile(sig)
    many = {n: d.signatures for n, d in _dispatchers().items() if len(d.signatures) > 1}
    assert many == {}
