"""The zeroth-order methods across ``torch.distributed`` ranks: one perturbation stream shared by every rank, each
rank's loss values on its local batch combined into the values on the whole batch, and a check that the ranks hold
the same parameters.

Used by :class:`taskloss.search.zeroth_order.MeZO`, :func:`~taskloss.search.zeroth_order.gaussian_smoothing_grad`
and :func:`~taskloss.search.zeroth_order.spsa_grad` (derived in notebook 05_policy_gradient_vs_zeroth_order). A rank
evaluates the loss of *its* batch at the perturbed parameters; with ``n_r`` examples on rank r and local mean losses
``L_r``, the mean over the concatenated batch is ``Σ_r n_r L_r / Σ_r n_r`` — exact for a loss that is a mean over
examples, an uneven last batch included. Without weights every rank counts once (the convention of DDP's gradient
average). Everything a rank needs travels in one ``all_gather`` of a few float64 numbers per call, summed in rank
order on every rank, so every rank computes bit-identical values and takes the same step: the memory of inference on
each rank, no parameter-sized communication.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["world_of", "share_generator_", "combine_across_ranks", "check_n_examples", "fingerprint"]

#: relative tolerance of the parameter fingerprints of two ranks (bit-identical on equal hardware)
FINGERPRINT_RTOL = 1e-9


def world_of(process_group=None) -> tuple[int, int]:
    """``(world size, rank)`` of ``process_group`` (default: the global group when initialized); ``(1, 0)`` otherwise.

    Args:
        process_group: a ``torch.distributed`` process group or ``None``.

    Returns:
        ``(world size, rank)``.
    """
    if process_group is not None or (dist.is_available() and dist.is_initialized()):
        return dist.get_world_size(process_group), dist.get_rank(process_group)
    return 1, 0


def _source(process_group) -> int:
    return dist.get_global_rank(process_group, 0) if process_group is not None else 0


def _comm_device(process_group, device: torch.device) -> torch.device:
    """The device collectives of ``process_group`` take tensors on (CUDA for NCCL, else the CPU)."""
    backend = dist.get_backend(process_group)
    return device if backend == "nccl" and device.type == "cuda" else torch.device("cpu")


def share_generator_(generator: torch.Generator, process_group, device: torch.device) -> None:
    """Give ``generator`` the state of rank 0's generator, in place on every rank (one broadcast).

    Args:
        generator: this rank's generator (its state is replaced on ranks other than 0).
        process_group: the process group.
        device: the device of the tensors the ranks work on (the broadcast goes through it under NCCL).
    """
    dev = _comm_device(process_group, device)
    state = generator.get_state().to(dev)
    dist.broadcast(state, src=_source(process_group), group=process_group)
    generator.set_state(state.cpu())


def check_n_examples(n_examples) -> float | None:
    """``n_examples`` as a float: a positive whole number (or 0-dim tensor of one), or ``None``.

    Args:
        n_examples: the number of examples this rank's loss averages.

    Returns:
        The weight, or ``None``.

    Raises:
        TypeError: not a number.
        ValueError: not positive and finite.
    """
    if n_examples is None:
        return None
    if isinstance(n_examples, Tensor) and n_examples.numel() == 1 and not n_examples.is_complex():
        n_examples = n_examples.item()
    if isinstance(n_examples, bool) or not isinstance(n_examples, numbers.Real):
        raise TypeError(f"n_examples must be a number (the examples this rank's loss averages), got "
                        f"{type(n_examples).__name__}")
    value = float(n_examples)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"n_examples must be > 0 and finite, got {n_examples}")
    if value != int(value):
        raise ValueError(f"n_examples counts examples: a whole number, got {n_examples}")
    return value


def fingerprint(tensors) -> float:
    """A float64 sum of every entry of ``tensors``: equal on ranks that hold equal parameters."""
    return float(sum(t.detach().sum(dtype=torch.float64) for t in tensors)) if tensors else 0.0


def combine_across_ranks(values: Tensor, weight: float | None, print_of_params: float, process_group,
                         device: torch.device, what: str) -> Tensor:
    """The weighted mean over ranks of each rank's ``values``, after checking the ranks hold the same parameters.

    One ``all_gather`` of ``[Σ… values·w, w, fingerprint]``; the sums run in rank order on every rank (bit-identical
    results). NaN or inf on one rank reaches every rank's result, so every rank raises the same error afterwards.

    Args:
        values: float64 ``[k]``, this rank's loss values.
        weight: this rank's ``n_examples`` (``None``: 1).
        print_of_params: :func:`fingerprint` of this rank's parameters.
        process_group: the process group.
        device: the device of the tensors the ranks work on.
        what: who asks, for the messages.

    Returns:
        float64 ``[k]`` on the CPU: ``Σ_r w_r values_r / Σ_r w_r``.

    Raises:
        RuntimeError: the ranks' parameter fingerprints differ.
    """
    world, _ = world_of(process_group)
    w = 1.0 if weight is None else weight
    dev = _comm_device(process_group, device)
    k = values.numel()
    local = torch.empty(k + 2, dtype=torch.float64, device=dev)
    local[:k] = values.detach().reshape(-1).to(device=dev, dtype=torch.float64) * w
    local[k], local[k + 1] = w, print_of_params
    bufs = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(bufs, local, group=process_group)
    G = torch.stack(bufs).cpu()
    prints = G[:, k + 1]
    spread = float(prints.max() - prints.min())
    if not spread <= FINGERPRINT_RTOL * (1.0 + float(prints.abs().max())):
        raise RuntimeError(f"{what}: the ranks hold different (or NaN) parameters (fingerprints {prints.tolist()}): every "
                           "rank must start from the same parameters (broadcast them, as DDP does) and step them "
                           "with the same hyperparameters")
    total = G[0].clone()
    for r in range(1, world):       # rank order on every rank: bit-identical sums
        total += G[r]
    return total[:k] / total[k]
