"""``dualdrop fit`` end to end on tiny problems."""

import numpy as np

from dualdrop.cli import main


def test_fit_synthetic_with_path(tmp_path, capsys):
    rc = main(["fit", "--synthetic", "60,40", "--penalty", "mcp:a=3,lam=0.1", "--path", "4",
               "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "solver=cd" in out and "support recovery" in out
    coef = np.loadtxt(tmp_path / "coef.csv", delimiter=",", skiprows=1, usecols=1)
    assert coef.shape == (41,) and np.count_nonzero(coef[:-1]) > 0  # 40 features, intercept
    assert (tmp_path / "coef.csv").read_text().splitlines()[1].startswith("x0,")
    path = np.loadtxt(tmp_path / "path.csv", delimiter=",", skiprows=1)
    assert path.shape == (4, 41) and not np.any(path[0, 1:])  # alpha_max first: all zero
    assert (tmp_path / "path.png").stat().st_size > 1000


def test_fit_npz_classification_and_errors(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 5))
    y = (X[:, 0] > 0).astype(int)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    assert main(["fit", "--data", str(tmp_path / "d.npz"), "--task", "classification",
                 "--penalty", "logsum:eps=1"]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert main(["fit", "--data", str(tmp_path / "d.npz"), "--penalty", "nope"]) == 2
    assert "unknown penalty" in capsys.readouterr().err
    assert main(["fit", "--data", str(tmp_path / "missing.npz")]) == 2
    assert main(["fit", "--synthetic", "60,40", "--penalty", "logsum", "--solver", "cvxpy"]) == 2
    assert "Solvers that can" in capsys.readouterr().err


def test_fit_help_documents_every_option(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for opt in ("--tol", "--max-iter", "--scaling", "--no-intercept", "--task", "--solver"):
        after = text.split(opt, 2)[-1].split("}")[-1][:60] if opt in ("--solver", "--task", "--scaling") else text.split(opt, 2)[-1][:60]
        assert len(after.split()) > 3, opt  # a help sentence follows the option
    assert "{auto," in text  # auto is one of the listed choices


def test_path_figure_draws_only_entering_coefficients(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dualdrop.cli.fit_cmd import _plot_path

    alphas = np.logspace(0, -2, 5)
    coefs = np.zeros((5, 5000))
    coefs[2:, :40] = np.linspace(0.1, 4, 40)
    _plot_path(plt, alphas, coefs, "l1", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
