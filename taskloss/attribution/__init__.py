"""Attribution: integrated gradients as a path integral of the gradient, with Riemann and Gauss–Legendre rules,
any baseline (zeros, blurred, noisy, a set of baselines for expected gradients), any target, chunked batched
evaluation, attribution in the embedding space of token models, shaded-text rendering and the
model-randomization sanity check.

Notebooks: 15_integrated_gradients, 17_your_own_model. Source: Sundararajan, Taly & Yan, *Axiomatic Attribution
for Deep Networks* (ICML 2017); the reference implementation compared against is Captum's ``IntegratedGradients``.

Modules:

- :mod:`~taskloss.attribution.quadrature`            — nodes and weights of the rules on [0, 1], their orders
- :mod:`~taskloss.attribution.integrated_gradients`  — the chunked path-gradient core and ``IntegratedGradients``
  (one tensor or a tuple of inputs)
- :mod:`~taskloss.attribution.embedding`             — integrated gradients in a token model's embedding space
- :mod:`~taskloss.attribution.baselines`             — blurred, noisy and sampled (expected-gradients) baselines
- :mod:`~taskloss.attribution.sanity`                — rank correlation, randomized model copies (Adebayo et al.)
- :mod:`~taskloss.attribution.render`                — token attributions as shaded HTML text and as a figure
"""
from taskloss.attribution.baselines import (
    baseline_set,
    blurred_baseline,
    gaussian_noise_baseline,
    uniform_noise_baseline,
)
from taskloss.attribution.embedding import EmbeddingIntegratedGradients
from taskloss.attribution.integrated_gradients import (
    Attribution,
    IntegratedGradients,
    integrate_gradients,
    select_target,
)
from taskloss.attribution.quadrature import METHODS, captum_trapezoid_factor, convergence_order, quadrature_rule
from taskloss.attribution.render import plot_tokens, token_colors, tokens_html
from taskloss.attribution.sanity import (
    average_ranks,
    cascading_randomization,
    randomized_copy,
    spearman_correlation,
)

__all__ = [
    "Attribution", "IntegratedGradients", "integrate_gradients", "select_target", "EmbeddingIntegratedGradients",
    "METHODS", "quadrature_rule", "captum_trapezoid_factor", "convergence_order",
    "blurred_baseline", "gaussian_noise_baseline", "uniform_noise_baseline", "baseline_set",
    "average_ranks", "spearman_correlation", "randomized_copy", "cascading_randomization",
    "tokens_html", "token_colors", "plot_tokens",
]
