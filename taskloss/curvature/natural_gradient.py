"""Natural gradient descent: the step given a Fisher matrix, and the geometry of Gaussians.

The general curvature machinery for networks (dense GGN, Monte-Carlo / empirical Fisher, GGN-vector products,
conjugate gradient, K-FAC) lives in the other modules of :mod:`taskloss.curvature.fisher`; this module holds what is
specific to the natural-gradient step (notebook 06_natural_gradient):

- :func:`natural_gradient`, :func:`trust_region_step`, :class:`NaturalGradientDescent` — the step
  ``-η (F + λI)⁻¹ g`` and its trust-region form;
- :func:`gaussian_kl`, :func:`gaussian_fisher`, :class:`CoupledGaussian` — KL between Gaussians, the closed-form
  Fisher of a parameterized Gaussian, the tightly coupled 2-D example.

The Gaussian exponential family — natural / moment / expectation parameters of ``N(m, V)``, the log-partition,
Bonnet / Price Monte-Carlo gradient estimators and the natural-gradient Gaussian-VI update (notebook
08_natural_gradient_exponential_families) — lives in :mod:`taskloss.curvature.gaussian_family`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch.func import jacfwd

from taskloss.curvature.gaussian_family import check_mean_cov, check_square, check_tensor, checked_cholesky
from taskloss.curvature.model_io import HALF
from taskloss.parameter_vectors import distinct_param_group, flatten
from taskloss.validation import (
    all_finite,
    check_bool,
    check_nonnegative,
    check_not_meta,
    check_positive,
    check_same_dtype,
)

__all__ = ["natural_gradient", "trust_region_step", "NaturalGradientDescent", "gaussian_kl", "gaussian_fisher",
           "CoupledGaussian"]


# ------------------------------------------------------------------------------------ the natural step
def natural_gradient(fisher: torch.Tensor, grad: torch.Tensor, damping: float = 0.0) -> torch.Tensor:
    """The natural gradient ``(F + λI)⁻¹ g`` by a Cholesky solve.

    ``fisher`` [..., P, P] symmetric positive (semi-)definite, ``grad`` [..., P], ``damping`` λ ≥ 0 (Tikhonov /
    Levenberg–Marquardt damping; needed when F is singular). Returns [..., P]. Raises when ``F + λI`` is not
    positive definite. Float16 / bfloat16 inputs are solved in float32 (the result is cast back to ``grad``'s dtype);
    otherwise ``fisher`` and ``grad`` must share one dtype (float32 with float64 is a ``TypeError``, not promoted).
    Derived in notebook 06_natural_gradient.
    """
    if isinstance(fisher, torch.Tensor) and isinstance(grad, torch.Tensor) and (fisher.dtype in HALF or
                                                                                 grad.dtype in HALF):
        out_dtype = grad.dtype if grad.is_floating_point() else fisher.dtype
        return natural_gradient(fisher.float(), grad.float(), damping).to(out_dtype)
    check_square("fisher", fisher)
    check_tensor("grad", grad)
    check_same_dtype(fisher=fisher, grad=grad)
    lam = check_nonnegative("damping", damping)
    if grad.shape[-1] != fisher.shape[-1]:
        raise ValueError(f"grad of shape {tuple(grad.shape)} does not match fisher {tuple(fisher.shape)}")
    if lam > 0:
        fisher = fisher + lam * torch.eye(fisher.shape[-1], dtype=fisher.dtype, device=fisher.device)
    chol = checked_cholesky("fisher + damping * I", fisher)
    return torch.cholesky_solve(grad.unsqueeze(-1), chol).squeeze(-1)


def trust_region_step(fisher: torch.Tensor, grad: torch.Tensor, max_kl: float,
                      damping: float = 0.0) -> torch.Tensor:
    """The solution ``δ`` of ``min gᵀδ  s.t.  ½ δᵀFδ ≤ ε`` (``ε = max_kl``): ``δ = -√(2ε / gᵀF⁻¹g) · F⁻¹g``.

    ``fisher`` [..., P, P], ``grad`` [..., P]; returns [..., P] (zero where ``g = 0``). The constraint is the
    second-order expansion of ``KL(p_θ ‖ p_{θ+δ})``. Float16 / bfloat16 inputs are solved in float32 (the result
    is cast back to ``grad``'s dtype); otherwise ``fisher`` and ``grad`` must share one dtype, as in
    :func:`natural_gradient`. Derived in notebook 06_natural_gradient.
    """
    if isinstance(fisher, torch.Tensor) and isinstance(grad, torch.Tensor) and (fisher.dtype in HALF or
                                                                                 grad.dtype in HALF):
        out_dtype = grad.dtype if grad.is_floating_point() else fisher.dtype
        return trust_region_step(fisher.float(), grad.float(), max_kl, damping).to(out_dtype)
    eps = check_positive("max_kl", max_kl)
    nat = natural_gradient(fisher, grad, damping)
    quad = (grad * nat).sum(-1, keepdim=True).clamp_min(0.0)
    scale = torch.where(quad > 0, torch.sqrt(2.0 * eps / quad.clamp_min(torch.finfo(quad.dtype).tiny)),
                        torch.zeros_like(quad))
    return -scale * nat


class NaturalGradientDescent(torch.optim.Optimizer):
    """``θ ← θ - lr · (F + Λ)⁻¹ ∇L`` with a dense Fisher supplied by a callable (torch.optim API).

    Derived in notebook 06_natural_gradient.

    Args:
        params: parameters or parameter groups; each group may carry its own ``lr`` and ``damping``.
        fisher: ``fisher()`` returns the ``[P, P]`` curvature matrix over all parameters of all groups, flattened in
            order (e.g. :func:`taskloss.curvature.fisher.ggn_matrix` of the model at its current parameters), or over
            only the parameters that have a gradient this step (``ggn_matrix(model, None, x)`` covers exactly the
            trainable ones).
        lr: step size ``> 0`` (default of the groups).
        damping: Tikhonov damping ``λ ≥ 0`` (default of the groups); ``Λ`` is diagonal with each coordinate's group
            ``λ`` (one λ for all groups gives the usual ``F + λI``).

    As in torch.optim, parameters without a ``.grad`` (unused by the loss) are skipped, and so are frozen ones
    (``requires_grad=False``, even with a stale ``.grad``): the step solves the natural-gradient system restricted
    to the parameters that have a gradient. A parameter listed twice is one parameter. ``step(closure)``
    re-evaluates the loss when a closure is given (the closure must call ``backward``) and returns it.
    Hyperparameters live in ``param_groups`` (checked at every step; a learning-rate scheduler works) and round-trip
    through ``state_dict``; there is no other state. Float16 / bfloat16 parameters are stepped with the direction
    solved in float32 (:func:`natural_gradient`); meta tensors are refused.

    Across ``torch.distributed`` ranks: the gradient is DDP's (wrap the model in ``DistributedDataParallel``, the
    local loss scaled as ``loss_sum_r · world / N_total`` when the ranks hold unequal batches) and ``fisher`` the
    concatenated batch's, e.g. ``lambda: ggn_matrix(ddp.module, None, local_inputs)`` (the Fisher functions
    all-reduce over the default group, or ``process_group=``): every rank then solves the same system and takes the
    same step. A dense Fisher needs whole parameters: FSDP-sharded models are not supported.
    """

    def __init__(self, params, fisher: Callable[[], torch.Tensor], lr: float = 0.1, damping: float = 0.0):
        if not callable(fisher):
            raise TypeError("fisher must be a callable returning the [P, P] curvature matrix")
        super().__init__(params, dict(lr=check_positive("lr", lr), damping=check_nonnegative("damping", damping)))
        self.fisher = fisher

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with each tensor of the group kept once (by identity); meta tensors are refused."""
        group = distinct_param_group(param_group)
        check_not_meta("a parameter", group["params"])
        super().add_param_group(group)

    def _fisher_block(self, params: list, active: list[bool], g: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            F = self.fisher()
        if not isinstance(F, torch.Tensor):
            raise TypeError(f"fisher() must return a tensor, got {type(F).__name__}")
        n_all = sum(p.numel() for p in params)
        if F.shape == (n_all, n_all) and n_all != g.numel():
            keep = torch.cat([torch.full((p.numel(),), a, dtype=torch.bool) for p, a in zip(params, active)])
            idx = keep.nonzero().squeeze(1).to(F.device)
            F = F.index_select(0, idx).index_select(1, idx)
        elif F.shape != (g.numel(), g.numel()):
            raise ValueError(f"fisher() returned shape {tuple(F.shape)}, expected {(n_all, n_all)} (all parameters) "
                             f"or {(g.numel(), g.numel())} (those with a gradient)")
        return F.detach().to(torch.float32 if g.dtype in HALF else g.dtype)  # (half precision: solved in float32)

    @torch.no_grad()
    def step(self, closure=None):
        """One natural-gradient step on every group; returns the closure's loss (``None`` without a closure).

        Raises:
            ValueError: a NaN/inf gradient, a Fisher of the wrong shape, bad hyperparameters.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            check_positive("lr", group["lr"])
            check_nonnegative("damping", group["damping"])
        params = [p for group in self.param_groups for p in group["params"]]
        active = [p.grad is not None and p.requires_grad for p in params]
        if not any(active):
            return loss
        g = flatten([p.grad for p, a in zip(params, active) if a])
        if not all_finite(g):
            raise ValueError("a parameter gradient contains NaN or inf")
        F = self._fisher_block(params, active, g)
        live = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None and
                p.requires_grad]
        lams = [group["damping"] for group, _ in live]
        if len(set(lams)) == 1:
            direction = natural_gradient(F, g, lams[0])
        else:
            sizes = [p.numel() for _, p in live]
            lam = torch.repeat_interleave(torch.tensor(lams, dtype=g.dtype), torch.tensor(sizes)).to(g.device)
            direction = natural_gradient(F + torch.diag(lam), g, 0.0)
        offset = 0
        for group, p in live:
            n = p.numel()
            p.add_(direction[offset:offset + n].view_as(p), alpha=-group["lr"])
            offset += n
        return loss


# --------------------------------------------------------------------------------- Gaussian geometry
def gaussian_kl(m0: torch.Tensor, V0: torch.Tensor, m1: torch.Tensor, V1: torch.Tensor) -> torch.Tensor:
    """``KL(N(m0, V0) ‖ N(m1, V1))`` in closed form, batched: means [..., d], covariances [..., d, d] → [...].

    ``½[tr(V1⁻¹V0) + (m1-m0)ᵀV1⁻¹(m1-m0) - d + log det V1 - log det V0]``, via Cholesky factors. The four
    tensors share one dtype (float32 or float64; mixing them is a ``TypeError``, not a float64 promotion).
    Derived in notebook 06_natural_gradient.
    """
    L0, L1 = check_mean_cov(m0, V0, "first "), check_mean_cov(m1, V1, "second ")
    check_same_dtype(m0=m0, V0=V0, m1=m1, V1=V1)
    if m0.shape[-1] != m1.shape[-1]:
        raise ValueError(f"dimensions differ: {m0.shape[-1]} vs {m1.shape[-1]}")
    d = m0.shape[-1]
    M = torch.linalg.solve_triangular(L1, L0, upper=False)              # L1⁻¹ L0
    diff = torch.linalg.solve_triangular(L1, (m1 - m0).unsqueeze(-1), upper=False).squeeze(-1)
    logdet = 2 * (torch.log(torch.diagonal(L1, dim1=-2, dim2=-1)) - torch.log(torch.diagonal(L0, dim1=-2, dim2=-1)))
    return 0.5 * (M.square().sum((-1, -2)) + diff.square().sum(-1) - d + logdet.sum(-1))


def gaussian_fisher(param_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                    theta: torch.Tensor) -> torch.Tensor:
    """Fisher of ``θ ↦ N(m(θ), V(θ))``: ``F_ij = ∂_i mᵀ V⁻¹ ∂_j m + ½ tr(V⁻¹ ∂_iV V⁻¹ ∂_jV)``.

    ``param_fn(theta [P]) -> (m [d], V [d, d])``; returns [P, P]. Jacobians by forward-mode autodiff.
    Derived in notebook 06_natural_gradient.
    """
    check_tensor("theta", theta)
    if theta.ndim != 1:
        raise ValueError(f"theta must be a vector [P], got shape {tuple(theta.shape)}")
    m, V = param_fn(theta)
    L = check_mean_cov(m, V)
    if m.ndim != 1:
        raise ValueError("param_fn must return a mean [d] and a covariance [d, d]")
    Jm, JV = jacfwd(lambda t: param_fn(t))(theta)                        # [d, P], [d, d, P]
    Vinv = torch.cholesky_inverse(L)
    A = torch.einsum("ij,jkp->pik", Vinv, JV)                            # V⁻¹ ∂_p V
    return Jm.T @ Vinv @ Jm + 0.5 * torch.einsum("pij,qji->pq", A, A)


class CoupledGaussian:
    """The tightly coupled 2-D example: ``p(x; θ) = N(x; μ(θ), I)``, ``μ(θ) = [3θ₁ + θ₂/3, θ₁/3] = Jθ``.

    The loss is ``KL(N(0, I) ‖ p_θ) = ½‖Jθ‖²`` (cross-entropy against data from ``p(·; 0)`` minus its entropy),
    its gradient ``Fθ`` and its Fisher the constant ``F = JᵀJ = [[9 + 1/9, 1], [1, 1/9]]``. Methods accept
    ``theta`` [..., 2]. Derived in notebook 06_natural_gradient.
    """

    def __init__(self, dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu"):
        if not isinstance(dtype, torch.dtype) or dtype in HALF or not dtype.is_floating_point:
            raise TypeError(f"dtype must be float32 or float64 (the closed forms use an eigendecomposition), got {dtype}")
        self.J = torch.tensor([[3.0, 1.0 / 3.0], [1.0 / 3.0, 0.0]], dtype=dtype, device=device)

    def _theta(self, theta):
        check_tensor("theta", theta)
        if theta.shape[-1] != 2:
            raise ValueError(f"theta must have last dimension 2, got shape {tuple(theta.shape)}")
        return theta.to(self.J.dtype)

    def mean(self, theta: torch.Tensor) -> torch.Tensor:
        """The mean ``μ(θ) = Jθ`` ``[..., 2]``."""
        return self._theta(theta) @ self.J.T

    def loss(self, theta: torch.Tensor) -> torch.Tensor:
        """The loss ``½‖Jθ‖²``."""
        return 0.5 * self.mean(theta).square().sum(-1)

    def grad(self, theta: torch.Tensor) -> torch.Tensor:
        """The gradient ``JᵀJθ = Fθ``."""
        return self.mean(theta) @ self.J

    def fisher(self) -> torch.Tensor:
        """The constant Fisher ``F = JᵀJ``."""
        return self.J.T @ self.J

    def log_prob(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """``log N(x; μ(θ), I)``."""
        check_tensor("x", x)
        return -0.5 * (x - self.mean(theta)).square().sum(-1) - math.log(2 * math.pi)

    def kl_after_steps(self, theta0: torch.Tensor, lr: float, steps: torch.Tensor | int,
                       natural: bool = False) -> torch.Tensor:
        """Closed-form loss after ``t`` steps of ``θ ← (I - lr·A)θ`` (A = F for descent, I for natural).

        ``KL_t = ½ Σ_i λ_i (1 - lr·a_i)^{2t} (u_iᵀθ₀)²`` with ``F = Σ λ_i u_i u_iᵀ`` and ``a_i = λ_i`` (steepest
        descent) or ``a_i = 1`` (natural gradient). ``steps`` int or LongTensor [T]; returns [T] (or scalar).
        """
        natural = check_bool("natural", natural)
        check_positive("lr", lr)
        theta0 = self._theta(theta0)
        if theta0.ndim != 1:
            raise ValueError("theta0 must be a single point [2]")
        t = torch.as_tensor(steps, device=self.J.device)
        if t.is_floating_point() or bool((t < 0).any()):
            raise ValueError("steps must be non-negative integers")
        lam, U = torch.linalg.eigh(self.fisher())
        a = torch.ones_like(lam) if natural else lam
        coef = 0.5 * lam * (U.T @ theta0).square()
        return (coef * (1 - lr * a).abs().pow(2 * t.to(lam.dtype).unsqueeze(-1))).sum(-1)
