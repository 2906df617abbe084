"""``dualdrop fit``: cross-validated alpha (--cv K), feature names from the CSV header in every
output file, the intercept in coef.csv, long lists shortened in messages, a synthetic design
too large for memory refused in one line. Each failed before (no --cv option; coef.csv one
unnamed column; path.csv and path.png named w0..w199; every name printed; a MemoryError)."""

import csv

import numpy as np
import pytest

from dualdrop.cli import main
from dualdrop.linear import SparseLinearRegressionCV


@pytest.fixture
def wide_csv(tmp_path):
    """A 120 x 30 CSV with a header of gene names and the target in the middle; the first
    four features matter."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 30)) * rng.uniform(0.5, 3.0, 30)
    y = X[:, :4] @ np.array([2.0, -1.5, 1.0, 0.8]) + 0.3 * rng.standard_normal(120)
    names = [f"gene_{j}" for j in range(30)]
    data = np.column_stack([X[:, :10], y, X[:, 10:]])
    path = tmp_path / "genes.csv"
    np.savetxt(path, data, delimiter=",", header=",".join(names[:10] + ["response"] + names[10:]),
               comments="")
    return path, X, y, names


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_cv_chooses_alpha_and_writes_the_curve(wide_csv, tmp_path, capsys):
    path, X, y, names = wide_csv
    out = tmp_path / "out"
    rc = main(["fit", "--data", str(path), "--target", "response", "--cv", "3",
               "--cv-alphas", "8", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    ref = SparseLinearRegressionCV(alphas=8, cv=3).fit(X, y)  # the same folds and grid
    assert f"chose alpha={ref.alpha_:.4g}" in text and "3 folds x 8 alphas" in text
    rows = _rows(out / "cv.csv")
    assert rows[0] == ["alpha", "mean_mse", "std_mse", "chosen", "fold1_mse", "fold2_mse",
                       "fold3_mse"]
    table = np.array([[float(v) for v in r] for r in rows[1:]])
    np.testing.assert_allclose(table[:, 0], ref.alphas_, rtol=1e-12)
    np.testing.assert_allclose(table[:, 4:], ref.mse_path_, rtol=1e-9)
    np.testing.assert_allclose(table[:, 1], ref.mse_path_.mean(axis=1), rtol=1e-9)
    assert table[table[:, 3] == 1, 0] == pytest.approx(ref.alpha_)
    assert (out / "cv.png").stat().st_size > 1000
    coef = _rows(out / "coef.csv")
    assert coef[0] == ["feature", "coef"] and [r[0] for r in coef[1:-1]] == names
    assert coef[-1][0] == "(intercept)"
    np.testing.assert_allclose([float(r[1]) for r in coef[1:-1]], ref.coef_, rtol=1e-7,
                               atol=1e-10)
    assert float(coef[-1][1]) == pytest.approx(ref.intercept_, rel=1e-7, abs=1e-10)


def test_cv_for_classification_writes_the_log_loss(wide_csv, tmp_path, capsys):
    _, X, y, _ = wide_csv
    np.savez(tmp_path / "d.npz", X=X, y=(y > np.median(y)).astype(int))
    rc = main(["fit", "--data", str(tmp_path / "d.npz"), "--task", "classification", "--cv",
               "3", "--cv-alphas", "5", "--out", str(tmp_path / "o")])
    assert rc == 0 and "test log loss" in capsys.readouterr().out
    rows = _rows(tmp_path / "o" / "cv.csv")
    assert rows[0][:3] == ["alpha", "mean_log_loss", "std_log_loss"]
    assert all(float(r[1]) > 0 for r in rows[1:])  # a loss, lower is better
    coef = _rows(tmp_path / "o" / "coef.csv")
    assert coef[1][0] == "x0" and coef[-1][0] == "(intercept)"  # no header: x<index>


def test_every_output_file_names_the_features(wide_csv, tmp_path):
    path, _, _, names = wide_csv
    out = tmp_path / "o"
    assert main(["fit", "--data", str(path), "--target", "response", "--path", "4",
                 "--out", str(out)]) == 0
    assert _rows(out / "path.csv")[0] == ["alpha", *names]
    assert [r[0] for r in _rows(out / "coef.csv")[1:]] == [*names, "(intercept)"]


def test_the_path_figure_legend_uses_the_names(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dualdrop.cli import fit_cmd

    seen = {}
    real_close = plt.close

    def keep(fig=None):
        seen["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        real_close(fig)

    plt.close = keep
    try:
        coefs = np.zeros((3, 4))
        coefs[1:, 2] = [0.5, 1.0]
        fit_cmd._plot_path(plt, np.array([1.0, 0.1, 0.01]), coefs, "l1", tmp_path / "p.png",
                           labels=["age", "bmi", "glucose", "bp"])
    finally:
        plt.close = real_close
    assert seen["labels"] == ["glucose"]


def test_long_lists_are_shortened_in_messages(wide_csv, capsys):
    path, _, _, _ = wide_csv
    assert main(["fit", "--data", str(path), "--target", "response"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "features gene_0, gene_1" in first and "gene_29 (30 in all)" in first
    assert "gene_15" not in first
    assert main(["fit", "--data", str(path), "--target", "respons"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'response'?" in err and "(31 in all)" in err
    assert err.count("gene_") <= 10 and len(err.splitlines()) == 1


def test_cv_and_alpha_together_are_refused(capsys):
    assert main(["fit", "--synthetic", "40,5", "--cv", "3", "--alpha", "0.1"]) == 2
    assert "--cv chooses alpha" in capsys.readouterr().err
    assert main(["fit", "--synthetic", "40,5", "--cv", "1"]) == 2
    assert "--cv must be an integer >= 2" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["1000000000,1000000000", "1e9,1e9"])
def test_a_synthetic_design_beyond_memory_is_refused_in_one_line(size, capsys):
    assert main(["fit", "--synthetic", size]) == 2  # MemoryError before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--synthetic" in err[0] and "GiB" in err[0]
    assert "Traceback" not in err[0]
    assert main(["fit", "--synthetic", "40.5,10"]) == 2
    assert "two integers" in capsys.readouterr().err


def test_multiclass_outputs_name_the_classes_and_features(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 4))
    y = np.argmax(X[:, :3] + 0.3 * rng.standard_normal((150, 3)), axis=1)
    np.savetxt(tmp_path / "mc.csv", np.column_stack([X, y]), delimiter=",",
               header="a,b,c,d,label", comments="")
    out = tmp_path / "o"
    assert main(["fit", "--data", str(tmp_path / "mc.csv"), "--target", "label", "--task",
                 "classification", "--path", "3", "--out", str(out)]) == 0
    coef = _rows(out / "coef.csv")
    assert coef[0] == ["feature", "coef_0", "coef_1", "coef_2"]
    assert [r[0] for r in coef[1:]] == ["a", "b", "c", "d", "(intercept)"]
    assert _rows(out / "path.csv")[0][:3] == ["alpha", "0:a", "0:b"]
