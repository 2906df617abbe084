#!/usr/bin/env bash
# The trained reference networks that one-shot pruning starts from (benchmarks/RESULTS.md,
# "One-shot pruning"): dense LeNet-300-100 (20 epochs: the dense start of "Target density on
# MNIST"), LeNet-5-Caffe (10 epochs) and the row Transformer (10 epochs) on MNIST with the paper's
# protocol (Adam, batch 128, linear decay), then the small GPT-2 on the Python standard library's
# sources (oneshot_gpt2.py train). One run after another, one thread; rerunning skips finished
# runs and continues unfinished ones exactly.
# Usage: benchmarks/nn_accuracy/oneshot_references.sh MNIST_DIR OUT
set -euo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-results/oneshot/ref}
export OMP_NUM_THREADS=1
run() {  # run OUTDIR ARGS...
    local dir=$1; shift
    echo "== $dir $(date -u +%H:%M:%S)"
    if [ -f "$dir/final.json" ]; then echo "   done"; return; fi
    python3 -m dualdrop sparsify "$@" --method none --data-dir "$DATA" --seed 0 --out "$dir" \
        --threads 1 --no-progress --resume > "$dir.log" 2>&1 || echo "!! $dir failed"
}
mkdir -p "$OUT"
run "$OUT/lenet300" --model lenet300 --epochs 20
run "$OUT/lenet5" --model lenet5 --epochs 10
run "$OUT/transformer" --model transformer --epochs 10
if [ -f "$(dirname "$0")/oneshot_gpt2.py" ]; then
    echo "== $OUT/gpt2 $(date -u +%H:%M:%S)"
    python3 "$(dirname "$0")/oneshot_gpt2.py" train --out "$OUT/gpt2" > "$OUT/gpt2.log" 2>&1 \
        || echo "!! $OUT/gpt2 failed"
fi
echo "== finished $(date -u +%H:%M:%S)"
