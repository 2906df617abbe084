"""Edges of the one-shot methods: a Gram of rank 1 (one calibration sample) ends and meets the
budget, a penalty method refuses another penalty, a non-finite Gram says what to do, the first
compile is announced by the method itself, and the benchmark scripts import without a cycle."""

import ast
import contextlib
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from dualdrop.nn.oneshot import Budget, get_method, layer_objective
from dualdrop.nn.oneshot.methods.base import LayerProblem
from dualdrop.nn.oneshot.methods.penalty import allocate_penalty

D = torch.float64


@contextlib.contextmanager
def deadline(seconds):
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``."""
    def alarm(*_):
        raise TimeoutError(f"still running after {seconds} s: an unbounded search loop")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _rank_one_layer(R=12, p=48, seed=0):
    """One calibration sample: ``G = x x^T`` has rank 1, so a row's least squares is exact with
    one input and coordinate descent never spreads a row over more inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, p, generator=g, dtype=D) + 0.1
    return torch.randn(R, p, generator=g, dtype=D), x.T @ x


@pytest.mark.parametrize("name", ["logsum", "mcp", "admm", "polish"])
def test_one_calibration_sample_ends_and_meets_the_budget(name):
    """The penalty path stalled at one nonzero per row and the greedy additions retried an input
    they had been refused, forever; the budget is met exactly, and the layer reproduced (one
    input per row is enough on a rank-1 Gram)."""
    W0, G = _rank_one_layer()
    X = torch.randn(64, 48, dtype=D)
    get_method(name).prune(W0, X.T @ X, Budget(pattern=(2, 4)))  # compiles outside the deadline
    get_method(name).prune(W0, X.T @ X, Budget(n_keep=100))
    with deadline(60):
        for budget in (Budget(n_keep=300), Budget(n_keep=5), Budget(pattern=(2, 4))):
            W = get_method(name).prune(W0, G, budget)
            assert budget.met_by(W)
            if budget.n_keep is not None:
                assert int((W != 0).sum()) <= budget.n_keep
            if budget.keep_count(W0.shape) >= W0.shape[0]:  # an input for every row
                assert layer_objective(W, W0, G) < 1e-6


def test_allocate_penalty_ends_on_rank_one_grams():
    problems = [LayerProblem(f"l{i}", *_rank_one_layer(seed=i)) for i in range(2)]
    allocate_penalty(problems[:1], 0.01)  # compiles outside the deadline
    with deadline(60):
        counts = allocate_penalty(problems, 0.5)
    assert sum(counts.values()) == round(0.5 * sum(p.W0.numel() for p in problems))


def test_a_penalty_method_refuses_another_penalty():
    """``get_method("logsum", penalty="mcp")`` ran MCP under the name logsum."""
    with pytest.raises(ValueError, match=r"'logsum'.*penalty='mcp'.*method='penalty:mcp'"):
        get_method("logsum", penalty="mcp")
    assert get_method("logsum", penalty="logsum").P.name == "logsum"
    assert get_method("penalty", penalty="mcp").P.name == "mcp"
    assert get_method("penalty:scad").P.name == "scad"


def test_non_finite_gram_says_what_to_do():
    W0, G = _rank_one_layer()
    G[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"G has non-finite entries.*calibration"):
        get_method("magnitude").prune(W0, G, Budget(n_keep=3))


class _Uncompiled:
    """A numba dispatcher stand-in with no machine code and no cache entry."""
    signatures = []

    class _cache:  # noqa: N801
        class _cache_file:  # noqa: N801
            @staticmethod
            def _load_index():
                return {}


def test_the_method_announces_its_first_compile(capsys):
    """Any caller of ``prune`` (not only ``prune_oneshot`` with its progress bar) hears that
    the kernels compile now, once a process."""
    from dualdrop.nn.oneshot.methods.magnitude import Magnitude

    kernel = _Uncompiled()

    class Slow(Magnitude):
        def kernels(self):
            return (kernel,)

    W0, G = _rank_one_layer()
    Slow().prune(W0, G, Budget(n_keep=3))
    assert "one-shot magnitude: compiling numba kernels" in capsys.readouterr().err
    Slow().prune(W0, G, Budget(n_keep=3))
    assert capsys.readouterr().err == ""


def test_penalty_methods_announce_only_the_kernels_their_layers_compile(monkeypatch):
    """A small network never runs the wide-layer splitting: its kernels are not in the
    method's list (they are never cached there, so listing them printed the compile notice on
    every call); a wide layer announces them itself, and solver='split' lists only them."""
    from dualdrop.nn.oneshot.methods import penalty as pen

    small = get_method("logsum")
    assert not set(pen.SPLIT_KERNELS) & set(small.kernels())
    assert small.kernels()  # the path's kernels are still announced
    assert get_method("logsum", solver="split").kernels() == pen.SPLIT_KERNELS
    said = []
    monkeypatch.setattr(pen, "announce_first_use", lambda ks, what: said.append((ks, what)))
    monkeypatch.setattr(pen, "split_support", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("reached the splitting")))
    W0, G = _rank_one_layer()
    with pytest.raises(RuntimeError, match="reached the splitting"):
        get_method("logsum", solver="split").prune(W0, G, Budget(n_keep=3))
    assert said == [(pen.SPLIT_KERNELS, "one-shot logsum at width")]


def _local_imports(path: Path, names):
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in names:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in names)
    return out


def test_benchmark_scripts_import_without_a_cycle():
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "nn_accuracy"
    files = {f.stem: f for f in folder.glob("*.py")}
    graph = {name: _local_imports(f, files) for name, f in files.items()}

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(graph[n])
        return seen

    cycles = sorted(n for n in graph if n in reach(n))
    assert not cycles, f"benchmark modules in an import cycle: {cycles}"
