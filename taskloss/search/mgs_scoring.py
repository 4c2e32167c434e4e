"""Scoring MGS candidates: the task loss of every perturbed parameter set θ + Δθ_k.

Used by :class:`taskloss.search.mgs.MGS` (derived in notebook 02_importance_sampling_and_mgs; applied in
03_metric_optimization_classification and 04). Three modes, chosen by ``MGS(parallel=..., vmap_task_loss=...)``:
``"vmap"`` — forward and task loss of a chunk of candidates in one ``torch.func.vmap`` over stacked parameter
dicts; ``"vmap_forward"`` — vmap the forward, score each candidate's outputs in a Python loop (for
non-vmappable metrics); ``"loop"`` — write θ + Δθ_k into the module's own parameters, score, go on to the next
candidate (the caller restores θ once after the last one). With ``vmap_task_loss="auto"`` a failing mode falls
back to the next one with a warning. In every mode candidate k is evaluated at the parameters θ + Δθ_k computed
by one elementwise addition, so the modes differ only in the forward kernels (batched or not).

In every mode ``forward_fn`` receives the module itself: in the loop it holds θ + Δθ_k in its own tensors; in the
vmap modes the candidate's (batched) parameters are swapped into it for the whole call of ``forward_fn`` and, in
``"vmap"``, ``task_loss_fn`` (:func:`~taskloss.search.functional.call_with_parameters`), so a method
(``model.generate``), a submodule or a task loss that drives the model sees the candidate there too. What would
still score θ instead of θ + Δθ_k is refused: a read of an original parameter tensor captured before the step
(watched on the first vmap call) and a forward or task loss that does not depend on the candidate at all. A
function vmap cannot trace — Hugging Face's ``generate`` stops on a data-dependent condition — fails in the vmap
modes; ``vmap_task_loss="auto"`` then falls back to the loop.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import vmap
from torch.utils._pytree import tree_leaves, tree_map

from taskloss.parameter_vectors import flatten
from taskloss.search.functional import ParameterReads, call_with_parameters, depends_on_vmap
from taskloss.search.mgs_noise import CandidateDraws
from taskloss.validation import eval_mode as _eval_mode

__all__ = ["default_forward", "CandidateScorer", "stack_losses", "MODES", "ModelOutputError", "is_model_output",
           "model_output_message"]

#: the scoring modes, in the order of the ``"auto"`` fallback
MODES = ("vmap", "vmap_forward", "loop")


def default_forward(model: Callable, batch):
    """``(inputs, targets, ...)`` → ``model(inputs)``; a tensor batch → ``model(batch)``.

    Pass ``forward_fn`` to :class:`~taskloss.search.mgs.MGS` for anything else (e.g. decoding a continuation from a
    prefix).

    Args:
        model: the model (or a candidate's functional proxy).
        batch: a tuple ``(inputs, ...)`` or a tensor.

    Returns:
        The model's outputs.

    Raises:
        TypeError: any other batch.
    """
    if not callable(model):
        raise TypeError(f"model must be callable (a module or a function of the inputs), got {type(model).__name__}")
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


def stack_losses(values: list, what: str) -> Tensor:
    """The task losses of several candidates as one float64 tensor ``[n]``.

    For tensors of one dtype and device: one shape check per value and one stack and conversion in all (the
    numbers of a per-value conversion, which handles anything else).

    Args:
        values: what ``task_loss_fn`` returned per candidate.
        what: the scoring mode, for the message.

    Returns:
        float64 ``[n]``.

    Raises:
        ValueError: a value that is not a scalar.
    """
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


#: what to do when a candidate's parameters do not reach the computation (the end of the messages below)
_REACH = ("reach the parameters through the model forward_fn is given (model_k.lm_head.weight, model_k.generate, "
          "...), or pass parallel=False (the loop writes θ + Δθ_k into the module itself)")


class ModelOutputError(TypeError):
    """``task_loss_fn`` failed on a Hugging Face ``ModelOutput`` that ``forward_fn`` passed on (issue 41)."""


def is_model_output(value) -> bool:
    """Whether ``value`` is a ``transformers`` ``ModelOutput`` (read from its classes: no import of transformers).

    Args:
        value: what ``forward_fn`` returned.

    Returns:
        True for a ``ModelOutput`` (``CausalLMOutputWithCrossAttentions``, ``SequenceClassifierOutput``, ...).
    """
    return any(c.__name__ == "ModelOutput" for c in type(value).__mro__)


def model_output_message(value) -> str:
    """The refusal of a ``ModelOutput`` where the task loss needed a tensor, with the one-line fix.

    Args:
        value: the ``ModelOutput`` ``forward_fn`` returned.

    Returns:
        The message.
    """
    return (f"task_loss_fn failed on a {type(value).__name__}, a transformers ModelOutput (fields "
            f"{list(value.keys())}): MGS hands task_loss_fn what forward_fn returns, and the default forward_fn "
            "returns model(batch[0]) as it is. Pass a forward_fn that returns the tensor the task loss needs, e.g. "
            "MGS(model, optimizer, task_loss_fn, forward_fn=lambda model, batch: model(batch[0]).logits)")


class CandidateScorer:
    """Scores MGS candidates: the task loss of θ + Δθ_k in one of the three modes of the module docstring.

    Built by :class:`taskloss.search.mgs.MGS` with everything it needs passed in; it owns the scoring mode (and
    its ``"auto"`` fallback) and nothing else.

    Args:
        model: the module; its ``params`` are written in loop mode (θ restored by the caller or :meth:`loaded`).
        names: the names of the searched parameters (``model.named_parameters`` order).
        params: the searched parameters themselves.
        forward_fn: ``(model_k, batch) → outputs``.
        task_loss_fn: ``(outputs, batch) → scalar``.
        mode: ``"vmap"``, ``"vmap_forward"`` or ``"loop"``.
        auto: fall back to the next mode (with a warning) when a vmap mode fails before it first succeeded.
        eval_mode: score with ``model.eval()``.
    """

    def __init__(self, model: nn.Module, names: list[str], params: list[Tensor], forward_fn: Callable,
                 task_loss_fn: Callable, mode: str, auto: bool, eval_mode: bool):
        self.model, self.names, self.params = model, list(names), list(params)
        self.forward_fn, self.task_loss_fn = forward_fn, task_loss_fn
        self.mode, self.auto, self.eval_mode, self.confirmed = mode, auto, eval_mode, False
        self.guarded = False        # the vmap modes' first call watches for reads of the original parameters
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]

    def unflat(self, flat: Tensor) -> dict[str, Tensor]:
        """``[..., P]`` → {name: ``[..., *shape]``} views."""
        lead = flat.shape[:-1]
        return {n: v.reshape(*lead, *sh) for n, v, sh in zip(self.names, flat.split(self.numels, -1), self.shapes)}

    def load(self, theta: Tensor, delta: Tensor | None = None) -> None:
        """Write θ (+ Δθ) into the module's parameters, one elementwise pass per tensor (no temporaries)."""
        with torch.no_grad():
            if delta is None:
                for p, v in zip(self.params, self.unflat(theta).values()):
                    p.copy_(v)
            else:
                for p, t, d in zip(self.params, self.unflat(theta).values(), self.unflat(delta).values()):
                    torch.add(t, d, out=p)

    @contextlib.contextmanager
    def loaded(self, flat: Tensor, theta: Tensor):
        """The module itself with ``flat`` written into its parameters; ``theta`` restored on exit (even on error)."""
        self.load(flat)
        try:
            yield self.model
        finally:
            self.load(theta)

    def loss_at(self, flat: Tensor, batch) -> float:
        """The task loss at the parameters ``flat`` (e.g. l(θ) of an earlier step), on the module as in loop mode.

        Args:
            flat: the flat parameters ``[P]`` to score.
            batch: the batch.

        Returns:
            The task loss; the module's current parameters are restored after.
        """
        with _eval_mode(self.model, self.eval_mode), torch.no_grad():
            now = flatten([p.detach() for p in self.params])
            with self.loaded(flat, now) as model:
                return float(self.score_one(model, batch))

    def task_of(self, outputs, batch):
        """``task_loss_fn(outputs, batch)``; a failure on a ``ModelOutput`` raises :class:`ModelOutputError`."""
        try:
            return self.task_loss_fn(outputs, batch)
        except (AttributeError, TypeError) as e:
            if is_model_output(outputs):
                raise ModelOutputError(model_output_message(outputs)) from e
            raise

    def task_value(self, model_k, batch):
        """``task_loss_fn(forward_fn(model_k, batch), batch)`` as returned (checked by :func:`stack_losses`)."""
        return self.task_of(self.forward_fn(model_k, batch), batch)

    def score_one(self, model_k, batch) -> Tensor:
        """The task loss of ``model_k`` on ``batch`` as a float64 scalar."""
        return _scalar_loss(self.task_value(model_k, batch), "loop")

    def _at(self, params: dict[str, Tensor], batch, with_loss: bool):
        """One candidate inside ``vmap``: ``forward_fn`` (and ``task_loss_fn`` with ``with_loss``) with the candidate's
        parameters swapped into the module for the whole call (:func:`~taskloss.search.functional.call_with_parameters`),
        so its methods and submodules see them too. The first call also refuses reads of the module's original
        parameters (a tensor captured before the step); every call refuses a value that does not depend on the
        candidate (which vmap would silently hand to every candidate)."""
        guard = None if self.guarded else ParameterReads(dict(zip(self.names, self.params)), _REACH)

        def run(model):
            with guard if guard is not None else contextlib.nullcontext():
                out = self.forward_fn(model, batch)
                return self.task_of(out, batch) if with_loss else out

        value = call_with_parameters(self.model, params, run)
        if any(isinstance(v, Tensor) for v in tree_leaves(value)) and not depends_on_vmap(value):
            what = "task loss" if with_loss else "output of forward_fn"
            raise ValueError(f"the {what} is the same for every candidate: it does not depend on the parameters of "
                             f"the module forward_fn is given (computed from a copy of the model, or without it); "
                             f"{_REACH}")
        return value

    def score(self, deltas: Tensor, theta: Tensor, batch) -> Tensor:
        """Task losses (float64 ``[c]``) of the candidates θ + Δθ_j for the rows of ``deltas [c, P]``.

        In loop mode the module is left holding the last candidate's parameters: the caller restores θ.
        """
        c = deltas.shape[0]
        if self.mode != "loop":
            stacked = self.unflat(theta.unsqueeze(0) + deltas)
            try:
                if self.mode == "vmap":
                    out = vmap(lambda p: self._at(p, batch, True), randomness="different")(stacked)
                    if not isinstance(out, Tensor) or out.shape != (c,):
                        raise ValueError(f"task_loss_fn must return a scalar tensor per candidate, got "
                                         f"{tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
                    res = out.detach().to(torch.float64)
                else:
                    outs = vmap(lambda p: self._at(p, batch, False), randomness="different")(stacked)
                    res = stack_losses([self.task_of(tree_map(lambda o, j=j: o[j], outs), batch)
                                        for j in range(c)], "vmap_forward")
                self.confirmed = self.guarded = True
                return res
            except Exception as e:  # noqa: BLE001 — a genuine error re-raises in the fallback below
                if isinstance(e, ModelOutputError):
                    raise
                if not self.auto or self.confirmed:
                    if hasattr(e, "add_note"):      # Python ≥ 3.11
                        e.add_note(f"MGS scored the candidates in mode {self.mode!r} (one torch.func.vmap over "
                                   "stacked parameters): forward_fn and task_loss_fn must be traceable by vmap there "
                                   "(no data-dependent Python control flow, no .item()); pass parallel=False to score "
                                   "them one after another on the module, or vmap_task_loss='auto' to fall back")
                    raise
                new = "vmap_forward" if self.mode == "vmap" else "loop"
                warnings.warn(f"MGS: candidate evaluation mode '{self.mode}' failed ({type(e).__name__}: "
                              f"{str(e)[:160]}); falling back to '{new}'", RuntimeWarning, stacklevel=3)
                self.mode = new
                return self.score(deltas, theta, batch)
        out = []
        for d in deltas:
            self.load(theta, d)
            out.append(self.task_value(self.model, batch))
        return stack_losses(out, "loop")

    def score_candidates(self, draws: CandidateDraws, theta: Tensor, batch, own: list[int], *, low_memory: bool,
                         eager_base_loss: bool, chunk_size: int | None):
        """The task losses of one step's candidates (phase 3 of :meth:`taskloss.search.mgs.MGS.step`).

        Every rank draws every candidate (the weights need all statistics) and scores its own. In loop mode the
        module's parameters are restored to θ afterwards, also on error.

        Args:
            draws: the step's candidates.
            theta: the flat parameters θ (the plan's kept copy).
            batch: the batch.
            own: the candidates this rank scores.
            low_memory: regenerate Δθ_k from its seed instead of storing the ``[n, P]`` rows.
            eager_base_loss: also score θ itself.
            chunk_size: candidates per vmap call (``None``: all).

        Returns:
            ``(losses, rows, base)``: float64 ``[len(own)]``, the rows Δθ_k (``None`` with ``low_memory``) and
            l(θ) (``None`` unless ``eager_base_loss``).

        Raises:
            ValueError: l(θ) is not finite (with ``eager_base_loss``), or a bad task loss.
        """
        plan, scorer = draws.plan, self
        rows = None if low_memory else draws.draw_all(
            plan.buffer("rows", (len(draws.seeds), theta.numel()), theta.dtype))
        scratch = plan.buffer("scratch", theta.shape, theta.dtype) if low_memory else None
        base = None
        try:
            with _eval_mode(self.model, self.eval_mode), torch.no_grad():
                if eager_base_loss:
                    base = scorer.score_one(self.model, batch)
                if low_memory:      # statistics of the candidates other ranks score
                    for k in range(len(draws.seeds)):
                        if k not in own:
                            draws.draw(k, scratch)
                if scorer.mode == "loop":
                    losses = self._score_loop(draws, theta, batch, own, rows, scratch)
                else:
                    chunk = chunk_size or max(len(own), 1)
                    parts = []
                    for i in range(0, len(own), chunk):
                        ks = own[i:i + chunk]
                        if rows is None:
                            D = theta.new_empty(len(ks), theta.numel())
                            for j, k in enumerate(ks):
                                draws.draw(k, D[j])
                        else:
                            D = rows[torch.tensor(ks, device=rows.device)] if len(own) < len(draws.seeds) \
                                else rows[ks[0]:ks[-1] + 1]
                        parts.append(scorer.score(D, theta, batch))
                    losses = torch.cat(parts) if parts else theta.new_zeros(0, dtype=torch.float64)
        finally:
            if scorer.mode == "loop":      # the module holds the last candidate scored in loop mode
                with torch.no_grad():
                    torch._foreach_copy_(self.params, plan.views("theta", theta, self.shapes))
        if base is not None and not math.isfinite(float(base)):
            raise ValueError(f"task loss at the current parameters is not finite: l(θ) = {float(base)}")
        return losses, rows, base

    def _score_loop(self, draws: CandidateDraws, theta: Tensor, batch, own: list[int], rows, scratch) -> Tensor:
        """Loop mode: θ + Δθ_k written into the module by one add per tensor, through views of the kept θ and rows
        built once; for small P (the batched-draw regime) every θ + Δθ_k at once into a kept ``[n, P]`` buffer, then
        one foreach copy per candidate — the same numbers, a few calls instead of one per tensor and candidate."""
        plan = draws.plan
        thetas = plan.views("theta", theta, self.shapes)

        def views(flat):
            return [[v.view(sh) for v, sh in zip(r.split(self.numels), self.shapes)] for r in flat.unbind(0)]

        if rows is not None and theta.numel() < CandidateDraws.ROW_BLOCK:
            cands = torch.add(rows, theta, out=plan.buffer("candidates", rows.shape, rows.dtype))
            cand_views = plan.cached("candidate views", (cands,), lambda: views(cands))
        else:
            cand_views = None
            row_views = plan.cached("row views", (rows, scratch), lambda: views(
                rows if rows is not None else scratch[None]))
        values = []
        for k in own:
            if cand_views is not None:
                torch._foreach_copy_(self.params, cand_views[k])
            else:
                if rows is None:
                    draws.draw(k, scratch)
                for p, x, d in zip(self.params, thetas, row_views[k if rows is not None else 0]):
                    torch.add(x, d, out=p)
            values.append(self.task_value(self.model, batch))
        return stack_losses(values, "loop")
