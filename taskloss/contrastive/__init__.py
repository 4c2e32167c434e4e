"""Contrastive learning at large batch on small memory: InfoNCE with in-batch negatives, exact two-pass gradient
accumulation (GradCache), and the all-gather that makes it exact across ranks.

Notebooks: 10_contrastive_accumulation, 17_your_own_model.

Modules:

- :mod:`~taskloss.contrastive.losses`          — InfoNCE / in-batch negatives: temperature, symmetric, hard negatives
- :mod:`~taskloss.contrastive.accumulation`    — exact accumulation: embed without graph, cache ∂L/∂e, replay with RNG
- :mod:`~taskloss.contrastive.rng_state`       — the CPU and CUDA random states a pass used, recorded and replayed
- :mod:`~taskloss.contrastive.distributed`     — all-gather with gradient to the own rows; the DDP-exact loss scale
- :mod:`~taskloss.contrastive.retrieval`       — paragraph-half pairs split by document; recall@k and MRR
- :mod:`~taskloss.contrastive.minilm_encoder`  — a trainable top of MiniLM over cached frozen lower layers
"""
from taskloss.contrastive.accumulation import (
    AccumulationResult,
    accumulated_backward,
    batch_size,
    check_batch_independent,
    embed_micro_batches,
    embedding_gradients,
    naive_accumulated_backward,
    replay_backward,
    split_micro_batches,
)
from taskloss.contrastive.distributed import distributed_info_nce, gather_with_grad, world
from taskloss.contrastive.losses import REDUCTIONS, check_pair_embeddings, info_nce, info_nce_rows
from taskloss.contrastive.minilm_encoder import MiniLMTop, minilm_prefix_states
from taskloss.contrastive.retrieval import paragraph_pairs, retrieval_metrics, retrieval_ranks
from taskloss.contrastive.rng_state import RNGState

__all__ = [
    "info_nce", "info_nce_rows", "check_pair_embeddings", "REDUCTIONS",
    "RNGState", "AccumulationResult", "batch_size", "split_micro_batches", "embed_micro_batches",
    "embedding_gradients", "replay_backward", "accumulated_backward", "naive_accumulated_backward",
    "check_batch_independent",
    "world", "gather_with_grad", "distributed_info_nce",
    "paragraph_pairs", "retrieval_ranks", "retrieval_metrics",
    "MiniLMTop", "minilm_prefix_states",
]
