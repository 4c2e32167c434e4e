"""Scoring MGS candidates: the task loss of every perturbed parameter set θ + Δθ_k.

Used by :class:`taskloss.search.mgs.MGS` (derived in notebook 02_importance_sampling_and_mgs; applied in
03_metric_optimization_classification and 04). Three modes, chosen by ``MGS(parallel=..., vmap_task_loss=...)``:
``"vmap"`` — forward and task loss of a chunk of candidates in one ``torch.func.vmap`` over stacked parameter
dicts; ``"vmap_forward"`` — vmap the forward, score each candidate's outputs in a Python loop (for
non-vmappable metrics); ``"loop"`` — write θ + Δθ_k into the module's own parameters, score, go on to the next
candidate (the caller restores θ once after the last one). With ``vmap_task_loss="auto"`` a failing mode falls
back to the next one with a warning. In every mode candidate k is evaluated at the parameters θ + Δθ_k computed
by one elementwise addition, so the modes differ only in the forward kernels (batched or not).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

from taskloss.utils import eval_mode as _eval_mode

__all__ = ["default_forward"]

MODES = ("vmap", "vmap_forward", "loop")   # in the order of the "auto" fallback


def default_forward(model: Callable, batch):
    """``(inputs, targets, ...)`` → ``model(inputs)``; a tensor batch → ``model(batch)``. Pass ``forward_fn`` to
    :class:`MGS` for anything else (e.g. decoding a continuation from a prefix)."""
    if isinstance(batch, (tuple, list)) and batch:
        return model(batch[0])
    if isinstance(batch, Tensor):
        return model(batch)
    raise TypeError(f"default_forward needs a tuple (inputs, ...) or a tensor batch, got {type(batch).__name__};"
                    " pass forward_fn=(model, batch) -> outputs")


def _scalar_loss(value, what: str) -> Tensor:
    t = torch.as_tensor(value)
    if t.numel() != 1:
        raise ValueError(f"task_loss_fn must return a scalar per candidate, got shape {tuple(t.shape)} ({what})")
    return t.detach().reshape(()).to(torch.float64)


def _stack_losses(values: list, what: str) -> Tensor:
    """The task losses of several candidates as one float64 tensor ``[n]``: for tensors of one dtype and device,
    one shape check per value and one stack and conversion in all (the numbers of :func:`_scalar_loss` per
    value, which handles anything else)."""
    first = values[0] if values else None
    if isinstance(first, Tensor) and all(isinstance(v, Tensor) and v.dtype == first.dtype and
                                         v.device == first.device for v in values):
        for v in values:
            if v.numel() != 1:
                raise ValueError(f"task_loss_fn must return a scalar per candidate, got shape {tuple(v.shape)} "
                                 f"({what})")
        return torch.stack([v if v.dim() == 0 else v.reshape(()) for v in values]).detach().to(torch.float64)
    if not values:
        return torch.zeros(0, dtype=torch.float64)
    return torch.stack([_scalar_loss(v, what) for v in values])


class _FunctionalModel:
    """The model with candidate parameters inside ``vmap``: calling it runs ``functional_call(model, params, …)``;
    other attributes (``vocab_size``, ``max_len``, …) are the module's."""

    def __init__(self, model: nn.Module, params: dict[str, Tensor]):
        self._model, self._params = model, params

    def __call__(self, *args, **kwargs):
        return functional_call(self._model, self._params, args, kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


class _CandidateScoring:
    """Candidate evaluation for :class:`taskloss.search.mgs.MGS` (a mixin). The host provides ``model``, ``params``,
    ``forward_fn``, ``task_loss_fn``, ``mode``, ``eval_mode``, ``_auto``, ``_mode_confirmed`` and ``_unflat``."""

    def _call(self, params: dict[str, Tensor]) -> "_FunctionalModel":
        return _FunctionalModel(self.model, params)

    def _load(self, theta: Tensor, delta: Tensor | None = None) -> None:
        """Write θ (+ Δθ) into the module's parameters, one elementwise pass per tensor (no temporaries)."""
        with torch.no_grad():
            if delta is None:
                for p, v in zip(self.params, self._unflat(theta).values()):
                    p.copy_(v)
            else:
                for p, t, d in zip(self.params, self._unflat(theta).values(), self._unflat(delta).values()):
                    torch.add(t, d, out=p)

    @contextlib.contextmanager
    def _loaded(self, flat: Tensor, theta: Tensor):
        """The module itself with ``flat`` written into its parameters; ``theta`` restored on exit (even on
        error)."""
        self._load(flat)
        try:
            yield self.model
        finally:
            self._load(theta)

    def _loss_at(self, flat: Tensor, batch) -> float:
        """The task loss at the parameters ``flat`` (e.g. l(θ) of an earlier step), on the module as in loop mode
        and in the mode the candidates are scored in; the module's current parameters are restored after."""
        with _eval_mode(self.model, self.eval_mode), torch.no_grad():
            now = torch.cat([p.detach().reshape(-1) for p in self.params])
            with self._loaded(flat, now) as model:
                return float(self._score_one(model, batch))

    def _task_value(self, model_k, batch):
        """``task_loss_fn(forward_fn(model_k, batch), batch)`` as returned (checked by :func:`_stack_losses`)."""
        return self.task_loss_fn(self.forward_fn(model_k, batch), batch)

    def _score_one(self, model_k, batch) -> Tensor:
        return _scalar_loss(self._task_value(model_k, batch), "loop")

    def _score(self, deltas: Tensor, theta: Tensor, batch) -> Tensor:
        """Task losses (float64 ``[c]``) of the candidates θ + Δθ_j for the rows of ``deltas [c, P]``. In loop
        mode the module is left holding the last candidate's parameters: the caller restores θ."""
        c = deltas.shape[0]
        if self.mode != "loop":
            stacked = self._unflat(theta.unsqueeze(0) + deltas)
            try:
                if self.mode == "vmap":
                    out = vmap(lambda p: self.task_loss_fn(self.forward_fn(self._call(p), batch), batch),
                               randomness="different")(stacked)
                    if not isinstance(out, Tensor) or out.shape != (c,):
                        raise ValueError(f"task_loss_fn must return a scalar tensor per candidate, got "
                                         f"{tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
                    self._mode_confirmed = True
                    return out.detach().to(torch.float64)
                outs = vmap(lambda p: self.forward_fn(self._call(p), batch), randomness="different")(stacked)
                res = _stack_losses([self.task_loss_fn(tree_map(lambda o, j=j: o[j], outs), batch)
                                     for j in range(c)], "vmap_forward")
                self._mode_confirmed = True
                return res
            except Exception as e:  # noqa: BLE001 — a genuine error re-raises in the fallback below
                if not self._auto or self._mode_confirmed:
                    raise
                new = "vmap_forward" if self.mode == "vmap" else "loop"
                warnings.warn(f"MGS: candidate evaluation mode '{self.mode}' failed ({type(e).__name__}: "
                              f"{str(e)[:160]}); falling back to '{new}'", RuntimeWarning, stacklevel=3)
                self.mode = new
                return self._score(deltas, theta, batch)
        out = []
        for d in deltas:
            self._load(theta, d)
            out.append(self._task_value(self.model, batch))
        return _stack_losses(out, "loop")
