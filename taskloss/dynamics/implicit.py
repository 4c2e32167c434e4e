"""Implicit gradient regularization: the gradient-norm penalty, the modified loss of a finite step, the flows
that gradient descent follows, and flooding.

Derived in notebook 12_implicit_gradient_regularization. Source: Barrett & Dherin, *Implicit Gradient
Regularization* (ICLR 2021). Backward error analysis says that gradient descent ``θ ← θ − h∇L(θ)`` stays, to
second order in ``h``, on the gradient flow of a *modified* loss::

    L̃_h(θ) = L(θ) + (h/4)·‖∇L(θ)‖²,        ∇L̃_h = ∇L + (h/2)·∇²L·∇L,

so after a fixed time ``T = n·h`` the iterate is ``O(h)`` away from the flow of ``L`` but ``O(h²)`` from the flow
of ``L̃_h``. An explicit penalty ``λ‖∇L‖²`` adds the same term by hand (``λ = h/4`` mimics the step ``h``).

Pieces:

- :func:`gradient_norm_penalty` — ``‖∇_θ L‖²`` from a scalar loss of any model by double backward
  (``create_graph=True``), to add to the loss in an ordinary training loop;
- :func:`per_example_gradient_penalty` — ``(1/N)Σ_n ‖∇_θ ℓ_n‖²`` with ``torch.func.vmap`` over examples (the
  mean of per-example squared norms, ``= ‖∇L‖² + Σ_j Var_n(∂_j ℓ_n)``; with mini-batches of one example, the
  implicit regularizer of SGD in Smith, Dherin, Barrett & De, *On the Origin of Implicit Regularization in
  Stochastic Gradient Descent*, ICLR 2021);
- :func:`modified_loss`, :func:`modified_gradient` — ``L̃_h`` (``torch.func``, composable with its transforms) and
  ``∇L̃_h`` (one gradient and one Hessian-vector product by double backward, never the Hessian);
- :func:`integrate_flow`, :func:`gradient_flow` — classical fourth-order Runge-Kutta with a step-doubling
  error check (the number of steps doubles until ``‖y_{2n} − y_n‖/15``, the estimated error of ``y_{2n}``, is
  below the tolerance);
- :func:`flooding` — ``|L − b| + b`` (Ishida et al., *Do We Need Zero Training Loss After Achieving Zero
  Training Error?*, NeurIPS 2020): around ``L = b`` a descent and an ascent step add up to one gradient step
  on ``(h²/2)‖∇L‖²``.

Fused kernels (cuDNN/oneDNN RNNs, flash attention) have no double backward: the ``torch.func`` functions here
run inside :func:`taskloss.dynamics.hessian.native_kernels`; for :func:`gradient_norm_penalty` build the loss
(the forward pass) inside ``with native_kernels():`` yourself when the model has such layers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from taskloss.dynamics.hessian import (
    check_params,
    checked_loss_fn,
    detached_params,
    loss_gradient,
    native_kernels,
    param_leaves,
    rebuild_params,
    value_and_gradient,
)
from taskloss.parameter_vectors import flatten, unflatten, unique_tensors
from taskloss.validation import (
    check_bool,
    check_eval_mode,
    check_finite,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_positive,
    is_transformed,
)

__all__ = [
    "gradient_norm_penalty", "per_example_gradient_penalty", "modified_loss", "modified_gradient",
    "FlowResult", "integrate_flow", "gradient_flow", "flooding",
]


def _wide(t: Tensor) -> Tensor:
    """``t`` in at least float32 (differentiably): squared norms and flooded losses of float16/bfloat16 values are
    computed there (a float16 gradient entry above 256 would overflow its square)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _check_scalar_loss(loss) -> Tensor:
    if not isinstance(loss, Tensor):
        raise TypeError(f"loss must be a tensor, got {type(loss).__name__}")
    if loss.ndim != 0:
        raise ValueError(f"loss must be a scalar (0-d) tensor, got shape {tuple(loss.shape)}; reduce it first")
    if not loss.is_floating_point():
        raise TypeError(f"loss must be floating point, got dtype {loss.dtype}")
    check_not_meta("loss", loss)
    if not is_transformed(loss) and not bool(torch.isfinite(loss.detach())):
        raise ValueError(f"loss is not finite ({float(loss)})")
    return loss


def gradient_norm_penalty(loss: Tensor, params, create_graph: bool = True) -> Tensor:
    """``‖∇_θ loss‖² = Σ_tensors Σ_i (∂loss/∂θ_i)²`` by autograd, differentiable (double backward).

    Args:
        loss: a scalar loss built from ``params`` with autograd.
        params: the tensors θ (e.g. ``model.parameters()``); ones the loss does not use contribute 0, a tensor listed
            twice counts once and frozen ones (``requires_grad=False``) are left out.
        create_graph: keep the graph so that ``(loss + λ·penalty).backward()`` reaches θ (the explicit
            regularizer); ``False`` gives the value only.

    Returns:
        A 0-d tensor (float32 for float16/bfloat16 gradients, whose squares are summed in float32).

    Raises:
        ValueError: non-scalar or non-finite loss, empty ``params``, NaN/inf gradient.
        TypeError: ``loss`` is not a floating tensor.

    Checked against ``torch.func`` (grad of the squared gradient norm) in tests/dynamics.
    Derived in notebook 12_implicit_gradient_regularization.
    """
    create_graph = check_bool("create_graph", create_graph)
    _check_scalar_loss(loss)
    params = unique_tensors(params, trainable_only=True)     # a shared tensor once, frozen ones left out
    if not params:
        raise ValueError("params is empty (or frozen): the gradient norm of no parameters is undefined")
    grads = torch.autograd.grad(loss, params, create_graph=create_graph, allow_unused=True)
    grads = [g for g in grads if g is not None]
    if not grads:
        raise ValueError("loss does not depend on any tensor in params")
    sq = sum(_wide(g).pow(2).sum() for g in grads)
    if not bool(torch.isfinite(sq.detach())):
        raise ValueError("the gradient contains NaN or inf")
    return sq


def per_example_gradient_penalty(model: nn.Module, example_loss: Callable, inputs: Tensor, targets: Tensor) -> Tensor:
    """``(1/N) Σ_n ‖∇_θ ℓ(model(x_n), y_n)‖²``: per-example gradients by ``vmap(grad(·))``, differentiable
    with respect to the model's parameters by ordinary autograd.

    Args:
        model: any ``nn.Module`` without randomness in ``forward`` (call ``model.eval()`` for dropout).
        example_loss: ``(output [1, ...], target [1, ...]) → 0-d loss`` of one example (e.g. ``F.cross_entropy``).
        inputs: ``[N, ...]`` inputs, ``N ≥ 1``.
        targets: ``[N, ...]`` targets.

    Returns:
        A 0-d tensor (float32 for a float16/bfloat16 model); ``≥ gradient_norm_penalty`` of the mean loss (Jensen),
        equal when all per-example gradients coincide.

    Raises:
        ValueError: empty batch, mismatched lengths, a non-scalar per-example loss, NaN gradients; a model holding a
            train-mode Dropout or BatchNorm (random or batch-coupled per-example losses;
            :func:`taskloss.validation.check_eval_mode`).

    Derived in notebook 12_implicit_gradient_regularization.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(example_loss):
        raise TypeError("example_loss must be callable")
    for name, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, Tensor) or t.ndim == 0:
            raise ValueError(f"{name} must be a tensor with a batch dimension")
        if t.shape[0] == 0:
            raise ValueError(f"{name} is empty (batch size 0)")
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(f"inputs and targets differ in batch size: {inputs.shape[0]} vs {targets.shape[0]}")
    check_not_meta("model", model)
    check_eval_mode(model, purpose="the per-example gradients are of random or batch-coupled losses",
                    fix="per_example_gradient_penalty")
    check_not_meta("inputs", inputs)
    check_finite("inputs", inputs)
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameters")

    def one(p, x, y):
        return _check_scalar_loss(example_loss(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0)))

    with native_kernels():
        g = vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, targets)
    sq = sum(_wide(t).pow(2).flatten(1).sum(1) for t in g.values()).mean()
    if not bool(torch.isfinite(sq.detach())):
        raise ValueError("a per-example gradient contains NaN or inf")
    return sq


def _check_params_outside_transforms(params) -> None:
    """Validate ``params`` unless inside a ``torch.func`` transform (where values cannot be inspected)."""
    if isinstance(params, Mapping) and params and is_transformed(next(iter(params.values()))):
        return
    if isinstance(params, Tensor) and is_transformed(params):
        return
    check_params("params", params)


def modified_loss(loss_fn: Callable, params, h: float) -> Tensor:
    """``L̃_h(θ) = L(θ) + (h/4)·‖∇L(θ)‖²``, a pure function of ``θ`` (composable with ``torch.func.grad``).

    Args:
        loss_fn: ``params → 0-d tensor``.
        params: θ (tensor or dict of tensors).
        h: the gradient-descent step ``h > 0`` whose second-order modified loss this is.

    Raises:
        ValueError: ``h ≤ 0`` or non-finite, empty/non-finite params, a non-scalar loss.

    Derived in notebook 12_implicit_gradient_regularization.
    """
    h = check_positive("h", h)
    f = checked_loss_fn(loss_fn)
    _check_params_outside_transforms(params)
    with native_kernels():
        g = grad(f)(params)
        return f(params) + (h / 4) * flatten(g).pow(2).sum()


def modified_gradient(loss_fn: Callable, params, h: float):
    """``∇L̃_h(θ) = ∇L(θ) + (h/2)·∇²L(θ)·∇L(θ)``: one forward, one gradient with its graph and one Hessian-vector
    product by double backward — the vector field of the flow that gradient descent with step ``h`` follows to
    second order. Not traceable by ``torch.func`` (use :func:`modified_loss` inside transforms).

    Args:
        loss_fn: ``params → 0-d tensor``.
        params: θ (tensor or dict of tensors).
        h: the step ``h ≥ 0`` (``h = 0`` returns ``∇L``).

    Returns:
        The gradient with the structure of ``params``.

    Raises:
        ValueError: ``h < 0`` or non-finite, empty/non-finite params, a non-scalar loss.

    Checked against ``torch.func.grad(modified_loss)`` in tests/dynamics.
    Derived in notebook 12_implicit_gradient_regularization.
    """
    h = check_nonnegative("h", h)
    f = checked_loss_fn(loss_fn)
    if h == 0:
        return loss_gradient(f, params)[1]
    x = detached_params(check_params("params", params))
    with native_kernels():                       # one forward: ∇L with its graph, then ∇⟨∇L, stop_grad(∇L)⟩
        _, g = value_and_gradient(f, x, create_graph=True)
        with torch.enable_grad():
            dot = sum((a * a.detach()).sum() for a in g if a.requires_grad)
            hg = torch.autograd.grad(dot, param_leaves(x), allow_unused=True) if torch.is_tensor(dot) else [None] * len(g)
    out = [a.detach() + (h / 2) * (0 if b is None else b) for a, b in zip(g, hg)]
    check_finite("modified gradient", flatten(out))
    return rebuild_params(params, out)


@dataclass(frozen=True)
class FlowResult:
    """The state ``y(T)`` of an integrated flow, the Runge-Kutta steps used and the estimated error of ``y``."""

    y: object
    n_steps: int
    error: float


def _rk4(field: Callable[[Tensor], Tensor], y: Tensor, T: float, n: int) -> Tensor:
    dt = T / n
    for _ in range(n):
        k1 = field(y)
        k2 = field(y + (dt / 2) * k1)
        k3 = field(y + (dt / 2) * k2)
        k4 = field(y + dt * k3)
        y = y + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def integrate_flow(field: Callable[[Tensor], Tensor], y0: Tensor, T: float, n_steps: int = 16, rtol: float = 1e-9,
                   atol: float = 1e-12, max_doublings: int = 14) -> FlowResult:
    """Solve ``dy/dt = field(y)`` on ``[0, T]`` by classical RK4, doubling the steps until the error check passes.

    With ``n`` and ``2n`` steps, RK4's global error ``C·dt⁴`` gives ``y_{2n} − y(T) ≈ (y_{2n} − y_n)/15``; the
    step count doubles from ``n_steps`` until that estimate is ``≤ atol + rtol·‖y_{2n}‖``.

    Args:
        field: ``y → dy/dt`` (same shape as ``y``), e.g. ``lambda y: -grad(L)(y)``.
        y0: initial state, a floating tensor (use float64 for tight tolerances).
        T: final time ``T > 0``.
        n_steps: initial number of steps (≥ 1).
        rtol: relative tolerance on the estimated error (``≥ 0``; not both 0).
        atol: absolute tolerance on it (``≥ 0``).
        max_doublings: give up after this many doublings.

    Returns:
        A :class:`FlowResult` with ``y`` (``y_{2n}``), ``n_steps`` (= 2n) and the error estimate ``‖y_{2n} − y_n‖/15``.

    Raises:
        ValueError: ``T ≤ 0``, bad tolerances (incl. one below the dtype's round-off), a non-finite state.
        RuntimeError: the tolerance was not reached within ``max_doublings``.

    Checked against the closed-form linear flow ``expm(−tA)·y0`` in tests/dynamics.
    Derived in notebook 12_implicit_gradient_regularization.
    """
    if not callable(field):
        raise TypeError("field must be callable")
    check_params("y0", y0)
    T = check_positive("T", T)
    n = check_int("n_steps", n_steps, minimum=1)
    rtol, atol = check_nonnegative("rtol", rtol), check_nonnegative("atol", atol)
    if rtol == 0 and atol == 0:
        raise ValueError("rtol and atol cannot both be 0")
    check_int("max_doublings", max_doublings, minimum=1)
    resolution = 8 * torch.finfo(y0.dtype).eps * max(1.0, float(y0.detach().double().norm()))
    if atol + rtol * float(y0.detach().double().norm()) < resolution:
        raise ValueError(f"the tolerance (atol={atol}, rtol={rtol}) is below the round-off of {y0.dtype} "
                         f"(about {resolution:.2g} here): loosen it or integrate in float64")
    v0 = field(y0)
    if not isinstance(v0, Tensor) or v0.shape != y0.shape:
        raise ValueError(f"field must return a tensor shaped like y0 {tuple(y0.shape)}")
    check_finite("field(y0)", v0)
    y_n = _rk4(field, y0, T, n)
    for _ in range(max_doublings):
        y_2n = _rk4(field, y0, T, 2 * n)
        check_finite("flow state", y_2n)
        err = float((y_2n - y_n).double().norm()) / 15
        n *= 2
        if err <= atol + rtol * float(y_2n.double().norm()):
            return FlowResult(y_2n, n, err)
        y_n = y_2n
    raise RuntimeError(f"integrate_flow: estimated error {err:.3g} above the tolerance after {n} steps "
                       f"(atol={atol}, rtol={rtol}); loosen it, raise max_doublings, or use float64")


def gradient_flow(loss_fn: Callable, theta0, T: float, h: float = 0.0, **kwargs) -> FlowResult:
    """``θ(T)`` of the gradient flow ``dθ/dt = −∇L(θ)`` (``h = 0``) or of the modified flow
    ``dθ/dt = −∇L̃_h(θ)`` (``h > 0``), by :func:`integrate_flow` (keyword arguments passed on).

    Args:
        loss_fn: ``params → 0-d tensor``.
        theta0: θ(0), a tensor or a dict of tensors (the result has the same structure).
        T: final time ``T > 0`` (``n`` gradient steps of size ``h`` cover ``T = n·h``).
        h: step of the modified loss (``0`` → the flow of ``L`` itself).
        **kwargs: passed on to :func:`integrate_flow` (``n_steps``, ``rtol``, ``atol``, ``max_doublings``).

    Returns:
        The :class:`FlowResult` of the flow, ``y`` with the structure of ``theta0``.

    Raises:
        ValueError: ``T ≤ 0``, ``h < 0``, empty/non-finite ``theta0``, a non-scalar loss.

    Derived in notebook 12_implicit_gradient_regularization.
    """
    check_params("theta0", theta0)
    h = check_nonnegative("h", h)
    if isinstance(theta0, Mapping):
        like = {k: v.detach() for k, v in theta0.items()}
        result = gradient_flow(lambda v: loss_fn(unflatten(v, like)), flatten(like), T, h, **kwargs)
        return FlowResult(unflatten(result.y, like), result.n_steps, result.error)
    result = integrate_flow(lambda y: -modified_gradient(loss_fn, y, h), theta0.detach(), T, **kwargs)
    return result


def flooding(loss: Tensor, b: float) -> Tensor:
    """The flooded loss ``|L − b| + b``: descent above the flood level ``b``, ascent below it.

    Args:
        loss: scalar training loss ``L``.
        b: flood level ``b ≥ 0``.

    Returns:
        ``|L − b| + b``, in float32 for a float16/bfloat16 loss.

    Raises:
        ValueError: non-scalar or non-finite loss, ``b < 0`` or non-finite.

    Derived in notebook 12_implicit_gradient_regularization.
    """
    _check_scalar_loss(loss)
    b = check_nonnegative("b", b)
    return (_wide(loss) - b).abs() + b

