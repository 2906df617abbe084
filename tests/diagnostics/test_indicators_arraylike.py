"""escape_indicator and alignment take NumPy arrays (and other array-likes) as well as tensors."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dualdrop.diagnostics import alignment, escape_indicator


def _pair(D=12, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((D, D))
    B = rng.standard_normal((D, 3))
    return A @ A.T, B @ B.T


def test_numpy_equals_tensor_and_closed_form():
    H, S = _pair()
    got = escape_indicator(H, S)
    ref = escape_indicator(torch.from_numpy(H), torch.from_numpy(S))
    assert got == pytest.approx(ref, rel=1e-12)
    # independent: Tr(H S) and Tr(S) Tr(H) / D in NumPy
    assert got["trace"] == pytest.approx(np.trace(H @ S), rel=1e-12)
    assert got["isotropic"] == pytest.approx(np.trace(S) * np.trace(H) / 12, rel=1e-12)
    a = alignment(H, S, k=3, null_samples=20)
    b = alignment(torch.from_numpy(H), torch.from_numpy(S), k=3, null_samples=20)
    cos = np.sum(H * S) / (np.linalg.norm(H) * np.linalg.norm(S))
    assert a["cosine"] == pytest.approx(cos, rel=1e-12)
    for key in ("cosine", "overlap", "energy", "p_value", "null_mean_exact", "null_std_exact"):
        assert a[key] == pytest.approx(b[key], rel=1e-10), key


def test_mixed_lists_sparse_and_float32_tensor():
    H, S = _pair(seed=1)
    ref = escape_indicator(H, S)["ratio"]
    assert escape_indicator(H.tolist(), sp.csr_matrix(S))["ratio"] == pytest.approx(ref, rel=1e-12)
    assert escape_indicator(torch.tensor(H, dtype=torch.float32), S)["ratio"] == pytest.approx(
        ref, rel=1e-5)


def test_non_numeric_input_names_the_argument():
    H, _ = _pair()
    with pytest.raises(TypeError, match=r"Sigma must be a square matrix \(a torch.Tensor or an "
                                        r"array-like of numbers"):
        escape_indicator(H, "not a matrix")
    with pytest.raises(ValueError, match="H must be a square matrix, got shape"):
        alignment(np.ones((3, 4)), np.eye(3))
