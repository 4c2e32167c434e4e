"""The geometry of training: Fisher information and the generalized Gauss-Newton matrix (dense, diagonal,
matrix-free), conjugate gradients and Hessian-free, diagonal-Fisher preconditioning, K-FAC, the natural-gradient
step and trust region, and the Gaussian exponential family.

One scale convention (the curvature of the batch-mean NLL) is stated in :mod:`taskloss.curvature.fisher`;
:func:`~taskloss.curvature.fisher.curvature_scale` converts it to libraries that take a loss module (curvlinops).
Notebooks: 06_natural_gradient, 07_fisher_approximations, 08_natural_gradient_exponential_families,
17_your_own_model.

Modules:

- :mod:`~taskloss.curvature.fisher`              — likelihoods, Fisher/GGN dense, diagonal, matrix-free; scales
- :mod:`~taskloss.curvature.model_io`            — how a model is called: tensor / keyword inputs, ModelOutput, masks, refusals
- :mod:`~taskloss.curvature.per_term`            — the per-term rows J_iᵀ v and their dense / diagonal sums
- :mod:`~taskloss.curvature.hessian_free`        — conjugate gradients, the Hessian-free direction and optimizer
- :mod:`~taskloss.curvature.diagonal`            — diagonal-Fisher preconditioning
- :mod:`~taskloss.curvature.kfac`                — K-FAC for Linear, Conv2d and Conv1D layers (hooks, averages, checkpoints)
- :mod:`~taskloss.curvature.kfac_coverage`       — which modules K-FAC covers, which it leaves alone and why (tied weights)
- :mod:`~taskloss.curvature.kfac_terms`          — K-FAC's loss terms: ignore_index, padding, the rows of each factor
- :mod:`~taskloss.curvature.kfac_math`           — K-FAC's pure maths: rows, factors, damped inverses, the plain step
- :mod:`~taskloss.curvature.kfac_factors`        — K-FAC's state: the layers, their factors and damped inverses
- :mod:`~taskloss.curvature.kfac_gradients`      — K-FAC's gradient side: gradient matrices, KL clip, flat buffers
- :mod:`~taskloss.curvature.shampoo`             — Shampoo (grafted onto Adam/SGD), matrix roots, the Muon/AdamW split
- :mod:`~taskloss.curvature.soap`                — SOAP: Adam in the eigenbasis of Shampoo's factors
- :mod:`~taskloss.curvature.natural_gradient`    — the natural-gradient step, trust region, Gaussian KL and Fisher, the coupled Gaussian
- :mod:`~taskloss.curvature.gaussian_family`     — Gaussian natural/expectation parameters, Bonnet/Price, natural-gradient VI
"""
from taskloss.curvature.diagonal import FisherDiagonalPreconditioner
from taskloss.curvature.distributed import RankFailure
from taskloss.curvature.fisher import (
    LIKELIHOODS,
    curvature_scale,
    empirical_fisher,
    empirical_fisher_diagonal,
    fisher_matrix,
    ggn_diagonal,
    ggn_matrix,
    ggn_operator,
    ggn_vector_product,
    mc_fisher,
    mc_fisher_diagonal,
    nll_loss,
    output_hessian_sqrt,
    sample_targets,
)
from taskloss.curvature.gaussian_family import (
    MCEstimate,
    NaturalGaussianVI,
    bonnet_gradient,
    gaussian_from_expectation,
    gaussian_from_natural,
    gaussian_log_partition,
    gaussian_natural_fisher,
    gaussian_natural_gradient,
    gaussian_samples,
    gaussian_to_expectation,
    gaussian_to_natural,
    gaussian_vi_natural_update,
    price_gradient,
    sym_to_vec,
    vec_to_sym,
)
from taskloss.curvature.hessian_free import HessianFree, conjugate_gradient, hessian_free_direction
from taskloss.curvature.kfac import KFAC
from taskloss.curvature.natural_gradient import (
    CoupledGaussian,
    NaturalGradientDescent,
    gaussian_fisher,
    gaussian_kl,
    natural_gradient,
    trust_region_step,
)
from taskloss.curvature.shampoo import Shampoo, matrix_power, muon_with_adamw
from taskloss.curvature.soap import SOAP

__all__ = [
    "LIKELIHOODS", "nll_loss", "sample_targets", "output_hessian_sqrt", "ggn_matrix",
    "fisher_matrix", "mc_fisher", "empirical_fisher", "ggn_diagonal", "mc_fisher_diagonal",
    "empirical_fisher_diagonal", "ggn_vector_product", "ggn_operator", "curvature_scale",
    "conjugate_gradient",
    "hessian_free_direction", "HessianFree", "FisherDiagonalPreconditioner", "KFAC", "RankFailure", "natural_gradient",
    "trust_region_step", "NaturalGradientDescent", "gaussian_kl", "gaussian_fisher", "CoupledGaussian",
    "sym_to_vec", "vec_to_sym", "gaussian_to_natural", "gaussian_from_natural", "gaussian_to_expectation",
    "gaussian_from_expectation", "gaussian_log_partition", "gaussian_natural_fisher", "MCEstimate",
    "gaussian_samples", "bonnet_gradient", "price_gradient", "gaussian_natural_gradient",
    "gaussian_vi_natural_update", "NaturalGaussianVI", "Shampoo", "SOAP", "matrix_power", "muon_with_adamw",
]
