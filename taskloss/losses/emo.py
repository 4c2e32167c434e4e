r"""EMO — earth mover distance optimization for language models, implemented lean.

Derived in notebook 09_emo_loss (source: Ren, Zhang, Xu and Lin, "EMO: Earth Mover Distance Optimization for
Auto-Regressive Language Modeling", ICLR 2024; reference code github.com/DRSY/EMO at commit 14da9d5, and the
``emoloss`` 0.0.3 package on PyPI).

Cross-entropy is the KL divergence from a one-hot target to the prediction ``p``. EMO instead charges the
optimal-transport cost of moving ``p`` onto the target, with a cost between tokens taken from *fixed* token
embeddings::

    c(i, j) = 1 - cos(e_i, e_j) = 1 - <ê_i, ê_j>,       ê = e / ||e||

* one-hot target ``t``: the only transport plan moves all mass to ``t``, so the earth mover distance is exact:
  ``EMO(p, t) = Σ_i p_i c(i, t) = 1 - <Σ_i p_i ê_i, ê_t>``. Computing ``Σ_i p_i ê_i`` first costs O(V·d) per
  token instead of O(V²).
* soft target ``τ``: the independent plan ``p_i τ_j`` is feasible, so ``Σ_ij p_i τ_j c_ij =
  1 - <Σ_i p_i ê_i, Σ_j τ_j ê_j>`` is an upper bound of the earth mover distance (:func:`emo_soft_upper_bound`).
* ``c = 1 - δ`` (identity embeddings) gives ``1 - p_t``, a smooth accuracy.

Zero-norm embedding rows: ``ê`` is defined as ``0`` there, so such a token costs ``c = 1`` to every token,
itself included (the cost is then not a metric on that row; it never produces NaN). Rows of any other scale
(1e-30 or 1e30) are normalized exactly (:func:`~taskloss.losses.emo_cost.normalize_cost_embeddings`).

**Two variants of the reference code** (``variant=``)::

    "plain"   q = p                         value Σ_i p_i c_it (the earth mover distance)
    "patch"   q = p - sg(p ⊙ onehot(t))     value Σ_i p_i c_it + sg(p_t)·||ê_t||²

``"plain"`` is ``language_modeling/gpt2.py`` mode ``emo`` (the mode ``run_lm_gpt2.sh`` selects for the paper's
language-modeling experiments) and the ``emoloss`` package. ``"patch"`` came with the commit "fix emo
implementation" (b6a7d7a, 2023-11-21, after the paper's first arXiv version of October 2023) into
``emo_patch.py``, the LLaMA continual fine-tuning and instruction-tuning models and gpt2.py's ``adaptive_emo``
mode. The subtracted term is detached, so the gradient of EMO itself is unchanged; only the value moves (by
``p_t``), and with it the detached ratios of the MLE combinations below — so their gradients differ.

The combinations with MLE used by the reference code (``combine=``; ``sg`` = stop-gradient, per token, then
reduced)::

    "emo"                 EMO
    "mle"                 MLE = -log p_t (same fused pass; for like-for-like comparisons)
    "emo_mle_ratio"       ½ (sg(min(MLE / (EMO + ε), ratio_max)) · EMO + MLE)
                          value = MLE, gradient ½ (∇MLE + (MLE/EMO) ∇EMO): EMO rescaled to MLE's size.
                          ratio_max=None: gpt2.py mode "emo", emo_patch.py ``emo1_adaptive``;
                          ratio_max=3: the ``emoloss`` package's ``mode=1`` ("emphasises MLE").
    "mle_scaled_by_emo"   sg(EMO / (MLE + ε)) · MLE + EMO
                          value = 2·EMO, gradient ∇EMO + (EMO/MLE) ∇MLE: ``emoloss`` ``mode=2``,
                          emo_patch.py ``emo2_adaptive`` / ``emo2_fixed``.

"adaptive" in the reference names means the cost embeddings are the *current* output layer (pass
``model.lm_head.weight`` at every call: it is detached here); "fixed" means a frozen copy (:class:`EMOLoss`).

Where the work happens: :mod:`taskloss.losses.emo_kernel` — the reduced loss builds its gradient in the forward
pass (one ``N·V·d`` matrix product for forward + backward), the per-token kernel uses two; both chunked, with the
memory of the logits' gradient only; their autograd twin serves Hessian-vector products and ``torch.func``.
:mod:`taskloss.losses.emo_cost` normalizes the cost table.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from taskloss.losses.emo_cost import normalize_cost_embeddings, unit_rows
from taskloss.losses.emo_kernel import (
    COMBINES,
    all_true,
    combine_weights,
    compute_dtype,
    default_chunk,
    emo_mle,
    fused_loss,
    no_autocast,
    patch_term,
    unwrapped,
    use_autograd_path,
)
from taskloss.validation import check_bool, check_choice, check_floating, check_int, check_ndim, check_positive

__all__ = ["VARIANTS", "REDUCTIONS", "emo_and_mle_per_token", "combine_emo_mle", "emo_loss",
           "emo_soft_upper_bound", "EMOLoss", "emo_loss_reference"]

VARIANTS = ("plain", "patch")
REDUCTIONS = ("mean", "sum", "none")
_UNDEFINED = "logits contain NaN or +inf (or a row that is entirely -inf): the loss is undefined"


# ---------------------------------------------------------------------------------------------- validation
def _check_options(reduction, combine, variant, ratio_max, eps, ignore_index=None, chunk_size=None):
    check_choice("reduction", reduction, REDUCTIONS)
    check_choice("combine", combine, COMBINES)
    check_choice("variant", variant, VARIANTS)
    check_positive("eps", eps)
    if ratio_max is not None:
        check_positive("ratio_max", ratio_max, allow_inf=True)
        if combine != "emo_mle_ratio":
            raise ValueError(f"ratio_max applies to combine='emo_mle_ratio' only, got combine={combine!r}")
    if ignore_index is not None:
        check_int("ignore_index", ignore_index)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)


def _flatten(logits: torch.Tensor, targets_shape_name: str, targets: torch.Tensor | None) -> torch.Tensor:
    check_floating("logits", logits)
    check_ndim("logits", logits, (2, 3))
    if logits.shape[-1] == 0 or logits.numel() == 0:
        raise ValueError(f"logits is empty (shape {tuple(logits.shape)})")
    if targets is not None and tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{targets_shape_name} shape {tuple(targets.shape)} does not match logits "
                         f"{tuple(logits.shape)} (expected {tuple(logits.shape[:-1])})")
    return logits.reshape(-1, logits.shape[-1])


def _prepared_cost(cost_embeddings, v: int, device, logits_dtype) -> torch.Tensor:
    """Unit rows of the cost embeddings on ``device`` in the compute dtype of ``logits_dtype``, validated against
    the vocabulary size ``v``."""
    if not isinstance(cost_embeddings, torch.Tensor):
        raise TypeError(f"cost_embeddings must be a torch.Tensor, got {type(cost_embeddings).__name__}")
    check_floating("cost_embeddings", cost_embeddings)
    check_ndim("cost_embeddings", cost_embeddings, 2)
    if cost_embeddings.shape[0] != v:
        raise ValueError(f"vocabulary mismatch: logits have V={v} classes but cost_embeddings has "
                         f"{cost_embeddings.shape[0]} rows")
    return unit_rows(cost_embeddings.to(device), compute_dtype(logits_dtype))


def _check_chunk(chunk_size, n: int, v: int, device: torch.device) -> int:
    if chunk_size is None:
        return default_chunk(n, v, device)
    return min(check_int("chunk_size", chunk_size, minimum=1), max(n, 1))


def _check_finite_result(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not all_true(torch.isfinite(t)):
            raise ValueError(_UNDEFINED)


def _check_targets(targets, v: int, ignore_index: int) -> None:
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor (token ids), got dtype {targets.dtype}")
    t = unwrapped(targets)
    bad = ((t < 0) | (t >= v)) & (t != ignore_index)
    if bool(bad.any()):
        raise ValueError(f"targets must lie in [0, {v}) or equal ignore_index={ignore_index}; "
                         f"found {t[bad][:5].tolist()}")


def _prepare(logits, targets, cost_embeddings, ignore_index, chunk_size):
    """Validate; return flat logits ``x [N, V]``, targets ``t [N]`` (ignored ones set to 0), ``u = ê_t [N, d]``,
    the unit cost rows ``ê``, the ``valid`` mask and the chunk size."""
    check_int("ignore_index", ignore_index)
    x = _flatten(logits, "targets", targets if isinstance(targets, torch.Tensor) else None)
    n, v = x.shape
    _check_targets(targets, v, ignore_index)
    e_hat = _prepared_cost(cost_embeddings, v, x.device, logits.dtype)
    t = targets.reshape(-1).to(device=x.device, dtype=torch.long)
    valid = t != ignore_index
    t = t.masked_fill(~valid, 0)
    u = e_hat.index_select(0, t)  # ê_t gathered by index: never a dense one-hot
    return x, t, u, e_hat, valid, _check_chunk(chunk_size, n, v, x.device)


# ---------------------------------------------------------------------------------------------- public API
def emo_and_mle_per_token(logits: torch.Tensor, targets: torch.Tensor, cost_embeddings: torch.Tensor, *,
                          ignore_index: int = -100, chunk_size: int | None = None, need_mle: bool = True,
                          variant: str = "plain") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token EMO and MLE (cross-entropy) from one chunked pass.

    Args:
        logits: ``[N, V]`` or ``[B, T, V]`` raw scores, any float dtype (float32 math inside, float64 for float64).
        targets: integer ids with the leading shape of ``logits``, in ``[0, V)`` or equal to ``ignore_index``.
        cost_embeddings: ``[V, d]`` token embeddings defining the cost (detached, rows normalized here).
        ignore_index: target value marking positions that contribute 0 (default -100).
        chunk_size: tokens per chunk of the fused kernel (default: about 2M logits per CPU thread).
        need_mle: compute ``mle`` (else zeros; ``variant="patch"`` computes it anyway).
        variant: ``"plain"`` or ``"patch"`` (the reference code's ``q - sg(q ⊙ onehot)``; module docstring).

    Returns:
        ``(emo, mle, valid)`` with the targets' shape, float32 (float64 for float64 logits); ``emo``/``mle`` are
        0 where ``targets == ignore_index``.

    Raises:
        TypeError: non-tensor or wrong-dtype inputs.
        ValueError: wrong shapes, empty logits, targets out of range,
            NaN/+inf logits (padding rows included) or a row that is entirely -inf, NaN/inf cost embeddings.

    Works inside ``torch.func`` transforms and supports double backward. Derived in notebook 09_emo_loss.
    """
    check_choice("variant", variant, VARIANTS)
    check_bool("need_mle", need_mle)
    x, t, u, e_hat, valid, chunk = _prepare(logits, targets, cost_embeddings, ignore_index, chunk_size)
    patch = variant == "patch"
    emo, mle, lse = emo_mle(x, u, e_hat, t, valid, chunk, need_mle or patch)
    _check_finite_result(lse, emo, mle)
    if patch:
        emo = emo + patch_term(mle, u, valid).detach()
        if not need_mle:
            mle = torch.zeros_like(mle)
    shape = targets.shape
    return emo.reshape(shape), mle.reshape(shape), valid.reshape(shape)


def combine_emo_mle(emo: torch.Tensor, mle: torch.Tensor, combine: str = "emo", *, ratio_max: float | None = None,
                    eps: float = 1e-10) -> torch.Tensor:
    """Per-token training loss from per-token ``emo`` and ``mle`` according to ``combine`` (module docstring).

    Args:
        emo: per-token EMO values, a floating tensor (any shape), finite.
        mle: per-token MLE values, same shape and dtype, finite.
        combine: ``"emo" | "mle" | "emo_mle_ratio" | "mle_scaled_by_emo"``.
        ratio_max: cap of the detached ratio of ``"emo_mle_ratio"`` (> 0; the ``emoloss`` package's ``mode=1``
            uses 3.0); None = no cap. Other combinations reject it.
        eps: > 0, added to the denominators of the detached ratios (1e-10 in the reference code).

    Returns:
        The per-token loss, shape of ``emo``, in float32 (float64 for float64 inputs: half-precision values are
        combined in float32). ``sg`` is ``detach``.

    Raises:
        TypeError: non-tensor or non-floating inputs.
        ValueError: unknown ``combine``, shape or dtype mismatch,
            empty input, NaN/inf values, ``ratio_max``/``eps`` not > 0.

    Derived in notebook 09_emo_loss.
    """
    check_choice("combine", combine, COMBINES)
    for name, t in (("emo", emo), ("mle", mle)):
        check_floating(name, t)
    if emo.shape != mle.shape:
        raise ValueError(f"emo and mle must have the same shape, got {tuple(emo.shape)} and {tuple(mle.shape)}")
    if emo.dtype != mle.dtype:
        raise TypeError(f"emo and mle must have the same dtype, got {emo.dtype} and {mle.dtype}")
    if emo.numel() == 0:
        raise ValueError(f"emo is empty (shape {tuple(emo.shape)})")
    for name, t in (("emo", emo), ("mle", mle)):
        if not all_true(torch.isfinite(t)):
            raise ValueError(f"{name} contains NaN or inf")
    check_positive("eps", eps)
    if ratio_max is not None:
        check_positive("ratio_max", ratio_max, allow_inf=True)
        if combine != "emo_mle_ratio":
            raise ValueError(f"ratio_max applies to combine='emo_mle_ratio' only, got combine={combine!r}")
    cdt = compute_dtype(emo.dtype)          # float16's ε = 1e-10 would be 0 and its ratios overflow
    emo, mle = emo.to(cdt), mle.to(cdt)
    if combine == "emo":
        return emo
    if combine == "mle":
        return mle
    w_e, w_m = combine_weights(emo.detach(), mle.detach(), combine, ratio_max, eps)
    return w_e * emo + w_m * mle


def _reduce(loss: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / valid.sum().clamp_min(1).to(loss.dtype)  # all-padding batch → 0, zero gradient


def emo_loss(logits: torch.Tensor, targets: torch.Tensor, cost_embeddings: torch.Tensor, *,
             ignore_index: int = -100, reduction: str = "mean", combine: str = "emo", variant: str = "plain",
             ratio_max: float | None = None, eps: float = 1e-10, chunk_size: int | None = None) -> torch.Tensor:
    r"""EMO loss for one-hot targets, optionally combined with MLE: ``1 - <Σ_i p_i ê_i, ê_t>`` per token.

    Args:
        logits: ``[N, V]`` or ``[B, T, V]`` raw scores (any float dtype; float32 math inside).
        targets: integer ids with the leading shape of ``logits``; ``ignore_index`` marks padding.
        cost_embeddings: ``[V, d]`` fixed token embeddings (detached and normalized here; zero rows cost 1).
            Pass an already unit-norm float32 table (as :class:`EMOLoss` holds) to skip the ``[V, d]`` copy.
        ignore_index: target value of padding positions (default -100).
        reduction: ``"mean"`` over non-ignored tokens (0 for an all-padding batch), ``"sum"`` or ``"none"``
            (the targets' shape, 0 at ignored positions).
        combine: ``"emo"`` (default) ``| "mle" | "emo_mle_ratio" | "mle_scaled_by_emo"`` (module docstring).
        variant: ``"plain"`` (default, the earth mover distance) or ``"patch"`` (the reference's
            ``q - sg(q ⊙ onehot)``; module docstring).
        ratio_max: cap of the detached ratio of ``"emo_mle_ratio"`` (> 0), None = no cap.
        eps: > 0, added to the denominators of the detached ratios.
        chunk_size: tokens per chunk (default: about 2M logits per CPU thread; larger is faster on busy
            multi-threaded CPUs and costs one ``[chunk, V]`` float32 buffer).

    Returns:
        The loss in float32 (float64 for float64 logits).

    Raises:
        TypeError / ValueError as :func:`emo_and_mle_per_token` and :func:`combine_emo_mle`.

    Derived in notebook 09_emo_loss.
    """
    _check_options(reduction, combine, variant, ratio_max, eps, ignore_index, chunk_size)
    if (reduction != "none" and torch.is_grad_enabled() and isinstance(logits, torch.Tensor)
            and logits.requires_grad and not use_autograd_path(logits)):
        x, t, u, e_hat, valid, chunk = _prepare(logits, targets, cost_embeddings, ignore_index, chunk_size)
        scale = 1.0 / valid.sum().clamp_min(1).to(e_hat.dtype) if reduction == "mean" else torch.ones(
            (), dtype=e_hat.dtype, device=x.device)
        loss, check, emo, mle = fused_loss(x, u, e_hat, t, valid, chunk, combine, variant == "patch", ratio_max,
                                           eps, scale)
        _check_finite_result(check, emo, mle)
        return loss
    emo, mle, valid = emo_and_mle_per_token(logits, targets, cost_embeddings, ignore_index=ignore_index,
                                            chunk_size=chunk_size, need_mle=combine != "emo", variant=variant)
    per_token = combine_emo_mle(emo, mle, combine, ratio_max=ratio_max, eps=eps)
    return _reduce(per_token, valid, reduction)


def emo_loss_reference(logits: torch.Tensor, targets: torch.Tensor, cost_embeddings: torch.Tensor, *,
                       ignore_index: int = -100) -> torch.Tensor:
    """EMO in its three-line form, the readable reference beside the fused :func:`emo_loss` (tested equal).

    The cost matrix ``C = 1 − ê êᵀ`` of the unit embeddings and the expected cost of the prediction under the one-hot
    target, ``EMO = Σ_i p_i C_{i t}``, averaged over the non-ignored tokens — what the reference code computes
    (github.com/DRSY/EMO, ``language_modeling/gpt2.py``, mode ``emo``), at O(V²) memory where :func:`emo_loss`
    needs O(V·d). Inputs are validated as :func:`emo_loss` validates them. Derived in notebook 09_emo_loss.

    Args:
        logits: ``[N, V]`` or ``[B, T, V]`` raw scores.
        targets: integer ids with the leading shape of ``logits``.
        cost_embeddings: ``[V, d]`` token embeddings (detached here).
        ignore_index: the target value of padding positions.

    Returns:
        The mean EMO over the tokens whose target is not ``ignore_index`` (float32 for half-precision logits, as
        :func:`emo_loss`).

    Raises:
        TypeError / ValueError: as :func:`emo_loss` — non-floating (complex included) or meta logits, targets
            that are not integer ids in range, a cost table of another vocabulary, NaN / +inf logits (a loss that
            would be NaN).
    """
    check_int("ignore_index", ignore_index)
    x = _flatten(logits, "targets", targets if isinstance(targets, torch.Tensor) else None)
    _check_targets(targets, x.shape[1], ignore_index)
    _prepared_cost(cost_embeddings, x.shape[1], x.device, logits.dtype)
    dt = compute_dtype(logits.dtype)                                                    # float32 for half
    e_hat = F.normalize(cost_embeddings.detach().to(dt), dim=-1)                        # ê, zero rows stay 0
    cost = 1 - e_hat @ e_hat.T                                                          # C_ij = 1 − cos(e_i, e_j)
    x, t = logits.to(dt).reshape(-1, logits.shape[-1]), targets.reshape(-1)
    keep = t != ignore_index
    per_token = (x[keep].softmax(-1) * cost[t[keep]]).sum(-1)                          # Σ_i p_i C_it
    _check_finite_result(per_token)
    return per_token.mean()


def emo_soft_upper_bound(logits: torch.Tensor, target_probs: torch.Tensor, cost_embeddings: torch.Tensor, *,
                         reduction: str = "mean", chunk_size: int | None = None, atol: float = 1e-4
                         ) -> torch.Tensor:
    r"""Upper bound ``Σ_ij p_i τ_j c_ij = 1 - <Σ_i p_i ê_i, Σ_j τ_j ê_j>`` of the EMD to a soft target ``τ``.

    The bound is the cost of the independent plan ``p_i τ_j``; it equals the earth mover distance for one-hot ``τ``.

    Args:
        logits: ``[N, V]`` or ``[B, T, V]`` raw scores.
        target_probs: ``τ`` with the shape of ``logits``, finite, non-negative, rows summing to 1 within ``atol``;
            gradients flow to it when it requires grad.
        cost_embeddings: ``[V, d]`` token embeddings (detached, normalized here).
        reduction: ``"mean"`` over rows, ``"sum"`` or ``"none"``.
        chunk_size: rows per chunk of the fused kernel.
        atol: tolerance of the row sums (> 0).

    Returns:
        The bound in float32 (float64 for float64 logits).

    Raises:
        TypeError: non-tensor or non-floating inputs.
        ValueError: shape mismatch, NaN/negative ``τ``, rows not
            summing to 1, NaN/+inf logits.

    Derived in notebook 09_emo_loss.
    """
    check_choice("reduction", reduction, REDUCTIONS)
    check_positive("atol", atol)
    check_floating("target_probs", target_probs)
    x = _flatten(logits, "target_probs", None)
    if tuple(target_probs.shape) != tuple(logits.shape):
        raise ValueError(f"target_probs shape {tuple(target_probs.shape)} must equal logits shape "
                         f"{tuple(logits.shape)}")
    n, v = x.shape
    e_hat = _prepared_cost(cost_embeddings, v, x.device, logits.dtype)
    tau = target_probs.reshape(n, v).to(device=x.device)
    tau_data = unwrapped(tau).detach()
    if not all_true(torch.isfinite(tau_data)) or bool((tau_data < 0).any()):
        raise ValueError("target_probs must be finite and non-negative")
    if not bool(((tau_data.sum(-1).double() - 1.0).abs() <= atol).all()):
        raise ValueError(f"target_probs rows must sum to 1 (within atol={atol})")
    with no_autocast(x.device):
        u = tau.to(e_hat.dtype) @ e_hat  # [N, d] target mean embedding Σ_j τ_j ê_j, in float32
    t = torch.zeros(n, dtype=torch.long, device=x.device)
    valid = torch.ones(n, dtype=torch.bool, device=x.device)
    bound, _, lse = emo_mle(x, u, e_hat, t, valid, _check_chunk(chunk_size, n, v, x.device), False)
    _check_finite_result(lse, bound)
    return _reduce(bound.reshape(logits.shape[:-1]), valid, reduction)


class EMOLoss(nn.Module):
    """``nn.Module`` form of :func:`emo_loss` holding the normalized cost embeddings as a (non-trainable) buffer.

    ``EMOLoss(model.lm_head.weight)`` freezes a unit-norm copy of the output layer at construction, as the paper's
    "fixed" cost does. Arguments as :func:`emo_loss`. ``forward(logits, targets)`` → loss.

    Derived in notebook 09_emo_loss.
    """

    def __init__(self, cost_embeddings: torch.Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                 combine: str = "emo", variant: str = "plain", ratio_max: float | None = None,
                 eps: float = 1e-10, chunk_size: int | None = None):
        super().__init__()
        _check_options(reduction, combine, variant, ratio_max, eps, ignore_index, chunk_size)
        self.register_buffer("cost_embeddings", normalize_cost_embeddings(cost_embeddings).clone())
        self.ignore_index, self.reduction, self.combine, self.variant = ignore_index, reduction, combine, variant
        self.ratio_max, self.eps, self.chunk_size = ratio_max, eps, chunk_size

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of :func:`emo_loss` with the held cost embeddings and options."""
        return emo_loss(logits, targets, self.cost_embeddings, ignore_index=self.ignore_index,
                        reduction=self.reduction, combine=self.combine, variant=self.variant,
                        ratio_max=self.ratio_max, eps=self.eps, chunk_size=self.chunk_size)

    def extra_repr(self) -> str:
        """The vocabulary, embedding size and options, for ``repr``."""
        v, d = self.cost_embeddings.shape
        return (f"vocab={v}, dim={d}, combine={self.combine!r}, variant={self.variant!r}, "
                f"reduction={self.reduction!r}, ratio_max={self.ratio_max}")
