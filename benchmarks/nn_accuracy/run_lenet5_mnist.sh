#!/usr/bin/env bash
# Every dualdrop.nn method on LeNet-5-Caffe (conv 20-50 5x5, fc 800-500-10) on real MNIST, as
# run for benchmarks/RESULTS.md ("LeNet-5 on MNIST"). Same protocol as LeNet-300-100 (Adam,
# batch 128, linear learning-rate decay to 0, validation split only for any choice, test error
# of the end-of-training pruned network), but a short schedule: EPOCHS (default 5) fits the
# 2-core machine shared by several sessions (measured ~45-100 s per epoch with one thread).
# The variational-dropout runs start from the dense run (as sparse VD starts from a pretrained
# network); the others from scratch. The methods' defaults, except where noted.
# Usage (from the repository root), one run after another with one thread:
#   nohup nice -n 10 benchmarks/nn_accuracy/run_lenet5_mnist.sh > results/lenet5_mnist.log 2>&1 &
# Rerunning skips finished runs (--resume returns their final.json) and continues unfinished ones.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
OUT=${OUT:-results/lenet5_mnist}
EPOCHS=${EPOCHS:-5}
run() {  # run NAME ARGS...: one training of LeNet-5 into $OUT/NAME
    local name=$1; shift
    echo "== $name $(date -u +%H:%M:%S)"
    python3 -m dualdrop sparsify --model lenet5 "$@" --epochs "$EPOCHS" --data-dir "$DATA" \
        --out "$OUT/$name" --threads 1 --no-progress --resume || echo "!! $name failed"
}
run dense --method none
run vardrop-lr --method vardrop-lr --init-from "$OUT/dense" --select-tol-margin 0.001
run magnitude --method magnitude --hp sparsity=0.99
run vardrop-lr-ar --method vardrop-lr-ar --lr 1e-3 --init-from "$OUT/dense" \
    --select-tol-margin 0.001
run hardconcrete --method hardconcrete
run logsum --method logsum --select-tol-margin 0.001
run eta-trick --method eta-trick --select-tol-margin 0.001
run adaprox --method adaprox --select-tol-margin 0.001
run adatikhonov --method adatikhonov --select-tol-margin 0.001
run hardconcrete-neuron --method hardconcrete-neuron
run vardrop --method vardrop --init-from "$OUT/dense" --select-tol-margin 0.001
# magnitude at 99% with the default 1% per-layer floor leaves every layer at its floor (conv1: 5 of
# 500 weights); these two give the global threshold room
run magnitude95 --method magnitude --hp sparsity=0.95 --hp min_layer_density=0.001
run magnitude99 --method magnitude --hp sparsity=0.99 --hp min_layer_density=0.001
echo "== done $(date -u +%H:%M:%S)"
