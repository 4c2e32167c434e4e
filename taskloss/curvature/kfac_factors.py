"""K-FAC's state: the layers it preconditions, their Kronecker factors and the damped inverses of the factors.

:class:`KroneckerFactors` is the state object that :class:`taskloss.curvature.kfac.KFAC` owns (as curvlinops'
``KFACLinearOperator`` owns its computers): built with the layers it covers, it folds batch moments into the running
factors, refreshes the inverses (eigendecompositions or the π-damped Cholesky inverses), applies them to a layer's
gradient matrix, checkpoints itself and forms the dense block-diagonal matrix. It reads no attribute of its owner:
what it needs comes in as arguments. The maths it calls is in :mod:`taskloss.curvature.kfac_math`. Derived in notebook
07_fisher_approximations.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from taskloss.curvature.kfac_math import (
    eigen_denominator,
    eigen_inverse,
    eigenvalues_in_basis,
    fold_moment,
    input_moment,
    nonfinite_keys,
    pi_inverse,
    precondition,
)
from taskloss.curvature.model_io import HALF

__all__ = ["KFACLayer", "KroneckerFactors", "DAMPING_MODES"]

DAMPING_MODES = ("eigen", "pi")


@dataclass(frozen=True)
class KFACLayer:
    """One preconditioned layer: its module and its trained weight and bias (``None`` where frozen, shared or absent).

    ``fan_in`` is D, the entries of one output unit's weight (``in_features``, or ``C_in·kh·kw``); the layer's
    gradient matrix ``[∇W, ∇b]`` is ``[out, cols]`` with ``cols = D·(weight trained) + (bias trained)``.
    ``transposed``: the weight is stored ``[in, out]`` (``transformers``' ``Conv1D``, ``y = x W + b``), so its
    gradient matrix is ``∇Wᵀ``.
    """

    name: str
    module: nn.Module
    weight: Tensor | None
    bias: Tensor | None
    fan_in: int
    transposed: bool = False

    @property
    def out(self) -> int:
        """The number of output units."""
        if self.weight is not None:
            return self.weight.shape[1] if self.transposed else self.weight.shape[0]
        return self.bias.shape[0]

    def weight_matrix(self, t: Tensor) -> Tensor:
        """A weight-shaped tensor (the gradient) as the ``[out, D]`` block of the layer's gradient matrix (a view)."""
        return t.T if self.transposed else t.reshape(t.shape[0], -1)

    @property
    def cols(self) -> int:
        """The columns of the layer's gradient matrix."""
        return self.fan_in * (self.weight is not None) + (self.bias is not None)

    @property
    def params(self) -> list[Tensor]:
        """The trained parameters, weight first."""
        return [p for p in (self.weight, self.bias) if p is not None]


class KroneckerFactors:
    """The running factors ``A``, ``G`` and their damped inverses for ``layers``, one damping mode.

    Args:
        layers: the preconditioned layers.
        damping_mode: ``"eigen"`` (``(A ⊗ G + λI)⁻¹`` exactly, through eigendecompositions) or ``"pi"`` (the
            factored ``(A + π√λ I)⁻¹ ⊗ (G + √λ/π I)⁻¹``).

    Attributes ``A``, ``G`` (per layer name, the running averages), ``inverses`` (per layer name: ``(Q_A, Q_G, λ_A,
    λ_G, 1/(λ_G λ_Aᵀ + λ))`` or ``(A⁻¹, G⁻¹)``) and ``inverse_damping`` (the λ they were formed with).
    """

    def __init__(self, layers: list[KFACLayer], damping_mode: str):
        if damping_mode not in DAMPING_MODES:
            raise ValueError(f"damping_mode must be one of {DAMPING_MODES}, got {damping_mode!r}")
        self.layers = {layer.name: layer for layer in layers}
        self.damping_mode = damping_mode
        self.A: dict[str, Tensor] = {}
        self.G: dict[str, Tensor] = {}
        self.inverses: dict[str, tuple[Tensor, ...]] = {}
        self.inverse_damping: float | None = None

    # ------------------------------------------------------------------------------------------------ factors
    @torch.no_grad()
    def fold(self, layer: KFACLayer, g: Tensor, n_terms: int, inputs: Tensor, decay: float) -> None:
        """Fold one batch into the layer's running factors, ``F ← decay·F + (1 − decay)·F_batch``.

        Args:
            layer: the layer.
            g: ``[R, out]`` rows of output gradients (per loss term and, for a convolution, per location).
            n_terms: the number of loss terms (the normalizer of ``G``).
            inputs: the layer's recorded input (its rows form ``A``).
            decay: the running-average weight of the old factors.
        """
        k = layer.name
        if g.dtype in HALF:  # float16 / bfloat16 layers: the moments are summed and kept in float32
            g, inputs = g.float(), inputs.float()
        self.G[k] = fold_moment(self.G.get(k), g, n_terms, decay)
        if layer.weight is not None:
            self.A[k] = input_moment(layer.module, inputs, layer.bias is not None, self.A.get(k), decay)
        elif k not in self.A:  # bias-only block: a = 1, A = [[1]] for ever
            self.A[k] = g.new_ones(1, 1)

    @torch.no_grad()
    def fold_moments(self, layer: KFACLayer, A: Tensor | None, G: Tensor, decay: float) -> None:
        """Fold a batch's moments formed elsewhere (the concatenated batch of several ranks) into the layer's running
        factors, ``F ← decay·F + (1 − decay)·F_batch``.

        Args:
            layer: the layer.
            A: the batch's input moment ``[cols, cols]`` (``None`` for a bias-only block: ``A = [[1]]``).
            G: the batch's output-gradient moment ``[out, out]``.
            decay: the running-average weight of the old factors.
        """
        k = layer.name
        if A is None:
            A = self.A.get(k, G.new_ones(1, 1))
        elif k in self.A and decay != 0:
            A = self.A[k].mul_(decay).add_(A, alpha=1 - decay)
        self.G[k] = self.G[k].mul_(decay).add_(G, alpha=1 - decay) if k in self.G and decay != 0 else G
        self.A[k] = A

    # ------------------------------------------------------------------------------------------------ inverses
    def refresh(self, damping: float, new_basis: bool) -> None:
        """Form the damped inverses of every layer's factors.

        Args:
            damping: λ > 0.
            new_basis: ``"eigen"`` mode: eigendecompose afresh (else keep the eigenbases and re-estimate the
                eigenvalues as ``diag(Qᵀ F Q)``, EKFAC-style).

        Raises:
            ValueError: NaN/inf in a factor.
        """
        bad = nonfinite_keys({k: (self.A[k], self.G[k]) for k in self.layers})
        if bad:
            raise ValueError(f"the K-FAC factors of layers {bad} contain NaN or inf (non-finite activations or "
                             "output gradients were recorded by update_statistics())")
        if self.damping_mode == "pi":
            self.inverses = {k: pi_inverse(self.A[k], self.G[k], damping, k) for k in self.layers}
        elif new_basis or not self.inverses:
            self.inverses = {k: eigen_inverse(self.A[k], self.G[k], damping, k) for k in self.layers}
        else:  # keep the eigenbases, re-estimate the eigenvalues in them
            for k, (qa, qg, _, _, _) in self.inverses.items():
                la, lg = eigenvalues_in_basis(self.A[k], qa), eigenvalues_in_basis(self.G[k], qg)
                self.inverses[k] = (qa, qg, la, lg, eigen_denominator(la, lg, damping))
        self.inverse_damping = damping

    def set_damping(self, damping: float) -> None:
        """Re-form the inverses for a new λ from what they hold (the eigenvalues, or the factors in ``"pi"`` mode)."""
        if self.damping_mode == "pi":
            self.refresh(damping, new_basis=False)
            return
        for k, (qa, qg, la, lg, _) in self.inverses.items():
            self.inverses[k] = (qa, qg, la, lg, eigen_denominator(la, lg, damping))
        self.inverse_damping = damping

    def precondition(self, name: str, m: Tensor, out: Tensor | None = None,
                     work: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """The damped inverse of layer ``name`` applied to its gradient matrix ``m [out, cols]`` (``out``, ``work``:
        buffers, as :func:`taskloss.curvature.kfac_math.precondition` takes them)."""
        return precondition(self.inverses[name], m, out=out, work=work)

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Copies of the factors, the inverses and the λ they were formed with."""
        return {"A": {k: v.clone() for k, v in self.A.items()}, "G": {k: v.clone() for k, v in self.G.items()},
                "inv": {k: tuple(t.clone() for t in v) for k, v in self.inverses.items()},
                "inv_damping": self.inverse_damping}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` onto these layers' devices, the factor shapes checked.

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ValueError: factors of other shapes than these layers need.
        """
        for k in state["A"]:
            layer = self.layers[k]
            want = ((layer.cols,) * 2, (layer.out,) * 2)
            got = (tuple(state["A"][k].shape), tuple(state["G"][k].shape))
            if got != want:
                raise ValueError(f"state_dict factors of layer {k!r} have shapes {got}, this layer needs "
                                 f"A {want[0]} and G {want[1]}")

        def put(t: Tensor, k: str) -> Tensor:
            return t.detach().clone().to(device=self.layers[k].params[0].device)

        self.A = {k: put(v, k) for k, v in state["A"].items()}
        self.G = {k: put(v, k) for k, v in state["G"].items()}
        self.inverses = {k: tuple(put(t, k) for t in v) for k, v in state["inv"].items()}
        self.inverse_damping = state["inv_damping"]

    def to_dense(self) -> Tensor:
        """Block-diagonal K-FAC matrix ``[P, P]`` (no damping), per layer the weight flattened row-major as stored
        (``[in, out]`` for a ``Conv1D``), then bias.

        Raises:
            RuntimeError: no factors yet.
        """
        if not self.A:
            raise RuntimeError("no factors yet: call update_statistics() first")
        blocks = []
        for k, layer in self.layers.items():
            out, d = self.G[k].shape[0], self.A[k].shape[0]
            block = torch.kron(self.G[k], self.A[k])                                   # row-major vec([W, b])
            if layer.weight is not None and (layer.bias is not None or layer.transposed):
                idx = torch.arange(out * d).view(out, d)
                w_idx = idx[:, : layer.fan_in]
                order = (w_idx.T if layer.transposed else w_idx).reshape(-1)           # the weight as stored
                if layer.bias is not None:
                    order = torch.cat([order, idx[:, -1]])
                block = block[order][:, order]
            blocks.append(block)
        return torch.block_diag(*blocks)
