"""K-FAC's maths as pure functions: layer inputs as rows, Kronecker factors, damped inverses, preconditioning.

The stateful shell (hooks, running averages, intervals, checkpoints) is :class:`taskloss.curvature.kfac.KFAC`;
this module holds what can be tested without hooks, after the split of curvlinops' ``kfac.py`` /
``computers/kfac_math.py``, and the plain K-FAC step :func:`kfac_precondition_reference` that the tuned one is tested
against. Inputs are validated by ``KFAC``; these functions assume finite tensors of matching
shapes. Derived in notebook 07_fisher_approximations.

Per layer ``s = W a`` (bias as a homogeneous coordinate) the curvature block is ``A ⊗ G`` acting on the row-major
flattening of ``M = [W, b]`` (shape ``[out, D(+1)]``) as ``vec(G M A)``, so
``(A ⊗ G + λI)⁻¹ vec(M) = vec(Q_G [(Q_Gᵀ M Q_A) / (λ_G λ_Aᵀ + λ)] Q_Aᵀ)`` ("eigen" damping, exact) and
``(A + π√λ I)⁻¹``-``(G + √λ/π I)⁻¹`` sandwich ``M`` for the factored ("pi") damping of Martens & Grosse
(ICML 2015, section 6.3).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["layer_rows", "input_moment", "second_moment", "fold_moment", "eigen_inverse", "eigen_denominator",
           "eigenvalues_in_basis", "pi_inverse", "precondition", "nonfinite_keys", "kfac_precondition_reference"]


def layer_rows(mod: nn.Module, a: Tensor, bias: bool) -> Tensor:
    """The layer's inputs as rows ``[N·L, D(+1)]``: Linear inputs ``[N, ..., D]`` flattened over the leading
    dimensions; Conv2d input patches (``L`` locations, "expand" convention); a column of ones appended when the
    layer's bias is trained."""
    if isinstance(mod, nn.Conv2d) and tuple(mod.dilation) == (1, 1):
        # patches as a strided view of the padded input, written once into [N, H', W', C·kh·kw(+1)]: the same
        # numbers as unfold → transpose → reshape → cat, with one copy instead of three (and no im2col)
        (kh, kw), (sh, sw), (ph, pw) = mod.kernel_size, mod.stride, mod.padding
        x = nn.functional.pad(a, (pw, pw, ph, ph)) if ph or pw else a
        view = x.unfold(2, kh, sh).unfold(3, kw, sw).permute(0, 2, 3, 1, 4, 5)       # [N, H', W', C, kh, kw]
        d = view.shape[3] * kh * kw
        out = a.new_empty(*view.shape[:3], d + bias)
        out[..., :d].unflatten(-1, view.shape[3:]).copy_(view)
        if bias:
            out[..., d] = 1.0
        return out.reshape(-1, d + bias)
    if isinstance(mod, nn.Conv2d):
        a = nn.functional.unfold(a, mod.kernel_size, dilation=mod.dilation, padding=mod.padding,
                                 stride=mod.stride).transpose(1, 2)                       # [N, L, C_in·kh·kw]
    a = a.reshape(-1, a.shape[-1])
    if bias:
        a = torch.cat([a, a.new_ones(a.shape[0], 1)], dim=1)
    return a


def input_moment(mod: nn.Module, a: Tensor, bias: bool, old: Tensor | None = None, decay: float = 0.0) -> Tensor:
    """``A = rowsᵀ rows / R`` for the rows of :func:`layer_rows` (``R`` of them), without materializing them in
    that column order for a Conv2d (dilation 1): the patches are copied from a channels-last copy of the padded
    input in (kh, kw, C) column order — whole runs of ``C`` contiguous numbers instead of ``kw``-long ones, several
    times faster on CPU — and the ``[D(+1), D(+1)]`` product is permuted back to ``layer_rows``' (C, kh, kw)
    order. Every entry is the same sum over the same rows (a permutation of ``A``'s rows and columns).

    With ``old`` (a running average) and ``decay > 0`` the result is folded into ``old`` in place:
    ``old ← decay·old + (1 − decay)·A`` (:func:`fold_moment`: one ``addmm`` for the rows of a Linear layer)."""
    if not (isinstance(mod, nn.Conv2d) and tuple(mod.dilation) == (1, 1)):
        rows = layer_rows(mod, a, bias)
        return fold_moment(old, rows, rows.shape[0], decay)
    (kh, kw), (sh, sw), (ph, pw) = mod.kernel_size, mod.stride, mod.padding
    c = a.shape[1]
    x = (nn.functional.pad(a, (pw, pw, ph, ph)) if ph or pw else a).permute(0, 2, 3, 1).contiguous()
    view = x.unfold(1, kh, sh).unfold(2, kw, sw).permute(0, 1, 2, 4, 5, 3)         # [N, H', W', kh, kw, C]
    d = c * kh * kw
    rows = a.new_empty(*view.shape[:3], d + bias)
    rows[..., :d].unflatten(-1, view.shape[3:]).copy_(view)
    if bias:
        rows[..., d] = 1.0
    rows = rows.reshape(-1, d + bias)
    order = torch.arange(d, device=a.device).view(kh, kw, c).permute(2, 0, 1).reshape(-1)   # (C, kh, kw) ← rows
    if bias:
        order = torch.cat([order, order.new_full((1,), d)])
    new = second_moment(rows, rows.shape[0])[order][:, order]
    return new if old is None or decay == 0 else old.mul_(decay).add_(new, alpha=1 - decay)


def second_moment(x: Tensor, n: int) -> Tensor:
    """``xᵀx / n`` for rows ``x [R, D]`` (``n``: the normalizer — rows for ``A``, loss terms for ``G``)."""
    return (x.T @ x).div_(n)


def fold_moment(old: Tensor | None, x: Tensor, n: int, decay: float) -> Tensor:
    """The running average ``old ← decay·old + (1 − decay)·xᵀx/n`` in place as one ``addmm`` (no ``[D, D]``
    temporary, one pass over ``old``); ``xᵀx/n`` (:func:`second_moment`) when ``old`` is None or ``decay == 0``.
    Equal to scaling and adding the batch moment up to rounding (``(1 − decay)/n`` is applied inside the GEMM)."""
    if old is None or decay == 0:
        return second_moment(x, n)
    return old.addmm_(x.T, x, beta=decay, alpha=(1 - decay) / n)


def _retry_float64(fn, m: Tensor, what: str):
    """``fn(m)``; on a float32/16 failure retry in float64 (as curvlinops does), cast back; else ``ValueError``."""
    try:
        return fn(m)
    except (torch.linalg.LinAlgError, RuntimeError) as e:
        if m.dtype == torch.float64:
            raise ValueError(f"{what} failed even in float64 ({e}); are the factors finite and the damping > 0?") from e
    try:
        out = fn(m.double())
    except (torch.linalg.LinAlgError, RuntimeError) as e:
        raise ValueError(f"{what} failed in {m.dtype} and in float64 ({e}); increase the damping") from e
    return tuple(t.to(m.dtype) for t in out) if isinstance(out, tuple) else out.to(m.dtype)


def eigen_denominator(la: Tensor, lg: Tensor, damping: float) -> Tensor:
    """``1 / (λ_G λ_Aᵀ + λ)`` ``[out, D]`` from the factors' eigenvalues (clamped at 0: PSD by construction)."""
    return 1.0 / (lg.clamp(min=0)[:, None] * la.clamp(min=0)[None, :] + damping)


def eigen_inverse(A: Tensor, G: Tensor, damping: float, name: str = "") -> tuple[Tensor, ...]:
    """``(Q_A, Q_G, λ_A, λ_G, 1/(λ_G λ_Aᵀ + λ))`` by ``eigh`` of both factors (float64 retry on failure)."""
    la, qa = _retry_float64(torch.linalg.eigh, A, f"eigh of factor A of layer {name!r}")
    lg, qg = _retry_float64(torch.linalg.eigh, G, f"eigh of factor G of layer {name!r}")
    return qa, qg, la, lg, eigen_denominator(la, lg, damping)


def eigenvalues_in_basis(F: Tensor, q: Tensor) -> Tensor:
    """``diag(Qᵀ F Q)``: the curvature of a new factor ``F`` along the columns of an old eigenbasis ``Q`` (the
    eigenvalues when ``Q`` diagonalizes ``F``). The eigenvalue rescaling of George et al., "Fast approximate
    natural gradient descent in a Kronecker-factored eigenbasis" (NeurIPS 2018), restricted to Kronecker
    eigenvalues: it refreshes the spectrum at the price of a matmul instead of an ``eigh``."""
    return ((F @ q) * q).sum(0)


def pi_inverse(A: Tensor, G: Tensor, damping: float, name: str = "") -> tuple[Tensor, Tensor]:
    """``((A + π√λ I)⁻¹, (G + √λ/π I)⁻¹)`` with ``π = sqrt((tr A / dim A) / (tr G / dim G))``, by Cholesky (retried
    in float64 when it fails in a lower precision, as curvlinops' ``KFACInverseLinearOperator`` does)."""
    ta, tg = float(A.trace()), float(G.trace())
    if ta < 0 or tg < 0:
        raise ValueError(f"a K-FAC factor of layer {name!r} has a negative trace (tr A = {ta:.3g}, tr G = {tg:.3g}): "
                         "the factors are second moments and must be positive semi-definite")
    pi = math.sqrt((ta / A.shape[0] + 1e-30) / (tg / G.shape[0] + 1e-30))
    root = math.sqrt(damping)

    def damped_inverse(delta: float):
        def inv(m: Tensor) -> Tensor:  # the damping is added in m's dtype: a float64 retry does not lose it
            damped = m.clone()
            damped.diagonal().add_(delta)  # = m + δ·I entry for entry (off the diagonal m_ij + 0 = m_ij)
            chol, info = torch.linalg.cholesky_ex(damped)
            if int(info) != 0:
                raise torch.linalg.LinAlgError(f"the leading minor of order {int(info)} is not positive definite")
            return torch.cholesky_inverse(chol)
        return inv

    return (_retry_float64(damped_inverse(root * pi), A, f"Cholesky of factor A + π√λ·I of layer {name!r}"),
            _retry_float64(damped_inverse(root / pi), G, f"Cholesky of factor G + √λ/π·I of layer {name!r}"))


def precondition(inv: tuple[Tensor, ...], m: Tensor, out: Tensor | None = None,
                 work: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``(A ⊗ G + λ)⁻¹`` (eigen: ``inv`` of :func:`eigen_inverse`, 4 matmuls) or the π-damped inverse (``inv`` of
    :func:`pi_inverse`, 2 matmuls) applied to the gradient matrix ``m [out, D(+1)]``; the last product is written
    into ``out`` when given (a contiguous ``[out, D(+1)]`` buffer), the intermediate ones into ``work`` (two more
    such buffers; ``out`` needed with it): the same products in the same order, no new allocation."""
    if work is None:
        if len(inv) == 5:
            qa, qg, _, _, inv_den = inv
            return torch.mm(qg @ (qg.T @ m @ qa).mul_(inv_den), qa.T, out=out)
        inv_a, inv_g = inv
        return torch.mm(inv_g @ m, inv_a, out=out)
    w1, w2 = work
    if len(inv) == 5:
        qa, qg, _, _, inv_den = inv
        torch.mm(torch.mm(qg.T, m, out=w1), qa, out=w2).mul_(inv_den)
        return torch.mm(torch.mm(qg, w2, out=w1), qa.T, out=out)
    inv_a, inv_g = inv
    return torch.mm(torch.mm(inv_g, m, out=w1), inv_a, out=out)


def nonfinite_keys(groups: dict[str, tuple[Tensor, ...]]) -> list[str]:
    """Keys whose tensors hold NaN/inf. One reduction per tensor and one sync: a finite sum proves every entry
    finite; only a non-finite sum (NaN/inf, or an overflow of finite entries) is checked entry by entry."""
    keys = [k for k, ts in groups.items() for _ in ts]
    tensors = [t for ts in groups.values() for t in ts]
    if not tensors:
        return []
    sums = torch.stack([t.sum() for t in tensors]).tolist()
    bad = {k for k, t, s in zip(keys, tensors, sums)   # a non-finite sum is settled entry by entry
           if not math.isfinite(s) and not bool(torch.isfinite(t).all())}
    return [k for k in groups if k in bad]


def kfac_precondition_reference(A: dict[str, Tensor], G: dict[str, Tensor], grads: dict[str, Tensor],
                                damping: float, damping_mode: str = "eigen", kl_clip: float | None = None,
                                lr: float | None = None, trust_region: float | None = None) -> dict[str, Tensor]:
    """The K-FAC step written plainly: every layer's preconditioned gradient matrix, KL-clipped.

    The readable reference beside :meth:`taskloss.curvature.kfac.KFAC.precondition_` (which keeps inverses between
    refreshes, works in flat buffers and reuses work space): with inverses refreshed at this call the two agree to
    float rounding. ``"eigen"``: ``(A ⊗ G + λI)⁻¹`` applied to ``vec(M)`` by one dense solve of the
    ``[out·cols]²`` matrix (on the row-major ``vec(M)`` it acts as ``G ⊗ A``); ``"pi"``: the factored damping of
    Martens & Grosse (ICML 2015, §6.3), ``(G + √λ/π I)⁻¹ M (A + π√λ I)⁻¹`` with
    ``π = sqrt((tr A / dim A) / (tr G / dim G))``. With ``kl_clip``: the whole step scaled by
    ``ν = min(1, sqrt(kl_clip / (lr² Σ vᵀg)))``; with ``trust_region``: by ``min(1, sqrt(trust_region / Σ vᵀg))``
    (both: the smaller factor). Derived in notebook 07_fisher_approximations.

    Args:
        A: per layer, the input factor ``[cols, cols]``.
        G: per layer, the output-gradient factor ``[out, out]``.
        grads: per layer, the gradient matrix ``M = [∇W, ∇b]`` ``[out, cols]``.
        damping: λ > 0.
        damping_mode: ``"eigen"`` or ``"pi"``.
        kl_clip: the KL bound (``None``: no clip).
        lr: the (one) learning rate the clip assumes.
        trust_region: the bound on ``Σ vᵀg`` (``None``: none).

    Returns:
        Per layer, the preconditioned matrix ``[out, cols]``.
    """
    new = {}
    for k, M in grads.items():
        if damping_mode == "eigen":
            K = torch.kron(G[k], A[k]) + damping * torch.eye(M.numel(), dtype=M.dtype, device=M.device)
            new[k] = torch.linalg.solve(K, M.reshape(-1)).reshape(M.shape)
        else:
            pi = math.sqrt((float(A[k].trace()) / A[k].shape[0]) / (float(G[k].trace()) / G[k].shape[0]))
            eye_g, eye_a = torch.eye(G[k].shape[0], dtype=M.dtype), torch.eye(A[k].shape[0], dtype=M.dtype)
            left = torch.linalg.solve(G[k] + math.sqrt(damping) / pi * eye_g, M)
            new[k] = torch.linalg.solve(A[k] + pi * math.sqrt(damping) * eye_a, left.T).T   # A symmetric
    vg = sum(float((v * grads[k]).sum()) for k, v in new.items())
    nu = 1.0
    if kl_clip is not None and vg > 0:
        nu = min(nu, math.sqrt(kl_clip / (lr ** 2 * vg)))
    if trust_region is not None and vg > 0:
        nu = min(nu, math.sqrt(trust_region / vg))
    return {k: nu * v for k, v in new.items()} if nu != 1.0 else new
