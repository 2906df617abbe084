#!/usr/bin/env bash
# LeNet-5-Caffe at matched density on MNIST: one dense network (EPOCHS_DENSE epochs), then each
# method fine-tuned from it to --target-density D for EPOCHS epochs, for D in DENSITIES.
# One run after another, one thread; rerunning skips finished runs and continues unfinished ones.
# Usage: benchmarks/nn_accuracy/run_lenet5_matched.sh MNIST_DIR OUT
#   env: EPOCHS (10), EPOCHS_DENSE (10), DENSITIES ("0.02 0.005"), SEED (0),
#        METHODS ("magnitude hardconcrete vardrop-lr vardrop-lr-ar eta-trick logsum")
set -euo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-runs/lenet5_matched}
EPOCHS=${EPOCHS:-10}
EPOCHS_DENSE=${EPOCHS_DENSE:-10}
DENSITIES=${DENSITIES:-"0.02 0.005"}
SEED=${SEED:-0}
METHODS=${METHODS:-"magnitude hardconcrete vardrop-lr vardrop-lr-ar eta-trick logsum"}
export OMP_NUM_THREADS=1
run() {  # run OUTDIR ARGS...
    local dir=$1; shift
    echo "== $dir $(date -u +%H:%M:%S)"
    python3 -m dualdrop sparsify --model lenet5 "$@" --data-dir "$DATA" --seed "$SEED" \
        --out "$dir" --threads 1 --no-progress --resume > /dev/null || echo "!! $dir failed"
}
run "$OUT/dense" --method none --epochs "$EPOCHS_DENSE"
for D in $DENSITIES; do
    for m in $METHODS; do
        run "$OUT/d$D/$m/seed$SEED" --method "$m" --target-density "$D" --epochs "$EPOCHS" \
            --init-from "$OUT/dense"
    done
done
