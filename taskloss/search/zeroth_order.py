"""Zeroth-order optimization: sample *parameters*, use loss values only.

Gaussian smoothing replaces ``f`` by ``f_σ(θ) = E_{ε~N(0,I)}[f(θ + σε)]``, whose gradient is

.. math::  \\nabla f_\\sigma(\\theta) = \\frac{1}{\\sigma}\\,\\mathbb{E}[f(\\theta+\\sigma\\varepsilon)\\,\\varepsilon]
           = \\frac{1}{\\sigma}\\,\\mathbb{E}[(f(\\theta+\\sigma\\varepsilon) - b)\\,\\varepsilon]

— exactly REINFORCE with the score ``ε/σ`` of the search distribution ``N(θ, σ²I)``, so any baseline ``b``
independent of ``ε`` keeps it unbiased. Estimators here (``n`` perturbations, evaluated in one batched call
with ``torch.func.vmap`` over stacked parameter sets where ``f`` allows it):

* :func:`gaussian_smoothing_grad` — ``baseline="none" | "value" (f(θ), forward differences) | "loo"``
  (leave-one-out mean), or ``"antithetic"`` (central differences ``(f(θ+σε) - f(θ-σε)) ε / 2σ``);
* :func:`spsa_grad` — simultaneous perturbation with Rademacher directions;
* :class:`MeZO` — the memory-of-one-model optimizer: perturb in place, regenerate the noise from a seed.

``θ`` may be a tensor or a dict of tensors (e.g. ``dict(model.named_parameters())``); :func:`functional_loss`
turns ``(model, loss_fn, inputs)`` into such an ``f`` via ``torch.func.functional_call``.

Derived in notebook 05_policy_gradient_vs_zeroth_order.
"""
from __future__ import annotations

import numbers
from typing import Callable

import torch
from torch.func import functional_call, vmap

from taskloss.utils import all_finite, check_int, check_nonnegative, check_positive

__all__ = ["functional_loss", "gaussian_smoothing_grad", "spsa_grad", "MeZO"]

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
    """f on each of the stacked parameter sets → ``[n]`` (one vmap call, or a loop when not vectorizable)."""
    call = (lambda p: f(p[""])) if single else f
    n = next(iter(stacked.values())).shape[0]
    with torch.no_grad():
        if vectorize:
            try:
                vals = vmap(call, chunk_size=chunk_size, randomness="different")(stacked)
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


def _validate(f, sigma: float, n: int, generator, chunk_size, name: str = "sigma") -> tuple[float, int]:
    if not callable(f):
        raise TypeError(f"f must be callable (theta -> scalar loss), got {type(f).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    return check_positive(name, sigma), check_int("num_samples", n, minimum=1)


def functional_loss(model: torch.nn.Module, loss_fn: Callable, *args, **kwargs):
    """``(f, theta)`` with ``theta = {name: detached parameter}`` and
    ``f(params) = loss_fn(functional_call(model, params, args, kwargs))`` — a pure function of the parameters
    that :func:`gaussian_smoothing_grad` / :func:`spsa_grad` can vmap over. ``loss_fn`` maps the model output
    to a scalar tensor (e.g. ``lambda logits: 1 - (logits.argmax(-1) == y).float().mean()``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable")
    theta = {k: p.detach() for k, p in model.named_parameters()}

    def f(params):
        return loss_fn(functional_call(model, params, args, kwargs))

    return f, theta


# -------------------------------------------------------------------------------------------- estimators
def gaussian_smoothing_grad(f: Callable, theta, sigma: float, num_samples: int, *, baseline: str = "value",
                            generator: torch.Generator | None = None, vectorize: bool = True,
                            chunk_size: int | None = None, return_samples: bool = False):
    """Gradient of the Gaussian-smoothed objective ``E[f(θ + σε)]`` from function values.

    ``f``: θ ↦ scalar tensor (same structure as ``theta``: tensor or dict of tensors). ``n = num_samples``
    directions ``ε_i ~ N(0, I)``; ``F_i = f(θ + σε_i)`` evaluated in one ``vmap`` call (``vectorize=False``
    loops instead, for ``f`` that vmap cannot trace; ``chunk_size`` bounds vmap's memory). ``baseline``:

    * ``"none"``  — ``(1/nσ) Σ F_i ε_i`` (plain REINFORCE with the Gaussian score);
    * ``"value"`` — ``(1/nσ) Σ (F_i - f(θ)) ε_i`` (forward differences; one extra evaluation);
    * ``"loo"``   — ``(1/nσ) Σ (F_i - mean_{j≠i} F_j) ε_i`` (needs n ≥ 2; no extra evaluation);
    * ``"antithetic"`` — ``(1/2nσ) Σ (f(θ+σε_i) - f(θ-σε_i)) ε_i`` (central differences; 2n evaluations).

    All four are unbiased for ``∇ E[f(θ+σε)]``. Returns the gradient (same structure as ``theta``), plus
    ``(eps, values)`` when ``return_samples`` (``eps``: stacked ``[n, ...]`` directions, ``values``: ``[n]``
    — or ``[2, n]`` for ``+``/``-`` in the antithetic case).
    """
    sigma, n = _validate(f, sigma, num_samples, generator, chunk_size)
    th, single = _as_dict(theta)
    _check_theta(th)
    if baseline not in ("none", "value", "loo", "antithetic"):
        raise ValueError(f"baseline must be 'none', 'value', 'loo' or 'antithetic', got {baseline!r}")
    if baseline == "loo" and n < 2:
        raise ValueError("baseline='loo' needs num_samples >= 2")
    eps = _draw(th, n, "gaussian", generator)
    plus = _evaluate(f, {k: th[k] + sigma * e for k, e in eps.items()}, single, vectorize, chunk_size)
    if baseline == "antithetic":
        minus = _evaluate(f, {k: th[k] - sigma * e for k, e in eps.items()}, single, vectorize, chunk_size)
        w, values, scale = plus - minus, torch.stack([plus, minus]), 1.0 / (2 * n * sigma)
    else:
        values, scale = plus, 1.0 / (n * sigma)
        if baseline == "none":
            w = plus
        elif baseline == "value":
            w = plus - _value(f, th, single).to(plus)
        else:
            w = plus - (plus.sum() - plus) / (n - 1)
    g = _combine(w, eps, scale, single)
    if return_samples:
        return g, (eps[""] if single else eps), values
    return g


def spsa_grad(f: Callable, theta, eps: float, num_samples: int = 1, *, generator: torch.Generator | None = None,
              vectorize: bool = True, chunk_size: int | None = None):
    """Simultaneous-perturbation stochastic approximation (SPSA) gradient estimate.

    ``δ_i`` with i.i.d. ±1 (Rademacher) entries; ``ĝ = (1/n) Σ (f(θ+εδ_i) - f(θ-εδ_i)) / (2ε) · δ_i``
    (``1/δ = δ`` for ±1 entries). Unbiased up to O(ε²) for smooth ``f`` since ``E[δδᵀ] = I``.
    """
    eps, n = _validate(f, eps, num_samples, generator, chunk_size, "eps")
    th, single = _as_dict(theta)
    _check_theta(th)
    d = _draw(th, n, "rademacher", generator)
    plus = _evaluate(f, {k: th[k] + eps * z for k, z in d.items()}, single, vectorize, chunk_size)
    minus = _evaluate(f, {k: th[k] - eps * z for k, z in d.items()}, single, vectorize, chunk_size)
    return _combine(plus - minus, d, 1.0 / (2 * n * eps), single)


# --------------------------------------------------------------------------------------------------- MeZO
class MeZO(torch.optim.Optimizer):
    """Memory-efficient zeroth-order SGD (in the spirit of *Fine-Tuning Language Models with Just Forward
    Passes*): the memory of one model, no stored perturbation.

    Per perturbation k (``num_perturbations`` of them) with a fresh seed s_k: ``θ += εz``; ``L+ = closure()``;
    ``θ -= 2εz``; ``L- = closure()``; ``θ += εz`` (restore); ``g_k = (L+ - L-) / 2ε``. Then
    ``θ ← θ - lr · (mean_k g_k z_k + weight_decay · θ)`` with each ``z_k ~ N(0, I)`` regenerated from s_k
    parameter by parameter (one parameter-sized temporary at a time). ``closure()`` must return the loss
    (no ``backward``); it runs under ``torch.no_grad()``. ``step`` returns ``L+`` of the first perturbation.
    ``seed`` makes the sequence of perturbations reproducible, and :meth:`state_dict` carries the seed generator's
    state, so a run restored into a fresh MeZO continues bit for bit. A closure that raises, returns a non-scalar
    or a NaN loss leaves the parameters restored (up to the rounding of θ + εz − εz).
    """

    def __init__(self, params, lr: float = 1e-3, eps: float = 1e-3, weight_decay: float = 0.0,
                 num_perturbations: int = 1, seed: int = 0):
        check_positive("lr", lr)
        check_positive("eps", eps)
        check_nonnegative("weight_decay", weight_decay)
        check_int("num_perturbations", num_perturbations, minimum=1)
        check_int("seed", seed, minimum=0)
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))
        self.num_perturbations = num_perturbations
        self._seeds = torch.Generator().manual_seed(seed)
        self.last_projected_grads: list[float] = []

    def state_dict(self) -> dict:
        """``torch.optim`` state plus the seed generator's state and ``num_perturbations``: loading it into a
        fresh MeZO over the same parameters continues the same perturbation sequence bit for bit."""
        out = super().state_dict()
        out["mezo"] = {"seed_generator": self._seeds.get_state().clone(),
                       "num_perturbations": self.num_perturbations}
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Inverse of :meth:`state_dict`; ``ValueError`` for a state without MeZO's generator state."""
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("mezo"), dict):
            raise ValueError("not a MeZO state_dict: the 'mezo' entry (seed generator state) is missing")
        state_dict = dict(state_dict)
        extra = state_dict.pop("mezo")
        gen_state = extra.get("seed_generator")
        if not isinstance(gen_state, torch.Tensor) or gen_state.dtype != torch.uint8:
            raise ValueError("MeZO state_dict: 'seed_generator' must be a uint8 tensor from Generator.get_state()")
        n = check_int("num_perturbations", extra.get("num_perturbations"), minimum=1)
        super().load_state_dict(state_dict)
        self._seeds.set_state(gen_state.clone())
        self.num_perturbations = n

    def _add_z(self, seed: int, coef: Callable[[dict], float]) -> None:
        """``p += coef(group) · z`` for every parameter, ``z ~ N(0, I)`` regenerated from ``seed`` in a fixed
        parameter order (one generator per device), one parameter-sized temporary at a time."""
        gens: dict = {}
        for group in self.param_groups:
            c = coef(group)
            for p in group["params"]:
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

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor | float]) -> torch.Tensor:
        """One MeZO update (see the class docstring); returns ``L+`` of the first perturbation. The parameters
        are restored before any error propagates (a failing closure, a non-scalar or NaN loss)."""
        if closure is None or not callable(closure):
            raise ValueError("MeZO.step needs a closure that returns the loss")
        eps_groups = {group["eps"] for group in self.param_groups}
        if len(eps_groups) != 1:
            raise ValueError("MeZO needs one eps shared by all parameter groups")
        eps = check_positive("eps", eps_groups.pop())
        for group in self.param_groups:
            check_positive("lr", group["lr"])
            check_nonnegative("weight_decay", group["weight_decay"])
        seeds, grads, first = [], [], None
        for _ in range(self.num_perturbations):
            s = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            self._add_z(s, lambda gr: gr["eps"])              # θ + εz
            try:
                lp = self._loss(closure)
            except BaseException:
                self._add_z(s, lambda gr: -gr["eps"])         # back to θ before the error propagates
                raise
            self._add_z(s, lambda gr: -2 * gr["eps"])         # θ - εz
            try:
                lm = self._loss(closure)
            finally:
                self._add_z(s, lambda gr: gr["eps"])          # θ
            if not (bool(torch.isfinite(lp)) and bool(torch.isfinite(lm))):
                raise ValueError("closure returned NaN or inf; parameters restored, no update made")
            seeds.append(s)
            grads.append((float(lp) - float(lm)) / (2 * eps))
            first = lp if first is None else first
        for group in self.param_groups:
            if group["weight_decay"] > 0:
                for p in group["params"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
        for s, g in zip(seeds, grads):
            self._add_z(s, lambda gr, g=g: -gr["lr"] * g / len(seeds))
        self.last_projected_grads = grads
        return first
