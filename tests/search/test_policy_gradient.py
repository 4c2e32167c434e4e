"""REINFORCE: surrogate gradients, baselines, and unbiasedness against exact expectations (enumerated)."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from taskloss.losses import metrics as M
from taskloss.search import policy_gradient as PG


def test_reinforce_loss_gradient_is_the_estimator():
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(theta, 0)[torch.tensor([0, 3, 3, 1])]
    r = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    PG.reinforce_loss(logp, r, 0.5).backward()
    # manual: -(1/S) Σ (r_s - b) ∇ log p(y_s)
    theta2 = theta.detach().clone().requires_grad_(True)
    lp2 = torch.log_softmax(theta2, 0)[torch.tensor([0, 3, 3, 1])]
    manual = torch.autograd.grad(-((r - 0.5) * lp2).sum() / 4, theta2)[0]
    torch.testing.assert_close(theta.grad, manual)
    assert PG.reinforce_loss(logp.detach(), r, reduction="none").shape == (4,)
    torch.testing.assert_close(PG.reinforce_loss(logp.detach(), r, reduction="sum"), -(r * logp.detach()).sum())


@pytest.mark.parametrize("baseline", [1e8 + 2.0, torch.tensor(1e8 + 2.0, dtype=torch.float64)])
def test_advantage_keeps_the_rewards_precision(baseline):
    """Large rewards with a nearby baseline: R - b is formed in the rewards' dtype (float64 here) before it meets
    float32 log-probabilities; rounding the baseline (or the rewards) to float32 first would give 0 or ±8."""
    logp = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    rewards = torch.tensor([1e8 + 1.0, 1e8 + 3.0], dtype=torch.float64)
    PG.reinforce_loss(logp, rewards, baseline, reduction="sum").backward()
    torch.testing.assert_close(logp.grad, torch.tensor([1.0, -1.0]), rtol=0, atol=0)   # −(R − b) exactly


def test_leave_one_out_and_moving_average_baselines():
    r = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]])
    loo = PG.leave_one_out_baseline(r)
    torch.testing.assert_close(loo, torch.tensor([[4.0, 3.5], [3.0, 1.5], [2.0, 4.0]]))
    torch.testing.assert_close(r - loo, 3 / 2 * (r - r.mean(0)))
    ma = PG.MovingAverageBaseline(momentum=0.5)
    assert ma(torch.tensor([2.0, 4.0])).tolist() == [0.0, 0.0]      # nothing seen yet
    assert ma(torch.tensor([10.0])).tolist() == [3.0]                # first mean, not the current rewards
    assert ma.value == pytest.approx(6.5)
    ma2 = PG.MovingAverageBaseline()
    ma2.load_state_dict(ma.state_dict())
    assert ma2.value == ma.value and ma2.momentum == 0.5


def _grad(loss, x):
    return torch.autograd.grad(loss, x)[0]


@pytest.mark.parametrize("baseline", ["none", "loo"])
def test_classification_reinforce_is_unbiased_for_expected_accuracy(baseline):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 4, dtype=torch.float64, generator=g).requires_grad_(True)
    target = torch.randint(0, 4, (6,), generator=g)
    exact = _grad(PG.expected_reward(logits, F.one_hot(target, 4)).mean(), logits)
    res = PG.classification_reinforce(logits, target, n_samples=40000, baseline=baseline, generator=g)
    est = -_grad(res.loss, logits)
    assert res.samples.shape == (40000, 6) and res.rewards.shape == (40000, 6)
    torch.testing.assert_close(est, exact, atol=6e-3, rtol=0)


def test_loo_baseline_cuts_variance_and_removes_reward_offset():
    """reward = -(0-1 loss): without a baseline the constant offset -1 inflates the variance; LOO removes it."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    target = torch.randint(0, 5, (8,), generator=g)
    neg_loss = lambda s, t: -M.zero_one_loss(s, t, reduction="none")
    var = {}
    for baseline in ("none", "loo"):
        ests = torch.stack([-_grad(PG.classification_reinforce(logits, target, 4, reward=neg_loss, baseline=baseline,
                                                               generator=g).loss, logits) for _ in range(300)])
        var[baseline] = ests.var(0).sum().item()
    assert var["loo"] < 0.5 * var["none"]
    # with LOO, reward and reward + constant give the same estimate on the same samples
    a = PG.classification_reinforce(logits, target, 4, reward=neg_loss, generator=torch.Generator().manual_seed(7))
    b = PG.classification_reinforce(logits, target, 4, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(_grad(a.loss, logits), _grad(b.loss, logits))


def test_batch_level_reward_macro_f1_unbiased_by_enumeration():
    """A batch-level reward (macro-F1 of a sampled label vector) — exact expectation by enumerating all C^N."""
    g = torch.Generator().manual_seed(3)
    N, C = 3, 2
    logits = torch.randn(N, C, dtype=torch.float64, generator=g).requires_grad_(True)
    target = torch.tensor([0, 1, 1])
    ys = torch.tensor(list(itertools.product(range(C), repeat=N)))                # [C^N, N]
    logp = torch.log_softmax(logits, -1)
    logp_y = logp.gather(1, ys.T).T.sum(1)                                       # [C^N]
    f1 = M.macro_f1(ys, target, C).to(torch.float64)
    exact = _grad((logp_y.exp() * f1).sum(), logits)
    res = PG.classification_reinforce(logits, target, 60000, reward=lambda s, t: M.macro_f1(s, t, C),
                                      generator=g)
    assert res.rewards.shape == (60000,) and res.logprobs.shape == (60000,)
    torch.testing.assert_close(-_grad(res.loss, logits), exact, atol=6e-3, rtol=0)


def test_mle_mixing_adds_cross_entropy():
    logits = torch.randn(5, 3, requires_grad=True)
    target = torch.tensor([0, 1, 2, 0, 1])
    a = PG.classification_reinforce(logits, target, 3, generator=torch.Generator().manual_seed(0))
    b = PG.classification_reinforce(logits, target, 3, mle_weight=0.5, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(b.loss, a.loss + 0.5 * F.cross_entropy(logits, target))


def test_constant_baseline_as_number_or_tensor():
    logits = torch.randn(5, 3, requires_grad=True)
    target = torch.tensor([0, 1, 2, 0, 1])
    a = PG.classification_reinforce(logits, target, 3, baseline=0.5, generator=torch.Generator().manual_seed(0))
    b = PG.classification_reinforce(logits, target, 3, baseline=torch.tensor(0.5),
                                    generator=torch.Generator().manual_seed(0))
    manual = PG.reinforce_loss(a.logprobs, a.rewards, 0.5)
    torch.testing.assert_close(a.loss, b.loss)
    torch.testing.assert_close(a.loss, manual)


def test_moving_average_baseline_in_classification_step():
    logits = torch.zeros(4, 2, requires_grad=True)
    target = torch.tensor([0, 0, 1, 1])
    ma = PG.MovingAverageBaseline(0.9)
    r1 = PG.classification_reinforce(logits, target, 1, baseline=ma, generator=torch.Generator().manual_seed(0))
    assert ma.value == pytest.approx(r1.reward_mean)


def test_policy_gradient_bad_inputs():
    lp = torch.zeros(3, requires_grad=True)
    with pytest.raises(ValueError, match="shape"):
        PG.reinforce_loss(lp, torch.zeros(4))
    with pytest.raises(TypeError):
        PG.reinforce_loss(lp, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        PG.reinforce_loss(lp, torch.tensor([0.0, float("nan"), 1.0]))
    with pytest.raises(ValueError, match="empty"):
        PG.reinforce_loss(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="reduction"):
        PG.reinforce_loss(lp, torch.zeros(3), reduction="max")
    with pytest.raises(ValueError, match="broadcast"):
        PG.reinforce_loss(lp, torch.zeros(3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2"):
        PG.leave_one_out_baseline(torch.zeros(1, 3))
    with pytest.raises(ValueError):
        PG.MovingAverageBaseline(1.0)
    logits, y = torch.zeros(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(ValueError):
        PG.classification_reinforce(logits, y, 0)
    with pytest.raises(ValueError, match="batch sizes"):
        PG.classification_reinforce(logits, y[:3])
    with pytest.raises(TypeError):
        PG.classification_reinforce(logits, y.float())
    with pytest.raises(ValueError, match="baseline"):
        PG.classification_reinforce(logits, y, 2, baseline="median")
    with pytest.raises(ValueError, match="at least 2"):
        PG.classification_reinforce(logits, y, 1, baseline="loo")
    with pytest.raises(ValueError, match="reward must return"):
        PG.classification_reinforce(logits, y, 2, reward=lambda s, t: torch.zeros(3))
    with pytest.raises(ValueError):
        PG.classification_reinforce(logits, y, 2, mle_weight=-1.0)


# ------------------------------------------------------------------------------------------------ sequences
class TinyLM(torch.nn.Module):
    """A 2-layer LM stand-in with the TransformerLM interface (vocab_size, forward(idx) → logits)."""

    def __init__(self, vocab_size=3, banned=None):
        super().__init__()
        self.vocab_size = vocab_size
        self.emb = torch.nn.Embedding(vocab_size, 8)
        self.out = torch.nn.Linear(8, vocab_size)
        mask = torch.zeros(vocab_size)
        if banned is not None:
            mask[banned] = -60.0                      # a pad token the policy never samples
        self.register_buffer("mask", mask)

    def forward(self, idx):
        h = torch.cumsum(self.emb(idx), 1)           # causal: position t sees tokens ≤ t
        return self.out(torch.tanh(h)) + self.mask


def test_sequence_reinforce_unbiased_by_enumeration():
    """Two new tokens from 3 live tokens (pad never sampled), no EOS: all 9 continuations enumerated give the
    exact gradient of the expected reward."""
    from taskloss.lm import sequence_logprob

    torch.manual_seed(0)
    model = TinyLM(4, banned=3).double()
    prefix = torch.tensor([[1, 2]])
    ref = [[0, 2]]
    task = lambda h, r: M.edit_distance(h, r, normalize=True)
    conts = torch.tensor(list(itertools.product(range(3), repeat=2)))              # [9, 2]
    logp = sequence_logprob(model, prefix.repeat(9, 1), conts, pad_id=3)
    exact_obj = -(logp.exp() * task(conts, ref * 9).double()).sum()
    exact = torch.autograd.grad(exact_obj, list(model.parameters()))
    res = PG.sequence_reinforce(model, prefix, ref, task, n_samples=20000, max_new_tokens=2, eos_id=None,
                                pad_id=3, generator=torch.Generator().manual_seed(0))
    est = torch.autograd.grad(res.loss, list(model.parameters()))
    assert res.samples.shape == (20000, 1, 2)
    for e, x in zip(est, exact):
        torch.testing.assert_close(-e, x, atol=1.5e-2, rtol=0)


def test_sequence_reinforce_batch_mle_and_errors():
    torch.manual_seed(1)
    model = TinyLM(5, banned=0)
    prefix = torch.tensor([[1, 2], [3, 1], [2, 2]])
    refs = [[1, 3, 4], [2], []]
    task = lambda h, r: M.edit_distance(h, r, eos_id=4, pad_id=0)
    res = PG.sequence_reinforce(model, prefix, refs, task, n_samples=3, max_new_tokens=4, eos_id=4, pad_id=0,
                                generator=torch.Generator().manual_seed(0))
    assert res.rewards.shape == (3, 3) and res.logprobs.shape == (3, 3) and res.samples.shape == (3, 3, 4)
    assert bool((res.rewards <= 0).all()) and bool((res.rewards >= -1).all())
    mle = torch.tensor([[1, 3, 4], [2, 4, 0], [4, 0, 0]])
    res2 = PG.sequence_reinforce(model, prefix, refs, task, n_samples=3, max_new_tokens=4, eos_id=4, pad_id=0,
                                 mle_weight=1.0, mle_continuations=mle, generator=torch.Generator().manual_seed(0))
    assert res2.loss.item() != pytest.approx(res.loss.item())
    res2.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match="batch sizes"):
        PG.sequence_reinforce(model, prefix, refs[:2], task, eos_id=4, pad_id=0)
    with pytest.raises(ValueError, match="mle_continuations"):
        PG.sequence_reinforce(model, prefix, refs, task, eos_id=4, pad_id=0, mle_weight=1.0)
    with pytest.raises(TypeError):
        PG.sequence_reinforce(model, prefix, refs, "edit", eos_id=4, pad_id=0)
    with pytest.raises(ValueError, match="shape"):
        PG.sequence_reinforce(model, prefix, refs, lambda h, r: torch.zeros(2), eos_id=4, pad_id=0)
