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
Update step here: :class:`MGS` (any ``nn.Module``, any task loss, any torch optimizer, candidates scored in one
``torch.func.vmap`` over stacked parameters — see :mod:`taskloss.search.mgs_scoring` — and split across ranks
under ``torch.distributed``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from taskloss.search.mgs_density import (
    DENSITIES,
    _check_choice,
    _log_q_from_sq,
    _seed_for,
    _uniform_from_seed,
    effective_sample_size,
    mgs_weights,
)
from taskloss.search.mgs_scoring import _CandidateScoring, default_forward
from taskloss.utils import check_int, check_positive, check_probability

__all__ = ["MGS", "MGSStats", "SIGMA_MODES", "ASSIGNMENTS"]

SIGMA_MODES = ("absolute", "relative")
ASSIGNMENTS = ("random", "stratified")


@dataclass
class MGSStats:
    """Diagnostics of one :meth:`MGS.step`. Tensors are float64 on CPU, indexed by candidate ``[K']``
    (K' = K, +1 with ``include_mle``: candidate 0 is then the exact step −∇l̃)."""

    step: int
    base_loss: float                 # l(θ)
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

    @property
    def best_index(self) -> int:
        return int(torch.argmin(self.task_losses))

    def as_dict(self) -> dict[str, Any]:
        """Scalars only (for logging)."""
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
    parameters θ+Δθ_k (``torch.func.functional_call``) — all candidates of a chunk in one ``vmap`` over
    stacked parameter dicts (``parallel=True``) or one after another (``parallel=False``); (4) self-normalized
    weights (:func:`mgs_weights`) and Δθ* = Σ_k w_k Δθ_k; (5) ``p.grad = −Δθ*`` (clipped to ``max_update_norm``)
    and ``optimizer.step()`` (the reference uses AdamW; SGD with lr=1 applies θ ← θ + Δθ* exactly).

    Arguments:

    - model: any ``nn.Module``; its parameters with ``requires_grad`` are searched (pass the plain module, not
      a DDP wrapper). optimizer: any ``torch.optim.Optimizer`` over those parameters.
    - surrogate_loss_fn(model, batch) → scalar tensor l̃ (differentiable).
    - task_loss_fn(outputs, batch) → scalar l (lower is better; a 0-dim tensor, or a float in loop mode).
    - forward_fn(model_k, batch) → outputs (default :func:`default_forward`: ``model_k(batch[0])``). ``model_k``
      runs the model with the candidate's parameters: in the vmap modes a callable proxy (``functional_call``,
      other attributes from the module); in loop mode (``parallel=False``) the module itself with θ+Δθ_k
      copied into its parameters and θ restored afterwards — so anything that works on the model (e.g.
      ``taskloss.lm.generate`` with early stopping) works there, and ``forward_fn`` may even return
      ``model_k`` itself for a ``task_loss_fn`` that drives the model.
    - K ≥ 1 candidates; alpha > 0 temperature (reference: 1/β = 0.01); sigma > 0 noise scale with
      ``sigma_mode`` "relative" (σ_t = σ·mean|g_t|, reference default) or "absolute"; mix = λ ∈ [0, 1], the
      weight of the zero-centred component; ``assignment``: "random" (each candidate's component drawn with
      P(zero) = λ) or "stratified" (a fixed pattern with ⌈j(1−λ)⌉ MLE-centred among the first j candidates —
      for λ = ½ the reference's alternation MLE, zero, MLE, …; the mixture density is still the right weight: it is the
      balance heuristic of deterministic-mixture importance sampling); ``density`` "mixture" or "unit_sigma".
    - vmap_task_loss: True (forward and task loss in one vmap), False (vmap the forward, score each candidate's
      outputs in a Python loop — for decoding + edit distance and other non-vmappable metrics), "auto" (try
      vmap, fall back to the forward-only vmap, then to the loop, with a warning). chunk_size: candidates
      per vmap call (None = all at once). low_memory: regenerate the noise from its seeds for the weighted
      sum instead of storing K parameter-sized tensors. eval_mode: score candidates with ``model.eval()``.
    - seed: base seed of the candidate noise (None: drawn from torch's global RNG). Under an initialized
      ``torch.distributed`` process group (or ``process_group``) rank 0's seed is broadcast once, rank r scores
      candidates r, r+W, …, the losses are all-gathered and every rank computes the same weights and update
      from the same seeds. Every rank must pass the same batch (checked through l(θ)).

    Derived in notebook 02_importance_sampling_and_mgs; used in 03 (classification) and 04 (sequences).
    """

    def __init__(self, model: nn.Module, optimizer, surrogate_loss_fn: Callable, task_loss_fn: Callable, *,
                 K: int = 4, alpha: float = 0.01, sigma: float = 1.0, sigma_mode: str = "relative",
                 mix: float = 0.5, include_mle: bool = False, density: str = "mixture",
                 assignment: str = "random", max_grad_norm: float | None = 1.0,
                 max_update_norm: float | None = 1.0, forward_fn: Callable | None = None, parallel: bool = True,
                 vmap_task_loss: bool | str = "auto", chunk_size: int | None = None, low_memory: bool = False,
                 eval_mode: bool = True, seed: int | None = None, process_group=None):
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
        if vmap_task_loss not in (True, False, "auto"):
            raise ValueError(f"vmap_task_loss must be True, False or 'auto', got {vmap_task_loss!r}")
        if seed is not None:
            check_int("seed", seed, minimum=0)
        self.model, self.optimizer = model, optimizer
        self.surrogate_loss_fn, self.task_loss_fn = surrogate_loss_fn, task_loss_fn
        self.forward_fn = forward_fn or default_forward
        self.include_mle, self.low_memory, self.eval_mode = bool(include_mle), bool(low_memory), bool(eval_mode)
        self.parallel, self.process_group = bool(parallel), process_group
        self._auto = self.parallel and vmap_task_loss == "auto"
        self.mode = "loop" if not self.parallel else ("vmap_forward" if vmap_task_loss is False else "vmap")
        self._mode_confirmed = False
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("model has no parameter with requires_grad=True")
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        kinds = {(p.device, p.dtype) for p in self.params}
        if len(kinds) != 1 or not self.params[0].is_floating_point():
            raise ValueError(f"MGS searches one flat parameter vector: all trainable parameters must share one "
                             f"floating dtype and device, got {sorted(map(str, kinds))}")
        self._shapes = [p.shape for p in self.params]
        self._numels = [p.numel() for p in self.params]
        self._lengths = torch.tensor(self._numels, device=self.params[0].device)
        self._seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if seed is None else int(seed)
        self._seed_synced = False
        self.steps_done = 0

    def state_dict(self) -> dict[str, int]:
        """Base seed and step counter: with the model's and optimizer's state, a run resumes bit-identically."""
        return {"seed": self._seed, "steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._seed, self.steps_done = int(state["seed"]), int(state["steps_done"])
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

    def _gather(self, local: dict[int, Tensor], base: Tensor, n: int, world: int) -> Tensor:
        vec = torch.zeros(n + 1, dtype=torch.float64, device=self.params[0].device)
        for k, v in local.items():
            vec[k] = v
        vec[n] = base
        if world == 1:
            return vec[:n].cpu()
        bufs = [torch.empty_like(vec) for _ in range(world)]
        dist.all_gather(bufs, vec, group=self.process_group)
        G = torch.stack(bufs).cpu()
        if not bool((G[:, n] == G[0, n]).all()):
            raise RuntimeError(f"ranks disagree on the task loss l(θ) ({G[:, n].tolist()}): every rank must pass "
                               "the same batch and hold the same parameters")
        return torch.stack([G[k % world, k] for k in range(n)])

    # -- candidates ----------------------------------------------------------------------------------------
    def _flat(self, tensors) -> Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def _unflat(self, flat: Tensor) -> dict[str, Tensor]:
        """``[..., P]`` → {name: ``[..., *shape]``} views."""
        lead = flat.shape[:-1]
        return {n: v.reshape(*lead, *sh) for n, v, sh in zip(self.names, flat.split(self._numels, -1),
                                                             self._shapes)}

    def _segsum(self, x: Tensor) -> Tensor:
        """Per-tensor sums of a flat float64 vector ``[P]`` → CPU ``[T]``."""
        return torch.segment_reduce(x, "sum", lengths=self._lengths).cpu()

    def _surrogate_grad(self, batch):
        loss = self.surrogate_loss_fn(self.model, batch)
        if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise ValueError("surrogate_loss_fn must return a scalar tensor that requires grad")
        if not bool(torch.isfinite(loss.detach())):
            raise ValueError(f"surrogate loss is not finite: {float(loss.detach())}")
        grads = torch.autograd.grad(loss.reshape(()), self.params, allow_unused=True)
        g = self._flat([torch.zeros_like(p) if gr is None else gr.detach() for p, gr in zip(self.params, grads)])
        norm = float(torch.linalg.vector_norm(g, dtype=torch.float64))
        if not math.isfinite(norm):
            raise ValueError("surrogate gradient contains NaN or inf")
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            g = g * (self.max_grad_norm / (norm + 1e-6))
        return float(loss.detach()), g, norm

    def _is_mle(self, k: int, seed: int) -> bool:
        if self.include_mle and k == 0:
            return True
        j, r = k - int(self.include_mle), 1.0 - self.mix
        if self.assignment == "stratified":
            return math.ceil((j + 1) * r - 1e-9) - math.ceil(j * r - 1e-9) == 1
        return _uniform_from_seed(seed) >= self.mix

    def _generate(self, k: int, seed: int, mle: bool, g: Tensor, s_flat: Tensor, stats=None) -> Tensor:
        """Flat Δθ_k ``[P]`` regenerated from its seed. With ``stats = (zz, zg)`` also fills row k of the
        float64 per-tensor statistics ‖z_t‖², ⟨z_t, g_t⟩ of its standard normal noise z."""
        if self.include_mle and k == 0:
            return -g
        gen = torch.Generator(device=g.device).manual_seed(seed)
        z = torch.randn(g.shape, generator=gen, device=g.device, dtype=g.dtype)
        if stats is not None:
            # float64 per-tensor ‖z_t‖² and ⟨z_t, g_t⟩, one tensor at a time. Both memory modes use this one
            # reduction (not segment_reduce in one and sum in the other): different kernels sum in a different
            # order, which made log q differ by ~1e-14 between the modes on some CPUs.
            zz, zg = stats
            for t, (zt, gt) in enumerate(zip(z.split(self._numels), g.split(self._numels))):
                zt64 = zt.double()
                zz[k, t], zg[k, t] = zt64.square().sum(), (zt64 * gt.double()).sum()
        return torch.addcmul(-g, s_flat, z) if mle else z.mul_(s_flat)

    def _log_q(self, mle, zz, zg, gg, sig, numel) -> Tensor:
        s = sig[None, :]
        m = torch.tensor(mle, dtype=torch.bool)[:, None]
        d0 = torch.where(m, gg - 2 * s * zg + s * s * zz, s * s * zz)     # ‖Δθ_t‖²
        d1 = torch.where(m, s * s * zz, s * s * zz + 2 * s * zg + gg)     # ‖Δθ_t + g_t‖²
        if self.include_mle:
            d0[0], d1[0] = gg[0], torch.zeros_like(gg[0])
        return _log_q_from_sq(d0, d1, sig, numel, self.mix, self.density)

    # -- the step ------------------------------------------------------------------------------------------
    def step(self, batch, *, return_deltas: bool = False) -> MGSStats:
        """One MGS update of the model's parameters on ``batch``; returns the step's :class:`MGSStats`."""
        world, rank = self.world()
        base_seed = self._base_seed(world)
        surrogate, g, grad_norm = self._surrogate_grad(batch)
        gg = self._segsum(g.double().square())
        numel = torch.tensor(self._numels, dtype=torch.float64)
        if self.sigma_mode == "relative":
            sig = self.sigma * self._segsum(g.double().abs()) / numel
        else:
            sig = torch.full((len(self._numels),), self.sigma, dtype=torch.float64)
        s_flat = torch.repeat_interleave(sig.to(device=g.device, dtype=g.dtype), self._lengths)
        n, T = self.K + int(self.include_mle), len(self.params)
        seeds = [_seed_for(base_seed, self.steps_done, k) for k in range(n)]
        mle = [self._is_mle(k, s) for k, s in enumerate(seeds)]
        zz = torch.zeros(n, T, dtype=torch.float64)
        zg = torch.zeros(n, T, dtype=torch.float64)
        own = list(range(rank, n, world))
        chunk = self.chunk_size or max(len(own), 1)
        theta = self._flat([p.detach() for p in self.params])
        stored: list[tuple[list[int], Tensor]] = []    # (candidate ids, their Δθ rows [c, P])
        local: dict[int, Tensor] = {}
        stats = (zz, zg)
        was_training = self.model.training
        try:
            if self.eval_mode:
                self.model.eval()
            with torch.no_grad():
                base = self._score_one(self.model, batch)
                for i in range(0, len(own), chunk):
                    ks = own[i:i + chunk]
                    ds = torch.stack([self._generate(k, seeds[k], mle[k], g, s_flat, stats) for k in ks])
                    local.update(zip(ks, self._score(ds, theta, batch)))
                    if not self.low_memory:
                        stored.append((ks, ds))
                    del ds
                for k in range(n):  # candidates scored by other ranks: their statistics (and noise) only
                    if k not in local:
                        d = self._generate(k, seeds[k], mle[k], g, s_flat, stats)
                        if not self.low_memory:
                            stored.append(([k], d.unsqueeze(0)))
                        del d
        finally:
            self.model.train(was_training)
        if not math.isfinite(float(base)):
            raise ValueError(f"task loss at the current parameters is not finite: l(θ) = {float(base)}")
        losses = self._gather(local, base, n, world)
        if bool(torch.isnan(losses).any()):
            raise ValueError(f"task loss is NaN/inf: l(θ) = {float(base)}, candidates = {losses.tolist()}")
        log_q = self._log_q(mle, zz, zg, gg.expand(n, T), sig, numel)
        log_w = mgs_weights(losses, base, log_q, self.alpha, log=True)
        w = log_w.exp()
        kept = [] if return_deltas else None
        with torch.no_grad():
            # Σ_k w_k Δθ_k accumulated in candidate order k = 0, 1, …: the same arithmetic on every rank and in
            # every mode (stored rows or regenerated noise), so ranks stay bit-identical step after step
            rows = {k: d for ks, ds in stored for k, d in zip(ks, ds)}
            update = torch.zeros_like(theta)
            for k in range(n):
                d = rows[k] if k in rows else self._generate(k, seeds[k], mle[k], g, s_flat)
                update.add_(d, alpha=float(w[k]))
                if kept is not None:
                    kept.append(self._unflat(d.clone()))
                del d
            rows.clear()
            stored.clear()
            update_norm = float(torch.linalg.vector_norm(update, dtype=torch.float64))
            for p, u in zip(self.params, self._unflat(-update).values()):
                p.grad = u
            if self.max_update_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.params, self.max_update_norm)
        self.optimizer.step()
        self.steps_done += 1
        from_mle = torch.tensor(mle, dtype=torch.bool)
        return MGSStats(step=self.steps_done - 1, base_loss=float(base), task_losses=losses, log_q=log_q,
                        log_weights=log_w, weights=w, ess=effective_sample_size(w), from_mle=from_mle,
                        mle_weight=float(w[from_mle].sum()), surrogate_loss=surrogate, grad_norm=grad_norm,
                        update_norm=update_norm, sigmas=sig.tolist(), seeds=seeds, evaluation=self.mode,
                        deltas=kept)
