"""The random state of a computation, recorded and replayed: what makes the second pass of the exact accumulation
(:mod:`taskloss.contrastive.accumulation`) draw the same dropout masks as the first. Derived in notebook
10_contrastive_accumulation.

The reference (``luyug/GradCache``, ``grad_cache.py``) records the CUDA states of the input tensors' devices only;
:class:`RNGState` also covers the CPU generator and the devices of an encoder's parameters and buffers.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["RNGState"]


def _tensors(obj: Any):
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


@dataclass(frozen=True)
class RNGState:
    """The CPU generator's state and those of the CUDA devices a computation touches.

    ``RNGState.capture(*objs)`` records them (CUDA devices found among the tensors, nested containers and module
    parameters in ``objs``); ``with state.replay(): …`` runs code from exactly that state and restores the
    current one afterwards (``torch.random.fork_rng``), so replaying does not advance the global generators.
    """

    cpu: Tensor
    cuda: tuple[tuple[int, Tensor], ...] = ()

    @classmethod
    def capture(cls, *objs: Any) -> "RNGState":
        """The RNG states of the CPU and of every CUDA device the tensors in ``objs`` live on."""
        devices = sorted({t.device.index if t.device.index is not None else torch.cuda.current_device()
                          for o in objs for t in _tensors(o) if t.device.type == "cuda"})
        return cls(torch.get_rng_state(), tuple((d, torch.cuda.get_rng_state(d)) for d in devices))

    @contextlib.contextmanager
    def replay(self):
        """A context in which the recorded RNG states are current (the caller's are restored after)."""
        with torch.random.fork_rng(devices=[d for d, _ in self.cuda]):
            torch.set_rng_state(self.cpu)
            for d, state in self.cuda:
                torch.cuda.set_rng_state(state, d)
            yield
