"""Pairs split by document, retrieval metrics against scikit-learn, and the MiniLM top-layer encoder against
the full model (taskloss.contrastive.retrieval, taskloss.contrastive.minilm_encoder)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score, top_k_accuracy_score

from taskloss.contrastive import (
    MiniLMTop,
    accumulated_backward,
    info_nce,
    minilm_prefix_states,
    paragraph_pairs,
    retrieval_metrics,
    retrieval_ranks,
    split_micro_batches,
)
from taskloss.datasets import load_documents, sentence_embeddings


@pytest.mark.parametrize("ties", [False, True])
def test_metrics_match_scikit_learn(ties):
    g = torch.Generator().manual_seed(0)
    q, c = torch.randn(30, 8, generator=g, dtype=torch.float64), torch.randn(40, 8, generator=g, dtype=torch.float64)
    if ties:                                       # integer scores: many ties, counted against the query
        q, c = q.round(), c.round()
        c[3] = c[5]
    s = (q @ c.T).numpy()
    got = retrieval_metrics(q, c, ks=(1, 5, 10))
    labels = np.arange(40)
    y = np.zeros_like(s)
    y[np.arange(30), np.arange(30)] = 1
    assert got["mrr"] == pytest.approx(label_ranking_average_precision_score(y, s), abs=1e-12)
    if not ties:                                   # top_k_accuracy_score breaks ties in favour of the label
        for k in (1, 5, 10):
            assert got[f"recall@{k}"] == pytest.approx(top_k_accuracy_score(np.arange(30), s, k=k, labels=labels))
    r = retrieval_ranks(q, c)
    assert r.min() >= 1 and r.max() <= 40
    assert retrieval_metrics(c[:30], c[:30])["recall@1"] <= 1.0


def test_pairs_are_paragraph_halves_split_by_document():
    train, held = paragraph_pairs("train"), paragraph_pairs(["valid", "test"])
    assert len(train) > 1000 and len(held) > 300
    assert not {t for *_, t in train} & {t for *_, t in held}                 # no shared document
    assert not {a + b for a, b, _ in train} & {a + b for a, b, _ in held}     # no shared paragraph
    lines = {line for d in load_documents("valid") for line in d.lines}
    q, p, _ = paragraph_pairs("valid", max_pairs=1)[0]
    assert f"{q} {p}" in lines and abs(len(q.split()) - len(p.split())) <= 1
    assert len(paragraph_pairs("valid", max_pairs=7)) == 7


@pytest.mark.slow
def test_top_layers_over_frozen_prefix_equal_the_sentence_encoder():
    texts = [q for q, _, _ in paragraph_pairs("valid") if len(q.split()) <= 30][:6]   # < 80 WordPiece tokens
    ref = sentence_embeddings(texts)
    for k in (1, 3):
        states = minilm_prefix_states(texts, n_trainable=k, max_tokens=80)
        assert not bool(states["mask"][:, -1].any())                                 # nothing truncated
        with torch.no_grad():
            got = MiniLMTop(k).eval()(states)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_minilm_top_accumulation_with_dropout_is_exact_in_float64():
    pairs = paragraph_pairs("valid", max_pairs=7)
    q, p = (minilm_prefix_states([x[i] for x in pairs], max_tokens=16) for i in (0, 1))
    q, p = ({k: v.double() if v.is_floating_point() else v for k, v in x.items()} for x in (q, p))
    top = MiniLMTop(1).double()                                      # training mode: dropout on
    loss_fn = functools.partial(info_nce, temperature=0.05)
    torch.manual_seed(2)
    loss_fn(*(torch.cat([top(c) for c in split_micro_batches(x, 3)]) for x in (q, p))).backward()
    ref = [x.grad.clone() for x in top.parameters()]
    top.zero_grad()
    torch.manual_seed(2)
    accumulated_backward(top, (q, p), loss_fn, 3)
    for a, b in zip(top.parameters(), ref):
        torch.testing.assert_close(a.grad, b, rtol=1e-9, atol=1e-12)
