"""Gradient flow through architectures: how a gradient travels back through time in recurrent networks and
back through depth in the three residual layouts of a Transformer (Post-LN, Pre-LN, RealFormer).

Notebooks: 13_recurrent_gradients (∂h_t/∂h_{t−k} and ∂c_t/∂c_{t−k} of RNN/LSTM/GRU, the ∏ f_t argument,
vanishing and exploding regimes), 14_realformer (the three layouts' gradient paths, per-layer gradient norms at
initialisation, attention entropy, and one learning-rate sweep comparing them).

Modules:

- :mod:`~taskloss.gradflow.recurrent`  — exact Jacobian-vs-lag probes for nn.RNN/LSTM/GRU and the RNNLM, their
  norms, the gate-product approximation and its error, recurrent re-initialisation
- :mod:`~taskloss.gradflow.attention`  — attention probabilities and entropy by layer, gradient norms by layer
- :mod:`~taskloss.gradflow.training`   — one LM-training harness (AdamW, warm-up, clipping, divergence detection),
  held-out NLL, the Xavier initialisation analysed by Xiong et al.
"""
from taskloss.gradflow.attention import (
    LayerGradients,
    attention_entropy,
    attention_probabilities,
    layer_gradient_norms,
)
from taskloss.gradflow.recurrent import (
    LagJacobians,
    gate_product_error,
    init_recurrent_,
    jacobian_norms,
    lag_jacobians,
)
from taskloss.gradflow.training import TrainResult, evaluate_nll, train_lm, xavier_init_

__all__ = [
    "LagJacobians", "lag_jacobians", "jacobian_norms", "gate_product_error", "init_recurrent_",
    "attention_probabilities", "attention_entropy", "LayerGradients", "layer_gradient_norms",
    "TrainResult", "train_lm", "evaluate_nll", "xavier_init_",
]
