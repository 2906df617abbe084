#!/usr/bin/env bash
# The eta-trick with the released code's dual expression (--hp dual=released), several seeds of
# the paper's 200-epoch protocol on real MNIST, one run at a time. Resumable: rerun the same
# command; finished runs (final.json present) are skipped, interrupted ones continue (--resume).
# Usage (from the repository root):
#   SEEDS="0 1 2" nohup nice -n 10 benchmarks/nn_accuracy/run_eta_released_mnist.sh > results/eta_released.log 2>&1 &
# Results: results/eta_released_dual/seed<k>/final.json (benchmarks/RESULTS.md, "eta-Trick against
# the paper's released code").
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
SEEDS=${SEEDS:-"0 1 2"}
OUT=${OUT:-results/eta_released_dual}
for seed in $SEEDS; do
  dir="$OUT/seed$seed"
  if [ -f "$dir/final.json" ]; then echo "done: $dir"; continue; fi
  echo "$(date -u +%FT%TZ) start $dir"
  python3 -m dualdrop sparsify --method eta-trick --hp dual=released --epochs 200 --seed "$seed" \
      --data-dir "$DATA" --out "$dir" --threads 1 --no-progress --resume
done
