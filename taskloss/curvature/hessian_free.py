"""Conjugate gradients and Hessian-free optimization: truncated Gauss-Newton with CG on GGN-vector products and
Levenberg-Marquardt damping (after Martens, *Deep learning via Hessian-free optimization*, ICML 2010).

Derived in notebook 07_fisher_approximations. Follows the scale convention of :mod:`taskloss.curvature.fisher`
(the mean NLL of a categorical or unit-variance Gaussian likelihood).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from taskloss.curvature.distributed import (
    all_reduce_sum,
    check_process_group,
    failing_fast,
    refuse_sharded,
    world_size,
)
from taskloss.curvature.fisher import Likelihood, check_likelihood, ggn_operator
from taskloss.curvature.model_io import HALF, check_precision
from taskloss.parameter_vectors import flat_gradient, flatten, named_tensors, unflatten
from taskloss.validation import (
    all_finite,
    check_bool,
    check_finite,
    check_int,
    check_nonnegative,
    check_not_meta,
    check_positive,
    check_probability,
)

__all__ = ["conjugate_gradient", "hessian_free_direction", "HessianFree"]


# ------------------------------------------------------------------------------------ conjugate gradients
def _cg_setup(matvec, b, x0):
    """Flat right-hand side, a flat matvec that checks shape and finiteness, and the flat starting point."""
    if not callable(matvec):
        raise TypeError("matvec must be callable")
    as_dict = isinstance(b, Mapping)
    like = dict(b) if as_dict else None
    if as_dict:
        if not like:
            raise ValueError("b must be a non-empty flat tensor or a dict of tensors")
        bf = flatten(like)
    elif not isinstance(b, Tensor) or b.ndim != 1 or b.numel() == 0:
        raise ValueError("b must be a non-empty flat tensor [P] or a dict of tensors")
    else:
        bf = b
    if not bf.is_floating_point():
        raise TypeError(f"b must be floating point, got dtype {bf.dtype}")
    check_not_meta("b", bf)
    if bf.dtype in HALF:
        raise TypeError(f"b is {bf.dtype}: conjugate gradients accumulate dot products and residuals in b's dtype, "
                        "which float16 overflows and bfloat16 rounds to 3 digits; solve in float32 (b.float() and a "
                        "float32 matvec)")
    check_finite("b", bf)

    def mv(x, it):
        out = matvec(unflatten(x, like)) if as_dict else matvec(x)
        if as_dict:
            if not isinstance(out, Mapping) or out.keys() != like.keys():
                raise ValueError("matvec must return a dict with the keys of b")
            out = flatten(out)
        if not isinstance(out, Tensor) or out.shape != bf.shape:
            raise ValueError(f"matvec returned shape {tuple(getattr(out, 'shape', ()))} at iteration {it}, "
                             f"expected {tuple(bf.shape)}")
        return out

    if x0 is None:
        x = torch.zeros_like(bf)
    else:
        x = (flatten(x0) if as_dict else x0).detach().clone()
        if not isinstance(x, Tensor) or x.shape != bf.shape:
            raise ValueError(f"x0 has shape {tuple(x.shape)}, expected {tuple(bf.shape)}")
        check_finite("x0", x)
    return bf, mv, x, like


def conjugate_gradient(matvec: Callable, b, damping: float = 0.0, max_iter: int = 50, tol: float = 1e-10,
                       x0=None, *, truncated: bool = False, return_info: bool = False):
    """Solve ``(A + λI) x = b`` by conjugate gradients for a symmetric positive (semi-)definite ``A``.

    CG needs ``pᵀ(A + λI)p > 0`` along every search direction ``p``. A direction whose curvature is not
    positive — or is positive only at rounding level, ``pᵀ(A + λI)p ≤ ε_dtype · ρ_max · ‖p‖²`` with ``ρ_max``
    the largest Rayleigh quotient seen so far — means the operator is indefinite or singular along ``p``.

    Args:
        matvec: ``v ↦ A v`` (flat ``[P]`` tensors, or dicts with the keys and shapes of ``b``).
        b: right-hand side, a non-empty flat floating tensor ``[P]`` or a dict name → tensor; finite.
        damping: ``λ ≥ 0`` added to the diagonal (Tikhonov / Levenberg-Marquardt).
        max_iter: iteration budget (≥ 1).
        tol: stop when the residual ``‖r‖ ≤ tol · ‖b‖`` (≥ 0). ``tol=0`` disables the early stop: CG runs all
            ``max_iter`` iterations (stopping sooner only at an exactly zero residual or, when ``truncated``, a
            direction of non-positive curvature), as Hessian-free optimization with a fixed CG budget does. A solve
            (``truncated=False``) with ``tol=0`` then reports ``converged=False`` (and warns, without
            ``return_info``) unless the true residual is exactly zero.
        x0: warm start (same kind as ``b``); zeros by default.
        truncated: ``False`` (default) — a solve: a direction of non-positive curvature raises ``ValueError``
            and running out of iterations without meeting ``tol`` issues a ``RuntimeWarning`` (unless
            ``return_info``, whose ``info["converged"]`` reports it). The returned solution is checked with one
            extra product, the true residual ``‖b − (A + λI)x‖``. ``True`` — truncated CG as used by
            Hessian-free optimization (Martens, ICML 2010): stop at the first direction of non-positive curvature
            or after ``max_iter`` and return the iterate so far together with ``info`` (always).
        return_info: also return ``info`` (implied by ``truncated``).

    Returns:
        ``x`` (same kind as ``b``), or ``(x, info)`` with ``info = {"iterations", "residual_norm",
        "relative_residual", "converged", "stop", "curvature"}``; ``stop`` is ``"converged"``, ``"max_iter"``,
        ``"nonpositive_curvature"`` or ``"inaccurate"`` (the recursive residual met ``tol`` but the true one did not:
        a singular or, for this dtype, too ill-conditioned operator); ``curvature`` is ``pᵀ(A + λI)p`` of the direction
        where CG stopped, else ``None``.

    Raises:
        ValueError: bad arguments; ``matvec`` returning a wrong shape or NaN/inf; and, unless ``truncated``,
            non-positive curvature — the message names the iteration and ``pᵀ(A + λI)p``.
    """
    truncated = check_bool("truncated", truncated)
    return_info = check_bool("return_info", return_info)
    damping = check_nonnegative("damping", damping)
    check_int("max_iter", max_iter, minimum=1)
    tol = check_nonnegative("tol", tol)
    bf, mv, x, like = _cg_setup(matvec, b, x0)

    def A(v, it):                                       # the damped operator (A + λI) v
        return mv(v, it) + damping * v

    x, rs, it, stop, curvature = _cg_iterate(A, bf, x, x0 is not None, max_iter, tol, truncated)
    res, rel, converged, stop = _cg_check(A, bf, x, rs, it, stop, tol, truncated)
    info = {"iterations": it, "residual_norm": res, "relative_residual": rel, "converged": converged,
            "stop": stop, "curvature": curvature}
    if not truncated and not converged and not return_info:
        warnings.warn(f"conjugate_gradient did not converge ({stop}): relative residual {rel:.3e} > tol={tol:.1e} "
                      f"after {it} iterations (raise max_iter, add damping, or pass return_info=True to handle it)",
                      RuntimeWarning, stacklevel=2)
    out = unflatten(x, like) if like is not None else x
    return (out, info) if (return_info or truncated) else out


def _cg_iterate(A: Callable, b: Tensor, x: Tensor, warm: bool, max_iter: int, tol: float, truncated: bool):
    """The textbook iteration (Hestenes & Stiefel 1952; Nocedal & Wright, *Numerical Optimization*, Alg. 5.2) on the
    left, its guards on the right. Returns ``(x, rᵀr, iterations, stop, curvature)``."""
    r = b - A(x, 0) if warm else b.clone()                         # r₀ = b − A x₀
    p, rs = r.clone(), torch.dot(r, r)                              # p₀ = r₀
    b_norm, eps, rayleigh_max, it = float(b.norm()), torch.finfo(b.dtype).eps, 0.0, 0
    if b_norm == 0.0:                                               # guard: b = 0 is solved by x = 0
        return x.zero_(), torch.zeros_like(rs), 0, "converged", None
    while True:
        if math.sqrt(float(rs)) <= tol * b_norm:                    # ‖r‖ ≤ tol · ‖b‖
            return x, rs, it, "converged", None
        if it == max_iter:                                          # guard: the budget
            return x, rs, it, "max_iter", None
        ap = A(p, it)
        pap, pp = float(torch.dot(p, ap)), float(torch.dot(p, p))
        if _nonpositive_curvature(pap, pp, eps * rayleigh_max, it, truncated):   # guard: pᵀAp > 0 needed
            return x, rs, it, "nonpositive_curvature", pap
        rayleigh_max = max(rayleigh_max, pap / pp)
        alpha = float(rs) / pap                                     # α = rᵀr / pᵀAp
        x.add_(p, alpha=alpha)                                      # x ← x + α p
        r.sub_(ap, alpha=alpha)                                     # r ← r − α A p
        rs_new = torch.dot(r, r)
        p = r + (rs_new / rs) * p                                   # p ← r + β p,  β = r'ᵀr' / rᵀr
        rs, it = rs_new, it + 1


def _nonpositive_curvature(pap: float, pp: float, floor: float, it: int, truncated: bool) -> bool:
    """``True`` when ``pᵀAp`` is not positive beyond rounding (``≤ ε · ρ_max · ‖p‖²``): truncated CG stops there, a
    solve raises; NaN/inf from ``matvec`` always raises."""
    if not math.isfinite(pap):
        raise ValueError(f"conjugate_gradient: matvec returned NaN or inf at iteration {it} (pᵀ(A + λI)p = {pap})")
    if pap > floor * pp:
        return False
    if truncated:
        return True
    raise ValueError(
        f"conjugate_gradient: non-positive curvature pᵀ(A + λI)p = {pap:.3e} (‖p‖² = {pp:.3e}) at iteration "
        f"{it}: the operator is indefinite or singular along the search direction. Add damping, check "
        "that matvec is symmetric positive semi-definite, or pass truncated=True to stop there and get "
        "the iterate with its info")


def _cg_check(A: Callable, b: Tensor, x: Tensor, rs: Tensor, it: int, stop: str, tol: float, truncated: bool):
    """The solution's residual — for a solve the true one, ``‖b − (A + λI)x‖`` (one extra product), not the
    recursive one — and whether it met ``tol``: ``(residual, relative residual, converged, stop)``."""
    b_norm, eps = float(b.norm()), torch.finfo(b.dtype).eps
    res = math.sqrt(float(rs))
    if not truncated and b_norm > 0:
        res = float((b - A(x, it)).norm())
    if not math.isfinite(res) or not all_finite(x):
        raise ValueError("conjugate_gradient produced non-finite values (is the operator PSD and finite?)")
    rel = res / b_norm if b_norm > 0 else 0.0
    converged = stop == "converged"
    if not truncated:  # the recursive residual drifts from the true one by rounding: allow 100·tol (or 1000·ε)
        converged = rel <= tol or (converged and rel <= max(100 * tol, 1000 * eps))
        if stop == "converged" and not converged:
            stop = "inaccurate"  # singular or too ill-conditioned for this dtype
    return res, rel, converged, stop


def hessian_free_direction(model_or_fn, params, inputs, grad, likelihood: Likelihood = "categorical",
                           damping: float = 1e-3, cg_iters: int = 50, tol: float = 1e-10, x0=None,
                           return_info: bool = False, *, mask=None):
    """Hessian-free natural gradient ``d ≈ (G + λI)⁻¹ grad`` by CG on GGN-vector products (a checked solve).

    Args:
        model_or_fn: the model of the GGN, as in :func:`taskloss.curvature.fisher.ggn_operator`.
        params: its parameters, as there.
        inputs: the GGN batch, as there.
        grad: flat ``[P]`` or a dict like ``params``.
        likelihood: as in :func:`~taskloss.curvature.fisher.ggn_operator`.
        damping: ``λ > 0``.
        cg_iters: as ``max_iter`` of :func:`conjugate_gradient`.
        tol: as ``tol`` there.
        x0: as ``x0`` there (a warm start).
        return_info: also return CG's ``info`` (otherwise running out of iterations warns).
        mask: the loss terms that count, as there.

    Returns:
        ``d`` (same kind as ``grad``; the update is ``θ ← θ − lr · d``), or ``(d, info)``.
    """
    return_info = check_bool("return_info", return_info)
    check_positive("damping", damping)
    return conjugate_gradient(ggn_operator(model_or_fn, params, inputs, likelihood, mask=mask), grad, damping=damping,
                              max_iter=cg_iters, tol=tol, x0=x0, return_info=return_info)


# ------------------------------------------------------------------------------------------------ optimizers
def _weighted_sum(x: Tensor, n_terms: tuple[int, int], process_group) -> Tensor:
    """``Σ_r (n_r / n) x_r`` over the ranks, for ``n_terms = (n_r, n)``: one all-reduce."""
    local, total = n_terms
    return all_reduce_sum([x * (local / total)], process_group)[0]


class HessianFree(torch.optim.Optimizer):
    """Hessian-free natural gradient (truncated Gauss-Newton), after Martens, "Deep learning via Hessian-free
    optimization" (ICML 2010). Derived in notebook 07_fisher_approximations.

    One step solves ``(G + λI) d = g`` by truncated CG (:func:`conjugate_gradient` with ``truncated=True``,
    warm-started at ``warm_start · d_prev``), sets ``θ ← θ − lr·d`` and, with ``adapt_damping``, re-evaluates the
    loss: ``ρ = ΔL / q(−lr·d)`` (``q`` the undamped quadratic model) updates λ Levenberg-Marquardt style
    (ρ > ¾ → λ·⅔; ρ < ¼ → λ·3/2) and a step that raises the loss is undone.

    ``step(closure)`` follows torch.optim: ``closure()`` zeroes the gradients, computes the mean NLL (the
    convention of :mod:`taskloss.curvature.fisher`), calls ``backward()`` and returns ``(loss, inputs)``: the GGN
    needs the model's inputs (a tensor, or a mapping of keyword tensors for a Hugging Face model; ``(inputs, mask)``
    with a mask of the loss terms that count, e.g. ``labels != -100`` of a causal LM), which a loss alone does not
    expose, and returning the data a method needs besides
    the gradient is the package's one way of passing it (:class:`taskloss.search.mgs.MGS` gets its batch the same
    way). The closure is called twice per step when ``adapt_damping``; ``step`` returns the first loss.

    ``param_groups``: each group may carry its own ``lr`` (a learning-rate scheduler works); ``damping``,
    ``cg_iters``, ``cg_tol``, ``warm_start`` and ``min_damping`` are those of the one CG solve over all
    parameters, so they must agree between groups (``damping`` is adapted in every group). Frozen parameters
    (``requires_grad=False``) are not solved for and do not move; a parameter listed twice is one parameter.

    Args:
        params: the parameters (tensors of ``model_fn``, ``(name, tensor)`` pairs, a dict, or parameter groups of
            tensors of the module ``model_fn``).
        model_fn: the ``nn.Module`` owning ``params`` (it may return a ``ModelOutput``) or
            ``fn(params_dict, inputs) → outputs [N, C]`` (or per-token ``[N, T, C]``).
        lr: the step size (default of the groups).
        damping: the initial λ > 0.
        cg_iters: CG iterations per step.
        cg_tol: CG's relative residual tolerance (≥ 0; ``0`` runs all ``cg_iters`` iterations every step).
        likelihood: ``"categorical"`` or ``"gaussian"``.
        adapt_damping: Levenberg-Marquardt adaptation of λ (and undoing of steps that raise the loss).
        warm_start: the factor on the previous direction CG starts from.
        min_damping: the floor of the adapted λ.
        process_group: the ``torch.distributed`` ranks whose batches make one batch (``None``: the default group
            when initialized, else this process alone). Each rank's closure runs on its local batch with the plain
            module (not a ``DistributedDataParallel`` wrapper: the step combines the gradients itself); the
            gradient and the loss are the concatenated batch's (each rank's mean weighted by its loss terms, one
            all-reduce), each GGN-vector product one all-reduce (:func:`~taskloss.curvature.fisher.ggn_operator`),
            and CG, the damping adaptation and the step are then the same on every rank.

    ``state_dict()`` holds λ and the previous direction, so a restored optimizer continues bit-identically.
    ``last_info`` holds CG's info of the last step and ``loss``, ``damping``, ``rho``, ``new_loss``, ``accepted``.

    Raises:
        TypeError: a bad ``model_fn`` or flag; float16 / bfloat16 parameters.
        ValueError: bad hyperparameters; at ``step``, a closure that does not return ``(loss, inputs)``.
        FloatingPointError: a non-finite loss.
    """

    SHARED = ("damping", "cg_iters", "cg_tol", "warm_start", "min_damping")

    def __init__(self, params, model_fn, *, lr: float = 1.0, damping: float = 1.0, cg_iters: int = 20,
                 cg_tol: float = 1e-6, likelihood: Likelihood = "categorical", adapt_damping: bool = True,
                 warm_start: float = 0.95, min_damping: float = 1e-8, process_group=None):
        if not callable(model_fn):
            raise TypeError("model_fn must be an nn.Module or a callable fn(params, inputs)")
        if isinstance(model_fn, DistributedDataParallel):
            raise TypeError("HessianFree combines the ranks' gradients itself: pass the module inside the "
                            "DistributedDataParallel wrapper (model_fn=ddp.module) and process_group=")
        if isinstance(model_fn, nn.Module):
            refuse_sharded(model_fn, "HessianFree")
        self.process_group = check_process_group(process_group)
        check_likelihood(likelihood)
        self.model_fn, self.likelihood = model_fn, likelihood
        self.adapt_damping = check_bool("adapt_damping", adapt_damping)
        self._names: dict[int, str] = {}
        if not isinstance(params, Mapping):
            params = list(params)
        groups = params if params and all(isinstance(g, dict) for g in params) else [{"params": params}]
        defaults = dict(lr=check_positive("lr", lr), damping=check_positive("damping", damping),
                        cg_iters=check_int("cg_iters", cg_iters, minimum=1), cg_tol=check_nonnegative("cg_tol", cg_tol),
                        warm_start=check_probability("warm_start", warm_start),
                        min_damping=check_positive("min_damping", min_damping))
        super().__init__(groups, defaults)
        self.last_info: dict = {}

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim``'s, with the tensors named (for the GGN) and each kept once (by identity); float16 /
        bfloat16 and meta tensors are refused (the GGN products and CG run in the parameters' dtype)."""
        names, tensors = named_tensors(param_group["params"], self.model_fn)
        for k, p in zip(names, tensors):
            check_not_meta(f"parameter {k!r}", p)
            check_precision(f"parameter {k!r}", p)
        fresh = [(k, p) for k, p in zip(names, tensors) if id(p) not in self._names]
        for k, p in fresh:
            self._names[id(p)] = k
        super().add_param_group({**param_group, "params": [p for _, p in fresh]})

    @staticmethod
    def _call(closure, finite: bool = True):
        with torch.enable_grad():
            out = closure()
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError("HessianFree's closure must return (loss, inputs): the loss it called backward() on "
                             "and the inputs of the GGN batch")
        loss, inputs = out
        mask = None
        if isinstance(inputs, tuple) and len(inputs) == 2:
            inputs, mask = inputs
        if not isinstance(inputs, (Tensor, Mapping)):
            raise TypeError("the GGN inputs returned by the closure must be a tensor, a mapping of keyword tensors or "
                            f"a pair (inputs, mask), got {type(inputs).__name__}")
        value = torch.as_tensor(loss).detach()
        if value.numel() != 1:
            raise ValueError(f"closure must return a scalar loss, got shape {tuple(value.shape)}")
        value = float(value)
        if finite and not math.isfinite(value):
            raise FloatingPointError(f"closure returned a non-finite loss ({value})")
        return loss, value, (inputs, mask)

    def _shared(self) -> dict:
        """The solver hyperparameters, equal in every group, checked."""
        out = {}
        for key in self.SHARED:
            values = {g[key] for g in self.param_groups}
            if len(values) != 1:
                raise ValueError(f"HessianFree solves one CG system over all parameters: {key} must be the same in "
                                 f"every parameter group, got {sorted(values)}")
            out[key] = values.pop()
        check_positive("damping", out["damping"])
        check_int("cg_iters", out["cg_iters"], minimum=1)
        for g in self.param_groups:
            check_positive("lr", g["lr"])
        return out

    def _global_gradient(self, g: Tensor, value: float, n_terms: tuple[int, int]) -> tuple[Tensor, float]:
        """The concatenated batch's gradient and loss from this rank's means over its terms (one all-reduce)."""
        both = torch.cat([g, g.new_tensor([value])])
        both = _weighted_sum(both, n_terms, self.process_group)
        return both[:-1], float(both[-1])

    @torch.no_grad()
    def step(self, closure):  # type: ignore[override]
        """One Hessian-free step (see the class docstring).

        Args:
            closure: zeroes the gradients, computes the loss, calls ``backward()``, returns ``(loss, inputs)``.

        Returns:
            The loss the closure returned first (before the step).

        Raises:
            ValueError: no closure, a bad closure result, bad hyperparameters in ``param_groups``.
            FloatingPointError: a non-finite loss before the step.
            RankFailure: across ranks, any rank's failure before the first all-reduce (raised on every rank).
        """
        with failing_fast("HessianFree.step", self.process_group):
            return self._step(closure)

    def _step(self, closure):
        if not callable(closure):
            raise ValueError("HessianFree.step needs closure() (zeroes grads, computes the loss, calls backward, "
                             "returns (loss, inputs))")
        h = self._shared()
        live = [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not live:
            raise ValueError("HessianFree has no parameter with requires_grad=True to step")
        ps = [p for _, p in live]
        loss, value, (inputs, mask) = self._call(closure)
        g = flat_gradient(ps)
        params = {self._names[id(p)]: p.detach() for p in ps}
        op = ggn_operator(self.model_fn, params, inputs, self.likelihood, mask=mask, process_group=self.process_group)
        if world_size(self.process_group) > 1:
            g, value = self._global_gradient(g, value, op.n_terms)
        check_finite("gradient", g)
        state = self.state[ps[0]]
        x0 = state["direction"] * h["warm_start"] if "direction" in state else None
        d, info = conjugate_gradient(op, g, damping=h["damping"], max_iter=h["cg_iters"], tol=h["cg_tol"], x0=x0,
                                     truncated=True)
        state["direction"] = d
        lrs = [grp["lr"] for grp, _ in live]
        one_lr = len(set(lrs)) == 1
        if one_lr:
            lr = lrs[0]
            scaled = None
        else:   # each group's learning rate on its own coordinates
            scaled = d * torch.cat([torch.full((p.numel(),), r, dtype=d.dtype, device=d.device)
                                    for r, p in zip(lrs, ps)])
        if self.adapt_damping:  # the quadratic model q(−lr·d) at the current parameters (before they move)
            if one_lr:
                predicted = float(-lr * torch.dot(g, d) + 0.5 * lr**2 * torch.dot(d, op(d)))
            else:
                predicted = float(-torch.dot(g, scaled) + 0.5 * torch.dot(scaled, op(scaled)))
        views = unflatten(d if one_lr else scaled, ps)
        for p, v in zip(ps, views):
            p.sub_(lr * v if one_lr else v)
        info.update(loss=value, damping=h["damping"])
        if self.adapt_damping:
            new_loss = self._call(closure, finite=False)[1]  # NaN: the step is undone below
            if world_size(self.process_group) > 1:
                new_loss = float(_weighted_sum(torch.tensor([new_loss], dtype=torch.float64), op.n_terms,
                                               self.process_group))
            rho = (new_loss - value) / predicted if predicted < 0 else -1.0
            damping = h["damping"]
            if rho > 0.75:
                damping = max(damping * 2 / 3, h["min_damping"])
            elif rho < 0.25:
                damping *= 1.5
            for grp in self.param_groups:
                grp["damping"] = damping
            if not (new_loss <= value):  # undo a step that did not decrease the loss (also catches NaN)
                for p, v in zip(ps, views):
                    p.add_(lr * v if one_lr else v)
                state["direction"] = torch.zeros_like(d)
            info.update(rho=rho, new_loss=new_loss, accepted=new_loss <= value)
        self.last_info = info
        return loss
