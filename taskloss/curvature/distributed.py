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

Failing fast: a rank that cannot form its statistics (no loss term left, NaN / inf, shapes that do not match) must
not leave the others waiting in the all-reduce until the backend's timeout (gloo's default: 30 minutes). Inside
:func:`failing_fast` the first :func:`all_reduce_sum` is preceded by one small all-reduce of every rank's status
(:func:`agree_status`); a rank that raised before reaching it sends its failure instead, and every rank raises the
same :class:`RankFailure` naming the ranks and what went wrong there, within the time of one collective.

Sharded parameters (``torch.distributed.fsdp``): the statistics here are of whole layers, formed from each layer's
full weight gradient; :func:`refuse_sharded` names the modules whose parameters are DTensor shards or FSDP flat
parameters.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["check_process_group", "world_size", "all_reduce_sum", "pack_symmetric", "unpack_symmetric",
           "refuse_sharded", "RankFailure", "failing_fast", "fails_fast", "agree_status"]


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


class RankFailure(ValueError):
    """A rank could not form its statistics; raised on every rank of the group, with the same message."""


#: The failures the ranks agree on, by code (0: this rank is fine), and the words that classify a rank's error.
_FAILURES = {1: ("has no loss term left (every label is ignore_index or padding)", ("no loss term", "no row is left")),
             2: ("holds NaN or inf", ("nan", "inf")),
             3: ("has inputs, outputs or targets of shapes that do not match", ("shape", "batch size", "batch_size")),
             4: ("raised an error", ())}
_STATE = threading.local()


def _failure_code(error: BaseException) -> int:
    text = str(error).lower()
    return next((code for code, (_, words) in _FAILURES.items() if any(w in text for w in words)), 4)


def agree_status(error: BaseException | None, what: str, process_group) -> None:
    """Every rank reports whether it can go on (one all-reduce of ``world`` small integers); if any rank cannot, every
    rank raises the same :class:`RankFailure`.

    Args:
        error: this rank's error, or ``None`` when it is ready for the collective.
        what: the method, for the message.
        process_group: the process group (``None``: the default one).

    Raises:
        RankFailure: a rank reported an error (chained to this rank's own error where it has one).
    """
    world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(process_group) == "nccl" \
        else torch.device("cpu")
    status = torch.zeros(world, dtype=torch.int64, device=device)
    if error is not None:
        status[rank] = _failure_code(error)
    dist.all_reduce(status, op=dist.ReduceOp.MAX, group=process_group)
    codes = status.tolist()
    if any(codes):
        where = "; ".join(f"rank {r} {_FAILURES[c][0]}" for r, c in enumerate(codes) if c)
        raise RankFailure(f"{what} cannot form its statistics across the {world} ranks: {where}. Every rank raises "
                          "this error (the ranks agree on a status before the all-reduce, so none is left waiting "
                          "in it); the failing rank's own error is chained to it there. Fix that rank's batch (give "
                          "every rank at least one labelled token, finite inputs and matching shapes)") from error


@contextlib.contextmanager
def failing_fast(what: str, process_group):
    """A block whose first :func:`all_reduce_sum` is preceded by :func:`agree_status`; an error raised in it before that
    collective is reported to the other ranks, and every rank raises the same :class:`RankFailure` (one process: the
    block runs as it is).

    Args:
        what: the method, for the message.
        process_group: the process group (``None``: the default one when initialized).
    """
    if world_size(check_process_group(process_group)) == 1:
        yield
        return
    outer, active = getattr(_STATE, "pending", None), _STATE.__dict__.setdefault("active", [])
    active.append(what)
    what = active[0]   # a block inside another speaks for the outermost one: every rank names the same method
    _STATE.pending = (what, process_group)
    try:
        yield
    except (ValueError, TypeError, RuntimeError, ArithmeticError) as e:
        if getattr(_STATE, "pending", None) is not None and not isinstance(e, RankFailure):
            _STATE.pending = None
            agree_status(e, what, process_group)
        raise
    finally:
        _STATE.pending = outer
        active.pop()


def fails_fast(fn):
    """Run ``fn`` (a function taking ``process_group=``) inside :func:`failing_fast`, named by its own name."""
    @functools.wraps(fn)
    def wrapper(*args, process_group=None, **kwargs):
        with failing_fast(fn.__name__, process_group):
            return fn(*args, process_group=process_group, **kwargs)
    return wrapper


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
    pending = getattr(_STATE, "pending", None)
    if pending is not None:   # inside failing_fast: the ranks agree that every one of them is ready first
        _STATE.pending = None
        agree_status(None, *pending)
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
