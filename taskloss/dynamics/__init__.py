"""Training dynamics: gradient clipping and (L0, L1)-smoothness, and the implicit gradient regularization of a
finite learning rate.

Notebooks: 11_gradient_clipping (the two clipping forms, smoothness measured along the training of an LSTM and a
Transformer LM, clipped vs unclipped gradient descent where the theory is exact and on the LM),
12_implicit_gradient_regularization (backward error analysis of gradient descent, explicit gradient
regularization vs a larger learning rate, flooding as a gradient penalty).

Modules:

- :mod:`~taskloss.dynamics.clipping`     — hard and soft clipping, global or per tensor; the ``ClippedSGD`` optimizer
- :mod:`~taskloss.dynamics.hessian`      — gradients and Hessian-vector products of a pure loss, the top Hessian
  eigenvalue by power iteration, second-order-safe kernels
- :mod:`~taskloss.dynamics.smoothness`   — the trajectory smoothness probe (functional and for a training loop), the
  (L0, L1) fit
- :mod:`~taskloss.dynamics.implicit`     — gradient-norm penalties (double backward, per example), the modified
  loss and its gradient, RK4 flows with an error check, flooding
"""
from taskloss.dynamics.clipping import CLIP_MODES, ClippedSGD, clip_coefficient, clip_grad_
from taskloss.dynamics.hessian import (
    EigenResult,
    hessian_vector_product,
    loss_gradient,
    native_kernels,
    top_hessian_eigenvalue,
)
from taskloss.dynamics.implicit import (
    FlowResult,
    flooding,
    gradient_flow,
    gradient_norm_penalty,
    integrate_flow,
    modified_gradient,
    modified_loss,
    per_example_gradient_penalty,
)
from taskloss.dynamics.smoothness import (
    SmoothnessFit,
    SmoothnessSample,
    TrajectorySmoothness,
    fit_l0_l1,
    local_smoothness,
)

__all__ = [
    "CLIP_MODES", "clip_coefficient", "clip_grad_", "ClippedSGD",
    "native_kernels", "loss_gradient", "hessian_vector_product", "local_smoothness", "SmoothnessSample",
    "TrajectorySmoothness",
    "top_hessian_eigenvalue", "EigenResult", "fit_l0_l1", "SmoothnessFit",
    "gradient_norm_penalty", "per_example_gradient_penalty", "modified_loss", "modified_gradient", "FlowResult",
    "integrate_flow", "gradient_flow", "flooding",
]
