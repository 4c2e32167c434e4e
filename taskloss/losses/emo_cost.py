"""Cost tables of the EMO loss: unit-norm token embeddings ``ê = e / ||e||`` and the dense cost
``c_ij = 1 - <ê_i, ê_j>``. Derived in notebook 09_emo_loss; used by :mod:`taskloss.losses.emo`.

Normalization is exact for rows of any finite scale: each row is first divided by its largest magnitude (so that
squaring neither underflows for rows of 1e-30 or subnormals, nor overflows for rows of 1e30), then by the norm of
the scaled row. A zero row stays zero (it then costs 1 to every token).
"""
from __future__ import annotations

import torch

from taskloss.losses.emo_kernel import all_true, compute_dtype
from taskloss.validation import check_floating, check_ndim

__all__ = ["normalize_cost_embeddings", "emo_cost_matrix"]

_UNIT_TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def unit_rows(cost_embeddings: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Detached ``ê = e / ||e||`` in ``dtype``, robust to rows of any finite scale; zero rows stay zero.

    A table whose rows already have unit norm (within 1e-5 in float32, 1e-12 in float64) or are zero, in ``dtype``,
    is returned as it is (no copy). Otherwise each row is first divided by its largest magnitude, so that squaring
    neither underflows (rows of 1e-30, subnormals) nor overflows (rows of 1e30), then by the norm of the scaled
    row (which lies in ``[1, √d]``). The work runs in the wider of the table's dtype and ``dtype``: a float64 table
    of tiny rows is normalized before it is cast to float32.
    """
    check_floating("cost_embeddings", cost_embeddings)
    check_ndim("cost_embeddings", cost_embeddings, 2)
    if cost_embeddings.shape[0] == 0 or cost_embeddings.shape[1] == 0:
        raise ValueError(f"cost_embeddings must be non-empty [V, d], got {tuple(cost_embeddings.shape)}")
    e = cost_embeddings.detach()
    if e.dtype == dtype and dtype in _UNIT_TOL:
        norm = torch.linalg.vector_norm(e, dim=1)
        unit = (norm - 1.0).abs() <= _UNIT_TOL[dtype]
        if all_true(unit):
            return e
        if all_true(unit | (norm == 0)) and all_true((torch.linalg.vector_norm(e, ord=float("inf"), dim=1) == 0)
                                                     | unit):
            return e  # unit rows and true zero rows (not rows whose squares underflowed)
    work = torch.promote_types(e.dtype, dtype)
    x = e.to(work)
    scale = torch.linalg.vector_norm(x, ord=float("inf"), dim=1)  # max |e_ij| per row
    if not all_true(torch.isfinite(scale)):
        raise ValueError("cost_embeddings contain NaN or inf")
    nonzero = scale > 0
    y = x / torch.where(nonzero, scale, torch.ones_like(scale))[:, None]  # entries in [-1, 1], max 1 per row
    norm = torch.linalg.vector_norm(y, dim=1)
    y = y * torch.where(nonzero, 1.0 / norm.clamp_min(1.0), torch.zeros_like(norm))[:, None]
    return y.to(dtype)


def normalize_cost_embeddings(cost_embeddings: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Detached unit-norm rows ``ê = e / ||e||`` of ``cost_embeddings [V, d]``; zero rows stay zero.

    Args:
        cost_embeddings: ``[V, d]`` floating tensor, finite; rows of any scale (tiny or huge) are normalized
            exactly (each row is rescaled by its largest entry first, so nothing underflows to a zero row).
        dtype: the result's dtype (default float32, float64 for float64 input).

    Returns:
        ``[V, d]`` detached; the input itself when it already has unit (or zero) rows in ``dtype``.

    Raises:
        TypeError: not a floating tensor, or ``dtype`` not a floating dtype.
        ValueError: wrong ndim, empty, NaN or inf.

    Derived in notebook 09_emo_loss.
    """
    if not isinstance(cost_embeddings, torch.Tensor):
        raise TypeError(f"cost_embeddings must be a torch.Tensor, got {type(cost_embeddings).__name__}")
    check_floating("cost_embeddings", cost_embeddings)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    return unit_rows(cost_embeddings, dtype or compute_dtype(cost_embeddings.dtype))


def emo_cost_matrix(cost_embeddings: torch.Tensor) -> torch.Tensor:
    """Dense transport cost ``c [V, V]``, ``c_ij = 1 - <ê_i, ê_j>`` (O(V²): for checks and small vocabularies).

    Derived in notebook 09_emo_loss.
    """
    e = normalize_cost_embeddings(cost_embeddings)
    return 1.0 - e @ e.T
