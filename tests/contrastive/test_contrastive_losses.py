"""InfoNCE (taskloss.contrastive.losses) against float64 cross-entropy on the score matrix, the essay's form,
the closed-form embedding gradient, and properties (pair-order invariance, bounds, extreme temperatures)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from taskloss.contrastive import distributed_info_nce, info_nce

D = torch.float64


def _pairs(B=6, d=4, M=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, p = torch.randn(B, d, generator=g, dtype=D), torch.randn(B, d, generator=g, dtype=D)
    h = torch.randn(M, d, generator=g, dtype=D) if M else None
    return q, p, h


@pytest.mark.parametrize("M", [0, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_info_nce_is_cross_entropy_over_candidates(M, reduction):
    q, p, h = _pairs(M=M)
    c = p if h is None else torch.cat([p, h])
    ref = F.cross_entropy(q @ c.T / 0.3, torch.arange(6), reduction=reduction)
    torch.testing.assert_close(info_nce(q, p, temperature=0.3, hard_negatives=h, reduction=reduction), ref)


@pytest.mark.parametrize("M", [0, 2])
def test_symmetric_averages_both_directions(M):
    q, p, h = _pairs(M=M)
    c = p if h is None else torch.cat([p, h])
    fwd = F.cross_entropy(q @ c.T / 0.5, torch.arange(6))
    bwd = F.cross_entropy(p @ q.T / 0.5, torch.arange(6))           # positives against the queries only
    torch.testing.assert_close(info_nce(q, p, temperature=0.5, hard_negatives=h, symmetric=True), (fwd + bwd) / 2)


def test_essay_form_with_one_hot_labels():
    q, p, _ = _pairs()
    s = q @ p.T / 0.2
    t = torch.eye(6, dtype=D)                                         # one-hot label per row
    essay = -(t * s).sum() + torch.logsumexp(s, dim=1).sum()
    torch.testing.assert_close(info_nce(q, p, temperature=0.2, reduction="sum"), essay)


def test_embedding_gradient_closed_form():
    """∂L/∂q_i = Σ_j (P_ij − δ_ij) c_j / (Bτ) and ∂L/∂c_j = Σ_i (P_ij − δ_ij) q_i / (Bτ)."""
    q, p, h = _pairs(M=2)
    q.requires_grad_(), p.requires_grad_(), h.requires_grad_()
    tau = 0.4
    info_nce(q, p, temperature=tau, hard_negatives=h).backward()
    c = torch.cat([p, h]).detach()
    P = torch.softmax(q.detach() @ c.T / tau, dim=1)
    R = P - torch.eye(6, 8, dtype=D)
    torch.testing.assert_close(q.grad, R @ c / (6 * tau))
    gc = R.T @ q.detach() / (6 * tau)
    torch.testing.assert_close(p.grad, gc[:6])
    torch.testing.assert_close(h.grad, gc[6:])


@given(perm_seed=st.integers(0, 1000), tau=st.floats(1e-3, 10.0), symmetric=st.booleans())
def test_pair_order_does_not_matter_and_loss_is_bounded(perm_seed, tau, symmetric):
    q, p, h = _pairs(B=5, M=2, seed=perm_seed)
    q, p, h = F.normalize(q, dim=1), F.normalize(p, dim=1), F.normalize(h, dim=1)
    perm = torch.randperm(5, generator=torch.Generator().manual_seed(perm_seed))
    a = info_nce(q, p, temperature=tau, hard_negatives=h, symmetric=symmetric)
    b = info_nce(q[perm], p[perm], temperature=tau, hard_negatives=h, symmetric=symmetric)
    torch.testing.assert_close(a, b)
    assert torch.isfinite(a) and a >= 0
    # unit vectors: scores lie in [−1/τ, 1/τ], so each row loss is at most log(n) + 2/τ
    assert a <= math.log(7) + 2 / tau + 1e-9


def test_extreme_temperature_stays_finite():
    q, p, _ = _pairs()
    q, p = F.normalize(q, dim=1), F.normalize(p, dim=1)
    assert torch.isfinite(info_nce(q, p, temperature=1e-6))
    assert torch.isfinite(info_nce(q * 1e6, p * 1e6, temperature=1e-3, symmetric=True))


def test_half_precision_embeddings_are_scored_in_float32_also_under_autocast():
    q, p, _ = _pairs(B=32, d=16)
    q, p = F.normalize(q, dim=1), F.normalize(p, dim=1)
    ref = info_nce(q, p, temperature=0.05)
    qb, pb = q.to(torch.bfloat16), p.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = info_nce(qb, pb, temperature=0.05)
    assert got.dtype == torch.float32
    # the only error left is rounding the embeddings to bf16 (autocast does not lower the score matmul)
    torch.testing.assert_close(got, info_nce(qb.double(), pb.double(), temperature=0.05).float(), rtol=1e-5, atol=1e-5)
    assert abs(got.item() - ref.item()) < 0.05 * ref.item()


def test_distributed_loss_without_process_group_is_info_nce():
    q, p, h = _pairs(M=3)
    for kw in (dict(), dict(symmetric=True), dict(reduction="sum", hard_negatives=h)):
        torch.testing.assert_close(distributed_info_nce(q, p, temperature=0.1, **kw),
                                   info_nce(q, p, temperature=0.1, **kw))
