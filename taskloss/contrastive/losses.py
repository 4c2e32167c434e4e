"""InfoNCE with in-batch negatives: every other pair's positive is a negative for this query.

Derived in notebook 10_contrastive_accumulation. With queries ``q_i``, positives ``p_i`` (i = 1..B) and optional
extra candidates ``h_m`` (hard negatives, shared by every query), the candidates are ``c = [p; h]`` and the
scores ``s_ij = ⟨q_i, c_j⟩ / τ``. The loss of query i is the cross-entropy of its own positive among all
candidates::

    ℓ_i = −s_ii + log Σ_j exp(s_ij),        L = (1/B) Σ_i ℓ_i      (reduction="mean"; "sum" drops 1/B).

The *symmetric* variant (CLIP's) also scores each positive against all queries, ``ℓ'_i = −s_ii + log Σ_j
exp(⟨p_i, q_j⟩/τ)``, and uses ``½(ℓ_i + ℓ'_i)`` per pair. The essay's form ``−Σ t_ij s_ij + Σ_i log Σ_j
e^{s_ij}`` is the sum reduction with ``t`` the identity (a one-hot label per row).

Conventions of the peers (tested in ``tests/contrastive/test_contrastive_peers.py``):

* sentence-transformers' ``MultipleNegativesRankingLoss`` / ``CachedMultipleNegativesRankingLoss`` (Henderson
  et al., 2017): cosine similarity times ``scale`` (default 20) — here unit-normalized embeddings with
  ``temperature = 1/scale``; mean over queries; hard negatives appended as extra columns, as here. Our
  ``symmetric=True`` is its ``directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"``.
* GradCache's ``SimpleContrastiveLoss`` (Gao et al., 2021): raw dot products (``temperature=1``), mean over
  queries, no symmetric term; its hard negatives are interleaved per query rather than shared.

The row terms are computed by :func:`info_nce_rows`, which :mod:`taskloss.contrastive.distributed` reuses with
the candidates gathered from every rank. Scores are formed in at least float32 (bf16/fp16 embeddings from
autocast are upcast first).
"""
from __future__ import annotations

import torch
from torch import Tensor

from taskloss.validation import check_bool, check_finite, check_floating, check_positive

__all__ = ["REDUCTIONS", "info_nce", "info_nce_rows", "check_pair_embeddings"]

REDUCTIONS = ("mean", "sum")


def check_pair_embeddings(queries: Tensor, positives: Tensor, hard_negatives: Tensor | None = None) -> None:
    """Validate a batch of pair embeddings: 2-D floating tensors ``[B, d]`` with the same B (queries and
    positives) and d (all), at least one row, finite values; ``hard_negatives`` ``[M, d]`` (M ≥ 0) or None.

    Raises:
        TypeError: a non-tensor or non-floating tensor.
        ValueError: wrong rank, empty batch, mismatched numbers of queries and positives, mismatched
            dimension, NaN or inf.
    """
    named = {"queries": queries, "positives": positives}
    if hard_negatives is not None:
        named["hard_negatives"] = hard_negatives
    for name, t in named.items():
        check_floating(name, t)
        if t.ndim != 2:
            raise ValueError(f"{name} must have shape [n, d], got shape {tuple(t.shape)}")
    if queries.shape[0] == 0:
        raise ValueError("queries is empty (batch size 0)")
    if queries.shape[0] != positives.shape[0]:
        raise ValueError(f"numbers of queries and positives differ: {queries.shape[0]} queries, "
                         f"{positives.shape[0]} positives (row i of each must form a pair)")
    dims = {name: t.shape[1] for name, t in named.items()}
    if len(set(dims.values())) > 1:
        raise ValueError(f"embedding dimensions differ: {dims}")
    for name, t in named.items():
        check_finite(name, t.detach())


def _score_dtype(*ts: Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in ts:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def info_nce_rows(queries: Tensor, positives: Tensor, all_queries: Tensor, candidates: Tensor, temperature: float,
                  symmetric: bool = False) -> Tensor:
    """Per-row InfoNCE terms of some rows of a (possibly gathered) batch — the unchecked core.

    Args:
        queries: ``[n, d]`` the rows' queries.
        positives: ``[n, d]`` the rows' positives.
        all_queries: ``[B, d]`` every query of the batch (the candidates of the symmetric term).
        candidates: ``[B + M, d]`` every positive of the batch (the rows' own among them), then the hard
            negatives.
        temperature: τ > 0.
        symmetric: add the positive→queries term and halve.

    Returns:
        ``[n]`` losses ``ℓ_i`` (or ``½(ℓ_i + ℓ'_i)``), in at least float32.
    """
    symmetric = check_bool("symmetric", symmetric)
    check_positive("temperature", temperature)       # τ = 0 (or NaN) would divide every score into NaN / inf
    for name, t in (("queries", queries), ("positives", positives), ("all_queries", all_queries),
                    ("candidates", candidates)):
        check_floating(name, t)
    dtype = _score_dtype(queries, candidates)
    with torch.autocast(device_type=queries.device.type, enabled=False):   # autocast would lower the matmuls
        q, p = queries.to(dtype), positives.to(dtype)
        s = q @ candidates.to(dtype).T / temperature                                 # [n, B + M]
        pos = (q * p).sum(-1) / temperature                                          # s_ii
        rows = torch.logsumexp(s, dim=-1) - pos
        if symmetric:
            s_rev = p @ all_queries.to(dtype).T / temperature                        # [n, B]
            rows = 0.5 * (rows + torch.logsumexp(s_rev, dim=-1) - pos)
    return rows


def info_nce(queries: Tensor, positives: Tensor, *, temperature: float = 0.05, hard_negatives: Tensor | None = None,
             symmetric: bool = False, reduction: str = "mean") -> Tensor:
    """InfoNCE / in-batch-negatives loss of B pairs ``(queries[i], positives[i])`` (module docstring).

    Args:
        queries: ``[B, d]`` query embeddings (normalize them first for cosine scores).
        positives: ``[B, d]`` positive embeddings; row i is the positive of query i and a negative of the others.
        temperature: τ > 0; scores are ``⟨q, c⟩/τ`` (sentence-transformers' ``scale`` is 1/τ).
        hard_negatives: optional ``[M, d]`` extra candidates, negatives of every query.
        symmetric: also score each positive against all queries and average the two directions.
        reduction: ``"mean"`` over pairs (default) or ``"sum"`` (the essay's form).

    Returns:
        A scalar tensor (at least float32).

    Raises:
        ValueError: temperature ≤ 0, unknown reduction, or bad embeddings (:func:`check_pair_embeddings`).
    """
    symmetric = check_bool("symmetric", symmetric)
    temperature = check_positive("temperature", temperature)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    check_pair_embeddings(queries, positives, hard_negatives)
    candidates = positives if hard_negatives is None else torch.cat([positives, hard_negatives.to(positives.dtype)])
    rows = info_nce_rows(queries, positives, queries, candidates, temperature, symmetric)
    return rows.mean() if reduction == "mean" else rows.sum()
