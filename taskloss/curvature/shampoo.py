"""Shampoo: a Kronecker-factored preconditioner built from the gradients alone, with optional grafting; and the
Muon / AdamW split of a model's parameters for ``torch.optim.Muon``.

Shampoo (Gupta, Koren & Singer, "Shampoo: Preconditioned Stochastic Tensor Optimization", ICML 2018,
arXiv:1802.09568) keeps, for a weight whose gradient is the matrix ``G [m, n]``, the two statistics

    L ← β₂·L + (1 − β₂)·G Gᵀ        R ← β₂·R + (1 − β₂)·Gᵀ G        (β₂ = 1: the running sums L + GGᵀ, R + GᵀG)

and steps along ``D = (L + εI)^e  M  (R + εI)^e`` (``e`` = ``exponent``: −1/4 in the paper, −1/2 the "Shampoo²"
that Morwani et al., "A New Perspective on Shampoo's Preconditioner", arXiv:2406.17748, relate to the Gauss–Newton
matrix), with ``M`` the gradient or its running mean (``β₁``). K-FAC's factors are moments of layer inputs and
output gradients (``A = E[aaᵀ]``, ``G = E[ggᵀ]``); Shampoo's are moments of whole gradient matrices, so they need no
hooks and apply to every matrix-shaped parameter. They are folded with K-FAC's
:func:`~taskloss.curvature.kfac_math.fold_moment` (the same running second moment, with the gradient's columns or
rows as the "rows"). Derived in notebook 07_fisher_approximations, raced in notebook 16_update_rule_harness.

Grafting (Agarwal et al., "Disentangling Adaptive Gradient Methods from Learning Rates", arXiv:2002.11803; used by
the distributed Shampoo of Shi et al., arXiv:2309.06497): the step takes Shampoo's direction and the per-tensor norm
of a base optimizer's step (``"adam"``: ``torch.optim.Adam``'s, ``"sgd"``: the gradient's). Before
``start_preconditioning_step`` the base optimizer's step is taken as it is — the same operations as ``torch.optim``'s
single-tensor Adam / SGD, so Shampoo with the preconditioner disabled *is* its base (tested bit for bit).

Conventions: a tensor with ``ndim ≥ 2`` is preconditioned as the matrix ``[shape[0], rest]`` (K-FAC's view of a
Conv2d weight; pytorch_optimizer's Shampoo keeps one factor per dimension instead); a 1-D tensor gets the diagonal
of its one factor, ``M · (d + ε)^{2e}`` (AdaGrad / RMSProp for ``e = −1/4``); a side longer than
``max_preconditioner_dim`` is left unpreconditioned. Weight decay is coupled (added to the gradient, as in
``torch.optim.Adam``). Under DistributedDataParallel the gradient — Shampoo's only statistic — is already the
all-reduced mean when ``step`` runs, so the ranks' factors, roots and steps are bit-identical without a collective of
their own (tested with two gloo ranks).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import Tensor, nn

from taskloss.curvature.kfac_math import fold_moment
from taskloss.parameter_vectors import distinct_param_group
from taskloss.validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_param_list,
    check_positive,
)

__all__ = ["Shampoo", "matrix_power", "muon_with_adamw", "GRAFTINGS"]

#: the base optimizers whose step norm Shampoo can take (``"none"``: Shampoo's own step)
GRAFTINGS = ("adam", "sgd", "none")


def matrix_power(m: Tensor, exponent: float, epsilon: float) -> Tensor:
    """``(m + εI)^e`` of a symmetric PSD matrix through its eigendecomposition (eigenvalues clamped at 0 first).

    Args:
        m: a symmetric positive semi-definite floating matrix ``[d, d]``.
        exponent: the power ``e`` (negative: an inverse root), finite.
        epsilon: ``ε > 0``, added to every eigenvalue.

    Returns:
        The matrix ``Q diag((λ + ε)^e) Qᵀ``, in ``m``'s dtype.

    Raises:
        TypeError: ``m`` is not a floating tensor, ``exponent`` not a number.
        ValueError: ``m`` is not square, holds NaN or inf; ``exponent`` not finite; ``epsilon`` not > 0.
    """
    if not isinstance(m, Tensor) or not m.is_floating_point():
        raise TypeError(f"m must be a floating tensor, got {type(m).__name__}")
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"m must be a square matrix [d, d], got shape {tuple(m.shape)}")
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        raise TypeError(f"exponent must be a number, got {type(exponent).__name__}")
    if not math.isfinite(exponent):
        raise ValueError(f"exponent must be finite, got {exponent}")
    check_positive("epsilon", epsilon)
    if not torch.isfinite(m).all():
        raise ValueError("m holds NaN or inf")
    return _matrix_power(m, float(exponent), float(epsilon))


def _matrix_power(m: Tensor, exponent: float, epsilon: float) -> Tensor:
    lam, q = symmetric_eigh(m, epsilon)
    return (q * (lam.clamp(min=0) + epsilon).pow(exponent)) @ q.T


def symmetric_eigh(m: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh`` of a statistics matrix, robust to LAPACK's convergence failures: where the solver
    gives up on an ill-conditioned matrix with repeated eigenvalues (it does, on some CPU code paths, for a factor of
    a nearly rank-deficient layer), retry in float64, then on ``m + ε·I`` in float64 — the damping the step adds
    anyway — and return the result in ``m``'s dtype (eigenvalues of the latter shifted back by ε)."""
    try:
        return torch.linalg.eigh(m)
    except torch.linalg.LinAlgError:
        pass
    m64 = m.double()
    try:
        lam, q = torch.linalg.eigh(m64)
    except torch.linalg.LinAlgError:
        lam, q = torch.linalg.eigh(m64 + epsilon * torch.eye(m.shape[0], dtype=torch.float64, device=m.device))
        lam = lam - epsilon
    return lam.to(m.dtype), q.to(m.dtype)


def _check_betas(betas) -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"betas must be a pair (β₁, β₂), got {betas!r}")
    b1, b2 = (check_nonnegative(f"betas[{i}]", b) for i, b in enumerate(betas))
    if b1 >= 1 or b2 > 1:
        raise ValueError(f"betas must satisfy 0 ≤ β₁ < 1 and 0 ≤ β₂ ≤ 1, got {betas!r}")
    return b1, b2


def _check_exponent(exponent) -> float:
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)) or not -1 <= exponent < 0:
        raise ValueError(f"exponent must be a number in [-1, 0) (−1/4: Gupta et al.; −1/2: Shampoo²), got {exponent!r}")
    return float(exponent)


def _with_gradients(params, name: str):
    """The trainable parameters of a group that have a gradient, refusing sparse, complex or non-finite ones before
    the statistics see them (Shampoo's and SOAP's steps share it)."""
    for p in params:
        if p.grad is None or not p.requires_grad:
            continue
        if p.grad.is_sparse or torch.is_complex(p):
            raise ValueError(f"{name} needs dense real gradients")
        if not torch.isfinite(p.grad).all():
            raise ValueError(f"a gradient holds NaN or inf; {name}'s factors would be poisoned")
        yield p


class Shampoo(torch.optim.Optimizer):
    """Shampoo with optional grafting onto Adam or SGD (see the module docstring for the step).

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        lr: step size ``η > 0``.
        betas: ``(β₁, β₂)``: β₁ ∈ [0, 1) the running mean of the gradient that is preconditioned (0: the gradient),
            β₂ ∈ [0, 1] the factors' decay (1: running sums, as in Gupta et al.).
        exponent: the power ``e`` ∈ [−1, 0) applied to each factor (−1/4: the paper; −1/2: Shampoo²).
        epsilon: ``ε > 0`` added to the factors' eigenvalues before the root.
        precondition_interval: the roots are recomputed every this many steps (≥ 1).
        start_preconditioning_step: the first step that uses Shampoo's direction; before it the base optimizer's
            step is taken (≥ 1; ``1``: from the start).
        grafting: ``"adam"``, ``"sgd"`` or ``"none"`` (see :data:`~taskloss.curvature.shampoo.GRAFTINGS`); with ``"none"`` the steps before
            ``start_preconditioning_step`` are SGD's on ``M``.
        graft_betas: Adam's ``(β₁, β₂)`` for ``grafting="adam"``.
        graft_eps: Adam's ``eps``.
        weight_decay: coupled L2 coefficient ``λ ≥ 0`` (``g ← g + λθ``).
        max_preconditioner_dim: a side longer than this is not preconditioned.

    ``state[p]``: ``step``, the factors ``L``/``R`` (``D`` for a 1-D tensor), their roots ``L_root``/``R_root``
    (``D_root``), ``momentum`` (β₁ > 0) and the base's ``exp_avg``/``exp_avg_sq`` (Adam grafting). ``step(closure)``
    follows torch.optim; a learning-rate scheduler works; frozen parameters and those without ``.grad`` do not move; a
    parameter listed twice is stepped once; ``state_dict`` / ``load_state_dict`` resume bit-identically.
    Derived in notebook 07_fisher_approximations; raced in notebook 16_update_rule_harness.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.0, 1.0), exponent: float = -0.25,
                 epsilon: float = 1e-12, precondition_interval: int = 1, start_preconditioning_step: int = 1,
                 grafting: str = "adam", graft_betas: tuple[float, float] = (0.9, 0.999), graft_eps: float = 1e-8,
                 weight_decay: float = 0.0, max_preconditioner_dim: int = 8192):
        defaults = dict(lr=lr, betas=betas, exponent=exponent, epsilon=epsilon,
                        precondition_interval=precondition_interval,
                        start_preconditioning_step=start_preconditioning_step, grafting=grafting,
                        graft_betas=graft_betas, graft_eps=graft_eps, weight_decay=weight_decay,
                        max_preconditioner_dim=max_preconditioner_dim)
        self._validate_group(defaults)
        check_param_list(params)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with each tensor of the group kept once (by identity) and the group validated."""
        group = distinct_param_group(param_group)
        check_not_meta("params", group.get("params", []))
        super().add_param_group(group)
        self._validate_group(self.param_groups[-1])

    @staticmethod
    def _validate_group(group: dict) -> None:
        check_positive("lr", group["lr"])
        _check_betas(group["betas"])
        _check_exponent(group["exponent"])
        check_positive("epsilon", group["epsilon"])
        check_int("precondition_interval", group["precondition_interval"], minimum=1)
        check_int("start_preconditioning_step", group["start_preconditioning_step"], minimum=1)
        check_choice("grafting", group["grafting"], GRAFTINGS)
        gb1, gb2 = _check_betas(group["graft_betas"])
        if gb2 >= 1:
            raise ValueError(f"graft_betas[1] must be < 1, got {gb2}")
        check_positive("graft_eps", group["graft_eps"])
        check_nonnegative("weight_decay", group["weight_decay"])
        check_int("max_preconditioner_dim", group["max_preconditioner_dim"], minimum=1)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None):
        """One step on every parameter with a gradient; returns the closure's loss (``None`` without a closure).

        Raises:
            ValueError: a gradient holds NaN or inf, or a hyperparameter in ``param_groups`` is invalid.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._validate_group(group)
            for p in _with_gradients(group["params"], "Shampoo"):
                self._step_tensor(p, group)
        return loss

    def _step_tensor(self, p: Tensor, group: dict) -> None:
        """The five phases of one parameter's step: gradient, base step, statistics, roots, grafted update."""
        st = self.state[p]
        if not st:
            st["step"] = 0
        st["step"] += 1
        t = st["step"]
        g = p.grad if group["weight_decay"] == 0 else p.grad.add(p, alpha=group["weight_decay"])
        b1, b2 = group["betas"]
        if b1 > 0:                                        # M: the running mean of the gradient (or the gradient)
            if "momentum" not in st:
                st["momentum"] = torch.zeros_like(p)
            m = st["momentum"].lerp_(g, 1 - b1)
        else:
            m = g
        base = self._base_step(p, g, st, group, t)        # (numerator, denominator or None, step size)
        self._update_statistics(g, st, b2, group["max_preconditioner_dim"])
        if t < group["start_preconditioning_step"]:        # the base optimizer's step, exactly
            num, den, size = base if group["grafting"] != "none" else (m, None, group["lr"])
            if den is None:
                p.add_(num, alpha=-size)
            else:
                p.addcdiv_(num, den, value=-size)
            return
        if (t - group["start_preconditioning_step"]) % group["precondition_interval"] == 0 or "roots" not in st:
            st["roots"] = [None if f is None or f.ndim < 2 else _matrix_power(f, group["exponent"], group["epsilon"])
                           for f in st["factors"]]          # a 1-D tensor's diagonal factor is used as it is
        d = self._direction(m, st, group)
        if group["grafting"] != "none":
            num, den, size = base
            b = num if den is None else num / den
            d = d * (size / group["lr"] * b.norm() / d.norm().clamp(min=torch.finfo(d.dtype).tiny))
        p.add_(d, alpha=-group["lr"])

    @staticmethod
    def _base_step(p: Tensor, g: Tensor, st: dict, group: dict, t: int):
        """The grafted base's step as ``(numerator, denominator, size)``: ``θ ← θ − size·num/den``."""
        if group["grafting"] == "sgd":
            return g, None, group["lr"]
        if group["grafting"] == "none":
            return None
        gb1, gb2 = group["graft_betas"]
        if "exp_avg" not in st:
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        st["exp_avg"].lerp_(g, 1 - gb1)                  # torch.optim.Adam's single-tensor operations, in order
        st["exp_avg_sq"].mul_(gb2).addcmul_(g, g, value=1 - gb2)
        denom = (st["exp_avg_sq"].sqrt() / (1 - gb2 ** t) ** 0.5).add_(group["graft_eps"])
        return st["exp_avg"], denom, group["lr"] / (1 - gb1 ** t)

    @staticmethod
    def _update_statistics(g: Tensor, st: dict, b2: float, max_dim: int) -> None:
        """Fold ``G Gᵀ`` and ``Gᵀ G`` (a 1-D tensor: ``g²``) into the factors (``None``: a side not preconditioned)."""
        if "factors" not in st:
            sides = (g.numel(),) if g.ndim <= 1 else (g.shape[0], g.numel() // g.shape[0])
            st["factors"] = [None if (len(sides) == 2 and s > max_dim) else
                             g.new_zeros(s) if len(sides) == 1 else g.new_zeros(s, s) for s in sides]
        if g.ndim <= 1:
            sq = g.reshape(-1).square()
            st["factors"][0] = st["factors"][0].add_(sq) if b2 == 1 else st["factors"][0].lerp_(sq, 1 - b2)
            return
        mat = g.reshape(g.shape[0], -1)
        for i, rows in enumerate((mat.T, mat)):          # L = Σ GGᵀ has G's columns as rows; R = Σ GᵀG its rows
            f = st["factors"][i]
            if f is None:
                continue
            st["factors"][i] = f.addmm_(rows.T, rows) if b2 == 1 else fold_moment(f, rows, 1, b2)

    @staticmethod
    def _direction(m: Tensor, st: dict, group: dict) -> Tensor:
        """Shampoo's direction ``L^e M R^e`` (a 1-D tensor: ``M ⊙ (d + ε)^{2e}``), shaped like ``m``."""
        roots = st["roots"]
        if m.ndim <= 1:
            return m * (st["factors"][0].clamp(min=0) + group["epsilon"]).pow(2 * group["exponent"]).view_as(m)
        mat = m.reshape(m.shape[0], -1)
        if roots[0] is not None:
            mat = roots[0] @ mat
        if roots[1] is not None:
            mat = mat @ roots[1]
        return mat.view_as(m)


def muon_with_adamw(model: nn.Module, lr: float = 0.02, momentum: float = 0.95, adamw_lr: float = 1e-3,
                    weight_decay: float = 0.0, exclude: Iterable[str] = (), **muon_kwargs):
    """``torch.optim.Muon`` on the hidden matrices of ``model`` and ``torch.optim.AdamW`` on the rest.

    The split that ``torch.optim.Muon``'s documentation prescribes: Muon for 2-D weights of hidden layers; biases,
    norms, embeddings (``nn.Embedding`` weights) and the parameters named in ``exclude`` (e.g. an output head) to
    AdamW. Muon (Jordan et al., 2024) orthogonalizes each matrix's momentum by Newton–Schulz — steepest descent under
    the spectral norm (Bernstein & Newhouse, arXiv:2409.20325), Shampoo without accumulation (notebook
    07_fisher_approximations). Frozen parameters are left out; a shared parameter appears once.

    Args:
        model: the network.
        lr: Muon's learning rate.
        momentum: Muon's momentum.
        adamw_lr: AdamW's learning rate.
        weight_decay: both optimizers' decoupled weight decay.
        exclude: names (as in ``named_parameters``) of 2-D parameters to give AdamW.
        **muon_kwargs: further arguments of ``torch.optim.Muon`` (``nesterov``, ``ns_steps``, ``adjust_lr_fn``).

    Returns:
        ``(muon, adamw)``; either is ``None`` when it gets no parameter.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: a name in ``exclude`` that is not a trainable parameter of ``model``; no trainable parameter.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    exclude = set([exclude] if isinstance(exclude, str) else exclude)
    named = dict(model.named_parameters())              # shared parameters once, under their first name
    unknown = sorted(exclude - {n for n, p in named.items() if p.requires_grad})
    if unknown:
        raise ValueError(f"exclude names {unknown}, which are not trainable parameters of the model")
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matrices, rest = [], []
    for n, p in named.items():
        if not p.requires_grad:
            continue
        (matrices if p.ndim == 2 and n not in exclude and id(p) not in embeddings else rest).append(p)
    if not matrices and not rest:
        raise ValueError("the model has no trainable parameter")
    check_positive("lr", lr)
    check_positive("adamw_lr", adamw_lr)
    muon = torch.optim.Muon(matrices, lr=lr, momentum=momentum, weight_decay=weight_decay,
                            **muon_kwargs) if matrices else None
    adamw = torch.optim.AdamW(rest, lr=adamw_lr, weight_decay=weight_decay) if rest else None
    return muon, adamw
