"""How the curvature code calls a model: its inputs, its outputs, the loss terms that count, and what it refuses.

Shared by the Fisher / GGN functions (:mod:`taskloss.curvature.fisher`), Hessian-free, the diagonal preconditioner
and K-FAC, so that a model is accepted or refused the same way by all of them (notebooks 06_natural_gradient and
07_fisher_approximations derive what they compute).

* **Inputs** are one tensor ``[N, ...]`` (``model(inputs)``) or a mapping of keyword arguments
  (``model(**inputs)``, e.g. ``{"input_ids": ..., "attention_mask": ...}`` for a Hugging Face model): every tensor
  in it has the batch size ``N`` in its first dimension, other values are passed unchanged to every call.
* **Outputs** are a tensor ``[N, C]`` or per-token ``[N, T, C]`` (any ``[N, ..., C]``: every position is a loss
  term), or an object holding such a tensor as ``.logits`` (a ``transformers`` ``ModelOutput``).
* **Loss terms** that count are chosen by a boolean mask of the outputs' leading shape (``[N]`` or ``[N, T]``) and,
  where targets are given, by ``ignore_index`` labels (``-100``, as ``torch.nn.functional.cross_entropy``); the
  curvature is that of the mean NLL over the terms left.
* **Attention**: forward-mode AD (``jvp``) and double backward are not implemented for the fused CPU attention
  kernels behind ``torch.nn.functional.scaled_dot_product_attention``, so every transformed call runs under
  :func:`math_attention` (the plain math kernel, differentiable to any order). An operation that still lacks a
  derivative ends in a ``ValueError`` that names the fix (``attn_implementation="eager"``).
* **Refused**: train-mode ``Dropout`` / ``BatchNorm`` (random or batch-coupled outputs, :func:`check_eval_mode`),
  float16 / bfloat16 parameters or inputs where the computation would run in them (:func:`check_precision`), and
  tensors on the meta device (no data).
"""
from __future__ import annotations

import contextlib
from typing import Mapping

import torch
from torch import Tensor, nn

# the eval-mode policy lives in taskloss.validation (one helper for every deterministic-forward method)
from taskloss.validation import check_eval_mode, check_finite, check_not_meta

__all__ = ["math_attention", "model_logits", "batch_size", "check_inputs", "take", "example", "call_module",
           "check_precision", "HALF", "transform_error",
           "loss_term_mask", "default_mask", "prepare", "call_model", "describe"]

HALF = (torch.float16, torch.bfloat16)


def math_attention():
    """A context in which ``scaled_dot_product_attention`` uses its math kernel (differentiable to any order, with
    forward-mode AD); a no-op on a torch without ``torch.nn.attention.sdpa_kernel``."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


class OutputTypeError(TypeError):
    """A model returned something other than a tensor or an object with ``.logits`` (not wrapped by
    :func:`call_model`: the message already says what to do)."""


def model_logits(out, what: str = "the model") -> Tensor:
    """The output tensor of a model call: ``out`` itself, or ``out.logits`` (a ``transformers`` ``ModelOutput``).

    Args:
        out: what the model returned.
        what: who returned it, for the message.

    Returns:
        The tensor.

    Raises:
        TypeError: neither a tensor nor an object with a ``.logits`` tensor (a tuple from ``return_dict=False``).
    """
    if isinstance(out, Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(out, (tuple, list)):
        raise OutputTypeError(f"{what} returned a {type(out).__name__}: the curvature functions take a tensor [N, C] / "
                        "[N, T, C] or an object with .logits (a transformers ModelOutput); call the model with "
                        "return_dict=True or pass a function fn(params, inputs) that returns the logits tensor")
    fields = [k for k, v in out.items() if isinstance(v, Tensor)] if isinstance(out, Mapping) else []
    if fields:   # a ModelOutput without logits (a base model's last_hidden_state, a loss)
        raise OutputTypeError(
            f"{what} returned a {type(out).__name__} without a .logits tensor (tensor fields: {', '.join(fields)}): "
            "the curvature code needs the output tensor [N, C] / [N, T, C] the likelihood is over. Pass a function "
            "that returns it in place of the model (model_or_fn, the forward_fn of this package), e.g. "
            f"fn = lambda params, inputs: torch.func.functional_call(model, params, inputs).{fields[0]}; K-FAC's "
            f"update_statistics takes outputs=out.{fields[0]}")
    raise OutputTypeError(f"{what} must return a tensor or an object with a .logits tensor (a transformers ModelOutput), "
                    f"got {type(out).__name__}")


def batch_size(inputs) -> int:
    """The batch size ``N`` of a tensor or of the tensors of a mapping of keyword inputs (checked: see
    :func:`check_inputs`)."""
    if isinstance(inputs, Tensor):
        return inputs.shape[0]
    return next(v.shape[0] for v in inputs.values() if isinstance(v, Tensor))


def check_inputs(inputs, name: str = "inputs", *, half: bool = False, finite: bool = True) -> int:
    """The batch size of ``inputs`` after checking them (see the module docstring).

    Args:
        inputs: a tensor ``[N, ...]`` or a mapping of keyword inputs.
        name: the argument's name, for the messages.
        half: accept float16 / bfloat16 inputs (K-FAC, which computes its factors in float32).
        finite: check floating inputs for NaN/inf (K-FAC does not: non-finite factors are caught when inverted).

    Returns:
        ``N``.

    Raises:
        TypeError: neither a tensor nor a mapping with a tensor; float16 / bfloat16 inputs unless ``half``.
        ValueError: an empty batch, NaN/inf in a floating input, batch sizes that differ, a meta tensor.
    """
    if isinstance(inputs, Tensor):
        tensors = {name: inputs}
    elif isinstance(inputs, Mapping):
        tensors = {f"{name}[{k!r}]": v for k, v in inputs.items() if isinstance(v, Tensor)}
        if not tensors:
            raise TypeError(f"{name} is a mapping without a tensor: pass model(**inputs)'s keyword tensors")
    else:
        raise TypeError(f"{name} must be a torch.Tensor or a mapping of keyword tensors (model(**inputs)), got "
                        f"{type(inputs).__name__}")
    sizes = {}
    for k, t in tensors.items():
        check_not_meta(k, t)
        if t.ndim == 0 or t.shape[0] == 0:
            raise ValueError(f"{k} is empty (batch size 0)")
        if not half:
            check_precision(k, t)
        if finite:
            check_finite(k, t)
        sizes[k] = t.shape[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the tensors of {name} have different batch sizes (first dimension): {sizes}")
    return next(iter(sizes.values()))


def take(inputs, start: int, stop: int):
    """The examples ``start:stop`` of a tensor or of every tensor of a mapping (other values unchanged)."""
    if isinstance(inputs, Tensor):
        return inputs[start:stop]
    return {k: v[start:stop] if isinstance(v, Tensor) else v for k, v in inputs.items()}


def example(x):
    """One example (as ``vmap`` hands it, without the batch dimension) made a batch of one again."""
    if isinstance(x, Tensor):
        return x.unsqueeze(0)
    return {k: v.unsqueeze(0) if isinstance(v, Tensor) else v for k, v in x.items()}


def call_module(module: nn.Module, params: Mapping[str, Tensor], inputs) -> Tensor:
    """``module(inputs)`` or ``module(**inputs)`` at ``params`` (``torch.func.functional_call``), as a tensor."""
    if isinstance(inputs, Mapping):
        out = torch.func.functional_call(module, dict(params), (), dict(inputs))
    else:
        out = torch.func.functional_call(module, dict(params), (inputs,))
    return model_logits(out, f"the model ({type(module).__name__})")


def check_precision(name: str, t: Tensor) -> Tensor:
    """``t`` unless it is a float16 / bfloat16 tensor (``TypeError`` naming the fix): the curvature functions sum
    per-example outer products and solve linear systems in the dtype of the parameters, which float16 overflows
    (above 65504) and bfloat16 rounds to 3 significant digits."""
    if isinstance(t, Tensor) and t.dtype in HALF:
        raise TypeError(f"{name} is {t.dtype}: curvature is computed in the parameters' dtype, and float16 "
                        "overflows / bfloat16 rounds away the per-example outer products and the solves; convert "
                        "the model and its inputs to float32 for curvature (model.float(); K-FAC computes its "
                        "factors in float32 itself)")
    return t


def transform_error(e: Exception) -> Exception:
    """A ``ValueError`` naming the fix for an operation without forward-mode AD or a second derivative inside a
    ``torch.func`` transform (fused attention kernels), or for an ``autograd.Function`` that cannot be transformed
    (BLOOM's GeLU); ``e`` itself otherwise.

    Args:
        e: the error raised inside the transform.

    Returns:
        The error to raise.
    """
    msg = str(e)
    if isinstance(e, (RuntimeError, NotImplementedError)) and any(
            k in msg for k in ("forward AD", "forward mode AD", "forward-mode AD", "derivative for")):
        return ValueError(
            "the model uses an operation without forward-mode AD or without a second derivative (fused attention "
            "kernels are the usual cause; the curvature functions already run scaled_dot_product_attention under "
            "its math kernel): build the model with attn_implementation=\"eager\" (transformers), or replace the "
            f"operation. Original error: {msg}")
    if isinstance(e, RuntimeError) and "setup_context" in msg:
        return ValueError(
            "the model calls a torch.autograd.Function that torch.func cannot transform (it has no setup_context; "
            "BLOOM's GeLUFunction is one): replace the module that calls it with a plain one computing the same "
            "function (for BLOOM: every BloomGelu by nn.GELU(approximate=\"tanh\")), or use a method that needs no "
            "torch.func transform (K-FAC; MGS with parallel=False). Original error: " + msg)
    return e


def loss_term_mask(mask, shape: torch.Size, device, name: str = "mask") -> Tensor | None:
    """``mask`` as a bool tensor of the loss terms' shape (``None`` stays ``None``), checked.

    Args:
        mask: a bool or 0/1 integer tensor (True / 1: the term counts), or None.
        shape: the loss terms' shape (the outputs' leading shape, ``[N]`` or ``[N, T]``).
        device: where the mask must live.
        name: the argument's name, for the messages.

    Returns:
        The bool mask, or None.

    Raises:
        TypeError: not a bool / integer tensor.
        ValueError: another shape, values other than 0/1, or no term left.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.is_floating_point() or mask.is_complex():
        raise TypeError(f"{name} must be a bool or 0/1 integer tensor, got "
                        f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
    check_not_meta(name, mask)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of the loss terms {tuple(shape)} (the outputs without their "
                         f"last dimension), got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(f"{name} must hold 0 and 1 only")
        mask = mask != 0
    if not bool(mask.any()):
        raise ValueError(f"{name} leaves no loss term (every entry is 0)")
    return mask.to(device)


def default_mask(mask, inputs, shape: torch.Size):
    """``mask``, or else ``inputs["attention_mask"]`` when ``inputs`` is a mapping holding one of the loss terms'
    ``shape`` (a causal LM's padding), or else None."""
    if mask is not None or not isinstance(inputs, Mapping):
        return mask
    am = inputs.get("attention_mask")
    return am if isinstance(am, Tensor) and tuple(am.shape) == tuple(shape) else None


# ------------------------------------------------------------------------------------------ params & calls
def _check_params(module: nn.Module | None, params) -> None:
    """Names, shapes, dtypes and values of ``params`` (against ``module``'s parameters when there is one)."""
    if not isinstance(params, Mapping) or len(params) == 0:
        raise ValueError("params must be a non-empty dict name → tensor")
    if module is not None:
        own = dict(module.named_parameters(remove_duplicate=False))   # a tied weight under each of its names
        unknown = [k for k in params if k not in own]
        if unknown:
            raise ValueError(f"params {unknown} are not parameters of the model (a phantom name would add an all-zero "
                             f"row and column); its parameters include {list(own)[:6]}")
        for k, p in params.items():
            if isinstance(p, Tensor) and tuple(p.shape) != tuple(own[k].shape):
                raise ValueError(f"parameter {k!r} has shape {tuple(p.shape)}, the model's {tuple(own[k].shape)}")
    seen: dict[int, str] = {}
    for k, p in params.items():
        if not isinstance(p, Tensor) or not p.is_floating_point():
            raise TypeError(f"parameter {k!r} must be a floating-point tensor")
        if id(p) in seen:
            raise ValueError(f"params holds one tensor under two names ({seen[id(p)]!r} and {k!r}: a tied or shared "
                             "parameter): list it once")
        seen[id(p)] = k
        check_not_meta(f"parameter {k!r}", p)
        check_precision(f"parameter {k!r}", p)
        check_finite(f"parameter {k!r}", p)


def prepare(model_or_fn, params, inputs):
    """``(fn(params, inputs) → output tensor, params detached)`` after validating everything.

    Args:
        model_or_fn: an ``nn.Module`` (called through ``torch.func.functional_call``) or ``fn(params, inputs)``.
        params: a dict name → tensor (for a module: names of its parameters, each tensor once; ``None``: its
            parameters that require grad, a tied weight once).
        inputs: a tensor or a mapping of keyword inputs.

    Returns:
        The function and the parameters.

    Raises:
        TypeError: bad types, float16 / bfloat16 parameters or inputs.
        ValueError: unknown parameter names or shapes, a tensor under two names, NaN/inf, meta tensors, a
            train-mode Dropout / BatchNorm, empty inputs.
    """
    module = None
    if isinstance(model_or_fn, nn.Module):
        module = model_or_fn
        check_not_meta("the model", module)
        check_eval_mode(module)
        if params is None:
            params = {k: p for k, p in module.named_parameters() if p.requires_grad}
            if not params:
                raise ValueError("the model has no parameter with requires_grad=True")

        def fn(p, x):
            return call_module(module, p, x)
    elif callable(model_or_fn):
        if params is None:
            raise ValueError("params must be given (a dict name → tensor) when model_or_fn is a function")

        def fn(p, x):
            return model_logits(model_or_fn(p, x), "model_or_fn")
    else:
        raise TypeError("model_or_fn must be an nn.Module or a callable fn(params, inputs)")
    _check_params(module, params)
    check_inputs(inputs)
    return fn, {k: p.detach() for k, p in params.items()}


def describe(inputs) -> str:
    """The inputs' shapes and dtypes, for a message."""
    if isinstance(inputs, Tensor):
        return f"inputs of shape {tuple(inputs.shape)} and dtype {inputs.dtype}"
    return "inputs " + ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" if isinstance(v, Tensor) else f"{k}={v!r}"
                                 for k, v in inputs.items())


def call_model(fn, params, inputs):
    """``fn(params, inputs)``; an error becomes a ``ValueError`` that describes the inputs (or names the fix, for an
    operation without forward-mode AD: :func:`transform_error`)."""
    try:
        return fn(params, inputs)
    except OutputTypeError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError) as e:
        mapped = transform_error(e)
        if mapped is not e:
            raise mapped from e
        raise ValueError(f"model raised on {describe(inputs)} (do they match the model and its parameters?): "
                         f"{e}") from e
