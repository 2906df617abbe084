"""Reference numbers and display names shared by every report of the training experiments.

The paper's table (LeJeune, Javadi, Baraniuk, "The Flip Side of the Reweighted Coin: Duality of
Adaptive Dropout and Regularization", NeurIPS 2021: LeNet-300-100 on MNIST after 200 epochs),
other published LeNet-300-100 points, the accuracy goals, and each method's label as figures and
tables print it. Only reports on all of MNIST show the reference numbers.
"""

from __future__ import annotations

from dualdrop.nn.registry import method_class, paper_table

# The paper's reported results after 200 epochs on MNIST, from each method's record in
# dualdrop.nn.registry: method -> (label, test error, fraction nonzero)
PAPER_TABLE: dict[str, tuple[str, float, float]] = paper_table()

#: Published LeNet-300-100 MNIST points (label -> (test error, fraction of nonzero weights)):
#: sparse variational dropout (Molchanov, Ashukha & Vetrov, "Variational Dropout Sparsifies Deep
#: Neural Networks", 2017), magnitude pruning with retraining (Han, Pool, Tran & Dally, "Learning
#: both Weights and Connections for Efficient Neural Networks", 2015) and dynamic network surgery
#: (Guo, Yao & Chen, "Dynamic Network Surgery for Efficient DNNs", 2016).
PUBLISHED_POINTS: dict[str, tuple[float, float]] = {
    "sparse VD (Molchanov et al. 2017)": (0.0192, 0.0147),
    "Han et al. 2015": (0.0159, 0.082),
    "DNS (Guo et al. 2016)": (0.0199, 0.018),
}

#: The accuracy goals on MNIST, as (test error, fraction nonzero) upper bounds.
GOALS: tuple[tuple[float, float], ...] = ((0.016, 0.015), (0.014, 0.05))


def method_label(m: str) -> str:
    """A method's display name (the paper's label where it has one)."""
    if m == "none":
        return "dense"
    try:
        return method_class(m).display_label()
    except (TypeError, ValueError):
        return m


def reference_rows() -> list[str]:
    """Markdown lines: the paper's table, the published points and the goals (MNIST,
    LeNet-300-100), to print beside a frontier on full MNIST only."""
    return (["", "Reference points (MNIST, LeNet-300-100):", "",
             "| source | test error | fraction nonzero |", "| --- | --- | --- |"]
            + [f"| paper: {label} (200 epochs) | {100 * e:.2f}% | {d:.4f} |"
               for label, e, d in PAPER_TABLE.values()]
            + [f"| published: {label} | {100 * e:.2f}% | {d:.4f} |"
               for label, (e, d) in PUBLISHED_POINTS.items()]
            + [f"| goal {i + 1} | <= {100 * e:.1f}% | <= {d:.3f} |"
               for i, (e, d) in enumerate(GOALS)])


__all__ = ["GOALS", "PAPER_TABLE", "PUBLISHED_POINTS", "method_label", "reference_rows"]
