"""Conjugate gradients and Hessian-free optimization: truncated Gauss-Newton with CG on GGN-vector products and
Levenberg-Marquardt damping (after Martens, *Deep learning via Hessian-free optimization*, ICML 2010).

Derived in notebook 07_fisher_approximations. Follows the scale convention of :mod:`taskloss.curvature.fisher`
(the mean NLL of a categorical or unit-variance Gaussian likelihood).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import torch
from torch import Tensor

from taskloss.curvature.fisher import Likelihood, _check_likelihood, flatten, ggn_operator, named_tensors, unflatten
from taskloss.utils import check_finite, check_int, check_nonnegative, check_positive, check_probability

__all__ = ["conjugate_gradient", "hessian_free_direction", "HessianFree"]


# ------------------------------------------------------------------------------------ conjugate gradients
def conjugate_gradient(matvec: Callable, b, damping: float = 0.0, max_iter: int = 50, tol: float = 1e-10,
                       x0=None, return_info: bool = False):
    """Solve ``(A + damping·I) x = b`` for symmetric PSD ``A`` given as ``matvec`` (flat tensors or param dicts).

    Stops after ``max_iter`` iterations, when ``‖r‖ ≤ tol·‖b‖``, or on non-positive curvature ``pᵀAp ≤ 0``.
    With ``return_info`` also returns ``{"iterations", "residual_norm", "converged"}``.
    """
    if not callable(matvec):
        raise TypeError("matvec must be callable")
    damping = check_nonnegative("damping", damping)
    check_int("max_iter", max_iter, minimum=1)
    tol = check_nonnegative("tol", tol)
    as_dict = isinstance(b, Mapping)
    if as_dict:
        like = dict(b)
        bf = flatten(like)
        mv = lambda x: flatten(matvec(unflatten(x, like)))  # noqa: E731
    else:
        if not isinstance(b, Tensor) or b.ndim != 1 or b.numel() == 0:
            raise ValueError("b must be a non-empty flat tensor or a dict of tensors")
        bf, mv = b, matvec
    check_finite("b", bf)
    x = torch.zeros_like(bf) if x0 is None else (flatten(x0) if as_dict else x0).detach().clone()
    if x.shape != bf.shape:
        raise ValueError(f"x0 has shape {tuple(x.shape)}, expected {tuple(bf.shape)}")
    r = bf - (mv(x) + damping * x) if x0 is not None else bf.clone()
    p, rs = r.clone(), torch.dot(r, r)
    b_norm = float(bf.norm())
    it, converged = 0, b_norm == 0.0
    if converged:
        x.zero_()
    while not converged and it < max_iter:
        if math.sqrt(float(rs)) <= tol * b_norm:
            converged = True
            break
        ap = mv(p) + damping * p
        pap = torch.dot(p, ap)
        if float(pap) <= 0.0:
            break
        alpha = rs / pap
        x.add_(alpha * p)
        r.sub_(alpha * ap)
        rs_new = torch.dot(r, r)
        p = r + (rs_new / rs) * p
        rs, it = rs_new, it + 1
    if not bool(torch.isfinite(x).all()):
        raise FloatingPointError("conjugate_gradient produced non-finite values (is the matrix PSD and finite?)")
    converged = converged or math.sqrt(float(rs)) <= tol * b_norm
    out = unflatten(x, like) if as_dict else x
    if return_info:
        return out, {"iterations": it, "residual_norm": math.sqrt(float(rs)), "converged": converged}
    return out


def hessian_free_direction(model_or_fn, params, inputs: Tensor, grad, likelihood: Likelihood = "categorical",
                           damping: float = 1e-3, cg_iters: int = 50, tol: float = 1e-10, x0=None):
    """Hessian-free natural gradient ``d ≈ (G + λI)⁻¹ grad`` by truncated CG on GGN-vector products.

    ``grad`` flat ``[P]`` or dict like ``params``; the update is ``θ ← θ − lr · d``.
    """
    check_positive("damping", damping)
    return conjugate_gradient(ggn_operator(model_or_fn, params, inputs, likelihood), grad, damping=damping,
                              max_iter=cg_iters, tol=tol, x0=x0)


# ------------------------------------------------------------------------------------------------ optimizers


class HessianFree(torch.optim.Optimizer):
    """Hessian-free natural gradient (truncated Gauss-Newton), after "Deep learning via Hessian-free optimization".

    ``step(closure, inputs)``: ``closure()`` zeroes grads, returns the mean NLL (module convention) after
    ``backward()``; ``inputs`` is the (possibly smaller) batch on which the GGN is measured. One step solves
    ``(G + λI) d = g`` by CG (warm-started at ``warm_start · d_prev``), sets ``θ ← θ − lr·d``, and, with
    ``adapt_damping``, re-evaluates the loss: ``ρ = ΔL / q(−lr·d)`` (``q`` the undamped quadratic model) updates λ
    Levenberg-Marquardt style (ρ > ¾ → λ·⅔; ρ < ¼ → λ·3/2) and a step that raises the loss is undone.
    ``model_fn`` is the ``nn.Module`` owning ``params`` or ``fn(params_dict, inputs) → outputs [N, C]``.
    Derived in notebook 07_fisher_approximations.
    """

    def __init__(self, params, model_fn, *, lr: float = 1.0, damping: float = 1.0, cg_iters: int = 20,
                 cg_tol: float = 1e-6, likelihood: Likelihood = "categorical", adapt_damping: bool = True,
                 warm_start: float = 0.95, min_damping: float = 1e-8):
        if not callable(model_fn):
            raise TypeError("model_fn must be an nn.Module or a callable fn(params, inputs)")
        _check_likelihood(likelihood)
        self._names, tensors = named_tensors(params, model_fn)
        defaults = dict(lr=check_positive("lr", lr), damping=check_positive("damping", damping),
                        cg_iters=check_int("cg_iters", cg_iters, minimum=1), cg_tol=check_nonnegative("cg_tol", cg_tol),
                        warm_start=check_probability("warm_start", warm_start),
                        min_damping=check_positive("min_damping", min_damping))
        super().__init__(tensors, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("HessianFree supports a single parameter group")
        self.model_fn, self.likelihood, self.adapt_damping = model_fn, likelihood, bool(adapt_damping)
        self.last_info: dict = {}

    def step(self, closure, inputs: Tensor | None = None):  # type: ignore[override]
        if closure is None or inputs is None:
            raise ValueError("HessianFree.step needs closure() (returns the loss after backward) and inputs")
        group = self.param_groups[0]
        ps = group["params"]
        with torch.enable_grad():
            loss = float(torch.as_tensor(closure()).detach())
        if not math.isfinite(loss):
            raise FloatingPointError(f"closure returned a non-finite loss ({loss})")
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
        params = dict(zip(self._names, (p.detach() for p in ps)))
        op = ggn_operator(self.model_fn, params, inputs, self.likelihood)
        state = self.state[ps[0]]
        x0 = state["direction"] * group["warm_start"] if "direction" in state else None
        d, info = conjugate_gradient(op, g, damping=group["damping"], max_iter=group["cg_iters"],
                                     tol=group["cg_tol"], x0=x0, return_info=True)
        state["direction"] = d
        lr = group["lr"]
        with torch.no_grad():
            offsets = torch.cumsum(torch.tensor([0] + [p.numel() for p in ps]), 0).tolist()
            for p, a, b in zip(ps, offsets[:-1], offsets[1:]):
                p.sub_(lr * d[a:b].view_as(p))
        info.update(loss=loss, damping=group["damping"])
        if self.adapt_damping:
            predicted = float(-lr * torch.dot(g, d) + 0.5 * lr**2 * torch.dot(d, op(d)))
            with torch.enable_grad():
                new_loss = float(torch.as_tensor(closure()).detach())
            rho = (new_loss - loss) / predicted if predicted < 0 else -1.0
            if rho > 0.75:
                group["damping"] = max(group["damping"] * 2 / 3, group["min_damping"])
            elif rho < 0.25:
                group["damping"] *= 1.5
            if not (new_loss <= loss):  # undo a step that did not decrease the loss (also catches NaN)
                with torch.no_grad():
                    for p, a, b in zip(ps, offsets[:-1], offsets[1:]):
                        p.add_(lr * d[a:b].view_as(p))
                state["direction"] = torch.zeros_like(d)
            info.update(rho=rho, new_loss=new_loss, accepted=new_loss <= loss)
        self.last_info = info
        return loss


