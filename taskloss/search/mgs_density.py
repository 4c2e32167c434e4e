"""The functional core of MLE-guided parameter search (MGS): the proposal density, the importance weights, the
effective sample size, and the per-candidate seeds every rank agrees on.

Derived in notebook 02_importance_sampling_and_mgs. Source: *MLE-guided parameter search for task loss
minimization in neural sequence modeling* (Welleck & Cho, AAAI 2021). The proposal is
q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I) per parameter tensor t (``density="mixture"``: the true density;
``"unit_sigma"``: the reference code's formula, σ taken as 1 and constants dropped; ``"flat"``, MGS's default:
log q ≡ 0, the weights of the proposal tilted by the task loss — :mod:`taskloss.search.mgs` says when each is
right); the weights are
w_k ∝ exp(−[l(θ+Δθ_k) − l(θ)]/α) / q(Δθ_k), normalized in log space by
:func:`taskloss.sampling.update.normalized_log_weights` (the self-normalized weights of notebook
01_optimization_as_sampling; their effective sample size is :func:`taskloss.sampling.update.effective_sample_size`).
Everything is float64 through ``logsumexp``. The optimizer step built on them is :class:`taskloss.search.mgs.MGS`;
its fast path takes the same formulas on Python floats (:func:`log_q_floats`, :func:`checked_shift_floats`,
:func:`log_weights_floats`: K numbers cost fewer microseconds so than as tensors), tested equal to these.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from taskloss.sampling.update import normalized_log_weights
from taskloss.validation import all_finite, check_bool, check_choice, check_not_meta, check_positive, check_probability

__all__ = ["mixture_log_density", "mgs_weights", "DENSITIES", "log_q_from_sq", "log_q_floats", "checked_shift_floats",
           "log_weights_floats", "candidate_seeds", "uniform_from_seed", "mle_components"]

#: the log-densities the weights can use (:func:`~taskloss.search.mgs_density.log_q_from_sq`); ``"flat"`` is :class:`~taskloss.search.mgs.MGS`'s default
DENSITIES = ("flat", "mixture", "unit_sigma")
_LOG_2PI = math.log(2 * math.pi)
_STRATIFIED_EPS = 1e-9       # ⌈x⌉ of a product that should be an integer, robust to its rounding


# ------------------------------------------------------------------------------------------ functional core
def log_q_from_sq(d0: Tensor, d1: Tensor, sigma: Tensor, numel: Tensor, mix: float, density: str) -> Tensor:
    """Log q from squared distances to the two means (checked inputs; :func:`mixture_log_density` checks them).

    A tensor with σ_t = 0 is not perturbed: component 0 puts all its mass on Δθ_t = 0 and component 1 on
    Δθ_t = −g_t. Densities are taken with respect to Lebesgue measure on the perturbed tensors times the counting
    measure on these atoms, so such a tensor contributes a factor 1 to a component whose atom it sits on
    (``d0_t == 0`` resp. ``d1_t == 0``, exactly) and 0 (log −inf) to one it misses. For MGS, where σ_t = 0 only
    when g_t = 0 (``sigma_mode="relative"``) and then Δθ_t = 0, both atoms coincide and the factor is 1.

    Args:
        d0: float64 ``[..., T]``, ‖Δθ_t‖² per tensor t.
        d1: float64 ``[..., T]``, ‖Δθ_t + g_t‖² per tensor t.
        sigma: float64 ``[T]``, σ_t.
        numel: float64 ``[T]``, the number of entries of each tensor.
        mix: λ, the weight of the zero-centred component.
        density: ``"flat"`` (log q taken as 0: the weights are a softmax of the task term alone, the estimator of
            the proposal tilted by the task loss, q·e^{−Δl/α}), ``"mixture"`` or ``"unit_sigma"``.

    Returns:
        float64 ``[...]`` log q.
    """
    if density == "flat":
        return torch.zeros(d0.shape[:-1], dtype=torch.float64, device=d0.device)
    lm0, lm1 = math.log(mix) if mix > 0 else -math.inf, math.log1p(-mix) if mix < 1 else -math.inf
    sig = sigma.tolist()
    if density == "unit_sigma":
        l0, l1 = -0.5 * d0.sum(-1), -0.5 * d1.sum(-1)
    elif all(s > 0 for s in sig):      # every tensor perturbed (the usual case): two matrix-vector products
        # the T per-tensor constants in Python floats (a small model's step is made of such tiny operations)
        inv = torch.tensor([-0.5 / (s * s) for s in sig], dtype=torch.float64, device=d0.device)
        const = -math.fsum(n * (math.log(s) + 0.5 * _LOG_2PI) for n, s in zip(numel.tolist(), sig))
        return torch.logaddexp(d0 @ inv + (const + lm0), d1 @ inv + (const + lm1))
    else:
        live = sigma > 0
        s_safe = torch.where(live, sigma, torch.ones_like(sigma))
        const = -(numel * (torch.log(s_safe) + 0.5 * _LOG_2PI))
        atom0 = torch.where(d0 == 0, torch.zeros_like(d0), torch.full_like(d0, -math.inf))
        atom1 = torch.where(d1 == 0, torch.zeros_like(d1), torch.full_like(d1, -math.inf))
        l0 = torch.where(live, -0.5 * d0 / s_safe ** 2 + const, atom0).sum(-1)
        l1 = torch.where(live, -0.5 * d1 / s_safe ** 2 + const, atom1).sum(-1)
    return torch.logaddexp(l0 + lm0, l1 + lm1)


def _logaddexp(a: float, b: float) -> float:
    """log(eᵃ + eᵇ) of two Python floats (−inf allowed)."""
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


def log_q_floats(d0: list[list[float]], d1: list[list[float]], sig: list[float], numel: list[float], mix: float,
                 density: str) -> list[float] | None:
    """:func:`~taskloss.search.mgs_density.log_q_from_sq` on Python floats, one candidate per row of ``d0``/``d1``.

    The step's few numbers (K candidates × T tensors) cost fewer microseconds this way than as a dozen tiny tensor
    operations, and the sums over tensors are exact (``math.fsum``).

    Args:
        d0: per candidate, ‖Δθ_t‖² per tensor t.
        d1: per candidate, ‖Δθ_t + g_t‖² per tensor t.
        sig: σ_t per tensor.
        numel: entries per tensor.
        mix: λ.
        density: ``"flat"``, ``"mixture"`` or ``"unit_sigma"``.

    Returns:
        log q per candidate, or ``None`` when some σ_t = 0 under ``density="mixture"`` (the atoms of
        :func:`~taskloss.search.mgs_density.log_q_from_sq`, which handles them).
    """
    if density == "flat":
        return [0.0] * len(d0)
    lm0, lm1 = math.log(mix) if mix > 0 else -math.inf, math.log1p(-mix) if mix < 1 else -math.inf
    if density == "unit_sigma":
        return [_logaddexp(-0.5 * math.fsum(a) + lm0, -0.5 * math.fsum(b) + lm1) for a, b in zip(d0, d1)]
    if not all(s > 0 for s in sig):
        return None
    inv = [-0.5 / (s * s) for s in sig]
    const = -math.fsum(n * (math.log(s) + 0.5 * _LOG_2PI) for n, s in zip(numel, sig))
    c0, c1 = const + lm0, const + lm1
    return [_logaddexp(math.fsum(x * i for x, i in zip(a, inv)) + c0, math.fsum(x * i for x, i in zip(b, inv)) + c1)
            for a, b in zip(d0, d1)]


def _as_list(x) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, dict):
        return list(x.values())
    return list(x)


def mixture_log_density(delta, grad, sigma, mix: float = 0.5, *, density: str = "mixture") -> Tensor:
    """Log density of the MGS proposal q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I) at Δθ, summed over tensors.

    ``delta``: a tensor, a sequence or a dict of tensors (one per parameter tensor t), each shaped like the
    matching ``grad`` tensor (one candidate → float64 scalar) or with an extra leading candidate dimension
    ``[K, *shape]`` (→ float64 ``[K]``). ``grad``: the surrogate gradient g (same structure, without K).
    ``sigma``: one float for all tensors or one per tensor. σ_t = 0 marks an unperturbed tensor: its two
    components are the atoms Δθ_t = 0 and Δθ_t = −g_t, so a candidate whose tensor t sits on neither has
    density 0 (log q = −inf, which :func:`mgs_weights` refuses: such a Δθ cannot come from q); see
    :func:`~taskloss.search.mgs_density.log_q_from_sq`. This is the density MGS uses, where σ_t = 0 happens only with g_t = 0 and Δθ_t = 0.
    ``mix`` = λ, the weight of the zero-centred component. ``density="mixture"``: the true density with σ_t
    (normalizing constants included); ``"unit_sigma"``: the reference code's formula (σ taken as 1, constants
    dropped); ``"flat"``: 0 for every candidate (the weights then target q tilted by the task loss) — see the
    module docstring of :mod:`taskloss.search.mgs`. Computed in float64 through ``logsumexp`` (no underflow).
    Derived in notebook 02_importance_sampling_and_mgs.
    """
    check_choice("density", density, DENSITIES)
    mix = check_probability("mix", mix)
    for name, value in (("delta", delta), ("grad", grad)):
        if not isinstance(value, (Tensor, list, tuple, dict)):
            raise TypeError(f"{name} must be a tensor or a sequence of tensors, got {type(value).__name__}")
        check_not_meta(name, value)
    deltas, grads = _as_list(delta), _as_list(grad)
    if len(deltas) != len(grads) or not deltas:
        raise ValueError(f"delta and grad must hold the same non-zero number of tensors, got "
                         f"{len(deltas)} and {len(grads)}")
    if isinstance(sigma, bool) or isinstance(sigma, str):
        raise TypeError(f"sigma must be a number or a sequence of numbers, got {type(sigma).__name__}")
    if isinstance(sigma, Tensor):
        check_not_meta("sigma", sigma)
        if sigma.is_complex():
            raise TypeError("sigma must be real, got a complex tensor")
        sigma = sigma.detach().reshape(-1).tolist()
        sigma = sigma[0] if len(sigma) == 1 else sigma
    if isinstance(sigma, (int, float)):
        sig = [float(sigma)] * len(grads)
    else:
        try:
            sig = [float(s) for s in sigma]
        except (TypeError, ValueError) as e:
            raise TypeError(f"sigma must be a number or a sequence of numbers, got {sigma!r}") from e
    if len(sig) != len(grads):
        raise ValueError(f"sigma must be a float or hold one value per tensor ({len(grads)}), got {len(sig)}")
    if any(not math.isfinite(s) or s < 0 for s in sig):
        raise ValueError(f"sigma must be finite and >= 0, got {sig}")
    for name, ts in (("delta", deltas), ("grad", grads)):
        for t, x in enumerate(ts):
            if not isinstance(x, Tensor):
                raise TypeError(f"{name}[{t}] must be a torch.Tensor, got {type(x).__name__}")
            if not x.is_floating_point():
                raise TypeError(f"{name}[{t}] must be a floating tensor, got dtype {x.dtype}")
    batched = deltas[0].ndim == grads[0].ndim + 1
    if batched and deltas[0].shape[0] == 0:
        raise ValueError("delta holds no candidate (leading dimension K = 0)")
    d0, d1 = [], []
    for t, (d, g) in enumerate(zip(deltas, grads)):
        if tuple(d.shape[int(batched):]) != tuple(g.shape) or (d.ndim != g.ndim + int(batched)):
            raise ValueError(f"delta[{t}] has shape {tuple(d.shape)}, expected "
                             f"{('[K] + ' if batched else '') + str(tuple(g.shape))}")
        dd = d.detach().double().reshape(d.shape[0], -1) if batched else d.detach().double().reshape(1, -1)
        gg = g.detach().double().reshape(1, -1).to(dd.device)
        if not all_finite(dd) or not all_finite(gg):
            raise ValueError(f"delta[{t}] or grad[{t}] contains NaN or inf")
        d0.append(dd.square().sum(1))
        d1.append((dd + gg).square().sum(1))
    dev = d0[0].device
    out = log_q_from_sq(torch.stack(d0, -1), torch.stack(d1, -1), torch.tensor(sig, dtype=torch.float64,
                         device=dev), torch.tensor([float(g.numel()) for g in grads], dtype=torch.float64,
                         device=dev), mix, density)
    return out if batched else out[0]


def _real(name: str, x) -> Tensor:
    """``x`` (a tensor, number or sequence of numbers) as a float64 tensor; ``TypeError`` for anything else."""
    if isinstance(x, Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
        return x.detach().to(torch.float64)
    if isinstance(x, (str, bytes, bool)):
        raise TypeError(f"{name} must be real numbers, got {type(x).__name__}")
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{name} must be real numbers, got {type(x).__name__}") from e


def mgs_weights(task_losses, base_loss, log_q, alpha: float, *, log: bool = False) -> Tensor:
    """Self-normalized importance weights of the MGS candidates, float64 ``[K]``.

    w_k ∝ exp(−[l_k − l(θ)]/α) / q(Δθ_k), normalized in log space (``logsumexp``): no overflow or NaN for tiny α
    or huge losses. ``task_losses``: ``[K]`` l(θ+Δθ_k) (``+inf`` allowed: weight 0); ``base_loss``: l(θ) (it
    cancels after normalization but must be finite); ``log_q``: ``[K]`` log q(Δθ_k); ``alpha`` > 0 the
    temperature. ``log=True`` returns the normalized log-weights. Derived in notebook 02.
    """
    log = check_bool("log", log)
    alpha = check_positive("alpha", alpha)
    L = _real("task_losses", task_losses)
    lq = _real("log_q", log_q).to(L.device)
    b = _real("base_loss", base_loss).to(L.device)
    if L.ndim != 1 or L.numel() == 0:
        raise ValueError(f"task_losses must be a non-empty 1-D tensor [K], got shape {tuple(L.shape)}")
    if lq.shape != L.shape:
        raise ValueError(f"log_q must have shape {tuple(L.shape)}, got {tuple(lq.shape)}")
    if b.numel() != 1 or not all_finite(b):
        raise ValueError(f"base_loss must be a finite scalar, got {b}")
    shift = checked_shift_floats(L.tolist(), lq.tolist())
    out = normalized_log_weights(torch.sub(L, shift).div_(-alpha), lq)
    return out if log else out.exp()


def checked_shift_floats(losses: list[float], lqs: list[float]) -> float:
    """The value checks of :func:`mgs_weights`, on Python floats, and the shift of the log-weights.

    Args:
        losses: the task losses l(θ+Δθ_k).
        lqs: the log-densities log q(Δθ_k).

    Returns:
        The smallest finite loss (subtracted before the weights are formed; it cancels, like l(θ)).

    Raises:
        ValueError: a NaN or −inf loss, every loss +inf, or a non-finite log q.
    """
    if any(x != x or x == -math.inf for x in losses):
        raise ValueError(f"task_losses contain NaN or -inf: {losses}")
    finite = [x for x in losses if x != math.inf]
    if not finite:
        raise ValueError("every candidate has an infinite task loss; no weight can be formed")
    if not all(math.isfinite(x) for x in lqs):
        raise ValueError(f"log_q must be finite, got {lqs}")
    return min(finite)


def log_weights_floats(losses: list[float], lqs: list[float], alpha: float, shift: float) -> list[float]:
    """The normalized log-weights of :func:`mgs_weights` on Python floats, the log-sum-exp taken with ``math.fsum``.

    Args:
        losses: the task losses (checked by :func:`checked_shift_floats`).
        lqs: the log-densities log q.
        alpha: the temperature α > 0.
        shift: the smallest finite loss (:func:`checked_shift_floats`).

    Returns:
        log w_k = −(l_k − shift)/α − log q_k − logsumexp_j(…), one per candidate.
    """
    x = [-(L - shift) / alpha - q for L, q in zip(losses, lqs)]      # a +inf loss gives −inf: weight 0
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


# ------------------------------------------------------------------------------------------ candidate seeds
def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def candidate_seeds(base: int, step: int, n: int) -> list[int]:
    """The noise seeds of the candidates k = 0..n−1 of a step, the same on every rank.

    The SplitMix64 hash sm(sm(sm(base) ^ step) ^ k) >> 1 < 2⁶³ of (base seed, step, candidate), its common part
    computed once.

    Args:
        base: the base seed.
        step: the step counter.
        n: the number of candidates.

    Returns:
        ``n`` seeds in ``[0, 2⁶³)``.
    """
    h = _splitmix64(_splitmix64(base) ^ step)
    return [_splitmix64(h ^ k) >> 1 for k in range(n)]


def uniform_from_seed(seed: int) -> float:
    """A U[0, 1) draw determined by ``seed`` (a candidate's mixture component), identical on every rank.

    Args:
        seed: the candidate's seed (:func:`candidate_seeds`).

    Returns:
        A float in ``[0, 1)``.
    """
    return (_splitmix64(seed ^ 0x5DEECE66D) >> 11) / 2.0 ** 53


def mle_components(seeds: list[int], mix: float, assignment: str, include_mle: bool) -> list[bool]:
    """Which candidates come from the MLE-centred component (candidate 0 always, with ``include_mle``).

    Args:
        seeds: the candidates' seeds (:func:`candidate_seeds`).
        mix: λ, the probability of the zero-centred component.
        assignment: ``"random"`` (a U[0, 1) draw from the seed ≥ λ) or ``"stratified"`` (⌈j(1−λ)⌉ MLE-centred
            among the first j drawn candidates).
        include_mle: candidate 0 is the exact step −g.

    Returns:
        One flag per candidate.
    """
    out, r = [], 1.0 - mix
    for k, seed in enumerate(seeds):
        j = k - int(include_mle)
        if include_mle and k == 0:
            out.append(True)
        elif assignment == "stratified":
            out.append(math.ceil((j + 1) * r - _STRATIFIED_EPS) - math.ceil(j * r - _STRATIFIED_EPS) == 1)
        else:
            out.append(uniform_from_seed(seed) >= mix)
    return out
