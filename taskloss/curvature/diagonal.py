"""Diagonal-Fisher gradient preconditioning: ``p.grad ← p.grad / (D + λ)^power`` with ``D`` the Monte-Carlo,
empirical or exact (GGN) Fisher diagonal.

Derived in notebook 07_fisher_approximations (the empirical Fisher with ``power=½`` is the RMSProp/Adam-like
scaling). Follows the scale convention of :mod:`taskloss.curvature.fisher`.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from taskloss.curvature.distributed import check_process_group, refuse_sharded
from taskloss.curvature.fisher import (
    IGNORE_INDEX,
    Likelihood,
    check_likelihood,
    empirical_fisher_diagonal,
    ggn_diagonal,
    mc_fisher_diagonal,
    unflatten,
)
from taskloss.curvature.model_io import check_precision
from taskloss.validation import (
    all_finite,
    check_generator,
    check_int,
    check_not_meta,
    check_positive,
    check_probability,
)

__all__ = ["FisherDiagonalPreconditioner"]

class FisherDiagonalPreconditioner:
    """Diagonal Fisher preconditioning: ``p.grad ← p.grad / (D + damping)^power`` for every parameter.

    ``D`` is a running average (``decay``) of the batch diagonal of the ``"mc"`` Fisher (labels drawn from the
    model), the ``"empirical"`` Fisher (observed labels; ``power=0.5`` gives an RMSProp/Adam-like scaling) or the
    ``"exact"`` GGN diagonal. Usage: ``loss.backward(); pre.update_statistics(inputs, targets); pre.precondition_();
    opt.step()``. Derived in notebook 07_fisher_approximations.

    Not a ``torch.optim.Optimizer``: it moves no parameter, it transforms the gradients an optimizer of the caller's
    choice applies (so its verb is ``precondition_()``, and learning rates and schedules live in that optimizer).
    Its statistics come in as :class:`~taskloss.curvature.kfac.KFAC`'s do, ``update_statistics(inputs, targets)``.

    Args:
        model: the network (in eval mode while ``update`` measures the diagonal; see
            :mod:`taskloss.curvature.fisher`); its parameters that require grad are preconditioned.
        fisher_type: ``"mc"`` | ``"empirical"`` | ``"exact"``.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        damping: ``λ > 0``; decay: running-average weight in ``[0, 1)``; power: ``> 0``. All three are plain
            attributes that may be changed between steps; they are checked when used and saved by ``state_dict``.
        n_samples, generator: MC labels per example and the generator drawing them (its state is checkpointed).
        ignore_index: the categorical label of a loss term that does not count (the empirical Fisher's targets).
        process_group: the ``torch.distributed`` ranks whose batches make one batch (``None``: the default group
            when initialized, else this process alone): each rank passes its local batch to ``update_statistics``
            and the diagonal is the concatenated batch's (one all-reduce per update, see
            :mod:`taskloss.curvature.fisher`), so every rank scales its (DDP-averaged) gradients identically. MC
            labels are drawn by each rank's own generator. Parameters sharded by FSDP are refused (``ValueError``:
            the diagonal is computed through ``torch.func`` on whole parameters).

    The model may return a ``ModelOutput`` and take a mapping of keyword tensors, its outputs may be per-token
    ``[N, T, C]`` (see :mod:`taskloss.curvature.fisher`); float16 / bfloat16 and meta parameters are refused.

    ``state_dict()`` / ``load_state_dict()`` hold the running diagonal, the hyperparameters and the generator's
    state, so a restored preconditioner continues bit-identically.
    """

    FISHER_TYPES = ("mc", "empirical", "exact")

    def __init__(self, model: nn.Module, fisher_type: str = "mc", *, likelihood: Likelihood = "categorical",
                 damping: float = 1e-3, decay: float = 0.95, power: float = 1.0, n_samples: int = 1,
                 generator: torch.Generator | None = None, ignore_index: int = IGNORE_INDEX, process_group=None):
        if not isinstance(model, nn.Module):
            raise TypeError("model must be an nn.Module")
        check_not_meta("the model", model)
        self.ignore_index = check_int("ignore_index", ignore_index)
        self.process_group = check_process_group(process_group)
        refuse_sharded(model, "FisherDiagonalPreconditioner")
        if fisher_type not in self.FISHER_TYPES:
            raise ValueError(f"fisher_type must be one of {self.FISHER_TYPES}, got {fisher_type!r}")
        check_likelihood(likelihood)
        check_generator("generator", generator)
        self.model, self.fisher_type, self.likelihood = model, fisher_type, likelihood
        self.damping, self.decay, self.power = damping, decay, power
        self._check_hyperparameters()
        self.n_samples = check_int("n_samples", n_samples, minimum=1)
        self.generator = generator
        self.params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise ValueError("model has no parameters that require grad")
        for k, p in self.params.items():
            check_precision(f"parameter {k!r}", p)
        self.diagonal: Tensor | None = None  # flat [P] running average

    def _check_hyperparameters(self) -> None:
        check_positive("damping", self.damping)
        if check_probability("decay", self.decay) == 1.0:
            raise ValueError("decay must be < 1 (decay = 1 never incorporates new statistics)")
        check_positive("power", self.power)

    def update_statistics(self, inputs, targets: Tensor | None = None, *, mask: Tensor | None = None) -> Tensor:
        """Measure the batch diagonal at the current parameters and fold it into the running average.

        Args:
            inputs: the batch ``[N, ...]``, or a mapping of keyword tensors (``model(**inputs)``).
            targets: the observed targets (needed by ``"empirical"``; labels equal to ``ignore_index`` do not count).
            mask: the loss terms that count (outputs' leading shape; default: a mapping's ``attention_mask`` of
                that shape), as in :mod:`taskloss.curvature.fisher`.

        Returns:
            The running diagonal, flat ``[P]``.

        Raises:
            ValueError: bad inputs or hyperparameters, no targets for the empirical Fisher.
        """
        self._check_hyperparameters()
        if self.fisher_type == "mc":
            d = mc_fisher_diagonal(self.model, self.params, inputs, self.likelihood, self.n_samples, self.generator,
                                   mask=mask, process_group=self.process_group)
        elif self.fisher_type == "empirical":
            if targets is None:
                raise ValueError("the empirical Fisher needs the observed targets")
            d = empirical_fisher_diagonal(self.model, self.params, inputs, targets, self.likelihood, mask=mask,
                                          ignore_index=self.ignore_index, process_group=self.process_group)
        else:
            d = ggn_diagonal(self.model, self.params, inputs, self.likelihood, mask=mask,
                             process_group=self.process_group)
        self.diagonal = d if self.diagonal is None else self.decay * self.diagonal + (1 - self.decay) * d
        return self.diagonal

    @torch.no_grad()
    def precondition_(self) -> None:
        """Rewrite every ``.grad`` with the preconditioned gradient (call before ``optimizer.step()``).

        Parameters without a gradient are skipped.

        Raises:
            RuntimeError: no statistics yet.
            ValueError: a NaN/inf gradient (named), bad hyperparameters.
        """
        if self.diagonal is None:
            raise RuntimeError("call update_statistics(inputs, targets) before precondition_()")
        self._check_hyperparameters()
        for k, p in self.params.items():
            if p.grad is not None and not all_finite(p.grad):
                raise ValueError(f"the gradient of {k!r} contains NaN or inf")
        scale = (self.diagonal + self.damping).pow(-self.power)
        for (k, p), s in zip(self.params.items(), unflatten(scale, self.params).values()):
            if p.grad is not None:
                p.grad.mul_(s)

    def state_dict(self) -> dict:
        """The running diagonal, ``damping``/``decay``/``power`` and the generator's state (copies)."""
        return {"diagonal": None if self.diagonal is None else self.diagonal.clone(),
                "damping": self.damping, "decay": self.decay, "power": self.power,
                "generator": None if self.generator is None else self.generator.get_state(),
                "fisher_type": self.fisher_type, "n_params": sum(p.numel() for p in self.params.values())}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved (checked against this preconditioner's model and type)."""
        if not isinstance(state, dict) or "diagonal" not in state:
            raise ValueError("not a FisherDiagonalPreconditioner state_dict")
        n = sum(p.numel() for p in self.params.values())
        if state["fisher_type"] != self.fisher_type or state["n_params"] != n:
            raise ValueError(f"state_dict is for fisher_type={state['fisher_type']!r} with {state['n_params']} "
                             f"parameters; this preconditioner has {self.fisher_type!r} with {n}")
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("state_dict and this preconditioner disagree on whether a generator is used")
        diag = state["diagonal"]
        ref = next(iter(self.params.values()))
        self.diagonal = None if diag is None else diag.detach().clone().to(device=ref.device)
        self.damping, self.decay, self.power = state["damping"], state["decay"], state["power"]
        self._check_hyperparameters()
        if self.generator is not None:
            self.generator.set_state(state["generator"])
