"""Reports of the training experiments: the figures and tables that compare, frontier and
diagnose write, and the reference numbers they print beside them.

- :mod:`~dualdrop.train.report.references`: the paper's table, published points, goals, labels.
- :mod:`~dualdrop.train.report.tables`: Markdown and CSV tables, seed means and spreads.
- :mod:`~dualdrop.train.report.figures`: the PNG/PDF figures.

Reports read results (dicts of runs or frontier points) and write files; they train nothing and
import nothing from :mod:`dualdrop.train.experiments`, which calls them.
"""

from dualdrop.train.report.figures import plot_comparison, plot_diagnostics, plot_frontier
from dualdrop.train.report.references import (
    GOALS,
    PAPER_TABLE,
    PUBLISHED_POINTS,
    method_label,
    reference_rows,
)
from dualdrop.train.report.tables import comparison_table, frontier_table, mean_std, runs_table

__all__ = ["GOALS", "PAPER_TABLE", "PUBLISHED_POINTS", "comparison_table", "frontier_table",
           "mean_std", "method_label", "plot_comparison", "plot_diagnostics", "plot_frontier",
           "reference_rows", "runs_table"]
