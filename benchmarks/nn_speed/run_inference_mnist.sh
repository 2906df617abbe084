#!/usr/bin/env bash
# The networks of the "Inference" tables in benchmarks/RESULTS.md, trained on MNIST with small
# budgets by the commands of the structured runs (run_structured_mnist.sh,
# run_structured_models.sh) and of the README, one after another on one thread; resumable
# (finished runs are skipped). Then the inference benchmark on each of them.
#   LeNet-300-100: a dense start of EPOCHS_DENSE epochs; magnitude at 5% of the weights
#       (unstructured) and by neuron at 10% (784-30-10), EPOCHS epochs each from it;
#   LeNet-5-Caffe: magnitude by channel at 20%, EPOCHS_L5 epochs from scratch;
#   ResNet and Transformer: run_structured_models.sh with METHODS=magnitude.
# Usage: nohup nice -n 10 benchmarks/nn_speed/run_inference_mnist.sh MNIST_DIR OUT > log 2>&1 &
#   env: EPOCHS_DENSE (10), EPOCHS (10), EPOCHS_L5 (4), EPOCHS_STRUCT (3)
set -euo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-results/inference_runs}
EPOCHS_DENSE=${EPOCHS_DENSE:-10}
EPOCHS=${EPOCHS:-10}
EPOCHS_L5=${EPOCHS_L5:-4}
EPOCHS_STRUCT=${EPOCHS_STRUCT:-3}
HERE="$(cd "$(dirname "$0")" && pwd)"
export OMP_NUM_THREADS=1
run() {  # run OUTDIR ARGS...
    local dir=$1; shift
    echo "== $dir $(date -u +%H:%M:%S)"
    python3 -m dualdrop sparsify "$@" --data-dir "$DATA" --out "$dir" --threads 1 \
        --no-progress --resume > /dev/null || echo "!! $dir failed"
}
run "$OUT/lenet300/dense" --method none --epochs "$EPOCHS_DENSE"
run "$OUT/lenet300/magnitude-5pct" --method magnitude --target-density 0.05 --epochs "$EPOCHS" \
    --init-from "$OUT/lenet300/dense"
run "$OUT/lenet300/magnitude-by-neuron" --method magnitude --granularity neuron \
    --target-density 0.1 --epochs "$EPOCHS" --init-from "$OUT/lenet300/dense"
run "$OUT/lenet5/magnitude-by-channel" --model lenet5 --method magnitude --granularity channel \
    --target-density 0.2 --epochs "$EPOCHS_L5"
EPOCHS=$EPOCHS_STRUCT EPOCHS_DENSE=$EPOCHS_STRUCT METHODS=magnitude \
    "$HERE/../nn_accuracy/run_structured_models.sh" "$DATA" "$OUT/structured" || true
echo "== done $(date -u +%H:%M:%S)"
