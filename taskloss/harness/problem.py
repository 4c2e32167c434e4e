"""A problem for the update-rule harness, and the counting of forward and backward passes.

Derived in notebook 16_update_rule_harness.

A :class:`Problem` is what every rule sees: a model, a batch ``(inputs [N, ...], targets [N, ...])``, the
differentiable surrogate ``l̃`` (the batch-mean negative log-likelihood of :func:`taskloss.curvature.fisher.nll_loss`
plus ``weight_decay/2 · ‖θ‖²``) and a task loss ``l`` (lower is better) that search rules (MGS, zeroth order,
REINFORCE) optimize instead. When no task loss is given the task loss *is* the surrogate: that is the setting in
which the ideal update Δθ* of :mod:`taskloss.harness.reference` is the update every rule estimates.

:class:`PassCounter` counts, with module hooks, what a step really does to the model:

* ``forward`` — calls of the model's ``forward`` outside ``torch.func`` transforms (one call = one pass over the
  batch it is given; ``functional_call`` with swapped parameters counts too). When the counter knows the
  problem's ``batch_size`` N, a call on a ``[R, ...]`` input counts R/N (S sampled sequences per prefix: S);
  a sequence problem counts calls of its output layer instead (:mod:`taskloss.harness.sequence`);
* ``backward`` — gradients propagated back through the model's output by autograd (a tensor hook on the output
  fires once per ``backward``/``autograd.grad`` that reaches it, also for the second backward of a
  Hessian-vector product; weighted by the rows of its forward as above);
* ``functional`` — calls of ``forward`` inside ``torch.func`` transforms (``vmap``, ``jvp``, ``vjp``,
  ``jacrev``, ``hessian``), counted apart from plain passes. The convention: a call under ``vmap`` counts the
  product of the enclosing vmap batch sizes, so K candidates scored by one vmapped forward count K, exactly as
  K forwards one after another would; a call under ``grad``/``vjp``/``jvp`` alone counts one. When the counter
  is given the problem's ``batch_size`` N, each such call is further weighted by the rows it sees over N, so a
  vmap over the N examples one at a time (per-example gradients, a Fisher) counts one pass over the batch, not
  N (``functional`` is then a float). What the hooks
  cannot see are the backward sweeps *inside* a transform (``jacrev`` vmaps its vector-Jacobian products over
  the P basis vectors after one forward): a dense Hessian or a GGN-vector product therefore counts one
  functional call although it costs up to ~P backward sweeps. For such rules the pass count is a lower bound
  and the CPU seconds are the comparable axis.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from taskloss.curvature.fisher import LIKELIHOODS, nll_loss
from taskloss.parameter_vectors import flatten, unflatten
from taskloss.validation import (
    check_eval_mode,
    check_finite,
    check_floating,
    check_ndim,
    check_nonnegative,
    check_not_meta,
)

__all__ = ["Problem", "PassCounter", "PassCount", "grad_hessian"]

TaskLossFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Problem:
    """The model, one batch and the two losses a rule is judged on.

    Args:
        model: an ``nn.Module`` mapping ``inputs [N, ...]`` to outputs ``[N, C]`` (logits for ``"categorical"``,
            means for ``"gaussian"``); its parameters that require grad are the ones updated.
        inputs, targets: the batch (``N ≥ 1`` rows, finite inputs).
        likelihood: ``"categorical"`` or ``"gaussian"``, as in :mod:`taskloss.curvature.fisher`.
        weight_decay: ``λ ≥ 0``; the surrogate is ``nll + λ/2 ‖θ‖²`` (makes a linear model's Hessian definite).
        task_loss_fn: ``(outputs [N, C], targets) → 0-d tensor`` (lower is better); ``None``: the surrogate itself.
        task_labels_fn: ``(labels [..., N], targets) → [...]`` the task loss of predicted class ids (batched over
            leading dims), used by REINFORCE as ``reward = −task``; categorical problems only.

    Raises ``TypeError``/``ValueError`` on a non-module model, an empty batch, NaN/inf inputs, mismatched
    batch sizes, an unknown likelihood or a negative weight decay.
    """

    model: nn.Module
    inputs: Tensor
    targets: Tensor
    likelihood: str = "categorical"
    weight_decay: float = 0.0
    task_loss_fn: TaskLossFn | None = None
    task_labels_fn: Callable[[Tensor, Tensor], Tensor] | None = None

    def __post_init__(self):
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(self.model).__name__}")
        check_not_meta("model", self.model)
        for name, t in (("inputs", self.inputs), ("targets", self.targets)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
            check_not_meta(name, t)
            if t.ndim < 1 or t.shape[0] == 0:
                raise ValueError(f"{name} is an empty batch (shape {tuple(t.shape)}): need N >= 1 rows")
        if self.inputs.shape[0] != self.targets.shape[0]:
            raise ValueError(f"batch sizes differ: inputs {tuple(self.inputs.shape)}, targets "
                             f"{tuple(self.targets.shape)}")
        for name, t in (("inputs", self.inputs), ("targets", self.targets)):
            if t.is_floating_point():
                check_finite(name, t)
        if self.likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {self.likelihood!r}")
        self.weight_decay = check_nonnegative("weight_decay", self.weight_decay)
        for name in ("task_loss_fn", "task_labels_fn"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None")
        if not any(p.requires_grad for p in self.model.parameters()):
            raise ValueError("model has no parameter with requires_grad=True")

    def set_batch(self, inputs: Tensor, targets: Tensor) -> None:
        """Swap in another batch (validated as at construction); rules read the batch at every step."""
        old = self.inputs, self.targets
        self.inputs, self.targets = inputs, targets
        try:
            self.__post_init__()
        except (TypeError, ValueError):
            self.inputs, self.targets = old
            raise

    def grad_hessian(self) -> tuple[Tensor, Tensor]:
        """Gradient ``[P]`` and dense Hessian ``[P, P]`` (symmetrized) of the surrogate at the current parameters,
        by ``torch.func.grad`` and ``torch.func.jacrev`` twice (P² memory: small models only).

        Raises ``ValueError`` for a model holding a train-mode Dropout or BatchNorm (each call of the loss would be
        another random function; :func:`taskloss.validation.check_eval_mode`, as the curvature methods refuse it)."""
        check_eval_mode(self.model, purpose="the gradient and the Hessian would be of different random functions",
                        fix="grad_hessian()")
        return grad_hessian(self.flat_loss(), self.flat_params())

    @property
    def params(self) -> list[Tensor]:
        """The trained parameters, in ``named_parameters`` order."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def named_params(self) -> dict[str, Tensor]:
        """The trained parameters by name, in ``named_parameters`` order."""
        return {k: p for k, p in self.model.named_parameters() if p.requires_grad}

    def surrogate_from_outputs(self, outputs: Tensor, params=None) -> Tensor:
        """``nll(outputs, targets) + λ/2 ‖θ‖²`` (``params``: the θ to penalize, default the model's)."""
        if torch._C._functorch.peek_interpreter_stack() is None:
            loss = nll_loss(outputs, self.targets, self.likelihood)   # validated
        elif self.likelihood == "categorical":                          # the same, traceable by vmap
            loss = F.cross_entropy(outputs, self.targets)
        else:
            loss = 0.5 * (outputs - self.targets).pow(2).sum(-1).mean()
        if self.weight_decay > 0:
            ps = self.params if params is None else list(params)
            loss = loss + 0.5 * self.weight_decay * sum(p.pow(2).sum() for p in ps)
        return loss

    def surrogate(self, model: nn.Module | None = None, batch=None) -> Tensor:
        """The surrogate at the model's current parameters (signature ``(model, batch)`` as MGS wants it)."""
        return self.surrogate_from_outputs((model or self.model)(self.inputs))

    @property
    def counted_module(self) -> nn.Module:
        """The module whose calls :class:`PassCounter` counts as passes (here the model itself)."""
        return self.model

    def task_outputs(self, call: Callable | None = None) -> Tensor:
        """What the task loss is computed from: ``call(inputs)`` (default: the model's outputs ``[N, C]``).
        ``call`` runs the model, e.g. at other parameters through ``torch.func.functional_call``."""
        return (call or self.model)(self.inputs)

    def task_from_outputs(self, outputs: Tensor, params=None) -> Tensor:
        """The task loss of ``outputs`` (the surrogate when no task loss was given)."""
        if self.task_loss_fn is None:
            return self.surrogate_from_outputs(outputs, params)
        return torch.as_tensor(self.task_loss_fn(outputs, self.targets), device=outputs.device)

    def task_loss(self) -> float:
        """The task loss at the model's current parameters (no gradient)."""
        with torch.no_grad():
            value = float(self.task_from_outputs(self.task_outputs()))
        if value != value:
            raise ValueError("the task loss is NaN at the current parameters")
        return value

    def flat_params(self) -> Tensor:
        """The trained parameters as one flat vector (a detached copy)."""
        return flatten([p.detach() for p in self.params])

    def set_flat_params(self, flat: Tensor) -> None:
        """Write the flat vector ``flat`` into the trained parameters."""
        with torch.no_grad():
            torch._foreach_copy_(self.params, unflatten(flat, self.params))

    def flat_loss(self) -> Callable[[Tensor], Tensor]:
        """``θ [P] ↦ l̃(θ)``: the surrogate as a pure function of the flat parameters (for ``torch.func``)."""
        named = self.named_params
        shapes = [(k, p.shape, p.numel()) for k, p in named.items()]

        def f(theta: Tensor) -> Tensor:
            out, i = {}, 0
            for k, shape, n in shapes:
                out[k] = theta[i:i + n].view(shape)
                i += n
            outputs = torch.func.functional_call(self.model, out, (self.inputs,))
            return self.surrogate_from_outputs(outputs, out.values())

        return f


def grad_hessian(f: Callable[[Tensor], Tensor], theta: Tensor) -> tuple[Tensor, Tensor]:
    """``(∇f(θ), ∇²f(θ))`` of a scalar function of a flat vector, both checked finite (``TypeError`` for an ``f``
    that is not callable or a ``θ`` that is not a 1-D floating tensor)."""
    if not callable(f):
        raise TypeError(f"f must be callable (a function of the flat parameters), got {type(f).__name__}")
    check_floating("theta", theta)
    check_ndim("theta", theta, 1)
    g = check_finite("gradient", torch.func.grad(f)(theta))
    H = torch.func.jacrev(torch.func.jacrev(f))(theta)
    return g, check_finite("Hessian", 0.5 * (H + H.mT))


def _vmap_width() -> int:
    """Product of the batch sizes of the ``vmap`` levels on functorch's interpreter stack (1 when none)."""
    fc = torch._C._functorch
    width = 1
    for interp in fc.get_interpreter_stack() or []:
        if interp.key() == fc.TransformType.Vmap:
            width *= int(fc.CVmapInterpreterPtr(interp).batchSize())
    return width


@dataclass
class PassCount:
    """Counted passes of one step (see the module docstring)."""

    forward: float = 0
    backward: float = 0
    functional: float = 0

    @property
    def total(self) -> float:
        """``forward + backward + functional`` (see the module docstring for how functional calls are counted)."""
        return self.forward + self.backward + self.functional


class PassCounter:
    """Context manager that counts the model's passes: ``with PassCounter(model) as c: ...; c.count``.

    ``batch_size``: the problem's N, to weight functional calls by the rows they see (module docstring)."""

    def __init__(self, model: nn.Module, batch_size: int | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        self.model, self.count, self._handles, self.batch_size = model, PassCount(), [], batch_size

    def _bump_backward(self, weight):
        def hook(grad):
            self.count.backward += weight
            return None
        return hook

    def _pre(self, module, args):
        if torch._C._functorch.peek_interpreter_stack() is not None:  # inside vmap / grad / jvp / vjp
            weight = _vmap_width()
            if self.batch_size is not None and args and isinstance(args[0], Tensor):
                rows = args[0].shape[0] if args[0].ndim >= 2 else 1   # logical rows of one vmapped call
                weight = weight * rows / self.batch_size
            self.count.functional += weight
            self._transformed = True
        else:
            weight = 1
            if self.batch_size is not None and args and isinstance(args[0], Tensor) and args[0].ndim >= 2 \
                    and args[0].shape[0] != self.batch_size:
                weight = args[0].shape[0] / self.batch_size                 # a call over R ≠ N rows counts R/N
            self.count.forward += weight
            self._weight = weight
            self._transformed = False

    def _post(self, module, args, output):
        if not self._transformed and isinstance(output, Tensor) and output.requires_grad:
            output.register_hook(self._bump_backward(self._weight))

    def __enter__(self) -> PassCounter:
        self._transformed, self._weight = False, 1
        self._handles = [self.model.register_forward_pre_hook(self._pre),
                         self.model.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
