"""The networks the experiments train: a causal Transformer LM (Post-LN, Pre-LN, RealFormer), a recurrent LM
(LSTM / RNN), and an MLP and small CNN for the 8×8 digits.

Used by notebooks 02–09.

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
