"""In-batch negatives across ranks: all-gather the embeddings, gradient back to each rank's own rows.

Derived in notebook 10_contrastive_accumulation. With W ranks holding ``B_r`` pairs each (``B = Σ_r B_r``), rank r
computes the InfoNCE terms of *its own* pairs against the candidates of *every* rank::

    L_r = (W/B) Σ_{i ∈ rank r} ℓ_i            (mean reduction; "sum" drops 1/B)

Every rank's loss depends on every rank's embeddings, so the backward of :func:`gather_with_grad` sums the
gradients of the gathered matrix over ranks (one ``all_reduce``) and keeps its own slice: rank r receives
``∂(Σ_r' L_r')/∂e_r = W·∂L/∂e_r``, L being the single-process full-batch loss. ``DistributedDataParallel``
then averages the parameter gradients over the W ranks, which cancels the factor W: the synchronized gradient
is exactly ``∇_θ L`` — the same as one process with the whole batch (tested with 2 gloo processes).

``torch.distributed.nn.all_gather`` has the same backward (a reduce-scatter) for equal shards, and
sentence-transformers' ``gather_across_devices`` uses it with each rank's mean over its own rows — the same
scale when shards are equal; :func:`gather_with_grad` also takes unequal shards (the loss is then weighted by
``W/B`` rather than ``1/B_r``). GradCache's ``DistributedContrastiveLoss`` instead computes the *whole* B×B loss
on every rank with the gradient to the own slice only: after DDP's averaging that is ``∇_θ L / W`` (a learning
rate W times smaller), at W times the score-matrix cost. Combined with
:func:`taskloss.contrastive.accumulation.accumulated_backward`, each rank embeds its shard in micro-batches and
the cache is built from the gathered loss.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from taskloss.contrastive.losses import REDUCTIONS, check_pair_embeddings, info_nce_rows
from taskloss.validation import check_bool, check_not_meta, check_positive

__all__ = ["world", "gather_with_grad", "distributed_info_nce"]


def world(group=None) -> tuple[int, int]:
    """(world size, rank) of ``group`` (default group), or (1, 0) without an initialized process group; a
    ``group`` that is neither ``None`` nor a ``torch.distributed.ProcessGroup`` is a ``TypeError`` either way."""
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(f"group must be None or a torch.distributed.ProcessGroup, got {type(group).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        w, r = world(group)
        sizes = torch.tensor([x.shape[0]], device=x.device)
        all_sizes = [torch.zeros_like(sizes) for _ in range(w)]
        dist.all_gather(all_sizes, sizes, group=group)
        counts = [int(s) for s in all_sizes]
        padded = x.new_zeros((max(counts),) + tuple(x.shape[1:]))
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(w)]
        dist.all_gather(parts, padded.contiguous(), group=group)
        ctx.group, ctx.start, ctx.n = group, sum(counts[:r]), x.shape[0]
        return torch.cat([p[:c] for p, c in zip(parts, counts)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.start: ctx.start + ctx.n], None


def gather_with_grad(x: Tensor, group=None) -> Tensor:
    """All ranks' ``x`` concatenated in rank order, differentiable: the gradient of the gathered tensor is summed
    over ranks and each rank keeps the slice of its own rows. Ranks may hold different numbers of rows.
    Without an initialized process group, returns ``x`` itself.

    Args:
        x: ``[n_r, …]`` this rank's rows (same trailing shape and dtype on every rank).
        group: the process group (default: the world).

    Returns:
        ``[Σ_r n_r, …]``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_not_meta("x", x)
    if world(group)[0] == 1:
        return x
    return _GatherWithGrad.apply(x, group)


def distributed_info_nce(queries: Tensor, positives: Tensor, *, temperature: float = 0.05,
                         hard_negatives: Tensor | None = None, symmetric: bool = False, reduction: str = "mean",
                         group=None) -> Tensor:
    """This rank's share of the full-batch InfoNCE loss (:func:`taskloss.contrastive.losses.info_nce`) over the
    pairs of all ranks, scaled so that the ``DistributedDataParallel``-averaged gradient equals the full-batch
    gradient (module docstring). Without a process group it is :func:`~taskloss.contrastive.losses.info_nce`.

    Args:
        queries: ``[B_r, d]`` this rank's queries.
        positives: ``[B_r, d]`` their positives.
        temperature: as in :func:`~taskloss.contrastive.losses.info_nce`.
        hard_negatives: as there (gathered too: every query sees every rank's).
        symmetric: as there.
        reduction: as there.
        group: the process group (default: the world).

    Returns:
        The scalar ``W · Σ_{i∈r} ℓ_i / B`` (mean) or ``W · Σ_{i∈r} ℓ_i`` (sum); the full-batch loss is the mean of
        the ranks' values.

    Raises:
        ValueError: as :func:`~taskloss.contrastive.losses.info_nce`.
    """
    symmetric = check_bool("symmetric", symmetric)
    temperature = check_positive("temperature", temperature)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    check_pair_embeddings(queries, positives, hard_negatives)
    w, _ = world(group)
    all_q, all_p = gather_with_grad(queries, group), gather_with_grad(positives, group)
    candidates = all_p if hard_negatives is None else torch.cat(
        [all_p, gather_with_grad(hard_negatives.to(positives.dtype), group)])
    rows = info_nce_rows(queries, positives, all_q, candidates, temperature, symmetric)
    total = rows.sum() * w
    return total / all_q.shape[0] if reduction == "mean" else total
