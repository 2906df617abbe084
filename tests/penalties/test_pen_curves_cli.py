"""Curves, CSV, figure and the `dualdrop penalties` command."""

import csv
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest

import penalties as P
from penalties import curves


def test_nnz_curve_closed_forms():
    ks, vals = curves.nnz_curve(P.L1(), d=32)
    np.testing.assert_allclose(vals, np.sqrt(ks))  # k * (1/sqrt k)
    ks, vals = curves.nnz_curve(P.HardThreshold(16), d=32)
    assert np.all(vals[:16] == 0) and np.all(np.isinf(vals[16:]))
    ks, vals = curves.nnz_curve(P.MCP(0.5, math.sqrt(2)), d=32, lam=math.sqrt(2))
    A = 0.5 * math.sqrt(2)
    expect = [math.sqrt(2) * k * (1 / math.sqrt(k) - 1 / (2 * k * A)) if 1 / math.sqrt(k) <= A else math.sqrt(2) * k * A / 2 for k in ks]
    np.testing.assert_allclose(vals, expect)


def test_parse_spec():
    s = curves.parse_spec("mcp:a=0.5,lam=2@3")
    assert s.name == "mcp" and s.params == {"a": 0.5, "lam": 2.0} and s.lam == 3.0
    assert curves.parse_spec("hard_threshold:k=16").params == {"k": 16}
    for bad in ["", "logsum:eps", "logsum@x", "logsum:eps=two", "logsum:eps=-1"]:
        with pytest.raises(ValueError):
            curves.parse_spec(bad)


def test_cli_writes_csv_and_figure(tmp_path):
    out = tmp_path / "fig"
    r = subprocess.run([sys.executable, "-m", "dualdrop", "penalties", "--out", str(out), "--w-max", "3", "--points", "50"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with open(out / "penalties.csv") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    assert header[0] == "w" and len(header) == 6  # five scalar penalties (HardThresh is a vector penalty)
    assert len(rows) == 51 and float(rows[-1][0]) == 3.0
    col = header.index("LogSum(2), λ = 2")
    assert float(rows[-1][col]) == pytest.approx(2 * math.log1p(3 / 2))
    assert (out / "penalties.png").stat().st_size > 10000 and (out / "penalties.pdf").exists()
    with open(out / "nnz_curve.csv") as fh:
        nnz = list(csv.reader(fh))
    assert nnz[0][-1] == "HardThresh(16)" and nnz[17][-1] == "inf" and float(nnz[16][-1]) == 0.0
    bad = subprocess.run([sys.executable, "-m", "dualdrop", "penalties", "--out", str(out), "--penalties", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown penalty" in bad.stderr


def test_penalties_does_not_import_torch():
    code = "import penalties, penalties.curves, sys; penalties.VarDropExact().omega(1.0); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "False", r.stderr


def test_pickle_and_equality():
    for pen in [P.LogSum(2.0), P.MCP(3, 0.5), P.HardConcrete(), P.HardThreshold(4), P.Standout(2.0, 1.0)]:
        clone = pickle.loads(pickle.dumps(pen))
        assert clone == pen and repr(clone) == repr(pen)
    assert P.get("LogSum", eps=2.0) == P.LogSum(2.0)
    assert P.LogSum(2.0) != P.LogSum(3.0)


def test_figure_keeps_every_curve_visible_and_tables_escape_pipes(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    specs = curves.paper_specs()
    res = curves.penalty_figure(tmp_path, specs, n=100)
    ax1 = figs[-1].axes[0]
    styles = [(str(line.get_linestyle()), line.get_marker()) for line in ax1.get_lines()]
    assert len(styles) == 5 and len(set(styles)) == 5  # HardConcrete and MCP coincide beyond 0.7
    # the two curves that coincide are indeed equal there: the styles are what keeps both visible
    hc, mcp = res["scalar"]["HardConcrete"], res["scalar"]["MCP(1/2, √2), λ = √2"]
    w = res["scalar"]["w"]
    assert np.allclose(hc[w > 0.8], mcp[w > 0.8], atol=1e-6)
    assert not figs[-1].axes[0].get_legend()  # the legend is the figure's, below the axes
    table = curves.format_table(curves.comparison_table(specs))
    assert "\\|\\|w\\|\\|_0" in table
    for line in table.splitlines():  # every row has exactly the header's number of cells
        assert len(line.replace("\\|", "").split("|")) == len(table.splitlines()[0].split("|"))
