"""What a model is judged by, and losses that aim at it: task losses and metrics (accuracy, macro-F1, edit
distance, repetition, non-termination, BLEU), the earth mover distance (EMO) loss, and distribution-level
quality of generated text.

Notebooks: 02_importance_sampling_and_mgs, 03_metric_optimization_classification,
05_policy_gradient_vs_zeroth_order, 09_emo_loss, 16_update_rule_harness, 17_your_own_model,
18_group_policy_gradients.

Modules:

- :mod:`~taskloss.losses.metrics`            — task losses and metrics
- :mod:`~taskloss.losses.levenshtein`        — the batched edit-distance kernels (rapidfuzz on CPU, torch on GPU)
- :mod:`~taskloss.losses.emo`                — earth mover distance loss for language models (public API, the
  three-line reference)
- :mod:`~taskloss.losses.emo_kernel`         — its fused chunked kernels and their autograd twin
- :mod:`~taskloss.losses.emo_cost`           — its cost tables (unit-norm token embeddings, dense cost matrix)
- :mod:`~taskloss.losses.text_quality`       — frontier score (MAUVE recipe) and MMD² of text embeddings
"""
from taskloss.losses.emo import (
    REDUCTIONS,
    VARIANTS,
    EMOLoss,
    combine_emo_mle,
    emo_and_mle_per_token,
    emo_loss,
    emo_loss_reference,
    emo_soft_upper_bound,
)
from taskloss.losses.emo_cost import emo_cost_matrix, normalize_cost_embeddings
from taskloss.losses.emo_kernel import COMBINES
from taskloss.losses.metrics import (
    EDIT_DISTANCE_BACKENDS,
    accuracy,
    bleu,
    bleu_from_ids,
    bleu_loss,
    cut_at_eos,
    edit_distance,
    macro_f1,
    macro_f1_loss,
    non_termination,
    repetition,
    sentence_bleu,
    to_lists,
    token_repeat_rate,
    zero_one_loss,
)
from taskloss.losses.text_quality import (
    cluster_histograms,
    divergence_frontier,
    embed_texts,
    frontier_area,
    frontier_score,
    mmd2,
)

__all__ = [
    "cut_at_eos", "to_lists", "accuracy", "zero_one_loss", "macro_f1", "macro_f1_loss", "edit_distance",
    "EDIT_DISTANCE_BACKENDS",
    "repetition", "token_repeat_rate", "non_termination", "bleu", "sentence_bleu", "bleu_loss", "bleu_from_ids",
    "COMBINES", "VARIANTS", "REDUCTIONS", "normalize_cost_embeddings", "emo_cost_matrix", "emo_and_mle_per_token",
    "combine_emo_mle", "emo_loss", "emo_loss_reference", "emo_soft_upper_bound", "EMOLoss", "frontier_score", "cluster_histograms",
    "divergence_frontier", "frontier_area", "mmd2", "embed_texts",
]
