"""K-FAC's gradient side: the damped inverses of the factors, ``step`` (preconditioned gradients written back into
``.grad``), the KL clip, and the flat-buffer fast path with its per-layer fallback.

:class:`KFACStepMixin` is a base class of :class:`taskloss.curvature.kfac.KFAC` and works on the attributes that
``KFAC.__init__`` sets (``modules``, ``A``, ``G``, ``_inv``, ``_w``, ``_b``, ``_d``, ``_params``, the damping and the
intervals); the maths it calls is in :mod:`taskloss.curvature.kfac_math`. Derived in notebook
07_fisher_approximations; ``benchmarks/bench_curvature.py`` measures the step against its FLOP floor.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from taskloss.curvature.kfac_math import (
    eigen_denominator,
    eigen_inverse,
    eigenvalues_in_basis,
    nonfinite_keys,
    pi_inverse,
    precondition,
)
from taskloss.utils import all_finite, check_positive

__all__ = ["KFACStepMixin"]


class KFACStepMixin:
    """``step()`` and the inverses of :class:`~taskloss.curvature.kfac.KFAC` (see its docstring for the public API)."""

    def _grad_matrix(self, k: str) -> Tensor | None:
        """``[∇W, ∇b]`` as ``[out, D(+1)]`` (``[out, 1]`` for a bias-only block); ``None`` when there is no grad."""
        w, b = self._w[k], self._b[k]
        gb = b.grad if b is not None else None
        if w is None:
            return None if gb is None else gb.unsqueeze(1)
        if w.grad is None:
            return None
        g = w.grad.reshape(w.shape[0], -1)
        if b is not None:
            g = torch.cat([g, (gb if gb is not None else torch.zeros_like(b)).unsqueeze(1)], dim=1)
        return g                                                                       # [out, D(+1)]

    def _refresh_inverses(self) -> None:
        """Eigendecompose / rescale (``"eigen"``) or invert the damped factors (``"pi"``) of every layer."""
        bad = nonfinite_keys({k: (self.A[k], self.G[k]) for k in self.modules})
        if bad:
            raise ValueError(f"the K-FAC factors of layers {bad} contain NaN or inf (non-finite activations or "
                             "output gradients were recorded by update())")
        if self.damping_mode == "pi":
            self._inv = {k: pi_inverse(self.A[k], self.G[k], self._damping, k) for k in self.modules}
        elif self._n_steps % self.eigenbasis_update_interval == 0 or not self._inv:
            self._inv = {k: eigen_inverse(self.A[k], self.G[k], self._damping, k) for k in self.modules}
        else:  # keep the eigenbases, re-estimate the eigenvalues in them
            for k, (qa, qg, _, _, _) in self._inv.items():
                la, lg = eigenvalues_in_basis(self.A[k], qa), eigenvalues_in_basis(self.G[k], qg)
                self._inv[k] = (qa, qg, la, lg, eigen_denominator(la, lg, self._damping))
        self._inv_damping = self._damping

    def _apply_damping_change(self) -> None:
        if self.damping_mode == "pi":
            self._refresh_inverses()
            return
        for k, (qa, qg, la, lg, _) in self._inv.items():
            self._inv[k] = (qa, qg, la, lg, eigen_denominator(la, lg, self._damping))
        self._inv_damping = self._damping

    def _kl_scale(self, new: dict[str, Tensor], ms: dict[str, Tensor], flat: tuple[Tensor, Tensor] | None = None
                  ) -> float:
        """``ν = min(1, sqrt(kl_clip / Σ lr² vᵀg))`` with each parameter's current learning rate (``flat``: all
        layers' ``v`` and ``g`` as two flat buffers, for one dot product)."""
        groups = self.optimizer.param_groups
        lrs = [check_positive("optimizer learning rate (for kl_clip)", g["lr"]) for g in groups]
        if len(set(lrs)) == 1 and flat is not None:
            total = float(torch.dot(*flat)) * lrs[0]**2
        elif len(set(lrs)) == 1:  # one learning rate: lr² Σ vᵀg
            # one dot product per layer (a fused multiply-add reduction, no [out, D] temporary)
            total = float(torch.stack([torch.dot(new[k].reshape(-1), ms[k].reshape(-1)) for k in new]).sum()) \
                * lrs[0]**2
        else:
            lr_of = {id(p): lr for g, lr in zip(groups, lrs) for p in g["params"]}
            terms = []
            for k in new:
                prod, w, b = new[k] * ms[k], self._w[k], self._b[k]
                if w is not None and b is not None:
                    terms += [prod[:, :-1].sum() * lr_of[id(w)]**2, prod[:, -1].sum() * lr_of[id(b)]**2]
                else:
                    terms.append(prod.sum() * lr_of[id(w if w is not None else b)]**2)
            total = float(torch.stack(terms).sum())
        if not math.isfinite(total):
            self._raise_nonfinite(ms)
        return min(1.0, math.sqrt(self.kl_clip / total)) if total > 0 else 1.0

    @staticmethod
    def _raise_nonfinite(ms: dict[str, Tensor]) -> None:
        bad = [k for k, m in ms.items() if not all_finite(m)]
        if bad:
            raise ValueError(f"the gradients of K-FAC layers {bad} contain NaN or inf")
        raise ValueError("the preconditioned gradient is not finite although the gradients are: are the K-FAC "
                         "factors / inverses finite and the damping large enough?")

    @torch.no_grad()
    def step(self) -> float:
        """Rewrite ``.grad`` of every K-FAC layer with ``(A ⊗ G + λ)⁻¹ grad``; returns the KL-clip factor ν.

        Raises ``ValueError`` on NaN/inf gradients or factors and on an invalid (changed) hyperparameter.
        """
        if not self.A:
            raise RuntimeError("call update(outputs, targets) at least once before step()")
        hyper = (self._damping, self.decay, self.factor_update_interval, self.inverse_update_interval,
                 self.eigenbasis_update_interval, self.kl_clip)
        if hyper != self._checked:  # attributes may have been changed since the last check
            self._check_hyperparameters()
            self._checked = hyper
        if self._n_steps % self.inverse_update_interval == 0 or not self._inv:
            self._refresh_inverses()
        elif self._damping != self._inv_damping:
            self._apply_damping_change()
        self._n_steps += 1
        grads = self._flat_grads()
        if grads is not None:
            return self._step_flat(grads)
        ms: dict[str, Tensor] = {}
        for k in self.modules:
            m = self._grad_matrix(k)
            if m is None:
                continue
            if m.shape != (self.G[k].shape[0], self.A[k].shape[0]):
                raise ValueError(f"layer {k!r}: gradient shape {tuple(m.shape)} does not match the factors")
            ms[k] = m
        if self.kl_clip is None and nonfinite_keys({k: (m,) for k, m in ms.items()}):
            self._raise_nonfinite(ms)
        new = {k: precondition(self._inv[k], m) for k, m in ms.items()}
        nu = self._kl_scale(new, ms) if self.kl_clip is not None and new else 1.0
        for k, p in new.items():
            self._write_grad(k, p, nu)
        return nu

    # One flat buffer holds every layer's gradient matrix [∇W, ∇b] and one their preconditioned images, as views
    # [out, D(+1)]: a step gathers the gradients with one foreach copy, preconditions into the views (the same
    # matmuls as above), takes vᵀg as one dot product, scales by ν once and scatters back with one foreach copy —
    # a handful of kernel launches instead of ~15 per layer. Used when every trained parameter has a gradient of
    # the buffers' dtype and device (the usual case); otherwise the per-layer path above runs.
    def _flat_grads(self) -> list[Tensor] | None:
        """The trained parameters' gradients when the flat path applies (building its buffers once), else None."""
        if not self.use_flat_buffers:
            return None
        grads = [p.grad for p in self._params]
        if any(g is None for g in grads):
            return None
        key = (grads[0].dtype, grads[0].device)
        if self._flat is None or self._flat[0] != key:
            self._flat = self._build_flat(key)
        return grads if len(self._flat) > 1 else None

    def _build_flat(self, key: tuple) -> tuple:
        """``(key, m_flat, p_flat, [m per layer], [p per layer], [m blocks per parameter], [p blocks ...],
        [(work, work) per layer])``, or ``(key,)`` when the trained parameters do not share one dtype and device
        (the work buffers, two of the largest layer's size shared by all layers, hold the intermediate products of
        :func:`~taskloss.curvature.kfac_math.precondition`)."""
        if any((p.dtype, p.device) != key for p in self._params):
            return (key,)
        sizes = [(k, self._w[k].shape[0] if self._w[k] is not None else self._b[k].shape[0],
                  self._d[k] * (self._w[k] is not None) + (self._b[k] is not None)) for k in self.modules]
        bufs = torch.empty(2, sum(o * d for _, o, d in sizes), dtype=key[0], device=key[1])
        mats = [[v.view(o, d) for v, (_, o, d) in zip(t.split([o * d for _, o, d in sizes]), sizes)] for t in bufs]
        scratch = torch.empty(2, max(o * d for _, o, d in sizes), dtype=key[0], device=key[1])  # largest layer
        work = [(scratch[0, : o * d].view(o, d), scratch[1, : o * d].view(o, d)) for _, o, d in sizes]
        blocks = []  # per trained parameter, its columns of the layer matrix, viewed in the parameter's shape
        for ms in mats:
            blocks.append([])
            for k, m in zip(self.modules, ms):
                if self._w[k] is not None:
                    blocks[-1].append(m[:, : self._d[k]].view(self._w[k].shape))
                if self._b[k] is not None:
                    blocks[-1].append(m[:, -1])
        return (key, bufs[0], bufs[1], *mats, *blocks, work)

    def _step_flat(self, grads: list[Tensor]) -> float:
        _, m_flat, p_flat, ms, ps, m_blocks, p_blocks, work = self._flat
        torch._foreach_copy_(m_blocks, grads)
        if self.kl_clip is None and not math.isfinite(float(m_flat.sum())) and nonfinite_keys(
                {k: (m,) for k, m in zip(self.modules, ms)}):  # (a finite sum proves every entry finite)
            self._raise_nonfinite(dict(zip(self.modules, ms)))
        for k, m, p, w in zip(self.modules, ms, ps, work):
            precondition(self._inv[k], m, out=p, work=w)
        nu = 1.0
        if self.kl_clip is not None:
            nu = self._kl_scale(dict(zip(self.modules, ps)), dict(zip(self.modules, ms)), (p_flat, m_flat))
            if nu != 1.0:
                p_flat.mul_(nu)
        torch._foreach_copy_(grads, p_blocks)
        return nu

    def _write_grad(self, k: str, p: Tensor, nu: float) -> None:
        """``.grad ← ν·p`` for the weight (first ``D`` columns) and the bias (last column); one pass each."""
        w, b = self._w[k], self._b[k]
        if w is not None:
            g = w.grad
            dst = g.view(g.shape[0], -1) if g.is_contiguous() else None
            src = p[:, : self._d[k]]
            if dst is None:
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
