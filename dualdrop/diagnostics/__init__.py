"""Noise diagnostics: what dropout noise and SGD noise do relative to the loss's curvature.

The duality (LeJeune, Javadi, Baraniuk, NeurIPS 2021) accounts for adaptive dropout's *penalty*;
this package measures its *noise*.  It provides the Hessian (dense or matrix-free, with Lanczos top
eigenpairs), the covariances of the minibatch-gradient noise and of the dropout-gradient noise, the
escaping indicator ``Tr(H Sigma)`` and its ratio to isotropic noise (Zhu et al., ICML 2019), the
Hessian--noise alignment with a random-eigenvector null model, and the closed-form modified loss of
dropout whose gradient is the drift of dropout's stochastic modified equation (Zhang, Xu et al.,
ICLR 2024), and the depth regularity of residual networks (``depth_regularity``, the discrete
Lipschitz constant of the weights along depth; Marion et al., "Implicit regularization of deep
residual networks towards neural ODEs") with a builder of ``1/L``-scaled residual MLPs.  The math is written out in ``docs/diagnostics.md``.

Above ``DENSE_LIMIT`` parameters nothing of size ``D x D`` is formed: the Hessian is an operator of
Hessian-vector products and covariances are low-rank factors.
"""

from dualdrop.diagnostics._core import (DENSE_LIMIT, FlatParams, HessianOperator, LowRankCov,
                                        dropout_noise_cov, hessian, hessian_eigs, sgd_noise_cov)
from dualdrop.diagnostics.depth import ResidualMLP, depth_regularity, residual_mlp
from dualdrop.diagnostics.indicators import alignment, escape_indicator
from dualdrop.diagnostics.measure import measure
from dualdrop.diagnostics.modified import dropout_loss, modified_loss, plain_loss

__all__ = ["hessian", "hessian_eigs", "HessianOperator", "sgd_noise_cov", "dropout_noise_cov",
           "LowRankCov", "escape_indicator", "alignment", "modified_loss", "dropout_loss",
           "plain_loss", "measure", "DENSE_LIMIT", "FlatParams", "depth_regularity",
           "residual_mlp", "ResidualMLP"]
