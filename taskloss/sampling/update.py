"""Optimization as sampling an update, and self-normalized importance sampling. Derived in notebook
01_optimization_as_sampling.

The update is a random variable with an unnormalized log density (the *target*)

    log p(Δθ | θ) = −[l(θ + Δθ) − l(θ)] / α − log Z(θ),        Δθ* = E_p[Δθ],

estimated from samples of a proposal q by self-normalized importance sampling (SNIS), as in the paper
"MLE-guided parameter search for task loss minimization in neural sequence modeling". Two limits have
closed forms: a linear loss on the ball ‖Δθ‖ ≤ ε (gradient descent, :func:`ball_expected_update`) and a
quadratic loss (a Gaussian with mean −H⁻¹g and covariance αH⁻¹: Newton, :func:`gaussian_update_distribution`).

This module holds the SNIS core (:func:`self_normalized_is`, :func:`log_target`, :func:`expected_update`) and the
quadratic case; the proposals live in :mod:`taskloss.sampling.proposals` and the ε-ball formulas in
:mod:`taskloss.sampling.ball`.

Shapes: parameters ``theta [d]``, candidate updates ``deltas [K, d]``, losses ``[K]``. Tensors follow the
device of their inputs; random draws use the device of the ``generator`` when one is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from taskloss.sampling.proposals import GaussianProposal, _no_nan
from taskloss.utils import check_finite, check_floating, check_int, check_ndim, check_positive

__all__ = ["SNISResult", "log_target", "vmap_loss", "self_normalized_is", "expected_update", "newton_update",
           "gaussian_update_distribution"]

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


def self_normalized_is(log_target: torch.Tensor, log_proposal: torch.Tensor,
                       values: torch.Tensor) -> SNISResult:
    """Self-normalized importance sampling estimate of E_p[values] from draws of q.

    ``log_target [*B, K]`` — unnormalized log p (log ρ) at the K draws (−inf = zero density allowed);
    ``log_proposal [*B, K]`` — normalized log q at the draws (finite); ``values [*B, K, *event]``.
    Weights wᵢ = softmax(log ρᵢ − log qᵢ) are formed in log space (logsumexp), so log targets of any
    magnitude give finite results. Derived in notebook 01_optimization_as_sampling.
    """
    for name, t in (("log_target", log_target), ("log_proposal", log_proposal), ("values", values)):
        check_floating(name, t)
        _no_nan(name, t)
    if log_target.ndim < 1:
        raise ValueError("log_target must have shape [..., K] with at least one dimension")
    if log_proposal.shape != log_target.shape:
        raise ValueError(f"log_proposal shape {tuple(log_proposal.shape)} != log_target shape "
                         f"{tuple(log_target.shape)}")
    if tuple(values.shape[: log_target.ndim]) != tuple(log_target.shape):
        raise ValueError(f"values shape {tuple(values.shape)} must start with the log_target shape "
                         f"{tuple(log_target.shape)}")
    k = log_target.shape[-1]
    if k < 1 or log_target.numel() == 0:
        raise ValueError(f"need K >= 1 samples, got shape {tuple(log_target.shape)}")
    if bool((log_target == math.inf).any()):
        raise ValueError("log_target contains +inf")
    check_finite("log_proposal", log_proposal)
    check_finite("values", values)
    lw = log_target - log_proposal
    if bool((lw == -math.inf).all(dim=-1).any()):
        raise ValueError("every draw has zero target density (all log_target are -inf): no weights to normalize")
    log_norm = torch.logsumexp(lw, dim=-1, keepdim=True)
    log_w = lw - log_norm
    w = log_w.exp()
    ess = torch.exp(-torch.logsumexp(2.0 * log_w, dim=-1))
    log_z = log_norm.squeeze(-1) - math.log(k)
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
    _no_nan("loss_fn output", losses)
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
    if not (hasattr(proposal, "sample") and hasattr(proposal, "log_prob")):
        raise TypeError("proposal must provide sample(n, generator) and log_prob(x)")
    deltas = proposal.sample(n_samples, generator).to(device=theta.device, dtype=theta.dtype)
    lt = log_target(loss_fn, theta, deltas, alpha, radius=radius)
    lq = proposal.log_prob(deltas).to(lt.dtype)
    res = self_normalized_is(lt, lq, deltas)
    res.samples = deltas
    return res


# ------------------------------------------------------------------------------ the quadratic case
def _check_gh(g: torch.Tensor, H: torch.Tensor) -> None:
    check_floating("g", g)
    check_floating("H", H)
    if g.ndim < 1 or H.ndim < 2 or H.shape[-1] != H.shape[-2] or H.shape[-1] != g.shape[-1] or g.shape[-1] < 1:
        raise ValueError(f"need g [..., d] and H [..., d, d]; got {tuple(g.shape)} and {tuple(H.shape)}")
    check_finite("g", g)
    check_finite("H", H)


def newton_update(g: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """Newton's step −H⁻¹g for ``g [..., d]``, ``H [..., d, d]`` (batched, broadcasting) by a linear solve.
    Derived in notebook 01_optimization_as_sampling."""
    _check_gh(g, H)
    sol, info = torch.linalg.solve_ex(H, g.unsqueeze(-1))
    if bool((info != 0).any()):
        raise ValueError("H is singular: Newton's step is undefined")
    return -sol.squeeze(-1)


def gaussian_update_distribution(g: torch.Tensor, H: torch.Tensor, alpha: float) -> GaussianProposal:
    """The update distribution of a quadratic loss l(θ+Δ) − l(θ) = Δᵀg + ½ΔᵀHΔ:

        p(Δ) ∝ exp(−[Δᵀg + ½ΔᵀHΔ]/α) = N(Δ; −H⁻¹g, αH⁻¹),

    so Δθ* is Newton's step. ``g [d]``, ``H [d, d]`` symmetric positive definite (else p is not
    normalizable). Returns a :class:`GaussianProposal`. Derived in notebook 01_optimization_as_sampling."""
    alpha = check_positive("alpha", alpha)
    _check_gh(g, H)
    check_ndim("g", g, 1)
    check_ndim("H", H, 2)
    if not torch.allclose(H, H.mT, rtol=1e-5, atol=1e-8 * float(H.abs().max())):
        raise ValueError("H must be symmetric")
    tril, info = torch.linalg.cholesky_ex(0.5 * (H + H.mT))
    if int(info) != 0:
        raise ValueError("H must be positive definite: otherwise exp(-[Δᵀg + ½ΔᵀHΔ]/α) is not normalizable")
    mean = -torch.cholesky_solve(g.unsqueeze(-1), tril).squeeze(-1)
    cov = alpha * torch.cholesky_inverse(tril)
    return GaussianProposal(mean, cov=0.5 * (cov + cov.mT))
