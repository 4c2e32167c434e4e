"""Smoothness along a training trajectory and the (L0, L1)-smoothness fit.

Derived in notebook 11_gradient_clipping. Source: Zhang, He, Sra & Jadbabaie, *Why gradient clipping accelerates
training: a theoretical justification for adaptivity* (ICLR 2020), whose relaxed condition is::

    ‖∇²f(θ)‖ ≤ L0 + L1·‖∇f(θ)‖            ((L0, L1)-smoothness; L1 = 0 is ordinary L-smoothness)

and whose evidence is the local smoothness measured along the trajectory,
``L̂_t = ‖∇f(θ_{t+1}) − ∇f(θ_t)‖ / ‖θ_{t+1} − θ_t‖`` (same mini-batch at both points), plotted against
``‖∇f(θ_t)‖``. By the mean-value theorem ``L̂_t`` is at most the largest ``‖∇²f‖`` on the segment.

:func:`local_smoothness` works on a pure loss function (see :mod:`taskloss.dynamics.hessian`);
:class:`TrajectorySmoothness` on an ``nn.Module`` trained the usual way (autograd, ``.grad``, any optimizer);
:func:`fit_l0_l1` fits the constants to the pairs, by least squares and by the tightest upper envelope.
The top Hessian eigenvalue (whose ``|λ|`` is that ``‖∇²f‖``) is
:func:`taskloss.dynamics.hessian.top_hessian_eigenvalue`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from taskloss.dynamics.hessian import Params, check_params, check_same_structure, checked_loss_fn, loss_gradient
from taskloss.parameter_vectors import flatten, unique_tensors
from taskloss.validation import check_finite, check_iterable, check_not_meta

__all__ = ["local_smoothness", "SmoothnessSample", "TrajectorySmoothness", "fit_l0_l1", "SmoothnessFit"]


# -------------------------------------------------------------------------------- smoothness along a path
@dataclass(frozen=True)
class SmoothnessSample:
    """One trajectory probe (floats): ``smoothness = ‖∇f(θ') − ∇f(θ)‖ / ‖θ' − θ‖`` and its ingredients."""

    smoothness: float
    grad_norm: float          # ‖∇f(θ)‖
    grad_norm_next: float     # ‖∇f(θ')‖
    step_norm: float          # ‖θ' − θ‖


def local_smoothness(loss_fn: Callable, params: Params, params_next: Params,
                     grad: Params | None = None) -> SmoothnessSample:
    """Finite-difference smoothness between two points of a trajectory, on one fixed loss (same mini-batch).

    ``L̂ = ‖∇f(θ') − ∇f(θ)‖ / ‖θ' − θ‖``; by the mean-value theorem ``L̂ ≤ max_{s∈[0,1]} ‖∇²f(θ + s(θ' − θ))‖``.

    Args:
        loss_fn: ``params → 0-d tensor`` (the same batch at both points, else the probe measures noise).
        params: θ_t.
        params_next: θ_{t+1}, same structure.
        grad: ∇f(θ_t) if already computed (saves one gradient).

    Returns:
        A :class:`SmoothnessSample`.

    Raises:
        ValueError: ``params_next == params`` (no step), mismatched structures, non-finite values.

    Derived in notebook 11_gradient_clipping.
    """
    check_params("params", params)
    check_params("params_next", params_next)
    check_same_structure(params, params_next)
    g0 = loss_gradient(loss_fn, params)[1] if grad is None else check_params("grad", grad)
    g1 = loss_gradient(loss_fn, params_next)[1]
    return _sample(flatten(g0), flatten(g1), flatten(params), flatten(params_next))


def _sample(g0: Tensor, g1: Tensor, t0: Tensor, t1: Tensor) -> SmoothnessSample:
    """The finite-difference ratio from flat gradients and parameters (float64 norms)."""
    step = float((t1.double() - t0.double()).norm())
    if step == 0.0:
        raise ValueError("the parameters did not move: the smoothness of a zero step is undefined")
    dg = float((g1.double() - g0.double()).norm())
    return SmoothnessSample(dg / step, float(g0.double().norm()), float(g1.double().norm()), step)


class TrajectorySmoothness:
    """The trajectory probe for an ``nn.Module`` trained the usual way (autograd, ``.grad``, any optimizer).

    Usage, with the same batch on both sides of the step::

        probe = TrajectorySmoothness(model.parameters())
        loss = closure(); loss.backward()
        probe.before_step()                 # snapshots θ_t and ∇f(θ_t) (before a clipping optimizer edits .grad)
        optimizer.step()
        sample = probe.after_step(closure)  # ∇f(θ_{t+1}) on the same batch, by torch.autograd.grad

    ``after_step`` leaves ``.grad`` untouched. Parameters without a gradient count as zero gradient.

    Args:
        params: the parameters the optimizer updates (non-empty; each tensor counted once, frozen ones ignored).

    Derived in notebook 11_gradient_clipping.
    """

    def __init__(self, params):
        params = [params] if isinstance(params, Tensor) else list(check_iterable("params", params))
        for p in params:
            if not isinstance(p, Tensor) or not p.is_floating_point():
                raise TypeError("params must be floating-point tensors")
        check_not_meta("params", params)
        self.params = unique_tensors(params, trainable_only=True)    # a shared tensor once, frozen ones left out
        if not self.params:
            raise ValueError("params is empty (or every tensor is frozen): nothing to probe")
        self._snapshot: tuple[Tensor, Tensor] | None = None

    def _flat_grads(self, grads) -> Tensor:
        return flatten([(torch.zeros_like(p) if g is None else g).detach() for p, g in zip(self.params, grads)])

    def before_step(self) -> None:
        """Snapshot θ_t and ∇f(θ_t) from ``.grad`` (call after ``backward`` and before ``optimizer.step``).

        Raises:
            ValueError: no parameter has a gradient, or a gradient holds NaN/inf.
        """
        grads = [p.grad for p in self.params]
        if all(g is None for g in grads):
            raise ValueError("no parameter has a gradient: call backward() before before_step()")
        g = check_finite("gradient", self._flat_grads(grads)).clone()
        self._snapshot = (flatten([p.detach() for p in self.params]), g)

    def after_step(self, closure: Callable[[], Tensor]) -> SmoothnessSample:
        """Evaluate ``closure()`` (the same batch's scalar loss) at θ_{t+1} and return the probe.

        Raises:
            RuntimeError: ``before_step`` was not called first.
            ValueError: a non-scalar or non-finite loss, NaN gradients, parameters that did not move.
        """
        if self._snapshot is None:
            raise RuntimeError("call before_step() (after backward, before optimizer.step) first")
        with torch.enable_grad():
            loss = checked_loss_fn(lambda _: closure())(None)
        if not bool(torch.isfinite(loss)):
            raise ValueError(f"the loss after the step is not finite ({float(loss)})")
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        t0, g0 = self._snapshot
        self._snapshot = None
        t1 = flatten([p.detach() for p in self.params])
        return _sample(g0, check_finite("gradient", self._flat_grads(grads)), t0, t1)


# ------------------------------------------------------------------------------------------ fitting L0, L1
@dataclass(frozen=True)
class SmoothnessFit:
    """(L0, L1) from pairs (‖∇f‖, smoothness): a least-squares line and the tightest upper envelope.

    ``L0, L1`` — least squares ``s ≈ L0 + L1·g`` (may be negative; ``r`` is Pearson's correlation);
    ``envelope_L0, envelope_L1`` — the line ``L0 + L1·g ≥ s_i`` at every observed point, ``L0, L1 ≥ 0``, with the
    smallest mean height over the points (a linear program): constants that the observations actually satisfy.
    """

    L0: float
    L1: float
    r: float
    envelope_L0: float
    envelope_L1: float
    n: int


def _as_reals(name: str, values) -> np.ndarray:
    """A flat float64 array of real numbers (a sequence, array or real tensor); ``TypeError`` otherwise."""
    if isinstance(values, Tensor):
        check_not_meta(name, values)
        if values.is_complex():
            raise TypeError(f"{name} must hold real numbers, got dtype {values.dtype}")
        values = values.detach().cpu().numpy()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values)
    except ValueError as err:
        raise TypeError(f"{name} must be a sequence of numbers") from err
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64).reshape(-1)


def fit_l0_l1(grad_norms: Sequence[float], smoothness: Sequence[float]) -> SmoothnessFit:
    """Fit ``‖∇²f‖ ≤ L0 + L1·‖∇f‖`` to observed pairs.

    Args:
        grad_norms: ``‖∇f(θ_t)‖ ≥ 0``, one per probe.
        smoothness: the matching smoothness estimates ``≥ 0`` (finite differences or ``|λ_max|``).

    Returns:
        A :class:`SmoothnessFit` (least squares and upper envelope; ``scipy.optimize.linprog`` solves the latter).

    Raises:
        ValueError: fewer than 2 pairs, different lengths, negative or non-finite values, all grad norms equal.

    Derived in notebook 11_gradient_clipping.
    """
    from scipy.optimize import linprog

    g, s = _as_reals("grad_norms", grad_norms), _as_reals("smoothness", smoothness)
    if g.shape != s.shape:
        raise ValueError(f"grad_norms and smoothness must have the same length, got {g.size} and {s.size}")
    if g.size < 2:
        raise ValueError(f"fit_l0_l1 needs at least 2 pairs, got {g.size}")
    for name, a in (("grad_norms", g), ("smoothness", s)):
        if not np.isfinite(a).all() or (a < 0).any():
            raise ValueError(f"{name} must be finite and >= 0")
    if np.ptp(g) == 0:
        raise ValueError("all grad_norms are equal: L0 and L1 cannot be separated")
    L1, L0 = np.polyfit(g, s, 1)
    r = float(np.corrcoef(g, s)[0, 1]) if np.ptp(s) > 0 else 0.0
    res = linprog(c=[1.0, float(g.mean())], A_ub=np.stack([-np.ones_like(g), -g], 1), b_ub=-s,
                  bounds=[(0, None), (0, None)], method="highs")
    if not res.success:  # pragma: no cover - the LP is always feasible (L0 = max s, L1 = 0)
        raise RuntimeError(f"envelope fit failed: {res.message}")
    e0, e1 = (float(x) for x in res.x)
    return SmoothnessFit(float(L0), float(L1), r, e0, e1, int(g.size))
