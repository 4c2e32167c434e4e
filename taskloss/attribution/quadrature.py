"""Quadrature rules on [0, 1]: the nodes α_k and weights w_k with which integrated gradients approximates the
path integral ∫₀¹ g(α) dα ≈ Σ_k w_k g(α_k).

Derived in notebook 15_integrated_gradients. With m nodes and a smooth integrand g the error of each rule is

=====================  =========================================  ======================================
method                 nodes α_k, weights w_k (k = 0 … m−1)        error for smooth g
=====================  =========================================  ======================================
``riemann_left``       k/m, 1/m                                    −(g(1) − g(0))/(2m) + O(1/m²)
``riemann_right``      (k+1)/m, 1/m                                +(g(1) − g(0))/(2m) + O(1/m²)
``riemann_middle``     (k+½)/m, 1/m                                −(g′(1) − g′(0))/(24m²) + O(1/m⁴)
``riemann_trapezoid``  k/(m−1), 1/(m−1) (half at both ends)        +(g′(1) − g′(0))/(12(m−1)²) + O(1/m⁴)
``gausslegendre``      Gauss–Legendre on [0, 1] (m ≥ 1)            exact for polynomials of degree 2m−1;
                                                                   geometric in m for analytic g
=====================  =========================================  ======================================

The names and the nodes follow Captum (``captum/attr/_utils/approximation_methods.py``, captum 0.9.0) so that
``method=`` means the same thing in both, with one deliberate deviation: Captum's ``riemann_trapezoid`` puts m
nodes on ``linspace(0, 1, m)`` but weights them ``1/m`` (half at the ends), so its weights sum to ``(m−1)/m``
and its attributions are ``(m−1)/m`` times the trapezoid rule's — a relative error of ``1/m`` that no smoothness
removes (the completeness error of Captum's trapezoid falls as 1/m, not 1/m²). Here the weights are the
trapezoid rule's, ``1/(m−1)``; :func:`captum_trapezoid_factor` converts. Captum also casts the weights to float32;
here they are computed in float64 and cast to the dtype of the inputs.

Nodes and weights are computed in float64 (Gauss–Legendre by ``numpy.polynomial.legendre.leggauss``) and returned
as tensors of the requested dtype and device.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch

from taskloss.validation import check_device, check_int, check_steps

__all__ = ["METHODS", "quadrature_rule", "captum_trapezoid_factor", "convergence_order"]

METHODS = ("riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre")


def _check_method(method) -> str:
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, one of {METHODS}, got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


@functools.lru_cache(maxsize=64)
def _nodes_weights(method: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 CPU tensors (cached: Gauss–Legendre nodes cost an eigen-decomposition)."""
    a, w = _nodes_weights_np(method, n)
    return torch.from_numpy(a), torch.from_numpy(w)


def _nodes_weights_np(method: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(n, dtype=np.float64)
    if method == "riemann_left":
        return k / n, np.full(n, 1.0 / n)
    if method == "riemann_right":
        return (k + 1) / n, np.full(n, 1.0 / n)
    if method == "riemann_middle":
        return (k + 0.5) / n, np.full(n, 1.0 / n)
    if method == "riemann_trapezoid":
        w = np.full(n, 1.0 / (n - 1))
        w[[0, -1]] /= 2
        return k / (n - 1), w
    x, w = np.polynomial.legendre.leggauss(n)        # on [−1, 1], weights sum to 2
    return 0.5 * (x + 1.0), 0.5 * w


def _host_bytes(method: str, n: int) -> float:
    """The float64 host memory of building the rule with ``n`` nodes, at least: Gauss–Legendre's eigenvalue problem
    holds an ``n × n`` companion matrix (8n² bytes: 7.28 TiB at n = 10⁶); every rule a few float64 arrays of n."""
    return 32.0 * n + (8.0 * n * n if method == "gausslegendre" else 0.0)


def checked_steps(method, n_steps, *, caller: str = "quadrature_rule", device=None,
                  extra_bytes: Callable[[int], float] | None = None) -> int:
    """``n_steps`` as an int after checking ``method``, the rule's smallest node count, and that building the
    rule — plus what the caller allocates for these steps on ``device`` — fits in memory.

    Args:
        method: one of :data:`METHODS`.
        n_steps: the node count (≥ 1; ≥ 2 for ``riemann_trapezoid``).
        caller: the call, for the message.
        device: where ``extra_bytes`` are allocated (``None``: the CPU); the rule itself is built on the CPU.
        extra_bytes: ``n ↦`` the caller's own bytes for ``n`` steps (the interpolated inputs and their gradients).

    Returns:
        ``int(n_steps)``.

    Raises:
        TypeError / ValueError: an unknown method, ``n_steps`` not an int or too small, or an estimated
            allocation beyond the device's memory (the message gives both).
    """
    _check_method(method)
    minimum = 2 if method == "riemann_trapezoid" else 1
    n = check_int("n_steps", n_steps, minimum=minimum)
    what = f"{caller}(n_steps={n}, method={method!r})"
    extra = 0.0 if extra_bytes is None else float(extra_bytes(n))
    on_cpu = device is None or torch.device(device).type == "cpu"
    check_steps("n_steps", n, bytes_per_step=(_host_bytes(method, n) + (extra if on_cpu else 0.0)) / n, what=what,
                minimum=minimum)
    if not on_cpu:
        check_steps("n_steps", n, bytes_per_step=extra / n, what=what, device=device, minimum=minimum)
    return n


def quadrature_rule(method: str = "gausslegendre", n_steps: int = 50, *, dtype: torch.dtype = torch.float64,
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights of ``method`` with ``n_steps`` nodes on [0, 1] (see the module docstring).

    Args:
        method: one of :data:`METHODS`.
        n_steps: number of nodes m (≥ 1; ≥ 2 for ``riemann_trapezoid``, which needs both end points).
        dtype: floating dtype of the returned tensors (computed in float64, then cast).
        device: device of the returned tensors (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a
            ``torch.device``; one this machine does not have is a ``ValueError``).

    Returns:
        ``(alphas [m], weights [m])`` with ``Σ weights = 1`` and ``0 ≤ alphas ≤ 1`` ascending.

    Raises:
        ValueError / TypeError: unknown method, ``n_steps`` not an int or too small, non-floating dtype, an unknown
            or absent device, an ``n_steps`` whose rule would not fit in memory (Gauss–Legendre needs 8·n² bytes).
    """
    n = checked_steps(method, n_steps)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    device = check_device("device", device)
    alphas, weights = _nodes_weights(method, n)
    return (alphas.to(device=device, dtype=dtype, copy=True), weights.to(device=device, dtype=dtype, copy=True))


def captum_trapezoid_factor(n_steps: int) -> float:
    """``(m−1)/m``: Captum's ``riemann_trapezoid`` attributions equal this factor times ours (same nodes,
    Captum's weights ``1/m`` instead of ``1/(m−1)``); see the module docstring."""
    n = check_int("n_steps", n_steps, minimum=2)
    return (n - 1) / n


def convergence_order(method: str) -> float:
    """The power p in ``|completeness error| = O(m^−p)`` for a smooth path integrand (1 for left/right Riemann,
    2 for midpoint and trapezoid); ``inf`` for Gauss–Legendre, whose error falls geometrically in m."""
    _check_method(method)
    return {"riemann_left": 1.0, "riemann_right": 1.0, "riemann_middle": 2.0, "riemann_trapezoid": 2.0,
            "gausslegendre": float("inf")}[method]
