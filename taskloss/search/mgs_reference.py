"""One MGS step written plainly: the readable reference beside the tuned :class:`taskloss.search.mgs.MGS`.

Derived in notebook 02_importance_sampling_and_mgs. The step is the chain notebooks 01 and 02 teach: draw candidate
updates from the MLE-guided mixture q, score them by the task loss, and average them with the self-normalized
weights of :func:`taskloss.sampling.update.self_normalized_is` (log target −l(θ+Δθ_k)/α; l(θ) cancels). It follows
the fast path's conventions — the same seeds per candidate (:func:`taskloss.search.mgs_density.candidate_seeds`),
the same components (:func:`taskloss.search.mgs_density.mle_components`), one ``randn`` per tensor in parameter
order, σ_t and the clipping as there — so the two take the same step up to float rounding (the fast path reduces
the noise to float64 statistics and combines the weights on Python floats; ``tests/search/test_mgs_reference.py``
holds them equal), as torch.optim's ``_single_tensor_adam`` stands beside its foreach kernel. It is for reading and
testing: one forward per candidate on a copy of the parameters, no buffers kept, no vmap, no ranks.
"""
from __future__ import annotations

import torch
from torch import nn

from taskloss.parameter_vectors import flatten, unflatten
from taskloss.sampling.update import SNISResult, self_normalized_is
from taskloss.search.functional import call_with_parameters
from taskloss.search.mgs import GRAD_NORM_EPS
from taskloss.search.mgs_density import candidate_seeds, mixture_log_density, mle_components
from taskloss.search.mgs_scoring import default_forward
from taskloss.validation import check_int, check_not_meta, check_positive, eval_mode

__all__ = ["mgs_step_reference"]


def mgs_step_reference(model: nn.Module, optimizer: torch.optim.Optimizer, closure, task_loss_fn, *, seed: int,
                       step: int = 0, n_samples: int = 4, alpha: float = 0.01, sigma: float = 1.0,
                       sigma_mode: str = "relative", mix: float = 0.5, include_mle: bool = False,
                       density: str = "flat", assignment: str = "random", max_grad_norm: float | None = 1.0,
                       max_update_norm: float | None = 1.0, lr: float = 1.0, forward_fn=default_forward,
                       scoring_eval_mode: bool = True) -> tuple[torch.Tensor, SNISResult]:
    """Step ``step`` of :class:`~taskloss.search.mgs.MGS` with base seed ``seed``, written plainly (its arguments are
    checked at entry as MGS checks them; the numbers of a valid call are not).

    Args:
        model: the model; its trainable parameters are searched.
        optimizer: applies ``p.grad = −lr·Δθ*``.
        closure: as for ``MGS.step``: surrogate loss, ``backward()``, returns ``(loss, batch)``.
        task_loss_fn: ``(outputs, batch) → scalar``.
        seed: MGS's base seed.
        step: the step counter (the noise of step s comes from (seed, s, k)).
        n_samples: as MGS's hyperparameter of the same name.
        alpha: as MGS's.
        sigma: as MGS's.
        sigma_mode: as MGS's.
        mix: as MGS's.
        include_mle: as MGS's.
        density: as MGS's.
        assignment: as MGS's.
        max_grad_norm: as MGS's.
        max_update_norm: as MGS's.
        lr: as MGS's.
        forward_fn: as MGS's.
        scoring_eval_mode: MGS's ``eval_mode``.

    Returns:
        ``(loss, res)``: the closure's loss and the SNIS result over the candidates (``res.estimate`` is Δθ*
        before clipping, ``res.samples`` the ``[K', P]`` candidates Δθ_k).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    for name, fn in (("closure", closure), ("task_loss_fn", task_loss_fn), ("forward_fn", forward_fn)):
        if not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    check_int("seed", seed, minimum=0)
    check_int("step", step, minimum=0)
    check_int("n_samples", n_samples, minimum=1)
    check_positive("alpha", alpha)
    check_positive("lr", lr)
    check_not_meta("model", model)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("model has no trainable parameters")
    for p in params.values():
        p.grad = None
    with torch.enable_grad():                                            # 1. g = ∇l̃(θ), clipped
        loss, batch = closure()
    g = flatten([torch.zeros_like(p) if p.grad is None else p.grad for p in params.values()]).detach()
    norm = float(torch.linalg.vector_norm(g.double()))
    if max_grad_norm is not None and norm > max_grad_norm:
        g = g * (max_grad_norm / (norm + GRAD_NORM_EPS))
    gs = unflatten(g, params)                                            # 2. candidates Δθ_k ~ q, from their seeds
    sig = [sigma * float(t.double().abs().sum()) / t.numel() if sigma_mode == "relative" else sigma
           for t in gs.values()]
    seeds = candidate_seeds(seed, step, n_samples + int(include_mle))
    mle = mle_components(seeds, mix, assignment, include_mle)
    deltas = []
    for k, s in enumerate(seeds):
        gen = torch.Generator(device=g.device).manual_seed(s)
        deltas.append(flatten([-t if include_mle and k == 0 else torch.randn(t.shape, generator=gen, device=t.device,
                               dtype=t.dtype) * st - (t if mle[k] else 0) for t, st in zip(gs.values(), sig)]))
    D, theta = torch.stack(deltas), flatten([p.detach() for p in params.values()])
    with torch.no_grad(), eval_mode(model, scoring_eval_mode):          # 3. task losses l(θ + Δθ_k)
        losses = torch.stack([torch.as_tensor(call_with_parameters(                # the whole call at θ + Δθ_k
            model, unflatten(theta + d, params), lambda m: task_loss_fn(forward_fn(m, batch), batch)))
            .double().reshape(()) for d in D])
    log_q = mixture_log_density([x.reshape(len(D), *t.shape) for x, t in zip(D.split([t.numel() for t in gs.values()],
                                 1), gs.values())], list(gs.values()), sig, mix, density=density)
    res = self_normalized_is(-losses / alpha, log_q, D.double())           # 4. Δθ* by self-normalized IS
    update = res.estimate.to(g.dtype)                                    # 5. clipped, applied as a gradient
    u = float(torch.linalg.vector_norm(res.estimate))
    if max_update_norm is not None:
        update = update * min(1.0, max_update_norm / (u + GRAD_NORM_EPS))
    for p, u_p in zip(params.values(), unflatten(-lr * update, params).values()):
        p.grad = u_p.clone()
    optimizer.step()
    res.samples = D
    return loss, res
