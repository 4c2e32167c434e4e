"""Tests for taskloss.gradflow.training: the harness learns a learnable sequence, detects divergence, follows its
warm-up (Adam's first step moves every weight by the learning rate, a closed form), and xavier_init_'s scales."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import V, make_lm, tokens
from torch import nn

from taskloss.gradflow import evaluate_nll, train_lm, xavier_init_
from taskloss.lm.completion import block_nll


def periodic_blocks(n: int, T: int = 12, period: int = 5) -> torch.Tensor:
    """Rows of a repeating sequence 0, 1, …, period−1 at random phases: perfectly predictable after one token."""
    phase = torch.randint(0, period, (n, 1), generator=torch.Generator().manual_seed(0))
    return (phase + torch.arange(T + 1)) % period


@pytest.mark.parametrize("kind", ["pre", "post", "realformer", "lstm"])
def test_learns_a_periodic_sequence_and_is_reproducible(kind):
    train, valid = periodic_blocks(64), periodic_blocks(16)
    runs = []
    for _ in range(2):
        model = make_lm(kind, seed=3)
        kw = dict(steps=100, lr=3e-2, clip=1.0) if kind == "lstm" else dict(steps=60, lr=1e-2)  # the LSTM is slower
        runs.append(train_lm(model, train, valid, batch_size=8, seed=1, **kw))
    r = runs[0]
    assert not r.diverged and r.steps_run == kw["steps"] and len(r.train_loss) == len(r.grad_norm) == kw["steps"]
    assert math.isclose(r.initial_nll, math.log(V), rel_tol=0.05)       # near-uniform predictions at init
    assert r.valid_nll < 0.2, r.valid_nll                               # the sequence is deterministic
    # same seed, same process: the same numbers (tolerance: threads may reorder sums)
    assert math.isclose(runs[1].valid_nll, r.valid_nll, rel_tol=1e-5, abs_tol=1e-6)


def test_evaluate_nll_is_the_token_weighted_mean():
    model = make_lm("pre")
    blocks = tokens(10, 9)
    with torch.no_grad():
        ref = block_nll(model, blocks).item()
    assert math.isclose(evaluate_nll(model, blocks, batch_size=3), ref, rel_tol=1e-5)
    model.train()
    evaluate_nll(model, blocks)
    assert model.training                                               # mode restored


def test_divergence_detected():
    train, valid = periodic_blocks(32), periodic_blocks(8)
    r = train_lm(make_lm("post"), train, valid, steps=20, lr=1e3, batch_size=8)
    assert r.diverged and r.valid_nll > r.initial_nll                    # a learning rate of 1000 makes it worse

    class Exploding(nn.Module):
        vocab_size = V

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(V))
            self.calls = 0

        def forward(self, idx):
            self.calls += 1
            out = self.w.expand(*idx.shape, V)
            return out * math.inf if self.calls > 4 else out

    r = train_lm(Exploding(), train, valid, steps=10, lr=0.1)
    assert r.diverged and r.steps_run == 4 and r.valid_nll == math.inf and r.valid_ppl == math.inf
    # a perplexity ceiling also counts
    ok = train_lm(make_lm("pre"), train, valid, steps=5, lr=1e-3, divergence_ppl=1.0001)
    assert ok.diverged and ok.valid_nll < ok.initial_nll


def test_warmup_scales_the_first_adam_step():
    """Adam's first step is ``lr_0 · g/(|g| + ε) ≈ lr_0 · sign(g)``: with warm-up, ``lr_0 = lr / warmup_steps``."""
    train, valid = periodic_blocks(16), periodic_blocks(4)
    for warm, expected in ((0, 0.1), (10, 0.01)):
        model = make_lm("pre")
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_lm(model, train, valid, steps=1, lr=0.1, warmup_steps=warm, batch_size=4)
        step = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
        assert math.isclose(step, expected, rel_tol=1e-3), (warm, step)


def test_clipping_bounds_the_update_direction_but_records_the_raw_norm():
    train, valid = periodic_blocks(16), periodic_blocks(4)
    a = train_lm(make_lm("post", seed=2), train, valid, steps=3, lr=1e-3, clip=1e-3)
    b = train_lm(make_lm("post", seed=2), train, valid, steps=3, lr=1e-3)
    assert math.isclose(a.grad_norm[0], b.grad_norm[0], rel_tol=1e-6) and a.grad_norm[0] > 1e-3


def test_xavier_init_scales():
    torch.manual_seed(0)
    model = make_lm("post", tie_weights=False, d_model=64, n_heads=4, n_layers=2)
    xavier_init_(model, torch.Generator().manual_seed(0))
    d = 64
    qkv = model.blocks[0].attn.qkv.weight
    assert qkv.abs().max() <= math.sqrt(6 / (2 * d)) and qkv.abs().max() > 0.95 * math.sqrt(6 / (2 * d))
    fc1 = model.blocks[1].fc1.weight
    assert math.isclose(fc1.std().item(), math.sqrt(2 / (d + 4 * d)), rel_tol=0.03)   # uniform: var = bound²/3
    assert math.isclose(model.tok_emb.weight.std().item(), 1.0, rel_tol=0.03)
    assert math.isclose(model.head.weight.std().item(), d ** -0.5, rel_tol=0.03)
    assert model.blocks[0].fc1.bias.abs().max() == 0 and model.blocks[0].ln1.weight.eq(1).all()
    with pytest.raises(ValueError, match="tie_weights"):
        xavier_init_(make_lm("post"))
