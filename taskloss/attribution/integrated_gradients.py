"""Integrated gradients: the attribution of F(x) − F(x′) to the input features as the integral of the gradient
along the straight path from a baseline x′ to the input x.

Derived in notebook 15_integrated_gradients. Source: Sundararajan, Taly & Yan, *Axiomatic Attribution for Deep
Networks* (ICML 2017). With γ(α) = x′ + α(x − x′),

    IG_i(x; x′) = (x_i − x′_i) ∫₀¹ ∂F/∂x_i(γ(α)) dα  ≈  (x_i − x′_i) Σ_k w_k ∂F/∂x_i(γ(α_k)),

and by the fundamental theorem of calculus along γ the exact integral is *complete*: Σ_i IG_i = F(x) − F(x′).
The quadrature rule (α_k, w_k) comes from :func:`taskloss.attribution.quadrature.quadrature_rule`; what the rule
misses is returned as the completeness error Σ_i IG_i − (F(x) − F(x′)) (Captum's "convergence delta", same sign).

A set of K baselines x′_1 … x′_K (a tensor with one more leading dimension than the inputs) gives the average
of the K integrated gradients — expected gradients (Erion, Janizek, Sturmfels, Lundberg & Lee, *Improving
performance of deep learning models with axiomatic attribution priors and expected gradients*, Nature Machine
Intelligence 2021) with the quadrature rule in place of a sampled α — whose completeness reads
Σ_i EG_i = F(x) − mean_k F(x′_k).

Reference implementation: Captum's ``IntegratedGradients`` (``captum/attr/_core/integrated_gradients.py``,
captum 0.9.0): same argument names and ``method`` names, the same nodes (see the quadrature module for the
trapezoid weights, where this differs). Differences in how it is computed: all inputs × steps (× baselines) go
through ``forward_fn`` as one batch, or in chunks of at most ``internal_batch_size`` rows that are whole steps
(or, when one step's rows exceed it, slices of one step — Captum never splits a step, so its chunks hold at least
B rows); the quadrature weights are folded into the backward pass (``grad_outputs = w_k``; for float16 / bfloat16
inputs they are applied and the gradients summed in float32 instead); the target is read with one gather instead of
Captum's ``unbind`` into scalars; F(x) and F(x′) are taken from the path itself when the rule has nodes at α = 0 and 1 (trapezoid), otherwise from
one extra forward pass of the inputs and baselines together (chunked alike), without a graph.

A tuple of inputs (x₁, …, x_n), each ``[B, *feat_j]``, is one point per example in the product space: the path
moves every input from its baseline at once, ``forward_fn(x₁, …, x_n, *args)`` is called as Captum calls it, and
completeness holds for the attributions of all inputs together (Captum's delta alike). Internally each input is
flattened to ``[B, n_j]`` and the pieces are concatenated, so the core and its chunking are the single-tensor ones.

The pure core is :func:`integrate_gradients` (any scalar function of points); :class:`IntegratedGradients`
formats and validates inputs, baselines and targets around it, and
:class:`taskloss.attribution.embedding.EmbeddingIntegratedGradients` applies the same core in a token model's
embedding space.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from taskloss.attribution.quadrature import checked_steps, quadrature_rule
from taskloss.validation import all_finite, check_allocation, check_eval_mode, check_finite, check_int, check_not_meta

__all__ = ["Attribution", "IntegratedGradients", "integrate_gradients", "select_target"]

ScalarFn = Callable[[Tensor, Tensor], Tensor]


class Attribution(NamedTuple):
    """What :meth:`IntegratedGradients.attribute` returns (unpacks as ``attributions, error, diff = ...``).

    Attributes:
        attributions: tensor shaped like the inputs (``[B, T]`` per token for embedding attributions); a tuple of
            tensors shaped like the inputs when they were a tuple.
        completeness_error: ``[B]``, Σ attributions − (F(x) − F(x′)) per example (F(x′) averaged over a set).
        output_difference: ``[B]``, F(x) − F(x′) per example (the quantity the attributions split).

    For float16 / bfloat16 inputs the attributions come back in the inputs' dtype, rounded once from float32 sums;
    the completeness error and the output difference are float32, computed before that rounding.
    """

    attributions: Tensor | tuple[Tensor, ...]
    completeness_error: Tensor
    output_difference: Tensor


# ------------------------------------------------------------------------------------------------ the core
def _chunks(n_steps: int, n_pairs: int, cap: int):
    """Yield (step slice, pair slice): whole steps for all pairs when a step fits in ``cap`` rows, else slices
    of the pairs of one step. Every (step, pair) appears exactly once."""
    if n_pairs <= cap:
        per = cap // n_pairs
        for s in range(0, n_steps, per):
            yield slice(s, min(s + per, n_steps)), slice(0, n_pairs)
    else:
        for s in range(n_steps):
            for p in range(0, n_pairs, cap):
                yield slice(s, s + 1), slice(p, min(p + cap, n_pairs))


def _path_bytes(m: int, n_pairs: int, n_feat: int, itemsize: int, cap: int | None) -> float:
    """The memory, at least, of :func:`integrate_gradients` beyond its inputs: the path values ``[m, P]`` and the
    largest chunk of interpolated points with its gradient (``2 × rows × n_feat``); the forward's own activations
    come on top."""
    cap = m * n_pairs if cap is None else cap
    rows = min(cap // n_pairs, m) * n_pairs if n_pairs <= cap else cap
    return float(itemsize) * (m * n_pairs + 2.0 * rows * n_feat)


def _check_path(scalar_fn, starts, ends, alphas, weights) -> None:
    """:func:`integrate_gradients`' entry checks (the attribution classes call it with checked inputs already)."""
    if not callable(scalar_fn):
        raise TypeError(f"scalar_fn must be callable, got {type(scalar_fn).__name__}")
    for name, t in (("starts", starts), ("ends", ends), ("alphas", alphas), ("weights", weights)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_not_meta(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a real floating-point tensor, got dtype {t.dtype}")
        check_finite(name, t)
    if starts.dtype != ends.dtype or starts.shape != ends.shape or starts.ndim < 1 or starts.shape[0] == 0:
        raise ValueError(f"starts and ends must be non-empty [P, *feat] tensors of one shape and dtype, got "
                         f"{tuple(starts.shape)} {starts.dtype} and {tuple(ends.shape)} {ends.dtype}")
    if alphas.ndim != 1 or alphas.shape != weights.shape or alphas.numel() == 0:
        raise ValueError(f"alphas and weights must be 1-D tensors of one length >= 1, got shapes "
                         f"{tuple(alphas.shape)} and {tuple(weights.shape)}")


def _check_forward(forward_fn) -> None:
    """Integrated gradients integrate one fixed function: a model (or a model's bound method) holding a train-mode
    Dropout or BatchNorm is refused, as the curvature methods refuse it (:func:`taskloss.validation.check_eval_mode`)."""
    check_eval_mode(getattr(forward_fn, "__self__", forward_fn),
                    purpose="the path integral is of a random function and completeness fails", fix="attributing")


def integrate_gradients(scalar_fn: ScalarFn, starts: Tensor, ends: Tensor, alphas: Tensor, weights: Tensor,
                        internal_batch_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Σ_k w_k ∇f(γ_p(α_k)) for every pair p of a start and an end point, γ_p(α) = start_p + α(end_p − start_p).

    Args:
        scalar_fn: ``f(points [n, *feat], pair_index [n]) → [n]``, one scalar per point (row-wise: a row's value
            may depend only on that row and its pair index); evaluated with autograd enabled.
        starts: ``[P, *feat]`` path starts (baselines).
        ends: ``[P, *feat]`` path ends (inputs); same shape, dtype and device as ``starts``.
        alphas: ``[m]`` quadrature nodes in [0, 1].
        weights: ``[m]`` quadrature weights.
        internal_batch_size: at most this many points per forward/backward pass (``None``: all ``m·P`` at once).

    Returns:
        ``(gradient_integral [P, *feat], path_values [m, P])``: the weighted sum of gradients, and f at every node
        (detached), from which F(x) and F(x′) can be read when the nodes include 0 and 1. For float16 / bfloat16
        points both are float32: the gradients are weighted and summed in float32 (summed in the half dtype,
        1024 nodes in 128 chunks lost 40 % of a bfloat16 attribution, and ``w_k·∂f`` underflows float16).

    Raises:
        TypeError: ``scalar_fn`` not callable; tensors that are not floating (complex included) or of mixed dtypes.
        ValueError: ``starts`` / ``ends`` of different or empty shapes, NaN/inf in them or in the nodes and weights,
            nodes and weights not two 1-D tensors of one length ≥ 1, ``internal_batch_size`` < 1, meta tensors;
            ``scalar_fn`` not returning one value per point, or an output that does not depend on the
            points; NaN/inf values; a pass whose points and gradients (with the path values) would not fit in the
            device's memory (lower the number of nodes or set ``internal_batch_size``).
    """
    _check_path(scalar_fn, starts, ends, alphas, weights)
    if internal_batch_size is not None:
        internal_batch_size = check_int("internal_batch_size", internal_batch_size, minimum=1)
    m, n_pairs, feat = alphas.shape[0], starts.shape[0], starts.shape[1:]
    check_allocation(f"integrate_gradients over {m} nodes x {n_pairs} paths of {feat.numel()} features "
                     f"(internal_batch_size={internal_batch_size})",
                     _path_bytes(m, n_pairs, feat.numel(), starts.element_size(), internal_batch_size), starts.device)
    cap = m * n_pairs if internal_batch_size is None else internal_batch_size
    diff = ends - starts
    acc = _accumulation_dtype(starts.dtype)
    total = torch.zeros_like(starts, dtype=acc)
    values = starts.new_empty(m, n_pairs, dtype=acc)
    pair_ids = torch.arange(n_pairs, device=starts.device)
    view = (-1, 1) + (1,) * len(feat)
    for st, pr in _chunks(m, n_pairs, cap):
        a, w = alphas[st].view(view), weights[st]
        points = torch.addcmul(starts[pr].unsqueeze(0), a, diff[pr].unsqueeze(0))   # [s, p, *feat]
        s, p = points.shape[:2]
        points = points.reshape(s * p, *feat).requires_grad_(True)
        with torch.enable_grad():
            out = scalar_fn(points, pair_ids[pr].repeat(s))
            if not isinstance(out, Tensor) or out.shape != (s * p,):
                raise ValueError(f"the scalar function must return one value per point, shape [{s * p}], "
                                 f"got {tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
            if not out.requires_grad:
                raise ValueError("forward_fn's output does not depend on its inputs through autograd (computed "
                                 "under torch.no_grad(), detached, or not a function of the inputs)")
            seed = w.to(out.dtype) if acc == starts.dtype else torch.ones_like(w, dtype=out.dtype)
            (grad,) = torch.autograd.grad(out, points, grad_outputs=seed.repeat_interleave(p), allow_unused=True)
        values[st, pr] = out.detach().view(s, p).to(values.dtype)
        if grad is not None:                 # None: the output is a constant of the inputs (zero gradient)
            grad = grad.view(s, p, *feat)
            if acc != starts.dtype:          # half points: weighted here, in float32
                grad = grad.to(acc) * w.to(acc).view(view)
            total[pr] += grad.sum(0)
    if not all_finite(values):
        raise ValueError("forward_fn returned NaN or inf at a point on the path from baseline to input")
    return total, values


def select_target(output: Tensor, target: Any, example_index: Tensor) -> Tensor:
    """One scalar per row of ``output [n, ...]``: the entry picked by ``target`` (see
    :meth:`IntegratedGradients.attribute`), for rows belonging to examples ``example_index [n]``."""
    if not isinstance(output, Tensor) and isinstance(getattr(output, "logits", None), Tensor):
        raise TypeError(f"forward_fn returned a {type(output).__name__} (a Hugging Face ModelOutput), not a tensor: "
                        "return its logits, e.g. forward_fn=lambda x: model(inputs_embeds=x).logits")
    if not isinstance(output, Tensor) or output.ndim == 0 or output.numel() == 0:
        raise ValueError(f"forward_fn must return a non-empty tensor with a leading batch dimension, got "
                         f"{tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__}")
    check_not_meta("forward_fn's output", output)
    if output.is_complex():
        raise TypeError(f"forward_fn must return real values, got dtype {output.dtype}")
    n = output.shape[0]
    if callable(target):
        out = target(output)
        if not isinstance(out, Tensor) or out.ndim not in (1, 2) or out.shape[0] != n or out.numel() != n:
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"target function must return one scalar per example (shape [{n}]), got {shape}")
        return out.reshape(n)
    if target is None:
        if output[0].numel() != 1:
            raise ValueError(f"target is None but forward_fn returns {tuple(output.shape[1:])} values per example;"
                             " pass target= (a class index, a tuple of indices, one index per example, or a "
                             "function of the output returning one scalar per example)")
        return output.reshape(n)
    index = target if isinstance(target, tuple) else (target,)
    if output.ndim < 1 + len(index):
        raise ValueError(f"target {target!r} indexes {len(index)} output dimension(s) but forward_fn returns "
                         f"shape {tuple(output.shape)}")
    for t in index:
        if isinstance(t, Tensor):
            check_not_meta("target", t)
            if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.numel() == 0:
                raise TypeError(f"a target tensor must hold integer indices, got dtype {t.dtype} {tuple(t.shape)}")
        elif isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"target must be an int index, a tuple of them, an integer tensor or a function, got "
                            f"{type(t).__name__} {t!r}")
    for dim, t in enumerate(index, start=1):
        top = int(t.max()) if isinstance(t, Tensor) else t
        if top >= output.shape[dim]:
            raise ValueError(f"target index {top} is out of range for output dimension {dim} of size "
                             f"{output.shape[dim]}")
    if isinstance(target, Tensor):
        picked = output.gather(1, target[example_index].view(n, *([1] * (output.ndim - 1))).expand(
            n, 1, *output.shape[2:])).squeeze(1)
    else:
        picked = output[(slice(None), *index)]
    if picked.shape != (n,):
        raise ValueError(f"target {target!r} selects {tuple(picked.shape[1:])} values per example from output "
                         f"{tuple(output.shape)}; it must select a single scalar")
    return picked


def _check_target(target, n_examples: int, device: torch.device):
    """Validate ``target`` and return it in the form :func:`select_target` reads."""
    if target is None or callable(target):
        return target
    if isinstance(target, numbers.Integral) and not isinstance(target, bool):
        if target < 0:
            raise ValueError(f"target must be a non-negative class index, got {target}")
        return int(target)
    if isinstance(target, tuple):
        for t in target:
            check_int("target entry", t, minimum=0)
        return tuple(int(t) for t in target)
    if isinstance(target, list):
        target = torch.tensor(target)
    if isinstance(target, Tensor):
        if target.is_floating_point() or target.dtype == torch.bool:
            raise TypeError(f"target tensor must hold integer class indices, got dtype {target.dtype}")
        if target.numel() == 1:
            return _check_target(int(target.reshape(())), n_examples, device)
        if target.ndim != 1 or target.shape[0] != n_examples:
            raise ValueError(f"target tensor must have one index per example, shape [{n_examples}], "
                             f"got {tuple(target.shape)}")
        if int(target.min()) < 0:
            raise ValueError("target indices must be non-negative")
        return target.to(device=device, dtype=torch.long)
    raise TypeError("target must be None, an int, a tuple of ints, a list/1-D tensor of ints (one per example) or"
                    f" a callable mapping the output to one scalar per example; got {type(target).__name__}")


def _expand_args(args: tuple, example_index: Tensor, n_examples: int) -> tuple:
    """Rows of tensor arguments with a leading batch dimension follow the examples; the rest pass unchanged."""
    return tuple(a[example_index] if isinstance(a, Tensor) and a.ndim > 0 and a.shape[0] == n_examples else a
                 for a in args)


def _format_args(additional_forward_args) -> tuple:
    if additional_forward_args is None:
        return ()
    return additional_forward_args if isinstance(additional_forward_args, tuple) else (additional_forward_args,)


def _check_inputs(inputs, name: str = "inputs") -> Tensor:
    if not isinstance(inputs, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or a tuple of tensors, got {type(inputs).__name__}")
    if not inputs.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {inputs.dtype}")
    if inputs.ndim == 0 or inputs.shape[0] == 0 or inputs.numel() == 0:
        raise ValueError(f"{name} must have a non-empty leading batch dimension, got shape {tuple(inputs.shape)}")
    return check_finite(name, inputs).detach()


def _check_input_tuple(inputs: tuple) -> tuple[Tensor, ...]:
    """Validate a tuple of inputs: each a non-empty floating tensor, one batch size, dtype and device for all."""
    if len(inputs) == 0:
        raise ValueError("inputs is an empty tuple; pass a tensor or a tuple of at least one tensor")
    xs = tuple(_check_inputs(x, f"inputs[{j}]") for j, x in enumerate(inputs))
    for j, x in enumerate(xs[1:], start=1):
        if x.shape[0] != xs[0].shape[0]:
            raise ValueError(f"every input must have the same batch size: inputs[0] has {xs[0].shape[0]} rows, "
                             f"inputs[{j}] has {x.shape[0]}")
        if x.dtype != xs[0].dtype or x.device != xs[0].device:
            raise ValueError(f"every input must share one dtype and device: inputs[0] is {xs[0].dtype} on "
                             f"{xs[0].device}, inputs[{j}] is {x.dtype} on {x.device}")
    return xs


def _format_baseline_tuple(baselines, xs: tuple[Tensor, ...]) -> Tensor:
    """Baselines of a tuple of inputs as one flat ``[K, B, Σ n_j]`` tensor: ``None`` or a number for every input,
    or a tuple with one entry (None, a number, a tensor or a set of K baselines) per input, one K for all."""
    if baselines is None or (isinstance(baselines, numbers.Real) and not isinstance(baselines, bool)):
        baselines = (baselines,) * len(xs)
    if not isinstance(baselines, tuple):
        raise TypeError("baselines of a tuple of inputs must be None, a number, or a tuple with one entry per input;"
                        f" got {type(baselines).__name__}")
    if len(baselines) != len(xs):
        raise ValueError(f"baselines has {len(baselines)} entries but inputs has {len(xs)}; give one per input")
    parts = []
    for j, (b, x) in enumerate(zip(baselines, xs)):
        try:
            parts.append(_format_baselines(b, x))
        except (TypeError, ValueError) as err:
            raise type(err)(f"baselines[{j}]: {err}") from None
    sizes = [p.shape[0] for p in parts]
    if len(set(sizes)) > 1:
        raise ValueError(f"the baselines of the inputs hold different numbers of baselines per set {sizes}; "
                         "give every input the same K (or one baseline each)")
    return torch.cat([p.reshape(p.shape[0], p.shape[1], -1) for p in parts], dim=2)


def _format_baselines(baselines, like: Tensor) -> Tensor:
    """Baselines as ``[K, B, *feat]`` (K = 1 unless a set was given), on the device and dtype of ``like``."""
    B, feat = like.shape[0], like.shape[1:]
    if baselines is None:
        return torch.zeros_like(like).unsqueeze(0)
    if isinstance(baselines, numbers.Real) and not isinstance(baselines, bool):
        return torch.full_like(like, float(baselines)).unsqueeze(0)
    if not isinstance(baselines, Tensor):
        raise TypeError(f"baselines must be None, a number or a tensor, got {type(baselines).__name__}")
    if not baselines.is_floating_point():
        raise TypeError(f"baselines must be a floating-point tensor, got dtype {baselines.dtype}")
    check_finite("baselines", baselines)
    shape = tuple(baselines.shape)
    if baselines.ndim == like.ndim and shape[1:] == tuple(feat) and shape[0] in (1, B):
        b = baselines.unsqueeze(0)
    elif baselines.ndim == like.ndim + 1 and shape[2:] == tuple(feat) and shape[1] in (1, B) and shape[0] >= 1:
        b = baselines
    else:
        raise ValueError(f"baselines shape {shape} does not match inputs shape {tuple(like.shape)}: expected "
                         f"[{B} or 1, *{tuple(feat)}], or a set of K baselines [K, {B} or 1, *{tuple(feat)}]")
    return b.detach().to(device=like.device, dtype=like.dtype).expand(b.shape[0], B, *feat)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 points (the sums over nodes and features), the points' dtype otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_batch_size(internal_batch_size) -> int | None:
    return None if internal_batch_size is None else check_int("internal_batch_size", internal_batch_size, minimum=1)


def _attribute_pairs(scalar_fn: ScalarFn, inputs: Tensor, bases: Tensor, n_steps: int, method: str,
                     internal_batch_size: int | None, caller: str = "IntegratedGradients.attribute"
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """The shared tail of :class:`IntegratedGradients` and the embedding variant: inputs ``[B, *feat]``,
    baselines ``[K, B, *feat]`` → (attributions ``[B, *feat]``, completeness error ``[B]``, F(x) − F(x′) ``[B]``).
    ``n_steps`` is refused before anything is allocated when the rule and one pass of the path would not fit.
    For float16 / bfloat16 inputs all three are float32 (the callers round the attributions to the inputs' dtype
    after their own sums), so the completeness error measures the quadrature, not the rounding of the sums."""
    K, B, feat = bases.shape[0], inputs.shape[0], inputs.shape[1:]
    n_steps = checked_steps(method, n_steps, caller=caller, device=inputs.device, extra_bytes=lambda n: _path_bytes(
        n, K * B, feat.numel(), inputs.element_size(), internal_batch_size))
    alphas, weights = quadrature_rule(method, n_steps, dtype=inputs.dtype, device=inputs.device)
    starts = bases.reshape(K * B, *feat)
    ends = inputs.unsqueeze(0).expand(K, B, *feat).reshape(K * B, *feat)
    grad_sum, values = integrate_gradients(scalar_fn, starts, ends, alphas, weights, internal_batch_size)
    attr = ((ends.to(grad_sum.dtype) - starts.to(grad_sum.dtype)) * grad_sum).view(K, B, *feat).mean(0)
    if alphas[0] == 0 and alphas[-1] == 1:
        f_end, f_start = values[-1], values[0]
    else:
        points = torch.cat([inputs, starts])     # the B inputs and the K·B baselines, without a graph
        index = torch.cat([torch.arange(B), torch.arange(K * B)]).to(inputs.device)
        cap = len(points) if internal_batch_size is None else internal_batch_size
        with torch.no_grad():
            f_both = torch.cat([scalar_fn(points[i:i + cap], index[i:i + cap]).reshape(-1)
                                for i in range(0, len(points), cap)])
        f_end, f_start = f_both[:B].repeat(K), f_both[B:]
        if not bool(torch.isfinite(f_end).all() & torch.isfinite(f_start).all()):
            raise ValueError("forward_fn returned NaN or inf at the inputs or the baselines")
    diff = (f_end.to(attr.dtype) - f_start.to(attr.dtype)).view(K, B).mean(0)
    error = attr.reshape(B, -1).sum(1) - diff
    return attr, error, diff


class IntegratedGradients:
    """Integrated gradients of ``forward_fn`` (Sundararajan, Taly & Yan, ICML 2017) with Captum's API shape.

    ``IntegratedGradients(forward_fn).attribute(inputs, baselines=…, target=…, n_steps=…, method=…)`` returns an
    :class:`Attribution` (attributions shaped like the inputs, the completeness error and F(x) − F(x′) per
    example). Derived in notebook 15_integrated_gradients.

    Args:
        forward_fn: ``forward_fn(inputs [n, *feat], *additional_forward_args) → output [n, ...]`` (a model or any
            function of it; with a tuple of inputs ``forward_fn(x_1 [n, …], …, x_n [n, …], *args)``); rows must
            not interact (no batch statistics: put models in ``eval()`` mode).
    """

    def __init__(self, forward_fn: Callable[..., Tensor]):
        if not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable, got {type(forward_fn).__name__}")
        self.forward_fn = forward_fn

    def attribute(self, inputs: Tensor | tuple[Tensor, ...], baselines: Any = None, target: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  additional_forward_args: Any = None) -> Attribution:
        """Attribute ``F(x) − F(x′)`` to the features of each input.

        Args:
            inputs: ``[B, *feat]`` floating tensor, the points x to explain; or a tuple of such tensors
                ``([B, *feat_1], …, [B, *feat_n])`` (one batch size, dtype and device), passed to
                ``forward_fn(x_1, …, x_n, *additional_forward_args)`` as Captum does.
            baselines: x′ — ``None`` (zeros), a number (constant), ``[B or 1, *feat]``, or a set of K baselines
                ``[K, B or 1, *feat]`` whose integrated gradients are averaged (expected gradients). Moved to the
                device and dtype of ``inputs``; see :mod:`taskloss.attribution.baselines` for blurred, noisy and
                sampled baselines. With a tuple of inputs: ``None`` or a number for every input, or a tuple with
                one such entry per input (the same K for every input that is given a set).
            target: which scalar of the output to explain — ``None`` (the output is one scalar per example), an
                int class index ``output[:, c]``, a tuple of indices ``output[:, i, j]``, a list / 1-D tensor with
                one class index per example, or a callable ``output [n, ...] → [n]`` applied row-wise (e.g.
                ``lambda out: out.log_softmax(-1)[:, 3]``).
            n_steps: number of quadrature nodes m (≥ 1; ≥ 2 for ``riemann_trapezoid``).
            method: quadrature rule, one of :data:`taskloss.attribution.quadrature.METHODS`.
            internal_batch_size: at most this many points per forward/backward pass (memory bound);
                ``None`` evaluates all ``m·K·B`` points at once.
            additional_forward_args: extra arguments of ``forward_fn`` (one object or a tuple); tensors whose
                leading dimension is ``B`` are repeated along the path with their example, others passed as is.

        Returns:
            :class:`Attribution` ``(attributions [B, *feat], completeness_error [B], output_difference [B])``;
            with a tuple of inputs the attributions are a tuple shaped like the inputs, and the completeness
            error is that of all inputs' attributions together.

        Raises:
            TypeError / ValueError: non-tensor or non-floating inputs, empty batch, NaN/inf in inputs or
                baselines, baseline shape mismatch, a tuple of inputs with different batch sizes, dtypes or
                devices, a tuple of baselines whose length is not that of the inputs or whose sets differ in K,
                ``n_steps`` < 1, unknown method, a target that does not select one scalar per example,
                NaN/inf produced by ``forward_fn``.
        """
        if isinstance(inputs, tuple):
            return self._attribute_tuple(inputs, baselines, target, n_steps, method, internal_batch_size,
                                         additional_forward_args)
        _check_forward(self.forward_fn)
        inputs = _check_inputs(inputs)
        bases = _format_baselines(baselines, inputs)
        bs = _check_batch_size(internal_batch_size)
        B = inputs.shape[0]
        tgt = _check_target(target, B, inputs.device)
        args = _format_args(additional_forward_args)

        def scalar_fn(points: Tensor, pair_index: Tensor) -> Tensor:
            example = pair_index % B
            return select_target(self.forward_fn(points, *_expand_args(args, example, B)), tgt, example)

        attr, error, diff = _attribute_pairs(scalar_fn, inputs, bases, n_steps, method, bs)
        return Attribution(attr.to(inputs.dtype), error, diff)

    def _attribute_tuple(self, inputs: tuple, baselines, target, n_steps: int, method: str,
                         internal_batch_size: int | None, additional_forward_args) -> Attribution:
        """:meth:`attribute` for a tuple of inputs: one flat path ``[B, Σ n_j]`` through the single-tensor core,
        split back into one attribution per input."""
        _check_forward(self.forward_fn)
        xs = _check_input_tuple(inputs)
        bases = _format_baseline_tuple(baselines, xs)
        bs = _check_batch_size(internal_batch_size)
        B = xs[0].shape[0]
        tgt = _check_target(target, B, xs[0].device)
        args = _format_args(additional_forward_args)
        feats = [x.shape[1:] for x in xs]
        sizes = [x[0].numel() for x in xs]
        flat = torch.cat([x.reshape(B, -1) for x in xs], dim=1)

        def split(points: Tensor) -> tuple[Tensor, ...]:
            pieces = points.split(sizes, dim=1)
            return tuple(p.reshape(len(points), *f) for p, f in zip(pieces, feats))

        def scalar_fn(points: Tensor, pair_index: Tensor) -> Tensor:
            example = pair_index % B
            return select_target(self.forward_fn(*split(points), *_expand_args(args, example, B)), tgt, example)

        attr, error, diff = _attribute_pairs(scalar_fn, flat, bases, n_steps, method, bs)
        return Attribution(split(attr.to(flat.dtype)), error, diff)
