#!/usr/bin/env bash
# More points on a method's frontier at the paper's 200-epoch protocol: one run per knob value
# and seed into OUT/<method>-<hp>/seed<k> (ordinary sparsify runs), to draw beside
# run_seeds_mnist.sh's runs with `dualdrop frontier --from-runs ... --by method`.
# Resumable: rerun the same command (finished runs are skipped).
#   METHOD=magnitude KNOB=sparsity VALUES="0.95 0.99" SEEDS=0 \
#       nohup nice -n 10 benchmarks/nn_accuracy/run_knobs_mnist.sh > results/knobs.log 2>&1 &
#   python3 -m dualdrop frontier --from-runs results/seeds_mnist/runs results/knobs_mnist \
#       --data-dir ../shared/mnist --by method --out results/frontier_mnist_runs
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
METHOD=${METHOD:?set METHOD, e.g. magnitude}
KNOB=${KNOB:?set KNOB, e.g. sparsity}
VALUES=${VALUES:?set VALUES, e.g. "0.95 0.99"}
SEEDS=${SEEDS:-0}
OUT=${OUT:-results/knobs_mnist}
for v in $VALUES; do
    for seed in $SEEDS; do
        python3 -m dualdrop sparsify --method "$METHOD" --hp "$KNOB=$v" --epochs 200 \
            --seed "$seed" --data-dir "$DATA" --out "$OUT/$METHOD-$KNOB$v/seed$seed" \
            --threads 1 --no-progress --resume
    done
done
