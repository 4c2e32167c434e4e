"""K-FAC's gradient side: the layers' gradient matrices, the KL clip, and writing the preconditioned gradients back.

:class:`LayerGradients` is owned by :class:`taskloss.curvature.kfac.KFAC` and built with the layers it covers. Its
fast path gathers every trained parameter's gradient into one flat buffer with one foreach copy, preconditions each
layer's ``[out, cols]`` view of it into a second buffer (the matmuls of
:func:`taskloss.curvature.kfac_math.precondition`, into kept work buffers), takes the KL clip's ``Σ vᵀg`` as one dot
product, scales once and scatters back with one more foreach copy — a handful of kernel launches instead of ~15 per
layer. It applies when every trained parameter has a gradient of one dtype and device (the usual case); otherwise the
per-layer path runs (the same matmuls; only ``Σ vᵀg`` is summed in another order). The plain version of the whole
step, for reading and testing, is :func:`taskloss.curvature.kfac_math.kfac_precondition_reference`. Derived in
notebook 07_fisher_approximations; ``benchmarks/bench_curvature.py`` measures the step against its FLOP floor.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from taskloss.curvature.kfac_factors import KFACLayer, KroneckerFactors
from taskloss.curvature.kfac_math import nonfinite_keys
from taskloss.curvature.model_io import HALF
from taskloss.validation import all_finite, check_positive

__all__ = ["LayerGradients"]


class LayerGradients:
    """Read, precondition and write back the gradients of ``layers`` (see the module docstring).

    Args:
        layers: the preconditioned layers.

    Attribute ``use_flat_buffers`` (default True): ``False`` runs the per-layer path.
    """

    def __init__(self, layers: list[KFACLayer]):
        self.layers = list(layers)
        self.params = [p for layer in self.layers for p in layer.params]
        self.use_flat_buffers = True
        self._flat: tuple | None = None

    def matrix(self, layer: KFACLayer) -> Tensor | None:
        """``[∇W, ∇b]`` as ``[out, cols]`` (``[out, 1]`` for a bias-only block); ``None`` when there is no grad."""
        w, b = layer.weight, layer.bias
        gb = b.grad if b is not None else None
        if w is None:
            return None if gb is None else gb.unsqueeze(1)
        if w.grad is None:
            return None
        g = layer.weight_matrix(w.grad)
        if b is not None:
            g = torch.cat([g, (gb if gb is not None else torch.zeros_like(b)).unsqueeze(1)], dim=1)
        return g if g.dtype not in HALF else g.float()   # (float16 / bfloat16: preconditioned in float32)

    @torch.no_grad()
    def precondition_(self, factors: KroneckerFactors, kl_clip: float | None, param_groups: list | None,
                      trust_region: float | None = None) -> float:
        """Rewrite every layer's ``.grad`` with its preconditioned gradient (times the clip factor ν of
        :meth:`kl_scale`).

        Args:
            factors: the factors and their current inverses.
            kl_clip: the KL bound (``None``: no clip).
            param_groups: the optimizer's groups, whose current learning rates the KL clip reads.
            trust_region: the bound on ``Σ vᵀg`` (``None``: none).

        Returns:
            ν (1 without a clip).

        Raises:
            ValueError: NaN/inf in a gradient, or a gradient that does not match the factors.
        """
        grads = self._flat_grads()
        if grads is not None:
            return self._precondition_flat(grads, factors, kl_clip, param_groups, trust_region)
        ms: dict[str, Tensor] = {}
        for layer in self.layers:
            m = self.matrix(layer)
            if m is None:
                continue
            k = layer.name
            if m.shape != (factors.G[k].shape[0], factors.A[k].shape[0]):
                raise ValueError(f"layer {k!r}: gradient shape {tuple(m.shape)} does not match the factors")
            ms[k] = m
        clip = kl_clip is not None or trust_region is not None
        if not clip and nonfinite_keys({k: (m,) for k, m in ms.items()}):
            self._raise_nonfinite(ms)
        new = {k: factors.precondition(k, m) for k, m in ms.items()}
        nu = self.kl_scale(new, ms, kl_clip, param_groups, trust_region=trust_region) if clip and new else 1.0
        by_name = {layer.name: layer for layer in self.layers}
        for k, p in new.items():
            self._write_grad(by_name[k], p, nu)
        return nu

    def kl_scale(self, new: dict[str, Tensor], ms: dict[str, Tensor], kl_clip: float | None, param_groups: list | None,
                 flat: tuple[Tensor, Tensor] | None = None, trust_region: float | None = None) -> float:
        """``ν = min(1, sqrt(kl_clip / Σ lr² vᵀg), sqrt(trust_region / Σ vᵀg))`` with each parameter's current
        learning rate (each bound only when given).

        Args:
            new: the preconditioned gradient matrices v per layer.
            ms: the gradient matrices g per layer.
            kl_clip: the KL bound (``None``: none).
            param_groups: the optimizer's groups (their ``lr``; needed by ``kl_clip``).
            flat: all layers' ``v`` and ``g`` as two flat buffers, for one dot product.
            trust_region: the bound on ``Σ vᵀg`` itself, the squared length of ``v`` in the damped K-FAC metric
                (``None``: none).

        Returns:
            ν.

        Raises:
            ValueError: a non-positive learning rate, or a non-finite ``Σ lr² vᵀg``.
        """
        nu = 1.0
        if trust_region is not None:
            total = self._lr_weighted_dot(new, ms, None, flat)
            nu = min(nu, math.sqrt(trust_region / total)) if total > 0 else nu
        if kl_clip is not None:
            total = self._lr_weighted_dot(new, ms, param_groups, flat)
            nu = min(nu, math.sqrt(kl_clip / total)) if total > 0 else nu
        return nu

    def _lr_weighted_dot(self, new: dict[str, Tensor], ms: dict[str, Tensor], param_groups: list | None,
                         flat: tuple[Tensor, Tensor] | None) -> float:
        """``Σ lr² vᵀg`` over the layers (``param_groups=None``: every ``lr = 1``); raises when it is not finite."""
        lrs = [1.0] if param_groups is None else [
            check_positive("optimizer learning rate (for kl_clip)", g["lr"]) for g in param_groups]
        if len(set(lrs)) == 1 and flat is not None:
            total = float(torch.dot(*flat)) * lrs[0]**2
        elif len(set(lrs)) == 1:  # one learning rate: lr² Σ vᵀg
            # one dot product per layer (a fused multiply-add reduction, no [out, D] temporary)
            total = float(torch.stack([torch.dot(new[k].reshape(-1), ms[k].reshape(-1)) for k in new]).sum()) \
                * lrs[0]**2
        else:
            lr_of = {id(p): lr for g, lr in zip(param_groups, lrs) for p in g["params"]}
            by_name, terms = {layer.name: layer for layer in self.layers}, []
            for k in new:
                prod, w, b = new[k] * ms[k], by_name[k].weight, by_name[k].bias
                if w is not None and b is not None:
                    terms += [prod[:, :-1].sum() * lr_of[id(w)]**2, prod[:, -1].sum() * lr_of[id(b)]**2]
                else:
                    terms.append(prod.sum() * lr_of[id(w if w is not None else b)]**2)
            total = float(torch.stack(terms).sum())
        if not math.isfinite(total):
            self._raise_nonfinite(ms)
        return total

    @staticmethod
    def _raise_nonfinite(ms: dict[str, Tensor]) -> None:
        bad = [k for k, m in ms.items() if not all_finite(m)]
        if bad:
            raise ValueError(f"the gradients of K-FAC layers {bad} contain NaN or inf")
        raise ValueError("the preconditioned gradient is not finite although the gradients are: are the K-FAC "
                         "factors / inverses finite and the damping large enough?")

    # -- the flat-buffer path ------------------------------------------------------------------------------
    def _flat_grads(self) -> list[Tensor] | None:
        """The trained parameters' gradients when the flat path applies (building its buffers once), else None."""
        if not self.use_flat_buffers:
            return None
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            return None
        key = (grads[0].dtype, grads[0].device)   # buffers in float32 for float16 / bfloat16 gradients
        if self._flat is None or self._flat[0] != key:
            self._flat = self._build_flat(key)
        return grads if len(self._flat) > 1 else None

    def _build_flat(self, key: tuple) -> tuple:
        """``(key, m_flat, p_flat, [m per layer], [p per layer], [m blocks per parameter], [p blocks ...],
        [(work, work) per layer])``, or ``(key,)`` when the trained parameters do not share one dtype and device
        (the work buffers, two of the largest layer's size shared by all layers, hold the intermediate products of
        :func:`~taskloss.curvature.kfac_math.precondition`)."""
        if any((p.dtype, p.device) != key for p in self.params):
            return (key,)
        sizes = [(layer.out, layer.cols) for layer in self.layers]
        dtype = torch.float32 if key[0] in HALF else key[0]
        bufs = torch.empty(2, sum(o * d for o, d in sizes), dtype=dtype, device=key[1])
        mats = [[v.view(o, d) for v, (o, d) in zip(t.split([o * d for o, d in sizes]), sizes)] for t in bufs]
        scratch = torch.empty(2, max(o * d for o, d in sizes), dtype=dtype, device=key[1])  # largest layer
        work = [(scratch[0, : o * d].view(o, d), scratch[1, : o * d].view(o, d)) for o, d in sizes]
        blocks = []  # per trained parameter, its columns of the layer matrix, viewed in the parameter's shape
        for ms in mats:
            blocks.append([])
            for layer, m in zip(self.layers, ms):
                if layer.weight is not None:   # (a Conv1D's weight [in, out] is the transposed block)
                    w = m[:, : layer.fan_in]
                    blocks[-1].append(w.T if layer.transposed else w.view(layer.weight.shape))
                if layer.bias is not None:
                    blocks[-1].append(m[:, -1])
        return (key, bufs[0], bufs[1], *mats, *blocks, work)

    def _precondition_flat(self, grads: list[Tensor], factors: KroneckerFactors, kl_clip: float | None,
                           param_groups: list | None, trust_region: float | None = None) -> float:
        _, m_flat, p_flat, ms, ps, m_blocks, p_blocks, work = self._flat
        names = [layer.name for layer in self.layers]
        torch._foreach_copy_(m_blocks, grads)
        clip = kl_clip is not None or trust_region is not None
        if not clip and not math.isfinite(float(m_flat.sum())) and nonfinite_keys(
                {k: (m,) for k, m in zip(names, ms)}):  # (a finite sum proves every entry finite)
            self._raise_nonfinite(dict(zip(names, ms)))
        for k, m, p, w in zip(names, ms, ps, work):
            factors.precondition(k, m, out=p, work=w)
        nu = 1.0
        if clip:
            nu = self.kl_scale(dict(zip(names, ps)), dict(zip(names, ms)), kl_clip, param_groups, (p_flat, m_flat),
                               trust_region)
            if nu != 1.0:
                p_flat.mul_(nu)
        torch._foreach_copy_(grads, p_blocks)
        return nu

    @staticmethod
    def _write_grad(layer: KFACLayer, p: Tensor, nu: float) -> None:
        """``.grad ← ν·p`` for the weight (first ``D`` columns) and the bias (last column); one pass each."""
        w, b = layer.weight, layer.bias
        if w is not None:
            g = w.grad
            dst = g.view(g.shape[0], -1) if g.is_contiguous() and not layer.transposed else None
            src = p[:, : layer.fan_in]
            if layer.transposed:
                g.copy_((src * nu if nu != 1.0 else src).T)
            elif dst is None:
                g.copy_((src * nu if nu != 1.0 else src).reshape(g.shape))
            elif nu != 1.0:
                torch.mul(src, nu, out=dst)
            else:
                dst.copy_(src)
        if b is not None:
            if b.grad is None:
                b.grad = torch.zeros_like(b)
            if nu != 1.0:
                torch.mul(p[:, -1], nu, out=b.grad)
            else:
                b.grad.copy_(p[:, -1])
