"""Gradient clipping in its two forms, globally or per tensor, and the clipped (momentum) SGD optimizer.

Derived in notebook 11_gradient_clipping. Source: Zhang, He, Sra & Jadbabaie, *Why gradient clipping accelerates
training: a theoretical justification for adaptivity* (ICLR 2020). For a gradient ``g`` and a threshold
``γ > 0`` the update ``θ ← θ − η·c(g)·g`` uses one of two coefficients::

    hard:  c(g) = min{1, γ/‖g‖}          (the update's length is at most ηγ)
    soft:  c(g) = γ/(‖g‖ + γ)             (a smooth version, close to normalized / RMSProp-like steps)

and ``½·hard ≤ soft ≤ hard`` everywhere, so the two forms bound each other within a factor 2.

``per_tensor=False`` (global) takes ``‖g‖`` over all tensors together — the same coefficient as
``torch.nn.utils.clip_grad_norm_`` (which computes ``min{1, γ/(‖g‖ + 10⁻⁶)}``; pass ``eps=1e-6`` to match it
to the last bit of the coefficient, the default ``eps=0`` is the exact formula above). ``per_tensor=True`` scales
each tensor by its own coefficient. Clipping is applied before momentum in :class:`ClippedSGD`, as
``clip_grad_norm_`` followed by ``torch.optim.SGD`` does (the paper's experiments clip the same way).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Iterable

import torch
from torch import Tensor

from taskloss.parameter_vectors import distinct_param_group, unique_tensors
from taskloss.validation import (
    all_finite,
    check_bool,
    check_iterable,
    check_nonnegative,
    check_not_meta,
    check_param_list,
    check_positive,
)

__all__ = ["CLIP_MODES", "clip_coefficient", "clip_grad_", "ClippedSGD"]

CLIP_MODES = ("hard", "soft")


def _check_mode(mode) -> str:
    if mode not in CLIP_MODES:
        raise ValueError(f"mode must be one of {CLIP_MODES}, got {mode!r}")
    return mode


def _check_gamma(gamma) -> float:
    """γ > 0; ``math.inf`` means "no clipping" (both coefficients tend to 1 as γ → ∞)."""
    return check_positive("gamma", gamma, allow_inf=True)


def clip_coefficient(norm, gamma: float, mode: str = "hard", eps: float = 0.0) -> Tensor:
    """The clipping coefficient ``c`` of a gradient of norm ``‖g‖`` (elementwise over a tensor of norms).

    Args:
        norm: ``‖g‖ ≥ 0``, a number or a tensor of norms (any shape).
        gamma: threshold ``γ > 0`` (``math.inf``: no clipping, ``c = 1``).
        mode: ``"hard"`` → ``min{1, γ/(‖g‖ + eps)}``; ``"soft"`` → ``γ/(‖g‖ + γ)``.
        eps: added to the norm in the hard form (``1e-6`` reproduces ``torch.nn.utils.clip_grad_norm_``).

    Returns:
        ``c`` in ``(0, 1]``, a tensor shaped like ``norm`` (float64 for a Python number, float32 for a float16 or
        bfloat16 norm, whose coefficient is computed in float64).

    Raises:
        ValueError: ``γ ≤ 0`` or NaN, a negative / NaN norm, an unknown mode, a negative eps.

    Derived in notebook 11_gradient_clipping.
    """
    gamma = _check_gamma(gamma)
    _check_mode(mode)
    eps = check_nonnegative("eps", eps)
    if not isinstance(norm, Tensor):
        if isinstance(norm, bool) or not isinstance(norm, (int, float)):
            raise TypeError(f"norm must be a number or a tensor, got {type(norm).__name__}")
        norm = torch.tensor(float(norm), dtype=torch.float64)
    if not norm.is_floating_point():
        raise TypeError(f"norm must be a floating-point tensor, got dtype {norm.dtype}")
    check_not_meta("norm", norm)
    if bool(torch.isnan(norm).any()) or bool((norm < 0).any()):
        raise ValueError("norm must be >= 0 and not NaN (a NaN gradient norm cannot be clipped)")
    out = scalar_dtype(norm.dtype)
    if math.isinf(gamma):
        return torch.ones_like(norm, dtype=out)
    # in half precision γ, ‖g‖ + γ and their ratio would underflow or overflow: float64 there, the norm's own
    # dtype otherwise (hard clipping then matches clip_grad_norm_ bit for bit)
    n = norm if norm.dtype == out else norm.to(torch.float64)
    c = gamma / (n + eps) if mode == "hard" else gamma / (n + gamma)
    return torch.clamp(c, max=1.0).to(out)


def scalar_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms and coefficients are computed and returned in: float32 for float16/bfloat16, else ``dtype``."""
    return torch.promote_types(dtype, torch.float32)


def _norms(grads: list[Tensor], norm_type: float) -> list[Tensor]:
    """Each gradient's ``norm_type``-norm, accumulated in at least float32 (a finite float16 gradient may have a norm
    above 65504, the largest float16)."""
    if all(scalar_dtype(g.dtype) == g.dtype for g in grads):
        return list(torch._foreach_norm(grads, norm_type))
    return [torch.linalg.vector_norm(g, norm_type, dtype=scalar_dtype(g.dtype)) for g in grads]


def _scale_(grads: list[Tensor], coefs: list[Tensor]) -> None:
    """``g ← c·g`` in place, the product taken in at least float32 (a small coefficient would flush to 0 in
    float16)."""
    plain = [(g, c) for g, c in zip(grads, coefs) if scalar_dtype(g.dtype) == g.dtype]
    if plain:
        torch._foreach_mul_([g for g, _ in plain], [c.to(g.device, g.dtype) for g, c in plain])
    for g, c in zip(grads, coefs):
        if scalar_dtype(g.dtype) != g.dtype:
            g.copy_(g.to(scalar_dtype(g.dtype)).mul_(c.to(g.device)))


def _grads(params, name: str = "params") -> list[Tensor]:
    if isinstance(params, Tensor):
        params = [params]
    params = list(check_iterable(name, params))
    if not params:
        raise ValueError(f"{name} is empty: no parameters to clip")
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"{name} must hold tensors, got {type(p).__name__}")
    params = unique_tensors(params, trainable_only=True)      # a shared tensor once, frozen ones left alone
    check_not_meta(name, params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError(f"no tensor in {name} has a gradient (.grad is None everywhere): call backward() first")
    return grads


def clip_grad_(params: Iterable[Tensor] | Tensor, gamma: float, mode: str = "hard", per_tensor: bool = False,
               norm_type: float = 2.0, eps: float = 0.0) -> Tensor:
    """Clip the ``.grad`` of ``params`` in place: ``g ← c(‖g‖)·g`` (see :func:`clip_coefficient`).

    Args:
        params: tensors (or one tensor) whose ``.grad`` is clipped; tensors without a gradient are skipped, a tensor
            listed twice counts once and frozen ones (``requires_grad=False``) are left alone.
        gamma: threshold ``γ > 0`` (``math.inf``: leave the gradients unchanged, still return the norm).
        mode: ``"hard"`` (``min{1, γ/‖g‖}``) or ``"soft"`` (``γ/(‖g‖ + γ)``).
        per_tensor: ``False`` — one coefficient from the norm of all gradients together (global);
            ``True`` — one coefficient per tensor from that tensor's own norm.
        norm_type: the ``p`` of the ``p``-norm (``2``, ``1``, ``math.inf``, …), as in ``clip_grad_norm_``.
        eps: added to the norm in the hard form (``1e-6``: bit-compatible with ``clip_grad_norm_``).

    Returns:
        The norm(s) before clipping: a 0-d tensor (global) or ``[n_tensors_with_grad]`` (per tensor), computed in at
        least float32 (float16 and bfloat16 gradients are accumulated and scaled in float32, so a finite float16
        gradient whose norm exceeds 65504 is clipped, not refused).

    Raises:
        ValueError: empty ``params``, no gradient at all, NaN/inf in a gradient, ``γ ≤ 0``, bad mode/norm_type.

    Global hard clipping equals ``torch.nn.utils.clip_grad_norm_(params, γ, norm_type)`` (tested).
    Derived in notebook 11_gradient_clipping.
    """
    gamma = _check_gamma(gamma)
    _check_mode(mode)
    check_bool("per_tensor", per_tensor)
    eps = check_nonnegative("eps", eps)
    norm_type = check_positive("norm_type", norm_type, allow_inf=True)
    grads = _grads(params)
    with torch.no_grad():
        norms = _norms(grads, norm_type)
        dtype = functools.reduce(torch.promote_types, [n.dtype for n in norms])
        stacked = torch.stack([n.to(grads[0].device, dtype) for n in norms])
        norm = stacked if per_tensor else torch.linalg.vector_norm(stacked, norm_type)
        if not all_finite(norm):
            raise ValueError("a gradient contains NaN or inf: refusing to clip (the step would be NaN)")
        coef = clip_coefficient(norm, gamma, mode, eps)
        _scale_(grads, list(coef.unbind(0)) if per_tensor else [coef] * len(grads))
    return norm


class ClippedSGD(torch.optim.Optimizer):
    """SGD with gradient clipping (hard or soft, global or per tensor) and optional heavy-ball momentum.

    One step on each parameter group ``G`` (the clipping norm is taken over ``G``'s gradients)::

        g ← c(‖g_G‖)·g                        (clip_grad_ on the group; gamma = inf: no clipping)
        b ← μ·b + g   (b = g at the first step; skipped when μ = 0)
        θ ← θ − η·b                           (η = lr)

    With ``mode="hard"`` and ``momentum=0`` this is the clipped GD of Zhang et al. (2020),
    ``θ ← θ − min{η, ηγ/‖g‖}·g``; with ``gamma=math.inf`` it is ``torch.optim.SGD`` (tested).

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        lr: step size ``η > 0``.
        gamma: clipping threshold ``γ > 0`` (``math.inf``: plain SGD).
        mode: ``"hard"`` or ``"soft"`` (see :func:`clip_coefficient`).
        per_tensor: clip each tensor by its own norm instead of the group's global norm.
        momentum: heavy-ball coefficient ``μ ∈ [0, 1)`` (``torch.optim.SGD``'s convention, no dampening).

    ``step(closure)`` follows torch.optim (the closure re-evaluates the loss and calls ``backward``); every group is
    stepped, a learning-rate scheduler works, frozen parameters (``requires_grad=False``, even with a stale ``.grad``)
    do not move and a parameter listed twice is stepped once.
    ``state[p]["momentum_buffer"]`` holds ``b``; ``self.last_norms[i]`` the norm(s) of group ``i`` before clipping
    at the last step (a diagnostic, not state). ``state_dict`` / ``load_state_dict`` resume bit-identically.
    Derived in notebook 11_gradient_clipping.
    """

    def __init__(self, params, lr: float, gamma: float = math.inf, mode: str = "hard", per_tensor: bool = False,
                 momentum: float = 0.0):
        check_param_list(params)
        defaults = dict(lr=check_positive("lr", lr), gamma=_check_gamma(gamma), mode=_check_mode(mode),
                        per_tensor=check_bool("per_tensor", per_tensor), momentum=self._check_momentum(momentum))
        super().__init__(params, defaults)
        for group in self.param_groups:
            if not group["params"]:
                raise ValueError("a parameter group is empty: no parameters to optimize")
            self._validate_group(group)
        self.last_norms: list[Tensor | None] = [None] * len(self.param_groups)

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with each tensor of the group kept once (by identity)."""
        group = distinct_param_group(param_group)
        check_not_meta("params", group.get("params", []))
        super().add_param_group(group)

    @staticmethod
    def _check_momentum(momentum) -> float:
        m = check_nonnegative("momentum", momentum)
        if m >= 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        return m

    def _validate_group(self, group: dict) -> None:
        check_positive("lr", group["lr"])
        _check_gamma(group["gamma"])
        _check_mode(group["mode"])
        check_bool("per_tensor", group["per_tensor"])
        self._check_momentum(group["momentum"])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None):
        """One clipped step on every group; returns the closure's loss (``None`` without a closure).

        A group whose parameters have no gradient is skipped (``last_norms[i]`` stays ``None``), as
        ``torch.optim.SGD`` skips it.

        Raises:
            ValueError: no group has a gradient at all (``backward`` was not called), a gradient holds NaN/inf, or a
                hyperparameter in ``param_groups`` was set to an invalid value (e.g. ``gamma ≤ 0``).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_norms = [None] * len(self.param_groups)
        stepped = False
        for i, group in enumerate(self.param_groups):
            self._validate_group(group)
            params = [p for p in group["params"] if p.grad is not None and p.requires_grad]
            if not params:          # skipped, as torch.optim.SGD skips it (a frozen or unused part of the model)
                continue
            stepped = True
            self.last_norms[i] = clip_grad_(params, group["gamma"], group["mode"], group["per_tensor"])
            grads = [p.grad for p in params]
            if group["momentum"]:
                bufs = []
                for p, g in zip(params, grads):
                    st = self.state[p]
                    if "momentum_buffer" not in st:
                        st["momentum_buffer"] = g.detach().clone()
                    else:
                        st["momentum_buffer"].mul_(group["momentum"]).add_(g)
                    bufs.append(st["momentum_buffer"])
                grads = bufs
            torch._foreach_add_(params, grads, alpha=-group["lr"])
        if not stepped:
            raise ValueError("no gradients: no parameter of any group has a .grad, call backward() before step()")
        return loss
