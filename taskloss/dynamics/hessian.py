"""Second-order probes of a pure loss function: gradients and Hessian-vector products (double backward), and the
top Hessian eigenvalue by power iteration.

Derived in notebook 11_gradient_clipping (sharpness in 12_implicit_gradient_regularization). A *loss function* is
a pure function ``loss_fn(params) → 0-d tensor`` of a tensor or a dict of tensors; for an ``nn.Module``,
:func:`taskloss.parameter_vectors.functional_loss` (``functional_loss(model, criterion, inputs)``) builds one with
``torch.func.functional_call``.
Gradients use autograd on detached copies of θ (the caller's tensors are never touched); Hessian-vector products
are double backward, ``∇⟨∇f(θ), v⟩`` (about the cost of two gradients), never the Hessian itself. Fused kernels
(cuDNN and oneDNN RNNs, flash attention) have no second-order derivatives, so second-order code runs inside
:func:`native_kernels` (the plain kernels compute the same function). :func:`top_hessian_eigenvalue` is plain
power iteration, with a spectral shift when the algebraic maximum (the *sharpness*) is wanted.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from taskloss.parameter_vectors import flatten
from taskloss.validation import check_finite, check_generator, check_int, check_not_meta, check_positive

__all__ = ["native_kernels", "loss_gradient", "hessian_vector_product", "top_hessian_eigenvalue", "EigenResult",
           "Params", "check_params", "checked_loss_fn", "map_params", "params_dot", "param_leaves", "rebuild_params",
           "detached_params", "value_and_gradient", "check_same_structure"]

Params = Tensor | Mapping[str, Tensor]
#: dtypes the second-order probes refuse (their finite differences, curvatures and tolerances need float32 or more)
HALF_DTYPES = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------------------ validation
def check_params(name: str, params) -> Params:
    """``params`` after checking it is a non-empty floating tensor, or a non-empty dict of them, all finite.

    Args:
        name: the argument's name, for the messages.
        params: a tensor or a dict name → tensor.

    Returns:
        ``params``.

    Raises:
        TypeError: not floating tensors, or float16/bfloat16 ones.
        ValueError: empty, or NaN/inf.
    """
    if isinstance(params, Tensor):
        items = [(name, params)]
    elif isinstance(params, Mapping):
        if len(params) == 0:
            raise ValueError(f"{name} is empty: no parameters")
        items = [(f"{name}[{k!r}]", v) for k, v in params.items()]
    else:
        raise TypeError(f"{name} must be a tensor or a dict of tensors, got {type(params).__name__}")
    for n, t in items:
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{n} must be a floating-point tensor, got {type(t).__name__}"
                            + (f" of dtype {t.dtype}" if isinstance(t, Tensor) else ""))
        check_not_meta(n, t)
        if t.dtype in HALF_DTYPES:
            raise TypeError(f"{n} has dtype {t.dtype}: the second-order probes (gradients, Hessian-vector products, "
                            "modified losses, flows, smoothness) run in float32 or float64 — pass a float32 copy "
                            "(e.g. {k: v.float() for k, v in params.items()})")
        if t.numel() == 0:
            raise ValueError(f"{n} is empty (0 elements)")
        check_finite(n, t.detach())
    return params


def checked_loss_fn(loss_fn: Callable) -> Callable:
    """``loss_fn`` wrapped so that a non-scalar or non-floating output raises a clear error.

    Args:
        loss_fn: ``params → 0-d tensor``.

    Returns:
        The checked function.

    Raises:
        TypeError: ``loss_fn`` is not callable (and, when called, a non-tensor or non-floating loss).
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")

    def f(params):
        out = loss_fn(params)
        if not isinstance(out, Tensor):
            raise TypeError(f"loss_fn must return a tensor, got {type(out).__name__}")
        if out.ndim != 0:
            raise ValueError(f"loss_fn must return a scalar (0-d) loss, got shape {tuple(out.shape)}; "
                             "reduce it (e.g. .mean()) first")
        if not out.is_floating_point():
            raise TypeError(f"loss_fn must return a floating-point loss, got dtype {out.dtype}")
        return out

    return f


def map_params(fn, *trees):
    """Apply ``fn`` leafwise to tensors or dicts of tensors (all of the same structure)."""
    if isinstance(trees[0], Mapping):
        return {k: fn(*(t[k] for t in trees)) for k in trees[0]}
    return fn(*trees)


def params_dot(a: Params, b: Params) -> Tensor:
    """⟨a, b⟩ over all entries, in float64."""
    return (flatten(a).double() * flatten(b).double()).sum()


# ------------------------------------------------------------------------------------------ gradient and HVP
@contextmanager
def native_kernels():
    """Run second-order differentiation through kernels that support it: cuDNN and oneDNN (mkldnn) off — their
    fused RNN kernels have neither forward-mode nor double-backward formulas — and the math backend of
    ``F.scaled_dot_product_attention`` (the fused CPU/flash kernels have no double backward). Same function,
    slower kernels; the previous settings are restored on exit (process-wide flags: not for concurrent threads).

    Derived in notebook 11_gradient_clipping (used by every second-order function of :mod:`taskloss.dynamics`).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    prev = torch.backends.cudnn.enabled, torch.backends.mkldnn.enabled
    torch.backends.cudnn.enabled = torch.backends.mkldnn.enabled = False
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.cudnn.enabled, torch.backends.mkldnn.enabled = prev


def param_leaves(params: Params) -> list[Tensor]:
    """The tensors of a tensor or a dict of tensors, as a list."""
    return list(params.values()) if isinstance(params, Mapping) else [params]


def rebuild_params(like: Params, leaves: Sequence[Tensor]) -> Params:
    """``leaves`` in the structure of ``like`` (a dict with its keys, or the one tensor)."""
    return dict(zip(like.keys(), leaves)) if isinstance(like, Mapping) else leaves[0]


def detached_params(params: Params) -> Params:
    """Fresh leaf copies of ``params`` that require grad (the caller's tensors are never touched)."""
    return map_params(lambda t: t.detach().requires_grad_(True), params)


def value_and_gradient(f: Callable, x: Params, create_graph: bool = False) -> tuple[Tensor, list[Tensor]]:
    """``(L, ∇L leaves)`` of ``f`` at leaf tensors ``x`` (zeros where ``f`` does not use a leaf).

    Args:
        f: the (checked) loss function.
        x: leaf tensors that require grad (:func:`detached_params`).
        create_graph: keep the graph of the gradient (for a second derivative).

    Returns:
        The loss and its gradient, one tensor per leaf.

    Raises:
        ValueError: the loss is not finite.
    """
    with torch.enable_grad():
        value = f(x)
        if not bool(torch.isfinite(value.detach())):
            raise ValueError(f"the loss is not finite at params (L = {float(value)})")
        grads = torch.autograd.grad(value, param_leaves(x), create_graph=create_graph, allow_unused=True)
    return value, [torch.zeros_like(t) if g is None else g for t, g in zip(param_leaves(x), grads)]


def loss_gradient(loss_fn: Callable, params: Params) -> tuple[Tensor, Params]:
    """``(L(θ), ∇L(θ))`` of a pure loss function, by autograd on detached copies of ``params``.

    Args:
        loss_fn: ``params → 0-d tensor``.
        params: θ, a floating tensor or a dict of them.

    Returns:
        The loss (0-d, detached) and the gradient with the structure of ``params``.

    Raises:
        ValueError: empty or non-finite ``params``, a non-scalar loss, a NaN/inf loss or gradient.

    Derived in notebook 11_gradient_clipping.
    """
    f = checked_loss_fn(loss_fn)
    x = detached_params(check_params("params", params))
    value, grads = value_and_gradient(f, x)
    check_finite("gradient", flatten(grads))
    return value.detach(), rebuild_params(params, [g.detach() for g in grads])


def hessian_vector_product(loss_fn: Callable, params: Params, vector: Params) -> Params:
    """``∇²L(θ)·v`` without forming the Hessian: ``∇_θ⟨∇L(θ), v⟩`` by double backward, inside
    :func:`native_kernels`.

    Reverse-over-reverse rather than ``torch.func.jvp(grad(L))``: on CPU at this repository's model sizes it
    measured 1.5–3.5× faster (functorch's forward-mode decompositions dominate small operations).

    Args:
        loss_fn: ``params → 0-d tensor``.
        params: θ (tensor or dict of tensors).
        vector: ``v`` with the same structure and shapes as ``params``.

    Returns:
        ``Hv`` with the structure of ``params``.

    Raises:
        ValueError: structure/shape mismatch, empty or non-finite inputs, a non-scalar loss.

    Checked against the dense ``torch.func.hessian`` in tests/dynamics. Derived in notebook 11_gradient_clipping.
    """
    f = checked_loss_fn(loss_fn)
    check_params("params", params)
    check_params("vector", vector)
    check_same_structure(params, vector)
    x = detached_params(params)
    with native_kernels():
        _, grads = value_and_gradient(f, x, create_graph=True)
        with torch.enable_grad():
            dot = sum((g * v.detach().to(g.dtype)).sum() for g, v in zip(grads, param_leaves(vector)) if g.requires_grad)
            hv = (torch.autograd.grad(dot, param_leaves(x), allow_unused=True) if torch.is_tensor(dot)
                  else [None] * len(grads))           # a linear loss: ∇L does not depend on θ, H = 0
    hv = [torch.zeros_like(t) if h is None else h.detach() for t, h in zip(param_leaves(x), hv)]
    check_finite("Hessian-vector product", flatten(hv))
    return rebuild_params(params, hv)


def check_same_structure(a: Params, b: Params) -> None:
    """Raise unless ``a`` and ``b`` are both tensors, or dicts with the same keys, of equal shapes."""
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("params and vector must both be tensors or both be dicts")
    pairs = [(k, a[k], b.get(k)) for k in a] if isinstance(a, Mapping) else [("tensor", a, b)]
    if isinstance(a, Mapping) and set(a) != set(b):
        raise ValueError(f"vector keys {sorted(b)} differ from params keys {sorted(a)}")
    for k, x, y in pairs:
        if x.shape != y.shape:
            raise ValueError(f"vector[{k!r}] has shape {tuple(y.shape)}, params has {tuple(x.shape)}")


# ----------------------------------------------------------------------------------- top Hessian eigenvalue
@dataclass(frozen=True)
class EigenResult:
    """Outcome of :func:`top_hessian_eigenvalue`: the eigenvalue, its unit eigenvector (structure of params),
    the iterations used, whether the relative change fell below ``tol`` and the residual ``‖Hv − λv‖``."""

    value: float
    vector: Params
    n_iter: int
    converged: bool
    residual: float


def _power(hvp: Callable, v: Params, shift: float, max_iter: int, tol: float) -> tuple[float, Params, int, bool]:
    lam_prev, lam = math.nan, math.nan
    for it in range(1, max_iter + 1):
        hv = hvp(v)
        if shift:
            hv = map_params(lambda a, b: a - shift * b, hv, v)
        lam = float(params_dot(v, hv))
        norm = float(flatten(hv).double().norm())
        if norm == 0.0:                      # v in the null space: H v = 0 (λ = 0 is then the answer)
            return 0.0, v, it, True
        v = map_params(lambda a: a / norm, hv)
        if abs(lam - lam_prev) <= tol * abs(lam):
            return lam, v, it, True
        lam_prev = lam
    return lam, v, max_iter, False


def top_hessian_eigenvalue(loss_fn: Callable, params: Params, which: str = "magnitude", max_iter: int = 100,
                           tol: float = 1e-4, generator: torch.Generator | None = None) -> EigenResult:
    """The dominant eigenvalue of ``∇²L(θ)`` by power iteration on Hessian-vector products.

    Args:
        loss_fn: ``params → 0-d tensor``.
        params: θ (tensor or dict of tensors).
        which: ``"magnitude"`` — the eigenvalue of largest ``|λ|``, whose absolute value is the spectral norm
            ``‖∇²L‖`` that (L0, L1)-smoothness bounds; ``"largest"`` — the largest (algebraic) eigenvalue λ_max,
            the *sharpness*: when the dominant eigenvalue λ_m is negative, a second power iteration on
            ``∇²L − λ_m I`` (whose spectrum is ≥ 0) returns λ_max.
        max_iter: power iterations per run (≥ 1).
        tol: stop when the Rayleigh quotient changes by less than ``tol·|λ|``.
        generator: draws the random start vector (reproducible probes).

    Returns:
        An :class:`EigenResult` (``converged=False`` when ``max_iter`` ran out; the estimate is then a lower bound
        on ``|λ|``).

    Raises:
        ValueError: bad ``which``, ``max_iter < 1``, ``tol ≤ 0``, empty/non-finite params, a non-scalar loss.

    Checked against the dense ``torch.linalg.eigvalsh(torch.func.hessian(...))`` in tests/dynamics.
    Derived in notebook 11_gradient_clipping.
    """
    if which not in ("magnitude", "largest"):
        raise ValueError(f"which must be 'magnitude' or 'largest', got {which!r}")
    check_int("max_iter", max_iter, minimum=1)
    tol = check_positive("tol", tol)
    check_generator("generator", generator)
    params = map_params(lambda t: t.detach(), check_params("params", params))

    def draw(t: Tensor) -> Tensor:
        dev = generator.device if generator is not None else t.device
        return torch.randn(t.shape, generator=generator, device=dev, dtype=t.dtype).to(t.device)

    def start() -> Params:
        v = map_params(draw, params)
        n0 = float(flatten(v).double().norm())
        return map_params(lambda a: a / n0, v)

    def hvp(u):
        return hessian_vector_product(loss_fn, params, u)

    lam, v, it, conv = _power(hvp, start(), 0.0, max_iter, tol)
    if which == "largest" and lam < 0:     # shifted spectrum λ_i − λ_m ≥ 0: its top is λ_max − λ_m
        mu, v, it2, conv = _power(hvp, start(), lam, max_iter, tol)
        lam, it = mu + lam, it + it2
    hv = hvp(v)
    residual = float((flatten(hv).double() - lam * flatten(v).double()).norm())
    return EigenResult(float(lam), v, it, conv, residual)
