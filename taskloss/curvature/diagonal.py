"""Diagonal-Fisher gradient preconditioning: ``p.grad ← p.grad / (D + λ)^power`` with ``D`` the Monte-Carlo,
empirical or exact (GGN) Fisher diagonal.

Derived in notebook 07_fisher_approximations (the empirical Fisher with ``power=½`` is the RMSProp/Adam-like
scaling). Follows the scale convention of :mod:`taskloss.curvature.fisher`.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from taskloss.curvature.fisher import (
    Likelihood,
    _check_likelihood,
    empirical_fisher_diagonal,
    ggn_diagonal,
    mc_fisher_diagonal,
    unflatten,
)
from taskloss.utils import check_int, check_positive, check_probability

__all__ = ["FisherDiagonalPreconditioner"]

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
