#!/usr/bin/env bash
# Structured sparsity on the small ResNet (whole channels) and the row Transformer (whole
# attention heads and feed-forward units) on MNIST: a dense network of EPOCHS_DENSE epochs, then
# each method fine-tuned from it for EPOCHS epochs to --target-density with --granularity
# channel / head, then the units / error / latency table of structured_mnist.py. The
# Transformer's embedding and its feed-forward output layers write the residual stream (no
# unit of theirs can leave the network): they are excluded, so that the density budget goes to
# heads and hidden units. One run after another, one thread; resumable.
# Usage: benchmarks/nn_accuracy/run_structured_models.sh MNIST_DIR OUT
#   env: EPOCHS (5), EPOCHS_DENSE (5), METHODS ("magnitude hardconcrete"),
#        RESNET_DENSITY (0.3), TRANSFORMER_DENSITY (0.5)
set -euo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-runs/structured_models}
EPOCHS=${EPOCHS:-5}
EPOCHS_DENSE=${EPOCHS_DENSE:-5}
METHODS=${METHODS:-"magnitude hardconcrete"}
export OMP_NUM_THREADS=1
run() {  # run OUTDIR ARGS...
    local dir=$1; shift
    echo "== $dir $(date -u +%H:%M:%S)"
    python3 -m dualdrop sparsify "$@" --data-dir "$DATA" --out "$dir" --threads 1 \
        --no-progress --resume > /dev/null || echo "!! $dir failed"
}
for model in resnet transformer; do
    run "$OUT/$model/dense" --model "$model" --method none --epochs "$EPOCHS_DENSE"
done
for m in $METHODS; do
    run "$OUT/resnet/$m" --model resnet --method "$m" --granularity channel \
        --target-density "${RESNET_DENSITY:-0.3}" --epochs "$EPOCHS" --init-from "$OUT/resnet/dense"
    run "$OUT/transformer/$m" --model transformer --method "$m" --granularity head \
        --exclude 'embed.*' --exclude 'encoder.*.linear2.*' \
        --target-density "${TRANSFORMER_DENSITY:-0.5}" --epochs "$EPOCHS" \
        --init-from "$OUT/transformer/dense"
done
python3 "$(dirname "$0")/structured_mnist.py" "$OUT"/resnet/{dense,magnitude,hardconcrete} \
    --data-dir "$DATA" --out "$OUT/report_resnet" --repeats 50
python3 "$(dirname "$0")/structured_mnist.py" "$OUT"/transformer/{dense,magnitude,hardconcrete} \
    --data-dir "$DATA" --out "$OUT/report_transformer" --repeats 50
