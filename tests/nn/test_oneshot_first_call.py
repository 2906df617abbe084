"""What the cold first call of the penalty methods compiles and runs, checked against independent
references: the written-out algebra that replaced numba's LAPACK wrappers and sorts (Anderson's
weights, the working-set selection, the polish's Cholesky inverse and solve), and the polish
effort the penalty path picks by layer size (``polish.default_effort``)."""

import numpy as np
import pytest
import torch

from dualdrop.linear._jit import select_ws
from dualdrop.linear.solvers.anderson import weights
from dualdrop.nn.oneshot.methods import penalty as penalty_mod
from dualdrop.nn.oneshot.methods import polish as P
from dualdrop.nn.oneshot.methods._moves import _exact_f
from dualdrop.nn.oneshot.methods._row_kernels import _spd_inverse
from dualdrop.nn.oneshot.methods.base import Budget
from dualdrop.nn.oneshot.registry import get_method


def _select_ws_by_sorting(score, nz, size):
    """The working set as the sorts defined it: candidates (positive score or nonzero), ranked
    by key (inf for a nonzero) with a stable sort, the first ``size`` in index order."""
    cand = np.flatnonzero((score > 0) | nz)
    if cand.size <= size:
        return cand
    key = np.where(nz[cand], np.inf, score[cand])
    return np.sort(cand[np.argsort(-key, kind="mergesort")[:size]])


def test_select_ws_matches_the_sorted_selection_ties_included():
    rng = np.random.default_rng(0)
    for _ in range(400):
        p = int(rng.integers(1, 40))
        # few distinct values: ties at the cut are the rule, not the exception
        score = np.round(rng.random(p) * 3, int(rng.integers(0, 2))) * (rng.random(p) > 0.3)
        nz = rng.random(p) > 0.7
        size = int(rng.integers(0, p + 2))
        got = select_ws(score, nz, size)
        np.testing.assert_array_equal(got, _select_ws_by_sorting(score, nz, size))


def test_anderson_weights_solve_the_regularized_system():
    """``c`` proportional to ``(U U^T + 1e-10 tr I)^-1 1``, summing to 1 (numpy's solve as the
    reference), and ``ok = False`` when the differences vanish."""
    rng = np.random.default_rng(1)
    hist = rng.standard_normal((6, 30))
    ok, c = weights(hist)
    U = np.diff(hist, axis=0)
    C = U @ U.T
    C += 1e-10 * np.trace(C) * np.eye(5)
    ref = np.linalg.solve(C, np.ones(5))
    assert ok
    np.testing.assert_allclose(c, ref / ref.sum(), rtol=1e-9)
    ok, _ = weights(np.ones((6, 30)))
    assert not ok


def test_the_polish_inverse_and_solve_match_numpy():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((50, 12))
    G = X.T @ X / 50 + 1e-8 * np.eye(12)
    H = np.empty((12, 12))
    _spd_inverse(G.copy(), 12, H)
    np.testing.assert_allclose(H, np.linalg.inv(G), rtol=1e-9, atol=1e-12)
    b = rng.standard_normal(12)
    S = np.array([0, 3, 5, 7, 11, 2, 2, 2], dtype=np.int64)  # only the first 5 are the support
    sub = S[:5]
    want = 0.5 * (4.0 - b[sub] @ np.linalg.solve(G[np.ix_(sub, sub)], b[sub]))
    assert _exact_f(G, b, 4.0, S, 5) == pytest.approx(want, rel=1e-12)


def _layer(R, p, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(3 * p, p, generator=g, dtype=torch.float64)
    return torch.randn(R, p, generator=g, dtype=torch.float64), X.T @ X / X.shape[0]


@pytest.mark.parametrize("limit, want", [(10_000, "full"), (20, "swaps")])
def test_the_path_polishes_fully_up_to_the_size_limit(monkeypatch, limit, want):
    """``polish=None`` (the default): ``"full"`` on layers of at most ``FULL_WEIGHTS`` live
    weights, ``"swaps"`` beyond; ``polish=False`` really switches the polish off (it used to
    mean the default)."""
    seen = []
    real = penalty_mod.penalty_support

    def spy(*args, **kw):
        seen.append(kw["polish"])
        return real(*args, **kw)

    monkeypatch.setattr(penalty_mod, "penalty_support", spy)
    monkeypatch.setattr(P, "FULL_WEIGHTS", limit)
    W0, G = _layer(6, 10)  # 60 live weights
    budget = Budget(n_keep=20)
    W = get_method("logsum").prune(W0, G, budget)
    assert seen == [want] and int((W != 0).sum()) == 20
    get_method("logsum", polish=False).prune(W0, G, budget)
    get_method("logsum", polish="full").prune(W0, G, budget)
    assert seen[1:] == [False, "full"]


def test_kernels_compiled_for_one_penalty_compile_only_its_formulas(tmp_path):
    """``gram_cd.kernels_for(LOGSUM)``: its zero threshold (the path's ``alpha_max``) compiles
    without the catalog's numeric prox (vardrop's, hard-concrete's), and agrees with the
    general kernel's; in a fresh process with an empty cache (what a first call sees)."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from penalties import kernels as K\n"
        "from dualdrop.linear import _jit\n"
        "from dualdrop.linear.solvers.gram_cd import kernels_for\n"
        "p = np.array([1.0])\n"
        "own = kernels_for(K.LOGSUM).zero_threshold(K.LOGSUM, p, 0.3)\n"
        "assert not K._prox_numeric_scalar.signatures, 'numeric prox compiled'\n"
        "assert own == _jit.zero_threshold(K.LOGSUM, p, 0.3) > 0, own\n"
        "assert K._prox_numeric_scalar.signatures\n"
        "print('ok')\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_working_set_heap_compiles_its_sift_once():
    """Compiled anew (so that numba types its calls again), the working-set selection asks its
    heap's sift for one signature: no literal start position compiles it a second time."""
    import numba

    from dualdrop.linear import _jit

    rng = np.random.default_rng(0)
    score = rng.random(60)
    got = numba.njit(select_ws.py_func)(score, score > 0.8, 10)
    assert np.array_equal(got, _select_ws_by_sorting(score, score > 0.8, 10))
    assert len(_jit._sift_down.signatures) == 1
