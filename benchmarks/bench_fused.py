"""Training step of each method, current layers against the fused Functions, as ratios to dense.

For every method this times, interleaved in rounds, three steps of LeNet-300-100 (Adam, batch
128, cross-entropy, the regularizer's gradient only as ``dualdrop.train`` runs it):

- ``dense``: the plain network;
- ``current``: ``sparsify(model, method)`` as the package runs it today (``bench_floors``' step);
- ``fused``: the same sparsified parameters, with the per-weight work done by
  ``dualdrop.nn._fused`` (counter-based noise keyed by (seed, layer, step)): the step the wiring
  plan at the top of that module would give.

Medians over rounds, spread (min-max) and ratios to the dense median of the same run; the load
average is printed because the machine is shared. The default clock is the process's CPU time:
on a machine shared by several busy processes, wall-clock time mostly measures how often the
scheduler takes the core away, CPU time what the step itself costs (``--clock wall`` for the
other; contention for caches and memory bandwidth still shows in both).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python3 benchmarks/bench_fused.py --rounds 7 --steps 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_floors import (add_common_args, dense_setup, lenet, make_adam,  # noqa: E402
                          make_method, run_rounds)

from dualdrop.nn import _fused as FU  # noqa: E402
from dualdrop.nn import sparsify  # noqa: E402
from dualdrop.nn._noise import make_key  # noqa: E402

METHODS = ("magnitude", "logsum", "adatikhonov", "adaprox", "penalty:mcp", "eta-trick",
           "hardconcrete", "hardconcrete-neuron", "vardrop", "vardrop-lr", "vardrop-lr-ar")
N_TRAIN = 48000
SEED = 0


def _penalty_kind(layer):
    return layer.penalty.name, dict(layer.penalty.params)


def _layer_out(method, i, layer, h, step):
    """One sparsified Linear layer's training forward with the fused Functions; returns
    ``(pre-activation, regularizer term)``."""
    key = make_key(SEED, i, step)
    zero = h.new_zeros(())
    if method == "hardconcrete":
        w, l0 = FU.hard_concrete_gate(layer.weight, layer.gate_logits, key, layer.beta,
                                      layer.gamma, layer.zeta)
        return F.linear(h, w, layer.bias), (layer.lam / N_TRAIN) * l0
    if method == "hardconcrete-neuron":
        hz, l0 = FU.hard_concrete_gate(h, layer.gate_logits, key, layer.beta, layer.gamma,
                                       layer.zeta)
        return (F.linear(hz, layer.weight, layer.bias),
                (layer.lam * layer.group_size() / N_TRAIN) * l0)
    if method == "vardrop":
        w, kl = FU.vardrop_noise(layer.weight, layer.log_alpha, key, layer.clip, False)
        return F.linear(h, w, layer.bias), (layer.lam / N_TRAIN) * kl
    if method == "vardrop-lr":
        var_w, kl = FU.lr_variance_kl(layer.weight, layer.log_alpha, layer.clip, False)
        out = FU.local_reparam_linear(h, layer.weight, layer.bias, var_w, key)
        return out, (layer.lam / N_TRAIN) * kl
    if method == "vardrop-lr-ar":
        var_w, kl = FU.ar_variance_kl(layer.weight, layer.log_sigma2, layer.clip, False)
        out = FU.local_reparam_linear(h, layer.weight, layer.bias, var_w, key)
        return out, (layer.lam / N_TRAIN) * kl
    if method == "eta-trick":
        reg = FU.eta_trick_objective(layer.weight, layer.log_eta, layer.lam, layer.eps,
                                     layer.eta_decay, False)
        return F.linear(h, layer.weight, layer.bias), reg
    if method in ("logsum", "adatikhonov") or method.startswith("penalty:"):
        hook = getattr(layer, "_bench_penalty_hook", None)
        if hook is None:
            kind, params = _penalty_kind(layer)
            hook = layer._bench_penalty_hook = FU.PenaltyGradHook(layer.weight, kind, layer.lam,
                                                                  params)
        return F.linear(h, layer.weight, layer.bias), hook.term()
    return F.linear(h, layer.weight, layer.bias), zero  # adaprox, magnitude


def _fused_after_step(method, sp, layers, opt, step, total):
    if method == "adaprox":
        group = opt.param_groups[0]
        beta2 = group["betas"][1]
        for layer in layers:
            st = opt.state[layer.weight]
            kind, params = _penalty_kind(layer)
            FU.adaptive_prox_(layer.weight.data, st["exp_avg_sq"], kind, params,
                              group["lr"] * layer.lam, 1.0 - beta2 ** float(st["step"]),
                              group["eps"])
    elif method == "magnitude":
        sp.after_step(opt, step, total)


def make_fused(method, sizes, data, steps_total):
    torch.manual_seed(0)
    model = lenet(sizes)
    sp = sparsify(model, method)
    layers = [layer for _, layer in sp.layers]
    opt = make_adam(list(model.parameters()), sp.hparams["lr"])
    state = {"step": 0}

    def step():
        x, y = data.next()
        h, reg = x, 0.0
        for i, layer in enumerate(layers):
            h, r = _layer_out(method, i, layer, h, state["step"])
            reg = reg + r
            if i < len(layers) - 1:
                h = F.relu(h)
        loss = F.cross_entropy(h, y) + reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state["step"] += 1
        _fused_after_step(method, sp, layers, opt, state["step"], steps_total)

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap, steps=40, clock="cpu")
    ap.add_argument("--methods", nargs="*", default=list(METHODS), help="methods to time")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="do not flush subnormal floats to zero (dualdrop.train flushes them by "
                         "default, so the benchmark does too)")
    args = ap.parse_args(argv)
    flushed = not args.keep_denormals and torch.set_flush_denormal(True)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {unknown}; known: {list(METHODS)}")
    clock, sizes, data, items = dense_setup(args)
    # a long nominal schedule, as in a real run: magnitude prunes every 100 steps, not every 24
    total = 75000
    for m in args.methods:
        items[f"{m} current"] = make_method(m, sizes, data, total)
        items[f"{m} fused"] = make_fused(m, sizes, data, total)
    load0 = os.getloadavg()[0]
    times = run_rounds(items, args.rounds, args.steps, clock)
    med = {k: statistics.median(v) for k, v in times.items()}
    dense = med["dense"]
    n_w = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    print(f"\nPer-step times, MLP {'-'.join(map(str, sizes))} ({n_w} weights), batch {args.batch}, "
          f"{args.threads} thread(s), median of {args.rounds} interleaved rounds x {args.steps} "
          f"steps, {args.clock} clock, subnormals {'flushed' if flushed else 'kept'}; "
          f"load average {load0:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end\n")
    lo, hi = min(times["dense"]), max(times["dense"])
    print(f"dense step: {dense * 1e3:.3f} ms (min {lo * 1e3:.3f}, max {hi * 1e3:.3f})\n")
    print("| method | current x dense | fused x dense | fused / current | current ms (min-max) "
          "| fused ms (min-max) |\n| --- | --- | --- | --- | --- | --- |")
    for m in args.methods:
        c, f = med[f"{m} current"], med[f"{m} fused"]
        tc, tf = times[f"{m} current"], times[f"{m} fused"]
        print(f"| {m} | {c / dense:.2f} | {f / dense:.2f} | {f / c:.2f} | {c * 1e3:.2f} "
              f"({min(tc) * 1e3:.2f}-{max(tc) * 1e3:.2f}) | {f * 1e3:.2f} "
              f"({min(tf) * 1e3:.2f}-{max(tf) * 1e3:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
