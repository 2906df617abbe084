#!/usr/bin/env bash
# The one-shot cells in the order the goals need them (oneshot_goals.py), on a shared machine:
# A. the optimization methods against ADMM at 20/10/5% and 2:4, uniform allocation, no
#    fine-tuning, every network; B. allocation="penalty" against uniform at 10% and 5%;
# C. LeNet-300-100 fine-tuned at 5% and 2%; D. everything else of oneshot_run_all.sh.
# Each step is resumable (finished cells are skipped).
# Usage: benchmarks/nn_accuracy/oneshot_priority.sh MNIST_DIR OUT
set -uo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-results/oneshot}
export OMP_NUM_THREADS=1
HERE=$(dirname "$0")
cells() {  # cells NET ARGS...
    local net=$1; shift
    local extra=()
    [ "$net" = gpt2 ] && extra=(--calib 128)
    echo "== $net $* $(date -u +%H:%M:%S)"
    python3 "$HERE/oneshot_networks.py" --net "$net" --ref "$OUT/ref/$net" --data-dir "$DATA" \
        --out "$OUT/$net" "${extra[@]}" "$@" || echo "!! $net failed"
}
OPT=(sparsegpt admm logsum mcp polish)
for net in lenet300 lenet5 transformer gpt2; do                                        # A
    cells "$net" --targets 0.2 0.1 0.05 2:4 --allocations uniform --methods "${OPT[@]}" \
        --finetune-lr 0
done
cells lenet300 --targets 0.2 0.1 0.05 2:4 --allocations uniform --methods vardrop hardconcrete \
    --finetune-lr 0
for net in lenet300 lenet5 transformer gpt2; do                                        # B
    cells "$net" --targets 0.1 0.05 --allocations penalty --methods sparsegpt admm logsum \
        --finetune-lr 0
done
cells lenet300 --targets 0.05 0.02 --allocations uniform global penalty \
    --methods magnitude sparsegpt admm logsum mcp polish                               # C
FINETUNE=0 "$HERE/oneshot_run_all.sh" "$DATA" "$OUT" lenet5 transformer gpt2           # D
"$HERE/oneshot_run_all.sh" "$DATA" "$OUT"
echo "== finished $(date -u +%H:%M:%S)"
