#!/usr/bin/env bash
# Goal attempt: a method with its strength lam ramped over the first WARMUP epochs
# (--lam-warmup), the paper's 200-epoch protocol otherwise, one run per seed into
# OUT/seed<k>; the no-warm-up runs to compare with are those of run_seeds_mnist.sh.
# Resumable: rerun the same command (finished seeds are skipped).
#   nohup nice -n 10 benchmarks/nn_accuracy/run_goal_warmup.sh > results/goal_warmup.log 2>&1 &
#   METHOD=eta-trick HP="dual=released" SEEDS=0 benchmarks/nn_accuracy/run_goal_warmup.sh
#   LAYERS="fc1=2 fc2=0.5 fc3=0.25" SEEDS=0 benchmarks/nn_accuracy/run_goal_warmup.sh   # per-layer lam too
# Frontier (tolerance swept on validation, seeds averaged) beside the plain runs:
#   python3 -m dualdrop frontier --from-runs results/seeds_mnist/runs/logsum results/goal \
#       --data-dir ../shared/mnist --out results/goal/frontier
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
WARMUP=${WARMUP:-100}
METHOD=${METHOD:-logsum}
SEEDS=${SEEDS:-"0 1 2"}
HP=${HP:-}
LAYERS=${LAYERS:-}
L=${LAYERS//=/x}
TAG=${HP:+-${HP//[=,]/-}}${LAYERS:+-layers-${L// /-}}
OUT=${OUT:-results/goal/${METHOD}${TAG}-warmup${WARMUP}}
LAYER_ARGS=()
for l in $LAYERS; do LAYER_ARGS+=(--lam-layer "$l"); done
for seed in $SEEDS; do
    # shellcheck disable=SC2046
    python3 -m dualdrop sparsify --method "$METHOD" --epochs 200 --lam-warmup "$WARMUP" \
        --seed "$seed" $( [ -n "$HP" ] && echo --hp "$HP" ) "${LAYER_ARGS[@]}" --data-dir "$DATA" \
        --out "$OUT/seed$seed" --threads 1 --no-progress --resume
done
