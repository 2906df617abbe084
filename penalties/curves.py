"""Penalty curves for people: arrays, CSV and the two-panel comparison figure of the paper.

A *spec* names a penalty, its parameters and the lambda it is scaled by. As a string:
``name[:key=value,key=value][@lambda]``, e.g. ``logsum:eps=2@2`` or ``mcp:a=0.5,lam=1.41421356@1.41421356``.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_real_array, check_param
from .registry import get


@dataclass
class Spec:
    """A penalty to draw: catalog name, constructor params, lambda and a display label; or any
    penalty object (``penalty=``: a catalog penalty, one built by ``from_keep_ratio`` and the
    other constructors, a ``HardThreshold``), drawn as given."""

    name: str
    params: dict = field(default_factory=dict)
    lam: float = 1.0
    label: str | None = None
    penalty: object = None

    def __post_init__(self):
        self.lam = check_param(self.lam, "lambda", low=0.0)
        if self.penalty is not None:
            _check_penalty_object(self.penalty)
        if self.label is None:
            inner = ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
            self.label = self.name + (f"({inner})" if inner else "") + (f"@{_fmt(self.lam)}" if self.lam != 1 else "")

    @classmethod
    def of(cls, penalty, lam=1.0, label=None) -> "Spec":
        """The spec of a penalty object (its label: its description, e.g. the name of the rule
        it was built from, else its repr)."""
        _check_penalty_object(penalty)
        if label is None:
            desc = getattr(penalty, "description", None)  # penalties built from callables
            if desc is None:
                label = repr(penalty)
            else:
                label = f"{penalty.name}: {desc}" if desc and "<lambda>" not in desc else penalty.name
        return cls(getattr(penalty, "name", type(penalty).__name__), {}, lam, label, penalty)

    def build(self):
        if self.penalty is not None:
            return self.penalty
        return get(self.name, **self.params)


def _check_penalty_object(pen):
    if not (callable(getattr(pen, "omega", None)) and callable(getattr(pen, "eta_hat", None))):
        raise ValueError(f"expected a penalty (an object with omega and eta_hat, e.g. "
                         f"penalties.LogSum(2.0) or from_keep_ratio(...)), a Spec or a spec "
                         f"string, got {type(pen).__name__}")


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def parse_spec(text: str) -> Spec:
    """Parse ``name[:k=v,...][@lambda]`` into a :class:`Spec` (ValueError with the fix if malformed)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a penalty spec must be a non-empty string like 'logsum:eps=2@2'")
    body, lam = text.strip(), 1.0
    if "@" in body:
        body, lam_s = body.rsplit("@", 1)
        try:
            lam = float(lam_s)
        except ValueError:
            raise ValueError(f"bad lambda {lam_s!r} in spec {text!r}: write e.g. 'logsum:eps=2@2'") from None
    name, params = body, {}
    if ":" in body:
        name, rest = body.split(":", 1)
        for item in filter(None, rest.split(",")):
            if "=" not in item:
                raise ValueError(f"bad parameter {item!r} in spec {text!r}: use key=value")
            k, v = item.split("=", 1)
            if k.strip() in params:
                raise ValueError(f"parameter {k.strip()!r} given twice in spec {text!r}")
            try:
                val = float(v)
            except ValueError:
                raise ValueError(f"parameter {k!r} in spec {text!r} must be a number, got {v!r}") from None
            params[k.strip()] = int(val) if k.strip() == "k" and val.is_integer() else val
    spec = Spec(name.strip(), params, lam)
    spec.build()  # validate now, with the catalog's own error messages
    return spec


def paper_specs() -> list[Spec]:
    """The penalties of the paper's comparison figure (docs/theory.md section 3) plus HardThresh(16)."""
    r2 = math.sqrt(2.0)
    return [
        Spec("vardrop_exact", {}, 1.0, "VarDrop (exact KL)"),
        Spec("standout", {"a": 1.0, "b": 0.0}, 1.0, "Standout (a=1, b=0)"),
        Spec("hardconcrete", {}, 1.0, "HardConcrete"),
        Spec("logsum", {"eps": 2.0}, 2.0, "LogSum(2), λ = 2"),
        Spec("mcp", {"a": 0.5, "lam": r2}, r2, "MCP(1/2, √2), λ = √2"),
        Spec("hard_threshold", {"k": 16}, 1.0, "HardThresh(16)"),
    ]


def _as_specs(specs):
    if specs is None:
        return paper_specs()
    if isinstance(specs, (str, Spec)) or hasattr(specs, "omega"):
        specs = [specs]
    out = []
    for s in specs:
        if isinstance(s, str):
            out.append(parse_spec(s))
        elif isinstance(s, Spec):
            out.append(s)
        else:  # a penalty object: refused with the fix unless it has omega and eta_hat
            out.append(Spec.of(s))
    labels = [s.label for s in out]
    for i, lab in enumerate(labels):  # two curves of one label would share a CSV column
        if labels.count(lab) > 1:
            out[i] = Spec(out[i].name, out[i].params, out[i].lam, f"{lab} [{i + 1}]",
                          out[i].penalty)
    return out


def scalar_curves(specs=None, w=None, w_min=0.01, w_max=5.0, n=500) -> dict:
    """``{label: lambda * Omega(w)}`` for the separable penalties among ``specs`` (plus ``"w"``)."""
    if w is None:
        w_min = check_param(w_min, "w_min", low=0.0)
        w_max = check_param(w_max, "w_max", low=w_min)
        n = check_param(n, "n", low=1, integer=True)
        w = np.linspace(w_min, w_max, n)
    w = as_real_array(w, "w")
    out = {"w": w}
    for s in _as_specs(specs):
        pen = s.build()
        if getattr(pen, "is_separable", True) is False:
            continue
        out[s.label] = s.lam * pen.omega(w)
    return out


def nnz_curve(penalty, d=32, lam=1.0, ks=None) -> tuple[np.ndarray, np.ndarray]:
    """Vector penalty of ``w = (1/sqrt(k), ..., 1/sqrt(k), 0, ..., 0)`` (k nonzeros, unit l2 norm).

    Returns ``(ks, values)``; for a separable penalty the value is ``k lam Omega(1/sqrt(k))``, for a
    vector penalty (e.g. HardThreshold) its own value on the vector.
    """
    d = check_param(d, "d", low=0, integer=True)
    ks = np.arange(1, d + 1) if ks is None else np.asarray(ks, dtype=int)
    if ks.size and (ks.min() < 1 or ks.max() > d):
        raise ValueError(f"ks must lie in [1, d={d}]")
    vals = np.empty(ks.size)
    for i, k in enumerate(ks):
        w = np.zeros(d)
        w[:k] = 1.0 / math.sqrt(k)
        if getattr(penalty, "is_separable", True):
            vals[i] = lam * float(np.sum(penalty.omega(w)))
        else:
            vals[i] = lam * float(penalty.omega(w))
    return ks, vals


def nnz_curves(specs=None, d=32) -> dict:
    """``{"k": ks, label: values}`` for every spec (the right panel of the paper's figure)."""
    out = {}
    for s in _as_specs(specs):
        ks, vals = nnz_curve(s.build(), d=d, lam=s.lam)
        out["k"] = ks
        out[s.label] = vals
    return out


def write_csv(path, columns: dict):
    """Write equal-length columns to CSV atomically (temp file + rename)."""
    names = list(columns)
    n = len(next(iter(columns.values())))
    tmp = f"{path}.tmp"
    with open(tmp, "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(names)
        for i in range(n):
            wr.writerow([repr(float(columns[c][i])) if np.isfinite(columns[c][i]) else "inf" for c in names])
    os.replace(tmp, path)


#: line styles and markers cycled over the curves, so curves that coincide (HardConcrete and
#: MCP(1/2, sqrt 2) share the cap 1/2 beyond |w| ~ 0.7) both stay visible
_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _style(i: int, n_points: int, n_curves: int) -> dict:
    """Distinct style of curve ``i``: dash pattern, marker, and markers staggered along the curve."""
    every = max(1, n_points // 10)
    return {"ls": _STYLES[i % len(_STYLES)], "marker": _MARKERS[i % len(_MARKERS)],
            "markevery": (int(i * every / max(n_curves, 1)), every), "ms": 5,
            "lw": 2.6 - 1.4 * i / max(n_curves - 1, 1), "zorder": 2 + i}


def plot_figure(scalar: dict, nnz: dict, path_stem: str, d=32):
    """The paper's two panels: lambda Omega(w) against |w|, and the vector penalty against k.

    Every curve has its own dash pattern and marker (markers staggered along the curve, later
    curves drawn thinner and on top), so curves that coincide over a range stay visible; the
    legend sits below the axes, never over the data.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.2))
    w = scalar["w"]
    labels = [lbl for lbl in scalar if lbl != "w"]
    for i, label in enumerate(labels):
        ax1.plot(w, scalar[label], label=label, **_style(i, w.size, len(labels)))
    ax1.set_xlabel(r"$|w|$")
    ax1.set_ylabel(r"$\lambda\,\Omega(w)$")
    ax1.set_title(r"Effective penalties ($\Omega(0)=0$)")
    ax1.grid(alpha=0.3)
    ks = nnz["k"]
    finite = [v[np.isfinite(v)] for lbl, v in nnz.items() if lbl != "k" and np.isfinite(v).any()]
    finite_max = max((float(np.max(v)) for v in finite), default=1.0)
    nnz_labels = [lbl for lbl in nnz if lbl != "k"]
    for i, label in enumerate(nnz_labels):
        vals = nnz[label]
        st = _style(i, ks.size, len(nnz_labels))
        if np.isinf(vals).any():  # an indicator: draw the step, infinity at the top of the axis
            top = 1.05 * finite_max
            ax2.step(ks, np.where(np.isinf(vals), top, vals), where="post",
                     label=label + r" ($+\infty$ drawn at the top)", lw=st["lw"], ls=st["ls"], zorder=st["zorder"])
        else:
            st["markevery"] = 1
            st["ms"] = 3.5
            ax2.plot(ks, vals, label=label, **st)
    ax2.set_xlabel(rf"number of nonzeros $k$ ($d = {d}$, $\|w\|_2 = 1$)")
    ax2.set_ylabel(r"$\lambda\,\Omega(w)$ of the vector")
    ax2.set_title(r"Penalty against sparsity at fixed $\|w\|_2$")
    ax2.grid(alpha=0.3)
    handles, lbls = ax2.get_legend_handles_labels()
    fig.legend(handles, lbls, loc="lower center", ncol=min(3, max(len(lbls), 1)), fontsize=8.5,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(lbls) + 2) // 3), 1, 1))
    paths = []
    for ext in ("png", "pdf"):
        p = f"{path_stem}.{ext}"
        tmp = f"{path_stem}.tmp.{ext}"
        fig.savefig(tmp, dpi=150)
        os.replace(tmp, p)
        paths.append(p)
    plt.close(fig)
    return paths


def penalty_figure(out_dir, specs=None, w_min=0.01, w_max=5.0, n=500, d=32) -> dict:
    """Compute the curves, write ``penalties.csv``, ``nnz_curve.csv``, ``penalties.png/.pdf``.

    Returns ``{"scalar": ..., "nnz": ..., "files": [...]}``.
    """
    os.makedirs(out_dir, exist_ok=True)
    specs = _as_specs(specs)
    scalar = scalar_curves(specs, w_min=w_min, w_max=w_max, n=n)
    nnz = nnz_curves(specs, d=d)
    f1 = os.path.join(out_dir, "penalties.csv")
    f2 = os.path.join(out_dir, "nnz_curve.csv")
    write_csv(f1, scalar)
    write_csv(f2, nnz)
    figs = plot_figure(scalar, nnz, os.path.join(out_dir, "penalties"), d=d)
    return {"scalar": scalar, "nnz": nnz, "files": [f1, f2, *figs]}


def comparison_table(specs=None) -> list[dict]:
    """One row per penalty: behaviour at 0, at 1 and at infinity (what the figure shows)."""
    rows = []
    for s in _as_specs(specs):
        pen = s.build()
        if getattr(pen, "is_separable", True) is False:
            rows.append({"penalty": s.label, "slope_at_0": "-", "omega_1": "0 if ||w||_0<=k else inf",
                         "eta_hat_1": "0 or inf", "keep_ratio_1": "0 or 1", "omega_large": "-"})
            continue
        tiny = 1e-9
        rows.append({
            "penalty": s.label,
            "slope_at_0": s.lam * float(pen.omega(tiny)) / tiny,
            "omega_1": s.lam * float(pen.omega(1.0)),
            "eta_hat_1": float(pen.eta_hat(1.0)),
            "keep_ratio_1": float(pen.keep_ratio(1.0, s.lam)),
            "omega_large": s.lam * float(pen.omega(1e3)),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    """Markdown rendering of :func:`comparison_table`."""
    if not rows:
        return ""
    cols = list(rows[0])
    def cell(v):  # markdown: a literal '|' inside a cell must be escaped
        return (f"{v:.4g}" if isinstance(v, float) else str(v)).replace("|", "\\|")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    return "\n".join(lines)
