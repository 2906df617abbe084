#!/usr/bin/env bash
# The accuracy–sparsity frontier on real MNIST (LeNet-300-100, the paper's 200-epoch protocol).
#   stage 0: the dense network that warm starts are taken from (results/frontier_mnist_dense)
#   stage 1: each method's sparsity knob swept on the validation split, N_TRIALS trials per
#            method, each trial choosing a random start or the dense warm start; the test-time
#            tolerance is swept after training (no retraining). One Optuna study per method in
#            $OUT/study.journal; every trial is a sparsify run in $OUT/trials/<method>/<id>.
#   report:  $OUT/frontier.png/.pdf/.md/.csv (test error read once per validation-selected point)
# Resumable and shareable: rerun the script to continue (a killed trial resumes from its
# checkpoint); run it on a second machine that shares $OUT to add workers; raise N_TRIALS to add
# trials. Cost: about 200 x 3 s = 10 CPU-minutes per trial on this machine's cores, so 9 methods x
# 8 trials is about 12 CPU-hours (the closest-to-goal methods come first).
# Usage (from the repository root):
#   nohup nice -n 10 benchmarks/nn_accuracy/run_frontier_mnist.sh > results/frontier_mnist.log 2>&1 &
# Smoke test of the whole pipeline (minutes):  EPOCHS=2 N_TRIALS=2 OUT=/tmp/fsmoke benchmarks/nn_accuracy/run_frontier_mnist.sh
# The reduced frontier of benchmarks/RESULTS.md (10-epoch trials, 2 per method, warm starts from a
# 20-epoch dense network; 38 min wall on the shared 2-core machine at load ~6):
#   DENSE_EPOCHS=20 DENSE=results/frontier_mnist_reduced/dense EPOCHS=10 N_TRIALS=2 WORKERS=1 \
#     OUT=results/frontier_mnist_e10 benchmarks/nn_accuracy/run_frontier_mnist.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
EPOCHS=${EPOCHS:-200}
N_TRIALS=${N_TRIALS:-8}
WORKERS=${WORKERS:-2}
OUT=${OUT:-results/frontier_mnist_e$EPOCHS}
DENSE=${DENSE:-$OUT/dense}
DENSE_EPOCHS=${DENSE_EPOCHS:-$EPOCHS}  # the warm start's own schedule (may differ from the trials')

python3 -m dualdrop sparsify --method none --epochs "$DENSE_EPOCHS" --data-dir "$DATA" --out "$DENSE" \
    --threads 1 --no-progress --resume

common=(--epochs "$EPOCHS" --data-dir "$DATA" --out "$OUT" --n-trials "$N_TRIALS"
        --workers "$WORKERS" --threads 1 --init-from "$DENSE")
# the methods closest to the goal first; VarDrop+LR+AR with lr 1e-3 (better than the paper's 1e-4
# from a warm start in the earlier goal attempts), HardConcrete's L0 weight up to 3 (lam = 1 left
# 12% nonzero)
python3 -m dualdrop frontier "${common[@]}" --methods vardrop-lr-ar vardrop-lr hardconcrete magnitude \
    --hp vardrop-lr-ar:lr=1e-3 --range hardconcrete:lam=0.03:3
python3 -m dualdrop frontier "${common[@]}" --methods logsum adatikhonov adaprox vardrop eta-trick
