"""Searching for a lower task loss where the gradient does not reach it: MLE-guided parameter search (MGS),
policy gradient (REINFORCE) and zeroth-order estimators.

Notebooks: 02_importance_sampling_and_mgs, 03_metric_optimization_classification, 04_sequence_task_losses,
05_policy_gradient_vs_zeroth_order, 17_your_own_model, 18_group_policy_gradients.

Modules:

- :mod:`~taskloss.search.mgs`                   — the ``MGS`` optimizer (``step(closure)``)
- :mod:`~taskloss.search.mgs_reference`         — the same step in some thirty readable lines, tested equal
- :mod:`~taskloss.search.mgs_density`           — MGS proposal density, importance weights, per-candidate seeds
- :mod:`~taskloss.search.mgs_noise`             — one step's candidates: Δθ_k from its seed, float64 noise statistics
- :mod:`~taskloss.search.mgs_scoring`           — scoring candidates: a loop on the module, one vmap, a vmapped forward
- :mod:`~taskloss.search.mgs_stats`             — the diagnostics of one step
- :mod:`~taskloss.search.functional`            — a model at other parameters for a whole call (methods, submodules)
- :mod:`~taskloss.search.ranks`                 — the zeroth-order methods across torch.distributed ranks
- :mod:`~taskloss.search.policy_gradient`       — REINFORCE: sampling outputs, scored by a task loss
- :mod:`~taskloss.search.zeroth_order`          — sampling parameters: Gaussian smoothing, SPSA, MeZO
- :mod:`~taskloss.search.group_estimators`      — group policy gradients: mean baseline, RLOO, GRPO, Dr. GRPO, DAPO
- :mod:`~taskloss.search.exact_sequences`       — every sequence enumerated: exact E[R], ∇E[R], estimator moments
"""
from taskloss.search.exact_sequences import (
    GroupMoments,
    TabularPolicy,
    enumerate_sequences,
    exact_group_moments,
    exact_objective,
    sampled_group_moments,
    sequence_scores,
)
from taskloss.search.functional import call_with_parameters
from taskloss.search.group_estimators import (
    AGGREGATIONS,
    BASELINES,
    GRPO_EPS,
    SCALES,
    completion_logprobs,
    completion_mask,
    dapo_loss,
    dr_grpo_loss,
    group_advantages,
    grpo_loss,
    policy_gradient_surrogate,
    reinforce_mean_baseline_loss,
    rloo_loss,
    sample_groups,
    token_logprobs,
)
from taskloss.search.mgs import ASSIGNMENTS, MGS, SIGMA_MODES
from taskloss.search.mgs_density import DENSITIES, mgs_weights, mixture_log_density
from taskloss.search.mgs_reference import mgs_step_reference
from taskloss.search.mgs_scoring import default_forward
from taskloss.search.mgs_stats import MGSStats
from taskloss.search.policy_gradient import (
    MovingAverageBaseline,
    PGResult,
    classification_reinforce,
    expected_reward,
    leave_one_out_baseline,
    reinforce_loss,
    sequence_reinforce,
)
from taskloss.search.zeroth_order import MeZO, gaussian_smoothing_grad, spsa_grad

__all__ = [
    "MGS", "MGSStats", "SIGMA_MODES", "ASSIGNMENTS", "mixture_log_density", "mgs_weights", "mgs_step_reference",
    "DENSITIES", "default_forward", "reinforce_loss", "leave_one_out_baseline",
    "MovingAverageBaseline", "expected_reward", "PGResult", "classification_reinforce", "sequence_reinforce",
    "gaussian_smoothing_grad", "spsa_grad", "MeZO", "call_with_parameters",
]
__all__ += [  # group policy gradients and their exact moments (notebook 18)
    "BASELINES", "SCALES", "AGGREGATIONS", "GRPO_EPS", "completion_mask", "token_logprobs", "completion_logprobs",
    "sample_groups", "group_advantages", "policy_gradient_surrogate", "reinforce_mean_baseline_loss", "rloo_loss",
    "grpo_loss", "dr_grpo_loss", "dapo_loss", "enumerate_sequences", "TabularPolicy", "sequence_scores",
    "exact_objective", "exact_group_moments", "sampled_group_moments", "GroupMoments",
]
