#!/usr/bin/env bash
# Comparison of the sparsification methods on real MNIST (issue 3), as run for RESULTS.md.
# Both stages are resumable: rerun this script to continue; finished runs are skipped.
#   stage 1: all 9 methods, a complete 10-epoch schedule (lr decays to 0 over 10 epochs)
#   stage 2: the seed's full protocol, 200 epochs (cheap ones and VarDrop+LR first, eta-trick last)
# Usage (from the repository root):  nohup nice -n 10 benchmarks/nn_accuracy/run_compare_mnist.sh > results/compare_mnist.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
E1=${E1:-10}
python3 -m dualdrop compare --epochs "$E1" --data-dir "$DATA" --out "results/compare_mnist_e$E1" \
    --threads 1 --no-progress \
    --methods vardrop-lr-ar vardrop-lr vardrop adaprox adatikhonov logsum hardconcrete magnitude eta-trick
python3 -m dualdrop compare --epochs 200 --data-dir "$DATA" --out results/compare_mnist_e200 \
    --threads 1 --no-progress \
    --methods magnitude adatikhonov adaprox vardrop-lr vardrop-lr-ar logsum vardrop hardconcrete eta-trick
