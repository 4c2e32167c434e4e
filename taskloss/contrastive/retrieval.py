"""Positive pairs from the no-download corpus and retrieval metrics over a held-out pool.

Used by notebook 10_contrastive_accumulation. A pair is the two halves of one paragraph (first half of its words
as the query, second half as the positive) — a self-supervised retrieval task in the spirit of the inverse
cloze task (Lee, Chang & Toutanova, ACL 2019). Pairs are split by *document*: the corpus assigns each
document to train/valid/test by the hash of its title (:func:`taskloss.datasets.stdlib_corpus.split_of`), so a
held-out pool never shares a document with training; paragraphs that also occur in another split are dropped.

Retrieval: query i must rank its own positive (candidate i) first among all candidates by the dot product of
the embeddings. With the rank ``r_i = #{j : s_ij ≥ s_ii}`` (ties count against the query),
``recall@k = mean_i [r_i ≤ k]`` and ``MRR = mean_i 1/r_i`` — scikit-learn's ``top_k_accuracy_score`` and
``label_ranking_average_precision_score`` with one relevant label per row (tested).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from taskloss.datasets.corpus import SPLITS, load_documents
from taskloss.validation import check_finite, check_floating, check_int, check_iterable

__all__ = ["paragraph_pairs", "retrieval_ranks", "retrieval_metrics"]


def _paragraphs(split: str, path=None) -> list[tuple[str, str]]:
    return [(d.title, line) for d in load_documents(split, path) for line in d.lines]


def paragraph_pairs(splits: str | Sequence[str], min_words: int = 16, max_pairs: int | None = None,
                    path=None) -> list[tuple[str, str, str]]:
    """(query, positive, document title) triples: each paragraph of at least ``min_words`` words of the
    documents in ``splits``, cut in two halves by words; duplicates and paragraphs occurring in another split
    are dropped; corpus order; the first ``max_pairs``.

    Args:
        splits: one split name or several ("train", "valid", "test").
        min_words: shortest paragraph kept (≥ 2).
        max_pairs: keep at most this many (None: all).
        path: a WikiText folder instead of the default corpus (see :func:`taskloss.datasets.corpus.load_documents`).

    Raises:
        ValueError: unknown split, min_words < 2, max_pairs < 1, or no paragraph long enough.
    """
    splits = (splits,) if isinstance(splits, str) else tuple(check_iterable("splits", splits))
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"unknown split {s!r}; expected one of {SPLITS}")
    check_int("min_words", min_words, minimum=2)
    if max_pairs is not None:
        check_int("max_pairs", max_pairs, minimum=1)
    elsewhere = {line for s in SPLITS if s not in splits for _, line in _paragraphs(s, path)}
    seen, out = set(), []
    for s in splits:
        for title, line in _paragraphs(s, path):
            words = line.split()
            if len(words) < min_words or line in seen or line in elsewhere:
                continue
            seen.add(line)
            half = len(words) // 2
            out.append((" ".join(words[:half]), " ".join(words[half:]), title))
            if max_pairs is not None and len(out) >= max_pairs:
                return out
    if not out:
        raise ValueError(f"no paragraph of {splits} has {min_words} words")
    return out


def retrieval_ranks(queries: Tensor, candidates: Tensor) -> Tensor:
    """Rank of each query's own candidate (candidate i for query i; extra candidates beyond the queries are
    distractors) by dot product: ``r_i = #{j : ⟨q_i, c_j⟩ ≥ ⟨q_i, c_i⟩}`` (1 = first; ties count against).

    The scores are computed in at least float32, outside any autocast: bfloat16 scores (3 significant digits) tied
    and reordered candidates; with the ties counted against the query, bfloat16 embeddings of 512 synthetic pairs
    lost 13 % of their MRR and 17 % of their recall@10 against the float64 ranks of the same embeddings (issue 45).

    Args:
        queries: ``[n, d]``.
        candidates: ``[m, d]`` with m ≥ n.

    Returns:
        int64 ``[n]``.

    Raises:
        TypeError, ValueError: non-floating, wrong shape, fewer candidates than queries, NaN/inf.
    """
    for name, t in (("queries", queries), ("candidates", candidates)):
        check_floating(name, t)
        if t.ndim != 2 or t.shape[0] == 0:
            raise ValueError(f"{name} must have shape [n, d] with n ≥ 1, got {tuple(t.shape)}")
        check_finite(name, t)
    if candidates.shape[1] != queries.shape[1] or candidates.shape[0] < queries.shape[0]:
        raise ValueError(f"candidates must be [m ≥ n, d] for queries [n, d]; got {tuple(candidates.shape)} "
                         f"for {tuple(queries.shape)}")
    dtype = torch.promote_types(queries.dtype, torch.float32)
    with torch.autocast(device_type=queries.device.type, enabled=False):     # autocast would lower the matmul
        s = queries.to(dtype) @ candidates.to(dtype).T
    own = s.diagonal()[:, None]
    return (s >= own).sum(-1)


def retrieval_metrics(queries: Tensor, candidates: Tensor, ks: Sequence[int] = (1, 10)) -> dict[str, float]:
    """``{"recall@k": …, "mrr": …}`` of :func:`retrieval_ranks` (module docstring).

    Raises:
        ValueError: a k < 1 (and as :func:`retrieval_ranks`).
    """
    ks = [check_int("k", k, minimum=1) for k in ks]
    r = retrieval_ranks(queries, candidates).double()
    out = {f"recall@{k}": float((r <= k).double().mean()) for k in ks}
    out["mrr"] = float((1.0 / r).mean())
    return out
