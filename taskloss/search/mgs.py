"""MLE-guided parameter search (MGS): minimize a task loss by importance-sampling the parameter update.

Derived in notebook 02_importance_sampling_and_mgs; applied to classification metrics in
03_metric_optimization_classification and to sequence decoding in 04. Source: *MLE-guided parameter search for
task loss minimization in neural sequence modeling* (Welleck & Cho, AAAI 2021).

The update is the mean of p(Δθ) ∝ exp(−[l(θ+Δθ) − l(θ)]/α), estimated by self-normalized importance sampling
with the proposal q = λ·N(0, σ²I) + (1−λ)·N(−∇l̃, σ²I) built from the surrogate (MLE) gradient ∇l̃::

    Δθ_k ~ q,   log w_k = −[l(θ+Δθ_k) − l(θ)]/α − log q(Δθ_k),   Δθ* = Σ_k softmax(log w)_k Δθ_k.

σ is per tensor t: ``sigma_mode="absolute"`` uses σ_t = σ, ``"relative"`` σ_t = σ·mean|g_t| (the reference's
"uniform" noise scale). ``density="mixture"`` (default) evaluates the true mixture density with its σ_t;
``density="unit_sigma"`` reproduces the reference code, which evaluates the two Gaussians as if σ were 1 and
drops their normalizing constants: log q = log(λ e^{−½‖Δθ‖²} + (1−λ) e^{−½‖Δθ+g‖²}).

Functional core in :mod:`taskloss.search.mgs_density`: :func:`~taskloss.search.mgs_density.mixture_log_density`,
:func:`~taskloss.search.mgs_density.mgs_weights`, :func:`~taskloss.search.mgs_density.effective_sample_size`.
Candidates and the statistics of their noise: :mod:`taskloss.search.mgs_noise`. Update step here: :class:`MGS`
(any ``nn.Module``, any task loss, any torch optimizer; candidates scored one after another on the module on a
CPU, in one ``torch.func.vmap`` over stacked parameters on a GPU — see :mod:`taskloss.search.mgs_scoring` — and
split across ranks under ``torch.distributed``).

Cost of a step: one surrogate forward + backward and one optimizer step (an MLE step), K candidate forwards,
K draws of P normal numbers (P = number of searched parameters; each candidate's from its own seed, on a CPU
with P ≥ 2¹⁸ the candidates spread over torch's threads), each block of a candidate's noise reduced to its
float64 statistics and shifted while in cache (:meth:`taskloss.search.mgs_noise.CandidateDraws.draw_all`),
θ + Δθ_k written into the module per candidate (one add per tensor; below ``ROW_BLOCK`` parameters every
θ + Δθ_k formed by one add and copied in by one foreach call per candidate), the update Σ_k w_k Δθ_k (one
matrix-vector product) and a few passes over θ (a copy, float64 norms). The K×P candidate rows, θ, the gradient,
its float64 copy and the update live in buffers kept between steps (:class:`taskloss.search.mgs_noise.DrawPlan`;
fresh ones cost page faults at every step), and so do the per-tensor views into them: for a small model the step
is a few hundred tiny calls, each costing kernel-dispatch and Python time, so the step makes as few as it can
(views built once, the losses stacked and converted once, the K × T numbers of log q, the weights and their
checks on Python floats). The floor is the MLE step, the K forwards and the K·P normal draws. The task
loss at the current parameters, l(θ), cancels in the normalized weights, so the step does not compute it:
:attr:`MGSStats.base_loss` evaluates it on first access (``eager_base_loss=True`` computes it inside the step
and refuses a non-finite value, as a check). ``benchmarks/bench_mgs.py`` measures the step against this floor;
for a 4.8K-parameter MLP the step is ≈ 1.5× floor + noise on one thread, where a bare loop of the same
arithmetic (``_bare_mgs`` there: one σ, no density, no checks) is itself ≈ 1.2×; the rest, ≈ 0.35 ms of a 1.6 ms
step, is the per-tensor σ_t and noise statistics, log q, the checks and the norms, spread over some 150 calls of a
few microseconds each. From 85K parameters on one thread the step is within 1.2× floor + noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from taskloss.search.mgs_density import (
    DENSITIES,
    _check_choice,
    _checked_shift_floats,
    _log_weights_floats,
    _seeds_for,
    _uniform_from_seed,
)
from taskloss.search.mgs_noise import CandidateDraws, DrawPlan, build_proposal
from taskloss.search.mgs_scoring import MODES, _CandidateScoring, _stack_losses, default_forward
from taskloss.utils import check_int, check_positive, check_probability
from taskloss.utils import eval_mode as _eval_mode  # (``eval_mode`` is also MGS's argument)

__all__ = ["MGS", "MGSStats", "SIGMA_MODES", "ASSIGNMENTS"]

SIGMA_MODES = ("absolute", "relative")
ASSIGNMENTS = ("random", "stratified")



@dataclass
class MGSStats:
    """Diagnostics of one :meth:`MGS.step`. Tensors are float64 on CPU, indexed by candidate ``[K']``
    (K' = K, +1 with ``include_mle``: candidate 0 is then the exact step −∇l̃)."""

    step: int
    task_losses: Tensor              # l(θ + Δθ_k)
    log_q: Tensor                    # log q(Δθ_k)
    log_weights: Tensor              # normalized log w_k
    weights: Tensor                  # normalized w_k
    ess: float                       # 1 / Σ w_k²
    from_mle: Tensor                 # bool: candidate drawn from (or equal to) the MLE-centred component
    mle_weight: float                # Σ_k w_k over MLE-centred candidates
    surrogate_loss: float            # l̃(θ)
    grad_norm: float                 # ‖∇l̃‖ before clipping
    update_norm: float               # ‖Δθ*‖ before update clipping
    sigmas: list[float]              # σ_t per parameter tensor
    seeds: list[int]                 # per-candidate noise seeds
    evaluation: str                  # how candidates were scored: "vmap", "vmap_forward" or "loop"
    deltas: list[dict[str, Tensor]] | None = None  # Δθ_k per candidate (only with step(..., return_deltas=True))
    base: float | Callable[[], float] | None = field(default=None, repr=False, compare=False)

    @property
    def base_loss(self) -> float:
        """l(θ), the task loss at the parameters the step started from (it cancels in the weights). Computed
        inside the step with ``MGS(eager_base_loss=True)``; otherwise one forward on first access, at that
        step's parameters (kept in this object until then) with the model's buffers as they are now."""
        if callable(self.base):
            self.base = float(self.base())
        return self.base

    @property
    def best_index(self) -> int:
        return int(torch.argmin(self.task_losses))

    def as_dict(self) -> dict[str, Any]:
        """Scalars only (for logging); reading ``base_loss`` may cost one forward (see :attr:`base_loss`)."""
        return {"step": self.step, "base_loss": self.base_loss, "best_task_loss": float(self.task_losses.min()),
                "ess": self.ess, "mle_weight": self.mle_weight, "surrogate_loss": self.surrogate_loss,
                "grad_norm": self.grad_norm, "update_norm": self.update_norm}


# ------------------------------------------------------------------------------------------------ the step
class MGS(_CandidateScoring):
    """MLE-guided parameter search as an optimizer step: ``stats = MGS(...).step(batch)``.

    Each step: (1) g = ∇l̃(θ) from ``surrogate_loss_fn(model, batch)`` (a differentiable scalar, e.g.
    cross-entropy), clipped to ``max_grad_norm``; (2) K candidates Δθ_k ~ q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I)
    (plus Δθ = −g exactly with ``include_mle``), their noise drawn from per-candidate seeds; (3) task losses
    l(θ+Δθ_k) = ``task_loss_fn(forward_fn(model_k, batch), batch)`` where ``model_k`` runs the model with
    parameters θ+Δθ_k — one candidate after another on the module itself (``parallel=False``) or all candidates
    of a chunk in one ``vmap`` over stacked parameter dicts (``parallel=True``); (4) self-normalized weights
    (:func:`mgs_weights`) and Δθ* = Σ_k w_k Δθ_k; (5) ``p.grad = −Δθ*`` (clipped to ``max_update_norm``) and
    ``optimizer.step()`` (the reference uses AdamW; SGD with lr=1 applies θ ← θ + Δθ* exactly). Not
    ``torch.optim``'s ``step(closure)``: MGS needs the batch for its two objectives, so ``step(batch)``.

    Arguments:

    - model: any ``nn.Module``; its parameters with ``requires_grad`` are searched (pass the plain module, not
      a DDP wrapper). optimizer: any ``torch.optim.Optimizer`` over those parameters.
    - surrogate_loss_fn(model, batch) → scalar tensor l̃ (differentiable).
    - task_loss_fn(outputs, batch) → scalar l (lower is better; a 0-dim tensor, or a float in loop mode).
    - forward_fn(model_k, batch) → outputs (default :func:`default_forward`: ``model_k(batch[0])``). ``model_k``
      runs the model with the candidate's parameters: in loop mode the module itself with θ+Δθ_k written
      into its parameters (θ restored after the last candidate, also on error) — so anything that works on
      the model (e.g. ``taskloss.lm.generate`` with early stopping) works there, and ``forward_fn`` may even
      return ``model_k`` itself for a ``task_loss_fn`` that drives the model; in the vmap modes a callable
      proxy (``functional_call``, other attributes from the module).
    - K ≥ 1 candidates; alpha > 0 temperature (reference: 1/β = 0.01); sigma > 0 noise scale with
      ``sigma_mode`` "relative" (σ_t = σ·mean|g_t|, reference default) or "absolute"; mix = λ ∈ [0, 1], the
      weight of the zero-centred component; ``assignment``: "random" (each candidate's component drawn with
      P(zero) = λ) or "stratified" (a fixed pattern with ⌈j(1−λ)⌉ MLE-centred among the first j candidates —
      for λ = ½ the reference's alternation MLE, zero, MLE, …; the mixture density is still the right weight: it is the
      balance heuristic of deterministic-mixture importance sampling); ``density`` "mixture" or "unit_sigma".
    - parallel: "auto" (default: the vmap modes for parameters on a GPU, the loop on a CPU — on a CPU, K
      forwards one after another use the cores as well as one batched forward, while the vmap stacks K
      parameter copies and K activation sets: measured on one thread for digits MLPs with K = 8 (P = 4.8K to
      1.1M parameters, batches 128 and 1078), the vmap step took 0.97–1.58× the loop's time, never clearly less,
      and 3–5× its peak memory, so no size rule picks it on a CPU), True (vmap) or False (loop).
    - vmap_task_loss (vmap modes only): True (forward and task loss in one vmap), False (vmap the forward, score
      each candidate's outputs in a Python loop — for decoding + edit distance and other non-vmappable
      metrics), "auto" (try vmap, fall back to the forward-only vmap, then to the loop, with a warning).
      chunk_size: candidates per vmap call (None = all at once). low_memory: regenerate the noise from its
      seeds for the weighted sum instead of storing K parameter-sized rows (stored rows stay allocated between
      steps, as do a few P-sized buffers). eval_mode: score candidates with
      ``model.eval()``. eager_base_loss: compute l(θ) inside the step (one more forward) and raise if it is
      not finite; otherwise :attr:`MGSStats.base_loss` computes it when read.
    - seed: base seed of the candidate noise (None: drawn from torch's global RNG). Under an initialized
      ``torch.distributed`` process group (or ``process_group``) rank 0's seed is broadcast once, rank r scores
      candidates r, r+W, …, the losses are all-gathered and every rank computes the same weights and update
      from the same seeds. Every rank must pass the same batch and hold the same parameters (checked through
      the surrogate loss l̃(θ), which every rank computes).

    Raises ``TypeError``/``ValueError`` on bad arguments; ``ValueError`` when a candidate's task loss is NaN or
    every candidate's is infinite; ``RuntimeError`` when ranks disagree. Derived in notebook
    02_importance_sampling_and_mgs; used in 03 (classification) and 04 (sequences).
    """

    def __init__(self, model: nn.Module, optimizer, surrogate_loss_fn: Callable, task_loss_fn: Callable, *,
                 K: int = 4, alpha: float = 0.01, sigma: float = 1.0, sigma_mode: str = "relative",
                 mix: float = 0.5, include_mle: bool = False, density: str = "mixture",
                 assignment: str = "random", max_grad_norm: float | None = 1.0,
                 max_update_norm: float | None = 1.0, forward_fn: Callable | None = None,
                 parallel: bool | str = "auto", vmap_task_loss: bool | str = "auto", chunk_size: int | None = None,
                 low_memory: bool = False, eval_mode: bool = True, eager_base_loss: bool = False,
                 seed: int | None = None, process_group=None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError("optimizer must be a torch optimizer (an object with .step())")
        for name, fn in (("surrogate_loss_fn", surrogate_loss_fn), ("task_loss_fn", task_loss_fn)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable")
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError("forward_fn must be callable or None")
        self.K = check_int("K", K, minimum=1)
        self.alpha = check_positive("alpha", alpha)
        self.sigma = check_positive("sigma", sigma)
        self.mix = check_probability("mix", mix)
        self.sigma_mode = _check_choice("sigma_mode", sigma_mode, SIGMA_MODES)
        self.density = _check_choice("density", density, DENSITIES)
        self.assignment = _check_choice("assignment", assignment, ASSIGNMENTS)
        self.max_grad_norm = None if max_grad_norm is None else check_positive("max_grad_norm", max_grad_norm)
        self.max_update_norm = None if max_update_norm is None else check_positive("max_update_norm",
                                                                                   max_update_norm)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
        if vmap_task_loss not in (True, False, "auto") or isinstance(vmap_task_loss, (int, float)) and \
                not isinstance(vmap_task_loss, bool):
            raise ValueError(f"vmap_task_loss must be True, False or 'auto', got {vmap_task_loss!r}")
        if parallel not in (True, False, "auto") or isinstance(parallel, (int, float)) and \
                not isinstance(parallel, bool):
            raise ValueError(f"parallel must be True, False or 'auto', got {parallel!r}")
        if seed is not None:
            check_int("seed", seed, minimum=0)
        self.model, self.optimizer = model, optimizer
        self.surrogate_loss_fn, self.task_loss_fn = surrogate_loss_fn, task_loss_fn
        self.forward_fn = forward_fn or default_forward
        self.include_mle, self.low_memory, self.eval_mode = bool(include_mle), bool(low_memory), bool(eval_mode)
        self.eager_base_loss, self.process_group = bool(eager_base_loss), process_group
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("model has no parameter with requires_grad=True")
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        kinds = {(p.device, p.dtype) for p in self.params}
        if len(kinds) != 1 or not self.params[0].is_floating_point():
            raise ValueError(f"MGS searches one flat parameter vector: all trainable parameters must share one "
                             f"floating dtype and device, got {sorted(map(str, kinds))}")
        # "auto": the vmap on a GPU, the loop on a CPU. A size rule for the CPU was measured and not adopted: after
        # the per-call trimming of both paths (digits MLPs, one thread, thread CPU time, K = 8, interleaved in one
        # process), vmap / loop = 0.97-1.04 at P = 4.8K (batch 128, four runs), 1.27 / 0.99 at 19K (batch 128 /
        # 1078), 1.04 / 1.24 at 38K, 1.02-1.58 at 85K (batch 1078, K = 4 and 8, four runs), 1.34 at 1.1M: the vmap
        # never wins by more than the noise, at any P, and costs 3-5x the loop's peak memory.
        self.parallel = self.params[0].device.type == "cuda" if parallel == "auto" else bool(parallel)
        self._auto = self.parallel and vmap_task_loss == "auto"
        self.mode = "loop" if not self.parallel else ("vmap_forward" if vmap_task_loss is False else "vmap")
        self._mode_confirmed = False
        self._shapes = [p.shape for p in self.params]
        self._numels = [p.numel() for p in self.params]
        self._plan: DrawPlan | None = None
        self._seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if seed is None else int(seed)
        self._seed_synced = False
        self.steps_done = 0

    def state_dict(self) -> dict[str, Any]:
        """Base seed, step counter and candidate-evaluation mode: with the model's and optimizer's state, a run
        resumes bit-identically (the noise of step s comes from (seed, s, k) alone)."""
        return {"seed": self._seed, "steps_done": self.steps_done, "mode": self.mode}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`. A mode that the ``vmap_task_loss="auto"`` fallback had reached is
        kept (so the resumed run scores candidates the same way); other modes stay as constructed."""
        if not isinstance(state, dict) or not {"seed", "steps_done"} <= set(state):
            raise ValueError("not an MGS state_dict: expected the keys 'seed' and 'steps_done'")
        self._seed = check_int("seed", state["seed"], minimum=0)
        self.steps_done = check_int("steps_done", state["steps_done"], minimum=0)
        mode = state.get("mode")
        if self._auto and mode in MODES and MODES.index(mode) > MODES.index(self.mode):
            self.mode, self._mode_confirmed = mode, True
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
    def _unflat(self, flat: Tensor) -> dict[str, Tensor]:
        """``[..., P]`` → {name: ``[..., *shape]``} views."""
        lead = flat.shape[:-1]
        return {n: v.reshape(*lead, *sh) for n, v, sh in zip(self.names, flat.split(self._numels, -1),
                                                             self._shapes)}

    def _surrogate_grad(self, batch):
        """Phase 1: (l̃(θ), flat clipped gradient g, ‖∇l̃‖ before clipping)."""
        loss = self.surrogate_loss_fn(self.model, batch)
        if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise ValueError("surrogate_loss_fn must return a scalar tensor that requires grad")
        value = float(loss.detach())
        if not math.isfinite(value):
            raise ValueError(f"surrogate loss is not finite: {value}")
        grads = torch.autograd.grad(loss if loss.dim() == 0 else loss.reshape(()), self.params, allow_unused=True)
        plan = self._plan = DrawPlan.reuse(self._plan, self._numels, self.params[0].device)
        P = sum(self._numels)
        g = plan.buffer("g", (P,), self.params[0].dtype)
        if any(gr is None for gr in grads):
            torch.cat([torch.zeros_like(p).reshape(-1) if gr is None else gr.detach().reshape(-1)
                       for p, gr in zip(self.params, grads)], out=g)
        else:       # one call for every tensor (grads of leaves without create_graph carry no history)
            torch._foreach_copy_(plan.views("g", g, self._shapes), list(grads))
        g64 = plan.buffer("g64", (P,), torch.float64).copy_(g)
        norm = float(torch.linalg.vector_norm(g64))
        if not math.isfinite(norm):
            raise ValueError("surrogate gradient contains NaN or inf")
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            g64.copy_(g.mul_(self.max_grad_norm / (norm + 1e-6)))
        return value, g, g64, norm

    def _is_mle(self, k: int, seed: int) -> bool:
        if self.include_mle and k == 0:
            return True
        j, r = k - int(self.include_mle), 1.0 - self.mix
        if self.assignment == "stratified":
            return math.ceil((j + 1) * r - 1e-9) - math.ceil(j * r - 1e-9) == 1
        return _uniform_from_seed(seed) >= self.mix

    def _score_candidates(self, draws: CandidateDraws, theta: Tensor, batch, own: list[int]):
        """Phase 3: task losses of this rank's candidates ``own`` (float64 ``[len(own)]``), the ``[n, P]`` rows Δθ_k
        for the weighted sum (None with ``low_memory``) and, with ``eager_base_loss``, l(θ). Every rank draws every
        candidate (the weights need all statistics) and scores its own. ``theta`` is the plan's kept copy of θ."""
        plan = draws.plan
        rows = None if self.low_memory else draws.draw_all(
            plan.buffer("rows", (len(draws.seeds), theta.numel()), theta.dtype))
        scratch = plan.buffer("scratch", theta.shape, theta.dtype) if self.low_memory else None
        base = None
        try:
            with _eval_mode(self.model, self.eval_mode), torch.no_grad():
                if self.eager_base_loss:
                    base = self._score_one(self.model, batch)
                if self.low_memory:      # statistics of the candidates other ranks score
                    for k in range(len(draws.seeds)):
                        if k not in own:
                            draws.draw(k, scratch)
                if self.mode == "loop":
                    # θ + Δθ_k written into the module by one add per tensor, through views of the kept θ and
                    # rows built once (no pass over P besides the add itself); for small P (the batched-draw
                    # regime) every θ + Δθ_k at once into a kept [n, P] buffer, then one foreach copy per
                    # candidate — the same numbers, a few calls instead of one per tensor and candidate
                    thetas = plan.views("theta", theta, self._shapes)
                    views = lambda flat: [[v.view(sh) for v, sh in zip(r.split(self._numels), self._shapes)]  # noqa: E731
                                          for r in flat.unbind(0)]
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
                        values.append(self._task_value(self.model, batch))
                    losses = _stack_losses(values, "loop")
                else:
                    chunk = self.chunk_size or max(len(own), 1)
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
                        parts.append(self._score(D, theta, batch))
                    losses = torch.cat(parts) if parts else theta.new_zeros(0, dtype=torch.float64)
        finally:
            if self.mode == "loop":      # the module holds the last candidate scored in loop mode
                with torch.no_grad():
                    torch._foreach_copy_(self.params, plan.views("theta", theta, self._shapes))
        if base is not None and not math.isfinite(float(base)):
            raise ValueError(f"task loss at the current parameters is not finite: l(θ) = {float(base)}")
        return losses, rows, base

    def _weighted_sum(self, w: list[float], draws: CandidateDraws, rows: Tensor | None, theta: Tensor, keep: bool):
        """Phase 4: Δθ* = Σ_k w_k Δθ_k (``w``: the normalized weights): one matrix-vector product over the stored
        rows, or (``low_memory``) the rows regenerated one by one and accumulated in candidate order. Every rank
        runs the same arithmetic, so ranks stay bit-identical; the two memory modes agree to float rounding."""
        if rows is not None:
            update = draws.plan.buffer("update", theta.shape, theta.dtype)
            torch.mm(torch.tensor([w], dtype=rows.dtype, device=rows.device), rows, out=update[None])
            return update, ([self._unflat(d.clone()) for d in rows] if keep else None)
        update = draws.plan.buffer("update", theta.shape, theta.dtype).zero_()
        kept = [] if keep else None
        scratch = draws.plan.buffer("scratch", theta.shape, theta.dtype)
        for k in range(len(draws.seeds)):
            d = draws.draw(k, scratch)
            update.add_(d, alpha=w[k])
            if kept is not None:
                kept.append(self._unflat(d.clone()))
        return update, kept

    def _apply(self, update: Tensor) -> float:
        """Phase 5: ``p.grad = −Δθ*`` (clipped to ``max_update_norm`` as ``clip_grad_norm_`` does, with the norm
        taken in float64) and ``optimizer.step()``; returns ‖Δθ*‖. The ``p.grad`` are views of the kept update
        buffer, which the next step overwrites."""
        update_norm = float(torch.linalg.vector_norm(update, dtype=torch.float64))
        scale = -1.0
        if self.max_update_norm is not None:
            scale = -min(1.0, self.max_update_norm / (update_norm + 1e-6))
        update.mul_(scale)
        for p, u in zip(self.params, self._plan.views("update", update, self._shapes)):
            if p.grad is not u:      # set once: the views of the kept update buffer stay valid across steps
                p.grad = u
        self.optimizer.step()
        return update_norm

    # -- the step ------------------------------------------------------------------------------------------
    def step(self, batch, *, return_deltas: bool = False) -> MGSStats:
        """One MGS update of the model's parameters on ``batch``; returns the step's :class:`MGSStats`
        (``return_deltas=True`` also keeps every Δθ_k)."""
        world, rank = self.world()
        base_seed = self._base_seed(world)
        surrogate, g, g64, grad_norm = self._surrogate_grad(batch)
        plan = self._plan
        proposal = build_proposal(g, self._numels, self.sigma, self.sigma_mode, g64, plan)      # phase 2
        n = self.K + int(self.include_mle)
        seeds = _seeds_for(base_seed, self.steps_done, n)
        draws = CandidateDraws(proposal, seeds, [self._is_mle(k, s) for k, s in enumerate(seeds)],
                               self.include_mle, plan)
        theta = plan.buffer("theta", g.shape, g.dtype)      # θ, kept across steps (the loop restores from it)
        with torch.no_grad():
            torch._foreach_copy_(plan.views("theta", theta, self._shapes), self.params)
        own = list(range(rank, n, world))
        local, rows, base = self._score_candidates(draws, theta, batch, own)
        losses = self._gather(own, local, surrogate, n, world)
        L = losses.tolist()
        if any(x != x for x in L):
            raise ValueError(f"a candidate's task loss is NaN: {L}")
        log_q = draws.log_q(self.mix, self.density)
        # the checks and formula of mgs_weights(losses, l(θ), log_q, alpha) on Python floats (K numbers: cheaper
        # than a chain of tiny tensor operations); l(θ) cancels, any finite value will do
        lq = log_q.tolist()
        lw = _log_weights_floats(L, lq, self.alpha, _checked_shift_floats(L, lq))
        w = [math.exp(v) for v in lw]
        update, kept = self._weighted_sum(w, draws, rows, theta, return_deltas)
        update_norm = self._apply(update)
        self.steps_done += 1
        theta0 = None if base is not None else theta.clone()     # the lazy base_loss keeps this step's θ
        return MGSStats(step=self.steps_done - 1, task_losses=losses, log_q=log_q,
                        log_weights=torch.tensor(lw, dtype=torch.float64), weights=torch.tensor(w, dtype=torch.float64),
                        ess=1.0 / math.fsum(x * x for x in w), from_mle=torch.tensor(draws.mle, dtype=torch.bool),
                        mle_weight=math.fsum(x for x, m in zip(w, draws.mle) if m),
                        surrogate_loss=surrogate, grad_norm=grad_norm, update_norm=update_norm,
                        sigmas=proposal.sigma.tolist(), seeds=seeds, evaluation=self.mode, deltas=kept,
                        base=float(base) if base is not None else lambda: self._loss_at(theta0, batch))
