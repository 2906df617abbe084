"""Datafits beyond least squares and logistic, one module each (the registry is
``dualdrop.linear.datafits._DATAFITS``):

=============== ======================================================= =====================
module          loss of the linear predictor ``z`` (mean over samples)  solver's model
=============== ======================================================= =====================
``poisson``     half Poisson deviance, log link                         Newton (exact)
``gamma``       half Gamma deviance, log link                           Newton (exact)
``huber``       Huber's loss of ``y - z`` with threshold ``delta``      semismooth Newton
``quantile``    smoothed pinball loss of ``y - z`` (width ``delta``)      semismooth Newton
``cox``         Cox's negative log partial likelihood, Breslow's ties   Newton (diagonal bound)
``multinomial`` softmax cross-entropy over ``K`` classes                Newton (diagonal)
=============== ======================================================= =====================

Every one is a :class:`~dualdrop.linear.datafits.Datafit`: ``value(y, z)``, ``raw_grad(y, z)``
(``dL/dz``), ``raw_hess(y, z)`` (the diagonal model of ``d2L/dz2`` the proximal Newton solver
minimizes: the exact Hessian, a generalized Hessian where the loss is only once
differentiable, or a diagonal upper bound where the Hessian is not diagonal),
``intercept_init(y)`` (the best constant predictor), ``lipschitz(design)`` (per-coordinate
curvatures at the null model: the scale of the stopping criterion) and ``check_target(y)``
(the target, checked, or a ``ValueError`` naming ``y``). The solvers never ask which family
they fit.
"""
