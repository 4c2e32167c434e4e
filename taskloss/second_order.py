"""Second-order optimizers built on :mod:`taskloss.curvature`: Hessian-free (truncated Gauss-Newton with CG and
Levenberg-Marquardt damping) and diagonal-Fisher gradient preconditioning.

Derived in notebook 07_fisher_approximations. They follow :mod:`taskloss.curvature`'s scale convention (the mean
NLL of a categorical or unit-variance Gaussian likelihood) and are re-exported by it, so
``from taskloss.curvature import HessianFree`` keeps working.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import Tensor, nn

from .curvature import (Likelihood, _check_likelihood, conjugate_gradient, empirical_fisher_diagonal, ggn_diagonal,
                        ggn_operator, mc_fisher_diagonal, unflatten)
from .utils import check_int, check_nonnegative, check_positive, check_probability

__all__ = ["HessianFree", "FisherDiagonalPreconditioner"]


# ------------------------------------------------------------------------------------------------ optimizers
def _named(params, model_fn) -> tuple[list[str], list[Tensor]]:
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = list(params)
        if items and isinstance(items[0], tuple):
            items = [(str(k), p) for k, p in items]
        elif isinstance(model_fn, nn.Module):
            names = {id(p): k for k, p in model_fn.named_parameters()}
            if any(id(p) not in names for p in items):
                raise ValueError("every parameter must belong to model_fn")
            items = [(names[id(p)], p) for p in items]
        else:
            items = [(str(i), p) for i, p in enumerate(items)]
    if not items:
        raise ValueError("optimizer got an empty parameter list")
    return [k for k, _ in items], [p for _, p in items]


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
        self._names, tensors = _named(params, model_fn)
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


class FisherDiagonalPreconditioner:
    """Diagonal Fisher preconditioning: ``p.grad ← p.grad / (D + damping)^power`` for every parameter.

    ``D`` is a running average (``decay``) of the batch diagonal of the ``"mc"`` Fisher (labels drawn from the
    model), the ``"empirical"`` Fisher (observed labels; ``power=0.5`` gives an RMSProp/Adam-like scaling) or the
    ``"exact"`` GGN diagonal. Usage: ``loss.backward(); pre.update(inputs, targets); pre.step(); opt.step()``.
    Derived in notebook 07_fisher_approximations.
    """

    FISHER_TYPES = ("mc", "empirical", "exact")

    def __init__(self, model: nn.Module, fisher_type: str = "mc", *, likelihood: Likelihood = "categorical",
                 damping: float = 1e-3, decay: float = 0.95, power: float = 1.0, n_samples: int = 1,
                 generator: torch.Generator | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError("model must be an nn.Module")
        if fisher_type not in self.FISHER_TYPES:
            raise ValueError(f"fisher_type must be one of {self.FISHER_TYPES}, got {fisher_type!r}")
        _check_likelihood(likelihood)
        self.model, self.fisher_type, self.likelihood = model, fisher_type, likelihood
        self.damping = check_positive("damping", damping)
        self.decay = check_probability("decay", decay)
        if self.decay == 1.0:
            raise ValueError("decay must be < 1 (decay = 1 never incorporates new statistics)")
        self.power = check_positive("power", power)
        self.n_samples = check_int("n_samples", n_samples, minimum=1)
        self.generator = generator
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ValueError("model has no parameters that require grad")
        self.diagonal: Tensor | None = None  # flat [P] running average

    def update(self, inputs: Tensor, targets: Tensor | None = None) -> Tensor:
        """Measure the batch diagonal at the current parameters and fold it into the running average."""
        if self.fisher_type == "mc":
            d = mc_fisher_diagonal(self.model, self.params, inputs, self.likelihood, self.n_samples, self.generator)
        elif self.fisher_type == "empirical":
            if targets is None:
                raise ValueError("the empirical Fisher needs the observed targets")
            d = empirical_fisher_diagonal(self.model, self.params, inputs, targets, self.likelihood)
        else:
            d = ggn_diagonal(self.model, self.params, inputs, self.likelihood)
        self.diagonal = d if self.diagonal is None else self.decay * self.diagonal + (1 - self.decay) * d
        return self.diagonal

    @torch.no_grad()
    def step(self) -> None:
        """Rewrite every ``.grad`` with the preconditioned gradient (call before ``optimizer.step()``)."""
        if self.diagonal is None:
            raise RuntimeError("call update(inputs, targets) before step()")
        scale = (self.diagonal + self.damping).pow(-self.power)
        for (k, p), s in zip(self.params.items(), unflatten(scale, self.params).values()):
            if p.grad is not None:
                p.grad.mul_(s)
