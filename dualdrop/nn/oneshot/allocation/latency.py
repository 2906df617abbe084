"""A measured latency table for structured budgets: ``target_speedup`` (as ZipLM's, Kurtic et
al., NeurIPS 2023: the speed-up a budget asks for is measured on the user's machine, for the
model's own shapes, not counted in parameters or FLOPs).

For each unit group (``units.UnitGroup``: the producer layers, the attention's score and
context products for heads, and the consumer that reads the units) the table holds the time of
that part of the network with ``k`` units kept, on a grid of ``k`` (every count up to 16 units,
else 1, 2, 4, 8, 16 and every sixteenth of them), each a freshly built copy of the layers
narrowed to ``k`` units run on random inputs of the shapes the model's forward gives them on
``inputs`` (the batch the user will run: e.g. 32 sequences of 128 tokens). Groups of the same shapes (the blocks of a
transformer) share one curve. With the dense model's own time ``T``, a pruned model's time is
predicted as ``T - sum_g (t_g(n_g) - t_g(k_g))`` (``t_g`` interpolated linearly between grid
points), and its speed-up as ``T`` over that.

Timings run with ``threads`` torch threads (1 by default) in interleaved rounds, each the
fastest of its rounds (``dualdrop.nn._timing``; a neighbour's work only adds time, see
:func:`timed_ratio`), on the wall clock or, on a machine busy with other work, the
process's CPU time (``clock="cpu"``). The table is built once
per machine, model shapes, thread count and torch version, and cached as JSON under
``$DUALDROP_CACHE_DIR`` (default ``~/.cache/dualdrop``)``/latency/`` (written to a temporary
name, then moved into place).

**Measured, then corrected.** The prediction sums parts timed alone; the whole compact model
may save more (or less) than they do, and more so at other batch shapes. So a
``target_speedup`` budget is checked on the model itself (:func:`meet_measured`): the
allocation's counts are applied to a copy (which units of a layer go does not change its time),
the copy is compacted (``dualdrop.nn.compact``) and timed against the model on the same inputs
(:func:`measured_speedup`: the ratio of each one's fastest of at least 15 interleaved rounds,
more rounds while the two halves of them disagree by more than a quarter of the tolerance), and
the speed-up the allocation aims for is corrected (along a least-squares line of ``log``
measured against ``log`` asked over the tries; a try that contradicts an earlier one of nearly
the same counts is measured again) until the measured one is within ``tol`` (5%) of the target,
or the closest of at most ``max_rounds`` (6) tries is kept and said. Each try costs one
compaction and about ``2 x 15`` forwards of the user's batch on top of the calibration (the
forwards of the dense and the compact model, a few seconds for a sentence encoder at 32 x 128
tokens on one thread).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import platform
import tempfile
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dualdrop.nn._layers import conv1d_class, is_conv1d
from dualdrop.nn._timing import interleaved, torch_threads
from dualdrop.nn.compact import compact

VERSION = 3   # 3: fastest rounds, not medians; 2: the finer grid of ``k`` (older: measured again)


@dataclass
class LatencyTable:
    """``dense`` (seconds of one forward of the model on the table's inputs) and, per unit
    group, the grid ``ks`` and seconds ``ts`` of its part (module docstring)."""

    dense: float
    curves: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)

    def part(self, name: str, k: float) -> float:
        ks, ts = self.curves[name]
        return float(np.interp(k, ks, ts))

    def predicted(self, counts: dict) -> float:
        """The predicted seconds of the model keeping ``counts[name]`` units per group. Parts
        timed alone, each with its own call overhead, can add up to more than the whole model
        (a small model on one input): the savings are then scaled by the whole model's time
        over the parts' total, so that no prediction falls to 0 or below."""
        whole = sum(self.part(n, k) for n, k in self.sizes.items())
        scale = min(1.0, self.dense / whole) if whole > 0 else 1.0
        return self.dense - scale * sum(self.part(n, self.sizes[n]) - self.part(n, counts[n])
                                        for n in counts)

    def speedup(self, counts: dict) -> float:
        return self.dense / max(self.predicted(counts), 1e-12)

    def to_dict(self) -> dict:
        return {"version": VERSION, "dense": self.dense, "sizes": self.sizes,
                "curves": {n: [list(map(float, k)), list(map(float, t))]
                           for n, (k, t) in self.curves.items()}}


def _cache_dir() -> str:
    return os.path.join(os.environ.get("DUALDROP_CACHE_DIR")
                        or os.path.join(os.path.expanduser("~"), ".cache", "dualdrop"), "latency")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _shapes(model, groups, inputs, forward_fn):
    """The input shape of every producer and consumer module on ``forward_fn(model,
    inputs)``."""
    seen = {}
    mods = {}
    for g in groups:
        mods[id(g.step.module)] = g.step.module
        for p in g.parts:
            mods[id(p.module)] = p.module

    def make(mid):
        def hook(module, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(x, torch.Tensor) and mid not in seen:
                seen[mid] = tuple(x.shape)
        return hook

    handles = [m.register_forward_pre_hook(make(mid), with_kwargs=True)
               for mid, m in mods.items()]
    try:
        with torch.no_grad():
            forward_fn(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


class _Part:
    """A group's part narrowed to ``k`` units: its producers, the heads' attention, the
    consumer, on random inputs of the recorded shapes."""

    def __init__(self, group, shapes, k, dtype, device):
        self.ops = []
        gen = torch.Generator().manual_seed(0)

        def rnd(shape):
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(device, dtype)

        for part in group.parts:
            if part.role == "bn":
                continue
            shape = shapes.get(id(part.module))
            if shape is None:
                continue
            rows = len(part.index[0]) if part.index else 0
            layer = _narrow_out(part, rows * k)
            if layer is None:
                continue
            layer = layer.to(device, dtype)
            x = rnd(shape)
            self.ops.append(lambda layer=layer, x=x: F.gelu(layer(x)))
        cm = group.step.module
        cshape = shapes.get(id(cm))
        m = len(group.columns[0])
        if group.kind == "head" and cshape is not None:
            d = group.head_dim
            lead = cshape[:-1]
            if group.step.kind == "mha_out":
                batch_first = cm.batch_first
                B, L = (lead[0], lead[1]) if batch_first or len(lead) == 1 else (lead[1], lead[0])
            else:
                B, L = (lead[0], lead[1]) if len(lead) >= 2 else (1, lead[0])
            q, kk, v = (rnd((B, k, L, d)) for _ in range(3))
            self.ops.append(lambda q=q, kk=kk, v=v: F.scaled_dot_product_attention(q, kk, v))
        layer, x = _narrow_in(group, k * m, cshape, rnd)
        if layer is not None:
            layer = layer.to(device, dtype)
            self.ops.append(lambda layer=layer, x=x: layer(x))

    def __call__(self):
        for op in self.ops:
            op()


def _narrow_out(part, n_out):
    m = part.module
    if part.role == "mha_in":
        return nn.Linear(m.embed_dim, n_out, bias=m.in_proj_bias is not None)
    if is_conv1d(m):
        return conv1d_class()(n_out, m.weight.shape[0])
    if isinstance(m, nn.Linear):
        return nn.Linear(m.in_features, n_out, bias=m.bias is not None)
    if isinstance(m, (nn.Conv1d, nn.Conv2d)):
        return type(m)(m.in_channels, n_out, m.kernel_size, m.stride, m.padding, m.dilation,
                       bias=m.bias is not None, padding_mode=m.padding_mode)
    return None


def _narrow_in(group, n_in, shape, rnd):
    """The consumer with ``n_in`` input columns, and a random input of its recorded shape."""
    if shape is None:
        return None, None
    m = group.step.module
    kind = group.step.kind
    if kind == "mha_out":
        return nn.Linear(n_in, m.embed_dim, bias=m.out_proj.bias is not None), \
            rnd(shape[:-1] + (n_in,))
    if kind == "hf_conv1d":
        return conv1d_class()(m.weight.shape[1], n_in), rnd(shape[:-1] + (n_in,))
    if kind == "linear":
        return nn.Linear(n_in, m.out_features, bias=m.bias is not None), \
            rnd(shape[:-1] + (n_in,))
    K = int(np.prod(m.kernel_size))
    ch = max(1, n_in // K)
    layer = type(m)(ch, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
                    bias=m.bias is not None, padding_mode=m.padding_mode)
    return layer, rnd((shape[0], ch) + tuple(shape[2:]))


def _grid(n: int) -> list[int]:
    """Every count up to 16 units; else 0, 1, 2, 4, 8, 16 and every sixteenth of ``n``."""
    if n <= 16:
        return list(range(0, n + 1))
    return sorted({0, 1, 2, 4, 8, 16} | {int(round(n * j / 16)) for j in range(1, 17)})


def _signature(group, shapes) -> str:
    parts = [(p.role, type(p.module).__name__, tuple(getattr(p.module, "weight").shape)
              if getattr(p.module, "weight", None) is not None and p.role != "mha_in"
              else p.module.embed_dim, len(p.index[0]) if p.index else 0,
              shapes.get(id(p.module))) for p in group.parts]
    cm = group.step.module
    return repr((group.kind, group.step.kind, type(cm).__name__, group.n_units,
                 len(group.columns[0]), group.head_dim, shapes.get(id(cm)), parts))


def build_table(model, groups, inputs, forward_fn, *, threads: int | None = 1,
                clock: str = "wall", cache: bool = True, rounds: int = 5,
                progress: bool = True) -> LatencyTable:
    """The :class:`LatencyTable` of ``groups`` of ``model`` on ``inputs`` (module docstring);
    read from the cache when it holds one for these shapes and this machine."""
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    was = model.training
    model.eval()
    try:
        shapes = _shapes(model, groups, inputs, forward_fn)
    finally:
        model.train(was)
    sigs = {g.name: _signature(g, shapes) for g in groups}
    key = hashlib.sha1(json.dumps({
        "v": VERSION, "sigs": sigs, "model": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()), "threads": threads,
        "torch": torch.__version__, "cpu": _cpu_name(), "device": str(dev),
        "dtype": str(dtype), "inputs": repr(_input_shapes(inputs)), "clock": clock},
        sort_keys=True).encode()).hexdigest()[:20]
    path = os.path.join(_cache_dir(), f"{key}.json")
    if cache and os.path.exists(path):
        try:
            with open(path) as f:
                blob = json.load(f)
            if blob.get("version") == VERSION:
                return LatencyTable(float(blob["dense"]), {
                    n: (np.asarray(k, float), np.asarray(t, float))
                    for n, (k, t) in blob["curves"].items()}, dict(blob["sizes"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass   # an unreadable cache entry is measured again
    from tqdm.auto import tqdm

    by_sig: dict[str, list] = {}
    for g in groups:
        by_sig.setdefault(sigs[g.name], []).append(g)
    bar = tqdm(total=len(by_sig) + 1, desc="latency table", unit="part", leave=False,
               disable=not progress)
    curves = {}
    with torch_threads(threads), torch.no_grad():
        dense = interleaved({"dense": lambda: forward_fn(model, inputs)}, rounds=rounds,
                            warmup=1, clock=clock)["dense"]
        bar.update(1)
        for sig, members in by_sig.items():
            g = members[0]
            ks = _grid(g.n_units)
            fns = {k: _Part(g, shapes, k, dtype, dev) for k in ks if k > 0}
            times = interleaved(fns, rounds=rounds, warmup=1, clock=clock) if fns else {}
            ts = [0.0] + [min(times[k]) for k in ks if k > 0]
            ts = np.maximum.accumulate(np.asarray(ts))   # more units never faster
            for m in members:
                curves[m.name] = (np.asarray(ks, float), ts)
            bar.update(1)
    bar.close()
    table = LatencyTable(float(min(dense)), curves, {g.name: g.n_units for g in groups})
    if cache:
        _write(path, table.to_dict())
    return table


def _input_shapes(inputs):
    if isinstance(inputs, torch.Tensor):
        return tuple(inputs.shape)
    if isinstance(inputs, dict):
        return {k: _input_shapes(v) for k, v in sorted(inputs.items())}
    if isinstance(inputs, (tuple, list)):
        return [_input_shapes(v) for v in inputs]
    return type(inputs).__name__


def _write(path: str, blob: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(blob, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


#: interleaved rounds of a measured speed-up at least (min-of-rounds: see :func:`timed_ratio`)
MEASURE_ROUNDS = 15
#: the most rounds one measured speed-up may take when its halves disagree
MEASURE_MAX_ROUNDS = 120


def timed_ratio(fns: dict, *, rounds: int = MEASURE_ROUNDS, clock: str = "wall",
                noise: float = 0.0125, max_rounds: int = MEASURE_MAX_ROUNDS) -> tuple:
    """``(t_a / t_b, spread)`` for ``fns = {a: ..., b: ...}`` (two callables, in that order):
    each one's *fastest* round of ``rounds`` interleaved ones (``dualdrop.nn._timing``).

    Why the minimum: a neighbour's work only ever adds time to a round, so the fastest round is
    the one least disturbed, and the ratio of the two minima is the least noisy estimate of the
    ratio of the undisturbed times (a median moves with the load: ~10% between two tries on a
    loaded machine). The spread is ``|log|`` of the ratio of the ratios measured on the first
    and the second half of the rounds: while it is above ``noise`` (a quarter of the 5%
    tolerance by default) the rounds are doubled, up to ``max_rounds``."""
    a, b = list(fns)
    times = interleaved(fns, rounds=rounds, warmup=1, clock=clock)
    while True:
        ta, tb = times[a], times[b]
        h = len(ta) // 2
        spread = abs(math.log((min(ta[:h]) / max(min(tb[:h]), 1e-12))
                              / (min(ta[h:]) / max(min(tb[h:]), 1e-12))))
        if spread <= noise or 2 * len(ta) > max_rounds:
            return min(ta) / max(min(tb), 1e-12), spread
        more = interleaved(fns, rounds=len(ta), warmup=0, clock=clock)
        times = {k: times[k] + more[k] for k in times}


def measured_speedup(model, groups, counts: dict, inputs, forward_fn, *, threads: int | None = 1,
                     clock: str = "wall", rounds: int = MEASURE_ROUNDS) -> float:
    """The model's time over that of its compact copy keeping ``counts[name]`` units of each
    group (the last ones of each group removed: the time does not depend on which), on
    ``inputs``: the ratio of the fastest of at least ``rounds`` interleaved rounds of each
    (:func:`timed_ratio`, more rounds while the two halves disagree). ``model`` is left as
    it is."""
    small, copies = copy.deepcopy((model, groups))
    for g in copies:
        if counts[g.name] < g.n_units:
            g.zero_parts(range(counts[g.name], g.n_units))
    small = compact(small.eval(), inputs, groups=copies, verify=False)   # the groups as found
    with torch_threads(threads), torch.no_grad():
        ratio, _ = timed_ratio({"model": lambda: forward_fn(model, inputs),
                                "compact": lambda: forward_fn(small, inputs)},
                               rounds=max(int(rounds), MEASURE_ROUNDS), clock=clock)
    return float(ratio)


@dataclass
class SpeedupFit:
    """What :func:`meet_measured` found: the ``counts`` kept, their ``predicted`` and
    ``measured`` speed-ups, whether the measured one is within the tolerance (``met``), and
    every try as ``(asked, predicted, measured)``."""

    counts: dict
    predicted: float
    measured: float
    met: bool
    tries: list


def meet_measured(target: float, allocate, predict, measure, *, tol: float = 0.05,
                  max_rounds: int = 6, confirm: bool = True) -> SpeedupFit:
    """Counts whose *measured* speed-up is within ``tol`` of ``target`` (module docstring):
    ``allocate(s)`` the counts of an allocation aiming at the predicted speed-up ``s`` (a
    ``ValueError`` when no allocation reaches it), ``predict(counts)`` their predicted speed-up,
    ``measure(counts)`` their measured one (an asked speed-up the allocation refuses, beyond
    one unit per layer as predicted, is lowered by bisection: the prediction may be the part
    that is wrong). The first try asks for ``target`` itself; each next
    one corrects the asked speed-up along ``log measured = slope log asked + const``, the slope
    fitted by least squares on the last three tries (clamped to [0.25, 4]; 1 after one try), so
    that one noisy measurement does not throw the secant of two close tries off. A measurement
    that contradicts an earlier try of nearly the same asked speed-up (within ``tol / 2``,
    measured more than ``tol`` apart: timing noise, not the model) has both tries measured
    again, each averaged with its first value in ``log``. The asked speed-ups that measured
    below and above the target bracket it (1, the model itself, from below): a step that
    leaves the bracket bisects it instead (a measured speed-up can jump between two close
    counts), and counts met before are not measured again. With ``confirm`` a try that lands
    within ``tol`` is measured a second time and accepted only if the ``log`` average of the two
    still is. The closest try is returned."""
    asked, tries, seen, best = float(target), [], [], None
    lo, hi = 1.0, math.inf      # asked speed-ups bracketing the target (1: the model itself)
    known = {}                  # counts already measured -> their measured speed-up
    for _ in range(3 * max_rounds):
        try:
            counts = allocate(asked)
        except ValueError:                 # asked beyond one unit per layer (as predicted):
            hi = min(hi, asked)            # ask for less, between the bracket's ends
            new = math.sqrt(lo * hi)
            if hi <= lo * (1 + 1e-3):
                break
            asked = new
            continue
        key = tuple(sorted(counts.items()))
        if key in known:                   # the same counts again: no new measurement
            meas = known[key]
        elif len(tries) >= max_rounds:
            break
        else:
            meas, pred = float(measure(counts)), float(predict(counts))
            for i, (a, _, m) in enumerate(tries):
                if abs(math.log(a / asked)) < tol / 2 and abs(math.log(m / meas)) > tol:
                    # nearly the same counts measured far apart: timing noise; both again
                    m2 = math.sqrt(m * float(measure(seen[i])))
                    tries[i] = (a, tries[i][1], m2)
                    known[tuple(sorted(seen[i].items()))] = m2
                    meas = math.sqrt(meas * float(measure(counts)))
                    break
            if abs(meas / target - 1) <= tol and confirm:
                # accepted on two measurements: one lucky (or unlucky) timing is not enough
                meas = math.sqrt(meas * float(measure(counts)))
            known[key] = meas
            tries.append((asked, pred, meas))
            seen.append(dict(counts))
            best = _closest(tries, seen, target, tol)
            if best.met:
                break
        if meas < target:
            lo = max(lo, asked)
        else:
            hi = min(hi, asked)
        new = max(1.0, math.exp(math.log(asked) + math.log(target / meas) / _slope(tries[-3:])))
        if not lo < new < hi:              # the step left the bracket: bisect it instead
            new = math.sqrt(lo * hi) if hi < math.inf else 2.0 * lo
        if abs(new - asked) <= 1e-6 * asked or hi <= lo * (1 + 1e-3):
            break
        asked = new
    if best is None:
        raise ValueError(f"no allocation reaches a predicted speed-up of {target:g}x")
    best.tries = tries
    return best


def _closest(tries, seen, target, tol):
    """The try measured closest to ``target`` (in ``log``) as a :class:`SpeedupFit`."""
    i = min(range(len(tries)), key=lambda i: abs(math.log(tries[i][2] / target)))
    a, p, m = tries[i]
    return SpeedupFit(dict(seen[i]), p, m, abs(m / target - 1) <= tol, tries)


def _slope(tries) -> float:
    """d log measured / d log asked, least squares over ``tries`` (1 when they cannot say)."""
    x = np.log([t[0] for t in tries])
    y = np.log([t[2] for t in tries])
    if len(tries) < 2 or np.ptp(x) < 1e-6:
        return 1.0
    slope = float(np.polyfit(x, y, 1)[0])
    return min(max(slope, 0.25), 4.0) if slope > 0 else 1.0
