"""Optimization as sampling an update: the update distribution p(Δθ) ∝ exp(−[l(θ+Δθ) − l(θ)]/α), its mean
Δθ* estimated by self-normalized importance sampling (SNIS), the proposals, and the ε-ball and quadratic
(Newton) limits in closed form.

Notebooks: 01_optimization_as_sampling, 02_importance_sampling_and_mgs, 18_group_policy_gradients.

Modules:

- :mod:`~taskloss.sampling.update`        — SNIS core (weights, ESS), the update distribution, the Newton limit
- :mod:`~taskloss.sampling.proposals`     — Gaussian, uniform-ball and Gaussian-mixture (MGS) proposals
- :mod:`~taskloss.sampling.ball`          — the ε-ball update in closed form: partition function, Bessel ratios
"""
from taskloss.sampling.ball import (
    ball_expected_update,
    ball_log_partition,
    ball_log_partition_derivative,
    ball_partition,
    log_ball_volume,
)
from taskloss.sampling.proposals import GaussianMixtureProposal, GaussianProposal, UniformBallProposal
from taskloss.sampling.update import (
    SNISResult,
    effective_sample_size,
    expected_update,
    gaussian_update_distribution,
    log_target,
    newton_direction,
    normalized_log_weights,
    self_normalized_is,
    vmap_loss,
)

__all__ = [
    "SNISResult", "normalized_log_weights", "effective_sample_size", "log_target", "vmap_loss",
    "self_normalized_is", "expected_update", "newton_direction",
    "gaussian_update_distribution", "GaussianProposal", "UniformBallProposal", "GaussianMixtureProposal",
    "log_ball_volume", "ball_log_partition", "ball_partition", "ball_log_partition_derivative",
    "ball_expected_update",
]
