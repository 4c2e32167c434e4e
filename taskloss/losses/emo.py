r"""EMO — earth mover distance optimization for language models, implemented lean.

Derived in notebook 09_emo_loss (source: the paper "EMO: Earth Mover Distance Optimization for
Auto-Regressive Language Modeling", ICLR 2024).

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
itself included (the cost is then not a metric on that row; it never produces NaN).

Memory: :class:`_EMOFunction` walks the tokens in chunks. The forward keeps only per-token scalars (EMO, log-sum-exp) and
the ``[N, d]`` mean embedding; the backward recomputes the softmax of one chunk at a time inside the ``[N, V]``
logits gradient buffer, so nothing of size tokens × vocabulary exists beyond the logits and their
gradient (cross-entropy keeps a log-softmax copy besides). All arithmetic runs in float32 (float64 for float64
logits) whatever the autocast state; the gradient comes back in the logits' dtype.

The mixes with MLE used by the reference code (``sg`` = stop-gradient, per token, then reduced)::

    "emo"                 EMO
    "mle"                 MLE = -log p_t (same fused pass; for like-for-like comparisons)
    "emo_mle_ratio"       ½ (sg(min(MLE / (EMO + ε), ratio_max)) · EMO + MLE)
                          value = MLE, gradient ½ (∇MLE + (MLE/EMO) ∇EMO): EMO rescaled to MLE's size.
                          ratio_max=None is the language-modeling script's "emo" mode; ratio_max=3 is the
                          standalone EMOLoss ``mode=1`` ("emphasises MLE").
    "mle_scaled_by_emo"   sg(EMO / (MLE + ε)) · MLE + EMO
                          value = 2·EMO, gradient ∇EMO + (EMO/MLE) ∇MLE: the EMOLoss ``mode=2``
                          ("emphasises EMO").
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from taskloss.utils import check_floating, check_int, check_ndim, check_positive

__all__ = [
    "MIXES", "REDUCTIONS", "normalize_cost_embeddings", "emo_cost_matrix", "emo_and_mle_per_token",
    "combine_emo_mle", "emo_loss", "emo_soft_upper_bound", "EMOLoss",
]

MIXES = ("emo", "mle", "emo_mle_ratio", "mle_scaled_by_emo")
REDUCTIONS = ("mean", "sum", "none")
_CHUNK_ELEMENTS = 2**21  # default chunk: >= ~2M logits (8 MB in float32) per temporary


# --------------------------------------------------------------------------------------------------- helpers
def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _no_autocast(device: torch.device):
    try:
        return torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:  # a backend without autocast support
        return contextlib.nullcontext()


def _embeddings_and_inverse_norms(cost_embeddings: torch.Tensor, dtype: torch.dtype
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated, detached ``e [V, d]`` in ``dtype`` (no copy when it already is) and ``1/||e_i|| [V]`` (0 for
    zero rows). No ``[V, d]`` temporary: NaN/inf rows are detected through their norm."""
    check_floating("cost_embeddings", cost_embeddings)
    check_ndim("cost_embeddings", cost_embeddings, 2)
    if cost_embeddings.shape[0] == 0 or cost_embeddings.shape[1] == 0:
        raise ValueError(f"cost_embeddings must be non-empty [V, d], got {tuple(cost_embeddings.shape)}")
    e = cost_embeddings.detach().to(dtype)
    norm = torch.linalg.vector_norm(e, dim=1)
    if not bool(torch.isfinite(norm).all()):
        raise ValueError("cost_embeddings contain NaN or inf (or rows whose norm overflows)")
    inv = torch.where(norm > 0, 1.0 / norm.clamp_min(torch.finfo(e.dtype).tiny), torch.zeros_like(norm))
    return e, inv


def normalize_cost_embeddings(cost_embeddings: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Detached unit-norm rows ``ê = e / ||e||`` of ``cost_embeddings [V, d]``; zero rows stay zero.

    Returned in ``dtype`` (default float32, float64 for float64 input). Raises on NaN/inf or a wrong shape.
    """
    if not isinstance(cost_embeddings, torch.Tensor):
        raise TypeError(f"cost_embeddings must be a torch.Tensor, got {type(cost_embeddings).__name__}")
    e, inv = _embeddings_and_inverse_norms(cost_embeddings, dtype or _compute_dtype(cost_embeddings.dtype))
    return e * inv[:, None]


def emo_cost_matrix(cost_embeddings: torch.Tensor) -> torch.Tensor:
    """Dense transport cost ``c [V, V]``, ``c_ij = 1 - <ê_i, ê_j>`` (O(V²): for checks and small vocabularies)."""
    e = normalize_cost_embeddings(cost_embeddings)
    return 1.0 - e @ e.T


def _default_chunk(n: int, v: int) -> int:
    """At least ~2M logits per chunk (loop overhead); beyond that at most 1/16 of the batch (memory)."""
    return max(1, min(n, max(_CHUNK_ELEMENTS // max(v, 1), -(-n // 16))))


# ------------------------------------------------------------------------------------------- the fused kernel
class _EMOFunction(torch.autograd.Function):
    r"""Per-token ``emo_n = 1 - <Σ_i p_ni ê_i, u_n>`` and ``mle_n = logsumexp(x_n) - x_{n,t_n}``, chunked.

    Inputs: ``logits [N, V]``, ``u [N, d]`` (target mean embedding; ``ê_t`` for one-hot targets),
    ``emb [V, d]`` raw embeddings and ``inv [V]`` their inverse norms (compute dtype; ``ê = emb * inv``, never
    materialized), ``targets [N]`` (valid ids; ignored rows already replaced),
    ``valid [N]`` bool, ``chunk`` rows, ``need_mle``. Outputs ``emo [N]`` and ``mle [N]`` (0 where invalid).

    Gradients: ``∂emo_n/∂x_ni = p_ni (c_ni - emo_n)`` with ``c_ni = 1 - <ê_i, u_n>``, ``∂mle_n/∂x_n = p_n - 1_t``,
    ``∂emo_n/∂u_n = -Σ_i p_ni ê_i``.
    """

    @staticmethod
    def forward(ctx, logits, u, emb, inv, targets, valid, chunk, need_mle):
        cdt = emb.dtype
        n = logits.shape[0]
        emo = torch.zeros(n, dtype=cdt, device=logits.device)
        lse = torch.empty(n, dtype=cdt, device=logits.device)
        q = torch.empty(n, emb.shape[1], dtype=cdt, device=logits.device)
        with torch.no_grad(), _no_autocast(logits.device):
            for s in range(0, n, chunk):
                sl = slice(s, s + chunk)
                x = logits[sl]
                m = x.amax(-1).to(cdt)
                p = x.to(cdt, copy=True).sub_(m[:, None]).exp_()  # the one [chunk, V] temporary
                z = p.sum(-1)
                lse[sl] = m + z.log()
                q[sl] = (p.mul_(inv) @ emb).div_(z[:, None])  # Σ_i p_i ê_i = (p / ||e||) @ e
                del p
                emo[sl] = 1.0 - (q[sl] * u[sl].to(cdt)).sum(-1)
            if not bool(torch.isfinite(lse).all()):  # checked on every row, padding included
                raise ValueError("logits contain NaN or +inf (or a row that is entirely -inf): the loss is undefined")
            emo.masked_fill_(~valid, 0.0)
            if need_mle:
                x_t = logits.gather(1, targets[:, None]).squeeze(1).to(cdt)
                mle = (lse - x_t).masked_fill_(~valid, 0.0)
            else:
                mle = torch.zeros(n, dtype=cdt, device=logits.device)
        ctx.save_for_backward(logits, u, emb, inv, targets, valid, emo, lse, q)
        ctx.chunk = chunk
        ctx.need_mle = need_mle
        if not need_mle:
            ctx.mark_non_differentiable(mle)
        ctx.set_materialize_grads(False)
        return emo, mle

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_emo, g_mle):
        logits, u, emb, inv, targets, valid, emo, lse, q = ctx.saved_tensors
        cdt = emb.dtype
        n = logits.shape[0]
        if not ctx.need_mle:
            g_mle = None
        zeros = torch.zeros(n, dtype=cdt, device=logits.device)
        g_emo = zeros if g_emo is None else g_emo.to(cdt).masked_fill(~valid, 0.0)
        g_mle = zeros if g_mle is None else g_mle.to(cdt).masked_fill(~valid, 0.0)
        grad_logits = grad_u = None
        with torch.no_grad(), _no_autocast(logits.device):
            if ctx.needs_input_grad[0]:
                grad_logits = torch.empty_like(logits)
                in_place = logits.dtype == cdt  # work inside the gradient buffer: no extra [chunk, V] copy
                rows = torch.arange(min(ctx.chunk, n), device=logits.device)
                for s in range(0, n, ctx.chunk):
                    sl = slice(s, s + ctx.chunk)
                    k = logits[sl].shape[0]
                    p = grad_logits[sl] if in_place else torch.empty(k, logits.shape[1], dtype=cdt,
                                                                     device=logits.device)
                    p.copy_(logits[sl]).sub_(lse[sl, None]).exp_()  # softmax, recomputed
                    # c_ni - emo_n = (1 - emo_n) - <u_n, e_i> / ||e_i||   (one [chunk, V] temporary)
                    w = torch.mm(u[sl], emb.T).mul_(inv).neg_().add_((1.0 - emo[sl])[:, None])
                    w.mul_(g_emo[sl, None]).add_(g_mle[sl, None])
                    p.mul_(w)
                    del w
                    if ctx.need_mle:
                        p[rows[:k], targets[sl]] -= g_mle[sl]
                    if not in_place:
                        grad_logits[sl] = p
            if ctx.needs_input_grad[1]:
                grad_u = (-g_emo[:, None] * q).to(u.dtype)
        return grad_logits, grad_u, None, None, None, None, None, None


def _flatten(logits: torch.Tensor, targets_shape_name: str, targets: torch.Tensor | None) -> torch.Tensor:
    check_floating("logits", logits)
    check_ndim("logits", logits, (2, 3))
    if logits.shape[-1] == 0 or logits.numel() == 0:
        raise ValueError(f"logits is empty (shape {tuple(logits.shape)})")
    if targets is not None and tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{targets_shape_name} shape {tuple(targets.shape)} does not match logits "
                         f"{tuple(logits.shape)} (expected {tuple(logits.shape[:-1])})")
    return logits.reshape(-1, logits.shape[-1])


def _check_vocab(v: int, emb: torch.Tensor) -> None:
    check_floating("cost_embeddings", emb)
    check_ndim("cost_embeddings", emb, 2)
    if emb.shape[0] != v:
        raise ValueError(f"vocabulary mismatch: logits have V={v} classes but cost_embeddings has "
                         f"{emb.shape[0]} rows")


def _check_chunk(chunk_size, n: int, v: int) -> int:
    if chunk_size is None:
        return _default_chunk(n, v)
    return min(check_int("chunk_size", chunk_size, minimum=1), max(n, 1))


def _check_result(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not bool(torch.isfinite(t).all()):
            raise ValueError("logits contain NaN or +inf (or a row that is entirely -inf): the loss is undefined")


def emo_and_mle_per_token(logits: torch.Tensor, targets: torch.Tensor, cost_embeddings: torch.Tensor, *,
                          ignore_index: int = -100, chunk_size: int | None = None, need_mle: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token EMO and MLE (cross-entropy) from one chunked pass.

    Shapes: ``logits [N, V]`` or ``[B, T, V]``, ``targets`` the leading shape (int64), ``cost_embeddings
    [V, d]``. Returns ``(emo, mle, valid)`` with the targets' shape, float32 (float64 for float64 logits);
    ``emo``/``mle`` are 0 where ``targets == ignore_index``; ``mle`` is all zeros when ``need_mle`` is False.
    Derived in notebook 09_emo_loss.
    """
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor (token ids), got dtype {targets.dtype}")
    check_int("ignore_index", ignore_index)
    x = _flatten(logits, "targets", targets)
    n, v = x.shape
    emb, inv = _prepared_cost(cost_embeddings, v, x.device, logits.dtype)
    t = targets.reshape(-1).to(device=x.device, dtype=torch.long)
    valid = t != ignore_index
    if not bool(((t >= 0) & (t < v) | ~valid).all()):
        bad = t[valid & ((t < 0) | (t >= v))][:5].tolist()
        raise ValueError(f"targets must lie in [0, {v}) or equal ignore_index={ignore_index}; found {bad}")
    t = t.masked_fill(~valid, 0)
    u = emb.index_select(0, t).mul_(inv[t, None])  # ê_t gathered by index: never a dense one-hot
    emo, mle = _EMOFunction.apply(x, u, emb, inv, t, valid, _check_chunk(chunk_size, n, v), bool(need_mle))
    _check_result(emo, mle)
    shape = targets.shape
    return emo.reshape(shape), mle.reshape(shape), valid.reshape(shape)


def combine_emo_mle(emo: torch.Tensor, mle: torch.Tensor, mix: str = "emo", *, ratio_max: float | None = None,
                    eps: float = 1e-10) -> torch.Tensor:
    """Per-token training loss from per-token ``emo`` and ``mle`` according to ``mix`` (see module docstring).

    ``sg`` is ``detach``. ``ratio_max`` caps the detached ratio of ``"emo_mle_ratio"`` (the reference
    ``mode=1`` uses 3.0). Derived in notebook 09_emo_loss.
    """
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
    check_positive("eps", eps)
    if ratio_max is not None:
        check_positive("ratio_max", ratio_max)
    if mix == "emo":
        return emo
    if mix == "mle":
        return mle
    if mix == "emo_mle_ratio":
        ratio = (mle / (emo + eps)).detach()
        if ratio_max is not None:
            ratio = ratio.clamp_max(ratio_max)
        return 0.5 * (ratio * emo + mle)
    return (emo / (mle + eps)).detach() * mle + emo  # "mle_scaled_by_emo"


def _reduce(loss: torch.Tensor, valid: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / valid.sum().clamp_min(1).to(loss.dtype)  # all-padding batch → 0, zero gradient


def _prepared_cost(cost_embeddings, v: int, device, logits_dtype):
    """Validate the cost embeddings against the vocabulary size ``v``; return them on ``device`` with their
    inverse norms in the compute dtype of ``logits_dtype``."""
    if not isinstance(cost_embeddings, torch.Tensor):
        raise TypeError(f"cost_embeddings must be a torch.Tensor, got {type(cost_embeddings).__name__}")
    _check_vocab(v, cost_embeddings)
    return _embeddings_and_inverse_norms(cost_embeddings.to(device), _compute_dtype(logits_dtype))


def emo_loss(logits: torch.Tensor, targets: torch.Tensor, cost_embeddings: torch.Tensor, *,
             ignore_index: int = -100, reduction: str = "mean", mix: str = "emo", ratio_max: float | None = None,
             eps: float = 1e-10, chunk_size: int | None = None) -> torch.Tensor:
    r"""EMO loss for one-hot targets, optionally mixed with MLE: ``1 - <Σ_i p_i ê_i, ê_t>`` per token.

    Args:
        logits: ``[N, V]`` or ``[B, T, V]`` raw scores (any float dtype; float32 math inside).
        targets: integer ids with the leading shape of ``logits``; ``ignore_index`` marks padding.
        cost_embeddings: ``[V, d]`` fixed token embeddings (detached and normalized here; zero rows cost 1).
        reduction: ``"mean"`` over non-ignored tokens (0 for an all-padding batch), ``"sum"`` or ``"none"``
            (the targets' shape, 0 at ignored positions).
        mix: ``"emo" | "mle" | "emo_mle_ratio" | "mle_scaled_by_emo"`` (formulas in the module docstring).
        chunk_size: tokens per chunk (default: max(2M logits, 1/16 of the tokens)).
    Returns the loss in float32 (float64 for float64 logits). Derived in notebook 09_emo_loss.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
    emo, mle, valid = emo_and_mle_per_token(logits, targets, cost_embeddings, ignore_index=ignore_index,
                                            chunk_size=chunk_size, need_mle=mix != "emo")
    per_token = combine_emo_mle(emo, mle, mix, ratio_max=ratio_max, eps=eps)
    return _reduce(per_token, valid, reduction)


def emo_soft_upper_bound(logits: torch.Tensor, target_probs: torch.Tensor, cost_embeddings: torch.Tensor, *,
                         reduction: str = "mean", chunk_size: int | None = None, atol: float = 1e-4
                         ) -> torch.Tensor:
    r"""Upper bound ``Σ_ij p_i τ_j c_ij = 1 - <Σ_i p_i ê_i, Σ_j τ_j ê_j>`` of the EMD to a soft target ``τ``.

    The bound is the cost of the independent plan ``p_i τ_j``; it equals the earth mover distance for one-hot
    ``τ``. ``target_probs`` has the shape of ``logits`` (rows non-negative, summing to 1 within ``atol``);
    gradients flow to ``logits`` and, if it requires grad, to ``target_probs``. Derived in notebook 09_emo_loss.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    check_floating("target_probs", target_probs)
    if tuple(target_probs.shape) != tuple(logits.shape):
        raise ValueError(f"target_probs shape {tuple(target_probs.shape)} must equal logits shape "
                         f"{tuple(logits.shape)}")
    x = _flatten(logits, "target_probs", None)
    n, v = x.shape
    emb, inv = _prepared_cost(cost_embeddings, v, x.device, logits.dtype)
    tau = target_probs.reshape(n, v).to(device=x.device)
    if not bool(torch.isfinite(tau).all()) or bool((tau < 0).any()):
        raise ValueError("target_probs must be finite and non-negative")
    if not torch.allclose(tau.detach().sum(-1).double(), torch.ones(n, dtype=torch.float64, device=x.device),
                          atol=atol, rtol=0):
        raise ValueError(f"target_probs rows must sum to 1 (within atol={atol})")
    with _no_autocast(x.device):
        u = (tau.to(emb.dtype) * inv) @ emb  # [N, d] target mean embedding Σ_j τ_j ê_j, in float32
    t = torch.zeros(n, dtype=torch.long, device=x.device)
    valid = torch.ones(n, dtype=torch.bool, device=x.device)
    bound, _ = _EMOFunction.apply(x, u, emb, inv, t, valid, _check_chunk(chunk_size, n, v), False)
    _check_result(bound)
    return _reduce(bound.reshape(logits.shape[:-1]), valid, reduction)


class EMOLoss(nn.Module):
    """``nn.Module`` form of :func:`emo_loss` holding the normalized cost embeddings as a (non-trainable) buffer.

    ``EMOLoss(model.lm_head.weight)`` freezes a copy of the output layer at construction, as in the paper.
    ``forward(logits, targets)`` → loss. Derived in notebook 09_emo_loss.
    """

    def __init__(self, cost_embeddings: torch.Tensor, *, ignore_index: int = -100, reduction: str = "mean",
                 mix: str = "emo", ratio_max: float | None = None, eps: float = 1e-10,
                 chunk_size: int | None = None):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
        check_int("ignore_index", ignore_index)
        check_positive("eps", eps)
        if ratio_max is not None:
            check_positive("ratio_max", ratio_max)
        if chunk_size is not None:
            check_int("chunk_size", chunk_size, minimum=1)
        self.register_buffer("cost_embeddings", normalize_cost_embeddings(cost_embeddings).clone())
        self.ignore_index, self.reduction, self.mix = ignore_index, reduction, mix
        self.ratio_max, self.eps, self.chunk_size = ratio_max, eps, chunk_size

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        emo, mle, valid = emo_and_mle_per_token(logits, targets, self.cost_embeddings,
                                                ignore_index=self.ignore_index, chunk_size=self.chunk_size,
                                                need_mle=self.mix != "emo")
        per_token = combine_emo_mle(emo, mle, self.mix, ratio_max=self.ratio_max, eps=self.eps)
        return _reduce(per_token, valid, self.reduction)

    def extra_repr(self) -> str:
        v, d = self.cost_embeddings.shape
        return f"vocab={v}, dim={d}, mix={self.mix!r}, reduction={self.reduction!r}, ratio_max={self.ratio_max}"
