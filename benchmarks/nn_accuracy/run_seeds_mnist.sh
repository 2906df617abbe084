#!/usr/bin/env bash
# The paper's 200-epoch protocol on real MNIST (LeNet-300-100) over several seeds, every method:
# the table with mean ± sample std (results/seeds_mnist/table.md) and the figure with seed bands.
# Method by method (each method's error bars complete before the next starts), one run at a time.
# Resumable: rerun the same command; finished runs are skipped, interrupted ones continue exactly.
# Usage (from the repository root):
#   nohup nice -n 10 benchmarks/nn_accuracy/run_seeds_mnist.sh > results/seeds_mnist.log 2>&1 &
#   METHODS="eta-trick" SEEDS="0 1 2" benchmarks/nn_accuracy/run_seeds_mnist.sh      # a subset
# Table of whatever has finished so far (while it runs):
#   python3 -m dualdrop compare --report-only --out results/seeds_mnist --methods $METHODS
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
EPOCHS=${EPOCHS:-200}
METHODS=${METHODS:-"eta-trick magnitude logsum vardrop-lr-ar adatikhonov adaprox hardconcrete vardrop-lr vardrop"}
SEEDS=${SEEDS:-"0 1 2"}
OUT=${OUT:-results/seeds_mnist}
# shellcheck disable=SC2086
python3 -m dualdrop compare --methods $METHODS --seeds $SEEDS --epochs "$EPOCHS" \
    --data-dir "$DATA" --out "$OUT" --threads 1 --no-progress
