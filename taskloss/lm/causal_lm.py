"""Causal language models behind one interface, and fixed-length greedy decoding that vectorizes.

The model side of text completion (the setting of *MLE-guided parameter search for task loss minimization in
neural sequence modeling*), used by :mod:`taskloss.lm.completion` and the optimizers that decode
(:class:`taskloss.search.mgs.MGS`, :func:`taskloss.search.policy_gradient.sequence_reinforce`):

- :class:`CausalLM` — one interface over :class:`~taskloss.models.TransformerLM` and Hugging Face causal LMs:
  ``forward(idx [B, T], last_only=False) → logits [B, T, V]`` (or ``[B, V]`` for the last position only);
  greedy decoding with per-layer key/value caches lives in its ``forward`` (``decode=N``).
- :func:`load_causal_lm` — the committed small LM (``""``) or a local Hugging Face folder, offline;
  :class:`HFTokenizer` — a Hugging Face tokenizer behind the :class:`taskloss.datasets.tokenizer.Tokenizer` interface.
- :func:`greedy_decode` — fixed-length greedy decoding that works on a module *or* on MGS's functional
  ``call`` and vectorizes under ``torch.func.vmap`` (no data-dependent control flow).

Derived in notebook 04_sequence_task_losses.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from taskloss.lm.pretrained import load_pretrained_lm
from taskloss.utils import resolve_device
from taskloss.validation import check_bool, check_int, check_token_ids

__all__ = ["CausalLM", "HFTokenizer", "load_causal_lm", "greedy_decode"]


# ------------------------------------------------------------------------------------------------ models
def _is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and callable(getattr(model, "get_output_embeddings", None))


class CausalLM(nn.Module):
    """Adapter giving a causal LM one interface: ``forward(idx [B, T], last_only=False)`` → logits
    ``[B, T, V]``, or ``[B, V]`` at the last position only (what decoding needs: it skips the output layer at
    every other position). Attributes ``vocab_size``, ``max_len`` (``None`` if unbounded), ``is_recurrent``
    (False) make it usable by :func:`taskloss.lm.generate` and :func:`taskloss.lm.sequence_logprob`.

    Wraps a :class:`~taskloss.models.TransformerLM` (anything with ``hidden_states`` and ``head``) or a Hugging
    Face ``*ForCausalLM`` (through ``logits_to_keep=1`` and ``use_cache=False``). The wrapped model is the
    submodule ``lm``; parameters are shared, not copied. Works under ``torch.func.functional_call`` + ``vmap``
    (for HF models load them with ``attn_implementation="eager"``, see :func:`load_causal_lm`).
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        if not isinstance(lm, nn.Module):
            raise TypeError(f"lm must be an nn.Module, got {type(lm).__name__}")
        if isinstance(lm, CausalLM):
            raise TypeError("lm is already a CausalLM")
        if getattr(lm, "is_recurrent", False):
            raise TypeError("CausalLM wraps Transformer LMs (TransformerLM or Hugging Face); got a recurrent model")
        self.lm = lm
        if _is_hf(lm):
            self.kind = "hf"
            self.vocab_size = int(lm.get_output_embeddings().weight.shape[0])
            cfg = lm.config
            n = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
            self.max_len = int(n) if n else None
        elif hasattr(lm, "hidden_states") and hasattr(lm, "head") and isinstance(getattr(lm, "vocab_size", None), int):
            self.kind = "taskloss"
            self.vocab_size = lm.vocab_size
            self.max_len = getattr(lm, "max_len", None)
        else:
            raise TypeError(f"cannot adapt {type(lm).__name__}: expected a taskloss TransformerLM (hidden_states, "
                            "head, vocab_size) or a Hugging Face causal LM (config, get_output_embeddings)")
        self.is_recurrent = False

    def forward(self, idx: torch.Tensor, last_only: bool = False, decode: int = 0, eos_id: int | None = None,
                pad_id: int = 0, cache: bool = True) -> torch.Tensor:
        """Logits of ``idx`` ``[B, T]`` (``[B, V]`` with ``last_only``), or with ``decode = N > 0`` the ``N``
        greedy tokens after ``idx`` (``[B, N]``, ``pad_id`` after each row's first ``eos_id``; see
        :func:`greedy_decode`). Decoding lives in ``forward`` so that it runs under ``functional_call``."""
        last_only = check_bool("last_only", last_only)
        cache = check_bool("cache", cache)
        check_int("decode", decode, minimum=0)
        if not isinstance(last_only, bool):
            raise TypeError(f"last_only must be a bool, got {type(last_only).__name__}")
        if decode:
            check_int("pad_id", pad_id, minimum=0)
            if eos_id is not None:
                check_int("eos_id", eos_id, minimum=0)
            return self._greedy(idx, decode, eos_id, pad_id, bool(cache))
        return self._logits(idx, last_only)

    def _logits(self, idx: torch.Tensor, last_only: bool) -> torch.Tensor:
        if self.kind == "hf":
            if last_only:
                return self.lm(input_ids=idx, use_cache=False, logits_to_keep=1).logits[:, -1]
            return self.lm(input_ids=idx, use_cache=False).logits
        if last_only:
            return self.lm.head(self.lm.hidden_states(idx)[:, -1])
        return self.lm(idx)

    # -- greedy decoding ----------------------------------------------------------------------------------
    def _greedy(self, prefix: torch.Tensor, n: int, eos_id: int | None, pad_id: int, cache: bool) -> torch.Tensor:
        P = prefix.shape[1]
        fits = self.max_len is None or P + n - 1 <= self.max_len  # no cropping: cached keys stay valid
        if cache and fits:
            step = self._hf_cached_steps if self.kind == "hf" else self._tl_cached_steps
        else:
            step = self._recompute_steps
        done = torch.zeros(prefix.shape[0], dtype=torch.bool, device=prefix.device)
        out = []
        gen = step(prefix.long())
        logits = next(gen)
        for t in range(n):
            nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            if eos_id is not None:
                done = done | (nxt == eos_id)
            out.append(nxt)
            if t + 1 < n:
                logits = gen.send(nxt)
        gen.close()
        return torch.stack(out, dim=1)

    def _recompute_steps(self, seq: torch.Tensor):
        """Coroutine: yields next-token logits ``[B, V]``, receives the chosen tokens ``[B]``; the whole
        (cropped) context is recomputed at every step."""
        P = seq.shape[1]
        t = 0
        while True:
            start = 0 if self.max_len is None else max(0, P + t - self.max_len)
            nxt = yield self._logits(seq[:, start:], True)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            t += 1

    def _hf_cached_steps(self, seq: torch.Tensor):
        """Same coroutine through the Hugging Face key/value cache (``cache`` or ``past_key_values``)."""
        import inspect

        name = "cache" if "cache" in inspect.signature(self.lm.forward).parameters else "past_key_values"
        out = self.lm(input_ids=seq, use_cache=True, logits_to_keep=1)
        while True:
            nxt = yield out.logits[:, -1]
            out = self.lm(input_ids=nxt[:, None], use_cache=True, logits_to_keep=1, **{name: getattr(out, name)})

    def _tl_cached_steps(self, seq: torch.Tensor):
        """Same coroutine for a :class:`~taskloss.models.TransformerLM` with per-layer key/value caches (and the
        per-layer score rows RealFormer carries); dropout is not applied (decode in eval mode)."""
        lm = self.lm
        caches: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(lm.blocks)
        pos0 = 0
        x_idx = seq
        while True:
            T = x_idx.shape[1]
            pos = torch.arange(pos0, pos0 + T, device=x_idx.device)
            x = lm.tok_emb(x_idx) + lm.pos_emb(pos)
            scores = None
            for i, blk in enumerate(lm.blocks):
                if blk.residual == "pre":
                    a, _, caches[i] = _cached_attention(blk.attn, blk.ln1(x), caches[i], None)
                    x = x + a
                    x = x + blk.fc2(F.gelu(blk.fc1(blk.ln2(x))))
                else:
                    prev = scores if blk.residual == "realformer" else None
                    a, scores, caches[i] = _cached_attention(blk.attn, x, caches[i], prev)
                    x = blk.ln1(x + a)
                    x = blk.ln2(x + blk.fc2(F.gelu(blk.fc1(x))))
            nxt = yield lm.head(lm.ln_f(x[:, -1]))
            pos0 += T
            x_idx = nxt[:, None]


def _cached_attention(attn: nn.Module, x: torch.Tensor, cache, prev_scores):
    """Causal self-attention of the new rows ``x`` ``[B, T, d]`` (absolute positions after the cached ones)
    over cached + new keys; returns (output ``[B, T, d]``, raw scores ``[B, H, T, T_all]``, new cache)."""
    B, T, D = x.shape
    q, k, v = attn.qkv(x).view(B, T, 3, attn.n_heads, attn.d_head).permute(2, 0, 3, 1, 4)
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(attn.d_head)
    if prev_scores is not None:
        scores = scores + prev_scores
    n_all = k.shape[2]
    rows = torch.arange(n_all - T, n_all, device=x.device)
    visible = torch.arange(n_all, device=x.device)[None, :] <= rows[:, None]
    att = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    y = attn.proj((att @ v).transpose(1, 2).reshape(B, T, D))
    return y, scores, (k, v)


class HFTokenizer:
    """A Hugging Face tokenizer behind the small interface the notebooks use (that of
    :class:`taskloss.datasets.tokenizer.Tokenizer`): ``encode``, ``encode_batch``, ``decode``, ``vocab_size``, ``eos_id``,
    ``pad_id`` (the EOS id when the tokenizer has no pad token, as for GPT-2), ``bos_id``."""

    def __init__(self, hf_tokenizer, vocab_size: int | None = None):
        eos = getattr(hf_tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("the Hugging Face tokenizer has no eos_token; set one (needed for non-termination)")
        self.hf = hf_tokenizer
        self.eos_id = int(eos)
        pad = getattr(hf_tokenizer, "pad_token_id", None)
        self.pad_id = self.eos_id if pad is None else int(pad)
        bos = getattr(hf_tokenizer, "bos_token_id", None)
        self.bos_id = self.eos_id if bos is None else int(bos)
        self.vocab_size = int(vocab_size) if vocab_size is not None else len(hf_tokenizer)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, through the wrapped tokenizer."""
        if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of str")
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, through the wrapped tokenizer."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.encode_batch([text])[0]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Token ids (a 1-D integer tensor or a sequence of ints; not floats or bools) → text."""
        skip_special_tokens = check_bool("skip_special_tokens", skip_special_tokens)
        if isinstance(ids, torch.Tensor):
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool or ids.ndim != 1:
                raise TypeError(f"ids must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)):
            raise TypeError("ids must be a sequence of int token ids, got a str")
        return self.hf.decode([check_int("token id", i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"


def load_causal_lm(model_path: str | os.PathLike = "", device: str | torch.device = "cpu"):
    """``(CausalLM in eval mode on device, tokenizer)``.

    ``model_path=""``: the committed small LM of :func:`taskloss.lm.pretrained.load_pretrained_lm` with its
    :class:`~taskloss.datasets.tokenizer.Tokenizer`. Otherwise a local Hugging Face folder (e.g. a GPT-2 checkpoint saved
    with ``save_pretrained``) loaded offline through ``AutoModelForCausalLM``/``AutoTokenizer`` with eager
    attention (it vectorizes under ``vmap``), wrapped as :class:`HFTokenizer`. Nothing is downloaded.
    """
    dev = resolve_device(device)
    if not isinstance(model_path, (str, os.PathLike)):
        raise TypeError(f"model_path must be a str or path, got {type(model_path).__name__}")
    if str(model_path) == "":
        lm, tok = load_pretrained_lm(device=dev)
        return CausalLM(lm).to(dev).eval(), tok
    folder = Path(model_path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model_path {folder} is not a folder (expected a Hugging Face save_pretrained "
                                "folder with config.json, weights and tokenizer files)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    model = CausalLM(lm).to(dev).eval()
    return model, HFTokenizer(hf_tok, vocab_size=model.vocab_size)


# ---------------------------------------------------------------------------------------------- decoding
def greedy_decode(model: Callable, prefix: torch.Tensor, max_new_tokens: int, eos_id: int | None,
                  pad_id: int, cache: bool = True) -> torch.Tensor:
    """Greedy continuation ``[B, max_new_tokens]`` of each row of ``prefix`` (LongTensor ``[B, P]``).

    ``model``: a :class:`CausalLM` (a TransformerLM / Hugging Face model is wrapped on the fly) or a callable
    with :meth:`CausalLM.forward`'s signature — such as the functional ``call`` that :class:`taskloss.search.mgs.MGS`
    hands to its ``forward_fn``. Tokens after a row's first ``eos_id`` are ``pad_id``. Always runs
    ``max_new_tokens`` steps (no early stop, no ``.item()``), so it vectorizes under ``torch.func.vmap``
    over stacked parameters. ``cache=True`` reuses per-layer keys/values (each step costs one token instead
    of the whole context) whenever the context never exceeds the model's ``max_len``; otherwise the context
    is recomputed, cropped to its last ``max_len`` tokens. Same output as
    ``taskloss.lm.generate(..., greedy=True)`` (dropout off: call it in eval mode). No gradients.
    """
    cache = check_bool("cache", cache)
    if isinstance(model, nn.Module) and not isinstance(model, CausalLM):
        model = CausalLM(model)
    if not callable(model):
        raise TypeError(f"model must be a CausalLM or a callable, got {type(model).__name__}")
    vocab = getattr(model, "vocab_size", None)
    check_token_ids("prefix", prefix, vocab if isinstance(vocab, int) else 2 ** 62)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("pad_id", pad_id, minimum=0)
    if eos_id is not None:
        check_int("eos_id", eos_id, minimum=0)
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be a bool, got {type(cache).__name__}")
    with torch.no_grad():
        return model(prefix, decode=max_new_tokens, eos_id=eos_id, pad_id=pad_id, cache=bool(cache))
