#!/usr/bin/env bash
# The one-shot tables of benchmarks/RESULTS.md ("One-shot pruning"): every method x target x
# allocation on the four reference networks (oneshot_references.sh trains them). One network after
# another, one thread; rerunning skips finished cells (new methods add their cells).
# Usage: benchmarks/nn_accuracy/oneshot_run_all.sh MNIST_DIR OUT [NETS...]
#   env: FINETUNE=0 measures the one-shot cells only (fast); a later run with FINETUNE=1
#        (default) adds the fine-tuned errors
set -uo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-results/oneshot}
shift 2 || true
NETS=${*:-lenet300 lenet5 transformer gpt2}
export OMP_NUM_THREADS=1
HERE=$(dirname "$0")
for net in $NETS; do
    case $net in
        lenet300) extra=(--targets 0.5 0.2 0.1 0.05 0.02 2:4) ;;
        gpt2) extra=(--calib 128) ;;
        *) extra=() ;;
    esac
    echo "== $net $(date -u +%H:%M:%S)"
    if [ "${FINETUNE:-1}" = 0 ]; then extra+=(--finetune-lr 0); fi
    python3 "$HERE/oneshot_networks.py" --net "$net" --ref "$OUT/ref/$net" --data-dir "$DATA" \
        --out "$OUT/$net" "${extra[@]}" || echo "!! $net failed"
    python3 "$HERE/oneshot_networks.py" --net "$net" --out "$OUT/$net" --report > /dev/null
done
echo "== finished $(date -u +%H:%M:%S)"
