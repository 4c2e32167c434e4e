"""Optimization as sampling an update, and self-normalized importance sampling. Derived in notebook
01_optimization_as_sampling.

The update is a random variable with an unnormalized log density (the *target*)

    log p(Δθ | θ) = −[l(θ + Δθ) − l(θ)] / α − log Z(θ),        Δθ* = E_p[Δθ],

estimated from samples of a proposal q by self-normalized importance sampling (SNIS), as in the paper
"MLE-guided parameter search for task loss minimization in neural sequence modeling". Two limits have
closed forms: a linear loss on the ball ‖Δθ‖ ≤ ε (gradient descent, :func:`ball_expected_update`) and a
quadratic loss (a Gaussian with mean −H⁻¹g and covariance αH⁻¹: Newton, :func:`gaussian_update_distribution`).

This module holds the SNIS core (:func:`normalized_log_weights` and :func:`effective_sample_size`, written once and
used by :func:`self_normalized_is`, by :func:`taskloss.search.mgs_density.mgs_weights` and by the readable MGS step
:func:`taskloss.search.mgs_reference.mgs_step_reference`; :func:`log_target`, :func:`expected_update`) and the
quadratic case (:func:`newton_direction`: like every solve of the package it takes ``(curvature, grad)`` and returns
``+H⁻¹g``, so the step is ``−lr`` times it); the proposals live in :mod:`taskloss.sampling.proposals` and the ε-ball
formulas in :mod:`taskloss.sampling.ball`.

Shapes: parameters ``theta [d]``, candidate updates ``deltas [K, d]``, losses ``[K]``. Tensors follow the
device of their inputs; random draws use the device of the ``generator`` when one is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from taskloss.sampling.proposals import GaussianProposal
from taskloss.validation import (
    LINALG_DTYPES,
    check_finite,
    check_floating,
    check_generator,
    check_int,
    check_ndim,
    check_no_nan,
    check_positive,
    check_same_dtype,
)

__all__ = ["SNISResult", "normalized_log_weights", "effective_sample_size", "log_target", "vmap_loss",
           "self_normalized_is", "expected_update", "newton_direction", "gaussian_update_distribution"]

LossFn = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------------- SNIS
@dataclass
class SNISResult:
    """Output of :func:`self_normalized_is` (batch shape ``B`` = leading dims of ``log_target[..., K]``).

    ``estimate [*B, *event]`` — Σᵢ wᵢ valuesᵢ; ``weights [*B, K]`` — normalized weights (sum to 1);
    ``log_weights [*B, K]`` — their logs; ``ess [*B]`` — effective sample size 1/Σwᵢ² ∈ [1, K];
    ``log_z [*B]`` — log of the unbiased estimate of the normalizer, logmeanexp(log ρ − log q);
    ``samples`` — the draws, when the result comes from :func:`expected_update`.
    """

    estimate: torch.Tensor
    weights: torch.Tensor
    log_weights: torch.Tensor
    ess: torch.Tensor
    log_z: torch.Tensor
    samples: torch.Tensor | None = None


def normalized_log_weights(log_target: torch.Tensor, log_proposal: torch.Tensor) -> torch.Tensor:
    """Self-normalized log-weights ``log wᵢ = (log ρᵢ − log qᵢ) − logsumexp_j(log ρⱼ − log qⱼ)`` along the last axis.

    Formed in log space, so log targets of any magnitude give finite weights. Derived in notebook
    01_optimization_as_sampling.

    Args:
        log_target: ``[*B, K]`` unnormalized log ρ at the draws (−inf: zero density).
        log_proposal: ``[*B, K]`` log q at the draws (finite).

    Returns:
        ``[*B, K]`` normalized log-weights (their exponentials sum to 1).

    Raises:
        TypeError: a non-floating tensor.
        ValueError: NaN, mismatched shapes, no draw, +inf in ``log_target``, a non-finite ``log_proposal``, or a
            batch entry whose every draw has zero target density.
    """
    for name, t in (("log_target", log_target), ("log_proposal", log_proposal)):
        check_floating(name, t)
        check_no_nan(name, t)
    if log_target.ndim < 1:
        raise ValueError("log_target must have shape [..., K] with at least one dimension")
    if log_proposal.shape != log_target.shape:
        raise ValueError(f"log_proposal shape {tuple(log_proposal.shape)} != log_target shape "
                         f"{tuple(log_target.shape)}")
    if log_target.shape[-1] < 1 or log_target.numel() == 0:
        raise ValueError(f"need K >= 1 samples, got shape {tuple(log_target.shape)}")
    if bool((log_target == math.inf).any()):
        raise ValueError("log_target contains +inf")
    check_finite("log_proposal", log_proposal)
    lw = log_target - log_proposal
    if bool((lw == -math.inf).all(dim=-1).any()):
        raise ValueError("every draw has zero target density (all log_target are -inf): no weights to normalize")
    return lw - torch.logsumexp(lw, dim=-1, keepdim=True)


def _kish(w: torch.Tensor) -> torch.Tensor:
    """1 / Σᵢ wᵢ² along the last axis of checked, normalized weights."""
    return 1.0 / w.square().sum(-1)


def effective_sample_size(weights) -> float:
    """Kish's effective sample size 1 / Σₖ wₖ² of normalized weights (K for uniform weights, 1 for one winner).

    Derived in notebook 01_optimization_as_sampling (used in 02_importance_sampling_and_mgs).

    Args:
        weights: ``[K]`` normalized weights (a tensor or numbers), finite, non-negative, summing to 1.

    Returns:
        The effective sample size, in ``[1, K]``.

    Raises:
        TypeError: not real numbers.
        ValueError: empty, not 1-D, NaN, negative, or not summing to 1.
    """
    if isinstance(weights, torch.Tensor):
        if weights.dtype == torch.bool or weights.is_complex():
            raise TypeError(f"weights must hold real numbers, got dtype {weights.dtype}")
        w = weights.detach().to(torch.float64)
    elif isinstance(weights, (str, bytes, bool)):
        raise TypeError(f"weights must be real numbers, got {type(weights).__name__}")
    else:
        try:
            w = torch.as_tensor(weights, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"weights must be real numbers, got {type(weights).__name__}") from e
    if w.ndim != 1 or w.numel() == 0 or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights must be a non-empty 1-D tensor of finite non-negative values")
    if not math.isclose(float(w.sum()), 1.0, rel_tol=1e-6):
        raise ValueError(f"weights must sum to 1, got {float(w.sum())}")
    return float(_kish(w))


def self_normalized_is(log_target: torch.Tensor, log_proposal: torch.Tensor,
                       values: torch.Tensor) -> SNISResult:
    """Self-normalized importance sampling estimate of E_p[values] from draws of q.

    ``log_target [*B, K]`` — unnormalized log p (log ρ) at the K draws (−inf = zero density allowed);
    ``log_proposal [*B, K]`` — normalized log q at the draws (finite); ``values [*B, K, *event]``.
    Weights wᵢ = softmax(log ρᵢ − log qᵢ) (:func:`normalized_log_weights`) are formed in log space, so log targets
    of any magnitude give finite results; the ESS is :func:`effective_sample_size`'s 1/Σwᵢ². Derived in notebook
    01_optimization_as_sampling.
    """
    check_floating("values", values)
    check_no_nan("values", values)
    log_w = normalized_log_weights(log_target, log_proposal)
    if tuple(values.shape[: log_target.ndim]) != tuple(log_target.shape):
        raise ValueError(f"values shape {tuple(values.shape)} must start with the log_target shape "
                         f"{tuple(log_target.shape)}")
    check_finite("values", values)
    k = log_target.shape[-1]
    w = log_w.exp()
    ess = _kish(w)
    log_z = torch.logsumexp(log_target - log_proposal, dim=-1) - math.log(k)
    w_b = w.to(torch.result_type(w, values)).reshape(*w.shape, *([1] * (values.ndim - w.ndim)))
    estimate = (w_b * values).sum(dim=log_target.ndim - 1)
    return SNISResult(estimate=estimate, weights=w, log_weights=log_w, ess=ess, log_z=log_z)


# ------------------------------------------------------------------------------------------ targets
def vmap_loss(point_loss: Callable[[torch.Tensor], torch.Tensor], chunk_size: int | None = None) -> LossFn:
    """Turn a per-point loss ``θ [d] → scalar`` into the batched ``[K, d] → [K]`` that :func:`log_target`
    wants, with :func:`torch.func.vmap` (so the function must avoid data-dependent Python control flow)."""
    if not callable(point_loss):
        raise TypeError("point_loss must be callable")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    return torch.func.vmap(point_loss, chunk_size=chunk_size)


def log_target(loss_fn: LossFn, theta: torch.Tensor, deltas: torch.Tensor, alpha: float, *,
               radius: float | None = None) -> torch.Tensor:
    """Unnormalized log density of the update, −[l(θ+Δ) − l(θ)]/α, for ``deltas [K, d]`` → ``[K]``.

    ``loss_fn`` maps ``[K, d] → [K]`` (see :func:`vmap_loss`); a loss of +inf means zero density. With
    ``radius`` the target is restricted to the ball ‖Δ‖ ≤ radius (−inf outside). One call of ``loss_fn``
    evaluates θ and all θ+Δ. Derived in notebook 01_optimization_as_sampling.
    """
    alpha = check_positive("alpha", alpha)
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable ([K, d] -> [K]), got {type(loss_fn).__name__}")
    check_floating("theta", theta)
    check_ndim("theta", theta, 1)
    check_floating("deltas", deltas)
    check_ndim("deltas", deltas, 2)
    if deltas.shape[0] < 1:
        raise ValueError("deltas is empty: need K >= 1 candidate updates")
    if deltas.shape[1] != theta.shape[0]:
        raise ValueError(f"deltas has dim {deltas.shape[1]} but theta has dim {theta.shape[0]}")
    check_finite("theta", theta)
    check_finite("deltas", deltas)
    points = torch.cat([theta.unsqueeze(0), theta.unsqueeze(0) + deltas], dim=0)
    losses = loss_fn(points)
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (points.shape[0],):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(f"loss_fn must map [K, d] -> [K]; got {shape} for input {tuple(points.shape)}")
    check_no_nan("loss_fn output", losses)
    if not bool(torch.isfinite(losses[0])):
        raise ValueError(f"loss at theta must be finite, got {losses[0].item()}")
    if bool((losses == -math.inf).any()):
        raise ValueError("loss_fn returned -inf")
    out = -(losses[1:] - losses[0]) / alpha
    if radius is not None:
        radius = check_positive("radius", radius)
        out = torch.where(torch.linalg.vector_norm(deltas, dim=-1) <= radius, out, out.new_tensor(-math.inf))
    return out


def expected_update(loss_fn: LossFn, theta: torch.Tensor, alpha: float, proposal, n_samples: int,
                    generator: torch.Generator | None = None, *, radius: float | None = None) -> SNISResult:
    """Monte Carlo estimate of Δθ* = E_p[Δθ] with draws from ``proposal`` (any object with
    ``sample(n, generator) → [n, d]`` and ``log_prob([n, d]) → [n]``); ``.estimate [d]`` is Δθ*,
    ``.samples [n, d]`` the draws, ``.weights`` their SNIS weights. Derived in notebook
    01_optimization_as_sampling."""
    n_samples = check_int("n_samples", n_samples, minimum=1)
    check_generator("generator", generator)
    if not (hasattr(proposal, "sample") and hasattr(proposal, "log_prob")):
        raise TypeError("proposal must provide sample(n, generator) and log_prob(x)")
    deltas = proposal.sample(n_samples, generator).to(device=theta.device, dtype=theta.dtype)
    lt = log_target(loss_fn, theta, deltas, alpha, radius=radius)
    lq = proposal.log_prob(deltas).to(lt.dtype)
    res = self_normalized_is(lt, lq, deltas)
    res.samples = deltas
    return res


# ------------------------------------------------------------------------------ the quadratic case
def _check_curvature_grad(hessian: torch.Tensor, grad: torch.Tensor) -> None:
    check_floating("hessian", hessian)
    check_floating("grad", grad)
    check_same_dtype(LINALG_DTYPES, hessian=hessian, grad=grad)     # solves and Cholesky: float32/64, one dtype
    if grad.ndim < 1 or hessian.ndim < 2 or hessian.shape[-1] != hessian.shape[-2] or \
            hessian.shape[-1] != grad.shape[-1] or grad.shape[-1] < 1:
        raise ValueError(f"need hessian [..., d, d] and grad [..., d]; got {tuple(hessian.shape)} and "
                         f"{tuple(grad.shape)}")
    check_finite("grad", grad)
    check_finite("hessian", hessian)


def newton_direction(hessian: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Newton's direction ``+H⁻¹g`` by a linear solve (batched, broadcasting); the Newton step is ``−lr`` times it.

    The sign and argument order of every solve of the package (``natural_gradient(fisher, grad)`` is ``+F⁻¹g``).
    Derived in notebook 01_optimization_as_sampling.

    Args:
        hessian: ``[..., d, d]`` the curvature H.
        grad: ``[..., d]`` the gradient g.

    Returns:
        ``[..., d]`` the solution of ``H x = g``.

    Raises:
        ValueError: mismatched shapes, NaN/inf, or a singular ``hessian``.
    """
    _check_curvature_grad(hessian, grad)
    sol, info = torch.linalg.solve_ex(hessian, grad.unsqueeze(-1))
    if bool((info != 0).any()):
        raise ValueError("hessian is singular: Newton's direction is undefined")
    return sol.squeeze(-1)


def gaussian_update_distribution(hessian: torch.Tensor, grad: torch.Tensor, alpha: float) -> GaussianProposal:
    """The update distribution of a quadratic loss l(θ+Δ) − l(θ) = Δᵀg + ½ΔᵀHΔ.

        p(Δ) ∝ exp(−[Δᵀg + ½ΔᵀHΔ]/α) = N(Δ; −H⁻¹g, αH⁻¹),

    so Δθ* is Newton's step. Derived in notebook 01_optimization_as_sampling.

    Args:
        hessian: ``[d, d]`` H, symmetric positive definite (else p is not normalizable).
        grad: ``[d]`` g.
        alpha: the temperature α > 0.

    Returns:
        The :class:`GaussianProposal` N(−H⁻¹g, αH⁻¹).

    Raises:
        ValueError: bad shapes or values, an asymmetric or indefinite ``hessian``, α ≤ 0.
    """
    alpha = check_positive("alpha", alpha)
    _check_curvature_grad(hessian, grad)
    check_ndim("grad", grad, 1)
    check_ndim("hessian", hessian, 2)
    H = hessian
    if not torch.allclose(H, H.mT, rtol=1e-5, atol=1e-8 * float(H.abs().max())):
        raise ValueError("hessian must be symmetric")
    tril, info = torch.linalg.cholesky_ex(0.5 * (H + H.mT))
    if int(info) != 0:
        raise ValueError("hessian must be positive definite: otherwise exp(-[Δᵀg + ½ΔᵀHΔ]/α) is not normalizable")
    mean = -torch.cholesky_solve(grad.unsqueeze(-1), tril).squeeze(-1)
    cov = alpha * torch.cholesky_inverse(tril)
    return GaussianProposal(mean, cov=0.5 * (cov + cov.mT))
