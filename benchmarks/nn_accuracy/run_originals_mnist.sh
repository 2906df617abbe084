#!/usr/bin/env bash
# The original methods under their authors' released protocols, with our code (LeNet-300-100, MNIST).
#   sparse VD (Molchanov et al. 2017, ars-ashuha/variational-dropout-sparsifies-dnn,
#   experiments/lenet/lenet300-100-ard.py): from scratch, 200 epochs, batch 100, Adam 1e-3
#   (theirs: constant for 100 epochs then linear to 0; ours: linear decay over the 200), KL weight
#   0 for 5 epochs then linear to 1 at epoch 20 (ours: --lam-warmup 20, linear from epoch 1),
#   log sigma^2 init -10, log alpha clipped to 8, pruned at log alpha >= 3 (tol 0.0474).
#   L0 (Louizos et al. 2018, AMLab-Amsterdam/L0_regularization, models.L0MLP): input-unit gates,
#   200 epochs, batch 100, Adam 1e-3 constant, lam = 0.1/N per weight of a gate's group,
#   temperature 2/3, stretch (-0.1, 1.1); theirs also: droprate_init 0.2 (first layer) / 0.5,
#   an L2 term 5e-4 weighted by the gate's open probability, an EMA (0.999) of the parameters
#   for evaluation, N = 60,000; ours: droprate_init 0.2 everywhere, no L2, no EMA, N = 48,000
#   (12,000 held out for validation), linear learning-rate decay.
# Resumable: run it again to continue. Usage: benchmarks/nn_accuracy/run_originals_mnist.sh MNIST_DIR OUT
set -euo pipefail
DATA=${1:-../shared/mnist}
OUT=${2:-runs/originals}
export OMP_NUM_THREADS=1
python3 -m dualdrop sparsify --method vardrop-lr-ar --epochs 200 --batch-size 100 --lr 1e-3 \
    --lam-warmup 20 --hp lam=2.0833333e-5 --hp tol=0.0474 --data-dir "$DATA" \
    --out "$OUT/sparse_vd" --no-progress --threads 1 --resume
python3 -m dualdrop sparsify --method hardconcrete-neuron --epochs 200 --batch-size 100 \
    --lr 1e-3 --data-dir "$DATA" --out "$OUT/l0_neuron" --no-progress --threads 1 --resume
# L0 with droprate_init 0.5 everywhere (theirs: 0.2 for the input layer, 0.5 beyond)
python3 -m dualdrop sparsify --method hardconcrete-neuron --epochs 200 --batch-size 100 \
    --lr 1e-3 --hp droprate_init=0.5 --data-dir "$DATA" --out "$OUT/l0_neuron_droprate05" \
    --no-progress --threads 1 --resume
