"""The model-randomization sanity check for saliency maps: an explanation of a trained model should change
when the model's weights are replaced by random ones.

Derived in notebook 15_integrated_gradients. Source: Adebayo, Gilmer, Muelly, Goodfellow, Hardt & Kim, *Sanity
Checks for Saliency Maps* (NeurIPS 2018). They re-initialise the layers of a trained network — from the top
layer down (*cascading*) or one at a time (*independent*) — and measure how similar the attributions of the
randomized network stay to the original ones, with the Spearman rank correlation of the maps (signed and of
their absolute values). A method whose maps survive randomization explains the input, not the model.

:func:`spearman_correlation` is the rank correlation along the last dimension (tied values get their average
rank, as ``scipy.stats.spearmanr`` does); :func:`randomized_copy` re-initialises chosen modules of a copy with a
seeded generator, and :func:`cascading_randomization` lists the cascade from the output layer down.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
from torch import Tensor, nn

from taskloss.validation import check_bool, check_finite, check_int, check_module, check_not_meta

__all__ = ["average_ranks", "spearman_correlation", "randomized_copy", "cascading_randomization"]


def average_ranks(x: Tensor) -> Tensor:
    """Ranks 1…n of ``x`` along its last dimension, ties given the mean of the ranks they span (float64)."""
    if not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError("average_ranks needs a tensor with a non-empty last dimension")
    check_not_meta("x", x)
    if x.is_complex():
        raise TypeError(f"x must be real to be ranked, got dtype {x.dtype}")
    check_finite("x", x)
    n = x.shape[-1]
    flat = x.reshape(-1, n).to(torch.float64)
    sorted_x, order = flat.sort(dim=-1, stable=True)
    new_group = torch.ones_like(sorted_x, dtype=torch.bool)
    new_group[:, 1:] = sorted_x[:, 1:] != sorted_x[:, :-1]
    group = new_group.long().cumsum(-1) - 1                                   # tie-group id per sorted slot
    pos = torch.arange(1, n + 1, dtype=torch.float64, device=x.device).expand_as(sorted_x)
    sums = torch.zeros_like(sorted_x).scatter_add_(1, group, pos)
    counts = torch.zeros_like(sorted_x).scatter_add_(1, group, torch.ones_like(pos))
    mean_rank = (sums / counts.clamp_min(1)).gather(1, group)
    ranks = torch.empty_like(mean_rank).scatter_(1, order, mean_rank)
    return ranks.reshape(x.shape)


def spearman_correlation(a: Tensor, b: Tensor, absolute: bool = False) -> Tensor:
    """Spearman rank correlation of ``a`` and ``b`` along the last dimension (leading dimensions are batches).

    Args:
        a, b: tensors of one shape ``[..., n]`` with ``n ≥ 2``.
        absolute: rank ``|a|`` and ``|b|`` (Adebayo et al. report both).

    Returns:
        ``[...]`` float64 correlations in [−1, 1]; NaN-free: a constant row raises instead.

    Raises:
        ValueError: shape mismatch, ``n < 2``, NaN/inf, or a row whose ranks are all tied (correlation undefined).
    """
    absolute = check_bool("absolute", absolute)
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("a and b must be tensors")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.ndim == 0 or a.shape[-1] < 2:
        raise ValueError(f"need at least 2 values along the last dimension, got shape {tuple(a.shape)}")
    if absolute:
        a, b = a.abs(), b.abs()
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    den = (ra.square().sum(-1) * rb.square().sum(-1)).sqrt()
    if bool((den == 0).any()):
        raise ValueError("a row is constant (all ranks tied): its rank correlation is undefined")
    return (ra * rb).sum(-1) / den


def _parametrized_modules(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules()
            if hasattr(m, "reset_parameters") and any(True for _ in m.parameters(recurse=False))]


def randomized_copy(model: nn.Module, modules: Sequence[str] | None = None, seed: int = 0) -> nn.Module:
    """A deep copy of ``model`` whose ``modules`` (names from ``named_modules()``; ``None``: every module with
    parameters of its own) are re-initialised by their ``reset_parameters()`` under a seeded RNG. The original is
    untouched; the copy keeps the original's train/eval mode.

    Raises:
        ValueError: a name that is not a module of ``model`` or a module without ``reset_parameters``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_int("seed", seed, minimum=0)
    names = _parametrized_modules(model) if modules is None else list(modules)
    table = dict(model.named_modules())
    for name in names:
        if name not in table or not hasattr(table[name], "reset_parameters"):
            raise ValueError(f"{name!r} is not a module of the model with reset_parameters(); choose from "
                             f"{_parametrized_modules(model)}")
    clone = copy.deepcopy(model)
    clone_modules = dict(clone.named_modules())
    devices = [p.device for p in model.parameters() if p.device.type != "cpu"]
    with torch.random.fork_rng(devices=devices[:1]):
        torch.manual_seed(seed)
        with torch.no_grad():
            for name in names:
                clone_modules[name].reset_parameters()
    return clone


def cascading_randomization(model: nn.Module, seed: int = 0) -> list[tuple[str, nn.Module]]:
    """Adebayo et al.'s cascade: ``[(name, copy)]`` where the i-th copy has the last i+1 parametrized modules
    (in ``named_modules`` order, output side first) re-initialised with ``seed``."""
    check_module("model", model)
    names = _parametrized_modules(model)
    if not names:
        raise ValueError("model has no module with parameters and reset_parameters()")
    top_down = names[::-1]
    return [(top_down[i], randomized_copy(model, top_down[: i + 1], seed)) for i in range(len(top_down))]
