r"""Exact answers for a policy over short sequences: every sequence enumerated, so E_y[l(y)], its gradient and the
expectation and variance of a group policy-gradient estimator are sums, not samples.

A completion is a sequence of at most ``max_length`` tokens from ``n_tokens`` symbols, ending at its first EOS (or at
``max_length``). There are :math:`\sum_{k<L}(V-1)^k + (V-1)^L` of them (15 for V = 3, L = 3). For any causal model
``model(ids [N, T]) → logits [N, T, V]`` (the :class:`TabularPolicy` here, a tiny LM) the exact objective is

.. math::  J(\theta) = \sum_y p_\theta(y)\, R(y), \qquad \nabla J = \sum_y p_\theta(y)\, R(y)\, \nabla \log p_\theta(y),

and an estimator ``f`` that maps one group of ``G`` completions to a surrogate loss has the exact expectation
:math:`\mathbb{E}[\hat g] = \sum_{y_1..y_G} \prod_i p(y_i)\, \hat g(y_1..y_G)`, a sum over all :math:`M^G` ordered
groups. :func:`exact_group_moments` computes it by calling ``f`` itself on every group (one ``vmap`` of
``torch.func.grad`` over the groups gives ``∂f/∂log p_t`` per token; the chain rule through the per-token score
Jacobian gives ``ĝ``), so what is checked is the package's own loss function. :func:`sampled_group_moments` is the
Monte Carlo version with a standard error, for spaces too large to enumerate. Derived in notebook
18_group_policy_gradients.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from taskloss.search.group_estimators import completion_logprobs
from taskloss.validation import check_allocation, check_generator, check_int

__all__ = ["enumerate_sequences", "TabularPolicy", "sequence_scores", "exact_objective", "exact_group_moments",
           "sampled_group_moments", "GroupMoments"]


def enumerate_sequences(n_tokens: int, max_length: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every completion: ``(seqs [M, L] long, -100 after the EOS; mask [M, L] float)``, shortest first.

    Derived in notebook 18_group_policy_gradients.
    """
    V = check_int("n_tokens", n_tokens, minimum=2, maximum=8)
    L = check_int("max_length", max_length, minimum=1, maximum=5)
    eos = check_int("eos_id", eos_id, minimum=0, maximum=V - 1)
    body = [t for t in range(V) if t != eos]
    rows = []
    prefixes = [[]]
    for k in range(L):
        rows += [p + [eos] + [-100] * (L - k - 1) for p in prefixes]          # stop here
        prefixes = [p + [t] for p in prefixes for t in body]
    rows += prefixes                                                          # no EOS within L tokens
    seqs = torch.tensor(rows, dtype=torch.long)
    return seqs, (seqs != -100).float()


class TabularPolicy(nn.Module):
    """``p(y_t | y_{t-1}, t) = softmax(θ[t, y_{t-1}])``: one logit table per position and previous token.

    ``forward(ids [N, T]) → logits [N, T, V]`` (a causal LM whose context is the last token and the position), with
    ``vocab_size`` and ``max_len`` so that :func:`taskloss.lm.generate` samples from it. ``θ ~ N(0, init_scale²)``
    from ``seed``. Derived in notebook 18_group_policy_gradients.
    """

    def __init__(self, n_tokens: int, max_length: int, init_scale: float = 1.0, seed: int = 0):
        super().__init__()
        self.vocab_size = check_int("n_tokens", n_tokens, minimum=2)
        self.max_len = check_int("max_length", max_length, minimum=1) + 1           # the prompt token, then L
        check_allocation("TabularPolicy's logit table", 4.0 * self.max_len * self.vocab_size ** 2)
        g = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
        self.logits = nn.Parameter(float(init_scale) * torch.randn(self.max_len, n_tokens, n_tokens, generator=g,
                                                                   dtype=torch.float64))
        self.is_recurrent = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, T, V]``: row ``t`` predicts token ``t + 1`` from token ``t``."""
        T = ids.shape[1]
        if T > self.max_len:
            raise ValueError(f"{T} tokens exceed the table's {self.max_len} positions")
        return self.logits[torch.arange(T, device=ids.device), ids.clamp_min(0)]


def _params(model: nn.Module) -> list[torch.Tensor]:
    ps = [p for p in model.parameters() if p.requires_grad]
    if not ps:
        raise ValueError("model has no trainable parameters")
    return ps


def _check_space(model, prompt, seqs, mask, rewards=None) -> None:
    """The enumerated space's arguments, refused at entry with their names (a clear error instead of torch's)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for name, t, ndim in (("prompt", prompt, 1), ("seqs", seqs, 2)):
        if not isinstance(t, torch.Tensor) or t.is_meta or t.is_complex() or t.dtype.is_floating_point \
                or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor of token ids, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.ndim != ndim:
            what = "one sequence [P]" if name == "prompt" else "sequences [M, L]"
            raise ValueError(f"{name} must be {what}, got shape {tuple(t.shape)}")
    if not isinstance(mask, torch.Tensor) or mask.is_meta or mask.is_complex() or mask.shape != seqs.shape:
        raise ValueError(f"mask must be a real tensor shaped like seqs {tuple(seqs.shape)}, got "
                         f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if rewards is not None:
        if not isinstance(rewards, torch.Tensor) or rewards.is_meta or rewards.is_complex() \
                or rewards.shape != seqs.shape[:1]:
            raise ValueError(f"rewards must be a tensor [M={len(seqs)}] of real values, one per sequence")
        if not torch.isfinite(rewards.double()).all():
            raise ValueError("rewards contain NaN or inf")


def sequence_scores(model: nn.Module, prompt: torch.Tensor, seqs: torch.Tensor,
                    mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logps [M, L], jac [M, L, P])``: each token's log-prob and its gradient (flattened parameters), masked.

    One backward pass per token position and sequence. Derived in notebook 18_group_policy_gradients.
    """
    _check_space(model, prompt, seqs, mask)
    ps = _params(model)
    logps = completion_logprobs(model, prompt.expand(len(seqs), -1), seqs) * mask
    rows = []
    for v in logps.reshape(-1):
        if v.requires_grad:
            gs = torch.autograd.grad(v, ps, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(gs, ps)]))
        else:
            rows.append(torch.zeros(sum(p.numel() for p in ps), dtype=ps[0].dtype))
    return logps.detach(), torch.stack(rows).reshape(*logps.shape, -1)


def exact_objective(model: nn.Module, prompt: torch.Tensor, seqs: torch.Tensor, mask: torch.Tensor,
                    rewards: torch.Tensor) -> torch.Tensor:
    """``J = Σ_y p(y) R(y)``, differentiable: its autograd gradient is the exact ``∇E[R]``.

    Derived in notebook 18_group_policy_gradients.
    """
    _check_space(model, prompt, seqs, mask, rewards)
    logp = (completion_logprobs(model, prompt.expand(len(seqs), -1), seqs) * mask).sum(1)
    total = float(logp.detach().exp().sum())
    if abs(total - 1) > 1e-6:
        raise ValueError(f"the sequences' probabilities sum to {total}, not 1: is every sequence enumerated?")
    return (logp.exp() * rewards.to(logp.dtype)).sum()


class GroupMoments:
    """An estimator's ``mean [P]`` and ``trace_cov`` (E‖ĝ − E ĝ‖²) over groups; ``se [P]`` for a sampled mean."""

    def __init__(self, mean: torch.Tensor, trace_cov: float, se: torch.Tensor | None = None, n: int | None = None):
        self.mean, self.trace_cov, self.se, self.n = mean, trace_cov, se, n

    def __repr__(self) -> str:
        return f"GroupMoments(|mean|={float(self.mean.norm()):.4g}, trace_cov={self.trace_cov:.4g}, n={self.n})"


def _group_grads(estimator: Callable, logps, mask, jac, rewards, idx: torch.Tensor) -> torch.Tensor:
    """ĝ (the gradient of ``−estimator``, i.e. the ascent estimate of ∇E[R]) for each group ``idx [K, G]`` → ``[K, P]``."""
    G = idx.shape[1]
    coef = torch.func.vmap(torch.func.grad(lambda lp, m, r: estimator(lp, m, r, G)))(
        logps[idx], mask[idx], rewards[idx])                                     # [K, G, L] = ∂f/∂log p_t
    return -torch.einsum("kgl,kglp->kp", coef, jac[idx])


def _prepare(model, prompt, seqs, mask, rewards, group_size):
    G = check_int("group_size", group_size, minimum=1)
    _check_space(model, prompt, seqs, mask, rewards)
    logps, jac = sequence_scores(model, prompt, seqs, mask)
    p = logps.sum(1).exp()
    return G, logps, jac, p, rewards.to(logps.dtype)


def exact_group_moments(estimator: Callable, model: nn.Module, prompt: torch.Tensor, seqs: torch.Tensor,
                        mask: torch.Tensor, rewards: torch.Tensor, group_size: int,
                        chunk: int = 16384) -> GroupMoments:
    """Exact ``E[ĝ]`` and ``E‖ĝ − E ĝ‖²`` of ``estimator(logps [G, L], mask, rewards [G], G) → loss`` over all
    ``M^G`` ordered groups of i.i.d. completions. ``ĝ = −∇loss`` (the ascent direction). Derived in notebook
    18_group_policy_gradients.
    """
    G, logps, jac, p, R = _prepare(model, prompt, seqs, mask, rewards, group_size)
    M = len(seqs)
    if M ** G > 5_000_000:
        raise ValueError(f"{M}^{G} groups is too many to enumerate; use sampled_group_moments")
    mean = torch.zeros(jac.shape[-1], dtype=jac.dtype)
    second = 0.0
    for start in range(0, M ** G, chunk):
        flat = torch.arange(start, min(start + chunk, M ** G))
        idx = torch.stack([(flat // M ** j) % M for j in range(G)], 1)         # [K, G]
        w = p[idx].prod(1)
        g = _group_grads(estimator, logps, mask, jac, R, idx)
        mean += (w[:, None] * g).sum(0)
        second += float((w * (g * g).sum(1)).sum())
    return GroupMoments(mean, second - float(mean @ mean), n=M ** G)


def sampled_group_moments(estimator: Callable, model: nn.Module, prompt: torch.Tensor, seqs: torch.Tensor,
                          mask: torch.Tensor, rewards: torch.Tensor, group_size: int, n_groups: int,
                          generator: torch.Generator | None = None) -> GroupMoments:
    """Monte Carlo ``E[ĝ]`` over ``n_groups`` groups drawn from ``p_θ`` (by index over the enumerated sequences),
    with its standard error per coordinate. Derived in notebook 18_group_policy_gradients.
    """
    n = check_int("n_groups", n_groups, minimum=2)
    check_generator("generator", generator)
    G, logps, jac, p, R = _prepare(model, prompt, seqs, mask, rewards, group_size)
    idx = torch.multinomial(p.float(), n * G, replacement=True, generator=generator).reshape(n, G)
    g = torch.cat([_group_grads(estimator, logps, mask, jac, R, idx[s:s + 16384]) for s in range(0, n, 16384)])
    mean = g.mean(0)
    return GroupMoments(mean, float(g.var(0).sum()), se=g.std(0) / n ** 0.5, n=n)
