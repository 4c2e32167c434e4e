"""The group policy gradients against the exact gradient of an enumerable policy (notebook 18).

Ground truth is ``∇ Σ_y p(y) R(y)`` by autograd over every sequence (itself checked by finite differences). The
unbiased estimator (RLOO) must have exactly that expectation; the mean baseline and Dr. GRPO a known multiple of it;
GRPO and DAPO the expectation that an independent float64 loop over all groups predicts from their formulas (and it is
not a multiple of ∇E[R]: they are biased). Sampling through :func:`taskloss.lm.generate` and differentiating the
surrogates by autograd must land within the standard error of the exact expectation.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import taskloss.search as S
from taskloss.lm import CausalLM, sequence_logprob

V, L, EOS = 3, 3, 0
PROMPT = torch.tensor([EOS])


@pytest.fixture(scope="module")
def space():
    seqs, mask = S.enumerate_sequences(V, L, EOS)
    pol = S.TabularPolicy(V, L, seed=3)
    rewards = torch.randn(len(seqs), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    J = S.exact_objective(pol, PROMPT, seqs, mask, rewards)
    grad = torch.autograd.grad(J, [pol.logits])[0].reshape(-1)
    return seqs, mask, pol, rewards, grad


def test_enumeration_counts_and_exact_gradient_by_finite_differences(space):
    seqs, mask, pol, rewards, grad = space
    assert len(seqs) == sum((V - 1) ** k for k in range(L)) + (V - 1) ** L
    assert len({tuple(r) for r in seqs.tolist()}) == len(seqs)
    theta = pol.logits.detach().clone()
    fd = torch.zeros_like(theta).reshape(-1)
    for i in range(fd.numel()):
        for sign in (1, -1):
            with torch.no_grad():
                pol.logits.copy_(theta)
                pol.logits.view(-1)[i] += sign * 1e-6
            with torch.no_grad():
                fd[i] += sign * float(S.exact_objective(pol, PROMPT, seqs, mask, rewards)) / 2e-6
    with torch.no_grad():
        pol.logits.copy_(theta)
    torch.testing.assert_close(fd, grad, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("G", [2, 3, 4])
def test_rloo_unbiased_mean_baseline_and_dr_grpo_at_their_known_factors(space, G):
    seqs, mask, pol, rewards, grad = space
    m = {name: S.exact_group_moments(f, pol, PROMPT, seqs, mask, rewards, G).mean
         for name, f in [("rloo", S.rloo_loss), ("mean", S.reinforce_mean_baseline_loss), ("dr", S.dr_grpo_loss)]}
    torch.testing.assert_close(m["rloo"], grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(m["mean"], (G - 1) / G * grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(m["dr"], (G - 1) / (G * L) * grad, rtol=1e-9, atol=1e-12)


def _independent_expectation(pol, seqs, mask, rewards, G, kind):
    """E[ĝ] by a plain float64 loop over all ordered groups, from the estimators' formulas (no package loss)."""
    theta = pol.logits.detach().clone().requires_grad_(True)
    scores, lengths, probs = [], [], []
    for row, m in zip(seqs.tolist(), mask.tolist()):
        prev, logp = EOS, 0.0
        for t, (tok, keep) in enumerate(zip(row, m)):
            if keep:
                logp = logp + torch.log_softmax(theta[t, prev], -1)[tok]
                prev = tok
        scores.append(torch.autograd.grad(logp, theta)[0].reshape(-1).numpy())
        lengths.append(sum(m))
        probs.append(float(torch.as_tensor(logp).exp()))
    R, mean = rewards.numpy(), 0.0
    for group in itertools.product(range(len(seqs)), repeat=G):
        r = R[list(group)]
        a = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
        if kind == "grpo":
            g = sum(a[i] * scores[y] / lengths[y] for i, y in enumerate(group)) / G
        else:
            g = sum(a[i] * scores[y] for i, y in enumerate(group)) / sum(lengths[y] for y in group)
        mean = mean + np.prod([probs[y] for y in group]) * g
    return torch.as_tensor(mean)


@pytest.mark.parametrize("kind,fn", [("grpo", S.grpo_loss), ("dapo", S.dapo_loss)])
@pytest.mark.parametrize("G", [2, 3])
def test_grpo_and_dapo_at_their_predicted_bias(space, kind, fn, G):
    seqs, mask, pol, rewards, grad = space
    exact = S.exact_group_moments(fn, pol, PROMPT, seqs, mask, rewards, G).mean
    torch.testing.assert_close(exact, _independent_expectation(pol, seqs, mask, rewards, G, kind), rtol=1e-9,
                               atol=1e-12)
    c = float(exact @ grad / (grad @ grad))           # the best multiple of ∇E[R] still misses E[ĝ]: a biased direction
    assert float((exact - c * grad).norm()) > 0.02 * float(exact.norm())


@pytest.mark.parametrize("fn", [S.rloo_loss, S.grpo_loss, S.reinforce_mean_baseline_loss, S.dr_grpo_loss])
def test_sampling_with_generate_and_autograd_lands_within_the_standard_error(space, fn):
    """20 000 groups drawn by taskloss.lm.generate; the batch surrogate's gradient (the mean of the per-group
    estimates for sequence-level aggregations) against the exact expectation, judged by the exact trace covariance."""
    seqs, mask, pol, rewards, grad = space
    G, K = 3, 20000
    exact = S.exact_group_moments(fn, pol, PROMPT, seqs, mask, rewards, G)
    prompts, comp, cmask = S.sample_groups(pol, PROMPT.expand(K, 1), G, L, eos_id=EOS, pad_id=EOS,
                                           generator=torch.Generator().manual_seed(0))
    comp = comp.masked_fill(cmask == 0, -100)
    index = {tuple(r): i for i, r in enumerate(seqs.tolist())}
    r = rewards[[index[tuple(row)] for row in comp.tolist()]]
    logps = S.completion_logprobs(pol, prompts, comp)
    g = -torch.autograd.grad(fn(logps, cmask.double(), r, G), [pol.logits])[0].reshape(-1)
    err2 = float(((g - exact.mean) ** 2).sum())
    assert err2 < 6 * exact.trace_cov / K, (err2, exact.trace_cov / K)
    assert float(((g - 1.1 * exact.mean) ** 2).sum()) > 6 * exact.trace_cov / K   # sharp enough to see a 10% error


def test_sampled_moments_agree_with_exact(space):
    seqs, mask, pol, rewards, grad = space
    exact = S.exact_group_moments(S.dapo_loss, pol, PROMPT, seqs, mask, rewards, 3)
    mc = S.sampled_group_moments(S.dapo_loss, pol, PROMPT, seqs, mask, rewards, 3, 20000,
                                 torch.Generator().manual_seed(0))
    live = mc.se > 0
    assert int(live.sum()) > 10
    assert float(((mc.mean - exact.mean)[live] / mc.se[live]).abs().max()) < 5
    assert torch.equal(exact.mean[~live], torch.zeros_like(exact.mean[~live]))
    assert abs(mc.trace_cov / exact.trace_cov - 1) < 0.1


def test_an_hf_model_through_model_output_and_padding():
    """A GPT-2 with four tokens is enumerable too: ModelOutput logits, -100 padding, the same identities."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=4, n_positions=8)
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    seqs, mask = S.enumerate_sequences(4, 2, 3)
    rewards = torch.arange(len(seqs), dtype=torch.float64) % 3
    J = S.exact_objective(model, torch.tensor([3]), seqs, mask, rewards)
    params = [p for p in model.parameters()]
    grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(J, params)])
    m = S.exact_group_moments(S.rloo_loss, model, torch.tensor([3]), seqs, mask, rewards, 2).mean
    torch.testing.assert_close(m, grad, rtol=1e-8, atol=1e-12)
    # per-token log-probs summed over the mask equal the package's sequence log-prob (pad after EOS)
    cont = seqs.masked_fill(mask == 0, 3)
    ours = (S.completion_logprobs(model, torch.full((len(seqs), 1), 3), seqs) * mask).sum(1)
    ref = sequence_logprob(CausalLM(model), torch.full((len(seqs), 1), 3), cont, pad_id=3, eos_id=3)
    torch.testing.assert_close(ours, ref.to(ours.dtype), rtol=1e-6, atol=1e-6)


def test_on_policy_surrogates_share_the_estimate_and_the_clip_acts_off_policy():
    torch.manual_seed(0)
    logps = torch.randn(4, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
    A = torch.tensor([1.0, -1.0, 0.5, 2.0])
    g_on = torch.autograd.grad(S.policy_gradient_surrogate(logps, mask, A, clip_low=0.2, clip_high=0.2), logps)[0]
    torch.testing.assert_close(g_on, -(A[:, None] * mask) / mask.sum(1, keepdim=True) / 4)
    old = logps.detach() - 1.0                                   # ratio e > 1.2: clipped where A > 0
    g_off = torch.autograd.grad(S.policy_gradient_surrogate(logps, mask, A, old_logps=old, clip_low=0.2,
                                                            clip_high=0.2), logps)[0]
    assert torch.equal(g_off[A > 0], torch.zeros_like(g_off[A > 0]))
    assert bool((g_off[A < 0][mask[A < 0] > 0] != 0).all())
