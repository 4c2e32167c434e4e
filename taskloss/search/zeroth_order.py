r"""Zeroth-order optimization: sample *parameters*, use loss values only.

Gaussian smoothing replaces ``f`` by ``f_σ(θ) = E_{ε~N(0,I)}[f(θ + σε)]``, whose gradient is

.. math::  \nabla f_\sigma(\theta) = \frac{1}{\sigma}\,\mathbb{E}[f(\theta+\sigma\varepsilon)\,\varepsilon]
           = \frac{1}{\sigma}\,\mathbb{E}[(f(\theta+\sigma\varepsilon) - b)\,\varepsilon]

— exactly REINFORCE with the score ``ε/σ`` of the search distribution ``N(θ, σ²I)``, so any baseline ``b``
independent of ``ε`` keeps it unbiased. Estimators here (``n`` perturbations, evaluated in one batched call
with ``torch.func.vmap`` over stacked parameter sets where ``f`` allows it):

* :func:`gaussian_smoothing_grad` — ``baseline="none" | "value" (f(θ), forward differences) | "loo"``
  (leave-one-out mean), or ``"antithetic"`` (central differences ``(f(θ+σε) - f(θ-σε)) ε / 2σ``);
* :func:`spsa_grad` — simultaneous perturbation with Rademacher directions;
* :class:`MeZO` — the memory-of-one-model optimizer: perturb in place, regenerate the noise from a seed.

``θ`` may be a tensor or a dict of tensors (e.g. ``dict(model.named_parameters())``);
:func:`taskloss.parameter_vectors.functional_loss` turns ``(model, loss_fn, inputs)`` into such an ``f`` via
``torch.func.functional_call``. ``n_samples`` counts the perturbations, ``sigma`` is their scale (the vocabulary
of ``docs/vocabulary.md``).

Derived in notebook 05_policy_gradient_vs_zeroth_order.
"""
from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch.func import vmap

from taskloss.curvature.distributed import agree_status
from taskloss.parameter_vectors import distinct_param_group
from taskloss.search.functional import depends_on_vmap
from taskloss.search.ranks import check_n_examples, combine_across_ranks, fingerprint, share_generator_, world_of
from taskloss.validation import (
    all_finite,
    check_bool,
    check_generator,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_param_list,
    check_positive,
    check_steps,
)

__all__ = ["gaussian_smoothing_grad", "spsa_grad", "MeZO", "NOISE_BLOCK"]

# MeZO draws the noise of a parameter with more entries than this in blocks of this many (4 MiB in float32): the
# temporary stays below the activations of a small forward pass even for a 50K x 768 token embedding (whose whole
# draw, 147 MiB, had made a step need 1.17x the memory of inference on GPT-2 small at 128 tokens). A multiple of 16,
# so on the CPU the blocks' draws continue one another exactly as one draw of the whole flattened parameter would
# wherever its length is a multiple of 16 too.
NOISE_BLOCK = 1 << 20

# --------------------------------------------------------------------------------------------- pytrees
def _as_dict(theta) -> tuple[dict[str, torch.Tensor], bool]:
    if isinstance(theta, torch.Tensor):
        return {"": theta}, True
    if isinstance(theta, dict) and theta and all(isinstance(v, torch.Tensor) for v in theta.values()):
        return dict(theta), False
    raise TypeError("theta must be a tensor or a non-empty dict of tensors")


def _check_draws(theta: dict[str, torch.Tensor], n: int) -> None:
    """The ``n`` directions (and the points built from them) held at once, estimated before they are drawn."""
    per = sum(v.numel() * v.element_size() for v in theta.values())
    check_steps("n_samples", n, bytes_per_step=3.0 * per, device=next(iter(theta.values())).device)


def _check_theta(theta: dict[str, torch.Tensor]) -> None:
    check_not_meta("theta", theta)
    if sum(v.numel() for v in theta.values()) == 0:
        raise ValueError("theta has no entries (every tensor is empty)")
    for k, v in theta.items():
        if not v.is_floating_point():
            raise TypeError(f"parameter {k!r} must be floating point, got {v.dtype}")
        if not all_finite(v):
            raise ValueError(f"parameter {k!r} contains NaN or inf")


def _draw(theta: dict[str, torch.Tensor], n: int, kind: str, generator) -> dict[str, torch.Tensor]:
    """``n`` stacked perturbation directions ``[n, *shape]`` per entry (Gaussian or Rademacher)."""
    out = {}
    for k, v in theta.items():
        if kind == "gaussian":
            z = torch.randn((n, *v.shape), generator=generator, device=v.device, dtype=v.dtype)
        else:
            z = torch.randint(0, 2, (n, *v.shape), generator=generator, device=v.device).to(v.dtype) * 2 - 1
        out[k] = z
    return out


def _scalar_values(vals, n: int, where: str, finite: bool = True) -> torch.Tensor:
    """``vals`` from ``n`` evaluations of f → ``[n]``; ``ValueError`` unless f returned one number per point."""
    vals = torch.as_tensor(vals)
    if vals.ndim == 0 or vals.shape[0] != n or vals[0].numel() != 1:
        per = tuple(vals.shape[1:]) if vals.ndim and vals.shape[0] == n else tuple(vals.shape)
        raise ValueError(f"f must return a scalar (one loss per parameter set), got shape {per} at {where}")
    if vals.is_complex() or vals.dtype == torch.bool:
        raise TypeError(f"f must return a real number, got dtype {vals.dtype} at {where}")
    vals = vals.reshape(n)
    if finite and not all_finite(vals):
        raise ValueError(f"f returned NaN or inf at {where}")
    return vals


def _evaluate(f: Callable, stacked: dict[str, torch.Tensor], single: bool, vectorize: bool,
              chunk_size: int | None, finite: bool = True) -> torch.Tensor:
    """F on each of the stacked parameter sets → ``[n]`` (one vmap call, or a loop when not vectorizable)."""
    call = (lambda p: f(p[""])) if single else f
    n = next(iter(stacked.values())).shape[0]

    def checked(p):
        v = call(p)
        if isinstance(v, torch.Tensor) and not depends_on_vmap(v):
            raise ValueError("f returned the same value at every perturbed point under vmap: it does not depend on "
                             "the parameters it is given (a model evaluated with its own parameters instead of "
                             "through torch.func.functional_call, taskloss.parameter_vectors.functional_loss or "
                             "taskloss.search.call_with_parameters?); pass vectorize=False for an f that is "
                             "really constant")
        return v

    with torch.no_grad():
        if vectorize:
            try:
                vals = vmap(checked, chunk_size=chunk_size, randomness="different")(stacked)
            except ValueError as e:
                if "must only return Tensors" not in str(e):
                    raise
                raise ValueError("f must return a scalar tensor under vmap (pass vectorize=False for a function "
                                 "that returns Python numbers)") from e
        else:
            outs = []
            for i in range(n):
                v = torch.as_tensor(call({k: x[i] for k, x in stacked.items()}))
                if v.numel() != 1:
                    raise ValueError(f"f must return a scalar (one loss per parameter set), got shape "
                                     f"{tuple(v.shape)} at a perturbed point")
                outs.append(v.reshape(()))
            vals = torch.stack(outs)
    return _scalar_values(vals, n, "a perturbed point", finite)


def _value(f, theta: dict[str, torch.Tensor], single: bool, finite: bool = True) -> torch.Tensor:
    with torch.no_grad():
        v = torch.as_tensor(f(theta[""]) if single else f(theta))
    if v.numel() != 1:
        raise ValueError(f"f must return a scalar, got shape {tuple(v.shape)}")
    return _scalar_values(v.reshape(1), 1, "theta", finite)[0]


def _combine(weights: torch.Tensor, dirs: dict[str, torch.Tensor], scale: float, single: bool):
    g = {k: torch.tensordot(weights.to(z.dtype), z, dims=1) * scale for k, z in dirs.items()}
    return g[""] if single else g


def _validate(f, sigma: float, n: int, generator, chunk_size, vectorize) -> tuple[float, int]:
    check_bool("vectorize", vectorize)
    if not callable(f):
        raise TypeError(f"f must be callable (theta -> scalar loss), got {type(f).__name__}")
    check_generator("generator", generator)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    return check_positive("sigma", sigma), check_int("n_samples", n, minimum=1)


_HALF = ("float16", "bfloat16")
RESOLUTION_SHARE = 0.01          # the share of a half-precision tensor's entries allowed to round σz away


def _check_resolution(tensors, sigma: float, what: str) -> None:
    """Refuse a perturbation scale that half-precision parameters cannot represent (issue 45's precision table).

    θ ± σz is formed in the parameters' dtype. Where σ is below half the spacing of the floats around θ
    (``finfo.eps · |θ| / 2``), σz rounds away or to a neighbouring float, so the loss differences measure another
    direction than the ``z`` the estimate multiplies, and MeZO's in-place perturb / restore does not return θ (in
    bfloat16 at σ = 1e-3 on a small MLP: step cosine 0.90 with float64, a drift of 3 units of resolution). More than
    ``RESOLUTION_SHARE`` of any tensor's entries in that range is refused, with the σ that would be resolved.
    float32 and float64 tensors always pass.

    Raises:
        ValueError: σ below the resolution of too many half-precision entries.
    """
    for name, t in tensors:
        if str(t.dtype).split(".")[-1] not in _HALF or t.numel() == 0:
            continue
        spacing = t.detach().abs().float() * (torch.finfo(t.dtype).eps / 2)
        share = float((spacing > sigma).float().mean())
        if share > RESOLUTION_SHARE:
            needed = float(spacing.flatten().kthvalue(max(1, int((1 - RESOLUTION_SHARE) * spacing.numel()))).values)
            raise ValueError(
                f"{what}: sigma = {sigma:g} is below half the resolution of the {str(t.dtype).split('.')[-1]} "
                f"parameter {name} for {share:.0%} of its entries, so θ ± σz rounds the perturbation away and the "
                f"estimate follows another direction. Use sigma ≥ {needed:.2g} (resolved for all but "
                f"{RESOLUTION_SHARE:.0%} of the entries), or keep the parameters in float32 (float32 master weights)")


class _Ranks:
    """The ranks an estimator combines its values across (see :mod:`taskloss.search.ranks`): built once per call,
    after every rank's generator was given rank 0's state (or a seed from rank 0 when there is none)."""

    def __init__(self, theta: dict[str, torch.Tensor], n_examples, process_group):
        self.weight, self.group = check_n_examples(n_examples), process_group
        self.world = world_of(process_group)[0]
        self.device = next(iter(theta.values())).device
        self.print = fingerprint(list(theta.values())) if self.world > 1 else 0.0

    @property
    def local(self) -> bool:
        """One process: nothing to combine."""
        return self.world == 1

    def generator(self, generator: torch.Generator | None) -> torch.Generator | None:
        """The generator every rank draws the same directions from."""
        if self.local:
            return generator
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(int(torch.randint(0, 2**62, (1,))))
        share_generator_(generator, self.group, self.device)
        return generator

    def combine(self, *values: torch.Tensor) -> list[torch.Tensor]:
        """Each tensor of values over the whole batch (the ranks' weighted mean), checked finite."""
        if self.local:
            return list(values)
        sizes = [v.numel() for v in values]
        total = combine_across_ranks(torch.cat([v.reshape(-1).double() for v in values]), self.weight, self.print,
                                     self.group, self.device, "the zeroth-order estimate")
        if not bool(torch.isfinite(total).all()):
            raise ValueError("f returned NaN or inf at a perturbed point on some rank")
        return [t.to(v.dtype).to(v.device).reshape(v.shape) for t, v in zip(total.split(sizes), values)]


# -------------------------------------------------------------------------------------------- estimators
def gaussian_smoothing_grad(f: Callable, theta, sigma: float, n_samples: int, *, baseline: str = "value",
                            generator: torch.Generator | None = None, vectorize: bool = True,
                            chunk_size: int | None = None, return_samples: bool = False, n_examples=None,
                            process_group=None):
    """Gradient of the Gaussian-smoothed objective ``E[f(θ + σε)]`` from function values.

    ``f``: θ ↦ scalar tensor (same structure as ``theta``: tensor or dict of tensors). ``n = n_samples``
    directions ``ε_i ~ N(0, I)``; ``F_i = f(θ + σε_i)`` evaluated in one ``vmap`` call (``vectorize=False``
    loops instead, for ``f`` that vmap cannot trace; ``chunk_size`` bounds vmap's memory). ``baseline``:

    * ``"none"``  — ``(1/nσ) Σ F_i ε_i`` (plain REINFORCE with the Gaussian score);
    * ``"value"`` — ``(1/nσ) Σ (F_i - f(θ)) ε_i`` (forward differences; one extra evaluation);
    * ``"loo"``   — ``(1/nσ) Σ (F_i - mean_{j≠i} F_j) ε_i`` (needs n ≥ 2; no extra evaluation);
    * ``"antithetic"`` — ``(1/2nσ) Σ (f(θ+σε_i) - f(θ-σε_i)) ε_i`` (central differences; 2n evaluations).

    All four are unbiased for ``∇ E[f(θ+σε)]``. Derived in notebook 05_policy_gradient_vs_zeroth_order.

    Under ``torch.distributed`` (an initialized process group, or ``process_group``) each rank passes the ``f`` of its
    own batch: every rank draws rank 0's directions (``generator`` takes rank 0's state; without one, a seed from
    rank 0), the values ``F_i`` (and ``f(θ)``) are the ranks' weighted mean ``Σ_r n_r F_{r,i} / Σ_r n_r`` with
    ``n_r = n_examples`` (1 per rank when ``None``), one ``all_gather`` of ``2n + 3`` numbers at most
    (:mod:`taskloss.search.ranks`), and every rank returns the same estimate — that of one process on the
    concatenated batch, for an ``f`` that is a mean over examples. Every rank must call it with the same θ.

    Args:
        f: θ ↦ scalar tensor (same structure as ``theta``).
        theta: a tensor or a dict of tensors.
        sigma: the perturbation scale σ > 0.
        n_samples: the number of directions n ≥ 1.
        baseline: ``"none"``, ``"value"``, ``"loo"`` or ``"antithetic"`` (above).
        generator: the RNG of the directions.
        vectorize: evaluate the points in one ``vmap`` (``False``: a loop).
        chunk_size: points per vmap call.
        return_samples: also return the draws and the values.
        n_examples: the number of examples this rank's ``f`` averages (its weight across ranks; ignored in one
            process).
        process_group: the ``torch.distributed`` process group (default: the global one when initialized).

    Returns:
        The gradient (same structure as ``theta``), plus ``(directions, values)`` with ``return_samples``
        (``directions``: the stacked ``[n, ...]`` draws ε_i; ``values``: ``[n]``, or ``[2, n]`` for ``+``/``-`` in the
        antithetic case).

    Raises:
        TypeError: bad types (a non-callable ``f``, a flag that is not a bool).
        ValueError: bad values, NaN/inf in θ or in ``f``'s values.
    """
    sigma, n = _validate(f, sigma, n_samples, generator, chunk_size, vectorize)
    check_bool("return_samples", return_samples)
    th, single = _as_dict(theta)
    _check_theta(th)
    _check_draws(th, n)
    _check_resolution(th.items(), sigma, "gaussian_smoothing_grad")
    if baseline not in ("none", "value", "loo", "antithetic"):
        raise ValueError(f"baseline must be 'none', 'value', 'loo' or 'antithetic', got {baseline!r}")
    if baseline == "loo" and n < 2:
        raise ValueError("baseline='loo' needs n_samples >= 2")
    ranks = _Ranks(th, n_examples, process_group)
    directions = _draw(th, n, "gaussian", ranks.generator(generator))
    plus = _evaluate(f, {k: th[k] + sigma * e for k, e in directions.items()}, single, vectorize, chunk_size,
                     ranks.local)
    if baseline == "antithetic":
        minus = _evaluate(f, {k: th[k] - sigma * e for k, e in directions.items()}, single, vectorize, chunk_size,
                          ranks.local)
        plus, minus = ranks.combine(plus, minus)
        w, values, scale = plus - minus, torch.stack([plus, minus]), 1.0 / (2 * n * sigma)
    else:
        scale = 1.0 / (n * sigma)
        if baseline == "value":
            plus, base = ranks.combine(plus, _value(f, th, single, ranks.local).to(plus))
            w = plus - base
        else:
            (plus,) = ranks.combine(plus)
            w = plus if baseline == "none" else plus - (plus.sum() - plus) / (n - 1)
        values = plus
    g = _combine(w, directions, scale, single)
    if return_samples:
        return g, (directions[""] if single else directions), values
    return g


def spsa_grad(f: Callable, theta, sigma: float, n_samples: int = 1, *, generator: torch.Generator | None = None,
              vectorize: bool = True, chunk_size: int | None = None, n_examples=None, process_group=None):
    """Simultaneous-perturbation stochastic approximation (SPSA) gradient estimate.

    ``δ_i`` with i.i.d. ±1 (Rademacher) entries; ``ĝ = (1/n) Σ (f(θ+σδ_i) - f(θ-σδ_i)) / (2σ) · δ_i``
    (``1/δ = δ`` for ±1 entries). Unbiased up to O(σ²) for smooth ``f`` since ``E[δδᵀ] = I``. Derived in notebook
    05_policy_gradient_vs_zeroth_order. Across ``torch.distributed`` ranks as :func:`gaussian_smoothing_grad`.

    Args:
        f: θ ↦ scalar tensor (same structure as ``theta``).
        theta: a tensor or a dict of tensors.
        sigma: the perturbation scale σ > 0.
        n_samples: the number of directions n ≥ 1.
        generator: the RNG of the directions.
        vectorize: evaluate the 2n points in one ``vmap`` (``False``: a loop).
        chunk_size: points per vmap call.
        n_examples: the number of examples this rank's ``f`` averages (its weight across ranks).
        process_group: the ``torch.distributed`` process group (default: the global one when initialized).

    Returns:
        ĝ, with the structure of ``theta``.

    Raises:
        TypeError: bad types (a non-callable ``f``, a flag that is not a bool).
        ValueError: bad values, NaN/inf in θ or in ``f``'s values.
    """
    sigma, n = _validate(f, sigma, n_samples, generator, chunk_size, vectorize)
    th, single = _as_dict(theta)
    _check_theta(th)
    _check_draws(th, n)
    _check_resolution(th.items(), sigma, "spsa_grad")
    ranks = _Ranks(th, n_examples, process_group)
    d = _draw(th, n, "rademacher", ranks.generator(generator))
    plus = _evaluate(f, {k: th[k] + sigma * z for k, z in d.items()}, single, vectorize, chunk_size, ranks.local)
    minus = _evaluate(f, {k: th[k] - sigma * z for k, z in d.items()}, single, vectorize, chunk_size, ranks.local)
    plus, minus = ranks.combine(plus, minus)
    return _combine(plus - minus, d, 1.0 / (2 * n * sigma), single)


# --------------------------------------------------------------------------------------------------- MeZO
class MeZO(torch.optim.Optimizer):
    """Memory-efficient zeroth-order SGD: the memory of one model, no stored perturbation.

    After Malladi et al., *Fine-Tuning Language Models with Just Forward Passes* (NeurIPS 2023). Per perturbation k
    (``n_samples`` of them) with a fresh seed s_k: ``θ += σz``; ``L+ = closure()``; ``θ -= 2σz``;
    ``L- = closure()``; ``θ += σz`` (restore); ``g_k = (L+ - L-) / 2σ``. Then
    ``θ ← θ - lr · (mean_k g_k z_k + weight_decay · θ)`` with each ``z_k ~ N(0, I)`` regenerated from s_k
    parameter by parameter (a temporary of at most one parameter, or ``NOISE_BLOCK`` entries of a larger
    contiguous one, at a time). Derived in notebook
    05_policy_gradient_vs_zeroth_order.

    Half precision: θ ± σz is formed in the parameters' dtype, so a σ below half the resolution of float16/bfloat16
    parameters is refused with the σ that would be resolved (``benchmarks/bench_precision.py`` found the bfloat16 step
    0.90–0.96 cosine from float64 at σ = 1e-3). Above it the step follows float64's, but the in-place perturb / restore
    still rounds θ by a few units of the dtype's resolution per step (exact restoring would need a float32 copy of θ,
    the memory MeZO saves): keep float32 master weights where that drift matters.

    ``step(closure)`` follows torch.optim except that the closure is evaluated at perturbed parameters:
    ``closure()`` must return the loss (no ``backward``; it runs under ``torch.no_grad()``), or ``(loss,
    n_examples)`` — the number of examples the loss averages, which weighs it across ranks (below) — and ``step``
    returns the first loss, ``L+`` of the first perturbation. Frozen parameters (``requires_grad=False``) are
    neither perturbed nor updated, and a parameter listed twice is one parameter. ``lr`` and ``weight_decay`` may
    differ between parameter groups; ``sigma`` and ``n_samples`` are shared by all groups (one perturbation moves
    every parameter). A closure that raises, returns a non-scalar or a NaN loss leaves the parameters restored (up
    to the rounding of θ + σz − σz).

    Under ``torch.distributed`` (an initialized process group, or ``process_group``) every rank draws the same
    perturbations (rank 0's seed generator is broadcast at the first step and after :meth:`load_state_dict`) and
    evaluates the loss of its own batch; the 2·``n_samples`` losses of each rank are combined into those of the
    whole batch, ``L = Σ_r n_r L_r / Σ_r n_r`` with ``n_r`` the ``n_examples`` the closure returned (1 per rank
    when it returns the loss alone: DDP's equal-weight convention), by one ``all_gather`` of a few numbers per step
    (:mod:`taskloss.search.ranks`). Every rank then takes the same step: N processes equal one process on the
    concatenated batch for a mean loss (an uneven last batch included, given ``n_examples``), with the memory of
    inference on each. The ranks must start from the same parameters (checked at every step through a float64
    fingerprint).

    Args:
        params: parameters or parameter groups.
        lr: step size > 0.
        sigma: perturbation scale σ > 0.
        weight_decay: decoupled weight decay ≥ 0.
        n_samples: perturbations per step (≥ 1).
        seed: seed of the generator that draws the perturbations' seeds; :meth:`state_dict` carries its state, so
            a run restored into a fresh MeZO continues bit for bit.
        process_group: the ``torch.distributed`` process group (default: the global one when initialized).

    Raises:
        TypeError, ValueError: bad hyperparameters (at construction and, for ``param_groups`` edited since, at
            ``step``).
    """

    def __init__(self, params, lr: float = 1e-3, sigma: float = 1e-3, weight_decay: float = 0.0,
                 n_samples: int = 1, seed: int = 0, process_group=None):
        check_int("seed", seed, minimum=0)
        defaults = dict(lr=check_positive("lr", lr), sigma=check_positive("sigma", sigma),
                        weight_decay=check_nonnegative("weight_decay", weight_decay),
                        n_samples=check_int("n_samples", n_samples, minimum=1))
        check_param_list(params)
        super().__init__(params, defaults)
        self._seeds = torch.Generator().manual_seed(seed)
        self.process_group, self._seeds_shared = process_group, False
        self.last_projected_grads: list[float] = []

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with each tensor of the group kept once (by identity)."""
        group = distinct_param_group(param_group)
        check_not_meta("params", group.get("params", []))
        super().add_param_group(group)

    def state_dict(self) -> dict:
        """``torch.optim`` state plus the seed generator's state.

        Loading it into a fresh MeZO over the same parameters continues the same perturbation sequence bit for bit.
        """
        out = super().state_dict()
        out["mezo"] = {"seed_generator": self._seeds.get_state().clone(), "shapes": self._shapes()}
        return out

    def _shapes(self) -> list[list[tuple[int, ...]]]:
        """The shapes of every group's parameters (MeZO keeps no per-parameter state that torch could compare)."""
        return [[tuple(p.shape) for p in g["params"]] for g in self.param_groups]

    def load_state_dict(self, state_dict: dict) -> None:
        """Inverse of :meth:`state_dict`.

        Args:
            state_dict: what :meth:`state_dict` returned.

        Raises:
            ValueError: a state without MeZO's generator state, or one saved over parameters of other shapes (the
                perturbation sequence would continue over other tensors).
        """
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("mezo"), dict):
            raise ValueError("not a MeZO state_dict: the 'mezo' entry (seed generator state) is missing")
        state_dict = dict(state_dict)
        extra = state_dict.pop("mezo")
        gen_state = extra.get("seed_generator")
        if not isinstance(gen_state, torch.Tensor) or gen_state.dtype != torch.uint8:
            raise ValueError("MeZO state_dict: 'seed_generator' must be a uint8 tensor from Generator.get_state()")
        shapes = extra.get("shapes")
        if shapes is not None:
            saved = [[tuple(s) for s in g] for g in shapes]
            if saved != self._shapes():
                raise ValueError(f"MeZO state_dict was saved over parameters of shapes {saved}, but this optimizer "
                                 f"holds {self._shapes()}")
        super().load_state_dict(state_dict)
        self._seeds.set_state(gen_state.clone())
        self._seeds_shared = False

    def _trained(self, group: dict) -> list[torch.Tensor]:
        return [p for p in group["params"] if p.requires_grad]

    def _add_z(self, seed: int, coef: Callable[[dict], float]) -> None:
        """``p += coef(group) · z`` for every trained parameter, ``z ~ N(0, I)`` regenerated from ``seed`` in a fixed
        parameter order (one generator per device); a parameter of more than ``NOISE_BLOCK`` entries (contiguous)
        is drawn and added in blocks of that many, so no temporary exceeds one block or one smaller parameter."""
        gens: dict = {}
        for group in self.param_groups:
            c = coef(group)
            for p in self._trained(group):
                gen = gens.get(p.device)
                if gen is None:
                    gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
                if p.numel() > NOISE_BLOCK and p.is_contiguous():
                    flat = p.view(-1)
                    for i in range(0, flat.numel(), NOISE_BLOCK):
                        part = flat[i:i + NOISE_BLOCK]
                        part.add_(torch.randn(part.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=c)
                else:
                    p.add_(torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=c)

    @staticmethod
    def _loss(closure) -> tuple[torch.Tensor, float | None]:
        """The closure's loss as a 0-dim tensor, and its ``n_examples`` (``None`` when it returned the loss alone)."""
        out, n = closure(), None
        if isinstance(out, tuple):
            if len(out) != 2:
                raise ValueError(f"MeZO closure must return the loss or (loss, n_examples), got a tuple of {len(out)}")
            out, n = out[0], check_n_examples(out[1])
        if isinstance(out, bool) or not isinstance(out, (torch.Tensor, numbers.Real)):
            raise TypeError(f"MeZO closure must return a scalar loss (tensor or number), got {type(out).__name__}")
        v = torch.as_tensor(out).detach()
        if v.numel() != 1:
            raise ValueError(f"MeZO closure must return a scalar loss, got shape {tuple(v.shape)}")
        if v.is_complex() or v.dtype == torch.bool:
            raise TypeError(f"MeZO closure must return a real loss, got dtype {v.dtype}")
        return v.reshape(()), n

    def _shared(self, name: str, check) -> float:
        values = {group[name] for group in self.param_groups}
        if len(values) != 1:
            raise ValueError(f"MeZO needs one {name} shared by all parameter groups, got {sorted(values)}")
        return check(name, values.pop())

    def _perturbed_losses(self, closure, n: int, world: int) -> tuple[list, list, list, torch.Tensor]:
        """The seeds, the losses at θ ± σz, their weights and the first loss of one step (θ restored on return and
        before any error propagates)."""
        seeds, values, weights, first = [], [], [], None
        for _ in range(n):
            s = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            self._add_z(s, lambda gr: gr["sigma"])              # θ + σz
            try:
                lp, wp = self._loss(closure)
            except BaseException:
                self._add_z(s, lambda gr: -gr["sigma"])         # back to θ before the error propagates
                raise
            self._add_z(s, lambda gr: -2 * gr["sigma"])         # θ - σz
            try:
                lm, wm = self._loss(closure)
            finally:
                self._add_z(s, lambda gr: gr["sigma"])          # θ
            if world == 1 and not (bool(torch.isfinite(lp)) and bool(torch.isfinite(lm))):
                raise ValueError("closure returned NaN or inf; parameters restored, no update made")
            seeds.append(s)
            values += [float(lp), float(lm)]
            weights += [wp, wm]
            first = lp if first is None else first
        if len(set(weights)) != 1:
            raise ValueError(f"MeZO closure returned different n_examples within one step "
                             f"({sorted(set(weights), key=str)}): each call must weigh the loss of the same batch")
        return seeds, values, weights, first

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor | float]) -> torch.Tensor:  # type: ignore[override]
        """One MeZO update (see the class docstring).

        Args:
            closure: returns the loss at the current (perturbed) parameters, or ``(loss, n_examples)``.

        Returns:
            ``L+`` of the first perturbation (the first loss the closure returned; across ranks, that of the whole
            batch).

        Raises:
            ValueError: no closure, a NaN loss, bad hyperparameters; the parameters are restored before any error
                propagates.
        """
        if closure is None or not callable(closure):
            raise ValueError("MeZO.step needs a closure that returns the loss")
        sigma = self._shared("sigma", check_positive)
        n = self._shared("n_samples", lambda name, v: check_int(name, v, minimum=1))
        for group in self.param_groups:
            check_positive("lr", group["lr"])
            check_nonnegative("weight_decay", group["weight_decay"])
        world, _ = world_of(self.process_group)
        trained = [p for group in self.param_groups for p in self._trained(group)]
        _check_resolution(((f"#{i}", p) for i, p in enumerate(trained)), sigma, "MeZO")
        device = trained[0].device if trained else torch.device("cpu")
        if world > 1 and not self._seeds_shared:            # every rank draws rank 0's perturbations
            share_generator_(self._seeds, self.process_group, device)
        self._seeds_shared = True
        try:
            seeds, values, weights, first = self._perturbed_losses(closure, n, world)
        except (ValueError, TypeError, RuntimeError, ArithmeticError) as e:
            if world > 1:   # the others must not wait in the all-gather below: every rank raises the same error
                agree_status(e, "MeZO.step", self.process_group)
            raise
        if world > 1:       # every rank is ready (one small all-reduce of the ranks' status)
            agree_status(None, "MeZO.step", self.process_group)
        if world > 1:                                       # the losses of the whole batch, on every rank
            total = combine_across_ranks(torch.tensor(values, dtype=torch.float64), weights[0], fingerprint(trained),
                                         self.process_group, device, "MeZO")
            if not bool(torch.isfinite(total).all()):
                raise ValueError("closure returned NaN or inf on some rank; parameters restored, no update made")
            values = total.tolist()
            first = torch.tensor(values[0], dtype=first.dtype, device=first.device)
        grads = [(values[2 * k] - values[2 * k + 1]) / (2 * sigma) for k in range(n)]
        for group in self.param_groups:
            if group["weight_decay"] > 0:
                for p in self._trained(group):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
        for s, g in zip(seeds, grads):
            self._add_z(s, lambda gr, g=g: -gr["lr"] * g / len(seeds))
        self.last_projected_grads = grads
        return first
