"""Parameters as flat vectors and pure functions of them (used by every room that updates or measures parameters):
:func:`unique_tensors` keeps each tensor once by identity (a parameter shared between modules, or listed twice, is
one parameter, as ``nn.Module.parameters`` counts it) and drops frozen ones (``requires_grad=False``) on request;
:func:`flatten` / :func:`unflatten` turn a dict or sequence of tensors into one flat vector and back;
:func:`flat_gradient` is the flat ``.grad`` of a parameter list; :func:`named_tensors` names an optimizer's
parameters; :func:`functional_loss` turns ``(model, loss_fn, inputs)`` into a pure function of the parameters
(``torch.func.functional_call``), the form the zeroth-order estimators (notebook 05_policy_gradient_vs_zeroth_order)
and the second-order probes of :mod:`taskloss.dynamics` (notebooks 11_gradient_clipping,
12_implicit_gradient_regularization) take.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from taskloss._lazy import _Lazy
from taskloss.validation import check_bool, check_iterable, check_not_meta, check_tensors

torch = _Lazy("torch", bind="torch", namespace=globals())
nn = _Lazy("torch.nn", bind="nn", namespace=globals())
Tensor = _Lazy("torch", "Tensor", bind="Tensor", namespace=globals())

__all__ = [
    "count_parameters",
    "unique_tensors",
    "distinct_param_group",
    "flatten",
    "unflatten",
    "flat_gradient",
    "named_tensors",
    "functional_loss",
]


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``model`` (tied weights counted once)."""
    trainable_only = check_bool("trainable_only", trainable_only)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def unique_tensors(tensors, *, trainable_only: bool = False) -> list[Tensor]:
    """The tensors of ``tensors`` (one tensor or an iterable of them) in first-seen order, each once.

    Identity decides: a parameter shared between two modules, or listed twice, is one parameter (as
    ``nn.Module.parameters()`` counts it), so nothing that clips, steps or measures parameters counts it twice.

    Args:
        tensors: a tensor or an iterable of tensors.
        trainable_only: also drop the tensors with ``requires_grad=False`` (frozen parameters).

    Returns:
        A new list of the distinct tensors.

    Raises:
        TypeError: an element that is not a tensor.
    """
    trainable_only = check_bool("trainable_only", trainable_only)
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = check_iterable("tensors", tensors)
    out, seen = [], set()
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
        if id(t) in seen or (trainable_only and not t.requires_grad):
            continue
        seen.add(id(t))
        out.append(t)
    return out


def distinct_param_group(group: dict | Iterable) -> dict:
    """A ``torch.optim`` parameter group whose ``params`` hold each tensor once (:func:`unique_tensors`).

    The optimizers of the package pass every group through it in ``add_param_group`` (construction included), so a
    parameter listed twice in a group is stepped once, as one shared between modules is.

    Args:
        group: a parameter-group dict (``{"params": ..., hyperparameters}``) or an iterable of tensors.

    Returns:
        A new dict with the same entries and ``params`` as a list of distinct tensors.

    Raises:
        TypeError: ``group`` is neither.
    """
    if isinstance(group, Tensor):
        group = {"params": [group]}
    elif not isinstance(group, dict):
        raise TypeError(f"a parameter group must be a dict, got {type(group).__name__}")
    params = group.get("params", [])
    if isinstance(params, set):       # unordered: left for torch.optim to refuse
        return dict(group)
    return {**group, "params": unique_tensors(params)}


def flatten(tensors: Tensor | Mapping[str, Tensor] | Iterable[Tensor]) -> Tensor:
    """Concatenate a dict (dict order) or a sequence of tensors into one flat vector ``[P]`` (a tensor: flattened).

    Args:
        tensors: one tensor, a non-empty dict name → tensor, or a non-empty list/tuple of tensors.

    Returns:
        The flat concatenation (a new tensor).

    Raises:
        ValueError: nothing to flatten.
    """
    if isinstance(tensors, Tensor):
        check_not_meta("tensors", tensors)
        return tensors.reshape(-1)
    values = check_tensors("tensors", tensors)
    check_not_meta("tensors", values)
    if not values:
        raise ValueError("expected a non-empty dict or sequence of tensors")
    return torch.cat([t.reshape(-1) for t in values])


def unflatten(flat: Tensor, like: Mapping[str, Tensor] | Iterable[Tensor]):
    """Inverse of :func:`flatten`: split ``flat [P]`` into views shaped like the tensors of ``like``.

    Args:
        flat: a flat vector with as many entries as ``like`` holds.
        like: a dict name → tensor (returns a dict with its keys) or a sequence of tensors (returns a list).

    Returns:
        Views of ``flat``, a dict or a list as ``like``.

    Raises:
        ValueError: ``flat`` is not a flat tensor of the right length.
    """
    as_dict = isinstance(like, Mapping)
    check_tensors("like", like)
    items = list(like.items()) if as_dict else list(enumerate(like))
    total = sum(t.numel() for _, t in items)
    if not isinstance(flat, Tensor) or flat.ndim != 1 or flat.numel() != total:
        raise ValueError(f"flat vector must have shape ({total},), got "
                         f"{tuple(flat.shape) if isinstance(flat, Tensor) else type(flat).__name__}")
    parts = flat.split([t.numel() for _, t in items]) if items else ()
    views = [v.view_as(t) for v, (_, t) in zip(parts, items)]
    return dict(zip((k for k, _ in items), views)) if as_dict else views


def flat_gradient(params: Iterable[Tensor]) -> Tensor:
    """The ``.grad`` of ``params`` as one flat vector, zeros for a tensor without a gradient.

    Args:
        params: a non-empty sequence of tensors.

    Returns:
        A new flat tensor ``[P]`` (detached).

    Raises:
        ValueError: ``params`` is empty.
    """
    params = check_tensors("params", params)
    if not params:
        raise ValueError("params is empty: no gradient to flatten")
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad.detach()).reshape(-1) for p in params])


def named_tensors(params, model_fn) -> tuple[list[str], list[Tensor]]:
    """``(names, tensors)`` of an optimizer's ``params``, each tensor once (by identity).

    Args:
        params: a dict name → tensor, ``(name, tensor)`` pairs, or tensors of ``model_fn`` (named after the module's
            parameters) or of a function (named ``"0"``, ``"1"``, …).
        model_fn: the ``nn.Module`` owning the tensors, or a function.

    Returns:
        The names and the tensors, in the order given (a repeated tensor kept at its first place).

    Raises:
        ValueError: an empty list, or a tensor that is not a parameter of the module ``model_fn``.
    """
    if isinstance(params, Mapping):
        items = list(params.items())
    else:
        items = list(check_iterable("params", params))
        if items and isinstance(items[0], tuple):
            items = [(str(k), p) for k, p in items]
        elif isinstance(model_fn, nn.Module):
            names = {id(p): k for k, p in model_fn.named_parameters()}
            if any(id(p) not in names for p in items):
                raise ValueError("every parameter must belong to model_fn")
            items = [(names[id(p)], p) for p in items]
        else:
            items = [(str(i), p) for i, p in enumerate(items)]
    if not items:
        raise ValueError("optimizer got an empty parameter list")
    seen: set[int] = set()
    items = [(k, p) for k, p in items if not (id(p) in seen or seen.add(id(p)))]
    return [k for k, _ in items], [p for _, p in items]


def functional_loss(model: nn.Module, loss_fn: Callable, *args, **kwargs):
    """``(f, theta)``: the loss as a pure function of the model's trainable parameters, and those parameters.

    ``theta = {name: detached parameter}`` over the parameters with ``requires_grad`` (each shared parameter once,
    under its first name), and ``f(params) = loss_fn(functional_call(model, params, args, kwargs))``: a function
    that ``torch.func`` transforms and the zeroth-order estimators can vmap over; frozen parameters keep their
    values. Derived in notebook 05_policy_gradient_vs_zeroth_order; used in 03_metric_optimization_classification,
    11_gradient_clipping and 12_implicit_gradient_regularization.

    Args:
        model: the network.
        loss_fn: model output → scalar tensor (e.g. ``lambda logits: 1 - (logits.argmax(-1) == y).float().mean()``).
        *args: positional inputs of the model's forward.
        **kwargs: keyword inputs of the model's forward.

    Returns:
        ``(f, theta)``.

    Raises:
        TypeError: ``model`` is not a module or ``loss_fn`` not callable.
        ValueError: the model has no trainable parameter.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable")
    theta = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    if not theta:
        raise ValueError("model has no parameter with requires_grad=True")

    def f(params):
        return loss_fn(torch.func.functional_call(model, params, args, kwargs))

    return f, theta
