"""K-FAC's checkpoints and dense view: ``state_dict`` / ``load_state_dict`` (factors, inverses or eigenbases,
counters, damping, hyperparameters, generator state: a restored object continues bit-identically) and ``to_dense``.

:class:`KFACCheckpointMixin` is a base class of :class:`taskloss.curvature.kfac.KFAC` and works on the attributes
that ``KFAC.__init__`` sets. Derived in notebook 07_fisher_approximations.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KFACCheckpointMixin"]

_HYPER = ("decay", "factor_update_interval", "inverse_update_interval", "eigenbasis_update_interval", "kl_clip")


class KFACCheckpointMixin:
    """``state_dict``, ``load_state_dict`` and ``to_dense`` of :class:`~taskloss.curvature.kfac.KFAC`."""

    def state_dict(self) -> dict:
        """Factors, inverses / eigenbases, counters, damping, hyperparameters and generator state (copies)."""
        return {
            "layers": list(self.modules),
            "config": {"fisher_type": self.fisher_type, "likelihood": self.likelihood,
                       "damping_mode": self.damping_mode},
            "A": {k: v.clone() for k, v in self.A.items()}, "G": {k: v.clone() for k, v in self.G.items()},
            "inv": {k: tuple(t.clone() for t in v) for k, v in self._inv.items()},
            "damping": self._damping, "inv_damping": self._inv_damping,
            "n_updates": self._n_updates, "n_steps": self._n_steps,
            "hyper": {h: getattr(self, h) for h in _HYPER},
            "generator": None if self.generator is None else self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (checked against this object's layers and configuration)."""
        if not isinstance(state, dict) or not {"A", "G", "inv", "config", "layers"} <= state.keys():
            raise ValueError("not a KFAC state_dict")
        mine = {"fisher_type": self.fisher_type, "likelihood": self.likelihood, "damping_mode": self.damping_mode}
        if state["config"] != mine:
            raise ValueError(f"state_dict was saved with {state['config']}, this KFAC has {mine}")
        if set(state["layers"]) != set(self.modules):
            raise ValueError(f"state_dict holds layers {sorted(state['layers'])}, this KFAC {sorted(self.modules)}")
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("state_dict and this KFAC disagree on whether a generator is used")

        def put(t: Tensor, k: str) -> Tensor:
            ref = next(self.modules[k].parameters())
            return t.detach().clone().to(device=ref.device)

        for k in state["A"]:  # factor shapes [D(+1)]², [out]² of this model's layers
            w, b = self._w[k], self._b[k]
            want = (self._d[k] * (w is not None) + (b is not None), (w if w is not None else b).shape[0])
            got = (tuple(state["A"][k].shape), tuple(state["G"][k].shape))
            if got != ((want[0],) * 2, (want[1],) * 2):
                raise ValueError(f"state_dict factors of layer {k!r} have shapes {got}, this layer needs "
                                 f"A {(want[0],) * 2} and G {(want[1],) * 2}")
        self.A = {k: put(v, k) for k, v in state["A"].items()}
        self.G = {k: put(v, k) for k, v in state["G"].items()}
        self._inv = {k: tuple(put(t, k) for t in v) for k, v in state["inv"].items()}
        for h, v in state["hyper"].items():
            setattr(self, h, v)
        self.damping = state["damping"]
        self._check_hyperparameters()
        self._inv_damping, self._n_updates, self._n_steps = state["inv_damping"], state["n_updates"], state["n_steps"]
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self._sync_hooks()

    def to_dense(self) -> Tensor:
        """Block-diagonal K-FAC matrix ``[P, P]`` (no damping) in the order of ``model.named_parameters()``
        restricted to the K-FAC layers' trainable parameters (per layer: weight flattened row-major, then bias)."""
        if not self.A:
            raise RuntimeError("no factors yet: call update() first")
        blocks = []
        for k in self.modules:
            out, d = self.G[k].shape[0], self.A[k].shape[0]
            block = torch.kron(self.G[k], self.A[k])                                   # row-major vec([W, b])
            if self._w[k] is not None and self._b[k] is not None:
                idx = torch.arange(out * d).view(out, d)
                order = torch.cat([idx[:, : d - 1].reshape(-1), idx[:, -1]])
                block = block[order][:, order]
            blocks.append(block)
        return torch.block_diag(*blocks)
