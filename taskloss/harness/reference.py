"""The ideal update Δθ* of a problem, with its Monte Carlo error, and how close a rule's step comes to it.

Derived in notebook 16_update_rule_harness (the update distribution itself in 01_optimization_as_sampling):

    p(Δθ) ∝ exp(−[l̃(θ+Δθ) − l̃(θ)]/α)  on  ‖Δθ‖ ≤ ε  (or on all of R^P when ε = None),   Δθ* = E_p[Δθ].

:func:`ideal_update` estimates Δθ* with :func:`taskloss.sampling.update.expected_update` (self-normalized
importance sampling) from the proposal that fits: the Laplace distribution N(m, αH(θ+m)⁻¹) around the
minimizer m of l̃(θ+Δθ) (found by Newton's method with step halving; for a quadratic m = −H⁻¹g and this is
exactly p, :func:`taskloss.sampling.update.gaussian_update_distribution`, so every weight inside the ball is
equal) — and, with a ball, also the uniform ball
(:class:`taskloss.sampling.proposals.UniformBallProposal`), keeping the estimate with the larger effective sample
size. With the uniform ball the draws' own mean, whose expectation is 0, is subtracted as a control variate:
at large α, where Δθ* shrinks like 1/α, this removes the noise floor ε/√((d+2)n) that plain SNIS has there
(notebook 01, §2). H is the dense Hessian of the surrogate (``torch.func.jacrev`` twice; small models only). Centring the
Laplace proposal at θ's own Newton point instead fails as soon as the loss is not quadratic on the scale of that
step: at α = 10⁻⁴ the cubic remainder over α dominates and the effective sample size drops to ~1. The Monte Carlo
standard error is the delta-method one of SNIS, ``se_j² = Σ_i w_i² (Δθ_ij − Δθ*_j)²`` (with the control variate,
``Σ_i (w_i (Δθ_ij − Δθ*_j) − Δθ_ij/n)²``).

Limits that the tests check: for a quadratic without a ball Δθ* is Newton's step −H⁻¹g for every α; with a ball,
α → ∞ gives Δθ* → −ε²g/((d+2)α) (gradient descent's direction), and α → 0 the minimizer in the ball.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from taskloss.harness.problem import Problem, grad_hessian
from taskloss.sampling.proposals import GaussianProposal, UniformBallProposal
from taskloss.sampling.update import expected_update, gaussian_update_distribution, newton_direction, vmap_loss
from taskloss.validation import check_finite, check_generator, check_int, check_positive

__all__ = ["IdealUpdate", "ideal_update", "step_agreement"]

PROPOSALS = ("auto", "laplace", "ball")


@dataclass
class IdealUpdate:
    """``delta [P]`` — Δθ*; ``stderr [P]`` — its Monte Carlo standard error per coordinate; ``ess`` — effective
    sample size of the kept estimate; ``proposal`` — which one; ``grad [P]``, ``hessian [P, P]``, ``newton [P]``
    — g, H and −H⁻¹g at θ; ``alpha``, ``radius`` — the target's temperature and ball."""

    delta: Tensor
    stderr: Tensor
    ess: float
    proposal: str
    grad: Tensor
    hessian: Tensor
    newton: Tensor
    alpha: float
    radius: float | None

    @property
    def rel_stderr(self) -> float:
        """The relative standard error ‖se‖ / ‖Δθ*‖, the noise floor of any relative error measured against Δθ*."""
        return float(self.stderr.norm() / self.delta.norm().clamp_min(torch.finfo(self.delta.dtype).tiny))


def ideal_update(problem: Problem, alpha: float, *, radius: float | None = None, n_samples: int = 20000,
                 generator: torch.Generator | None = None, proposal: str = "auto",
                 chunk_size: int | None = 512, newton_iters: int = 30) -> IdealUpdate:
    """Estimate Δθ* of ``problem``'s surrogate at the model's current parameters.

    Args:
        problem: the :class:`Problem` (its surrogate must have a positive definite Hessian: add weight decay).
        alpha: temperature ``α > 0``.
        radius: the ball ε (``None``: no ball).
        n_samples: draws per proposal.
        generator: their RNG.
        chunk_size: candidates per vmapped loss call.
        proposal: ``"auto"`` (both, larger ESS kept), ``"laplace"`` or ``"ball"`` (uniform; needs radius).
        newton_iters: Newton iterations for the Laplace mode.

    Raises ``ValueError`` on α ≤ 0, ε ≤ 0, an unknown proposal, a non-definite Hessian or a non-finite gradient.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a taskloss.harness.Problem, got {type(problem).__name__}")
    alpha = check_positive("alpha", alpha)
    if radius is not None:
        radius = check_positive("radius", radius)
    n_samples = check_int("n_samples", n_samples, minimum=2)
    check_generator("generator", generator)
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
    if proposal == "ball" and radius is None:
        raise ValueError("proposal='ball' needs a radius")
    theta = problem.flat_params()
    f = problem.flat_loss()
    g, H = grad_hessian(f, theta)
    loss_fn = vmap_loss(f, chunk_size=chunk_size)
    candidates = []
    if proposal in ("auto", "laplace"):
        mode, H_mode = _minimizer(f, theta, g, H, newton_iters)
        laplace = gaussian_update_distribution(H_mode, torch.zeros_like(g), alpha)
        candidates.append(("laplace", GaussianProposal(mode, cov=laplace.covariance)))
    if proposal in ("auto", "ball") and radius is not None:
        candidates.append(("ball", UniformBallProposal(torch.zeros_like(theta), radius)))
    best = None
    with torch.no_grad():
        for name, q in candidates:
            try:
                res = expected_update(loss_fn, theta, alpha, q, n_samples, generator, radius=radius)
            except ValueError as e:  # every draw outside the ball: this proposal has nothing to say
                if "zero target density" not in str(e) or len(candidates) == 1:
                    raise
                continue
            if best is None or float(res.ess) > best[1].ess:
                w = res.weights.to(res.samples.dtype)[:, None]
                if name == "ball":   # control variate E_q[Δ] = 0: subtract the draws' mean
                    est = res.estimate - res.samples.mean(0)
                    infl = w * (res.samples - est) - res.samples / res.samples.shape[0]
                else:
                    est = res.estimate
                    infl = w * (res.samples - est)
                best = (name, res, est, torch.sqrt((infl ** 2).sum(0)))
    if best is None:
        raise ValueError("no proposal put a draw inside the ball: raise n_samples or the radius")
    name, res, est, se = best
    return IdealUpdate(delta=est, stderr=se, ess=float(res.ess), proposal=name, grad=g, hessian=H,
                       newton=-newton_direction(H, g), alpha=alpha, radius=radius)


def _minimizer(f, theta: Tensor, g: Tensor, H: Tensor, iters: int) -> tuple[Tensor, Tensor]:
    """M = argmin_Δ f(θ+Δ) by Newton with step halving (from Δ = 0), and H(θ+m)."""
    delta = torch.zeros_like(theta)
    value = float(f(theta))
    for _ in range(check_int("newton_iters", iters, minimum=0)):
        step, t = -newton_direction(H, g), 1.0
        while t > 1e-6:
            new = float(f(theta + delta + t * step))
            if new <= value:
                break
            t *= 0.5
        if t <= 1e-6 or value - new <= 1e-14 * max(1.0, abs(value)):
            break
        delta, value = delta + t * step, new
        g, H = grad_hessian(f, theta + delta)
    return delta, H


def step_agreement(delta: Tensor, reference: Tensor) -> dict[str, float]:
    """``cosine`` = cos∠(Δθ, Δθ*) and ``rel_error`` = ‖Δθ − Δθ*‖/‖Δθ*‖ of a step ``delta [P]`` to ``reference [P]``.

    Raises ``ValueError`` on shape mismatch, NaN/inf, or a zero vector (the angle is undefined)."""
    for name, t in (("delta", delta), ("reference", reference)):
        if not isinstance(t, Tensor) or t.ndim != 1:
            raise ValueError(f"{name} must be a flat [P] tensor")
        check_finite(name, t)
    if delta.shape != reference.shape:
        raise ValueError(f"delta {tuple(delta.shape)} and reference {tuple(reference.shape)} differ in shape")
    d, r = delta.double(), reference.double()
    if float(d.norm()) == 0.0 or float(r.norm()) == 0.0:
        raise ValueError("a zero step has no direction: cosine undefined")
    return {"cosine": float(d @ r / (d.norm() * r.norm())), "rel_error": float((d - r).norm() / r.norm())}
