r"""Policy gradient (REINFORCE): sample *outputs* from the model, score them with a task loss.

For a policy :math:`p_\theta(y|x)` and a reward :math:`R(y)` (here ``R = -task loss`` or a metric),

.. math::  \nabla_\theta\, \mathbb{E}_{y\sim p_\theta}[R(y)]
           = \mathbb{E}_{y\sim p_\theta}[(R(y) - b)\, \nabla_\theta \log p_\theta(y)]

for any baseline ``b`` that does not depend on ``y`` (a moving average of past rewards, or the leave-one-out
mean of the other samples drawn for the same input). The functional core is :func:`reinforce_loss`, a
*surrogate* whose gradient is minus this estimator, so ``loss.backward(); optimizer.step()`` ascends the
expected reward. :func:`classification_reinforce` and :func:`sequence_reinforce` are convenience steps that
sample, score, apply a baseline and optionally mix in the MLE loss.

Derived in notebook 05_policy_gradient_vs_zeroth_order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from taskloss.lm.generation import generate, sequence_logprob
from taskloss.losses.metrics import accuracy
from taskloss.validation import (
    check_finite,
    check_floating,
    check_generator,
    check_int,
    check_nonnegative,
    check_not_meta,
    is_transformed,
)

__all__ = [
    "reinforce_loss", "leave_one_out_baseline", "MovingAverageBaseline", "expected_reward",
    "PGResult", "classification_reinforce", "sequence_reinforce",
]


# ------------------------------------------------------------------------------------------ functional core
def reinforce_loss(logprobs: torch.Tensor, rewards: torch.Tensor, baseline: torch.Tensor | float | None = None,
                   *, reduction: str = "mean") -> torch.Tensor:
    """Surrogate ``-(R - b)·log p`` whose gradient is the (negated) REINFORCE estimate of ∇ E[R].

    Args:
      logprobs: ``log p_θ(y)`` of the sampled outputs (any non-empty shape, floating, differentiable).
      rewards: same shape, floating (treated as constants, higher is better).
      baseline: ``None`` (0), a real number, or a floating tensor broadcastable to ``rewards`` without changing
        its shape (treated as a constant).
      reduction: ``"mean"`` (scalar) | ``"sum"`` | ``"none"``.

    The advantage ``R - b`` is formed in the rewards' dtype (promoted with a tensor baseline's dtype; a Python
    number is subtracted in that dtype, never rounded to float32 first) and only then cast to the dtype of
    ``logprobs``: large rewards with a nearby baseline keep their difference. Raises ``TypeError`` on
    non-floating inputs or a bool/str baseline, ``ValueError`` on empty or mismatched shapes, NaN/inf, or an
    unknown reduction. Derived in notebook 05_policy_gradient_vs_zeroth_order.
    """
    check_floating("logprobs", logprobs)
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_floating("rewards", rewards)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if logprobs.numel() == 0:
        raise ValueError("logprobs is empty")
    if rewards.shape != logprobs.shape:
        raise ValueError(f"rewards shape {tuple(rewards.shape)} != logprobs shape {tuple(logprobs.shape)}")
    _finite("rewards", rewards)
    _finite("logprobs", logprobs.detach())
    adv = rewards.detach()
    if baseline is not None:
        if isinstance(baseline, torch.Tensor):
            check_floating("baseline", baseline)
            _finite("baseline", baseline.detach())
            b = baseline.detach().to(adv.device)
            try:
                adv = adv.to(torch.promote_types(adv.dtype, b.dtype)) - b
            except RuntimeError as e:
                raise ValueError(f"baseline of shape {tuple(b.shape)} does not broadcast to rewards "
                                 f"{tuple(rewards.shape)}") from e
        elif _is_real_number(baseline):
            b = float(baseline)
            if not math.isfinite(b):
                raise ValueError(f"baseline must be finite, got {baseline}")
            adv = adv - b
        else:
            raise TypeError(f"baseline must be None, a real number or a floating tensor, got {type(baseline).__name__}")
        if adv.shape != logprobs.shape:
            raise ValueError(f"baseline of shape {tuple(torch.as_tensor(baseline).shape)} does not broadcast "
                             f"to rewards {tuple(rewards.shape)} without changing its shape")
    surrogate = -(adv.to(logprobs.dtype) * logprobs)
    if reduction == "mean":
        return surrogate.mean()
    if reduction == "sum":
        return surrogate.sum()
    return surrogate


def _finite(name: str, t: torch.Tensor) -> torch.Tensor:
    """:func:`taskloss.validation.check_finite` after a clear refusal of meta tensors (which have no values to check)."""
    check_not_meta(name, t)
    return check_finite(name, t)


def _is_real_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def leave_one_out_baseline(rewards: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``b_s = mean of the other S-1 rewards along dim`` (S ≥ 2): unbiased, since b_s does not depend on y_s.

    ``rewards - leave_one_out_baseline(rewards)`` equals ``S/(S-1) · (rewards - rewards.mean(dim))``.
    Raises ``TypeError`` for a non-floating tensor or a non-int ``dim``, ``ValueError`` for NaN/inf rewards, a
    ``dim`` outside ``[-ndim, ndim)`` or fewer than 2 samples along it. Derived in notebook
    05_policy_gradient_vs_zeroth_order.
    """
    check_floating("rewards", rewards)
    dim = check_int("dim", dim)
    if not -rewards.ndim <= dim < max(rewards.ndim, 1) or rewards.ndim == 0:
        raise ValueError(f"dim={dim} is out of range for rewards of shape {tuple(rewards.shape)}")
    if not is_transformed(rewards):
        _finite("rewards", rewards)
    S = rewards.shape[dim]
    if S < 2:
        raise ValueError(f"leave-one-out baseline needs at least 2 samples along dim {dim}, got {S}")
    return (rewards.sum(dim, keepdim=True) - rewards) / (S - 1)


class MovingAverageBaseline:
    """Exponential moving average of past mean rewards: ``b ← m·b + (1-m)·mean(R)``.

    ``baseline(rewards)`` returns the value computed from *previous* calls (0 before the first one) and then
    updates, so the returned baseline never depends on the rewards it is subtracted from (unbiased).
    """

    def __init__(self, momentum: float = 0.9):
        m = check_nonnegative("momentum", momentum)
        if m >= 1:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        self.momentum = m
        self.value: float | None = None

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        """The baseline for ``rewards`` (the running mean before this batch), then the mean updated."""
        check_floating("rewards", rewards)
        _finite("rewards", rewards)
        if rewards.numel() == 0:
            raise ValueError("rewards is empty")
        current = 0.0 if self.value is None else self.value
        mean = float(rewards.detach().mean())
        self.value = mean if self.value is None else self.momentum * self.value + (1 - self.momentum) * mean
        return torch.full_like(rewards, current)

    def state_dict(self) -> dict:
        """The momentum and the running value."""
        return {"momentum": self.momentum, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`; the momentum is checked as in the constructor, the value is None or finite."""
        if not isinstance(state, dict) or set(state) != {"momentum", "value"}:
            raise ValueError("MovingAverageBaseline state must be a dict with the keys 'momentum' and 'value'")
        m = check_nonnegative("momentum", state["momentum"])
        if m >= 1:
            raise ValueError(f"momentum must lie in [0, 1), got {m}")
        value = state["value"]
        if value is not None and not (_is_real_number(value) and math.isfinite(float(value))):
            raise ValueError(f"value must be None or a finite number, got {value!r}")
        self.momentum, self.value = m, None if value is None else float(value)


def _apply_baseline(rewards: torch.Tensor, baseline) -> torch.Tensor | None:
    """Resolve a baseline spec against rewards ``[S, ...]`` (samples along dim 0)."""
    if baseline is None:
        return None
    if isinstance(baseline, str):
        if baseline == "none":
            return None
        if baseline in ("loo", "leave_one_out"):
            return leave_one_out_baseline(rewards, 0)
        if baseline == "mean":   # batch mean including the sample itself (biased by a factor (S-1)/S)
            return rewards.mean(0, keepdim=True).expand_as(rewards)
        raise ValueError(f"baseline must be 'none', 'loo', 'mean', a MovingAverageBaseline or a tensor, "
                         f"got {baseline!r}")
    if isinstance(baseline, MovingAverageBaseline):
        return baseline(rewards)
    if isinstance(baseline, (torch.Tensor, int, float)) and not isinstance(baseline, bool):
        return torch.as_tensor(baseline, dtype=rewards.dtype, device=rewards.device).expand_as(rewards)
    raise TypeError(f"unsupported baseline {type(baseline).__name__}")


# ---------------------------------------------------------------------------------------- classification
def expected_reward(logits: torch.Tensor, reward_table: torch.Tensor) -> torch.Tensor:
    """Exact ``E_{y~softmax(logits)}[R(y)]`` per example → ``[N]``, for a per-class reward table ``[N, C]``.

    With ``reward_table = one_hot(target)`` this is the expected accuracy ``p_θ(target|x)``; its autograd
    gradient is the quantity REINFORCE estimates (used to check the estimator in notebook 05).
    """
    check_floating("logits", logits)
    if not isinstance(reward_table, torch.Tensor):
        raise TypeError(f"reward_table must be a torch.Tensor, got {type(reward_table).__name__}")
    if logits.ndim != 2 or reward_table.shape != logits.shape:
        raise ValueError(f"logits [N, C] and reward_table [N, C] must match, got {tuple(logits.shape)} "
                         f"and {tuple(reward_table.shape)}")
    if logits.numel() == 0:
        raise ValueError(f"logits is empty: shape {tuple(logits.shape)}")
    if not is_transformed(logits):     # value checks need .item(): impossible inside torch.func transforms
        _finite("logits", logits.detach())
        _finite("reward_table", reward_table)
    return (logits.softmax(-1) * reward_table.to(logits.dtype)).sum(-1)


@dataclass
class PGResult:
    """Output of a convenience step: ``loss`` (call ``.backward()``), the sampled outputs and their rewards."""

    loss: torch.Tensor
    samples: torch.Tensor
    rewards: torch.Tensor
    logprobs: torch.Tensor
    reward_mean: float


def classification_reinforce(logits: torch.Tensor, target: torch.Tensor, n_samples: int = 4, *,
                             reward: str | Callable = "accuracy", baseline="loo", mle_weight: float = 0.0,
                             generator: torch.Generator | None = None) -> PGResult:
    """REINFORCE for a categorical policy ``softmax(logits)`` over classes.

    ``logits`` ``[N, C]`` (differentiable), ``target`` ``[N]`` int. Draws ``S = n_samples`` labels per input
    (``samples [S, N]``). ``reward``: ``"accuracy"`` (per-example correctness), or a callable
    ``reward(samples [S, N], target [N])`` returning per-example rewards ``[S, N]`` or one batch-level reward
    per sampled label vector ``[S]`` (e.g. ``lambda s, t: macro_f1(s, t, C)``); for the latter the log-prob is
    the sum over the batch. ``baseline``: ``"loo"`` (default, needs S ≥ 2), ``"mean"``, ``"none"``, a
    :class:`MovingAverageBaseline` or a tensor. ``mle_weight`` adds ``w · cross_entropy(logits, target)``.
    """
    check_floating("logits", logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, C], got shape {tuple(logits.shape)}")
    if logits.shape[0] == 0:
        raise ValueError("logits is empty (batch size 0)")
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.dtype == torch.bool:
        raise TypeError("target must be an integer tensor of class ids")
    if target.shape != logits.shape[:1]:
        raise ValueError(f"batch sizes differ: logits {tuple(logits.shape)}, target {tuple(target.shape)}")
    S = check_int("n_samples", n_samples, minimum=1)
    check_nonnegative("mle_weight", mle_weight)
    check_generator("generator", generator, logits.device)
    _finite("logits", logits.detach())
    C = logits.shape[1]
    lo, hi = int(target.min()), int(target.max())
    if lo < 0 or hi >= C:
        raise ValueError(f"target holds class ids in [{lo}, {hi}], outside [0, C={C}) for logits of shape "
                         f"{tuple(logits.shape)}")
    logp_all = F.log_softmax(logits, -1)                                        # [N, C]
    samples = torch.multinomial(logp_all.detach().exp(), S, replacement=True, generator=generator).T  # [S, N]
    logp = logp_all.gather(1, samples.T).T                                      # [S, N]
    if reward == "accuracy":
        rewards = accuracy(samples, target, reduction="none").to(logits.dtype)
    elif callable(reward):
        rewards = torch.as_tensor(reward(samples, target), device=logits.device)
        if not rewards.is_floating_point():   # e.g. integer counts; floating rewards keep their dtype
            rewards = rewards.to(logits.dtype)
    else:
        raise ValueError(f"reward must be 'accuracy' or a callable, got {reward!r}")
    if rewards.shape == (S,):
        logp = logp.sum(1)
    elif rewards.shape != (S, logits.shape[0]):
        raise ValueError(f"reward must return shape ({S}, {logits.shape[0]}) or ({S},), got "
                         f"{tuple(rewards.shape)}")
    b = _apply_baseline(rewards, baseline)
    loss = reinforce_loss(logp, rewards, b)
    if mle_weight > 0:
        loss = loss + mle_weight * F.cross_entropy(logits, target)
    return PGResult(loss, samples, rewards, logp, float(rewards.mean()))


# ------------------------------------------------------------------------------------------------ sequences
def sequence_reinforce(model: torch.nn.Module, prefix: torch.Tensor, references, task_loss: Callable, *,
                       n_samples: int = 4, max_new_tokens: int = 16, eos_id: int | None, pad_id: int,
                       baseline="loo", mle_weight: float = 0.0, mle_continuations: torch.Tensor | None = None,
                       top_k: int | None = None, generator: torch.Generator | None = None) -> PGResult:
    """REINFORCE for an autoregressive LM: sample continuations, reward = ``-task_loss``.

    ``prefix`` ``[B, P]`` LongTensor; ``references``: what ``task_loss`` compares against, one per prefix (a
    list of token lists or a ``[B, T]`` tensor). For each prefix, ``S = n_samples`` continuations
    ``[S·B, max_new_tokens]`` are drawn with ``taskloss.lm.generate(..., greedy=False)`` (temperature 1,
    so the sampling distribution is the policy whose score we differentiate; ``top_k`` makes it a different
    policy and the estimator biased), scored by ``task_loss(samples, references_repeated) → [S·B]`` (lower is
    better, e.g. ``lambda h, r: edit_distance(h, r, eos_id=eos, pad_id=pad)``) and differentiated through
    ``taskloss.lm.sequence_logprob``. ``samples`` is returned as ``[S, B, max_new_tokens]``.
    A sampled ``pad_id`` token before EOS would be taken for padding by ``sequence_logprob`` (its log-prob
    dropped): use a pad token the model does not produce. ``mle_weight > 0`` adds ``w ×`` the per-token negative
    log-likelihood of ``mle_continuations [B, C]`` (padded with ``pad_id``).
    """
    if not isinstance(prefix, torch.Tensor) or prefix.ndim != 2:
        raise ValueError("prefix must be a [B, P] LongTensor")
    if isinstance(model, torch.nn.Module):
        check_not_meta("model", model)
    if not callable(task_loss):
        raise TypeError("task_loss must be a callable (hyp, ref) -> [N] losses")
    S = check_int("n_samples", n_samples, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_generator("generator", generator, prefix.device if isinstance(prefix, torch.Tensor) else None)
    check_nonnegative("mle_weight", mle_weight)
    B = prefix.shape[0]
    n_ref = references.shape[0] if isinstance(references, torch.Tensor) else len(references)
    if n_ref != B:
        raise ValueError(f"batch sizes differ: {B} prefixes, {n_ref} references")
    rep_prefix = prefix.repeat(S, 1)                                             # [S·B, P], sample-major
    samples = generate(model, rep_prefix, max_new_tokens, eos_id, pad_id, greedy=False, top_k=top_k,
                       generator=generator)
    rep_refs = references.repeat(S, 1) if isinstance(references, torch.Tensor) else list(references) * S
    with torch.no_grad():
        losses = torch.as_tensor(task_loss(samples, rep_refs), device=prefix.device)
    if losses.shape != (S * B,):
        raise ValueError(f"task_loss must return shape ({S * B},), got {tuple(losses.shape)}")
    if not losses.is_floating_point():
        losses = losses.to(torch.get_default_dtype())
    rewards = -losses.reshape(S, B)          # in the losses' own dtype (reinforce_loss casts the advantage)
    logp = sequence_logprob(model, rep_prefix, samples, pad_id, eos_id=eos_id).reshape(S, B)
    b = _apply_baseline(rewards, baseline)
    loss = reinforce_loss(logp, rewards, b)
    if mle_weight > 0:
        if mle_continuations is None:
            raise ValueError("mle_weight > 0 needs mle_continuations [B, C]")
        nll = -sequence_logprob(model, prefix, mle_continuations, pad_id, eos_id=eos_id)
        n_tok = (mle_continuations != pad_id).sum(1).clamp_min(1)
        loss = loss + mle_weight * (nll / n_tok).mean()
    return PGResult(loss, samples.reshape(S, B, -1), rewards, logp, float(rewards.mean()))
