"""The networks the experiments train: a causal Transformer LM (Post-LN, Pre-LN, RealFormer), a recurrent LM
(LSTM / RNN), and an MLP and small CNN for the 8×8 digits.

Notebooks: 03_metric_optimization_classification, 06_natural_gradient, 07_fisher_approximations, 09_emo_loss,
11_gradient_clipping, 12_implicit_gradient_regularization, 13_recurrent_gradients, 14_realformer,
15_integrated_gradients, 16_update_rule_harness, 18_group_policy_gradients.

Modules:

- :mod:`~taskloss.models.transformer`       — causal Transformer LM with three residual layouts
- :mod:`~taskloss.models.recurrent`         — LSTM / RNN language model
- :mod:`~taskloss.models.feedforward`       — MLP and small CNN
"""
from taskloss.models.feedforward import MLP, SmallCNN
from taskloss.models.recurrent import RNNLM
from taskloss.models.transformer import RESIDUAL_MODES, TransformerLM

__all__ = [
    "TransformerLM", "RESIDUAL_MODES", "RNNLM", "MLP", "SmallCNN",
]
