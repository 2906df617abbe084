#!/usr/bin/env bash
# The original methods on LeNet-5-Caffe under their authors' settings, shortened to fit two CPU
# cores: every run starts from one dense LeNet-5 (DENSE, e.g. run_lenet5_matched.sh's) and
# trains EPOCHS epochs (theirs: 200), batch 100, Adam 1e-3 with our linear decay.
#   sparse VD (Molchanov et al. 2017): vardrop-lr-ar, KL weight 1/N warmed up over 5 epochs,
#     pruned at log alpha >= 3 (tol 0.0474); theirs also starts from a pretrained LeNet-5.
#   L0 (Louizos et al. 2018): hardconcrete-neuron (conv output channels, fc input units),
#     lam = 0.1/N per weight of a gate's group times 100, 5, 1, 100 for conv1, conv2, fc1, fc2
#     (their lambda = 10, 0.5, 0.1, 10 / N); theirs from scratch, with an L2 term and an EMA.
#   magnitude (Han et al. 2015): 92% of the weights pruned (their 8% nonzero), gradual (ours)
#     rather than prune-then-retrain in rounds.
# N = 48,000 (12,000 held out for validation). Resumable.
# Usage: benchmarks/nn_accuracy/run_originals_lenet5.sh DENSE MNIST_DIR OUT   (env: EPOCHS, 15)
set -euo pipefail
DENSE=${1:-runs/lenet5_matched/dense}
DATA=${2:-../shared/mnist}
OUT=${3:-runs/originals_lenet5}
EPOCHS=${EPOCHS:-15}
export OMP_NUM_THREADS=1
run() {  # run OUTDIR ARGS...
    local dir=$1; shift
    echo "== $dir $(date -u +%H:%M:%S)"
    python3 -m dualdrop sparsify --model lenet5 "$@" --epochs "$EPOCHS" --batch-size 100 \
        --lr 1e-3 --init-from "$DENSE" --data-dir "$DATA" --out "$dir" --threads 1 \
        --no-progress --resume > /dev/null || echo "!! $dir failed"
}
run "$OUT/sparse_vd" --method vardrop-lr-ar --lam-warmup 5 --hp lam=2.0833333e-5 --hp tol=0.0474
run "$OUT/l0" --method hardconcrete-neuron --hp lam=2.0833333e-6 --lam-layer conv1=100 \
    --lam-layer conv2=5 --lam-layer fc2=100
run "$OUT/magnitude_han" --method magnitude --hp sparsity=0.92
