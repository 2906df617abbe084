#!/usr/bin/env bash
# Structured sparsity on LeNet-300-100 / MNIST, 10 epochs from a dense-pretrained network, one
# run after another with one thread, then the units / error / latency table of
# structured_mnist.py. Resumable (finished runs are skipped). With --granularity neuron the
# training loop leaves the classifier (its output units are the classes) unsparsified.
# Usage: benchmarks/nn_accuracy/run_structured_mnist.sh DENSE_RUN MNIST_DIR OUT
set -euo pipefail
DENSE=${1:-runs/dense20}
DATA=${2:-../shared/mnist}
OUT=${3:-runs/structured}
export OMP_NUM_THREADS=1
run() {  # run NAME ARGS...
    local name=$1; shift
    python3 -m dualdrop sparsify "$@" --epochs 10 --init-from "$DENSE" --data-dir "$DATA" \
        --out "$OUT/$name" --threads 1 --no-progress --resume
}
run hardconcrete-neuron --method hardconcrete-neuron --target-density 0.1
for m in magnitude hardconcrete vardrop-lr logsum; do
    run "$m-by-neuron" --method "$m" --granularity neuron --target-density 0.1
done
python3 "$(dirname "$0")/structured_mnist.py" "$OUT"/hardconcrete-neuron "$OUT"/{magnitude,hardconcrete,vardrop-lr,logsum}-by-neuron \
    --data-dir "$DATA" --out "$OUT/report"
