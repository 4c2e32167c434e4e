"""A model evaluated at other parameters for the whole of a call: what MGS's vmap modes, its readable reference and
the harness's zeroth-order rules score candidates with.

``torch.func.functional_call(model, params, args)`` swaps the parameters for one call of ``model.forward``; anything
else a scoring function does with the model — a method (``model.generate``), a submodule (``model.lm_head``), a
second forward inside the task loss — would see the module's own parameters. :func:`call_with_parameters` runs
``fn(model, ...)`` with the parameters swapped for the whole call instead (``functional_call`` on a wrapper module
whose forward is ``fn``), so every path through the module sees them, under ``vmap`` too (then they are batched
tensors and so is everything computed from them). Tied parameters follow (``tie_weights=True``): swapping a shared
embedding once swaps it wherever the module uses it.

Two things can still bypass the swap, and the checks here refuse them instead of returning losses at the wrong
parameters: a tensor taken from the module *before* the call (``W = model.lm_head.weight`` captured by a closure,
or a second module object holding the same ``nn.Parameter``) — :class:`ParameterReads` sees every torch operation
that reads one of the original parameters; and a function whose value does not depend on the swapped parameters at
all (a copy of the model) — :func:`depends_on_vmap` tells whether a value computed inside ``vmap`` carries the
batch of candidates. Derived for notebook 02_importance_sampling_and_mgs's MGS (and used in 04_sequence_task_losses
and 16_update_rule_harness).
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

__all__ = ["call_with_parameters", "ParameterReads", "depends_on_vmap"]


class _Scope(nn.Module):
    """``forward(fn, *args, **kwargs) = fn(model, *args, **kwargs)``: the module under a wrapper whose forward is
    any function of it, so that ``functional_call`` swaps the parameters for the whole of ``fn``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def call_with_parameters(model: nn.Module, params: Mapping[str, Tensor], fn: Callable, *args, **kwargs):
    """``fn(model, *args, **kwargs)`` with ``model``'s parameters named in ``params`` replaced for the whole call.

    Every use of the module inside ``fn`` — its forward, its methods (``generate``), its submodules, a task loss that
    drives it — sees ``params``; the module's own tensors are put back afterwards, also on error. Inside
    ``torch.func.vmap`` over stacked ``params`` each candidate sees its own. Parameters not named keep their values;
    tied ones follow the name given (``functional_call``'s ``tie_weights``).

    Args:
        model: the module.
        params: ``{name: tensor}`` with names from ``model.named_parameters()`` (or buffers).
        fn: ``(model, *args, **kwargs) → anything``.
        *args: positional arguments of ``fn`` after the model.
        **kwargs: keyword arguments of ``fn``.

    Returns:
        What ``fn`` returns.

    Raises:
        TypeError: ``model`` is not a module, ``fn`` not callable or ``params`` not a mapping.
        ValueError: a name in ``params`` that is not a parameter or buffer of ``model``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(fn):
        raise TypeError(f"fn must be callable (model, ...) -> value, got {type(fn).__name__}")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping name -> tensor, got {type(params).__name__}")
    known = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    known.update(n for n, _ in model.named_buffers(remove_duplicate=False))
    unknown = [k for k in params if k not in known]
    if unknown:
        raise ValueError(f"params names {unknown[:5]} are not parameters or buffers of the model "
                         f"({type(model).__name__})")
    scoped = {f"model.{k}": v for k, v in params.items()}
    return functional_call(_Scope(model), scoped, (fn, *args), kwargs)


class ParameterReads(TorchFunctionMode):
    """A torch-function mode that raises on any operation reading one of ``tensors`` (by identity).

    Metadata (``shape``, ``dtype``, ``device``, ``numel``) does not count: only operations that return a tensor.
    Entered inside :func:`call_with_parameters`, it catches the module's original parameters reaching a computation
    that should have used the swapped ones.

    Args:
        tensors: ``{name: tensor}`` to watch.
        what: the sentence that ends the message (what to do instead).
    """

    def __init__(self, tensors: Mapping[str, Tensor], what: str):
        super().__init__()
        self._names = {id(t): n for n, t in tensors.items()}
        self._what = what

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(isinstance(o, Tensor) for o in tree_leaves(out)):
            for a in tree_leaves((args, kwargs)):
                if isinstance(a, Tensor) and id(a) in self._names:
                    raise ValueError(f"the parameter {self._names[id(a)]!r} was read directly (a tensor taken from "
                                     f"the model outside the call, by {getattr(func, '__name__', func)}), not through "
                                     f"the module the call was given, so it would keep its current value: "
                                     f"{self._what}")
        return out


def depends_on_vmap(value) -> bool:
    """Whether a value computed inside ``torch.func.vmap`` carries the batch of the innermost vmap level (some tensor
    leaf is batched there); a value that does not is the same for every element of the batch.

    Args:
        value: a tensor or a pytree of them.

    Returns:
        ``True`` when some tensor leaf is batched at the current vmap level (``True`` outside any transform).
    """
    fc = torch._C._functorch
    if fc.peek_interpreter_stack() is None:
        return True
    level = fc.current_level()
    for leaf in tree_leaves(value):
        if isinstance(leaf, Tensor) and fc.is_batchedtensor(leaf) and fc.maybe_get_level(leaf) == level:
            return True
    return False
