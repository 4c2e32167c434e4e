"""Conjugate gradients and Hessian-free optimization: truncated Gauss-Newton with CG on GGN-vector products and
Levenberg-Marquardt damping (after Martens, *Deep learning via Hessian-free optimization*, ICML 2010).

Derived in notebook 07_fisher_approximations. Follows the scale convention of :mod:`taskloss.curvature.fisher`
(the mean NLL of a categorical or unit-variance Gaussian likelihood).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Mapping

import torch
from torch import Tensor

from taskloss.curvature.fisher import Likelihood, _check_likelihood, ggn_operator
from taskloss.utils import (
    all_finite,
    check_finite,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    flatten,
    named_tensors,
    unflatten,
)

__all__ = ["conjugate_gradient", "hessian_free_direction", "HessianFree"]


# ------------------------------------------------------------------------------------ conjugate gradients
def _cg_setup(matvec, b, x0):
    """Flat right-hand side, a flat matvec that checks shape and finiteness, and the flat starting point."""
    if not callable(matvec):
        raise TypeError("matvec must be callable")
    as_dict = isinstance(b, Mapping)
    like = dict(b) if as_dict else None
    if as_dict:
        if not like:
            raise ValueError("b must be a non-empty flat tensor or a dict of tensors")
        bf = flatten(like)
    elif not isinstance(b, Tensor) or b.ndim != 1 or b.numel() == 0:
        raise ValueError("b must be a non-empty flat tensor [P] or a dict of tensors")
    else:
        bf = b
    if not bf.is_floating_point():
        raise TypeError(f"b must be floating point, got dtype {bf.dtype}")
    check_finite("b", bf)

    def mv(x, it):
        out = matvec(unflatten(x, like)) if as_dict else matvec(x)
        if as_dict:
            if not isinstance(out, Mapping) or out.keys() != like.keys():
                raise ValueError("matvec must return a dict with the keys of b")
            out = flatten(out)
        if not isinstance(out, Tensor) or out.shape != bf.shape:
            raise ValueError(f"matvec returned shape {tuple(getattr(out, 'shape', ()))} at iteration {it}, "
                             f"expected {tuple(bf.shape)}")
        return out

    if x0 is None:
        x = torch.zeros_like(bf)
    else:
        x = (flatten(x0) if as_dict else x0).detach().clone()
        if not isinstance(x, Tensor) or x.shape != bf.shape:
            raise ValueError(f"x0 has shape {tuple(x.shape)}, expected {tuple(bf.shape)}")
        check_finite("x0", x)
    return bf, mv, x, like


def conjugate_gradient(matvec: Callable, b, damping: float = 0.0, max_iter: int = 50, tol: float = 1e-10,
                       x0=None, *, truncated: bool = False, return_info: bool = False):
    """Solve ``(A + λI) x = b`` by conjugate gradients for a symmetric positive (semi-)definite ``A``.

    CG needs ``pᵀ(A + λI)p > 0`` along every search direction ``p``. A direction whose curvature is not
    positive — or is positive only at rounding level, ``pᵀ(A + λI)p ≤ ε_dtype · ρ_max · ‖p‖²`` with ``ρ_max``
    the largest Rayleigh quotient seen so far — means the operator is indefinite or singular along ``p``.

    Args:
        matvec: ``v ↦ A v`` (flat ``[P]`` tensors, or dicts with the keys and shapes of ``b``).
        b: right-hand side, a non-empty flat floating tensor ``[P]`` or a dict name → tensor; finite.
        damping: ``λ ≥ 0`` added to the diagonal (Tikhonov / Levenberg-Marquardt).
        max_iter: iteration budget (≥ 1).
        tol: stop when the residual ``‖r‖ ≤ tol · ‖b‖``.
        x0: warm start (same kind as ``b``); zeros by default.
        truncated: ``False`` (default) — a solve: a direction of non-positive curvature raises ``ValueError``
            and running out of iterations without meeting ``tol`` issues a ``RuntimeWarning`` (unless
            ``return_info``, whose ``info["converged"]`` reports it). The returned solution is checked with one
            extra product, the true residual ``‖b − (A + λI)x‖``. ``True`` — truncated CG as used by
            Hessian-free optimization (Martens, ICML 2010): stop at the first direction of non-positive curvature
            or after ``max_iter`` and return the iterate so far together with ``info`` (always).
        return_info: also return ``info`` (implied by ``truncated``).

    Returns:
        ``x`` (same kind as ``b``), or ``(x, info)`` with ``info = {"iterations", "residual_norm",
        "relative_residual", "converged", "stop", "curvature"}``; ``stop`` is ``"converged"``, ``"max_iter"``,
        ``"nonpositive_curvature"`` or ``"inaccurate"`` (the recursive residual met ``tol`` but the true one did not:
        a singular or, for this dtype, too ill-conditioned operator); ``curvature`` is ``pᵀ(A + λI)p`` of the direction
        where CG stopped, else ``None``.

    Raises:
        ValueError: bad arguments; ``matvec`` returning a wrong shape or NaN/inf; and, unless ``truncated``,
            non-positive curvature — the message names the iteration and ``pᵀ(A + λI)p``.
    """
    damping = check_nonnegative("damping", damping)
    check_int("max_iter", max_iter, minimum=1)
    tol = check_nonnegative("tol", tol)
    bf, mv, x, like = _cg_setup(matvec, b, x0)
    r = bf - (mv(x, 0) + damping * x) if x0 is not None else bf.clone()
    p, rs = r.clone(), torch.dot(r, r)
    b_norm = float(bf.norm())
    eps = torch.finfo(bf.dtype).eps
    rayleigh_max, curvature, stop, it = 0.0, None, None, 0
    if b_norm == 0.0:
        x.zero_()
        rs, stop = torch.zeros_like(rs), "converged"
    while stop is None:
        if math.sqrt(float(rs)) <= tol * b_norm:
            stop = "converged"
            break
        if it == max_iter:
            stop = "max_iter"
            break
        ap = mv(p, it) + damping * p
        pap, pp = float(torch.dot(p, ap)), float(torch.dot(p, p))
        if not math.isfinite(pap):
            raise ValueError(f"conjugate_gradient: matvec returned NaN or inf at iteration {it} "
                             f"(pᵀ(A + λI)p = {pap})")
        if pap <= eps * rayleigh_max * pp:
            curvature, stop = pap, "nonpositive_curvature"
            if truncated:
                break
            raise ValueError(
                f"conjugate_gradient: non-positive curvature pᵀ(A + λI)p = {pap:.3e} (‖p‖² = {pp:.3e}) at iteration "
                f"{it}: the operator is indefinite or singular along the search direction. Add damping, check "
                "that matvec is symmetric positive semi-definite, or pass truncated=True to stop there and get "
                "the iterate with its info")
        rayleigh_max = max(rayleigh_max, pap / pp)
        alpha = float(rs) / pap
        x.add_(p, alpha=alpha)
        r.sub_(ap, alpha=alpha)
        rs_new = torch.dot(r, r)
        p = r + (rs_new / rs) * p
        rs, it = rs_new, it + 1
    res = math.sqrt(float(rs))
    if not truncated and b_norm > 0:
        res = float((bf - (mv(x, it) + damping * x)).norm())     # the true residual, not the recursive one
    if not math.isfinite(res) or not all_finite(x):
        raise ValueError("conjugate_gradient produced non-finite values (is the operator PSD and finite?)")
    rel = res / b_norm if b_norm > 0 else 0.0
    converged = stop == "converged"
    if not truncated:  # the recursive residual drifts from the true one by rounding: allow 100·tol (or 1000·ε)
        converged = rel <= tol or (converged and rel <= max(100 * tol, 1000 * eps))
        if stop == "converged" and not converged:
            stop = "inaccurate"  # singular or too ill-conditioned for this dtype
    info = {"iterations": it, "residual_norm": res, "relative_residual": rel, "converged": converged,
            "stop": stop, "curvature": curvature}
    if not truncated and not converged and not return_info:
        warnings.warn(f"conjugate_gradient did not converge ({stop}): relative residual {rel:.3e} > tol={tol:.1e} "
                      f"after {it} iterations (raise max_iter, add damping, or pass return_info=True to handle it)",
                      RuntimeWarning, stacklevel=2)
    out = unflatten(x, like) if like is not None else x
    return (out, info) if (return_info or truncated) else out


def hessian_free_direction(model_or_fn, params, inputs: Tensor, grad, likelihood: Likelihood = "categorical",
                           damping: float = 1e-3, cg_iters: int = 50, tol: float = 1e-10, x0=None,
                           return_info: bool = False):
    """Hessian-free natural gradient ``d ≈ (G + λI)⁻¹ grad`` by CG on GGN-vector products (a checked solve).

    Args:
        model_or_fn, params, inputs, likelihood: the GGN, as in :func:`taskloss.curvature.fisher.ggn_operator`.
        grad: flat ``[P]`` or a dict like ``params``.
        damping: ``λ > 0``; cg_iters, tol, x0: as ``max_iter``, ``tol``, ``x0`` of :func:`conjugate_gradient`.
        return_info: also return CG's ``info`` (otherwise running out of iterations warns).

    Returns:
        ``d`` (same kind as ``grad``; the update is ``θ ← θ − lr · d``), or ``(d, info)``.
    """
    check_positive("damping", damping)
    return conjugate_gradient(ggn_operator(model_or_fn, params, inputs, likelihood), grad, damping=damping,
                              max_iter=cg_iters, tol=tol, x0=x0, return_info=return_info)


# ------------------------------------------------------------------------------------------------ optimizers
class HessianFree(torch.optim.Optimizer):
    """Hessian-free natural gradient (truncated Gauss-Newton), after Martens, "Deep learning via Hessian-free
    optimization" (ICML 2010). Derived in notebook 07_fisher_approximations.

    One step solves ``(G + λI) d = g`` by truncated CG (:func:`conjugate_gradient` with ``truncated=True``,
    warm-started at ``warm_start · d_prev``), sets ``θ ← θ − lr·d`` and, with ``adapt_damping``, re-evaluates the
    loss: ``ρ = ΔL / q(−lr·d)`` (``q`` the undamped quadratic model) updates λ Levenberg-Marquardt style
    (ρ > ¾ → λ·⅔; ρ < ¼ → λ·3/2) and a step that raises the loss is undone.

    ``step(closure)`` follows torch.optim: ``closure()`` zeroes the gradients, computes the mean NLL (the
    convention of :mod:`taskloss.curvature.fisher`), calls ``backward()`` and returns the loss. The one difference
    from torch.optim: the GGN needs the model's *inputs*, which a loss closure does not expose. They come from,
    in this order: ``step(closure, inputs)``; the closure returning ``(loss, inputs)``; ``ggn_inputs`` given at
    construction (a fixed curvature batch). The closure is called twice per step when ``adapt_damping``.

    Args:
        params: the parameters (tensors of ``model_fn``, ``(name, tensor)`` pairs or a dict); one group.
        model_fn: the ``nn.Module`` owning ``params`` or ``fn(params_dict, inputs) → outputs [N, C]``.
        lr, damping, cg_iters, cg_tol, warm_start, min_damping: the hyperparameters, kept in ``param_groups``
            (``damping`` is adapted there).
        likelihood: ``"categorical"`` or ``"gaussian"``.
        adapt_damping: Levenberg-Marquardt adaptation of λ (and undoing of steps that raise the loss).
        ggn_inputs: a fixed curvature batch (optional).

    ``state_dict()`` holds λ and the previous direction, so a restored optimizer continues bit-identically.
    ``last_info`` holds CG's info of the last step and ``loss``, ``damping``, ``rho``, ``new_loss``, ``accepted``.
    """

    def __init__(self, params, model_fn, *, lr: float = 1.0, damping: float = 1.0, cg_iters: int = 20,
                 cg_tol: float = 1e-6, likelihood: Likelihood = "categorical", adapt_damping: bool = True,
                 warm_start: float = 0.95, min_damping: float = 1e-8, ggn_inputs: Tensor | None = None):
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
        if ggn_inputs is not None and not isinstance(ggn_inputs, Tensor):
            raise TypeError("ggn_inputs must be a torch.Tensor (the curvature batch)")
        self.model_fn, self.likelihood, self.adapt_damping = model_fn, likelihood, bool(adapt_damping)
        self.ggn_inputs = ggn_inputs
        self.last_info: dict = {}

    @staticmethod
    def _call(closure, finite: bool = True):
        with torch.enable_grad():
            out = closure()
        if isinstance(out, tuple) and len(out) != 2:
            raise ValueError("closure must return the loss or a pair (loss, ggn_inputs)")
        loss, inputs = out if isinstance(out, tuple) else (out, None)
        loss = torch.as_tensor(loss).detach()
        if loss.numel() != 1:
            raise ValueError(f"closure must return a scalar loss, got shape {tuple(loss.shape)}")
        loss = float(loss)
        if finite and not math.isfinite(loss):
            raise FloatingPointError(f"closure returned a non-finite loss ({loss})")
        return loss, inputs

    def _check_group(self, group) -> None:
        check_positive("lr", group["lr"])
        check_positive("damping", group["damping"])
        check_int("cg_iters", group["cg_iters"], minimum=1)

    def step(self, closure, inputs: Tensor | None = None):  # type: ignore[override]
        """One Hessian-free step; returns the loss before it. ``inputs``: the GGN batch (see the class doc)."""
        if not callable(closure):
            raise ValueError("HessianFree.step needs closure() (zeroes grads, computes the loss, calls backward, "
                             "returns the loss or (loss, ggn_inputs))")
        group = self.param_groups[0]
        self._check_group(group)
        ps = group["params"]
        loss, from_closure = self._call(closure)
        inputs = next((x for x in (inputs, from_closure, self.ggn_inputs) if x is not None), None)
        if inputs is None:
            raise ValueError("HessianFree needs the GGN batch: step(closure, inputs), a closure returning "
                             "(loss, inputs), or ggn_inputs= at construction")
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
        check_finite("gradient", g)
        params = dict(zip(self._names, (p.detach() for p in ps)))
        op = ggn_operator(self.model_fn, params, inputs, self.likelihood)
        state = self.state[ps[0]]
        x0 = state["direction"] * group["warm_start"] if "direction" in state else None
        d, info = conjugate_gradient(op, g, damping=group["damping"], max_iter=group["cg_iters"],
                                     tol=group["cg_tol"], x0=x0, truncated=True)
        state["direction"] = d
        lr = group["lr"]
        if self.adapt_damping:  # the quadratic model q(−lr·d) at the current parameters (before they move)
            predicted = float(-lr * torch.dot(g, d) + 0.5 * lr**2 * torch.dot(d, op(d)))
        with torch.no_grad():
            offsets = torch.cumsum(torch.tensor([0] + [p.numel() for p in ps]), 0).tolist()
            for p, a, b in zip(ps, offsets[:-1], offsets[1:]):
                p.sub_(lr * d[a:b].view_as(p))
        info.update(loss=loss, damping=group["damping"])
        if self.adapt_damping:
            new_loss = self._call(closure, finite=False)[0]  # NaN: the step is undone below
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
