"""Optimization as sampling an update, and self-normalized importance sampling. Derived in notebook
01_optimization_as_sampling.

The update is a random variable with an unnormalized log density (the *target*)

    log p(Δθ | θ) = −[l(θ + Δθ) − l(θ)] / α − log Z(θ),        Δθ* = E_p[Δθ],

estimated from samples of a proposal q by self-normalized importance sampling (SNIS), as in the paper
"MLE-guided parameter search for task loss minimization in neural sequence modeling". Two limits have
closed forms: a linear loss on the ball ‖Δθ‖ ≤ ε (gradient descent, :func:`ball_expected_update`) and a
quadratic loss (a Gaussian with mean −H⁻¹g and covariance αH⁻¹: Newton, :func:`gaussian_update_distribution`).

Shapes: parameters ``theta [d]``, candidate updates ``deltas [K, d]``, losses ``[K]``. Tensors follow the
device of their inputs; random draws use the device of the ``generator`` when one is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from scipy import special

from .utils import check_finite, check_floating, check_int, check_ndim, check_positive

__all__ = [
    "SNISResult", "log_target", "vmap_loss", "self_normalized_is", "expected_update",
    "GaussianProposal", "UniformBallProposal", "GaussianMixtureProposal",
    "ball_log_partition", "ball_partition", "ball_log_partition_derivative", "ball_expected_update",
    "log_ball_volume", "newton_update", "gaussian_update_distribution",
]

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


def _no_nan(name: str, t: torch.Tensor) -> None:
    if bool(torch.isnan(t).any()):
        raise ValueError(f"{name} contains NaN")


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


# ---------------------------------------------------------------------------------------- proposals
def _draw(kind: str, shape, generator, like: torch.Tensor) -> torch.Tensor:
    """Random draws on the generator's device (when given), returned on ``like``'s device and dtype."""
    fn = torch.randn if kind == "normal" else torch.rand
    if generator is None:
        return fn(*shape, device=like.device, dtype=like.dtype)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return fn(*shape, generator=generator, device=generator.device, dtype=like.dtype).to(like.device)


def _check_points(x: torch.Tensor, d: int) -> None:
    check_floating("x", x)
    if x.ndim < 1 or x.shape[-1] != d:
        raise ValueError(f"x must have shape [..., {d}], got {tuple(x.shape)}")
    _no_nan("x", x)


class GaussianProposal:
    """N(mean, Σ) with ``mean [d]`` and either ``scale`` (std: a float or a ``[d]`` tensor, diagonal Σ) or
    ``cov [d, d]`` (symmetric positive definite). ``sample(n, generator) → [n, d]``, ``log_prob([..., d])``.
    Derived in notebook 01_optimization_as_sampling."""

    def __init__(self, mean: torch.Tensor, scale: float | torch.Tensor | None = None,
                 cov: torch.Tensor | None = None):
        check_floating("mean", mean)
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
        return self.scale_tril @ self.scale_tril.mT

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        n = check_int("n", n, minimum=1)
        z = _draw("normal", (n, self.dim), generator, self.mean)
        return self.mean + z @ self.scale_tril.mT

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        _check_points(x, self.dim)
        diff = (x - self.mean).reshape(-1, self.dim).mT
        sol = torch.linalg.solve_triangular(self.scale_tril, diff, upper=False)
        maha = (sol * sol).sum(0).reshape(x.shape[:-1])
        half_logdet = torch.log(torch.diagonal(self.scale_tril)).sum()
        return -0.5 * maha - half_logdet - 0.5 * self.dim * math.log(2 * math.pi)


def log_ball_volume(dim: int, radius: float) -> float:
    """log of the volume of the d-ball of ``radius``: (d/2) log π − log Γ(d/2 + 1) + d log r."""
    dim = check_int("dim", dim, minimum=1)
    radius = check_positive("radius", radius)
    return 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim + 1) + dim * math.log(radius)


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
        n = check_int("n", n, minimum=1)
        z = _draw("normal", (n, self.dim), generator, self.center)
        direction = z / torch.linalg.vector_norm(z, dim=-1, keepdim=True).clamp_min(1e-30)
        r = self.radius * _draw("uniform", (n, 1), generator, self.center) ** (1.0 / self.dim)
        return self.center + r * direction

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        _check_points(x, self.dim)
        inside = torch.linalg.vector_norm(x - self.center, dim=-1) <= self.radius * (1 + 1e-6)
        return torch.where(inside, x.new_tensor(-self._log_vol), x.new_tensor(-math.inf))


class GaussianMixtureProposal:
    """Σₘ πₘ N(meanₘ, Σₘ) over :class:`GaussianProposal` components with mixing ``weights [M]``
    (normalized here). :meth:`mgs` builds the mixture λ N(0, σ²I) + (1−λ) N(guide, σ²I) of the paper
    "MLE-guided parameter search for task loss minimization in neural sequence modeling".
    Derived in notebook 01_optimization_as_sampling."""

    def __init__(self, components: Sequence[GaussianProposal], weights: Sequence[float] | torch.Tensor):
        comps = list(components)
        if not comps or not all(isinstance(c, GaussianProposal) for c in comps):
            raise ValueError("components must be a non-empty sequence of GaussianProposal")
        if len({c.dim for c in comps}) != 1:
            raise ValueError("all components must have the same dimension")
        w = torch.as_tensor(weights, dtype=comps[0].mean.dtype).to(comps[0].mean.device).flatten()
        if w.numel() != len(comps) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
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
        n = check_int("n", n, minimum=1)
        w = self.weights if generator is None else self.weights.to(generator.device)
        idx = torch.multinomial(w, n, replacement=True, generator=generator).to(self.weights.device)
        draws = torch.stack([c.sample(n, generator) for c in self.components])  # [M, n, d]
        return draws[idx, torch.arange(n, device=idx.device)]

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        _check_points(x, self.dim)
        lp = torch.stack([c.log_prob(x) for c in self.components])  # [M, ...]
        logw = torch.log(self.weights).reshape(-1, *([1] * (lp.ndim - 1)))
        return torch.logsumexp(lp + logw, dim=0)


# ------------------------------------------------------------------------------ the ε-ball, exactly
def _log_iv_debye(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """log I_ν(x) by the uniform (Debye) expansion, three correction terms — for large ν."""
    z = x / nu
    s = np.sqrt(1.0 + z * z)
    p = 1.0 / s
    eta = s + np.log(z / (1.0 + s))
    u1 = (3 * p - 5 * p**3) / 24
    u2 = (81 * p**2 - 462 * p**4 + 385 * p**6) / 1152
    u3 = (30375 * p**3 - 369603 * p**5 + 765765 * p**7 - 425425 * p**9) / 414720
    return nu * eta - 0.5 * np.log(2 * np.pi * nu) - 0.5 * np.log(s) + np.log1p(u1 / nu + u2 / nu**2 + u3 / nu**3)


def _log_iv(nu: float, x: np.ndarray) -> np.ndarray:
    """log I_ν(x) for x > 0 in float64: scaled Bessel (ive), else the power series ₀F₁, else Debye."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        e = special.ive(nu, x)
        out = np.log(e) + x
        bad = ~(e > 1e-280) | ~np.isfinite(out)
        if bad.any():
            xb = x[bad]
            series = nu * np.log(xb / 2) - special.gammaln(nu + 1) + np.log(special.hyp0f1(nu + 1, xb * xb / 4))
            bad2 = ~np.isfinite(series)
            if bad2.any():
                series[bad2] = _log_iv_debye(np.full(int(bad2.sum()), nu), xb[bad2])
            out[bad] = series
    return out


def _ball_args(g_norm, alpha, eps: float, dim: int):
    """Validate, move to CPU float64 NumPy; return (x = ‖g‖ε/α, α, eps, dim, device), broadcast."""
    eps = check_positive("eps", eps)
    dim = check_int("dim", dim, minimum=1)
    device = g_norm.device if isinstance(g_norm, torch.Tensor) else (
        alpha.device if isinstance(alpha, torch.Tensor) else torch.device("cpu"))
    arrays = []
    for name, v in (("g_norm", g_norm), ("alpha", alpha)):
        if isinstance(v, torch.Tensor):
            if not (v.is_floating_point() or v.dtype in (torch.int32, torch.int64)):
                raise TypeError(f"{name} must be a real tensor, got dtype {v.dtype}")
            a = v.detach().to("cpu", torch.float64).numpy()
        elif isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            a = np.asarray(float(v))
        else:
            raise TypeError(f"{name} must be a number or a tensor, got {type(v).__name__}")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} must be finite, got NaN or inf")
        arrays.append(a)
    s, a = arrays
    if (s < 0).any():
        raise ValueError("g_norm must be >= 0")
    if (a <= 0).any():
        raise ValueError("alpha must be > 0")
    s, a = np.broadcast_arrays(s, a)
    return np.asarray(s * eps / a, dtype=np.float64), np.asarray(a, dtype=np.float64), eps, dim, device


def ball_log_partition(g_norm, alpha, eps: float, dim: int) -> torch.Tensor:
    """log Z for Z(‖g‖) = ∫_{‖Δ‖≤ε} exp(−Δᵀg/α) dΔ in ``dim`` dimensions, exactly and in log space.

    With x = ‖g‖ε/α and ν = d/2, integrating over the sphere then the radius gives
    Z = (2πε²/x)^{d/2} I_{d/2}(x) = vol(ε-ball) · ₀F₁(; d/2 + 1; x²/4), finite in log space for any x.
    ``g_norm`` and ``alpha`` broadcast (numbers or tensors); returns float64 on ``g_norm``'s device.
    Derived in notebook 01_optimization_as_sampling.
    """
    x, _, eps, dim, device = _ball_args(g_norm, alpha, eps, dim)
    nu = 0.5 * dim
    log_vol = log_ball_volume(dim, eps)
    out = np.full(x.shape, log_vol, dtype=np.float64)
    small = (x > 0) & (x * x / 4 <= 1.0)
    out[small] += np.log(special.hyp0f1(nu + 1, x[small] ** 2 / 4))
    big = x * x / 4 > 1.0
    if big.any():
        xb = x[big]
        out[big] = dim * math.log(eps) + nu * np.log(2 * np.pi / xb) + _log_iv(nu, xb)
    return torch.from_numpy(out).to(device)


def ball_partition(g_norm, alpha, eps: float, dim: int) -> torch.Tensor:
    """Z(‖g‖) = exp(:func:`ball_log_partition`); raises ``OverflowError`` rather than return inf (use the
    log version for large ‖g‖ε/α). Derived in notebook 01_optimization_as_sampling."""
    log_z = ball_log_partition(g_norm, alpha, eps, dim)
    if bool((log_z > 709.0).any()):
        raise OverflowError("Z overflows float64 here; use ball_log_partition")
    return log_z.exp()


def _bessel_ratio(nu: float, x: np.ndarray) -> np.ndarray:
    """I_{ν+1}(x) / I_ν(x) ∈ [0, 1) for x ≥ 0 (0 at x = 0)."""
    out = np.zeros_like(x)
    pos = x > 0
    if pos.any():
        xp = x[pos]
        with np.errstate(all="ignore"):
            num, den = special.ive(nu + 1, xp), special.ive(nu, xp)
            r = num / den
        bad = ~((num > 1e-280) & (den > 1e-280)) | ~np.isfinite(r)
        if bad.any():  # small x / large ν: the ratio of power series, free of Γ-function cancellation
            xb = xp[bad]
            with np.errstate(all="ignore"):
                series = xb / (2 * nu + 2) * special.hyp0f1(nu + 2, xb * xb / 4) / special.hyp0f1(nu + 1, xb * xb / 4)
            bad2 = ~np.isfinite(series)
            if bad2.any():
                series[bad2] = np.exp(_log_iv(nu + 1, xb[bad2]) - _log_iv(nu, xb[bad2]))
            r[bad] = series
        out[pos] = np.clip(r, 0.0, 1.0)
    return out


def ball_log_partition_derivative(g_norm, alpha, eps: float, dim: int) -> torch.Tensor:
    """Z'(‖g‖)/Z(‖g‖) = d log Z / d‖g‖ = (ε/α) · I_{d/2+1}(x) / I_{d/2}(x), x = ‖g‖ε/α.

    (From d/dx log[x^{−ν} I_ν(x)] = I_{ν+1}(x)/I_ν(x).) Returns float64 on ``g_norm``'s device.
    Derived in notebook 01_optimization_as_sampling."""
    x, a, eps, dim, device = _ball_args(g_norm, alpha, eps, dim)
    return torch.from_numpy(np.asarray(eps / a * _bessel_ratio(0.5 * dim, x))).to(device)


def ball_expected_update(g: torch.Tensor, alpha, eps: float) -> torch.Tensor:
    """Exact Δθ* for the linearized loss on the ball ‖Δθ‖ ≤ ε: for ``g [..., d]`` returns ``[..., d]``

        Δθ* = −α (Z'/Z) g/‖g‖ = −ε · I_{d/2+1}(x)/I_{d/2}(x) · g/‖g‖,   x = ‖g‖ε/α,

    which tends to −ε g/‖g‖ as α → 0 (steepest descent to the sphere) and to −ε²g/((d+2)α) → 0 as α → ∞
    (gradient descent with learning rate ε²/((d+2)α)). ``alpha`` is a number or broadcasts with
    ``g[..., 0]``. Same dtype and device as ``g``. Derived in notebook 01_optimization_as_sampling."""
    check_floating("g", g)
    if g.ndim < 1 or g.shape[-1] < 1:
        raise ValueError(f"g must have shape [..., d] with d >= 1, got {tuple(g.shape)}")
    check_finite("g", g)
    g_norm = torch.linalg.vector_norm(g.double(), dim=-1)
    x, _, eps, dim, _ = _ball_args(g_norm, alpha, eps, g.shape[-1])
    ratio = torch.from_numpy(_bessel_ratio(0.5 * dim, x)).to(g.device)
    unit = g.double() / g_norm.clamp_min(1e-300).unsqueeze(-1)
    return (-eps * ratio.unsqueeze(-1) * unit).to(g.dtype)


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
