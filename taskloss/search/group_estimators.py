r"""Group-sampled policy gradients for language models: REINFORCE with a mean baseline, RLOO, GRPO, Dr. GRPO and
token-level (DAPO) aggregation, as one family.

Every member starts from the score-function identity of :mod:`taskloss.search.policy_gradient`,

.. math::  \nabla_\theta\, \mathbb{E}_{y\sim p_\theta}[R(y)] = \mathbb{E}[(R(y) - b)\,\nabla_\theta \log p_\theta(y)],
           \qquad \log p_\theta(y) = \textstyle\sum_t \log p_\theta(y_t \mid y_{<t}),

draws a *group* of ``G`` completions per prompt, and differs only in three visible choices:

1. **the advantage** :math:`A_i` (:func:`group_advantages`): ``R_i`` minus the group mean (REINFORCE with a mean
   baseline: the sample's own reward is in its baseline, which shrinks the gradient by ``(G-1)/G``), minus the mean
   of the *other* rewards (RLOO: unbiased), and optionally divided by the group's standard deviation (GRPO);
2. **the aggregation** over tokens and sequences (:func:`policy_gradient_surrogate`): the sum of a sequence's token
   terms (REINFORCE, RLOO), their mean (GRPO's per-sequence length normalization ``1/|y_i|``), the sum over all
   tokens of the batch divided by their count (DAPO's token-level loss) or by a constant ``N·L_max`` (Dr. GRPO);
3. **the ratio** :math:`r_t = p_\theta(y_t|\cdot)/p_{\theta_\text{old}}(y_t|\cdot)` with PPO's clip
   ``min(r A, clip(r, 1-ε_low, 1+ε_high) A)``; on-policy (``old_logps=None``) ``r = 1`` with gradient ``∇log p``,
   so the clip changes nothing and the surrogate's gradient is the estimator.

Each estimator function returns the surrogate *loss* (lower is better) whose gradient is minus the estimate of
``∇ E[R]``, so ``loss.backward(); optimizer.step()`` ascends the expected reward. The correspondence with TRL 1.16's
``GRPOTrainer`` (checked to float round-off by ``tests/search/test_trl_parity.py``):

======================================  ==========================================================================
ours                                    TRL ``GRPOConfig``
======================================  ==========================================================================
:func:`grpo_loss`                       ``loss_type="grpo"``, ``scale_rewards="group"`` (``epsilon``, ``epsilon_high``)
:func:`dr_grpo_loss`                    ``loss_type="dr_grpo"``, ``scale_rewards="none"``, ``max_completion_length``
:func:`dapo_loss`                       ``loss_type="dapo"`` (TRL's default) and ``loss_type="bnpo"``: both divide by
                                        the batch's token count (they differ only across accumulation steps/ranks)
``scale="batch"``                       ``scale_rewards="batch"``
:func:`rloo_loss`                       no ``GRPOTrainer`` option (TRL's separate ``RLOOTrainer``)
:func:`reinforce_mean_baseline_loss`    ``loss_type="dr_grpo"``'s advantage with a per-sequence *sum* (no option)
======================================  ==========================================================================

Sources: Williams, "Simple statistical gradient-following algorithms…", Machine Learning 1992 (REINFORCE); Kool,
van Hoof & Welling, "Buy 4 REINFORCE samples, get a baseline for free!", ICLR workshop 2019 and Ahmadian et al.,
"Back to basics: revisiting REINFORCE style optimization…", arXiv:2402.14740 (RLOO); Shao et al., "DeepSeekMath",
arXiv:2402.03300 (GRPO); Liu et al., "Understanding R1-Zero-like training: a critical perspective",
arXiv:2503.20783 (Dr. GRPO); Yu et al., "DAPO", arXiv:2503.14476 (token-level loss, clip-higher); Schulman et al.,
"Proximal policy optimization algorithms", arXiv:1707.06347 (the clip). Derived in notebook
18_group_policy_gradients, which measures each one's bias and variance against the exact gradient
(:mod:`taskloss.search.exact_sequences`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from taskloss.lm.generation import generate
from taskloss.validation import (
    check_choice,
    check_finite,
    check_floating,
    check_generator,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_positive,
    is_transformed,
)

__all__ = [
    "BASELINES", "SCALES", "AGGREGATIONS", "GRPO_EPS", "completion_mask", "token_logprobs", "completion_logprobs",
    "sample_groups", "group_advantages", "policy_gradient_surrogate", "reinforce_mean_baseline_loss", "rloo_loss",
    "grpo_loss", "dr_grpo_loss", "dapo_loss",
]

BASELINES = ("none", "mean", "loo")
"""Baselines of :func:`group_advantages`: none, the group mean (self included), the leave-one-out mean."""
SCALES = ("none", "group", "batch")
"""Reward scalings of :func:`group_advantages` (TRL's ``scale_rewards``)."""
AGGREGATIONS = ("sequence_sum", "sequence_mean", "token_mean", "constant")
"""Token aggregations of :func:`policy_gradient_surrogate`."""
GRPO_EPS = 1e-4
"""The constant added to the group's standard deviation (TRL's value), so that a group of equal rewards gives 0."""


# ------------------------------------------------------------------------------------------ log-probabilities
def completion_mask(completions: torch.Tensor, eos_id: int | None, pad_id: int | None) -> torch.Tensor:
    """Which completion positions count: ``[N, C]`` float 0/1, up to and including each row's first EOS.

    ``-100`` and ``pad_id`` positions (after EOS, or a ``pad_id`` the model never samples) are dropped; the first
    ``eos_id`` counts even if it equals ``pad_id``. Derived in notebook 18_group_policy_gradients.
    """
    if not isinstance(completions, torch.Tensor) or completions.is_floating_point() or completions.ndim != 2:
        raise TypeError("completions must be an integer tensor [N, C]")
    keep = completions != -100
    if pad_id is not None:
        keep &= completions != check_int("pad_id", pad_id, minimum=0)
    if eos_id is not None:
        is_eos = completions == check_int("eos_id", eos_id, minimum=0)
        after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        keep = (keep | is_eos) & ~after
    return keep.float()


def token_logprobs(logits, completions: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / T)`` at each completion token: ``[N, C, V]`` (tensor or ``ModelOutput``) → ``[N, C]``.

    ``logits[:, t]`` must predict ``completions[:, t]``; ``-100`` entries get log-prob 0 (mask them out).
    Derived in notebook 18_group_policy_gradients.
    """
    logits = getattr(logits, "logits", logits)
    check_floating("logits", logits)
    if logits.ndim != 3 or completions.shape != logits.shape[:2]:
        raise ValueError(f"logits [N, C, V] and completions [N, C] must match, got {tuple(logits.shape)} and "
                         f"{tuple(completions.shape)}")
    check_positive("temperature", temperature)
    ids = completions.long().clamp_min(0)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = F.log_softmax(logits / temperature, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return torch.where(completions == -100, torch.zeros_like(logp), logp)


def completion_logprobs(model: nn.Module, prompts: torch.Tensor, completions: torch.Tensor, *,
                        attention_mask: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Per-token ``log p_θ(y_t | x, y_<t)`` of ``completions [N, C]`` after ``prompts [N, P]`` → ``[N, C]``.

    ``model(ids)`` may return logits ``[N, P+C, V]`` or a ``ModelOutput`` (a Hugging Face causal LM, which then also
    receives ``attention_mask`` ``[N, P+C]`` when given, e.g. for left-padded prompts). ``-100`` completion entries
    are fed as token 0 and scored 0. Derived in notebook 18_group_policy_gradients.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_not_meta("model", model)
    for name, t in (("prompts", prompts), ("completions", completions)):
        if not isinstance(t, torch.Tensor) or t.is_floating_point() or t.ndim != 2:
            raise TypeError(f"{name} must be an integer tensor [N, L]")
    if prompts.shape[0] != completions.shape[0] or prompts.shape[1] < 1:
        raise ValueError(f"prompts {tuple(prompts.shape)} and completions {tuple(completions.shape)} need the same "
                         "N and at least one prompt token")
    P = prompts.shape[1]
    ids = torch.cat([prompts, completions.clamp_min(0)], dim=1)[:, :-1]
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask[:, :-1]}
    logits = model(ids, **kwargs)
    return token_logprobs(getattr(logits, "logits", logits)[:, P - 1:], completions, temperature)


@torch.no_grad()
def sample_groups(model: nn.Module, prompts: torch.Tensor, group_size: int, max_new_tokens: int, *,
                  eos_id: int | None, pad_id: int, generator: torch.Generator | None = None):
    """``group_size`` sampled completions per prompt, groups consecutive (TRL's layout), by :func:`taskloss.lm.generate`.

    Returns ``(prompts_rep [N·G, P], completions [N·G, C], mask [N·G, C])`` with temperature 1 (the policy itself).
    For a Hugging Face model, wrap it in :class:`taskloss.lm.CausalLM` or sample with its own ``generate`` and pass
    the completions to the losses directly. Derived in notebook 18_group_policy_gradients.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module with vocab_size and max_len (a taskloss LM, a CausalLM wrapper "
                        f"or a TabularPolicy), got {type(model).__name__}")
    if not isinstance(prompts, torch.Tensor) or prompts.dtype.is_floating_point or prompts.is_complex() \
            or prompts.ndim != 2:
        raise TypeError(f"prompts must be an integer tensor [N, P] of token ids, got "
                        f"{getattr(prompts, 'dtype', type(prompts).__name__)} {tuple(getattr(prompts, 'shape', ()))}")
    G = check_int("group_size", group_size, minimum=1)
    check_generator("generator", generator, prompts.device)
    rep = prompts.repeat_interleave(G, dim=0)
    comp = generate(model, rep, max_new_tokens, eos_id, pad_id, greedy=False, generator=generator)
    return rep, comp, completion_mask(comp, eos_id, pad_id)


# ------------------------------------------------------------------------------------------------ advantages
def _check_rewards(rewards: torch.Tensor, group_size: int, min_group: int) -> tuple[torch.Tensor, int]:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    check_floating("rewards", rewards)
    if rewards.ndim != 1 or rewards.numel() == 0:
        raise ValueError(f"rewards must be a non-empty [N] tensor, got shape {tuple(rewards.shape)}")
    G = check_int("group_size", group_size, minimum=min_group)
    if rewards.numel() % G:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {G}")
    if not is_transformed(rewards):
        check_finite("rewards", rewards)
    return rewards.detach().reshape(-1, G), G


def group_advantages(rewards: torch.Tensor, group_size: int, *, baseline: str = "mean", scale: str = "none",
                     eps: float = GRPO_EPS) -> torch.Tensor:
    """Advantages ``[N]`` of rewards ``[N]`` laid out as consecutive groups of ``group_size`` (one group per prompt).

    ``baseline``: ``"none"`` (``A = R``), ``"mean"`` (``R_i − mean_j R_j``, self included), ``"loo"``
    (``R_i − mean_{j≠i} R_j = G/(G−1)·(R_i − mean)``). ``scale``: ``"none"``, ``"group"`` (divide by the group's
    standard deviation with Bessel's correction, plus ``eps``: GRPO), ``"batch"`` (the whole batch's). A baseline
    or a scale needs ``group_size ≥ 2``. Treated as constants (detached). Derived in notebook 18_group_policy_gradients.
    """
    check_choice("baseline", baseline, BASELINES)
    check_choice("scale", scale, SCALES)
    check_positive("eps", eps)
    need = 2 if (baseline != "none" or scale == "group") else 1
    R, G = _check_rewards(rewards, group_size, need)
    if baseline == "none":
        A = R
    elif baseline == "mean":
        A = R - R.mean(1, keepdim=True)
    else:
        A = R - (R.sum(1, keepdim=True) - R) / (G - 1)
    if scale == "group":
        A = A / (R.std(1, keepdim=True) + eps)
    elif scale == "batch":
        if R.numel() < 2:
            raise ValueError("scale='batch' needs at least 2 rewards")
        A = A / (R.std() + eps)
    return A.reshape(-1)


# ------------------------------------------------------------------------------------------------ surrogate
def _check_tokens(logps, mask, advantages, old_logps):
    check_floating("logps", logps)
    if logps.ndim != 2 or logps.numel() == 0:
        raise ValueError(f"logps must be a non-empty [N, C] tensor, got shape {tuple(logps.shape)}")
    if not isinstance(mask, torch.Tensor) or mask.shape != logps.shape:
        raise ValueError(f"mask must be a tensor of the logps' shape {tuple(logps.shape)}")
    if not isinstance(advantages, torch.Tensor) or advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages must be a tensor [N={logps.shape[0]}]")
    check_floating("advantages", advantages)
    if old_logps is not None:
        check_floating("old_logps", old_logps)
        if old_logps.shape != logps.shape:
            raise ValueError(f"old_logps shape {tuple(old_logps.shape)} != logps shape {tuple(logps.shape)}")
    if not is_transformed(logps):
        m = mask.detach()
        if not bool(((m == 0) | (m == 1)).all()):
            raise ValueError("mask must hold only 0 and 1")
        for name, t in (("logps", logps), ("advantages", advantages), ("old_logps", old_logps)):
            if t is not None:
                check_finite(name, t.detach())


def policy_gradient_surrogate(logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, *,
                              aggregation: str = "sequence_mean", old_logps: torch.Tensor | None = None,
                              clip_low: float | None = None, clip_high: float | None = None,
                              max_length: int | None = None) -> torch.Tensor:
    """The family's one surrogate loss; its gradient is minus the estimate of ``∇ E[R]``.

    Args:
        logps: per-token log-probs ``[N, C]`` of the sampled completions (differentiable).
        mask: ``[N, C]`` 0/1 (bool or floating): which tokens count.
        advantages: ``[N]`` constants, e.g. from :func:`group_advantages`.
        aggregation: ``"sequence_sum"`` (mean over sequences of the token sum: the score function of log p(y)),
            ``"sequence_mean"`` (GRPO: each sequence's token mean, ``1/|y_i|``), ``"token_mean"`` (DAPO: the sum over
            all tokens divided by their number), ``"constant"`` (Dr. GRPO: the sum divided by ``N · max_length``).
        old_logps: the sampling policy's per-token log-probs (``None``: ``logps`` detached, i.e. on-policy).
        clip_low: PPO's ε below 1 (``None``: that side unclipped; both ``None``, the default: no clip).
        clip_high: PPO's ε above 1 (DAPO's clip-higher takes it larger than ``clip_low``).
        max_length: the constant of ``"constant"`` (default ``C``).

    Returns:
        A scalar loss. Raises ``TypeError``/``ValueError`` on non-floating, mismatched, NaN/inf or non-0/1 inputs.
        Derived in notebook 18_group_policy_gradients.
    """
    check_choice("aggregation", aggregation, AGGREGATIONS)
    _check_tokens(logps, mask, advantages, old_logps)
    m = mask.to(logps.dtype)
    A = advantages.detach().to(logps.dtype).unsqueeze(1)                       # [N, 1]
    old = logps.detach() if old_logps is None else old_logps.detach().to(logps.dtype)
    ratio = torch.exp(logps - old)                                             # 1 on-policy, gradient ∇log p
    per_token = -ratio * A
    if clip_low is not None or clip_high is not None:                          # PPO: the pessimistic of the two
        lo = 1 - check_nonnegative("clip_low", clip_low) if clip_low is not None else None
        hi = 1 + check_nonnegative("clip_high", clip_high) if clip_high is not None else None
        per_token = torch.maximum(per_token, -torch.clamp(ratio, lo, hi) * A)
    per_token = per_token * m
    if aggregation == "sequence_sum":
        return per_token.sum(1).mean()
    if aggregation == "sequence_mean":                                         # GRPO's 1/|y_i|
        return (per_token.sum(1) / m.sum(1).clamp_min(1)).mean()
    if aggregation == "token_mean":                                            # DAPO's 1/Σ_i |y_i|
        return per_token.sum() / m.sum().clamp_min(1)
    L = logps.shape[1] if max_length is None else check_int("max_length", max_length, minimum=1)
    return per_token.sum() / (logps.shape[0] * L)                              # Dr. GRPO's constant


# ------------------------------------------------------------------------------------------------ estimators
def reinforce_mean_baseline_loss(logps, mask, rewards, group_size: int) -> torch.Tensor:
    """REINFORCE with the group-mean baseline (self included): ``−mean_i (R_i − R̄) log p(y_i)``.

    Its expectation is ``(G−1)/G · ∇E[R]``: biased by a known factor. Args as :func:`grpo_loss`. Derived in notebook
    18_group_policy_gradients.
    """
    A = group_advantages(rewards, group_size, baseline="mean")
    return policy_gradient_surrogate(logps, mask, A, aggregation="sequence_sum")


def rloo_loss(logps, mask, rewards, group_size: int) -> torch.Tensor:
    """RLOO: ``−mean_i (R_i − mean_{j≠i} R_j) log p(y_i)``, unbiased for ``∇E[R]`` (the baseline skips ``y_i``).

    Args as :func:`grpo_loss`. Derived in notebook 18_group_policy_gradients.
    """
    A = group_advantages(rewards, group_size, baseline="loo")
    return policy_gradient_surrogate(logps, mask, A, aggregation="sequence_sum")


def grpo_loss(logps, mask, rewards, group_size: int, *, old_logps=None, clip_low: float | None = 0.2,
              clip_high: float | None = 0.2, eps: float = GRPO_EPS, scale: str = "group") -> torch.Tensor:
    """GRPO: advantages ``(R_i − R̄)/(std + eps)``, each sequence's token mean, the mean over sequences, PPO clip.

    Args:
        logps: per-token log-probs ``[N, C]`` (differentiable), ``N`` = groups × ``group_size``, groups consecutive.
        mask: ``[N, C]`` 0/1.
        rewards: ``[N]`` (higher is better; constants).
        group_size: completions per prompt ``G ≥ 2``.
        old_logps: the sampling policy's per-token log-probs (``None``: on-policy).
        clip_low: PPO's ε below 1 (TRL's ``epsilon``; ``None``: unclipped).
        clip_high: PPO's ε above 1 (TRL's ``epsilon_high``; ``None``: unclipped).
        eps: added to the standard deviation.
        scale: ``"group"`` (GRPO), ``"batch"`` or ``"none"``.

    Returns:
        The scalar surrogate. Biased for ``∇E[R]`` twice: by ``1/std`` (a function of the group's own rewards) and
        by ``1/|y_i|``. Derived in notebook 18_group_policy_gradients.
    """
    A = group_advantages(rewards, group_size, baseline="mean", scale=scale, eps=eps)
    return policy_gradient_surrogate(logps, mask, A, aggregation="sequence_mean", old_logps=old_logps,
                                     clip_low=clip_low, clip_high=clip_high)


def dr_grpo_loss(logps, mask, rewards, group_size: int, *, old_logps=None, clip_low: float | None = 0.2,
                 clip_high: float | None = 0.2, max_length: int | None = None) -> torch.Tensor:
    """Dr. GRPO: advantages ``R_i − R̄`` (no std), the token sum divided by the constant ``N · max_length``.

    Equals ``(G−1)/(G · max_length)`` times ∇E[R] in expectation (the mean baseline's factor and a constant
    step size). Args as :func:`grpo_loss`; ``max_length`` defaults to ``C``. Derived in notebook
    18_group_policy_gradients.
    """
    A = group_advantages(rewards, group_size, baseline="mean")
    return policy_gradient_surrogate(logps, mask, A, aggregation="constant", old_logps=old_logps,
                                     clip_low=clip_low, clip_high=clip_high, max_length=max_length)


def dapo_loss(logps, mask, rewards, group_size: int, *, old_logps=None, clip_low: float | None = 0.2,
              clip_high: float | None = 0.28, eps: float = GRPO_EPS, scale: str = "group") -> torch.Tensor:
    """Token-level (DAPO) loss: GRPO's advantages, every token of the batch weighted ``1/Σ_i |y_i|``, clip-higher.

    Args as :func:`grpo_loss`. The batch-wide token count depends on every sampled length (as the std does on every
    reward), so the estimate is biased, through the batch's count instead of GRPO's per-sequence ``1/|y_i|``.
    Derived in notebook 18_group_policy_gradients.
    """
    A = group_advantages(rewards, group_size, baseline="mean", scale=scale, eps=eps)
    return policy_gradient_surrogate(logps, mask, A, aggregation="token_mean", old_logps=old_logps,
                                     clip_low=clip_low, clip_high=clip_high)
