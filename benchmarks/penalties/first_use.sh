#!/usr/bin/env bash
# First use of the compiled (numba) kernels: CPU seconds of a fresh process with an empty cache
# ("cold") and again with the cache it left ("warm"), for a linear fit, a logistic fit,
# `dualdrop demo` and one epoch of `dualdrop sparsify`. Each case starts from its own empty cache.
# Usage: benchmarks/penalties/first_use.sh [REPEATS]   (from the repository root; GNU time needed)
set -euo pipefail
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export PYTHONPATH="$repo" OMP_NUM_THREADS=1 MPLBACKEND=Agg NUMBA_CACHE_DIR="$work/numba"
PY=${PYTHON:-python3}
linear='import numpy as np
from dualdrop.linear import SparseLinearRegression
X = np.random.default_rng(0).standard_normal((100, 20)); y = X[:, 0]
SparseLinearRegression(penalty="l1", alpha=0.1).fit(X, y)'
logistic='import numpy as np
from dualdrop.linear import SparseLogisticRegression
X = np.random.default_rng(0).standard_normal((100, 20)); y = (X[:, 0] > 0).astype(int)
SparseLogisticRegression(penalty="l1", alpha=0.01).fit(X, y)'
run() {  # name, command...
  local name=$1; shift
  for kind in cold warm; do
    [ "$kind" = cold ] && rm -rf "$NUMBA_CACHE_DIR" out
    /usr/bin/time -f "$name $kind: cpu %U+%S s, wall %e s" "$@" >/dev/null 2>"$work/err" || { cat "$work/err"; exit 1; }
    tail -n 1 "$work/err"
    rm -rf out
  done
}
for rep in $(seq "${1:-1}"); do
  run linear_fit "$PY" -c "$linear"
  run logistic_fit "$PY" -c "$logistic"
  run demo "$PY" -m dualdrop demo --out out
  run sparsify_1_epoch "$PY" -m dualdrop sparsify --method logsum --epochs 1 --out out --no-progress
done
