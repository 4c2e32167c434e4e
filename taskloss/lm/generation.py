"""Batched decoding and sequence log-probabilities for the language models of :mod:`taskloss.models`.

- :func:`generate` — greedy or sampled (temperature, top-k) continuations ``[B, max_new_tokens]``, with the
  tokens after each sequence's first EOS replaced by ``pad_id``; used to evaluate task losses of generated
  text (repetition, non-termination, BLEU) in the MGS (03–04), policy-gradient (05) and EMO (09) notebooks.
- :func:`sequence_logprob` — differentiable ``log p(continuation | prefix)`` per sequence, the score function
  of policy gradient (notebook 05).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from taskloss.lm.causal_lm import CausalLM
from taskloss.validation import (
    all_finite,
    check_bool,
    check_generator,
    check_int,
    check_positive,
    check_token_ids,
    eval_mode,
)

__all__ = ["generate", "sequence_logprob"]


def _check_model(model, device: torch.device) -> int:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    vocab_size = getattr(model, "vocab_size", None)
    if not isinstance(vocab_size, int):
        raise TypeError(f"model must expose an int attribute vocab_size (TransformerLM, RNNLM), "
                        f"{type(model).__name__} does not")
    p = next(model.parameters(), None)
    if p is not None and p.device != device:
        raise ValueError(f"model is on {p.device} but the tokens are on {device}; move one of them")
    return vocab_size


def _check_special(name: str, value, vocab_size: int, allow_none: bool = False):
    if value is None and allow_none:
        return None
    return check_int(name, value, minimum=0, maximum=vocab_size - 1)


def _next_token(logits: torch.Tensor, greedy: bool, temperature: float, top_k: int | None,
                generator: torch.Generator | None) -> torch.Tensor:
    """``logits`` ``[B, V]`` → token ids ``[B]``: argmax, or a sample from softmax(logits/T) over the top-k."""
    if not all_finite(logits):
        raise ValueError("model produced NaN or inf logits during generation")
    if greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model: nn.Module, prefix: torch.Tensor, max_new_tokens: int, eos_id: int | None, pad_id: int,
             greedy: bool = True, temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode ``max_new_tokens`` tokens after each row of ``prefix`` (LongTensor ``[B, T]``, ``T ≥ 1``).

    Returns a LongTensor ``[B, max_new_tokens]`` on ``prefix.device``: each row's continuation, keeping its
    first ``eos_id`` and filling every later position with ``pad_id`` (``eos_id=None``: never stops).
    Decoding stops early once every row has produced EOS. ``greedy=True`` takes the argmax; otherwise
    samples from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits, using
    ``generator`` (which must live on the prefix's device) for reproducibility.

    Works for :class:`~taskloss.models.TransformerLM` (with key/value caches when prefix + continuation fit in
    ``max_len``; otherwise the context is cropped to its last ``max_len`` tokens and recomputed each step) and
    :class:`~taskloss.models.RNNLM` (the recurrent state is carried, one token per step), and for a
    :class:`~taskloss.lm.causal_lm.CausalLM` through the adapter's own key/value cache (its Hugging Face cache
    for a wrapped Hugging Face model). Runs under
    ``torch.no_grad()`` with the model temporarily in eval mode (its mode is restored afterwards).
    """
    greedy = check_bool("greedy", greedy)
    if not isinstance(prefix, torch.Tensor):
        raise TypeError(f"prefix must be a torch.LongTensor, got {type(prefix).__name__}")
    vocab_size = _check_model(model, prefix.device)
    check_token_ids("prefix", prefix, vocab_size)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    eos_id = _check_special("eos_id", eos_id, vocab_size, allow_none=True)
    pad_id = _check_special("pad_id", pad_id, vocab_size)
    if not isinstance(greedy, bool):
        raise TypeError(f"greedy must be a bool, got {type(greedy).__name__}")
    check_positive("temperature", temperature)
    if top_k is not None:
        check_int("top_k", top_k, minimum=1)
    check_generator("generator", generator, prefix.device)

    B, P = prefix.shape
    recurrent = bool(getattr(model, "is_recurrent", False))
    max_len = getattr(model, "max_len", None)
    seq = torch.cat([prefix.long(), prefix.new_full((B, max_new_tokens), pad_id, dtype=torch.long)], dim=1)
    finished = torch.zeros(B, dtype=torch.bool, device=prefix.device)
    # A TransformerLM whose whole output fits its context decodes through per-layer key/value caches (one new
    # row per step instead of re-running the context); otherwise the cropped context is recomputed each step.
    # A CausalLM (a TransformerLM or Hugging Face model behind the adapter) decodes through its own cache.
    wrapped = isinstance(model, CausalLM)
    cached = (not recurrent and (wrapped or hasattr(model, "blocks"))
              and (max_len is None or P + max_new_tokens - 1 <= max_len))
    steps = None
    with eval_mode(model):
        try:
            if recurrent:
                logits, state = model(seq[:, :P], return_state=True)
                last = logits[:, -1]
            elif cached:
                adapter = model if wrapped else CausalLM(model)
                steps = (adapter._hf_cached_steps if adapter.kind == "hf" else adapter._tl_cached_steps)(seq[:, :P])
                last = next(steps)
            for t in range(max_new_tokens):
                if not recurrent and not cached:
                    start = 0 if max_len is None else max(0, P + t - max_len)
                    last = model(seq[:, start:P + t])[:, -1]
                nxt = _next_token(last, greedy, temperature, top_k, generator)
                nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
                seq[:, P + t] = nxt
                if eos_id is not None:
                    finished |= nxt == eos_id
                    if bool(finished.all()):
                        break
                if t + 1 < max_new_tokens:
                    if recurrent:
                        logits, state = model(nxt[:, None], state, return_state=True)
                        last = logits[:, -1]
                    elif cached:
                        last = steps.send(nxt)
        finally:
            if steps is not None:
                steps.close()
    return seq[:, P:]


def sequence_logprob(model: nn.Module, prefix: torch.Tensor, continuation: torch.Tensor, pad_id: int,
                     eos_id: int | None = None) -> torch.Tensor:
    """``log p(continuation | prefix)`` per row: ``[B]`` sum over continuation tokens of
    ``log softmax(model(prefix ⊕ continuation[:, :-1]))`` at the token, differentiable w.r.t. the model.

    ``prefix`` ``[B, P]`` and ``continuation`` ``[B, C]`` (as returned by :func:`generate`) are LongTensors on
    the model's device. Positions equal to ``pad_id`` are ignored. When ``eos_id`` is given, everything after
    a row's first EOS is ignored too and the EOS itself counts even if ``eos_id == pad_id``. The model is used
    in its current mode (call ``model.eval()`` to disable dropout; on CUDA, backpropagating through a cuDNN
    LSTM/RNN needs train mode — use ``dropout=0`` there for deterministic scores). For a TransformerLM,
    ``P + C - 1 ≤ max_len`` is required.
    """
    if not isinstance(prefix, torch.Tensor) or not isinstance(continuation, torch.Tensor):
        raise TypeError("prefix and continuation must be torch.LongTensors")
    vocab_size = _check_model(model, prefix.device)
    check_token_ids("prefix", prefix, vocab_size)
    check_token_ids("continuation", continuation, vocab_size)
    if continuation.device != prefix.device:
        raise ValueError(f"prefix on {prefix.device} but continuation on {continuation.device}")
    if prefix.shape[0] != continuation.shape[0]:
        raise ValueError(f"batch sizes differ: prefix {prefix.shape[0]}, continuation {continuation.shape[0]}")
    pad_id = _check_special("pad_id", pad_id, vocab_size)
    eos_id = _check_special("eos_id", eos_id, vocab_size, allow_none=True)
    P, C = prefix.shape[1], continuation.shape[1]
    max_len = getattr(model, "max_len", None)
    if max_len is not None and P + C - 1 > max_len:
        raise ValueError(f"prefix length {P} + continuation length {C} - 1 exceeds the model's max_len {max_len}")
    cont = continuation.long()
    inp = torch.cat([prefix.long(), cont[:, :-1]], dim=1)
    logits = model(inp)[:, P - 1:]  # [B, C, V]: position P-1+j predicts continuation[:, j]
    logp = F.log_softmax(logits.float(), dim=-1).gather(-1, cont.unsqueeze(-1)).squeeze(-1)  # [B, C]
    keep = cont != pad_id
    if eos_id is not None:
        is_eos = cont == eos_id
        after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        keep = (keep | is_eos) & ~after_eos
    return torch.where(keep, logp, torch.zeros_like(logp)).sum(dim=1)
