"""The curvature statistics across ``torch.distributed`` ranks: each rank sums its local batch's moments, one
``all_reduce`` per update adds the ranks' sums and counts, and every rank divides by the global count.

Used by :class:`taskloss.curvature.kfac.KFAC` (the Kronecker factors), the diagonal / empirical Fisher
preconditioner and :class:`~taskloss.curvature.hessian_free.HessianFree` (derived in notebook
07_fisher_approximations). A statistic that is a mean over examples, ``F = (1/n) Σ_i f_i``, is the same on the
concatenated batch of every rank as ``Σ_r S_r / Σ_r n_r`` with ``S_r = Σ_{i ∈ rank r} f_i`` — an uneven last batch
(or masks leaving unequal counts) included. Sums rather than means travel so that one buffer carries every layer and
its own normalizer: the buffer holds every tensor of one dtype flattened end to end (one collective per update and
dtype, not one per layer), and gloo / NCCL's all-reduce leaves the same bits on every rank, so the ranks derive
bit-identical inverses and steps from it without broadcasting them.

Sharded parameters (``torch.distributed.fsdp``): the statistics here are of whole layers, formed from each layer's
full weight gradient; :func:`refuse_sharded` names the modules whose parameters are DTensor shards or FSDP flat
parameters.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["check_process_group", "world_size", "all_reduce_sum", "pack_symmetric", "unpack_symmetric",
           "refuse_sharded"]


def check_process_group(process_group):
    """``process_group`` if it is ``None`` or a ``torch.distributed`` process group.

    Args:
        process_group: the argument.

    Returns:
        It.

    Raises:
        TypeError: anything else.
    """
    if process_group is None:
        return None
    if not (dist.is_available() and isinstance(process_group, dist.ProcessGroup)):
        raise TypeError(f"process_group must be a torch.distributed ProcessGroup or None (the default group when "
                        f"torch.distributed is initialized, else one process), got {type(process_group).__name__}")
    return process_group


def world_size(process_group) -> int:
    """The number of ranks of ``process_group`` (default: the global group when initialized; 1 otherwise)."""
    if process_group is not None or (dist.is_available() and dist.is_initialized()):
        return dist.get_world_size(process_group)
    return 1


def all_reduce_sum(tensors: list[Tensor], process_group) -> list[Tensor]:
    """The sums over ranks of ``tensors`` (new tensors of the same shapes, dtypes and devices), in one ``all_reduce``
    per dtype: the tensors are flattened into one buffer, reduced and split back.

    Every rank must pass tensors of the same shapes and dtypes in the same order (a mismatch fails in the collective).

    Args:
        tensors: this rank's tensors.
        process_group: the process group (``None``: the default one).

    Returns:
        The summed tensors, in order.
    """
    out: list[Tensor | None] = [None] * len(tensors)
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    nccl = dist.get_backend(process_group) == "nccl"
    for dtype, idx in groups.items():
        device = tensors[idx[0]].device if nccl else torch.device("cpu")
        buf = torch.cat([tensors[i].detach().reshape(-1).to(device) for i in idx])
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=process_group)
        for i, piece in zip(idx, buf.split([tensors[i].numel() for i in idx])):
            out[i] = piece.view(tensors[i].shape).to(tensors[i].device)
    return out


def pack_symmetric(m: Tensor) -> Tensor:
    """The upper triangle of a square ``m [n, n]`` (diagonal included), row by row: ``n(n+1)/2`` numbers."""
    i, j = torch.triu_indices(m.shape[0], m.shape[0], device=m.device)
    return m[i, j]


def unpack_symmetric(packed: Tensor, n: int) -> Tensor:
    """The symmetric ``[n, n]`` matrix whose upper triangle :func:`pack_symmetric` gave as ``packed``."""
    i, j = torch.triu_indices(n, n, device=packed.device)
    m = packed.new_empty(n, n)
    m[i, j] = packed
    m[j, i] = packed
    return m


def _is_sharded(p: Tensor) -> bool:
    """A DTensor (``fully_shard``, tensor parallel) or an FSDP1 flat parameter."""
    return type(p).__name__ in ("DTensor", "FlatParameter") or hasattr(p, "_local_tensor")


def _is_fsdp_module(m: nn.Module) -> bool:
    """An FSDP1 wrapper or a module ``fully_shard`` gave its dynamic ``FSDP…`` class."""
    return any(c.__name__ in ("FullyShardedDataParallel", "FSDPModule") for c in type(m).__mro__)


def refuse_sharded(model: nn.Module, what: str) -> None:
    """Raise if ``model`` holds sharded parameters (FSDP), naming them and what works instead.

    Args:
        model: the network.
        what: who asks, for the message.

    Raises:
        ValueError: a parameter is a DTensor shard or an FSDP flat parameter, or a module is FSDP-wrapped.
    """
    names = [n for n, p in model.named_parameters() if _is_sharded(p)]
    if not names:   # FSDP's use_orig_params=True shows plain tensors: the wrappers give it away
        names = [n or "the model" for n, m in model.named_modules() if _is_fsdp_module(m)]
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise ValueError(f"{what} does not support sharded parameters (FullyShardedDataParallel / fully_shard: "
                         f"{shown}): its statistics need each layer's whole weight and gradient on every rank. Wrap "
                         "the model in DistributedDataParallel instead: the statistics are then all-reduced across "
                         "its ranks")
