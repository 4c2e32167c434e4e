"""Bad input to taskloss.contrastive: clear errors (type and message), nothing returned silently."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from taskloss.contrastive import (
    accumulated_backward,
    distributed_info_nce,
    gather_with_grad,
    info_nce,
    naive_accumulated_backward,
    paragraph_pairs,
    retrieval_metrics,
    retrieval_ranks,
    split_micro_batches,
)

q, p = torch.randn(4, 3), torch.randn(4, 3)
loss_fn = functools.partial(info_nce, temperature=0.5)


@pytest.mark.parametrize("fn", [info_nce, distributed_info_nce])
def test_loss_bad_inputs(fn):
    with pytest.raises(ValueError, match="numbers of queries and positives differ"):
        fn(q, p[:3])
    for t in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            fn(q, p, temperature=t)
    with pytest.raises(TypeError, match="temperature must be a number"):
        fn(q, p, temperature="0.1")
    bad = q.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="queries contains NaN"):
        fn(bad, p)
    with pytest.raises(ValueError, match="hard_negatives contains NaN"):
        fn(q, p, hard_negatives=torch.full((2, 3), float("inf")))
    with pytest.raises(ValueError, match="embedding dimensions differ"):
        fn(q, p, hard_negatives=torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"must have shape \[n, d\]"):
        fn(q[0], p[0])
    with pytest.raises(ValueError, match="empty"):
        fn(q[:0], p[:0])
    with pytest.raises(TypeError, match="floating-point"):
        fn(q.long(), p)
    with pytest.raises(ValueError, match="reduction"):
        fn(q, p, reduction="none")


def test_accumulation_bad_micro_batch_and_inputs():
    enc = nn.Linear(3, 2)
    for m in (0, -2):
        with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
            accumulated_backward(enc, (q, p), loss_fn, m)
        with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
            naive_accumulated_backward(enc, (q, p), loss_fn, m)
        with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
            split_micro_batches(q, m)
    with pytest.raises(TypeError, match="micro_batch_size must be an int"):
        accumulated_backward(enc, (q, p), loss_fn, 2.5)
    with pytest.raises(ValueError, match="one entry per input"):
        accumulated_backward(enc, (q, p), loss_fn, [2, 2, 2])
    with pytest.raises(ValueError, match="one entry per input"):
        accumulated_backward([enc], (q, p), loss_fn, 2)
    with pytest.raises(TypeError, match="must be callable"):
        accumulated_backward("encoder", (q, p), loss_fn, 2)
    with pytest.raises(TypeError, match="non-empty list or tuple"):
        accumulated_backward(enc, q, loss_fn, 2)
    with pytest.raises(ValueError, match="empty"):
        accumulated_backward(enc, (q[:0], p[:0]), loss_fn, 2)
    with pytest.raises(ValueError, match="numbers of queries and positives differ"):
        accumulated_backward(enc, (q, p[:3]), loss_fn, 2)
    with pytest.raises(ValueError, match="numbers of queries and positives differ"):
        naive_accumulated_backward(enc, (q, p[:3]), loss_fn, 2)
    with pytest.raises(ValueError, match="different numbers of micro-batches"):
        naive_accumulated_backward(enc, (q, p[:3]), loss_fn, [2, 1])


def test_nan_embeddings_and_bad_encoder_outputs():
    nan_enc = lambda x: torch.full((x.shape[0], 2), float("nan"))            # noqa: E731
    with pytest.raises(ValueError, match="input 0, micro-batch 0: the embeddings contain NaN"):
        accumulated_backward(nan_enc, (q, p), loss_fn, 2)
    with pytest.raises(ValueError, match="the embeddings contain NaN"):
        naive_accumulated_backward(nan_enc, (q, p), loss_fn, 2)
    with pytest.raises(ValueError, match=r"must return \[n, d\] with n = 2"):
        accumulated_backward(lambda x: torch.zeros(3, 2), (q, p), loss_fn, 2)
    with pytest.raises(TypeError, match="floating tensor"):
        accumulated_backward(lambda x: x.long(), (q, p), loss_fn, 2)
    with pytest.raises(ValueError, match="scalar tensor"):
        accumulated_backward(nn.Linear(3, 2), (q, p), lambda a, b: a @ b.T, 2)
    with pytest.raises(ValueError, match="non-finite loss"):
        accumulated_backward(nn.Linear(3, 2), (q, p), lambda a, b: (a.sum() + b.sum()) * float("inf"), 2)


def test_encoder_that_changes_shape_in_the_second_pass():
    class Shifty(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            out = self.lin(x)
            return out if torch.is_grad_enabled() is False else out[:, :3]     # narrower when replayed with a graph

    with pytest.raises(RuntimeError, match=r"input 0, micro-batch 0: the encoder returned shape \(2, 3\) in the second pass "
                                           r"but \(2, 4\) in the first"):
        accumulated_backward(Shifty(), (q, p), loss_fn, 2)


def test_retrieval_and_pairs_bad_inputs():
    with pytest.raises(ValueError, match=r"candidates must be \[m ≥ n, d\]"):
        retrieval_ranks(q, p[:2])
    with pytest.raises(ValueError, match="queries contains NaN"):
        retrieval_ranks(torch.full((2, 3), float("nan")), p)
    with pytest.raises(ValueError, match="shape"):
        retrieval_ranks(q[0], p)
    with pytest.raises(ValueError, match="k must be >= 1"):
        retrieval_metrics(q, p, ks=(0,))
    with pytest.raises(ValueError, match="unknown split"):
        paragraph_pairs("dev")
    with pytest.raises(ValueError, match="min_words must be >= 2"):
        paragraph_pairs("valid", min_words=1)
    with pytest.raises(ValueError, match="max_pairs must be >= 1"):
        paragraph_pairs("valid", max_pairs=0)
    with pytest.raises(ValueError, match="no paragraph"):
        paragraph_pairs("valid", min_words=10_000)
    with pytest.raises(TypeError, match="torch.Tensor"):
        gather_with_grad([1, 2])
