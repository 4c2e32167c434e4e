"""The diagnostics of one MGS step: losses, log-densities, weights, effective sample size, norms and seeds.

Filled by :meth:`taskloss.search.mgs.MGS.step` (derived in notebook 02_importance_sampling_and_mgs) into
``MGS.last_stats``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

__all__ = ["MGSStats", "ESS_WARNING", "collapse_message"]

#: the effective sample size below which a step warns: with two candidates, ESS < 1.5 means one holds > 79 % of the
#: weight, so the step is (nearly) one candidate, not an average
ESS_WARNING = 1.5


def collapse_message(stats: MGSStats, alpha: float, density: str, threshold: float = ESS_WARNING) -> str:
    """The warning text for a step whose weights collapsed: its ESS, which term caused it, and the remedy.

    The density term caused it when the task term alone, softmax(−l_k/α), would have kept the ESS at or above
    ``threshold`` (:attr:`MGSStats.task_ess`); otherwise the task losses differ by more than α allows.
    Derived in notebook 02_importance_sampling_and_mgs.

    Args:
        stats: the step's diagnostics.
        alpha: the temperature α of the step.
        density: the density the step used.
        threshold: the ESS below which a step counts as collapsed (``MGS``'s ``ess_warning``).

    Returns:
        One message naming the cause and the remedy.
    """
    K = len(stats.weights)
    lq = stats.log_q.tolist()
    finite = [x for x in stats.task_losses.tolist() if math.isfinite(x)]
    task_spread = (max(finite) - min(finite)) / alpha if finite else 0.0
    head = f"MGS's importance weights collapsed: effective sample size {stats.ess:.2f} of {K} candidates. "
    if stats.task_ess >= threshold and density != "flat":
        return head + (f"The proposal density decides them: −log q spreads over {max(lq) - min(lq):.3g} nats "
                       f"across the candidates against {task_spread:.3g} for the task term (task-loss differences / "
                       f"alpha), as it must with {density!r} in many dimensions (notebook 02 derives it). Use "
                       "density='flat' (the default), whose weights follow the task loss (the task term alone gives "
                       f"ESS {stats.task_ess:.2f}).")
    return head + (f"The task losses differ by up to {task_spread:.3g}·alpha, so one candidate takes (nearly) all "
                   f"the weight and the step is that candidate, not an average. Raise alpha towards the spread of "
                   f"the task losses (alpha={alpha:g} now) or use more candidates (n_samples) for a smoother step; "
                   "pass ess_warning=None to silence this.")



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
    task_ess: float = math.nan       # 1 / Σ v_k² of the task term alone, v = softmax(−l_k/α) (= ess with "flat")

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
                "ess": self.ess, "task_ess": self.task_ess, "mle_weight": self.mle_weight, "surrogate_loss": self.surrogate_loss,
                "grad_norm": self.grad_norm, "update_norm": self.update_norm}
