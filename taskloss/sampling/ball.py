"""The ε-ball case of optimization as sampling, in closed form. Derived in notebook 01_optimization_as_sampling.

For a linearized loss ``l(θ + Δ) − l(θ) = Δᵀg`` restricted to the ball ``‖Δ‖ ≤ ε`` (ε is the ``radius`` argument) the update density is
``p(Δ) ∝ exp(−Δᵀg/α)`` on the ball; its normalizer ``Z(‖g‖)`` and mean ``Δθ* = E_p[Δ]`` are Bessel-function
expressions of ``x = ‖g‖ε/α``: :func:`ball_log_partition` (exact, in log space), :func:`ball_partition`,
:func:`ball_log_partition_derivative` (``Z'/Z``) and :func:`ball_expected_update` (from steepest descent to the
sphere as α → 0 to gradient descent with a vanishing step as α → ∞); :func:`log_ball_volume` is the uniform
proposal's normalizer. Evaluated in float64 NumPy/SciPy, returned on the input's device.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import special

from taskloss.validation import check_finite, check_floating, check_int, check_not_meta, check_positive

__all__ = ["log_ball_volume", "ball_log_partition", "ball_partition", "ball_log_partition_derivative",
           "ball_expected_update"]


def log_ball_volume(dim: int, radius: float) -> float:
    """Log of the volume of the d-ball of ``radius``: (d/2) log π − log Γ(d/2 + 1) + d log r."""
    dim = check_int("dim", dim, minimum=1)
    radius = check_positive("radius", radius)
    return 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim + 1) + dim * math.log(radius)


# ------------------------------------------------------------------------------ the ε-ball, exactly
def _debye_u(nu, p):
    """1 + u₁(p)/ν + u₂(p)/ν² + u₃(p)/ν³ − 1 of the uniform expansion (its ``log1p`` argument)."""
    u1 = (3 * p - 5 * p**3) / 24
    u2 = (81 * p**2 - 462 * p**4 + 385 * p**6) / 1152
    u3 = (30375 * p**3 - 369603 * p**5 + 765765 * p**7 - 425425 * p**9) / 414720
    return u1 / nu + u2 / nu**2 + u3 / nu**3


def _log_iv_debye(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Log I_ν(x) by the uniform (Debye) expansion, three correction terms — for large ν."""
    z = x / nu
    s = np.hypot(1.0, z)          # √(1 + z²) without overflow for huge x
    p = 1.0 / s
    eta = s + np.log(z / (1.0 + s))
    return nu * eta - 0.5 * np.log(2 * np.pi * nu) - 0.5 * np.log(s) + np.log1p(_debye_u(nu, p))


def _log_ratio_debye(nu: float, x: np.ndarray) -> np.ndarray:
    """Log I_{ν+1}(x) − log I_ν(x) from the uniform expansion, written so that nothing of size x cancels.

    With R_μ = √(μ² + x²) the expansion reads log I_μ(x) ≈ R_μ + μ log x − μ log(μ + R_μ) − ½ log(2π R_μ)
    + log(1 + U_μ); the difference of the large terms is (2ν+1)/(R₁ + R₀), and the rest are logs of O(1)
    ratios. Used where scaled Bessel functions fail (x ≳ 1e10 in scipy)."""
    r0, r1 = np.hypot(nu, x), np.hypot(nu + 1, x)
    dr = (2 * nu + 1) / (r1 + r0)                                    # R₁ − R₀
    return (dr + np.log(x / (nu + 1 + r1)) - nu * np.log1p((1 + dr) / (nu + r0)) - 0.5 * np.log1p(dr / r0)
            + np.log1p(_debye_u(nu + 1, (nu + 1) / r1)) - np.log1p(_debye_u(nu, nu / r0)))


def _log_iv(nu: float, x: np.ndarray) -> np.ndarray:
    """Log I_ν(x) for x > 0 in float64: scaled Bessel (ive), else the power series ₀F₁, else Debye."""
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


def _ball_args(g_norm, alpha, radius: float, dim: int):
    """Validate, move to CPU float64 NumPy; return (x = ‖g‖ε/α, α, radius, dim, device), broadcast."""
    radius = check_positive("radius", radius)
    dim = check_int("dim", dim, minimum=1)
    device = g_norm.device if isinstance(g_norm, torch.Tensor) else (
        alpha.device if isinstance(alpha, torch.Tensor) else torch.device("cpu"))
    arrays = []
    for name, v in (("g_norm", g_norm), ("alpha", alpha)):
        if isinstance(v, torch.Tensor):
            check_not_meta(name, v)
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
    try:
        s, a = np.broadcast_arrays(s, a)
    except ValueError as e:
        raise ValueError(f"g_norm of shape {s.shape} and alpha of shape {a.shape} do not broadcast") from e
    with np.errstate(over="ignore"):
        x = np.asarray(s * radius / a, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("‖g‖·ε/α overflows float64 (g_norm too large or alpha too small for a finite log Z)")
    return x, np.asarray(a, dtype=np.float64), radius, dim, device


def ball_log_partition(g_norm, alpha, radius: float, dim: int) -> torch.Tensor:
    """Log Z for Z(‖g‖) = ∫_{‖Δ‖≤ε} exp(−Δᵀg/α) dΔ in ``dim`` dimensions, exactly and in log space.

    With x = ‖g‖ε/α and ν = d/2, integrating over the sphere then the radius gives
    Z = (2πε²/x)^{d/2} I_{d/2}(x) = vol(ε-ball) · ₀F₁(; d/2 + 1; x²/4), finite in log space for any x.
    ``g_norm`` and ``alpha`` broadcast (numbers or tensors); returns float64 on ``g_norm``'s device.
    Derived in notebook 01_optimization_as_sampling.
    """
    x, _, radius, dim, device = _ball_args(g_norm, alpha, radius, dim)
    nu = 0.5 * dim
    log_vol = log_ball_volume(dim, radius)
    out = np.full(x.shape, log_vol, dtype=np.float64)
    small = (x > 0) & (x <= 2.0)              # x²/4 ≤ 1, without squaring a huge x
    out[small] += np.log(special.hyp0f1(nu + 1, x[small] ** 2 / 4))
    big = x > 2.0
    if big.any():
        xb = x[big]
        out[big] = dim * math.log(radius) + nu * np.log(2 * np.pi / xb) + _log_iv(nu, xb)
    return torch.from_numpy(out).to(device)


def ball_partition(g_norm, alpha, radius: float, dim: int) -> torch.Tensor:
    """Z(‖g‖) = exp(:func:`ball_log_partition`); raises ``OverflowError`` rather than return inf (use the
    log version for large ‖g‖ε/α). Derived in notebook 01_optimization_as_sampling."""
    log_z = ball_log_partition(g_norm, alpha, radius, dim)
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
                series[bad2] = np.exp(_log_ratio_debye(nu, xb[bad2]))
            r[bad] = series
        out[pos] = np.clip(r, 0.0, 1.0)
    return out


def ball_log_partition_derivative(g_norm, alpha, radius: float, dim: int) -> torch.Tensor:
    """Z'(‖g‖)/Z(‖g‖) = d log Z / d‖g‖ = (ε/α) · I_{d/2+1}(x) / I_{d/2}(x), x = ‖g‖ε/α.

    (From d/dx log[x^{−ν} I_ν(x)] = I_{ν+1}(x)/I_ν(x).) Returns float64 on ``g_norm``'s device.
    Derived in notebook 01_optimization_as_sampling."""
    x, a, radius, dim, device = _ball_args(g_norm, alpha, radius, dim)
    return torch.from_numpy(np.asarray(radius / a * _bessel_ratio(0.5 * dim, x))).to(device)


def ball_expected_update(g: torch.Tensor, alpha, radius: float) -> torch.Tensor:
    """Exact Δθ* ``[..., d]`` for the linearized loss on the ball ‖Δθ‖ ≤ ε, for ``g [..., d]``.

        Δθ* = −α (Z'/Z) g/‖g‖ = −ε · I_{d/2+1}(x)/I_{d/2}(x) · g/‖g‖,   x = ‖g‖ε/α,

    which tends to −ε g/‖g‖ as α → 0 (steepest descent to the sphere) and to −ε²g/((d+2)α) → 0 as α → ∞
    (gradient descent with learning rate ε²/((d+2)α)). ``alpha`` is a number or broadcasts with
    ``g[..., 0]``. Same dtype and device as ``g``. Derived in notebook 01_optimization_as_sampling."""
    check_floating("g", g)
    if g.ndim < 1 or g.shape[-1] < 1:
        raise ValueError(f"g must have shape [..., d] with d >= 1, got {tuple(g.shape)}")
    check_finite("g", g)
    g64 = g.double()
    scale = g64.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    unit = g64 / scale                      # ‖g‖ = scale·‖g/scale‖: no overflow or underflow of the squares
    unit_norm = torch.linalg.vector_norm(unit, dim=-1, keepdim=True)
    g_norm = (scale * unit_norm).squeeze(-1)
    x, _, radius, dim, _ = _ball_args(g_norm, alpha, radius, g.shape[-1])
    ratio = torch.from_numpy(_bessel_ratio(0.5 * dim, x)).to(g.device)
    unit = unit / unit_norm.clamp_min(1e-300)
    return (-radius * ratio.unsqueeze(-1) * unit).to(g.dtype)
