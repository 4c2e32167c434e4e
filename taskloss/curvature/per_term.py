"""Per-term Jacobian products: the rows ``J_iᵀ v`` of every loss term ``i`` of a model, for given output-space
vectors ``v``, and their dense and diagonal sums — the one computation behind the dense and diagonal GGN, MC and
empirical Fisher of :mod:`taskloss.curvature.fisher` (each a choice of the vectors: the columns of ``H_i^{1/2}``,
gradients at sampled labels, gradients at the observed labels). Derived in notebook 07_fisher_approximations.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import Tensor
from torch.func import vjp, vmap

from taskloss.curvature.model_io import example, math_attention, take, transform_error
from taskloss.parameter_vectors import flatten

__all__ = ["jt_factors", "dense_sum", "diagonal_sum"]

_CHUNK_ELEMENTS = 2**24  # bound on N_chunk · K · P floats held by the per-example factor computation


def jt_factors(fn, params, inputs, factors: Tensor, lead: torch.Size, valid: Tensor | None) -> list[Tensor]:
    """Chunks ``[n, k, P]`` of the rows ``J_iᵀ v`` for every loss term ``i`` and its vectors ``factors [R, K, C]``
    (``R`` terms laid out as ``lead = [N, ...]``; rows of masked terms are zero or left out).

    Args:
        fn: ``fn(params, inputs) → outputs [N, ..., C]``.
        params: the parameters (detached).
        inputs: a tensor or a mapping of keyword inputs.
        factors: per loss term, ``K`` output-space vectors.
        lead: the loss terms' shape (the outputs' without ``C``).
        valid: the bool mask of the terms that count (flat ``[R]``), or None.

    Returns:
        The chunks (their ``Σ bᵀb`` is ``Σ_i J_iᵀ V_i V_iᵀ J_i``).

    Raises:
        ValueError: a random or stateful model function, an operation without the derivative needed.

    Outputs ``[N, C]``: one vmapped vjp per example. Per-token outputs: each term's vectors are placed at its position
    (the other positions zero) and all of an example's terms are back-propagated at once. Mapping inputs (keyword
    tensors, where ``transformers``' mask construction cannot be vmapped over examples): example by example, only
    the terms that count.
    """
    n, m = lead[0], math.prod(lead[1:])
    k, c = factors.shape[1:]
    per = factors.reshape(n, m, k, c)
    p_dim = sum(p.numel() for p in params.values())
    eye = torch.eye(m, dtype=factors.dtype, device=factors.device)

    def rows(vjp_fn, v, where):
        """``[len(where)·K, P]``: the vjps of the vectors ``v [M, K, C]`` at the positions ``where``."""
        cot = (eye[where][:, None, :, None] * v[where][:, :, None, :]).reshape(-1, *lead[1:], c)
        if cot.shape[0] == 1:
            return flatten(vjp_fn(cot[0])[0]).unsqueeze(0)
        return torch.cat([t.reshape(cot.shape[0], -1) for t in vmap(vjp_fn)(cot)[0].values()], dim=1)

    def one(x, v):
        if m == 1 and len(lead) == 1:   # outputs [N, C]: v is [1, K, C]
            _, vjp_fn = vjp(lambda p: fn(p, x.unsqueeze(0)).squeeze(0), params)
            v = v[0]
            if v.shape[0] == 1:
                return flatten(vjp_fn(v[0])[0]).unsqueeze(0)
            return torch.cat([t.reshape(v.shape[0], -1) for t in vmap(vjp_fn)(v)[0].values()], dim=1)
        _, vjp_fn = vjp(lambda p: fn(p, example(x)).squeeze(0), params)
        return rows(vjp_fn, v, slice(None))

    try:
        with math_attention():
            if isinstance(inputs, Mapping):
                keep = (torch.ones(n, m, dtype=torch.bool, device=factors.device) if valid is None
                        else valid.reshape(n, m))
                out = []
                for i in range(n):
                    x = take(inputs, i, i + 1)
                    _, vjp_fn = vjp(lambda p: fn(p, x).squeeze(0), params)
                    where = keep[i].nonzero().squeeze(1)
                    if where.numel():
                        out.append(rows(vjp_fn, per[i], where).unsqueeze(0))
                return out
            chunk = max(1, _CHUNK_ELEMENTS // max(1, m * k * p_dim))
            return [vmap(one)(inputs[i:i + chunk], per[i:i + chunk]) for i in range(0, n, chunk)]
    except RuntimeError as e:
        if "random" in str(e) or "batch_norm" in str(e).lower() or "in-place" in str(e):
            raise ValueError("the model function draws random numbers or updates state in place (train-mode "
                             "Dropout / BatchNorm?): per-example curvature needs a deterministic function of "
                             f"(params, one input); call model.eval() first. Original error: {e}") from e
        mapped = transform_error(e)
        if mapped is not e:
            raise mapped from e
        raise
    except NotImplementedError as e:
        raise transform_error(e) from e


def dense_sum(chunks: list[Tensor], n: int) -> Tensor:
    """``(1/n) Σ bᵀb`` over the chunks of :func:`jt_factors`: ``[P, P]``."""
    return sum(torch.einsum("nkp,nkq->pq", b, b) for b in chunks) / n


def diagonal_sum(chunks: list[Tensor], n: int) -> Tensor:
    """The diagonal of :func:`dense_sum`, ``[P]``."""
    return sum(b.pow(2).sum((0, 1)) for b in chunks) / n
