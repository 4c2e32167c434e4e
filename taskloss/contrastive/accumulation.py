"""Exact gradient accumulation for losses that couple the samples of a batch (in-batch negatives).

Derived in notebook 10_contrastive_accumulation. Source: the idea of *Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup* (Gao, Zhang, Han & Callan, RepL4NLP 2021 — GradCache, reference code
``luyug/GradCache``, ``grad_cache.py``), derived through the chain rule as in the first essay of
``001_*.txt`` ("can contrastive learning use gradient accumulation?").

A loss ``L(e_1, …, e_B)`` of the embeddings ``e_i = f_θ(x_i)`` has the gradient ``∇_θ L = Σ_i (∂L/∂e_i)ᵀ ∂e_i/∂θ``.
The first factor needs every embedding but no graph; the second needs a graph but only sample i. Hence two
passes over micro-batches, with only one micro-batch's activations alive at a time:

1. :func:`embed_micro_batches` — embed each micro-batch without a graph, recording the RNG state first;
2. :func:`embedding_gradients` — the loss on all embeddings at once, and the cache ``g_i = ∂L/∂e_i``;
3. :func:`replay_backward` — re-embed each micro-batch *with* a graph under the recorded RNG state (same dropout
   masks) and back-propagate ``⟨sg(g_i), e_i⟩``: its gradient is the micro-batch's share of ``∇_θ L``.

:func:`accumulated_backward` runs the three for one encoder or several (a query and a document tower), any
micro-batch size per input (also sizes that do not divide the batch). The gradients equal the full-batch
gradient up to floating-point summation order, whatever the loss, as long as the encoder treats samples
independently. A BatchNorm that normalizes with batch statistics (training mode, or ``track_running_stats=False``)
couples a micro-batch's samples, so its gradient cannot be the full-batch one: the passes refuse an encoder that
holds one (:func:`check_batch_independent`; put it in eval mode, or use LayerNorm / GroupNorm).
:func:`naive_accumulated_backward` is the usual accumulation (loss per
micro-batch, negatives only from the same micro-batch), kept as the baseline the notebook shows to be wrong.

Deviations from the reference: RNG states cover the CPU generator and every CUDA device of the inputs *and*
the encoder's parameters (the reference looks at input tensors only); the second pass is checked against the
first (same shape, same values within a dtype-dependent tolerance), so an encoder whose randomness is not
replayed fails loudly instead of giving a silently wrong gradient; the cache is kept in at least float32 under
autocast; under ``DistributedDataParallel`` only each encoder's last micro-batch synchronizes gradients (see
:mod:`taskloss.contrastive.distributed` for the loss that makes the synchronized gradient the full-batch one).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from taskloss.contrastive.rng_state import RNGState
from taskloss.validation import (
    all_finite,
    check_bool,
    check_floating,
    check_int,
    check_iterable,
    check_positive,
    check_tensors,
)

__all__ = [
    "AccumulationResult", "batch_size", "split_micro_batches", "embed_micro_batches",
    "embedding_gradients", "replay_backward", "check_batch_independent", "accumulated_backward", "naive_accumulated_backward",
]

# Relative tolerance of the second pass against the first (max |e₂ − e₁| / max |e₁|) per embedding dtype.
REPLAY_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


# ------------------------------------------------------------------------------------------------ batches
def batch_size(batch: Any) -> int:
    """Number of samples in a batch: a tensor's first dimension; the common first dimension of the tensors of a
    mapping (other values are passed whole) or of a tuple's elements; a list's length (a list is a batch of
    samples, e.g. strings; a tuple is a structure whose elements are batches).

    Raises:
        TypeError: an unsupported type. ValueError: disagreeing sizes, or a 0-d tensor.
    """
    if isinstance(batch, Tensor):
        if batch.ndim == 0:
            raise ValueError("a batch tensor needs a leading batch dimension, got a 0-d tensor")
        return batch.shape[0]
    if isinstance(batch, list):
        return len(batch)
    if isinstance(batch, (Mapping, tuple)):
        items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
        sizes = {k: batch_size(v) for k, v in items if isinstance(v, (Tensor, list, tuple, Mapping))}
        if not sizes or len(set(sizes.values())) > 1:
            raise ValueError(f"the parts of a batch must share one batch size, got {sizes}")
        return next(iter(sizes.values()))
    raise TypeError(f"a batch must be a tensor, a mapping, a tuple or a list, got {type(batch).__name__}")


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, (Tensor, list)):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return {k: _slice(v, start, stop) if isinstance(v, (Tensor, list, tuple, Mapping)) else v
                for k, v in batch.items()}
    return tuple(_slice(v, start, stop) if isinstance(v, (Tensor, list, tuple, Mapping)) else v for v in batch)


def split_micro_batches(batch: Any, micro_batch_size: int) -> list[Any]:
    """Consecutive micro-batches of at most ``micro_batch_size`` samples (the last may be smaller), in order.

    Raises:
        ValueError: ``micro_batch_size`` < 1 or an empty batch (see :func:`batch_size` for the batch types).
    """
    m = check_int("micro_batch_size", micro_batch_size, minimum=1)
    n = batch_size(batch)
    if n == 0:
        raise ValueError("the batch is empty (batch size 0)")
    return [_slice(batch, i, min(i + m, n)) for i in range(0, n, m)]


def _check_embedding(emb: Any, rows: int, where: str) -> Tensor:
    if not isinstance(emb, Tensor) or not emb.is_floating_point():
        raise TypeError(f"{where}: the encoder must return a floating tensor [n, d], got "
                        f"{type(emb).__name__ if not isinstance(emb, Tensor) else emb.dtype}")
    if emb.ndim != 2 or emb.shape[0] != rows:
        raise ValueError(f"{where}: the encoder must return [n, d] with n = {rows} (the micro-batch size), "
                         f"got shape {tuple(emb.shape)}")
    if not all_finite(emb.detach()):
        raise ValueError(f"{where}: the embeddings contain NaN or inf")
    return emb


def check_batch_independent(encoder: Any, where: str = "encoder") -> None:
    """Refuse an encoder whose output for one sample depends on the other samples of its micro-batch.

    BatchNorm layers (``nn.BatchNorm1d/2d/3d``, ``SyncBatchNorm``, lazy ones) normalize with the batch's statistics
    in training mode, and always when built with ``track_running_stats=False``: a micro-batch's embeddings then
    differ from the full batch's, and the accumulated gradient is not the full-batch one (and the running
    statistics would be updated in both passes). A plain callable cannot be inspected and is trusted.

    Args:
        encoder: the encoder (an ``nn.Module`` is searched, ``DistributedDataParallel`` included).
        where: what to call it in the message.

    Raises:
        ValueError: a batch-statistics BatchNorm inside ``encoder``, named with its path.
        TypeError: an ``encoder`` that is not callable.
    """
    if not callable(encoder):
        raise TypeError(f"encoder must be callable (a module or a function of a micro-batch), got "
                        f"{type(encoder).__name__}")
    if not isinstance(encoder, nn.Module):
        return
    for name, m in encoder.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or not m.track_running_stats):
            why = "is in training mode" if m.training else "has track_running_stats=False"
            raise ValueError(f"{where} holds {type(m).__name__} {name or '(the encoder itself)'!r}, which {why}: it "
                             "normalizes with the micro-batch's statistics, so accumulation cannot give the full-batch "
                             "gradient; put it in eval mode (encoder.eval() or the layer's .eval()) or use LayerNorm "
                             "/ GroupNorm")


def _check_tolerance(replay_tol) -> float | None:
    return None if replay_tol is None else check_positive("replay_tol", replay_tol)


# ------------------------------------------------------------------------------------------------ the passes
def embed_micro_batches(encoder: Callable[[Any], Tensor], chunks: Sequence[Any]) -> tuple[list[Tensor], list[RNGState]]:
    """Pass 1: embed each micro-batch without a graph, recording the RNG state just before each call.

    Args:
        encoder: a callable (usually an ``nn.Module``) mapping one micro-batch to embeddings ``[n, d]``.
        chunks: the micro-batches (:func:`split_micro_batches`).

    Returns:
        (embeddings, one ``[n_k, d]`` detached tensor per micro-batch; their :class:`RNGState`).

    Raises:
        TypeError, ValueError: the encoder returned something other than finite ``[n_k, d]`` floats.
        ValueError: the encoder holds a BatchNorm using batch statistics (:func:`check_batch_independent`).
    """
    if not callable(encoder):
        raise TypeError(f"encoder must be callable, got {type(encoder).__name__}")
    for chunk in check_iterable("chunks", chunks):
        batch_size(chunk)                     # a micro-batch of a supported type (TypeError otherwise)
    check_batch_independent(encoder)
    embeddings, states = [], []
    with torch.no_grad():
        for k, chunk in enumerate(chunks):
            states.append(RNGState.capture(chunk, encoder))
            emb = encoder(chunk)
            embeddings.append(_check_embedding(emb, batch_size(chunk), f"micro-batch {k}").detach())
    return embeddings, states


def embedding_gradients(loss_fn: Callable[..., Tensor], embeddings: Sequence[Tensor],
                        scaler: Any = None) -> tuple[Tensor, list[Tensor | None]]:
    """Pass 2: the loss on every embedding at once and its gradient ``g = ∂L/∂e`` per input (the cache).

    Args:
        loss_fn: ``loss_fn(*embeddings) -> scalar`` (e.g. a partial of :func:`taskloss.contrastive.losses.info_nce`).
        embeddings: one ``[B_j, d]`` tensor per input; half-precision ones are upcast to float32 leaves so that
            the cache keeps float32 precision.
        scaler: optional ``torch.amp.GradScaler``; the cache is then ``∂(scale·L)/∂e``.

    Returns:
        (the loss, detached; one gradient per input, None where the loss did not use that input).

    Raises:
        ValueError: the loss is not a finite scalar.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if isinstance(embeddings, Tensor):
        raise TypeError("embeddings must be a sequence of tensors (one [B_j, d] tensor per input), got a Tensor")
    embeddings = check_tensors("embeddings", embeddings)
    for k, e in enumerate(embeddings):
        check_floating(f"embeddings[{k}]", e)
    leaves = [e.detach().to(torch.promote_types(e.dtype, torch.float32)).requires_grad_() for e in embeddings]
    with torch.enable_grad():
        loss = loss_fn(*leaves)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
                         f"{'' if not isinstance(loss, Tensor) else f' of shape {tuple(loss.shape)}'}")
    if not bool(torch.isfinite(loss.detach())):
        raise ValueError(f"loss_fn returned a non-finite loss ({loss.item()})")
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


def replay_backward(encoder: Callable[[Any], Tensor], chunks: Sequence[Any], grads: Sequence[Tensor],
                    states: Sequence[RNGState], reference: Sequence[Tensor] | None = None,
                    replay_tol: float | None = None, sync: bool = True) -> None:
    """Pass 3: re-embed each micro-batch with a graph under its recorded RNG state and accumulate
    ``∂⟨sg(g_k), e_k⟩/∂θ`` into the parameters' ``.grad``.

    Args:
        encoder: the encoder of pass 1.
        chunks: the micro-batches of :func:`embed_micro_batches`.
        states: their RNG states, from the same call.
        grads: the cache, split like ``chunks`` (``[n_k, d]`` each).
        reference: pass 1's embeddings, to check the replay against (skipped when None).
        replay_tol: largest allowed ``max|e₂ − e₁| / max|e₁|`` (finite, > 0: a NaN would disable the check);
            None takes the dtype's default.
        sync: for a ``DistributedDataParallel`` encoder, whether the last micro-batch synchronizes gradients
            (the others run under ``no_sync``); False when the same encoder embeds another input afterwards.

    Raises:
        ValueError: ``chunks``, ``grads``, ``states`` (and ``reference``) of different lengths or none, a cache
            entry that is not a finite floating ``[n_k, d]`` tensor matching its micro-batch (and ``reference``),
            ``replay_tol`` not finite and > 0, a batch-statistics BatchNorm in the encoder.
        TypeError: a state that is not an :class:`RNGState`.
        RuntimeError: the second pass returned another shape, or values further than ``replay_tol`` from the
            first (randomness or state the RNG replay does not cover).
    """
    sync = check_bool("sync", sync)
    replay_tol = _check_tolerance(replay_tol)
    check_batch_independent(encoder)
    _check_replay_inputs(chunks, grads, states, reference)
    ddp = isinstance(encoder, DistributedDataParallel)
    for k, (chunk, g, state) in enumerate(zip(chunks, grads, states)):
        last = sync and k == len(chunks) - 1
        with contextlib.nullcontext() if not ddp or last else encoder.no_sync():
            with state.replay():
                emb = encoder(chunk)
            if not isinstance(emb, Tensor) or emb.shape != g.shape:
                raise RuntimeError(f"micro-batch {k}: the encoder returned shape "
                                   f"{tuple(emb.shape) if isinstance(emb, Tensor) else type(emb).__name__} in the "
                                   f"second pass but {tuple(g.shape)} in the first; it must be a function of its "
                                   "input and RNG state")
            if reference is not None:
                _check_replay(emb.detach(), reference[k], k, replay_tol)
            (emb.to(g.dtype) * g).sum().backward()


def _check_replay_inputs(chunks, grads, states, reference) -> None:
    for name, v in (("chunks", chunks), ("grads", grads), ("states", states)) + (
            (("reference", reference),) if reference is not None else ()):
        if not isinstance(v, Sequence) or isinstance(v, (str, bytes)):
            raise TypeError(f"{name} must be a sequence (one entry per micro-batch), got {type(v).__name__}")
    lengths = {"chunks": len(chunks), "grads": len(grads), "states": len(states)}
    if reference is not None:
        lengths["reference"] = len(reference)
    if len(set(lengths.values())) > 1:
        raise ValueError(f"replay_backward needs one grad, state (and reference) per micro-batch, got {lengths}")
    if not chunks:
        raise ValueError("replay_backward got no micro-batch: nothing to replay")
    for k, (chunk, g, state) in enumerate(zip(chunks, grads, states)):
        if not isinstance(state, RNGState):
            raise TypeError(f"states[{k}] must be an RNGState (from embed_micro_batches), got {type(state).__name__}")
        if not isinstance(g, Tensor) or not g.is_floating_point() or g.ndim != 2:
            raise ValueError(f"grads[{k}] must be a floating [n, d] tensor, got "
                             f"{tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__}"
                             f"{' ' + str(g.dtype) if isinstance(g, Tensor) else ''}")
        if g.shape[0] != batch_size(chunk):
            raise ValueError(f"grads[{k}] has {g.shape[0]} rows but micro-batch {k} has {batch_size(chunk)} samples")
        if reference is not None and (not isinstance(reference[k], Tensor) or reference[k].shape != g.shape):
            raise ValueError(f"reference[{k}] must have the shape of grads[{k}] {tuple(g.shape)}, got "
                             f"{tuple(getattr(reference[k], 'shape', ())) or type(reference[k]).__name__}")
        if not all_finite(g):
            raise ValueError(f"grads[{k}] contains NaN or inf: it would be written into the encoder's gradients")


def _check_replay(emb: Tensor, ref: Tensor, k: int, tol: float | None) -> None:
    tol = REPLAY_TOLERANCE.get(ref.dtype, 1e-2) if tol is None else tol
    err = float((emb.to(ref.dtype) - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
    if err > tol:
        raise RuntimeError(f"micro-batch {k}: the second pass differs from the first (relative error {err:.2e} > "
                           f"{tol:.0e}); the encoder draws randomness the CPU/CUDA RNG replay does not cover, "
                           "or changed state between the passes")


# ------------------------------------------------------------------------------------------------ one step
@contextlib.contextmanager
def _naming_input(j: int, n: int):
    """Prefix errors raised for one input with its index, when there are several."""
    try:
        yield
    except (TypeError, ValueError, RuntimeError) as err:
        if n == 1:
            raise
        raise type(err)(f"input {j}, {err}") from err


@dataclass
class AccumulationResult:
    """What :func:`accumulated_backward` computed: the loss (detached), the embeddings of pass 1 and their
    gradients (the cache; None for an input the loss ignored), one per input."""

    loss: Tensor
    embeddings: list[Tensor]
    embedding_grads: list[Tensor | None]


def _per_input(name: str, value, n: int, check) -> list:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and not isinstance(value, nn.Module):
        if len(value) != n:
            raise ValueError(f"{name} must have one entry per input ({n}), got {len(value)}")
        return [check(v) for v in value]
    return [check(value)] * n


def _encoders_and_sizes(encoders, inputs, micro_batch_size):
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TypeError("inputs must be a non-empty list or tuple with one batch per encoder input")
    encs = _per_input("encoders", encoders, len(inputs), lambda e: e)
    for e in encs:
        if not callable(e):
            raise TypeError(f"an encoder must be callable, got {type(e).__name__}")
    sizes = _per_input("micro_batch_size", micro_batch_size, len(inputs),
                       lambda m: check_int("micro_batch_size", m, minimum=1))
    return encs, sizes


def accumulated_backward(encoders: Callable | Sequence[Callable], inputs: Sequence[Any],
                         loss_fn: Callable[..., Tensor], micro_batch_size: int | Sequence[int], *,
                         scaler: Any = None, replay_tol: float | None = None,
                         check_replay: bool = True) -> AccumulationResult:
    """Accumulate the exact full-batch gradient of ``loss_fn(*[encoder_j(inputs[j])])`` micro-batch by micro-batch.

    Peak activation memory is one micro-batch's graph plus the embeddings and the loss's own graph (B×B scores
    for InfoNCE); compute is one extra forward pass. Works under an enclosing ``torch.autocast`` (both passes
    run under it; the cache stays float32).

    Args:
        encoders: one callable used for every input, or one per input (e.g. ``(query_enc, doc_enc, doc_enc)``).
        inputs: one batch per encoder input (tensor, mapping of tensors, tuple, or list; see :func:`batch_size`).
        loss_fn: ``loss_fn(*embeddings) -> scalar``, called once on all embeddings ``[B_j, d]``.
        micro_batch_size: samples per micro-batch, one int or one per input; need not divide the batch.
        scaler: optional ``torch.amp.GradScaler`` (fp16): gradients are accumulated scaled, unscale as usual.
        replay_tol: tolerance of the replay check (:func:`replay_backward`); None: the dtype's default.
        check_replay: compare the second pass with the first (cheap; turn off only for kernels known to be
            non-deterministic beyond the tolerance).

    Returns:
        :class:`AccumulationResult`; the parameters' ``.grad`` hold the gradient (added to what was there).

    Raises:
        ValueError: micro-batch size < 1, an empty batch, non-finite embeddings or loss, bad shapes,
            ``replay_tol`` not finite and > 0, an encoder holding a BatchNorm that uses batch statistics
            (:func:`check_batch_independent`; refused rather than accumulated wrongly).
        RuntimeError: the second pass does not reproduce the first.
    """
    check_replay = check_bool("check_replay", check_replay)
    replay_tol = _check_tolerance(replay_tol)
    encs, sizes = _encoders_and_sizes(encoders, inputs, micro_batch_size)
    for j, enc in enumerate(encs):
        check_batch_independent(enc, "encoder" if len(encs) == 1 else f"encoder {j}")
    chunks = [split_micro_batches(x, m) for x, m in zip(inputs, sizes)]
    embedded = []
    for j, (enc, ch) in enumerate(zip(encs, chunks)):
        with _naming_input(j, len(inputs)):
            embedded.append(embed_micro_batches(enc, ch))
    embeddings = [torch.cat(e) for e, _ in embedded]
    loss, grads = embedding_gradients(loss_fn, embeddings, scaler)
    used = [j for j, g in enumerate(grads) if g is not None]
    last_use = {id(encs[j]): j for j in used}          # a shared DDP encoder synchronizes once, at its last input
    for j in used:
        emb, states = embedded[j]
        g_chunks = grads[j].split([e.shape[0] for e in emb])
        with _naming_input(j, len(inputs)):
            replay_backward(encs[j], chunks[j], g_chunks, states, emb if check_replay else None, replay_tol,
                            sync=last_use[id(encs[j])] == j)
    return AccumulationResult(loss, embeddings, grads)


def naive_accumulated_backward(encoders: Callable | Sequence[Callable], inputs: Sequence[Any],
                               loss_fn: Callable[..., Tensor], micro_batch_size: int | Sequence[int]) -> Tensor:
    """Ordinary gradient accumulation: ``Σ_k (n_k/B)·loss_fn(micro-batch k)``, back-propagated per micro-batch.

    For a mean-over-pairs loss this is the full-batch loss only when samples do not interact; with in-batch
    negatives each query sees the negatives of its own micro-batch only (notebook 10 derives the gradient it
    computes). Every input must split into the same number of micro-batches.

    Args:
        encoders: as in :func:`accumulated_backward`.
        inputs: as there.
        micro_batch_size: as there.
        loss_fn: ``loss_fn(*embeddings) -> scalar``, a mean over the micro-batch's pairs.

    Returns:
        The accumulated loss (detached); the parameters' ``.grad`` hold its gradient.

    Raises:
        ValueError: micro-batch size < 1, an empty batch, inputs splitting into different numbers of micro-batches.
    """
    encs, sizes = _encoders_and_sizes(encoders, inputs, micro_batch_size)
    chunks = [split_micro_batches(x, m) for x, m in zip(inputs, sizes)]
    if len({len(c) for c in chunks}) > 1:
        raise ValueError(f"inputs split into different numbers of micro-batches: {[len(c) for c in chunks]}")
    total, n = 0.0, batch_size(inputs[0])
    for k in range(len(chunks[0])):
        embs = [_check_embedding(enc(ch[k]), batch_size(ch[k]), f"input {j}, micro-batch {k}")
                for j, (enc, ch) in enumerate(zip(encs, chunks))]
        loss = loss_fn(*embs) * (batch_size(chunks[0][k]) / n)
        loss.backward()
        total = total + loss.detach()
    return total
