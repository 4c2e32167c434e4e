"""The Gaussian as an exponential family: natural / moment / expectation parameters, the log-partition, the
Fisher of the natural parameters, Bonnet / Price Monte-Carlo gradients and natural-gradient Gaussian VI.

Derived in notebook 08_natural_gradient_exponential_families. The generic natural-gradient step and the Gaussian
geometry of notebook 06 (KL, closed-form Fisher, the coupled example) live in
:mod:`taskloss.curvature.natural_gradient`, which shares the validation helpers below (finite floating tensors,
square / symmetric positive definite matrices, mean-covariance pairs).

Symmetric-matrix parameters (``λ₂ = -½V⁻¹``, ``μ₂ = V + mmᵀ``) are turned into vectors with
:func:`sym_to_vec`, which scales off-diagonal entries by √2 so that the Frobenius inner product of matrices
equals the dot product of vectors — the Fisher of the natural parameters is then an ordinary invertible matrix.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch.func import grad, hessian, vmap

from taskloss.validation import (
    check_finite,
    check_floating,
    check_generator,
    check_int,
    check_not_meta,
    check_positive,
    check_same_dtype,
    check_steps,
)

__all__ = [
    "sym_to_vec", "vec_to_sym", "gaussian_to_natural", "gaussian_from_natural", "gaussian_to_expectation",
    "gaussian_from_expectation", "gaussian_log_partition", "gaussian_natural_fisher",
    "MCEstimate", "gaussian_samples", "bonnet_gradient", "price_gradient", "gaussian_natural_gradient",
    "gaussian_vi_natural_update", "NaturalGaussianVI", "check_tensor", "check_square", "checked_cholesky",
    "check_mean_cov",
]


# --------------------------------------------------------- validation (shared with taskloss.curvature.natural_gradient)
def check_tensor(name: str, x: torch.Tensor, ndim_min: int = 1) -> torch.Tensor:
    """``x`` after checking it is a finite, non-empty floating tensor of at least ``ndim_min`` dimensions.

    Args:
        name: the argument's name, for the message.
        x: the tensor.
        ndim_min: the fewest dimensions allowed.

    Returns:
        ``x``.

    Raises:
        TypeError: not a floating tensor, or a float16 / bfloat16 one (the Cholesky factorizations and solves need
            float32 or float64).
        ValueError: NaN/inf, too few dimensions, no entries, a meta tensor.
    """
    check_floating(name, x)
    check_not_meta(name, x)
    if x.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"{name} is {x.dtype}: the Gaussian's Cholesky factorizations and solves need float32 or "
                        f"float64; pass {name}.float()")
    check_finite(name, x)
    if x.ndim < ndim_min:
        raise ValueError(f"{name} must have at least {ndim_min} dimension(s), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)})")
    return x


def check_square(name: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` after checking it is a finite floating tensor whose last two dimensions are square (see
    :func:`check_tensor`); raises ``ValueError`` otherwise."""
    check_tensor(name, x, 2)
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dimensions, got shape {tuple(x.shape)}")
    return x


def checked_cholesky(name: str, x: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of the (symmetrized) ``x``; ``ValueError`` when ``x`` is not symmetric positive
    definite (the message names ``name``)."""
    asym = (x - x.transpose(-1, -2)).abs().amax()
    if bool(asym > 1e-6 * x.abs().amax() + 1e-12):
        raise ValueError(f"{name} is not symmetric (max |x - xᵀ| = {float(asym):.3g})")
    x = 0.5 * (x + x.transpose(-1, -2))
    chol, info = torch.linalg.cholesky_ex(x)
    if bool((info != 0).any()):
        raise ValueError(f"{name} is not symmetric positive definite (add damping or check the input)")
    return chol


def _matching(n1: str, v: torch.Tensor, n2: str, M: torch.Tensor) -> None:
    """Raise unless vector ``v [..., d]`` and matrix ``M [..., d, d]`` share ``d`` and broadcast in the batch."""
    try:
        ok = v.shape[-1] == M.shape[-1] and torch.broadcast_shapes(v.shape[:-1], M.shape[:-2]) is not None
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{n1} of shape {tuple(v.shape)} does not match {n2} of shape {tuple(M.shape)} "
                         "(expected [..., d] and [..., d, d] with broadcastable batch shapes)")


def check_mean_cov(m: torch.Tensor, V: torch.Tensor, name: str = "") -> torch.Tensor:
    """The Cholesky factor of ``V`` after checking a mean ``m [..., d]`` and a covariance ``V [..., d, d]``.

    Args:
        m: the mean.
        V: the covariance, symmetric positive definite.
        name: a prefix for the messages (e.g. ``"first "``).

    Returns:
        The lower Cholesky factor of ``V``.

    Raises:
        TypeError: a non-floating or half-precision tensor, or a mean and covariance of different dtypes (float32
            with float64: cast one, the computation is not promoted).
        ValueError: bad shapes or values, a covariance that is not positive definite.
    """
    check_tensor(f"{name}mean", m)
    check_square(f"{name}covariance", V)
    check_same_dtype(**{f"{name}mean": m, f"{name}covariance": V})
    _matching(f"{name}mean", m, "covariance", V)
    return checked_cholesky(f"{name}covariance", V)


# ------------------------------------------------------------------ Gaussian exponential-family parameters
def _sym_index(d: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row/column indices of the vector layout, and the [d, d] map from matrix entries to vector positions."""
    iu = torch.triu_indices(d, d, offset=1, device=device)
    rows = torch.cat([torch.arange(d, device=device), iu[0]])
    cols = torch.cat([torch.arange(d, device=device), iu[1]])
    pos = torch.empty(d, d, dtype=torch.long, device=device)
    pos[rows, cols] = torch.arange(rows.numel(), device=device)
    pos[cols, rows] = torch.arange(rows.numel(), device=device)
    return rows, cols, pos


def _sym_scale(rows, cols, like, off: float) -> torch.Tensor:
    ones = torch.ones(rows.shape, dtype=like.dtype, device=like.device)
    return torch.where(rows == cols, ones, ones * off)


def _sym_to_vec(S: torch.Tensor) -> torch.Tensor:
    d = S.shape[-1]
    rows, cols, _ = _sym_index(d, S.device)
    scale = _sym_scale(rows, cols, S, math.sqrt(2.0))
    return S[..., rows, cols] * scale


def _vec_to_sym(v: torch.Tensor, d: int) -> torch.Tensor:
    rows, cols, pos = _sym_index(d, v.device)
    scale = _sym_scale(rows, cols, v, 1.0 / math.sqrt(2.0))
    return (v * scale)[..., pos]


def sym_to_vec(S: torch.Tensor) -> torch.Tensor:
    """Symmetric [..., d, d] → [..., d(d+1)/2]: the diagonal, then the upper triangle row by row times √2.

    An isometry: ``⟨A, B⟩_F = sym_to_vec(A) · sym_to_vec(B)`` for symmetric A, B. Only the upper triangle is read.
    """
    return _sym_to_vec(check_square("S", S))


def vec_to_sym(v: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`sym_to_vec`: [..., d(d+1)/2] → symmetric [..., d, d]."""
    check_tensor("v", v)
    k = v.shape[-1]
    d = int(round((math.sqrt(8 * k + 1) - 1) / 2))
    if d * (d + 1) // 2 != k:
        raise ValueError(f"last dimension {k} is not d(d+1)/2 for any integer d")
    return _vec_to_sym(v, d)


def gaussian_to_natural(m: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m [.., d], V [.., d, d]) → (λ₁ = V⁻¹m, λ₂ = -½V⁻¹)``.

    Derived in notebook 08_natural_gradient_exponential_families.
    """
    L = check_mean_cov(m, V)
    P = torch.cholesky_inverse(L)
    return (P @ m.unsqueeze(-1)).squeeze(-1), -0.5 * P


def gaussian_from_natural(l1: torch.Tensor, l2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(λ₁, λ₂) → (m = -½λ₂⁻¹λ₁, V = -½λ₂⁻¹)``; requires ``λ₂`` negative definite.

    Derived in notebook 08_natural_gradient_exponential_families.
    """
    check_tensor("lambda1", l1)
    check_square("lambda2", l2)
    check_same_dtype(lambda1=l1, lambda2=l2)
    _matching("lambda1", l1, "lambda2", l2)
    L = checked_cholesky("-lambda2 (lambda2 must be negative definite)", -2.0 * l2)
    V = torch.cholesky_inverse(L)
    return (V @ l1.unsqueeze(-1)).squeeze(-1), V


def gaussian_to_expectation(m: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, V) → (μ₁ = E[z] = m, μ₂ = E[zzᵀ] = V + mmᵀ)``.

    Derived in notebook 08_natural_gradient_exponential_families.
    """
    check_mean_cov(m, V)
    return m, V + m.unsqueeze(-1) * m.unsqueeze(-2)


def gaussian_from_expectation(mu1: torch.Tensor, mu2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(μ₁, μ₂) → (m = μ₁, V = μ₂ - μ₁μ₁ᵀ)``; raises unless V is positive definite.

    Derived in notebook 08_natural_gradient_exponential_families.
    """
    check_tensor("mu1", mu1)
    check_square("mu2", mu2)
    check_same_dtype(mu1=mu1, mu2=mu2)
    _matching("mu1", mu1, "mu2", mu2)
    V = mu2 - mu1.unsqueeze(-1) * mu1.unsqueeze(-2)
    checked_cholesky("mu2 - mu1 mu1^T", V)
    return mu1, 0.5 * (V + V.transpose(-1, -2))


def _log_partition(l1: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    L = torch.linalg.cholesky(-2.0 * l2)                                 # LLᵀ = V⁻¹
    w = torch.linalg.solve_triangular(L, l1.unsqueeze(-1), upper=False).squeeze(-1)
    return (0.5 * w.square().sum(-1) - torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
            + 0.5 * l1.shape[-1] * math.log(2 * math.pi))


def gaussian_log_partition(l1: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """``A(λ) = -¼ λ₁ᵀλ₂⁻¹λ₁ - ½ log det(-2λ₂) + (d/2) log 2π`` with base measure ``h(z) = 1``.

    So ``log q(z) = λ₁ᵀz + zᵀλ₂z - A(λ)`` exactly; ``∇A = (μ₁, μ₂)``, ``∇²A`` = the Fisher. ``l1`` [..., d],
    ``l2`` [..., d, d] negative definite → [...]. Derived in notebook 08_natural_gradient_exponential_families.
    """
    gaussian_from_natural(l1, l2)  # validates
    return _log_partition(l1, l2)


def gaussian_natural_fisher(l1: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Fisher of the natural parameters, ``∇²A``, in the coordinates ``(λ₁, sym_to_vec(λ₂))``: [D, D].

    ``D = d + d(d+1)/2``; one distribution (``l1`` [d], ``l2`` [d, d]); by ``torch.func.hessian`` of the
    log-partition. Equals ``Cov[(z, sym_to_vec(zzᵀ))]`` under q.
    Derived in notebook 08_natural_gradient_exponential_families.
    """
    check_tensor("lambda1", l1)
    check_tensor("lambda2", l2)
    check_same_dtype(lambda1=l1, lambda2=l2)
    if l1.ndim != 1 or l2.ndim != 2:
        raise ValueError("gaussian_natural_fisher takes a single distribution: lambda1 [d], lambda2 [d, d]; got "
                         f"shapes {tuple(l1.shape)} and {tuple(l2.shape)}")
    gaussian_from_natural(l1, l2)  # validates shapes, symmetry and negative definiteness
    d = l1.shape[0]
    return hessian(lambda v: _log_partition(v[:d], _vec_to_sym(v[d:], d)))(torch.cat([l1, _sym_to_vec(l2)]))


# ----------------------------------------------------------------------- Bonnet / Price estimators
class MCEstimate(NamedTuple):
    """A Monte-Carlo mean and its standard error (sample std / √S), same shape."""

    mean: torch.Tensor
    stderr: torch.Tensor


def gaussian_samples(m: torch.Tensor, V: torch.Tensor, n_samples: int,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """``n_samples`` draws of ``N(m [d], V [d, d])`` as [S, d] (``z = m + Lε``, ``LLᵀ = V``).

    ``generator`` is ``None`` or a ``torch.Generator`` on any device (the draws are made there, then moved to
    ``m``'s); a seed or any other object is a ``TypeError``.
    """
    check_generator("generator", generator)
    L = check_mean_cov(m, V)
    # the draws [S, d] and a copy of them, estimated before they are drawn (n_samples=10**12 reached the allocator)
    check_steps("n_samples", n_samples, bytes_per_step=2.0 * m.shape[0] * m.element_size(), device=m.device)
    if m.ndim != 1:
        raise ValueError("m must be a vector [d]")
    gen_device = generator.device if generator is not None else m.device
    eps = torch.randn(n_samples, m.shape[0], dtype=m.dtype, device=gen_device, generator=generator).to(m.device)
    return m + eps @ L.T


def _mc(values: torch.Tensor) -> MCEstimate:
    n = values.shape[0]
    se = values.std(0, unbiased=True) / math.sqrt(n) if n > 1 else torch.full_like(values[0], float("inf"))
    return MCEstimate(values.mean(0), se)


def _derivatives(f: Callable, z: torch.Tensor, order: tuple[str, ...]) -> list[torch.Tensor]:
    """``vmap(grad f)(z)`` and/or ``vmap(hessian f)(z)`` after checking that ``f`` maps a point to a finite scalar;
    raise ``ValueError`` if any derivative is NaN/inf (naming how many of the ``S`` samples)."""
    if not callable(f):
        raise TypeError("f must be callable: point [d] -> scalar")
    y = f(z[0])
    if not isinstance(y, torch.Tensor) or y.numel() != 1 or y.ndim != 0:
        raise ValueError(f"f must map one point [d] to a scalar tensor, got "
                         f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}")
    out = []
    for kind in order:
        d = vmap(grad(f))(z) if kind == "grad" else vmap(hessian(f))(z)
        bad = ~torch.isfinite(d.reshape(d.shape[0], -1)).all(1)
        if bool(bad.any()):
            raise ValueError(f"the {'gradient' if kind == 'grad' else 'Hessian'} of f is NaN or inf at "
                             f"{int(bad.sum())} of {z.shape[0]} samples (e.g. z = {z[bad][0].tolist()})")
        out.append(d)
    return out


def bonnet_gradient(f: Callable[[torch.Tensor], torch.Tensor], m: torch.Tensor, V: torch.Tensor,
                    n_samples: int, generator: torch.Generator | None = None) -> MCEstimate:
    """Bonnet's theorem: ``∇_m E_{N(m,V)}[f(z)] = E[∇f(z)]``, estimated from ``n_samples`` draws → [d].

    ``f`` maps one point [d] to a scalar and must be differentiable with ``torch.func`` (it is vmapped).
    Derived in notebook 08_natural_gradient_exponential_families.
    """
    z = gaussian_samples(m, V, n_samples, generator)
    return _mc(_derivatives(f, z, ("grad",))[0])


def price_gradient(f: Callable[[torch.Tensor], torch.Tensor], m: torch.Tensor, V: torch.Tensor,
                   n_samples: int, generator: torch.Generator | None = None) -> MCEstimate:
    """Price's theorem: ``∇_V E_{N(m,V)}[f(z)] = ½ E[∇²f(z)]`` (V's entries taken as free) → [d, d].

    The derivative with respect to the single free entry ``V_ij = V_ji`` of a symmetric V is twice the
    off-diagonal entry of this matrix. Derived in notebook 08_natural_gradient_exponential_families.
    """
    z = gaussian_samples(m, V, n_samples, generator)
    return _mc(0.5 * _derivatives(f, z, ("hessian",))[0])


def gaussian_natural_gradient(f: Callable[[torch.Tensor], torch.Tensor], m: torch.Tensor, V: torch.Tensor,
                              n_samples: int, generator: torch.Generator | None = None
                              ) -> tuple[MCEstimate, MCEstimate]:
    """Natural gradient of ``E_{N(m,V)}[f]`` w.r.t. ``(λ₁, λ₂)``, equal to its gradient w.r.t. ``(μ₁, μ₂)``.

    ``(E[∇f] - E[∇²f] m,  ½ E[∇²f])`` from one set of ``n_samples`` draws (Bonnet + Price), each as an
    :class:`MCEstimate` of shape [d] and [d, d]. Derived in notebook 08_natural_gradient_exponential_families.
    """
    z = gaussian_samples(m, V, n_samples, generator)
    g, H = _derivatives(f, z, ("grad", "hessian"))
    return _mc(g - H @ m), _mc(0.5 * H)


# ------------------------------------------------------------------------ Gaussian variational inference
def _step_size(lr, batch_shape: torch.Size):
    """ρ in (0, 1] as a float, or a tensor of them broadcastable to ``batch_shape``."""
    if isinstance(lr, torch.Tensor):
        check_tensor("lr", lr, 0)
        if bool((lr <= 0).any()) or bool((lr > 1).any()):
            raise ValueError(f"lr must lie in (0, 1] for the natural-parameter update, got values in "
                             f"[{float(lr.min()):.3g}, {float(lr.max()):.3g}]")
        try:
            torch.broadcast_shapes(lr.shape, batch_shape)
        except RuntimeError as e:
            raise ValueError(f"lr of shape {tuple(lr.shape)} does not broadcast to the batch shape "
                             f"{tuple(batch_shape)}") from e
        return lr
    rho = check_positive("lr", lr)
    if rho > 1:
        raise ValueError(f"lr must lie in (0, 1] for the natural-parameter update, got {lr}")
    return rho


def gaussian_vi_natural_update(m: torch.Tensor, precision: torch.Tensor, grad_mean: torch.Tensor,
                               hess_mean: torch.Tensor, lr: float | torch.Tensor, prior_mean: torch.Tensor,
                               prior_precision: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One natural-gradient ascent step on ``ELBO = E_q[f] + E_q[log N(z; m₀, P₀⁻¹)] + H(q)``, q = N(m, P⁻¹).

    In natural parameters ``λ ← (1-ρ)λ + ρ(λ_prior + ∇_μ E_q[f])``, i.e.
    ``P' = (1-ρ)P + ρ(P₀ - E[∇²f])`` and ``m' = m + ρ P'⁻¹ (E[∇f] - P₀(m - m₀))``.

    Args:
        m: the current mean of q, [..., d] (leading batch dimensions update independent runs at once).
        precision: the current precision P of q, [..., d, d].
        grad_mean: an estimate of ``E_q[∇f]`` [..., d].
        hess_mean: an estimate of ``E_q[∇²f]`` [..., d, d].
        lr: ρ in (0, 1], a float or a tensor broadcastable to the batch shape ``m.shape[:-1]``.
        prior_mean: ``m₀`` [d] (or batch-broadcastable).
        prior_precision: ``P₀`` [d, d] (or batch-broadcastable).

    Returns ``(m', P')`` with the shapes of ``(m, precision)``. Raises ``ValueError`` on mismatched shapes,
    ρ outside (0, 1] or a ``P'`` that is not positive definite. Derived in notebook
    08_natural_gradient_exponential_families.
    """
    check_tensor("m", m)
    rho = _step_size(lr, m.shape[:-1])
    checked_cholesky("precision", check_square("precision", precision))
    if precision.shape != m.shape + m.shape[-1:]:
        raise ValueError(f"m must be [..., d] and precision [..., d, d], got {tuple(m.shape)} and "
                         f"{tuple(precision.shape)}")
    for name, x, want in (("grad_mean", grad_mean, m.shape), ("hess_mean", hess_mean, precision.shape)):
        if check_tensor(name, x).shape != want:
            raise ValueError(f"{name} must have shape {tuple(want)}, got {tuple(x.shape)}")
    check_square("prior_precision", prior_precision)
    _matching("prior_mean", check_tensor("prior_mean", prior_mean), "prior_precision", prior_precision)
    check_same_dtype(m=m, precision=precision, grad_mean=grad_mean, hess_mean=hess_mean, prior_mean=prior_mean,
                     prior_precision=prior_precision)
    if prior_mean.shape[-1] != m.shape[-1]:
        raise ValueError(f"prior_mean must have last dimension {m.shape[-1]}, got shape {tuple(prior_mean.shape)}")
    r = rho.unsqueeze(-1) if isinstance(rho, torch.Tensor) else rho                    # [..., 1]
    R = r.unsqueeze(-1) if isinstance(rho, torch.Tensor) else rho                      # [..., 1, 1]
    new_prec = (1 - R) * precision + R * (prior_precision - 0.5 * (hess_mean + hess_mean.transpose(-1, -2)))
    L = checked_cholesky("updated precision (E[hessian of f] not negative semi-definite? lower lr)", new_prec)
    resid = grad_mean - (prior_precision @ (m - prior_mean).unsqueeze(-1)).squeeze(-1)
    step = torch.cholesky_solve(resid.unsqueeze(-1), L).squeeze(-1)
    return m + r * step, 0.5 * (new_prec + new_prec.transpose(-1, -2))


class NaturalGaussianVI:
    """Stochastic natural-gradient Gaussian variational inference: ``q(z) = N(mean, precision⁻¹)``.

    Maximizes ``E_q[log_lik(z)] + E_q[log N(z; prior_mean, prior_precision⁻¹)] + H(q)``. Each :meth:`step` draws
    ``n_samples`` points, estimates ``E[∇ log_lik]`` and ``E[∇² log_lik]`` (Bonnet / Price) and applies
    :func:`gaussian_vi_natural_update`. ``log_lik`` maps a point [d] to a scalar (vmapped with torch.func).
    Derived in notebook 08_natural_gradient_exponential_families.

    Not a ``torch.optim.Optimizer``: it moves no tensor of the caller's — it *is* the variational distribution,
    owning its ``mean`` and ``precision`` and updating them in natural-parameter space from ``log_lik``, without
    gradients in ``.grad``. Its hyperparameters ``lr`` and ``n_samples`` are attributes (checked at every
    :meth:`step`, so a schedule may change ``lr``), and :meth:`state_dict` / :meth:`load_state_dict` carry the mean,
    the precision, the hyperparameters and the generator's state, so a restored object continues bit-identically.
    """

    def __init__(self, log_lik: Callable[[torch.Tensor], torch.Tensor], prior_mean: torch.Tensor,
                 prior_precision: torch.Tensor, lr: float = 0.1, n_samples: int = 8,
                 init_mean: torch.Tensor | None = None, init_precision: torch.Tensor | None = None,
                 generator: torch.Generator | None = None):
        if not callable(log_lik):
            raise TypeError("log_lik must be callable: point [d] -> scalar")
        self.prior_mean = check_tensor("prior_mean", prior_mean)
        if prior_mean.ndim != 1:
            raise ValueError("prior_mean must be a vector [d]")
        self.prior_precision = check_square("prior_precision", prior_precision)
        if prior_precision.shape != (prior_mean.shape[0],) * 2:
            raise ValueError("prior_precision must be [d, d] with d = len(prior_mean)")
        checked_cholesky("prior_precision", prior_precision)
        self.lr, self.n_samples = check_positive("lr", lr), check_int("n_samples", n_samples, minimum=1)
        if self.lr > 1:
            raise ValueError(f"lr must lie in (0, 1], got {lr}")
        self.log_lik, self.generator = log_lik, check_generator("generator", generator)
        self.mean = (prior_mean if init_mean is None else check_tensor("init_mean", init_mean)).clone()
        self.precision = (prior_precision if init_precision is None
                          else check_square("init_precision", init_precision)).clone()
        if self.mean.shape != prior_mean.shape or self.precision.shape != prior_precision.shape:
            raise ValueError("init_mean / init_precision must match the prior's shapes")
        check_same_dtype(prior_mean=prior_mean, prior_precision=prior_precision, init_mean=init_mean,
                         init_precision=init_precision)
        checked_cholesky("init_precision", self.precision)

    @property
    def covariance(self) -> torch.Tensor:
        """The covariance ``precision⁻¹`` of the current posterior."""
        return torch.cholesky_inverse(torch.linalg.cholesky(self.precision))

    def state_dict(self) -> dict:
        """Copies of the mean and precision, ``lr``, ``n_samples`` and the generator's state."""
        return {"mean": self.mean.clone(), "precision": self.precision.clone(), "lr": self.lr,
                "n_samples": self.n_samples,
                "generator": None if self.generator is None else self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`.

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ValueError: a state of other shapes, bad hyperparameters, or one that disagrees on the generator.
        """
        if not isinstance(state, dict) or not {"mean", "precision", "lr", "n_samples", "generator"} <= state.keys():
            raise ValueError("not a NaturalGaussianVI state_dict")
        if state["mean"].shape != self.mean.shape or state["precision"].shape != self.precision.shape:
            raise ValueError("state_dict is for another dimension")
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("state_dict and this NaturalGaussianVI disagree on whether a generator is used")
        self._check_hyperparameters(state["lr"], state["n_samples"])
        self.mean = state["mean"].detach().clone().to(self.mean)
        self.precision = state["precision"].detach().clone().to(self.precision)
        self.lr, self.n_samples = state["lr"], state["n_samples"]
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    @staticmethod
    def _check_hyperparameters(lr, n_samples) -> None:
        if check_positive("lr", lr) > 1:
            raise ValueError(f"lr must lie in (0, 1], got {lr}")
        check_int("n_samples", n_samples, minimum=1)

    def step(self) -> torch.Tensor:
        """One update.

        Returns:
            The Monte-Carlo estimate of ``E_q[log_lik]`` at the parameters before it.

        Raises:
            ValueError: ``lr`` or ``n_samples`` set to a bad value since construction.
        """
        self._check_hyperparameters(self.lr, self.n_samples)
        z = gaussian_samples(self.mean, self.covariance, self.n_samples, self.generator)
        values = vmap(self.log_lik)(z)
        g, H = (d.mean(0) for d in _derivatives(self.log_lik, z, ("grad", "hessian")))
        self.mean, self.precision = gaussian_vi_natural_update(
            self.mean, self.precision, g, H, self.lr, self.prior_mean, self.prior_precision)
        return values.mean()
