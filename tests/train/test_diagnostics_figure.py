"""The figure of `dualdrop diagnose` reads correctly: labelled axes, bars from 0 on linear axes
(log axes only with markers, for ratios spread over decades), NaN marked, the legend off the
data, and no line joining unrelated runs."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dualdrop.train.report.figures import diagnostics_figure, plot_diagnostics  # noqa: E402


def _record(method, sgd_ratio, drop_ratio, lam1):
    rec = {"method": method, "epoch": 3, "run": f"runs/{method}"}
    for noise, ratio in (("sgd", sgd_ratio), ("drop", drop_ratio)):
        rec.update({f"{noise}_ratio": ratio, f"{noise}_cosine": 0.7 if ratio == ratio else ratio,
                    f"{noise}_null_cosine": 2e-4 if ratio == ratio else ratio})
    rec.update({f"lambda_{i}": lam1 / i for i in range(1, 4)})
    return rec


@pytest.fixture
def records():
    return [_record("vardrop", 7400.0, 2381.0, 10.0), _record("none", 5600.0, math.nan, 3.0)]


def test_labels_linear_bars_from_zero_and_nan_marked(records):
    fig = diagnostics_figure(records)
    try:
        axes = fig.axes
        assert len(axes) == 3
        for ax in axes:
            assert ax.get_ylabel(), ax.get_title()
            assert ax.get_legend() is None  # the legend sits below the panels, off the data
        assert fig.legends
        for ax in axes[:2]:
            assert ax.get_yscale() == "linear"
            assert ax.get_ylim()[0] == 0
            heights = [p.get_height() for p in ax.patches]
            assert all(h > 0 for h in heights) and len(heights) == 3  # the NaN bar is not drawn
            assert "n/a" in [t.get_text() for t in ax.texts]
        # a bar of 2381 next to one of 7400 is visibly a third of it (no log axis from ~2300)
        h = sorted(p.get_height() for p in axes[0].patches)
        assert h[0] == pytest.approx(2381.0)
        # eigenvalues: markers only, nothing joins two runs
        for line in axes[2].get_lines():
            assert line.get_linestyle() in ("None", "none", "")
        assert axes[2].get_ylim()[0] == 0
    finally:
        plt.close(fig)


def test_ratios_over_decades_use_markers_on_a_log_axis(records):
    records[1]["sgd_ratio"] = 3.0
    fig = diagnostics_figure(records)
    try:
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and not ax.patches
        assert len([ln for ln in ax.get_lines() if len(ln.get_xdata()) == 1]) == 3
    finally:
        plt.close(fig)


def test_plot_diagnostics_writes_the_file(records, tmp_path):
    path = tmp_path / "diagnostics.png"
    plot_diagnostics(records, path)
    assert path.stat().st_size > 10_000
