"""K-FAC: Kronecker-factored approximate curvature for ``nn.Linear`` and ``nn.Conv2d`` as a gradient preconditioner.

After "Optimizing Neural Networks with Kronecker-factored Approximate Curvature" (fully connected layers) and
"A Kronecker-factored approximate Fisher matrix for convolution layers" (patches). Derived in notebook
07_fisher_approximations.

For a layer ``s = W a`` (bias as a homogeneous coordinate: ``a ← [a, 1]``, ``W ← [W, b]``) the per-example weight
gradient is ``g aᵀ`` with ``g = ∂ℓ/∂s``, and the layer's Fisher block is approximated by ``A ⊗ G`` (acting on the
row-major flattening of ``[W, b]`` as ``G ⊗ A``), with ``A = E[a aᵀ]`` and ``G = E[g gᵀ]`` estimated on the batch and
averaged over steps. Conv2d: ``a`` are the unfolded input patches and ``g`` the output gradients at each of the
``L`` spatial locations ("expand" convention, as curvlinops' ``KFACType.EXPAND``):
``A = (1/NL) Σ_{n,l} a aᵀ``, ``G = (1/N) Σ_{n,l} g gᵀ``. Scale: the curvature of the batch-mean NLL, see
:mod:`taskloss.curvature.fisher` — so ``G`` uses per-example gradients ``g_n`` (not the ``1/N``-scaled ones of the mean).

Fisher types for ``G`` (explicit, ``fisher_type``):

* ``"mc"``: ``g`` back-propagated from labels sampled from the model's predictive distribution ``p(y | f)``
  (``n_samples`` draws; K-FAC proper, unbiased for the true Fisher);
* ``"empirical"``: ``g`` from the observed targets (the empirical Fisher — biased, see notebook 07);
* ``"exact"``: the ``C`` columns of ``H_out^{1/2}`` are back-propagated (the "type-2" Fisher; exact for one example).

Usage::

    kfac = KFAC(model, damping=1e-3, fisher_type="mc")
    out = model(x)                      # forward hooks record layer inputs/outputs
    loss = nll_loss(out, y)             # batch-mean NLL (taskloss.curvature.fisher convention)
    kfac.update(out, y)                 # G-backward (retains the graph) → running factors; y unused for "mc"
    opt.zero_grad(); loss.backward()
    kfac.step()                         # .grad ← (A ⊗ G + λ)⁻¹ .grad (inverses refreshed every T_inv steps)
    opt.step()                          # e.g. torch.optim.SGD(model.parameters(), lr, momentum=0.9)
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from taskloss.curvature.fisher import (
    LIKELIHOODS,
    _check_outputs,
    _check_targets,
    _nll_grad,
    output_hessian_sqrt,
    sample_targets,
)
from taskloss.utils import check_int, check_positive, check_probability

__all__ = ["KFAC"]

SUPPORTED = (nn.Linear, nn.Conv2d)


class KFAC:
    """K-FAC preconditioner: ``kfac.update(outputs, targets)`` then ``kfac.step()`` rewrites ``.grad``.

    Args:
        model: the network; every ``nn.Linear`` / ``nn.Conv2d`` with trainable parameters is preconditioned. Any
            other module owning trainable parameters raises ``ValueError`` unless ``skip_unsupported=True`` (then
            its gradients are left untouched and it is listed in ``self.skipped``).
        damping: Tikhonov damping λ > 0. ``damping_mode="eigen"`` inverts ``A ⊗ G + λI`` exactly through the
            factors' eigendecompositions; ``"pi"`` uses the factored ``(A + π√λ I) ⊗ (G + √λ/π I)`` with
            ``π = sqrt((tr A / dim A) / (tr G / dim G))`` (the K-FAC paper's π-heuristic).
        fisher_type: ``"mc"`` | ``"empirical"`` | ``"exact"`` (see the module docstring).
        likelihood: ``"categorical"`` (outputs are logits) or ``"gaussian"`` (outputs are means of N(f, I)).
        decay: running-average weight of old factors, ``F ← decay·F + (1 − decay)·F_batch`` (0 → batch only).
        factor_update_interval, inverse_update_interval: recompute factors in every k-th ``update`` call, and the
            eigendecompositions / inverses in every k-th ``step`` call (a changed ``damping`` takes effect there).
        kl_clip, lr: if ``kl_clip`` is set, scale the step by ``ν = min(1, sqrt(kl_clip / (lr² Σ gᵀ F⁻¹ g)))``.
        n_samples, generator: MC labels per example and the generator drawing them.
    """

    FISHER_TYPES = ("mc", "empirical", "exact")
    DAMPING_MODES = ("eigen", "pi")

    def __init__(self, model: nn.Module, *, damping: float = 1e-3, fisher_type: str = "mc",
                 likelihood: str = "categorical", decay: float = 0.95, factor_update_interval: int = 1,
                 inverse_update_interval: int = 10, damping_mode: str = "eigen", kl_clip: float | None = None,
                 lr: float | None = None, n_samples: int = 1, generator: torch.Generator | None = None,
                 skip_unsupported: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError("model must be an nn.Module")
        if fisher_type not in self.FISHER_TYPES:
            raise ValueError(f"fisher_type must be one of {self.FISHER_TYPES}, got {fisher_type!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if damping_mode not in self.DAMPING_MODES:
            raise ValueError(f"damping_mode must be one of {self.DAMPING_MODES}, got {damping_mode!r}")
        self.damping = check_positive("damping", damping)
        self.decay = check_probability("decay", decay)
        if self.decay == 1.0:
            raise ValueError("decay must be < 1")
        self.factor_update_interval = check_int("factor_update_interval", factor_update_interval, minimum=1)
        self.inverse_update_interval = check_int("inverse_update_interval", inverse_update_interval, minimum=1)
        self.kl_clip = None if kl_clip is None else check_positive("kl_clip", kl_clip)
        if self.kl_clip is not None and lr is None:
            raise ValueError("kl_clip needs the optimizer's learning rate lr")
        self.lr = None if lr is None else check_positive("lr", lr)
        self.n_samples = check_int("n_samples", n_samples, minimum=1)
        if fisher_type != "mc" and n_samples != 1:
            raise ValueError("n_samples > 1 only makes sense for fisher_type='mc'")
        self.model, self.fisher_type, self.likelihood = model, fisher_type, likelihood
        self.damping_mode, self.generator = damping_mode, generator

        self.modules: dict[str, nn.Module] = {}
        self.skipped: list[str] = []
        for name, mod in model.named_modules():
            own = [p for p in mod.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if isinstance(mod, SUPPORTED) and mod.weight.requires_grad:
                if isinstance(mod, nn.Conv2d) and (mod.groups != 1 or mod.padding_mode != "zeros"
                                                   or isinstance(mod.padding, str)):
                    if not skip_unsupported:
                        raise ValueError(f"Conv2d {name!r}: only groups=1, padding_mode='zeros' and numeric "
                                         "padding are supported (or pass skip_unsupported=True)")
                    self.skipped.append(name)
                    continue
                self.modules[name] = mod
            elif skip_unsupported:
                self.skipped.append(name)
            else:
                raise ValueError(f"module {name!r} ({type(mod).__name__}) has trainable parameters but K-FAC "
                                 "supports only nn.Linear and nn.Conv2d; pass skip_unsupported=True to leave "
                                 "its gradients unpreconditioned")
        if not self.modules:
            raise ValueError("model has no trainable nn.Linear / nn.Conv2d layer")
        self.A: dict[str, Tensor] = {}
        self.G: dict[str, Tensor] = {}
        self._inv: dict[str, tuple[Tensor, ...]] = {}
        self._inputs: dict[str, list[Tensor]] = {n: [] for n in self.modules}
        self._outputs: dict[str, list[Tensor]] = {n: [] for n in self.modules}
        self._n_updates = self._n_steps = 0
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in self.modules.items()]
        # each forward of the whole model starts a fresh record (an evaluation pass simply replaces it)
        self._handles.append(model.register_forward_pre_hook(lambda mod, args: self._clear()))

    # ------------------------------------------------------------------------------------------ recording
    def _hook(self, name):
        def hook(mod, inputs, output):
            if torch.is_grad_enabled() and output.requires_grad:
                self._inputs[name].append(inputs[0].detach())
                self._outputs[name].append(output)
        return hook

    def remove(self) -> None:
        """Remove the forward hooks (the object cannot record afterwards)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _clear(self):
        for n in self.modules:
            self._inputs[n].clear()
            self._outputs[n].clear()

    def _patches(self, name: str, a: Tensor) -> Tensor:
        """Layer inputs as rows ``[N·L, D(+1)]`` (homogeneous coordinate appended when the layer has a bias)."""
        mod = self.modules[name]
        bias = mod.bias is not None and mod.bias.requires_grad
        if isinstance(mod, nn.Conv2d) and tuple(mod.dilation) == (1, 1):
            # patches as a strided view of the padded input, written once into [N, H', W', C·kh·kw(+1)]: the
            # same numbers as unfold → transpose → reshape → cat, with one copy instead of three (and no im2col)
            (kh, kw), (sh, sw), (ph, pw) = mod.kernel_size, mod.stride, mod.padding
            x = nn.functional.pad(a, (pw, pw, ph, ph)) if ph or pw else a
            view = x.unfold(2, kh, sh).unfold(3, kw, sw).permute(0, 2, 3, 1, 4, 5)   # [N, H', W', C, kh, kw]
            d = view.shape[3] * kh * kw
            out = a.new_empty(*view.shape[:3], d + bias)
            out[..., :d].unflatten(-1, view.shape[3:]).copy_(view)
            if bias:
                out[..., d] = 1.0
            return out.reshape(-1, d + bias)
        if isinstance(mod, nn.Conv2d):
            a = nn.functional.unfold(a, mod.kernel_size, dilation=mod.dilation, padding=mod.padding,
                                     stride=mod.stride).transpose(1, 2)                   # [N, L, C_in·kh·kw]
        a = a.reshape(-1, a.shape[-1])
        if bias:
            a = torch.cat([a, a.new_ones(a.shape[0], 1)], dim=1)
        return a

    def _output_cotangents(self, outputs: Tensor, targets: Tensor | None) -> Tensor:
        """Per-example output-space vectors ``V [K, N, C]`` whose back-propagation gives the ``g`` samples."""
        out = outputs.detach()
        if self.fisher_type == "empirical":
            if targets is None:
                raise ValueError("fisher_type='empirical' needs the observed targets")
            _check_targets(out, targets, self.likelihood)
            return _nll_grad(out, targets, self.likelihood).unsqueeze(0)
        if self.fisher_type == "exact":
            return output_hessian_sqrt(out, self.likelihood).permute(2, 0, 1)
        ys = sample_targets(out, self.likelihood, self.n_samples, self.generator)
        if self.n_samples == 1:  # (dividing by √1 would only cost an allocation)
            return _nll_grad(out, ys[0], self.likelihood).unsqueeze(0)
        return torch.stack([_nll_grad(out, y, self.likelihood) for y in ys]) / math.sqrt(self.n_samples)

    def update(self, outputs: Tensor, targets: Tensor | None = None) -> None:
        """Fold this batch's factors into the running averages (every ``factor_update_interval``-th call).

        ``outputs [N, C]``: the logits / means the loss is computed from, still attached to the graph of the
        forward pass that the hooks recorded. ``targets``: observed labels (needed for ``"empirical"``, checked
        for shape otherwise). The extra backward uses ``retain_graph=True`` and does not touch ``.grad``.
        """
        try:
            self._update(outputs, targets)
        finally:
            self._clear()  # drop the recorded activations (and their graph) whatever happened

    def _update(self, outputs: Tensor, targets: Tensor | None) -> None:
        if not isinstance(outputs, Tensor) or outputs.ndim != 2:
            raise ValueError("outputs must be a tensor of shape [N, C]")
        if not outputs.requires_grad:
            raise ValueError("outputs must be attached to the autograd graph (computed with grad enabled)")
        counts = {n: len(v) for n, v in self._outputs.items()}
        if any(c != 1 for c in counts.values()):
            raise RuntimeError(f"each K-FAC layer must be called exactly once per update (calls: {counts}); run "
                               "one forward pass of the model with grad enabled before update()")
        n = outputs.shape[0]
        for name in self.modules:
            seen = self._inputs[name][0].shape[0]
            if seen != n:
                raise ValueError(f"layer {name!r} saw batch size {seen}, but outputs have batch size {n}")
        self._n_updates += 1
        if (self._n_updates - 1) % self.factor_update_interval != 0:
            return
        _check_outputs(outputs.detach(), self.likelihood)  # value checks only when the factors are computed
        if targets is not None:
            _check_targets(outputs, targets, self.likelihood)
        names = list(self.modules)
        s_list = [self._outputs[k][0] for k in names]
        cot = self._output_cotangents(outputs, targets)                               # [K, N, C]
        if cot.shape[0] == 1:
            grads = [g.unsqueeze(0) if g is not None else None for g in
                     torch.autograd.grad(outputs, s_list, cot[0], retain_graph=True, allow_unused=True)]
        else:  # K backward passes at once (vmapped over the cotangents)
            grads = torch.autograd.grad(outputs, s_list, cot, retain_graph=True, allow_unused=True,
                                        is_grads_batched=True)
        with torch.no_grad():
            for k, g in zip(names, grads):
                if g is None:
                    raise ValueError(f"outputs do not depend on layer {k!r}")
                if isinstance(self.modules[k], nn.Conv2d):
                    g = g.movedim(2, -1)                                           # [K, N, H, W, C_out]
                g = g.reshape(-1, g.shape[-1])
                a = self._patches(k, self._inputs[k][0])
                A_new, G_new = (a.T @ a).div_(a.shape[0]), (g.T @ g).div_(n)   # in place: no extra buffers
                if k in self.A and self.decay > 0:  # (a fused addmm_ would round differently than this)
                    self.A[k].mul_(self.decay).add_(A_new, alpha=1 - self.decay)
                    self.G[k].mul_(self.decay).add_(G_new, alpha=1 - self.decay)
                else:
                    self.A[k], self.G[k] = A_new, G_new

    # ------------------------------------------------------------------------------------ preconditioning
    def _grad_matrix(self, mod) -> Tensor:
        g = mod.weight.grad.reshape(mod.weight.shape[0], -1)
        if mod.bias is not None and mod.bias.requires_grad:
            b = mod.bias.grad if mod.bias.grad is not None else torch.zeros_like(mod.bias)
            g = torch.cat([g, b.unsqueeze(1)], dim=1)
        return g                                                                       # [out, D(+1)]

    def _refresh_inverses(self) -> None:
        """Eigendecompose (``"eigen"``) or invert the damped factors (``"pi"``) of every layer."""
        for k in self.modules:
            if self.damping_mode == "eigen":
                la, qa = torch.linalg.eigh(self.A[k])
                lg, qg = torch.linalg.eigh(self.G[k])
                inv_den = 1.0 / (lg.clamp(min=0)[:, None] * la.clamp(min=0)[None, :] + self.damping)
                self._inv[k] = (qa, qg, inv_den)
            else:
                A, G = self.A[k], self.G[k]
                pi = math.sqrt((float(A.trace()) / A.shape[0] + 1e-30) / (float(G.trace()) / G.shape[0] + 1e-30))
                root = math.sqrt(self.damping)
                eye_a = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
                eye_g = torch.eye(G.shape[0], dtype=G.dtype, device=G.device)
                self._inv[k] = (torch.cholesky_inverse(torch.linalg.cholesky(A + root * pi * eye_a)),
                                torch.cholesky_inverse(torch.linalg.cholesky(G + root / pi * eye_g)))

    def _precondition(self, k: str, m: Tensor) -> Tensor:
        if self.damping_mode == "eigen":            # (A ⊗ G + λI)⁻¹ in the factors' eigenbases: 4 matmuls
            qa, qg, inv_den = self._inv[k]
            return qg @ (qg.T @ m @ qa).mul_(inv_den) @ qa.T
        inv_a, inv_g = self._inv[k]                 # (G + √λ/π)⁻¹ M (A + π√λ)⁻¹: 2 matmuls
        return inv_g @ m @ inv_a

    @torch.no_grad()
    def step(self) -> float:
        """Rewrite ``.grad`` of every K-FAC layer with ``(A ⊗ G + λ)⁻¹ grad``; returns the KL-clip factor ν."""
        if not self.A:
            raise RuntimeError("call update(outputs, targets) at least once before step()")
        if self._n_steps % self.inverse_update_interval == 0 or not self._inv:
            self._refresh_inverses()
        self._n_steps += 1
        new, vg = {}, []
        for k, mod in self.modules.items():
            if mod.weight.grad is None:
                continue
            m = self._grad_matrix(mod)
            if m.shape != (self.G[k].shape[0], self.A[k].shape[0]):
                raise ValueError(f"layer {k!r}: gradient shape {tuple(m.shape)} does not match the factors")
            new[k] = self._precondition(k, m)
            if self.kl_clip is not None:
                vg.append((new[k] * m).sum())
        nu = 1.0
        if self.kl_clip is not None and vg:
            total = float(torch.stack(vg).sum())
            if total > 0:
                nu = min(1.0, math.sqrt(self.kl_clip / (self.lr**2 * total)))
        for k, p in new.items():
            mod = self.modules[k]
            if nu != 1.0:
                p.mul_(nu)
            w = mod.weight.shape
            mod.weight.grad.copy_(p[:, : w[1:].numel()].reshape(w))
            if mod.bias is not None and mod.bias.requires_grad:
                if mod.bias.grad is None:
                    mod.bias.grad = torch.zeros_like(mod.bias)
                mod.bias.grad.copy_(p[:, -1])
        return nu

    def to_dense(self) -> Tensor:
        """Block-diagonal K-FAC matrix ``[P, P]`` (no damping) in the order of ``model.named_parameters()``
        restricted to the K-FAC layers (per layer: weight flattened row-major, then bias)."""
        if not self.A:
            raise RuntimeError("no factors yet: call update() first")
        blocks = []
        for k, mod in self.modules.items():
            out, d = self.G[k].shape[0], self.A[k].shape[0]
            block = torch.kron(self.G[k], self.A[k])                                   # row-major vec([W, b])
            has_bias = mod.bias is not None and mod.bias.requires_grad
            idx = torch.arange(out * d).view(out, d)
            order = torch.cat([idx[:, : d - 1].reshape(-1), idx[:, -1]]) if has_bias else idx.reshape(-1)
            blocks.append(block[order][:, order])
        return torch.block_diag(*blocks)
