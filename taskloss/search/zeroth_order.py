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
:func:`taskloss.utils.functional_loss` turns ``(model, loss_fn, inputs)`` into such an ``f`` via
``torch.func.functional_call``. ``n_samples`` counts the perturbations, ``sigma`` is their scale (the vocabulary
of ``docs/vocabulary.md``).

Derived in notebook 05_policy_gradient_vs_zeroth_order.
"""
from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch.func import vmap

from taskloss.search.functional import depends_on_vmap
from taskloss.utils import all_finite, check_bool, check_int, check_nonnegative, check_positive, distinct_param_group

__all__ = ["gaussian_smoothing_grad", "spsa_grad", "MeZO"]

# --------------------------------------------------------------------------------------------- pytrees
def _as_dict(theta) -> tuple[dict[str, torch.Tensor], bool]:
    if isinstance(theta, torch.Tensor):
        return {"": theta}, True
    if isinstance(theta, dict) and theta and all(isinstance(v, torch.Tensor) for v in theta.values()):
        return dict(theta), False
    raise TypeError("theta must be a tensor or a non-empty dict of tensors")


def _check_theta(theta: dict[str, torch.Tensor]) -> None:
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


def _scalar_values(vals, n: int, where: str) -> torch.Tensor:
    """``vals`` from ``n`` evaluations of f → ``[n]``; ``ValueError`` unless f returned one number per point."""
    vals = torch.as_tensor(vals)
    if vals.ndim == 0 or vals.shape[0] != n or vals[0].numel() != 1:
        per = tuple(vals.shape[1:]) if vals.ndim and vals.shape[0] == n else tuple(vals.shape)
        raise ValueError(f"f must return a scalar (one loss per parameter set), got shape {per} at {where}")
    if vals.is_complex() or vals.dtype == torch.bool:
        raise TypeError(f"f must return a real number, got dtype {vals.dtype} at {where}")
    vals = vals.reshape(n)
    if not all_finite(vals):
        raise ValueError(f"f returned NaN or inf at {where}")
    return vals


def _evaluate(f: Callable, stacked: dict[str, torch.Tensor], single: bool, vectorize: bool,
              chunk_size: int | None) -> torch.Tensor:
    """F on each of the stacked parameter sets → ``[n]`` (one vmap call, or a loop when not vectorizable)."""
    call = (lambda p: f(p[""])) if single else f
    n = next(iter(stacked.values())).shape[0]

    def checked(p):
        v = call(p)
        if isinstance(v, torch.Tensor) and not depends_on_vmap(v):
            raise ValueError("f returned the same value at every perturbed point under vmap: it does not depend on "
                             "the parameters it is given (a model evaluated with its own parameters instead of "
                             "through torch.func.functional_call, taskloss.utils.functional_loss or "
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
    return _scalar_values(vals, n, "a perturbed point")


def _value(f, theta: dict[str, torch.Tensor], single: bool) -> torch.Tensor:
    with torch.no_grad():
        v = torch.as_tensor(f(theta[""]) if single else f(theta))
    if v.numel() != 1:
        raise ValueError(f"f must return a scalar, got shape {tuple(v.shape)}")
    return _scalar_values(v.reshape(1), 1, "theta")[0]


def _combine(weights: torch.Tensor, dirs: dict[str, torch.Tensor], scale: float, single: bool):
    g = {k: torch.tensordot(weights.to(z.dtype), z, dims=1) * scale for k, z in dirs.items()}
    return g[""] if single else g


def _validate(f, sigma: float, n: int, generator, chunk_size, vectorize) -> tuple[float, int]:
    check_bool("vectorize", vectorize)
    if not callable(f):
        raise TypeError(f"f must be callable (theta -> scalar loss), got {type(f).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    return check_positive("sigma", sigma), check_int("n_samples", n, minimum=1)


# -------------------------------------------------------------------------------------------- estimators
def gaussian_smoothing_grad(f: Callable, theta, sigma: float, n_samples: int, *, baseline: str = "value",
                            generator: torch.Generator | None = None, vectorize: bool = True,
                            chunk_size: int | None = None, return_samples: bool = False):
    """Gradient of the Gaussian-smoothed objective ``E[f(θ + σε)]`` from function values.

    ``f``: θ ↦ scalar tensor (same structure as ``theta``: tensor or dict of tensors). ``n = n_samples``
    directions ``ε_i ~ N(0, I)``; ``F_i = f(θ + σε_i)`` evaluated in one ``vmap`` call (``vectorize=False``
    loops instead, for ``f`` that vmap cannot trace; ``chunk_size`` bounds vmap's memory). ``baseline``:

    * ``"none"``  — ``(1/nσ) Σ F_i ε_i`` (plain REINFORCE with the Gaussian score);
    * ``"value"`` — ``(1/nσ) Σ (F_i - f(θ)) ε_i`` (forward differences; one extra evaluation);
    * ``"loo"``   — ``(1/nσ) Σ (F_i - mean_{j≠i} F_j) ε_i`` (needs n ≥ 2; no extra evaluation);
    * ``"antithetic"`` — ``(1/2nσ) Σ (f(θ+σε_i) - f(θ-σε_i)) ε_i`` (central differences; 2n evaluations).

    All four are unbiased for ``∇ E[f(θ+σε)]``. Derived in notebook 05_policy_gradient_vs_zeroth_order.

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
    if baseline not in ("none", "value", "loo", "antithetic"):
        raise ValueError(f"baseline must be 'none', 'value', 'loo' or 'antithetic', got {baseline!r}")
    if baseline == "loo" and n < 2:
        raise ValueError("baseline='loo' needs n_samples >= 2")
    directions = _draw(th, n, "gaussian", generator)
    plus = _evaluate(f, {k: th[k] + sigma * e for k, e in directions.items()}, single, vectorize, chunk_size)
    if baseline == "antithetic":
        minus = _evaluate(f, {k: th[k] - sigma * e for k, e in directions.items()}, single, vectorize, chunk_size)
        w, values, scale = plus - minus, torch.stack([plus, minus]), 1.0 / (2 * n * sigma)
    else:
        values, scale = plus, 1.0 / (n * sigma)
        if baseline == "none":
            w = plus
        elif baseline == "value":
            w = plus - _value(f, th, single).to(plus)
        else:
            w = plus - (plus.sum() - plus) / (n - 1)
    g = _combine(w, directions, scale, single)
    if return_samples:
        return g, (directions[""] if single else directions), values
    return g


def spsa_grad(f: Callable, theta, sigma: float, n_samples: int = 1, *, generator: torch.Generator | None = None,
              vectorize: bool = True, chunk_size: int | None = None):
    """Simultaneous-perturbation stochastic approximation (SPSA) gradient estimate.

    ``δ_i`` with i.i.d. ±1 (Rademacher) entries; ``ĝ = (1/n) Σ (f(θ+σδ_i) - f(θ-σδ_i)) / (2σ) · δ_i``
    (``1/δ = δ`` for ±1 entries). Unbiased up to O(σ²) for smooth ``f`` since ``E[δδᵀ] = I``. Derived in notebook
    05_policy_gradient_vs_zeroth_order.

    Args:
        f: θ ↦ scalar tensor (same structure as ``theta``).
        theta: a tensor or a dict of tensors.
        sigma: the perturbation scale σ > 0.
        n_samples: the number of directions n ≥ 1.
        generator: the RNG of the directions.
        vectorize: evaluate the 2n points in one ``vmap`` (``False``: a loop).
        chunk_size: points per vmap call.

    Returns:
        ĝ, with the structure of ``theta``.

    Raises:
        TypeError: bad types (a non-callable ``f``, a flag that is not a bool).
        ValueError: bad values, NaN/inf in θ or in ``f``'s values.
    """
    sigma, n = _validate(f, sigma, n_samples, generator, chunk_size, vectorize)
    th, single = _as_dict(theta)
    _check_theta(th)
    d = _draw(th, n, "rademacher", generator)
    plus = _evaluate(f, {k: th[k] + sigma * z for k, z in d.items()}, single, vectorize, chunk_size)
    minus = _evaluate(f, {k: th[k] - sigma * z for k, z in d.items()}, single, vectorize, chunk_size)
    return _combine(plus - minus, d, 1.0 / (2 * n * sigma), single)


# --------------------------------------------------------------------------------------------------- MeZO
class MeZO(torch.optim.Optimizer):
    """Memory-efficient zeroth-order SGD: the memory of one model, no stored perturbation.

    After Malladi et al., *Fine-Tuning Language Models with Just Forward Passes* (NeurIPS 2023). Per perturbation k
    (``n_samples`` of them) with a fresh seed s_k: ``θ += σz``; ``L+ = closure()``; ``θ -= 2σz``;
    ``L- = closure()``; ``θ += σz`` (restore); ``g_k = (L+ - L-) / 2σ``. Then
    ``θ ← θ - lr · (mean_k g_k z_k + weight_decay · θ)`` with each ``z_k ~ N(0, I)`` regenerated from s_k
    parameter by parameter (one parameter-sized temporary at a time). Derived in notebook
    05_policy_gradient_vs_zeroth_order.

    ``step(closure)`` follows torch.optim except that the closure is evaluated at perturbed parameters:
    ``closure()`` must return the loss (no ``backward``; it runs under ``torch.no_grad()``), and ``step`` returns the
    first value it returned, ``L+`` of the first perturbation. Frozen parameters (``requires_grad=False``) are
    neither perturbed nor updated, and a parameter listed twice is one parameter. ``lr`` and ``weight_decay`` may
    differ between parameter groups; ``sigma`` and ``n_samples`` are shared by all groups (one perturbation moves
    every parameter). A closure that raises, returns a non-scalar or a NaN loss leaves the parameters restored (up
    to the rounding of θ + σz − σz).

    Args:
        params: parameters or parameter groups.
        lr: step size > 0.
        sigma: perturbation scale σ > 0.
        weight_decay: decoupled weight decay ≥ 0.
        n_samples: perturbations per step (≥ 1).
        seed: seed of the generator that draws the perturbations' seeds; :meth:`state_dict` carries its state, so
            a run restored into a fresh MeZO continues bit for bit.

    Raises:
        TypeError, ValueError: bad hyperparameters (at construction and, for ``param_groups`` edited since, at
            ``step``).
    """

    def __init__(self, params, lr: float = 1e-3, sigma: float = 1e-3, weight_decay: float = 0.0,
                 n_samples: int = 1, seed: int = 0):
        check_int("seed", seed, minimum=0)
        defaults = dict(lr=check_positive("lr", lr), sigma=check_positive("sigma", sigma),
                        weight_decay=check_nonnegative("weight_decay", weight_decay),
                        n_samples=check_int("n_samples", n_samples, minimum=1))
        super().__init__(params, defaults)
        self._seeds = torch.Generator().manual_seed(seed)
        self.last_projected_grads: list[float] = []

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with each tensor of the group kept once (by identity)."""
        super().add_param_group(distinct_param_group(param_group))

    def state_dict(self) -> dict:
        """``torch.optim`` state plus the seed generator's state.

        Loading it into a fresh MeZO over the same parameters continues the same perturbation sequence bit for bit.
        """
        out = super().state_dict()
        out["mezo"] = {"seed_generator": self._seeds.get_state().clone()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Inverse of :meth:`state_dict`.

        Args:
            state_dict: what :meth:`state_dict` returned.

        Raises:
            ValueError: a state without MeZO's generator state.
        """
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("mezo"), dict):
            raise ValueError("not a MeZO state_dict: the 'mezo' entry (seed generator state) is missing")
        state_dict = dict(state_dict)
        extra = state_dict.pop("mezo")
        gen_state = extra.get("seed_generator")
        if not isinstance(gen_state, torch.Tensor) or gen_state.dtype != torch.uint8:
            raise ValueError("MeZO state_dict: 'seed_generator' must be a uint8 tensor from Generator.get_state()")
        super().load_state_dict(state_dict)
        self._seeds.set_state(gen_state.clone())

    def _trained(self, group: dict) -> list[torch.Tensor]:
        return [p for p in group["params"] if p.requires_grad]

    def _add_z(self, seed: int, coef: Callable[[dict], float]) -> None:
        """``p += coef(group) · z`` for every trained parameter, ``z ~ N(0, I)`` regenerated from ``seed`` in a fixed
        parameter order (one generator per device), one parameter-sized temporary at a time."""
        gens: dict = {}
        for group in self.param_groups:
            c = coef(group)
            for p in self._trained(group):
                gen = gens.get(p.device)
                if gen is None:
                    gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
                z = torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype)
                p.add_(z, alpha=c)

    @staticmethod
    def _loss(closure) -> torch.Tensor:
        out = closure()
        if isinstance(out, bool) or not isinstance(out, (torch.Tensor, numbers.Real)):
            raise TypeError(f"MeZO closure must return a scalar loss (tensor or number), got {type(out).__name__}")
        v = torch.as_tensor(out).detach()
        if v.numel() != 1:
            raise ValueError(f"MeZO closure must return a scalar loss, got shape {tuple(v.shape)}")
        if v.is_complex() or v.dtype == torch.bool:
            raise TypeError(f"MeZO closure must return a real loss, got dtype {v.dtype}")
        return v.reshape(())

    def _shared(self, name: str, check) -> float:
        values = {group[name] for group in self.param_groups}
        if len(values) != 1:
            raise ValueError(f"MeZO needs one {name} shared by all parameter groups, got {sorted(values)}")
        return check(name, values.pop())

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor | float]) -> torch.Tensor:  # type: ignore[override]
        """One MeZO update (see the class docstring).

        Args:
            closure: returns the loss at the current (perturbed) parameters.

        Returns:
            ``L+`` of the first perturbation (the first value the closure returned).

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
        seeds, grads, first = [], [], None
        for _ in range(n):
            s = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            self._add_z(s, lambda gr: gr["sigma"])              # θ + σz
            try:
                lp = self._loss(closure)
            except BaseException:
                self._add_z(s, lambda gr: -gr["sigma"])         # back to θ before the error propagates
                raise
            self._add_z(s, lambda gr: -2 * gr["sigma"])         # θ - σz
            try:
                lm = self._loss(closure)
            finally:
                self._add_z(s, lambda gr: gr["sigma"])          # θ
            if not (bool(torch.isfinite(lp)) and bool(torch.isfinite(lm))):
                raise ValueError("closure returned NaN or inf; parameters restored, no update made")
            seeds.append(s)
            grads.append((float(lp) - float(lm)) / (2 * sigma))
            first = lp if first is None else first
        for group in self.param_groups:
            if group["weight_decay"] > 0:
                for p in self._trained(group):
                    p.mul_(1 - group["lr"] * group["weight_decay"])
        for s, g in zip(seeds, grads):
            self._add_z(s, lambda gr, g=g: -gr["lr"] * g / len(seeds))
        self.last_projected_grads = grads
        return first
