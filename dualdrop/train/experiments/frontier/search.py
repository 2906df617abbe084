"""The search space of the frontier: one sparsity knob per method, and the Pareto set.

A trial draws the knob ``theta`` on ``[low, high]`` (log scale; a target sparsity near 1 as the
log of its complement) and, with a dense run to start from, a random or a warm start. Its
candidates are the validation points ``(E_val(tol), rho(tol))`` of its tolerance sweep; the
frontier is their Pareto set for minimizing both (:func:`pareto_front`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualdrop.nn import method_class

@dataclass(frozen=True)
class Knob:
    """One sparsity knob: the hyperparameter ``name`` searched on ``[low, high]``.

    ``log``: sample uniformly in log scale. ``complement``: sample ``1 - value`` in log scale
    instead (for a target sparsity near 1, e.g. magnitude's ``sparsity`` in [0.8, 0.995] is
    searched as a density in [0.005, 0.2]). Values are rounded to 3 significant digits (of the
    complement when ``complement``), which names the trial's folder.
    """

    name: str
    low: float
    high: float
    log: bool = True
    complement: bool = False

    def validate(self, method: str) -> None:
        for which in ("low", "high"):
            v = getattr(self, which)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{method}:{self.name} {which}={v!r}; expected a finite number")
        if not self.low < self.high:
            raise ValueError(f"{method}:{self.name} range [{self.low}, {self.high}] is empty; "
                             "give low < high, e.g. lam=1e-4:1e-2")
        if self.name == TARGET_DENSITY and not (0 < self.low and self.high <= 1):
            raise ValueError(f"{method}:{self.name} range [{self.low}, {self.high}]: a target "
                             "density lies in (0, 1], e.g. target_density=0.005:0.2")
        if self.complement and not (0 <= self.low and self.high < 1):
            raise ValueError(f"{method}:{self.name} range [{self.low}, {self.high}]: a "
                             "complement knob (a target sparsity) must lie in [0, 1)")
        if self.log and not self.complement and self.low <= 0:
            raise ValueError(f"{method}:{self.name} low={self.low}: a log-scale range needs "
                             "low > 0")

    @property
    def param(self) -> str:
        """Name of the Optuna parameter."""
        return f"1-{self.name}" if self.complement else self.name

    def bounds(self) -> tuple[float, float]:
        return (1 - self.high, 1 - self.low) if self.complement else (self.low, self.high)

    def value(self, sampled: float) -> float:
        """The hyperparameter value for a sampled parameter (rounded, see the class doc)."""
        q = float(f"{sampled:.3g}")
        return float(f"{1 - q:.6g}") if self.complement else q


#: the knob every method accepts: the finished network's density (``sparsify(...,
#: target_density=D)``), searched in log scale; not a hyperparameter of the method
TARGET_DENSITY = "target_density"


def target_density_knob(low: float = 0.005, high: float = 0.2) -> Knob:
    """The target density as the knob (the same for every method, so that trials of all methods
    land on a shared grid of densities)."""
    return Knob(TARGET_DENSITY, low, high)


def default_knob(method: str, hparams: dict, n_train: int | None = None) -> Knob:
    """The sparsity knob of ``method`` given its default ``hparams``: a decade either side of the
    default ``lam`` (KL weight of variational dropout, L0 weight of hard-concrete, penalty weight
    of the penalty methods; a default ``lam=None`` is the method record's
    ``lam_per_dataset / n_train``), or magnitude's target sparsity in [0.8, 0.995]."""
    spec = method_class(method).knob if method != "none" else None
    if spec is not None:  # the record's own knob (magnitude: its target sparsity)
        name, low, high, options = spec
        return Knob(name, low, high, **options)
    lam = hparams.get("lam")
    if lam is None and n_train and "lam" in hparams:
        per_dataset = method_class(method).lam_per_dataset
        lam = per_dataset / n_train if per_dataset else None
    if isinstance(lam, (int, float)) and not isinstance(lam, bool) and lam > 0:
        return Knob("lam", lam / 10, lam * 10)
    raise ValueError(f"method {method!r} has no default sparsity knob (its hyperparameters: "
                     f"{', '.join(sorted(hparams)) or 'none'}); give one, e.g. "
                     f"knobs={{{method!r}: Knob('name', low, high)}}")


def method_slug(method: str) -> str:
    """Folder name of a method (``penalty:mcp`` -> ``penalty_mcp``)."""
    return method.replace(":", "_").replace("/", "_")


def pareto_front(points: list[dict], error: str = "val_error",
                 density: str = "nonzero_total") -> list[dict]:
    """Points not dominated in (``error``, ``density``), both minimized, sorted by density.

    ``q`` dominates ``p`` when ``q`` is no worse in both and better in one. Of points equal in
    both values one is kept: the one earlier in the order of the optional key ``"tie"`` (e.g.
    the distance of its tolerance to the trained one), then of the list. Sorting by density then
    error, a point is on the front exactly when its error is below every error before it.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][density], points[i][error],
                                                      points[i].get("tie", 0.0), i))
    front, best = [], math.inf
    for i in order:
        if points[i][error] < best:
            front.append(points[i])
            best = points[i][error]
    return front


def suggest(trial, plan) -> tuple[dict, bool, str]:
    """Ask ``trial`` for the knob (and the start): ``(hparams, warm, trial id)``; the id spells
    the rounded knob value and the start, and names the trial's folder."""
    lo, hi = plan.knob.bounds()
    value = plan.knob.value(trial.suggest_float(plan.knob.param, lo, hi, log=plan.knob.log))
    warm = bool(trial.suggest_categorical("warm", [False, True])) if plan.init_from else False
    tid = f"{plan.knob.name}={value:g}"
    if plan.init_from:
        tid += "-warm" if warm else "-cold"
    return {**plan.fixed, plan.knob.name: value}, warm, tid


def validation_points(report: dict) -> list[dict]:
    """The candidates of one finished run, from validation numbers only.

    With a keep-ratio tolerance: one per entry of ``val_tol_sweep`` (plus the trained tolerance
    if the sweep lacks it); otherwise the trained network alone (``tol`` None). ``tie``: distance
    of the tolerance to the trained one, in log scale (equal networks: prefer the trained tol).
    """
    tol0 = (report.get("hparams") or {}).get("tol")
    sweep = report.get("val_tol_sweep") or []
    pts = [{"tol": float(r["tol"]), "val_error": float(r["error"]),
            "nonzero_total": float(r["nonzero_total"])} for r in sweep]
    if tol0 is None or not any(math.isclose(p["tol"], tol0) for p in pts):
        pts.append({"tol": None if tol0 is None else float(tol0),
                    "val_error": float(report["val_error"]),
                    "nonzero_total": float(report["nonzero_total"])})
    for p in pts:
        p["tie"] = 0.0 if p["tol"] is None or tol0 is None else abs(math.log(p["tol"] / tol0))
    return pts


__all__ = ["Knob", "default_knob", "method_slug", "pareto_front", "suggest", "validation_points"]
