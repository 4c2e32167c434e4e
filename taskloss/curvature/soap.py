"""SOAP: Adam run in the eigenbasis of Shampoo's factors.

Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", arXiv:2409.11321 (reference code:
github.com/nikhilvyas/SOAP, ``soap.py``). For a weight whose gradient is the matrix ``G [m, n]`` SOAP keeps
Shampoo's factors as running means, ``L ← β_s·L + (1 − β_s)·GGᵀ`` and ``R ← β_s·R + (1 − β_s)·GᵀG`` (folded with
K-FAC's :func:`~taskloss.curvature.kfac_math.fold_moment`), their eigenvectors ``Q_L``, ``Q_R``, and runs Adam on the
rotated gradient ``G̃ = Q_Lᵀ G Q_R``::

    m ← β₁ m + (1 − β₁) G                      (first moment, kept in the original basis)
    v ← β₂ v + (1 − β₂) G̃ ⊙ G̃                 (second moment, in the eigenbasis)
    θ ← θ − η_t · Q_L [(Q_Lᵀ m Q_R) / (√v + ε)] Q_Rᵀ,   η_t = η √(1 − β₂ᵗ) / (1 − β₁ᵗ)
    θ ← (1 − ηλ) θ                             (decoupled weight decay)

With ``Q_L = Q_R = I`` this is AdamW; with the exact eigenbasis and β₂ = 1-style averages it is Shampoo with exponent
−1/2 run "diagonally in its own eigenbasis" (the paper's section 3). As in the reference code, the first call only
gathers the statistics and the first eigenbasis (``torch.linalg.eigh``; no parameter moves), and every
``precondition_frequency`` updates the basis is refreshed — by one power iteration and a QR decomposition, the second
moment re-ordered with the estimated eigenvalues (``eigenbasis="qr"``, the paper's), or by a new ``eigh``
(``eigenbasis="eigh"``). A 1-D tensor, and a side longer than ``max_preconditioner_dim``, is not rotated (Adam).
A tensor with ``ndim > 2`` is rotated as the matrix ``[shape[0], rest]`` (K-FAC's view; the reference rotates each
dimension). Under DistributedDataParallel the statistics are of the all-reduced gradient, so the ranks stay
bit-identical without a collective of their own.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from taskloss.curvature.kfac_math import fold_moment
from taskloss.curvature.shampoo import _check_betas, _with_gradients, symmetric_eigh
from taskloss.parameter_vectors import distinct_param_group
from taskloss.validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_param_list,
    check_positive,
    check_probability,
)

__all__ = ["SOAP", "EIGENBASIS_METHODS"]

#: how SOAP refreshes its eigenbasis: one power iteration + QR (the paper's) or a full eigendecomposition
EIGENBASIS_METHODS = ("qr", "eigh")


class SOAP(torch.optim.Optimizer):
    """SOAP (see the module docstring for the step).

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        lr: step size ``η > 0``.
        betas: Adam's ``(β₁, β₂)``, each in [0, 1).
        shampoo_beta: the factors' decay β_s ∈ [0, 1] (``None``: β₂, as in the reference).
        eps: Adam's ``ε > 0``.
        weight_decay: decoupled weight decay ``λ ≥ 0``.
        precondition_frequency: the eigenbasis is refreshed after every this many updates (≥ 1).
        max_preconditioner_dim: a side longer than this is not rotated.
        eigenbasis: ``"qr"`` or ``"eigh"`` (see :data:`~taskloss.curvature.soap.EIGENBASIS_METHODS`).

    ``state[p]``: ``step`` (Adam updates taken), ``exp_avg``, ``exp_avg_sq``, ``factors`` and ``Q`` (``None`` per
    side not rotated). ``step(closure)`` follows torch.optim; schedulers work; frozen parameters and those without a
    gradient do not move; a parameter listed twice is stepped once; ``state_dict`` round-trips bit-identically.
    Derived in notebook 07_fisher_approximations; raced in notebook 16_update_rule_harness.
    """

    def __init__(self, params, lr: float = 3e-3, betas: tuple[float, float] = (0.95, 0.95),
                 shampoo_beta: float | None = None, eps: float = 1e-8, weight_decay: float = 0.01,
                 precondition_frequency: int = 10, max_preconditioner_dim: int = 10000, eigenbasis: str = "qr"):
        defaults = dict(lr=lr, betas=betas, shampoo_beta=shampoo_beta, eps=eps, weight_decay=weight_decay,
                        precondition_frequency=precondition_frequency,
                        max_preconditioner_dim=max_preconditioner_dim, eigenbasis=eigenbasis)
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
        b1, b2 = _check_betas(group["betas"])
        if b2 >= 1:
            raise ValueError(f"betas[1] must be < 1, got {b2}")
        if group["shampoo_beta"] is not None:
            check_probability("shampoo_beta", group["shampoo_beta"])
        check_positive("eps", group["eps"])
        check_nonnegative("weight_decay", group["weight_decay"])
        check_int("precondition_frequency", group["precondition_frequency"], minimum=1)
        check_int("max_preconditioner_dim", group["max_preconditioner_dim"], minimum=1)
        check_choice("eigenbasis", group["eigenbasis"], EIGENBASIS_METHODS)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None):
        """One step on every parameter with a gradient (the first call per parameter only gathers statistics);
        returns the closure's loss (``None`` without a closure).

        Raises:
            ValueError: a gradient holds NaN or inf, or a hyperparameter in ``param_groups`` is invalid.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._validate_group(group)
            for p in _with_gradients(group["params"], "SOAP"):
                self._step_tensor(p, group)
        return loss

    def _step_tensor(self, p: Tensor, group: dict) -> None:
        st = self.state[p]
        g = p.grad
        beta_s = group["betas"][1] if group["shampoo_beta"] is None else group["shampoo_beta"]
        if not st:                                           # the first call: statistics and eigenbasis only
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p)
            st["exp_avg_sq"] = torch.zeros_like(p)
            sides = (g.shape[0], g.numel() // g.shape[0]) if g.ndim >= 2 else ()
            st["factors"] = [None if s > group["max_preconditioner_dim"] else g.new_zeros(s, s) for s in sides]
            self._fold(g, st, beta_s)
            st["Q"] = [None if f is None else _eigenvectors(f) for f in st["factors"]]
            return
        st["step"] += 1
        t = st["step"]
        b1, b2 = group["betas"]
        exp_avg, exp_avg_sq = st["exp_avg"], st["exp_avg_sq"]
        exp_avg.lerp_(g, 1 - b1)
        exp_avg_sq.lerp_(_rotate(g, st["Q"]).square(), 1 - b2)
        denom = exp_avg_sq.sqrt().add_(group["eps"])
        update = _rotate(_rotate(exp_avg, st["Q"]) / denom, st["Q"], back=True)
        p.add_(update, alpha=-group["lr"] * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t))
        if group["weight_decay"]:
            p.mul_(1 - group["lr"] * group["weight_decay"])
        self._fold(g, st, beta_s)
        if t % group["precondition_frequency"] == 0:
            if group["eigenbasis"] == "eigh":
                st["Q"] = [None if f is None else _eigenvectors(f) for f in st["factors"]]
            else:
                self._power_qr(st)

    @staticmethod
    def _fold(g: Tensor, st: dict, beta_s: float) -> None:
        """``L ← β_s L + (1 − β_s) GGᵀ``, ``R ← β_s R + (1 − β_s) GᵀG`` for the sides that are rotated."""
        if g.ndim < 2:
            return
        mat = g.reshape(g.shape[0], -1)
        for i, rows in enumerate((mat.T, mat)):
            if st["factors"][i] is not None:
                st["factors"][i] = fold_moment(st["factors"][i], rows, 1, beta_s) if beta_s > 0 \
                    else rows.T @ rows

    @staticmethod
    def _power_qr(st: dict) -> None:
        """One power iteration ``F Q`` per factor, columns sorted by the estimated eigenvalues ``diag(Qᵀ F Q)``
        (descending; the second moment re-ordered alike), orthonormalized by QR."""
        v = st["exp_avg_sq"].reshape(st["exp_avg_sq"].shape[0], -1)
        for i, (f, q) in enumerate(zip(st["factors"], st["Q"])):
            if f is None:
                continue
            fq = f @ q
            order = torch.argsort((q * fq).sum(dim=0), descending=True)
            v = v.index_select(i, order)
            st["Q"][i] = torch.linalg.qr(fq.index_select(1, order)).Q
        st["exp_avg_sq"] = v.reshape(st["exp_avg_sq"].shape).contiguous()


_EIGH_JITTER = 1e-12     # the shift of the last-resort float64 retry, relative to the factor's diagonal


def _eigenvectors(f: Tensor) -> Tensor:
    """The eigenvectors of a symmetric factor, by descending eigenvalue."""
    return symmetric_eigh(f, _EIGH_JITTER * float(f.diagonal().abs().max().clamp(min=1.0)))[1].flip(1)


def _rotate(x: Tensor, qs: list, back: bool = False) -> Tensor:
    """``Q_Lᵀ X Q_R`` (``back``: ``Q_L X Q_Rᵀ``) of a tensor as its ``[shape[0], rest]`` matrix; identity where a
    side has no basis (``None``) and for 1-D tensors."""
    if not qs:
        return x
    mat = x.reshape(x.shape[0], -1)
    ql, qr = qs
    if ql is not None:
        mat = (ql if back else ql.T) @ mat
    if qr is not None:
        mat = mat @ (qr.T if back else qr)
    return mat.reshape(x.shape)
