"""The diagnostics of one MGS step: losses, log-densities, weights, effective sample size, norms and seeds.

Filled by :meth:`taskloss.search.mgs.MGS.step` (derived in notebook 02_importance_sampling_and_mgs) into
``MGS.last_stats``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

__all__ = ["MGSStats"]


@dataclass
class MGSStats:
    """Diagnostics of one :meth:`MGS.step` (``MGS.last_stats``).

    Tensors are float64 on CPU, indexed by candidate ``[K']`` (K' = ``n_samples``, +1 with ``include_mle``:
    candidate 0 is then the exact step −∇l̃).
    """

    step: int
    task_losses: Tensor              # l(θ + Δθ_k)
    log_q: Tensor                    # log q(Δθ_k)
    log_weights: Tensor              # normalized log w_k
    weights: Tensor                  # normalized w_k
    ess: float                       # 1 / Σ w_k²
    from_mle: Tensor                 # bool: candidate drawn from (or equal to) the MLE-centred component
    mle_weight: float                # Σ_k w_k over MLE-centred candidates
    surrogate_loss: float            # l̃(θ)
    grad_norm: float                 # ‖∇l̃‖ before clipping
    update_norm: float               # ‖Δθ*‖ before update clipping
    sigmas: list[float]              # σ_t per parameter tensor
    seeds: list[int]                 # per-candidate noise seeds
    evaluation: str                  # how candidates were scored: "vmap", "vmap_forward" or "loop"
    deltas: list[dict[str, Tensor]] | None = None  # Δθ_k per candidate (only with MGS(keep_deltas=True))
    base: float | Callable[[], float] | None = field(default=None, repr=False, compare=False)

    @property
    def base_loss(self) -> float:
        """The task loss l(θ) at the parameters the step started from (it cancels in the weights).

        Computed inside the step with ``MGS(eager_base_loss=True)``; otherwise one forward on first access, at that
        step's parameters (kept in this object until then) with the model's buffers as they are now.
        """
        if callable(self.base):
            self.base = float(self.base())
        return self.base

    @property
    def best_index(self) -> int:
        """The candidate with the lowest task loss."""
        return int(torch.argmin(self.task_losses))

    def as_dict(self) -> dict[str, Any]:
        """Scalars only (for logging); reading ``base_loss`` may cost one forward (see :attr:`base_loss`)."""
        return {"step": self.step, "base_loss": self.base_loss, "best_task_loss": float(self.task_losses.min()),
                "ess": self.ess, "mle_weight": self.mle_weight, "surrogate_loss": self.surrogate_loss,
                "grad_norm": self.grad_norm, "update_norm": self.update_norm}
