#!/usr/bin/env bash
# Several seeds of the paper's 200-epoch protocol on real MNIST (LeNet-300-100), one run at a time.
# Resumable: rerun the same command to continue; finished runs (final.json present) are skipped,
# interrupted ones continue exactly from their last checkpoint (--resume).
# Usage (from the repository root):
#   METHODS="eta-trick" SEEDS="0 1 2" nohup nice -n 10 benchmarks/run_seeds_mnist.sh > results/seeds_mnist.log 2>&1 &
# Results: results/seeds_mnist/<method>/seed<k>/final.json; summarize with
#   python3 -m dualdrop compare --summarize results/seeds_mnist   (or read final.json)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
EPOCHS=${EPOCHS:-200}
METHODS=${METHODS:-"eta-trick magnitude adatikhonov adaprox logsum vardrop-lr vardrop-lr-ar vardrop hardconcrete"}
SEEDS=${SEEDS:-"0 1 2"}
OUT=${OUT:-results/seeds_mnist}
for seed in $SEEDS; do
  for m in $METHODS; do
    dir="$OUT/$m/seed$seed"
    if [ -f "$dir/final.json" ]; then echo "done: $dir"; continue; fi
    echo "$(date -u +%FT%TZ) start $dir"
    python3 -m dualdrop sparsify --method "$m" --epochs "$EPOCHS" --seed "$seed" \
        --data-dir "$DATA" --out "$dir" --threads 1 --no-progress --resume
  done
done
