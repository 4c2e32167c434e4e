"""MLE-guided parameter search (MGS): minimize a task loss by importance-sampling the parameter update.

Derived in notebook 02_importance_sampling_and_mgs; applied to classification metrics in
03_metric_optimization_classification and to sequence decoding in 04. Source: *MLE-guided parameter search for
task loss minimization in neural sequence modeling* (Welleck & Cho, AAAI 2021).

The update is the mean of p(Δθ) ∝ exp(−[l(θ+Δθ) − l(θ)]/α), estimated by self-normalized importance sampling
with the proposal q = λ·N(0, σ²I) + (1−λ)·N(−∇l̃, σ²I) built from the surrogate (MLE) gradient ∇l̃::

    Δθ_k ~ q,   log w_k = −[l(θ+Δθ_k) − l(θ)]/α − log q(Δθ_k),   Δθ* = Σ_k softmax(log w)_k Δθ_k.

σ is per tensor t: ``sigma_mode="absolute"`` uses σ_t = σ, ``"relative"`` σ_t = σ·mean|g_t| (the reference's
"uniform" noise scale). Which log q enters the weights is ``density``:

- ``"flat"`` (default): log q ≡ 0, so w = softmax(−l(θ+Δθ_k)/α). This is self-normalized importance sampling,
  exact in its own terms, for the target p̃(Δθ) ∝ q(Δθ)·e^{−[l(θ+Δθ) − l(θ)]/α} — the proposal tilted by the task
  loss, the minimizer of E_p[l(θ+Δθ)] + α·KL(p‖q) (the Gibbs variational principle, Donsker & Varadhan 1975).
  The weights follow the task loss whatever P and σ are.
- ``"mixture"``: the true density of the draws, with its σ_t. Across candidates drawn from one component,
  −log q = ½‖z_k‖² + const with z_k ~ N(0, I_P), so it spreads by √(P/2) nats (standard deviation), and the
  exact step −g (``include_mle``) sits ≈ P/2 nats apart. Against a task term (l_j − l_k)/α that a bounded
  task loss keeps below (max l − min l)/α, the weights collapse to one candidate (ESS ≈ 1) once P reaches the
  tens (notebook 02_importance_sampling_and_mgs §6 derives and measures it). It is the right choice only where
  the target e^{−Δl/α} is itself a proper density (a loss that grows without bound, as a quadratic) and P is
  small enough that √(P/2) stays below the task term's spread — the toy problems of notebooks 01 and 02.
- ``"unit_sigma"``: the reference code's formula, which evaluates the two Gaussians as if σ were 1 and drops
  their normalizing constants: log q = log(λ e^{−½‖Δθ‖²} + (1−λ) e^{−½‖Δθ+g‖²}). Under ``sigma_mode="relative"``
  its spread across candidates, √(Σ_t σ_t⁴·n_t/2), is tiny, so it acts like ``"flat"``; with an absolute σ it is
  σ²√(P/2) and collapses the weights too.

``MGS.last_stats.ess`` (:class:`~taskloss.search.mgs_stats.MGSStats`) is the effective sample size 1/Σ w_k² of the
last step; the first step whose ESS falls below ``ess_warning`` (1.5 by default: with two candidates, one holds
more than 79 % of the weight) emits one ``UserWarning`` that says whether the density term or the task term made
it collapse and what to change.

Where each piece lives: the density, the weights and the candidate seeds in :mod:`taskloss.search.mgs_density`
(the weights on :func:`taskloss.sampling.update.normalized_log_weights`); the candidates and the statistics of their
noise in :mod:`taskloss.search.mgs_noise`; their scoring in :mod:`taskloss.search.mgs_scoring`; the step here,
:class:`MGS` (any ``nn.Module``, any task loss, any torch optimizer; candidates scored one after another on the
module on a CPU, in one ``torch.func.vmap`` over stacked parameters on a GPU, and split across ranks under
``torch.distributed``). The same step written plainly, in some thirty lines on
:func:`taskloss.sampling.update.self_normalized_is`, is :func:`taskloss.search.mgs_reference.mgs_step_reference`;
the tests hold the two equal (to float rounding).

Cost of a step: one surrogate forward + backward (the closure) and one optimizer step (an MLE step), K candidate
forwards, K draws of P normal numbers (P = number of searched parameters; each candidate's from its own seed),
θ + Δθ_k written into the module per candidate, the update Σ_k w_k Δθ_k (one matrix-vector product) and a few
passes over θ. The buffers and the per-tensor views into them are kept between steps
(:class:`taskloss.search.mgs_noise.DrawPlan`), and the K numbers of log q and the weights are combined on Python
floats: for a small model a step is a few hundred tiny calls, so the step makes as few as it can. The task loss at
the current parameters, l(θ), cancels in the normalized weights, so the step does not compute it:
:attr:`MGSStats.base_loss` evaluates it on first access (``eager_base_loss=True`` computes it inside the step and
refuses a non-finite value, as a check). ``benchmarks/bench_mgs.py`` measures the step against its floor (the MLE
step, the K forwards and the K·P normal draws); the figures and the tuning history are in
``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from taskloss.curvature.distributed import agree_status
from taskloss.search.mgs_density import (
    DENSITIES,
    candidate_seeds,
    checked_shift_floats,
    log_weights_floats,
    mle_components,
)
from taskloss.search.mgs_noise import CandidateDraws, DrawPlan, build_proposal
from taskloss.search.mgs_scoring import MODES, CandidateScorer, default_forward
from taskloss.search.mgs_stats import ESS_WARNING, MGSStats, collapse_message
from taskloss.validation import check_bool, check_choice, check_int, check_not_meta, check_positive, check_probability

__all__ = ["MGS", "SIGMA_MODES", "ASSIGNMENTS", "GRAD_NORM_EPS"]

SIGMA_MODES = ("absolute", "relative")
ASSIGNMENTS = ("random", "stratified")
#: the numerical floor added to a norm before dividing by it when clipping (as ``clip_grad_norm_`` does)
GRAD_NORM_EPS = 1e-6


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning raised in :meth:`MGS.step` at the line that called the step (past
    torch's ``no_grad`` and optimizer-hook wrappers)."""
    torch_dir = os.path.dirname(torch.__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(torch_dir) or
                                 frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


# ------------------------------------------------------------------------------------------------ the step
class MGS(torch.optim.Optimizer):
    """MLE-guided parameter search as a ``torch.optim`` optimizer: ``loss = MGS(...).step(closure)``.

    ``closure()`` computes the surrogate loss l̃ (a differentiable scalar, e.g. cross-entropy) on a batch, calls
    ``backward()`` and returns ``(loss, batch)``. Returning the batch is the package's one way of passing the data
    a method needs besides the gradient (:class:`taskloss.curvature.hessian_free.HessianFree` gets its GGN batch
    the same way): MGS scores its candidates by the task loss on that same batch. Each step: (1) MGS clears the
    searched gradients and calls the closure; g = ∇l̃(θ) is read from ``.grad`` and clipped to ``max_grad_norm``;
    (2) ``n_samples`` candidates Δθ_k ~ q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I) (plus Δθ = −g exactly with
    ``include_mle``), their noise drawn from per-candidate seeds; (3) task losses l(θ+Δθ_k) =
    ``task_loss_fn(forward_fn(model_k, batch), batch)`` where ``model_k`` runs the model with parameters θ+Δθ_k —
    one candidate after another on the module itself (``parallel=False``) or all candidates of a chunk in one
    ``vmap`` over stacked parameter dicts (``parallel=True``); (4) self-normalized weights and Δθ* = Σ_k w_k Δθ_k;
    (5) Δθ* clipped to ``max_update_norm``, ``p.grad = −lr·Δθ*`` and ``optimizer.step()`` (the reference uses
    AdamW; SGD with lr=1 applies θ ← θ + lr·Δθ* exactly). ``step`` returns the closure's loss; the step's
    diagnostics are ``last_stats`` (:class:`MGSStats`). Derived in notebook 02_importance_sampling_and_mgs;
    applied to classification metrics in 03_metric_optimization_classification and to sequence task losses in
    04_sequence_task_losses.

    ``param_groups`` holds one group, the searched parameters with the hyperparameters ``lr`` (the factor on Δθ*, 1
    by default, which a learning-rate scheduler may change), ``n_samples``, ``alpha``, ``sigma``, ``mix``,
    ``max_grad_norm`` and ``max_update_norm`` (read and checked at every step). ``add_param_group`` raises: the
    searched parameters are the model's trainable ones, fixed when MGS is built (the candidates are draws over
    one flat vector of them).

    Args:
        model: any ``nn.Module``; its parameters with ``requires_grad`` are searched, each shared parameter once
            (pass the plain module, not a DDP wrapper).
        optimizer: a ``torch.optim.Optimizer`` holding exactly the model's trainable parameters (it may also hold
            frozen ones, which it leaves alone); its ``step`` applies −lr·Δθ*.
        task_loss_fn: ``(outputs, batch) → scalar`` l (lower is better; a 0-dim tensor, or a float in loop mode).
        n_samples: candidates per step (≥ 1).
        alpha: the temperature α > 0 (reference: 1/β = 0.01).
        sigma: the noise scale σ > 0, per tensor as ``sigma_mode`` says.
        sigma_mode: ``"relative"`` (σ_t = σ·mean|g_t|, the reference's default) or ``"absolute"``.
        mix: λ ∈ [0, 1], the weight of the zero-centred component.
        include_mle: add the exact step −g as candidate 0.
        density: ``"flat"`` (default: the weights are a softmax of the task term; checked to keep ESS > 1 on a
            tiny GPT-2 scored by edit distance through ``generate`` — notebook 17 — and on the harness MLP of
            :mod:`taskloss.harness`), ``"mixture"`` (the exact proposal density: only for small P) or
            ``"unit_sigma"`` (the reference code's formula); the module docstring says when each is right.
        assignment: ``"random"`` (each candidate's component drawn with P(zero) = λ) or ``"stratified"`` (a fixed
            pattern with ⌈j(1−λ)⌉ MLE-centred among the first j candidates — for λ = ½ the reference's alternation
            MLE, zero, MLE, …; the mixture density is still the right weight: it is the balance heuristic of
            deterministic-mixture importance sampling).
        max_grad_norm: clip ‖g‖ to it (``None``: no clipping).
        max_update_norm: clip ‖Δθ*‖ to it (``None``: no clipping).
        lr: the factor on Δθ* (see above).
        forward_fn: ``(model_k, batch) → outputs`` (default :func:`~taskloss.search.mgs_scoring.default_forward`:
            ``model_k(batch[0])``). ``model_k`` is the module itself in every mode: in loop mode with θ+Δθ_k written
            into its parameters (θ restored after the last candidate, also on error) — so anything that works on
            the model (e.g. ``taskloss.lm.generate`` with early stopping) works there, and ``forward_fn`` may even
            return ``model_k`` itself for a ``task_loss_fn`` that drives the model; in the vmap modes with the
            candidate's parameters swapped in for the whole call (its methods and submodules see them;
            :func:`~taskloss.search.functional.call_with_parameters`). A parameter tensor captured before the step,
            or outputs that do not depend on the candidate, are refused there (they would score θ for every
            candidate); a function vmap cannot trace (Hugging Face's ``generate``) needs the loop.
        parallel: ``"auto"`` (the vmap modes for parameters on a GPU, the loop on a CPU, where it was never
            clearly slower and takes a fraction of the vmap's memory: ``benchmarks/RESULTS.md``), ``True`` (vmap) or
            ``False`` (loop).
        vmap_task_loss: vmap modes only: ``True`` (forward and task loss in one vmap), ``False`` (vmap the forward,
            score each candidate's outputs in a Python loop — for decoding + edit distance and other
            non-vmappable metrics), ``"auto"`` (try vmap, fall back to the forward-only vmap, then to the loop,
            with a warning).
        chunk_size: candidates per vmap call (``None``: all at once).
        low_memory: regenerate the noise from its seeds for the weighted sum instead of storing K parameter-sized
            rows (stored rows stay allocated between steps, as do a few P-sized buffers).
        eval_mode: score candidates with ``model.eval()``.
        eager_base_loss: compute l(θ) inside the step (one more forward) and raise if it is not finite;
            otherwise :attr:`MGSStats.base_loss` computes it when read.
        keep_deltas: keep every Δθ_k in ``last_stats.deltas``.
        ess_warning: emit a ``UserWarning`` when a step's effective sample size falls below it (steps with at least
            two candidates; ``None``: never), once per MGS; ``collapsed_steps`` counts every such step. Default
            :data:`~taskloss.search.mgs_stats.ESS_WARNING`.
        seed: base seed of the candidate noise (``None``: drawn from torch's global RNG). Under an initialized
            ``torch.distributed`` process group (or ``process_group``) rank 0's seed is broadcast once, rank r
            scores candidates r, r+W, …, the losses are all-gathered and every rank computes the same weights and
            update from the same seeds. Every rank must pass the same batch and hold the same parameters (checked
            through the surrogate loss l̃(θ), which every rank computes).
        process_group: the process group (default: the global one when initialized).

    ``state_dict()`` holds the group, the inner optimizer's state, the base seed, the step counter and the scoring
    mode: a run restored into a fresh MGS resumes bit-identically (the noise of step s comes from (seed, s, k)).

    Raises:
        TypeError: bad argument types (a flag that is not a bool, a non-callable loss).
        ValueError: bad values; an optimizer that does not hold the model's trainable parameters; at ``step``, a
            candidate's task loss that is NaN or every candidate's infinite.
        RuntimeError: ranks that disagree.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, task_loss_fn: Callable, *,
                 n_samples: int = 4, alpha: float = 0.01, sigma: float = 1.0, sigma_mode: str = "relative",
                 mix: float = 0.5, include_mle: bool = False, density: str = "flat",
                 assignment: str = "random", max_grad_norm: float | None = 1.0,
                 max_update_norm: float | None = 1.0, lr: float = 1.0, forward_fn: Callable | None = None,
                 parallel: bool | str = "auto", vmap_task_loss: bool | str = "auto", chunk_size: int | None = None,
                 low_memory: bool = False, eval_mode: bool = True, eager_base_loss: bool = False,
                 keep_deltas: bool = False, seed: int | None = None, process_group=None,
                 ess_warning: float | None = ESS_WARNING):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        check_not_meta("model", model)
        if not callable(task_loss_fn):
            raise TypeError("task_loss_fn must be callable")
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError("forward_fn must be callable or None")
        self.sigma_mode = check_choice("sigma_mode", sigma_mode, SIGMA_MODES)
        self.density = check_choice("density", density, DENSITIES)
        self.assignment = check_choice("assignment", assignment, ASSIGNMENTS)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
        for name, value in (("vmap_task_loss", vmap_task_loss), ("parallel", parallel)):
            if not (isinstance(value, bool) or (isinstance(value, str) and value == "auto")):
                raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")
        if seed is not None:
            check_int("seed", seed, minimum=0)
        self.include_mle, self.low_memory = check_bool("include_mle", include_mle), check_bool("low_memory", low_memory)
        self.eval_mode = check_bool("eval_mode", eval_mode)
        self.eager_base_loss = check_bool("eager_base_loss", eager_base_loss)
        self.keep_deltas = check_bool("keep_deltas", keep_deltas)
        self.ess_warning = None if ess_warning is None else check_positive("ess_warning", ess_warning)
        self.model, self.optimizer, self.process_group = model, optimizer, process_group
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("model has no parameter with requires_grad=True")
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self._check_optimizer(optimizer)
        kinds = {(p.device, p.dtype) for p in self.params}
        if len(kinds) != 1 or not self.params[0].is_floating_point():
            raise ValueError(f"MGS searches one flat parameter vector: all trainable parameters must share one "
                             f"floating dtype and device, got {sorted(map(str, kinds))}")
        defaults = dict(lr=lr, n_samples=n_samples, alpha=alpha, sigma=sigma, mix=mix, max_grad_norm=max_grad_norm,
                        max_update_norm=max_update_norm)
        super().__init__(self.params, defaults)
        self._hyper(self.param_groups[0])
        self.parallel = self.params[0].device.type == "cuda" if parallel == "auto" else bool(parallel)
        mode = "loop" if not self.parallel else ("vmap_forward" if vmap_task_loss is False else "vmap")
        self.scorer = CandidateScorer(model, self.names, self.params, forward_fn or default_forward, task_loss_fn,
                                      mode, self.parallel and vmap_task_loss == "auto", self.eval_mode)
        self._shapes, self._numels = self.scorer.shapes, self.scorer.numels
        self._plan: DrawPlan | None = None
        self._seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if seed is None else int(seed)
        self._seed_synced = False
        self.steps_done = 0
        self.collapsed_steps = 0     # steps whose ESS fell below ess_warning (the first one warned)
        self.last_stats: MGSStats | None = None

    def _check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in zip(self.names, self.params) if id(p) not in held]
        if missing:
            raise ValueError(f"optimizer does not hold the model's trainable parameters {missing}: MGS writes −Δθ* "
                             "into their .grad and calls optimizer.step(), which would leave them unchanged")
        mine = {id(p) for p in self.params}
        extra = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and id(p) not in mine]
        if extra:
            raise ValueError(f"optimizer holds {len(extra)} trainable tensor(s) that are not trainable parameters of "
                             "the model: MGS searches the model's parameters only")

    @staticmethod
    def _hyper(group: dict) -> dict:
        """The group's hyperparameters, checked (they may have been changed since the last step)."""
        out = dict(lr=check_positive("lr", group["lr"]),
                   n_samples=check_int("n_samples", group["n_samples"], minimum=1),
                   alpha=check_positive("alpha", group["alpha"]), sigma=check_positive("sigma", group["sigma"]),
                   mix=check_probability("mix", group["mix"]))
        for name in ("max_grad_norm", "max_update_norm"):
            out[name] = None if group[name] is None else check_positive(name, group[name])
        return out

    def add_param_group(self, param_group: dict) -> None:
        """Refused after construction: MGS searches the model's trainable parameters, fixed when it is built."""
        if getattr(self, "param_groups", None):
            raise ValueError("MGS searches the model's trainable parameters as one flat vector, fixed when it is "
                             "built: add parameters to the model (and its optimizer) before building MGS")
        super().add_param_group(param_group)

    @property
    def mode(self) -> str:
        """The way candidates are scored, ``"vmap"``, ``"vmap_forward"`` or ``"loop"``."""
        return self.scorer.mode

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim``'s state plus the inner optimizer's, the base seed, the step counter and the mode."""
        out = super().state_dict()
        out["optimizer"] = self.optimizer.state_dict()
        out["mgs"] = {"seed": self._seed, "steps_done": self.steps_done, "mode": self.mode}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        A mode that the ``vmap_task_loss="auto"`` fallback had reached is kept (so the resumed run scores
        candidates the same way); other modes stay as constructed.

        Args:
            state_dict: what :meth:`state_dict` returned.

        Raises:
            ValueError: not an MGS state_dict.
        """
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("mgs"), dict) or \
                "optimizer" not in state_dict or not {"seed", "steps_done"} <= set(state_dict["mgs"]):
            raise ValueError("not an MGS state_dict: expected the entries 'mgs' (seed, steps_done) and 'optimizer'")
        state_dict = dict(state_dict)
        extra, inner = state_dict.pop("mgs"), state_dict.pop("optimizer")
        seed = check_int("seed", extra["seed"], minimum=0)
        steps = check_int("steps_done", extra["steps_done"], minimum=0)
        super().load_state_dict(state_dict)
        self.optimizer.load_state_dict(inner)
        self._seed, self.steps_done = seed, steps
        mode = extra.get("mode")
        if self.scorer.auto and mode in MODES and MODES.index(mode) > MODES.index(self.mode):
            self.scorer.mode, self.scorer.confirmed = mode, True
        self._seed_synced = False

    # -- distributed helpers -------------------------------------------------------------------------------
    def world(self) -> tuple[int, int]:
        """(world size, rank) of the process group in use; (1, 0) without torch.distributed."""
        if self.process_group is not None or (dist.is_available() and dist.is_initialized()):
            return dist.get_world_size(self.process_group), dist.get_rank(self.process_group)
        return 1, 0

    def _base_seed(self, world: int) -> int:
        if not self._seed_synced and world > 1:
            t = torch.tensor([self._seed], dtype=torch.int64, device=self.params[0].device)
            src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
            dist.broadcast(t, src=src, group=self.process_group)
            self._seed = int(t.item())
        self._seed_synced = True
        return self._seed

    def _gather(self, own: list[int], local: Tensor, check: float, n: int, world: int) -> Tensor:
        """Task losses of all n candidates (each rank scored its own: ``local`` float64 ``[len(own)]`` for the
        candidates ``own``), plus a check that every rank computed the same surrogate loss ``check`` (same batch,
        same parameters)."""
        if world == 1:
            return local.cpu()
        vec = torch.zeros(n + 1, dtype=torch.float64, device=self.params[0].device)
        for k, v in zip(own, local.to(vec.device).unbind(0)):
            vec[k] = v
        vec[n] = check
        bufs = [torch.empty_like(vec) for _ in range(world)]
        dist.all_gather(bufs, vec, group=self.process_group)
        G = torch.stack(bufs).cpu()
        if not bool((G[:, n] == G[0, n]).all()):
            raise RuntimeError(f"ranks disagree on the surrogate loss l̃(θ) ({G[:, n].tolist()}): every rank must "
                               "pass the same batch and hold the same parameters")
        return torch.stack([G[k % world, k] for k in range(n)])

    # -- phases of a step ----------------------------------------------------------------------------------
    def _surrogate(self, closure: Callable):
        """Phase 1a: the closure with the searched gradients cleared; returns (its loss, l̃(θ) as a float, batch)."""
        for p in self.params:
            p.grad = None
        with torch.enable_grad():
            out = closure()
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("MGS's closure must return (loss, batch): the surrogate loss it called backward() on "
                             "and the batch the candidates are scored on")
        loss, batch = out
        if not isinstance(loss, (Tensor, float, int)) or isinstance(loss, bool) or torch.as_tensor(loss).numel() != 1:
            raise ValueError(f"MGS's closure must return a scalar surrogate loss, got {type(loss).__name__}")
        value = float(loss.detach() if isinstance(loss, Tensor) else loss)
        if not math.isfinite(value):
            raise ValueError(f"surrogate loss is not finite: {value}")
        return loss, value, batch

    def _gradient(self, max_grad_norm: float | None):
        """Phase 1b: (flat clipped gradient g, its float64 copy, ‖∇l̃‖ before clipping) from ``.grad``."""
        grads = [p.grad for p in self.params]
        if all(gr is None for gr in grads):
            raise ValueError("no searched parameter has a gradient after closure(): the closure must call "
                             "backward() on the surrogate loss")
        plan = self._plan = DrawPlan.reuse(self._plan, self._numels, self.params[0].device)
        P = sum(self._numels)
        g = plan.buffer("g", (P,), self.params[0].dtype)
        if any(gr is None for gr in grads):
            torch.cat([torch.zeros_like(p).reshape(-1) if gr is None else gr.detach().reshape(-1)
                       for p, gr in zip(self.params, grads)], out=g)
        else:       # one call for every tensor
            torch._foreach_copy_(plan.views("g", g, self._shapes), [gr.detach() for gr in grads])
        g64 = plan.buffer("g64", (P,), torch.float64).copy_(g)
        norm = float(torch.linalg.vector_norm(g64))
        if not math.isfinite(norm):
            raise ValueError("surrogate gradient contains NaN or inf")
        if max_grad_norm is not None and norm > max_grad_norm:
            g64.copy_(g.mul_(max_grad_norm / (norm + GRAD_NORM_EPS)))
        return g, g64, norm

    def _weighted_sum(self, w: list[float], draws: CandidateDraws, rows: Tensor | None, theta: Tensor, keep: bool):
        """Phase 4: Δθ* = Σ_k w_k Δθ_k (``w``: the normalized weights): one matrix-vector product over the stored
        rows, or (``low_memory``) the rows regenerated one by one and accumulated in candidate order. Every rank
        runs the same arithmetic, so ranks stay bit-identical; the two memory modes agree to float rounding."""
        unflat = self.scorer.unflat
        if rows is not None:
            update = draws.plan.buffer("update", theta.shape, theta.dtype)
            torch.mm(torch.tensor([w], dtype=rows.dtype, device=rows.device), rows, out=update[None])
            return update, ([unflat(d.clone()) for d in rows] if keep else None)
        update = draws.plan.buffer("update", theta.shape, theta.dtype).zero_()
        kept = [] if keep else None
        scratch = draws.plan.buffer("scratch", theta.shape, theta.dtype)
        for k in range(len(draws.seeds)):
            d = draws.draw(k, scratch)
            update.add_(d, alpha=w[k])
            if kept is not None:
                kept.append(unflat(d.clone()))
        return update, kept

    def _apply(self, update: Tensor, lr: float, max_update_norm: float | None) -> float:
        """Phase 5: ``p.grad = −lr·Δθ*`` (Δθ* clipped to ``max_update_norm`` as ``clip_grad_norm_`` does, the norm
        taken in float64) and ``optimizer.step()``; returns ‖Δθ*‖. The ``p.grad`` are views of the kept update
        buffer, which the next step overwrites."""
        update_norm = float(torch.linalg.vector_norm(update, dtype=torch.float64))
        scale = -1.0
        if max_update_norm is not None:
            scale = -min(1.0, max_update_norm / (update_norm + GRAD_NORM_EPS))
        if lr != 1.0:
            scale *= lr
        update.mul_(scale)
        for p, u in zip(self.params, self._plan.views("update", update, self._shapes)):
            p.grad = u
        self.optimizer.step()
        return update_norm

    def _local_step(self, closure, h: dict, world: int, rank: int, base_seed: int):
        """This rank's part of a step before the ranks exchange their candidates' losses: the surrogate, its
        gradient, the candidates and the task losses of those this rank scores."""
        loss, surrogate, batch = self._surrogate(closure)
        g, g64, grad_norm = self._gradient(h["max_grad_norm"])
        plan = self._plan
        proposal = build_proposal(g, self._numels, h["sigma"], self.sigma_mode, g64, plan)      # phase 2
        seeds = candidate_seeds(base_seed, self.steps_done, h["n_samples"] + int(self.include_mle))
        draws = CandidateDraws(proposal, seeds, mle_components(seeds, h["mix"], self.assignment, self.include_mle),
                               self.include_mle, plan)
        theta = plan.buffer("theta", g.shape, g.dtype)      # θ, kept across steps (the loop restores from it)
        torch._foreach_copy_(plan.views("theta", theta, self._shapes), self.params)
        n = len(seeds)
        own = list(range(rank, n, world))
        local, rows, base = self.scorer.score_candidates(draws, theta, batch, own, low_memory=self.low_memory,
                                                         eager_base_loss=self.eager_base_loss,
                                                         chunk_size=self.chunk_size)
        return loss, surrogate, batch, (g, grad_norm, proposal, seeds, draws, theta, n, own, local, rows, base)

    # -- the step ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable):  # type: ignore[override]
        """One MGS update of the model's parameters (see the class docstring).

        Args:
            closure: computes the surrogate loss on a batch, calls ``backward()``, returns ``(loss, batch)``.

        Returns:
            The closure's loss; ``last_stats`` holds the step's :class:`MGSStats`.

        Raises:
            TypeError: no closure.
            ValueError: a bad closure result, invalid hyperparameters in ``param_groups``, a NaN task loss.
        """
        if not callable(closure):
            raise TypeError("MGS.step needs closure(): it computes the surrogate loss on a batch, calls backward() "
                            "and returns (loss, batch)")
        h = self._hyper(self.param_groups[0])
        world, rank = self.world()
        base_seed = self._base_seed(world)
        try:
            loss, surrogate, batch, rest = self._local_step(closure, h, world, rank, base_seed)
        except (ValueError, TypeError, RuntimeError, ArithmeticError) as e:
            if world > 1:   # the others must not wait in the all-gather: every rank raises the same error
                agree_status(e, "MGS.step", self.process_group)
            raise
        if world > 1:       # every rank is ready (one small all-reduce of the ranks' status)
            agree_status(None, "MGS.step", self.process_group)
        g, grad_norm, proposal, seeds, draws, theta, n, own, local, rows, base = rest
        losses = self._gather(own, local, surrogate, n, world)
        L = losses.tolist()
        if any(x != x for x in L):
            raise ValueError(f"a candidate's task loss is NaN: {L}")
        log_q = draws.log_q(h["mix"], self.density)
        # the checks and formula of mgs_weights(losses, l(θ), log_q, alpha) on Python floats (K numbers: cheaper
        # than a chain of tiny tensor operations); l(θ) cancels, any finite value will do
        lq = log_q.tolist()
        lw = log_weights_floats(L, lq, h["alpha"], checked_shift_floats(L, lq))
        w = [math.exp(v) for v in lw]
        tw = [math.exp(v) for v in (log_weights_floats(L, [0.0] * n, h["alpha"], checked_shift_floats(L, [0.0] * n))
                                    if self.density != "flat" else lw)]
        update, kept = self._weighted_sum(w, draws, rows, theta, self.keep_deltas)
        update_norm = self._apply(update, h["lr"], h["max_update_norm"])
        self.steps_done += 1
        theta0 = None if base is not None else theta.clone()     # the lazy base_loss keeps this step's θ
        self.last_stats = MGSStats(
            step=self.steps_done - 1, task_losses=losses, log_q=log_q,
            log_weights=torch.tensor(lw, dtype=torch.float64),
            weights=torch.tensor(w, dtype=torch.float64), ess=1.0 / math.fsum(x * x for x in w),
            from_mle=torch.tensor(draws.mle, dtype=torch.bool),
            mle_weight=math.fsum(x for x, m in zip(w, draws.mle) if m),
            surrogate_loss=surrogate, grad_norm=grad_norm, update_norm=update_norm, sigmas=proposal.sigma.tolist(),
            seeds=seeds, evaluation=self.mode, deltas=kept,
            base=float(base) if base is not None else lambda: self.scorer.loss_at(theta0, batch),
            task_ess=1.0 / math.fsum(x * x for x in tw))
        if self.ess_warning is not None and n > 1 and self.last_stats.ess < self.ess_warning:
            self.collapsed_steps += 1
            if self.collapsed_steps == 1:        # once per MGS: a training loop would repeat it every step
                warnings.warn(collapse_message(self.last_stats, h["alpha"], self.density, self.ess_warning),
                              UserWarning, stacklevel=_caller_stacklevel())
        return loss
