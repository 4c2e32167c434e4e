"""Proposal distributions for sampling an update: ``sample(n, generator) → [n, d]`` and
``log_prob([..., d]) → [...]``. Derived in notebook 01_optimization_as_sampling.

:class:`GaussianProposal` (diagonal or full covariance), :class:`UniformBallProposal` (the ε-ball case) and
:class:`GaussianMixtureProposal` (with :meth:`GaussianMixtureProposal.mgs`, the proposal of MLE-guided parameter
search). Draws are made on the generator's device when one is given and returned on the parameters' device.
:func:`taskloss.sampling.update.expected_update` consumes them.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from taskloss.sampling.ball import log_ball_volume
from taskloss.validation import (
    LINALG_DTYPES,
    all_finite,
    check_dtype,
    check_finite,
    check_floating,
    check_generator,
    check_int,
    check_iterable,
    check_ndim,
    check_no_nan,
    check_not_meta,
    check_positive,
    check_same_dtype,
)

__all__ = ["GaussianProposal", "UniformBallProposal", "GaussianMixtureProposal"]


# shared with taskloss.sampling.update (SNIS inputs may hold ±inf, never NaN)
# ---------------------------------------------------------------------------------------- proposals
def _draw(kind: str, shape, generator, like: torch.Tensor) -> torch.Tensor:
    """Random draws on the generator's device (when given), returned on ``like``'s device and dtype."""
    fn = torch.randn if kind == "normal" else torch.rand
    check_generator("generator", generator)
    if generator is None:
        return fn(*shape, device=like.device, dtype=like.dtype)
    return fn(*shape, generator=generator, device=generator.device, dtype=like.dtype).to(like.device)


def _check_points(x: torch.Tensor, d: int) -> None:
    check_floating("x", x)
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"x must have shape [..., {d}], got {tuple(x.shape)}")
    check_no_nan("x", x)


class GaussianProposal:
    """N(mean, Σ) with ``mean [d]`` and either ``scale`` (std: a float or a ``[d]`` tensor, diagonal Σ) or
    ``cov [d, d]`` (symmetric positive definite). ``sample(n, generator) → [n, d]``, ``log_prob([..., d])``.
    ``mean`` is float32 or float64 (the triangular solve of ``log_prob``); ``cov`` must share its dtype, a
    ``scale`` tensor is cast to it.
    Derived in notebook 01_optimization_as_sampling."""

    def __init__(self, mean: torch.Tensor, scale: float | torch.Tensor | None = None,
                 cov: torch.Tensor | None = None):
        check_floating("mean", mean)
        check_dtype("mean", mean, LINALG_DTYPES)      # log_prob's triangular solve: float32/64
        check_ndim("mean", mean, 1)
        check_finite("mean", mean)
        if (scale is None) == (cov is None):
            raise ValueError("give exactly one of scale and cov")
        d = mean.shape[0]
        if d < 1:
            raise ValueError("mean is empty: need d >= 1")
        if cov is None:
            if isinstance(scale, torch.Tensor) and scale.numel() > 1:
                check_finite("scale", scale)
                if tuple(scale.shape) != (d,) or bool((scale <= 0).any()):
                    raise ValueError(f"scale must be positive with shape [{d}], got {tuple(scale.shape)}")
                std = scale.to(mean)
            else:
                std = torch.full((d,), check_positive("scale", scale), dtype=mean.dtype, device=mean.device)
            self.scale_tril = torch.diag(std)
        else:
            check_floating("cov", cov)
            check_same_dtype(LINALG_DTYPES, mean=mean, cov=cov)     # Cholesky: float32/64, one dtype
            check_finite("cov", cov)
            if tuple(cov.shape) != (d, d):
                raise ValueError(f"cov must have shape [{d}, {d}], got {tuple(cov.shape)}")
            cov = cov.to(mean)
            if not torch.allclose(cov, cov.mT, rtol=1e-5, atol=1e-8 * float(cov.abs().max())):
                raise ValueError("cov must be symmetric")
            tril, info = torch.linalg.cholesky_ex(0.5 * (cov + cov.mT))
            if int(info) != 0:
                raise ValueError("cov must be positive definite")
            self.scale_tril = tril
        self.mean = mean
        self.dim = d

    @property
    def covariance(self) -> torch.Tensor:
        """The covariance ``L Lᵀ``."""
        return self.scale_tril @ self.scale_tril.mT

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` draws ``[n, d]``."""
        n = check_int("n", n, minimum=1)
        z = _draw("normal", (n, self.dim), generator, self.mean)
        return self.mean + z @ self.scale_tril.mT

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log density at ``x [..., d]``."""
        _check_points(x, self.dim)
        diff = (x - self.mean).reshape(-1, self.dim).mT
        sol = torch.linalg.solve_triangular(self.scale_tril, diff, upper=False)
        maha = (sol * sol).sum(0).reshape(x.shape[:-1])
        half_logdet = torch.log(torch.diagonal(self.scale_tril)).sum()
        return -0.5 * maha - half_logdet - 0.5 * self.dim * math.log(2 * math.pi)


class UniformBallProposal:
    """Uniform on the ball ‖x − center‖ ≤ radius (``center [d]``): the proposal of the ε-ball case.
    ``log_prob`` is −log vol inside and −inf outside. Derived in notebook 01_optimization_as_sampling."""

    def __init__(self, center: torch.Tensor, radius: float):
        check_floating("center", center)
        check_ndim("center", center, 1)
        check_finite("center", center)
        if center.shape[0] < 1:
            raise ValueError("center is empty: need d >= 1")
        self.center, self.radius, self.dim = center, check_positive("radius", radius), center.shape[0]
        self._log_vol = log_ball_volume(self.dim, self.radius)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` draws ``[n, d]``, uniform in the ball."""
        n = check_int("n", n, minimum=1)
        z = _draw("normal", (n, self.dim), generator, self.center)
        direction = z / torch.linalg.vector_norm(z, dim=-1, keepdim=True).clamp_min(1e-30)
        r = self.radius * _draw("uniform", (n, 1), generator, self.center) ** (1.0 / self.dim)
        return self.center + r * direction

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log density at ``x [..., d]`` (−inf outside the ball)."""
        _check_points(x, self.dim)
        inside = torch.linalg.vector_norm(x - self.center, dim=-1) <= self.radius * (1 + 1e-6)
        return torch.where(inside, x.new_tensor(-self._log_vol), x.new_tensor(-math.inf))


class GaussianMixtureProposal:
    """Σₘ πₘ N(meanₘ, Σₘ) over :class:`GaussianProposal` components with mixing ``weights [M]``
    (normalized here). :meth:`mgs` builds the mixture λ N(0, σ²I) + (1−λ) N(guide, σ²I) of the paper
    "MLE-guided parameter search for task loss minimization in neural sequence modeling".
    Derived in notebook 01_optimization_as_sampling."""

    def __init__(self, components: Sequence[GaussianProposal], weights: Sequence[float] | torch.Tensor):
        comps = list(check_iterable("components", components))
        if not comps or not all(isinstance(c, GaussianProposal) for c in comps):
            raise ValueError("components must be a non-empty sequence of GaussianProposal")
        if len({c.dim for c in comps}) != 1:
            raise ValueError("all components must have the same dimension")
        if isinstance(weights, torch.Tensor):
            check_not_meta("weights", weights)
        elif not isinstance(weights, (list, tuple, np.ndarray)) or np.asarray(weights).dtype.kind not in "fiub":
            raise TypeError(f"weights must be a tensor, array or list of numbers, got {type(weights).__name__}")
        if isinstance(weights, torch.Tensor) and weights.is_complex():
            raise TypeError(f"weights must be real, got dtype {weights.dtype}")
        w = torch.as_tensor(weights, dtype=comps[0].mean.dtype).to(comps[0].mean.device).flatten()
        if w.numel() != len(comps) or not all_finite(w) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise ValueError(f"weights must be {len(comps)} finite non-negative numbers with a positive sum")
        self.components, self.weights, self.dim = comps, w / w.sum(), comps[0].dim

    @classmethod
    def mgs(cls, guide: torch.Tensor, scale: float, mix: float) -> "GaussianMixtureProposal":
        """λ N(0, scale²I) + (1−λ) N(guide, scale²I) with λ = ``mix`` ∈ [0, 1]."""
        if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0.0 <= mix <= 1.0:
            raise ValueError(f"mix must be a number in [0, 1], got {mix}")
        zero = GaussianProposal(torch.zeros_like(guide), scale=scale)
        return cls([zero, GaussianProposal(guide, scale=scale)], [mix, 1.0 - mix])

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` draws ``[n, d]`` from the mixture."""
        n = check_int("n", n, minimum=1)
        check_generator("generator", generator)
        w = self.weights if generator is None else self.weights.to(generator.device)
        idx = torch.multinomial(w, n, replacement=True, generator=generator).to(self.weights.device)
        draws = torch.stack([c.sample(n, generator) for c in self.components])  # [M, n, d]
        return draws[idx, torch.arange(n, device=idx.device)]

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log density of the mixture at ``x [..., d]``."""
        _check_points(x, self.dim)
        lp = torch.stack([c.log_prob(x) for c in self.components])  # [M, ...]
        logw = torch.log(self.weights).reshape(-1, *([1] * (lp.ndim - 1)))
        return torch.logsumexp(lp + logw, dim=0)
