#!/usr/bin/env bash
# Goal attempt: LogSum with its strength ramped over the first half of training (--lam-warmup),
# the paper's 200-epoch protocol otherwise, seed 0; compare with LogSum seed 0 of
# results/seeds_mnist. Resumable: rerun the same command.
#   nohup nice -n 10 benchmarks/run_goal_warmup.sh > results/goal_warmup.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
DATA=${DATA:-../shared/mnist}
WARMUP=${WARMUP:-100}
METHOD=${METHOD:-logsum}
OUT=${OUT:-results/goal/${METHOD}-warmup${WARMUP}}
python3 -m dualdrop sparsify --method "$METHOD" --epochs 200 --lam-warmup "$WARMUP" \
    --data-dir "$DATA" --out "$OUT" --threads 1 --no-progress --resume
