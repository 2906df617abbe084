#!/usr/bin/env bash
# Attempts at issue 3's accuracy-sparsity goal beyond the seed (<= 1.6% test error at <= 1.5%
# nonzero weights, <= 1.4% at <= 5%) and the eta-trick check, as run for benchmarks/RESULTS.md.
# Every run is a full 200-epoch schedule on real MNIST, seed 0, one thread; selection (the
# tolerance chosen with --select-tol-margin) sees the validation split only.
# Usage (from the repository root; two runs at a time fit the 2-core machine):
#   nohup nice -n 10 benchmarks/nn_accuracy/run_goal_mnist.sh > results/goal_mnist.log 2>&1 &
# Rerunning skips finished runs (--resume returns their final.json) and continues unfinished ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
OUT=${OUT:-results/goal_mnist}
run() {  # run NAME ARGS...: one 200-epoch training into $OUT/NAME
    local name=$1; shift
    python3 -m dualdrop sparsify "$@" --epochs 200 --data-dir "$DATA" --out "$OUT/$name" \
        --threads 1 --no-progress --resume
}
# the dense baseline, also the warm start of the pretrained runs (as sparse VD starts)
run dense200 --method none
# from scratch
run mag95 --method magnitude --hp sparsity=0.95 --hp end=0.5
run ar_lr1e-3 --method vardrop-lr-ar --lr 1e-3
run eta_nodecay --method eta-trick --hp eta_decay=0
run vdlr --method vardrop-lr
# warm-started from the dense run
run ar_pre --method vardrop-lr-ar --lr 1e-3 --init-from "$OUT/dense200" --select-tol-margin 0.001
run vdlr_pre --method vardrop-lr --init-from "$OUT/dense200" --select-tol-margin 0.001
run ar_pre_l03 --method vardrop-lr-ar --lr 1e-3 --hp lam=0.3 --init-from "$OUT/dense200" \
    --select-tol-margin 0.001
run hc_pre_l1 --method hardconcrete --hp lam=1 --init-from "$OUT/dense200"
run ar_pre_l01 --method vardrop-lr-ar --lr 1e-3 --hp lam=0.1 --init-from "$OUT/dense200" \
    --select-tol-margin 0.001
run hc_pre_l5 --method hardconcrete --hp lam=5 --init-from "$OUT/dense200"
