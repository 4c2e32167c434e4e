r"""The computational core of the EMO loss: the fused chunked kernels and their plain-autograd twin.
Derived in notebook 09_emo_loss; the public API is :mod:`taskloss.losses.emo`, the cost tables
:mod:`taskloss.losses.emo_cost`.

Per token ``n`` with logits ``x_n [V]``, ``p_n = softmax(x_n)``, unit-norm cost embeddings ``ê [V, d]`` and a target
mean embedding ``u_n [d]`` (``ê_t`` for a one-hot target), ``s_ni = <u_n, ê_i> = 1 - c_ni``::

    emo_n = 1 - Σ_i p_ni s_ni = 1 - <q_n, u_n>,   q_n = Σ_i p_ni ê_i
    mle_n = logsumexp(x_n) - x_{n, t_n}
    ∂/∂x_ni (g_e emo_n + g_m mle_n) = p_ni (a_n - g_e s_ni) - g_m [i = t_n],   a_n = g_e (1 - emo_n) + g_m

Three implementations of this one formula:

* :class:`_FusedEMOLoss` — the reduced loss (``reduction="mean"``/``"sum"``) when the logits need a gradient. A
  combination's weights ``g_e, g_m`` depend on the token's own values only (:func:`combine_weights`), so one
  ``[chunk, d] @ [d, V]`` product per chunk gives ``s``, from which come EMO *and* the complete gradient: ``2·N·V·d``
  FLOPs for forward + backward. The gradient buffer is filled in the forward pass (the softmax is built inside it)
  and handed over by the backward; a second backward, or one with ``create_graph=True``, recomputes through autograd.
* :class:`_FusedEMO` — per-token ``(emo, mle)`` for any downstream use (``reduction="none"``, the soft bound, no
  gradient needed): the forward keeps per-token scalars and ``q [N, d]``; the backward recomputes the softmax chunk
  by chunk inside the gradient buffer and folds the per-token scalars into one ``addmm``: ``4·N·V·d`` FLOPs.
  Double backward recomputes through autograd.
* :func:`emo_mle_autograd` — plain differentiable torch ops (keeps ``p [N, V]``), used inside ``torch.func``
  transforms (``grad``, ``vmap``, ``jvp``, ``hessian``) and under forward-mode AD (:func:`use_autograd_path`).

Both kernels walk the tokens in chunks with reused ``[chunk, V]`` buffers, so nothing of size ``N × V`` exists
beyond the logits and their gradient; arithmetic runs in float32 (float64 for float64 logits) whatever the
autocast state, and the gradient comes back in the logits' dtype.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["COMBINES"]

_CHUNK_ELEMENTS = 2**21  # default chunk: ~2M logits (8 MiB in float32) per reused buffer


# --------------------------------------------------------------------------------------------------- helpers
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other floating dtype (bf16/fp16 included)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def no_autocast(device: torch.device):
    """A context with autocast off on ``device`` (a null context where the backend has no autocast)."""
    try:
        return torch.autocast(device_type=device.type, enabled=False)
    except RuntimeError:  # a backend without autocast support
        return contextlib.nullcontext()


def _functorch():
    return getattr(torch._C, "_functorch", None)


def use_autograd_path(*tensors: torch.Tensor) -> bool:
    """True inside ``torch.func`` transforms or forward-mode AD: the plain-autograd formula must be used there."""
    f = _functorch()
    if f is not None:
        active = getattr(f, "_are_functorch_transforms_active", None) or getattr(
            torch._C, "_are_functorch_transforms_active", None)
        if active is not None and active():
            return True
        if any(f.is_functorch_wrapped_tensor(t) for t in tensors):
            return True
    from torch.autograd import forward_ad
    return any(forward_ad.unpack_dual(t).tangent is not None for t in tensors)


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The plain data under ``torch.func`` wrappers (a batched tensor keeps its batch dimension): value checks
    (NaN, target range) then still run inside ``vmap``/``grad``."""
    f = _functorch()
    if f is None:
        return t
    while f.is_functorch_wrapped_tensor(t):
        t = f.get_unwrapped(t)
    return t


def all_true(mask: torch.Tensor) -> bool:
    """``bool(mask.all())`` that also works on a tensor wrapped by ``torch.func`` transforms."""
    return bool(unwrapped(mask).all())


def default_chunk(n: int, v: int, device: torch.device) -> int:
    """Rows per chunk: about ``_CHUNK_ELEMENTS`` logits (per intra-op thread on CPU), at least 32 rows, at most ``n``.

    Smaller chunks pay for every elementwise pass as a parallel region to synchronize, larger ones gain nothing
    (the measurements that chose the size: ``benchmarks/RESULTS.md``, "Tuning history moved from the docstrings"). A
    chunk costs one ``[chunk, V]`` buffer of memory; pass ``chunk_size`` to trade memory for speed."""
    elements = _CHUNK_ELEMENTS * (max(1, torch.get_num_threads()) if device.type == "cpu" else 1)
    return max(1, min(n, max(elements // max(v, 1), 32)))


# ------------------------------------------------------------------------------------------- plain autograd
def emo_mle_autograd(x, u, e_hat, targets, valid, need_mle):
    """Per-token ``(emo, mle)`` with differentiable torch ops (``p [N, V]`` kept by autograd): the formula of
    :class:`_FusedEMO` for higher-order and ``torch.func`` use. ``emo``/``mle`` are 0 where ``valid`` is False."""
    cdt = e_hat.dtype
    with no_autocast(x.device):
        logp = torch.log_softmax(x.to(cdt), dim=-1)
        q = logp.exp() @ e_hat
        emo = 1.0 - (q * u.to(cdt)).sum(-1)
        zero = torch.zeros((), dtype=cdt, device=x.device)
        emo = torch.where(valid, emo, zero)
        if need_mle:
            mle = torch.where(valid, -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), zero)
        else:
            mle = torch.zeros_like(emo)
    return emo, mle


# ----------------------------------------------------------------------------------------------- combinations
COMBINES = ("emo", "mle", "emo_mle_ratio", "mle_scaled_by_emo")


def combine_weights(emo, mle, combine: str, ratio_max: float | None, eps: float):
    """Per-token weights ``(w_e, w_m)`` with ``combination = w_e·EMO + w_m·MLE`` and gradient ``w_e ∇EMO + w_m ∇MLE``
    (the ratios are stop-gradient): the one definition of the combinations of :mod:`taskloss.losses.emo`.
    ``emo``/``mle`` are plain (detached) values."""
    one, zero = torch.ones_like(emo), torch.zeros_like(emo)
    if combine == "emo":
        return one, zero
    if combine == "mle":
        return zero, one
    if combine == "emo_mle_ratio":  # ½ (sg(min(MLE/(EMO+ε), r_max)) EMO + MLE)
        ratio = mle / (emo + eps)
        if ratio_max is not None:
            ratio = ratio.clamp_max(ratio_max)
        return 0.5 * ratio, 0.5 * one
    return one, emo / (mle + eps)  # "mle_scaled_by_emo": sg(EMO/(MLE+ε)) MLE + EMO


# ------------------------------------------------------------------------------------------- the fused kernel
class _FusedEMO(torch.autograd.Function):
    r"""Per-token ``emo_n = 1 - <Σ_i p_ni ê_i, u_n>`` and ``mle_n = logsumexp(x_n) - x_{n,t_n}``, chunked.

    Inputs: ``logits [N, V]``, ``u [N, d]``, ``e_hat [V, d]`` unit rows in the compute dtype, ``targets [N]`` (valid
    ids; ignored rows already replaced), ``valid [N]`` bool, ``chunk`` rows, ``need_mle``. Outputs ``emo [N]``,
    ``mle [N]`` (0 where invalid; ``mle`` all 0 and non-differentiable when ``need_mle`` is False).
    """

    @staticmethod
    def forward(logits, u, e_hat, targets, valid, chunk, need_mle):
        cdt = e_hat.dtype
        n, v = logits.shape
        dev = logits.device
        lse = torch.empty(n, dtype=cdt, device=dev)
        mx = torch.empty(n, dtype=cdt, device=dev)       # max_i x_i per row
        log_z = torch.empty(n, dtype=cdt, device=dev)    # log Σ_i exp(x_i − max)
        q = torch.empty(n, e_hat.shape[1], dtype=cdt, device=dev)
        buf = torch.empty(min(chunk, n), v, dtype=cdt, device=dev)  # reused by every chunk
        rows = torch.arange(min(chunk, n), device=dev)
        with torch.no_grad(), no_autocast(dev):
            for s in range(0, n, chunk):
                x = logits[s:s + chunk]
                k = x.shape[0]
                m, top = x.max(-1)
                m = mx[s:s + k].copy_(m)
                p = torch.sub(x, m[:, None], out=buf[:k]).exp_()  # unnormalized softmax, 1 at the max
                # z = 1 + r with r the sum of the other terms, taken without the 1: log z = log1p(r) keeps its
                # relative precision on a confident row (log z ≈ r ≈ 1e-7, where log(1 + r) in float32 is ~10 % off
                # and (max + log z) − x_t rounds to 0)
                p[rows[:k], top] = 0.0
                r = p.sum(-1)
                p[rows[:k], top] = 1.0
                torch.mm(p, e_hat, out=q[s:s + k]).div_(r.add(1.0)[:, None])  # q = Σ_i p_i ê_i
                torch.log1p(r, out=log_z[s:s + k])
                torch.add(m, log_z[s:s + k], out=lse[s:s + k])
            del buf
            emo = torch.linalg.vecdot(q, u.to(cdt)).neg_().add_(1.0).masked_fill_(~valid, 0.0)
            if need_mle:    # −log p_t = (max − x_t) + log z: no large term cancels
                x_t = logits.gather(1, targets[:, None]).squeeze(1).to(cdt)
                mle = (mx - x_t).add_(log_z).masked_fill_(~valid, 0.0)
            else:
                mle = torch.zeros(n, dtype=cdt, device=dev)
        return emo, mle, lse, q, mx, log_z

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, u, e_hat, targets, valid, chunk, need_mle = inputs
        emo, mle, lse, q, mx, log_z = output
        ctx.save_for_backward(logits, u, e_hat, targets, valid, emo, mx, log_z, q)
        ctx.chunk, ctx.need_mle = chunk, need_mle
        ctx.mark_non_differentiable(lse, q, mx, log_z)
        if not need_mle:
            ctx.mark_non_differentiable(mle)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g_emo, g_mle, _g_lse=None, _g_q=None, _g_mx=None, _g_log_z=None):
        logits, u, e_hat, targets, valid, emo, mx, log_z, q = ctx.saved_tensors
        if not ctx.need_mle:
            g_mle = None
        if g_emo is None and g_mle is None:
            return None, None, None, None, None, None, None
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward (Hessian-vector products)
            return _FusedEMO._backward_differentiable(ctx, logits, u, e_hat, targets, valid, g_emo, g_mle)
        cdt = e_hat.dtype
        n, v = logits.shape
        dev = logits.device
        zeros = torch.zeros(n, dtype=cdt, device=dev)
        g_e = zeros if g_emo is None else g_emo.to(cdt).masked_fill(~valid, 0.0)
        g_m = zeros if g_mle is None else g_mle.to(cdt).masked_fill(~valid, 0.0)
        grad_logits = grad_u = None
        with no_autocast(dev):
            if ctx.needs_input_grad[0]:
                a = g_e * (1.0 - emo) + g_m  # per-token scalars of the weight a_n - g_e <u_n, ê_i>
                u_scaled = u.to(cdt) * (-g_e)[:, None]
                if ctx.need_mle:    # at t: g_m (p_t − 1) + p_t g_e (1 − EMO − s_t), p_t − 1 by expm1 (no cancellation)
                    d_t = logits.gather(1, targets[:, None])[:, 0].to(cdt).sub_(mx).sub_(log_z)
                    s_t = torch.linalg.vecdot(u.to(cdt), e_hat.index_select(0, targets))
                    g_t = torch.addcmul(g_m * torch.expm1(d_t), torch.exp(d_t), g_e * (1.0 - emo - s_t))
                grad_logits = torch.empty_like(logits)
                in_place = logits.dtype == cdt  # the softmax is rebuilt inside the gradient buffer
                k0 = min(ctx.chunk, n)
                w = torch.empty(k0, v, dtype=cdt, device=dev)
                pbuf = None if in_place else torch.empty(k0, v, dtype=cdt, device=dev)
                for s in range(0, n, ctx.chunk):
                    sl = slice(s, s + ctx.chunk)
                    k = logits[sl].shape[0]
                    p = grad_logits[sl] if in_place else pbuf[:k]
                    # softmax, recomputed as exp((x − max) − log z): max + log z would round log z away
                    torch.sub(logits[sl], mx[sl, None], out=p).sub_(log_z[sl, None]).exp_()
                    wk = torch.addmm(a[sl, None].expand(k, v), u_scaled[sl], e_hat.T, out=w[:k])
                    p.mul_(wk)
                    if ctx.need_mle:
                        p.scatter_(1, targets[sl, None], g_t[sl, None])
                    if not in_place:
                        grad_logits[sl] = p
            if ctx.needs_input_grad[1]:
                grad_u = (-g_e[:, None] * q).to(u.dtype)
        return grad_logits, grad_u, None, None, None, None, None

    @staticmethod
    def _backward_differentiable(ctx, logits, u, e_hat, targets, valid, g_emo, g_mle):
        wanted = [t for t, need in zip((logits, u), ctx.needs_input_grad[:2]) if need]
        with torch.enable_grad():
            emo, mle = emo_mle_autograd(logits, u, e_hat, targets, valid, ctx.need_mle)
            outs, grads = [], []
            for out, g in ((emo, g_emo), (mle, g_mle)):
                if g is not None:
                    outs.append(out)
                    grads.append(g.to(out.dtype))
            res = iter(torch.autograd.grad(outs, wanted, grads, create_graph=True, allow_unused=True))
        gl = next(res) if ctx.needs_input_grad[0] else None
        gu = next(res) if ctx.needs_input_grad[1] else None
        if gl is not None:
            gl = gl.to(logits.dtype)
        return gl, gu, None, None, None, None, None


class _FusedEMOLoss(torch.autograd.Function):
    r"""The reduced loss ``Σ_n scale·(w_e,n EMO_n + w_m,n MLE_n)`` with its gradient built in the forward pass.

    The weights of a combination (:func:`combine_weights`) depend on a token's own EMO and MLE only, and the
    reduction's ``scale`` is known in advance, so the gradient ``∂loss/∂x_ni = p_ni (a_n - g_e,n s_ni) - g_m,n
    [i = t_n]`` (``s_ni = <u_n, ê_i>``, ``a_n = g_e,n (1 - EMO_n) + g_m,n``) is complete once a chunk's values are:
    one ``[chunk, d] @ [d, V]`` product per chunk gives ``s``, from which come both EMO (``1 - Σ_i p_ni s_ni``) and
    the gradient — ``2·N·V·d`` FLOPs in all, half of the per-token kernel's forward + backward. The ``[N, V]``
    gradient buffer is allocated in the forward (the peak of forward + backward is unchanged) and handed to autograd
    by the backward; a second backward through the same graph, or one with ``create_graph=True``, recomputes
    through :func:`emo_mle_autograd`.

    Outputs ``loss`` (scalar, differentiable w.r.t. ``logits``), and for checks ``check`` (``Σ_i p_ni s_ni``, finite
    exactly when row ``n`` has no NaN/+inf and is not entirely -inf, padding rows included), ``emo``, ``mle``
    ``[N]``. The softmax comes from one ``log_softmax`` per chunk (``MLE = -log p_t`` read from it), exponentiated in
    place inside the gradient buffer: six elementwise passes per chunk besides the product.
    """

    @staticmethod
    def forward(ctx, logits, u, e_hat, targets, valid, chunk, combine, patch, ratio_max, eps, scale):
        cdt = e_hat.dtype
        precise_mle = patch or combine in ("emo_mle_ratio", "mle_scaled_by_emo")   # ratios amplify MLE's error
        n, v = logits.shape
        dev = logits.device
        k0 = min(chunk, n)
        check = torch.empty(n, dtype=cdt, device=dev)
        emo = torch.empty(n, dtype=cdt, device=dev)
        mle = torch.empty(n, dtype=cdt, device=dev)
        total = torch.zeros((), dtype=cdt, device=dev)
        grad = torch.empty_like(logits)
        in_place = logits.dtype == cdt
        sbuf = torch.empty(k0, v, dtype=cdt, device=dev)
        pbuf = None if in_place else torch.empty(k0, v, dtype=cdt, device=dev)  # else p lives in the gradient
        rows = torch.arange(k0, device=dev)
        with torch.no_grad(), no_autocast(dev):
            for s in range(0, n, chunk):
                sl = slice(s, s + chunk)
                x = logits[sl]
                k = x.shape[0]
                ok = valid[sl]
                ps = torch.mm(u[sl].to(cdt), e_hat.T, out=sbuf[:k])  # s_ni = <u_n, ê_i> = 1 - c_ni
                logp = _log_softmax_into(x, grad[sl] if in_place else pbuf[:k])
                m_k = logp.gather(1, targets[sl, None]).squeeze(1).neg_().masked_fill_(~ok, 0.0)  # -log p_t
                p = logp.exp_()  # the softmax, in the gradient buffer
                if precise_mle:
                    m_k, p_t, rest = _confident_mle(p, targets[sl], m_k)
                ps.mul_(p)  # p_ni s_ni
                check_k = ps.sum(-1)  # finite exactly when the row has no NaN/+inf and is not entirely -inf
                e_k = (1.0 - check_k).masked_fill_(~ok, 0.0)
                e_val = e_k + patch_term(m_k, u[sl].to(cdt), ok) if patch else e_k
                w_e, w_m = combine_weights(e_val, m_k, combine, ratio_max, eps)
                g_e = (w_e * scale).masked_fill_(~ok, 0.0)
                g_m = (w_m * scale).masked_fill_(~ok, 0.0)
                total += (g_e * e_val + g_m * m_k).sum()
                # gradient p_ni (a_n - g_e s_ni) = a_n p_ni - g_e p_ni s_ni, written over p
                a = g_e * (1.0 - e_k) + g_m
                p.mul_(a[:, None]).addcmul_(ps, (-g_e)[:, None])
                if precise_mle:     # at t: g_m (p_t − 1) + g_e (p_t (1 − EMO) − p_t s_t), p_t − 1 = −S/(p_t + S)
                    t = targets[sl, None]
                    g_t = torch.addcmul(-g_m * rest / (p_t + rest), g_e, p_t * (1.0 - e_k) - ps.gather(1, t)[:, 0])
                    p.scatter_(1, t, g_t[:, None])
                else:
                    p[rows[:k], targets[sl]] -= g_m
                if not in_place:
                    grad[sl] = p
                check[sl], emo[sl], mle[sl] = check_k, e_val, m_k
        ctx.save_for_backward(logits, u, e_hat, targets, valid)
        ctx.options = (combine, patch, ratio_max, eps, scale)
        ctx.grad = grad
        ctx.mark_non_differentiable(check, emo, mle)
        ctx.set_materialize_grads(False)
        return total, check, emo, mle

    @staticmethod
    def backward(ctx, g_total, *_):
        none = (None,) * 10
        if g_total is None:
            return (None,) + none
        grad, ctx.grad = ctx.grad, None
        if grad is not None and not torch.is_grad_enabled():
            if not (g_total.device.type == "cpu" and float(g_total) == 1.0):
                grad.mul_(g_total.to(grad.dtype))
            return (grad,) + none
        logits, u, e_hat, targets, valid = ctx.saved_tensors
        combine, patch, ratio_max, eps, scale = ctx.options
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            x = logits if create_graph and logits.requires_grad else logits.detach().requires_grad_()
            loss = reduced_loss_autograd(x, u, e_hat, targets, valid, combine, patch, ratio_max, eps, scale)
            (gl,) = torch.autograd.grad(loss, x, g_total.to(loss.dtype), create_graph=create_graph)
        return (gl.to(logits.dtype),) + none


#: below this −log p_t the MLE is recomputed from the other probabilities (:func:`_confident_mle`)
_CONFIDENT_MLE = 0.5


def _confident_mle(p: torch.Tensor, targets: torch.Tensor, mle: torch.Tensor) -> torch.Tensor:
    """−log p_t for confident tokens from the *other* probabilities: ``log1p(S/p_t)`` with ``S = Σ_{i≠t} p_i``.

    On a confident token ``−log p_t ≈ 1e-7`` is read off a log-softmax whose ``log z`` carries float32's rounding of
    ``z = 1 + S`` (~10 % of such a value); a detached ratio EMO/MLE then carries that error into the gradient.
    ``S`` keeps full relative precision (summed without the leading 1, ``p_t`` set to 0 for the sum and put back),
    and the common normalization error of ``p`` cancels in ``S/p_t``. Rows with ``mle ≥`` :data:`_CONFIDENT_MLE`
    keep ``mle``: nothing cancels there. One more pass over ``p`` (only for the combinations that use MLE in a ratio,
    and the patch). Returns ``(mle, p_t, S)``: the gradient at the target uses ``p_t − 1 = −S/(p_t + S)``."""
    t = targets[:, None]
    p_t = p.gather(1, t)
    p.scatter_(1, t, 0.0)
    rest = p.sum(-1)
    p.scatter_(1, t, p_t)
    p_t = p_t[:, 0]
    return torch.where(mle < _CONFIDENT_MLE, torch.log1p(rest / p_t), mle), p_t, rest


def _log_softmax_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``log_softmax(x)`` along the last dimension written into ``out`` (the compute dtype)."""
    if x.dtype == out.dtype:
        return torch.ops.aten._log_softmax.out(x, -1, False, out=out)
    return out.copy_(torch.log_softmax(x, dim=-1, dtype=out.dtype))


def reduced_loss_autograd(x, u, e_hat, targets, valid, combine, patch, ratio_max, eps, scale):
    """``Σ_n scale·(w_e,n EMO_n + w_m,n MLE_n)`` with plain autograd (the reference of :class:`_FusedEMOLoss`)."""
    emo, mle = emo_mle_autograd(x, u, e_hat, targets, valid, True)
    if patch:
        emo = emo + patch_term(mle, u, valid).detach()
    w_e, w_m = combine_weights(emo.detach(), mle.detach(), combine, ratio_max, eps)
    return ((w_e * emo + w_m * mle) * valid * scale).sum()


def patch_term(mle, u, valid):
    """``p_t <ê_t, u_n>`` with ``p_t = exp(-MLE)``: the reference's ``q - sg(q ⊙ onehot)`` adds its stop-gradient to
    EMO's value (0 at ignored positions)."""
    return torch.where(valid, torch.exp(-mle) * (u * u).sum(-1), torch.zeros_like(mle))


def fused_loss(logits, u, e_hat, targets, valid, chunk, combine, patch, ratio_max, eps, scale):
    """The reduced loss with its gradient from one pass (:class:`_FusedEMOLoss`); returns ``(loss, check, emo,
    mle)`` (``emo`` includes the patch term; ``check`` is finite exactly when every row of logits is usable)."""
    return _FusedEMOLoss.apply(logits, u, e_hat, targets, valid, chunk, combine, patch, ratio_max, eps, scale)


def emo_mle(logits, u, e_hat, targets, valid, chunk, need_mle):
    """Per-token ``(emo, mle, lse)``: the fused kernel, or its autograd twin inside ``torch.func``/forward-mode AD.

    ``lse [N]`` (log-sum-exp of every row, padding included; plain data, not differentiable) is for checks: it is
    finite exactly when a row has no NaN, no +inf and is not entirely -inf."""
    if use_autograd_path(logits, u):
        emo, mle = emo_mle_autograd(logits, u, e_hat, targets, valid, need_mle)
        with torch.no_grad():
            data = unwrapped(logits).to(e_hat.dtype)
            if data.ndim == 2:
                lse = torch.logsumexp(data, dim=-1)
            else:  # under vmap (batch dimension at an unknown place): NaN or +inf anywhere
                lse = torch.where(torch.isnan(data).any() | torch.isposinf(data).any(), float("nan"), 0.0)
        return emo, mle, lse
    emo, mle, lse, *_ = _FusedEMO.apply(logits, u, e_hat, targets, valid, chunk, need_mle)
    return emo, mle, lse
