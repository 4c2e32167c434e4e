"""Text completion as a task-loss problem: greedy continuations of prefixes, scored by sequence task losses.

The setting of *MLE-guided parameter search for task loss minimization in neural sequence modeling*: a language
model receives a prefix and continues it greedily; the continuation is scored by non-differentiable task
losses (repetition, single-token repeats, non-termination, edit distance to the reference continuation).
This module is the glue between the models (:mod:`taskloss.models`, or a Hugging Face causal LM), the text
data (:mod:`taskloss.text`), the metrics (:mod:`taskloss.metrics`) and the optimizers (:class:`taskloss.mgs.MGS`,
:func:`taskloss.policy_gradient.sequence_reinforce`):

- :class:`CausalLM` — one interface over :class:`~taskloss.models.TransformerLM` and Hugging Face causal LMs:
  ``forward(idx [B, T], last_only=False) → logits [B, T, V]`` (or ``[B, V]`` for the last position only);
  :func:`load_causal_lm` loads the committed small LM (``""``) or a local Hugging Face folder, offline.
- :func:`greedy_decode` — fixed-length greedy decoding that works on a module *or* on MGS's functional
  ``call`` and vectorizes under ``torch.func.vmap`` (no data-dependent control flow).
- :func:`task_loss_terms` / :class:`CompletionTask` — the per-sequence task losses and the three callables
  MGS needs (surrogate, decoding, task loss) plus the per-sequence loss policy gradient needs.
- :func:`completion_pairs`, :func:`heldout_blocks`, :func:`perplexity`, :func:`evaluate_completions`.

Derived in notebook 04_sequence_task_losses.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import metrics
from .generation import check_token_ids
from .utils import check_int, check_nonempty, resolve_device

__all__ = [
    "TASK_LOSSES", "CausalLM", "HFTokenizer", "load_causal_lm", "greedy_decode", "parse_task_loss",
    "task_loss_terms", "CompletionBatch", "CompletionTask", "pad_sequences", "completion_pairs",
    "heldout_blocks", "window_nll", "block_nll", "perplexity", "evaluate_completions",
]

#: Per-sequence task losses of a continuation, each in [0, 1], lower is better.
TASK_LOSSES = ("edit_distance", "repetition", "token_repeat_rate", "non_termination")


# ------------------------------------------------------------------------------------------------ models
def _is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and callable(getattr(model, "get_output_embeddings", None))


class CausalLM(nn.Module):
    """Adapter giving a causal LM one interface: ``forward(idx [B, T], last_only=False)`` → logits
    ``[B, T, V]``, or ``[B, V]`` at the last position only (what decoding needs: it skips the output layer at
    every other position). Attributes ``vocab_size``, ``max_len`` (``None`` if unbounded), ``is_recurrent``
    (False) make it usable by :func:`taskloss.models.generate` and :func:`taskloss.models.sequence_logprob`.

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
        if decode:
            return self._greedy(idx, decode, eos_id, pad_id, cache)
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
    :class:`taskloss.text.Tokenizer`): ``encode``, ``encode_batch``, ``decode``, ``vocab_size``, ``eos_id``,
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
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of str")
        return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.encode_batch([text])[0]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"


def load_causal_lm(model_path: str | os.PathLike = "", device: str | torch.device = "cpu"):
    """``(CausalLM in eval mode on device, tokenizer)``.

    ``model_path=""``: the committed small LM of :func:`taskloss.text.load_pretrained_lm` with its
    :class:`~taskloss.text.Tokenizer`. Otherwise a local Hugging Face folder (e.g. a GPT-2 checkpoint saved
    with ``save_pretrained``) loaded offline through ``AutoModelForCausalLM``/``AutoTokenizer`` with eager
    attention (it vectorizes under ``vmap``), wrapped as :class:`HFTokenizer`. Nothing is downloaded.
    """
    dev = resolve_device(device)
    if not isinstance(model_path, (str, os.PathLike)):
        raise TypeError(f"model_path must be a str or path, got {type(model_path).__name__}")
    if str(model_path) == "":
        from .text import load_pretrained_lm

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
    with :meth:`CausalLM.forward`'s signature — such as the functional ``call`` that :class:`taskloss.mgs.MGS`
    hands to its ``forward_fn``. Tokens after a row's first ``eos_id`` are ``pad_id``. Always runs
    ``max_new_tokens`` steps (no early stop, no ``.item()``), so it vectorizes under ``torch.func.vmap``
    over stacked parameters. ``cache=True`` reuses per-layer keys/values (each step costs one token instead
    of the whole context) whenever the context never exceeds the model's ``max_len``; otherwise the context
    is recomputed, cropped to its last ``max_len`` tokens. Same output as
    ``taskloss.models.generate(..., greedy=True)`` (dropout off: call it in eval mode). No gradients.
    """
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
    with torch.no_grad():
        return model(prefix, decode=max_new_tokens, eos_id=eos_id, pad_id=pad_id, cache=bool(cache))


# ------------------------------------------------------------------------------------------- task losses
def parse_task_loss(spec: str) -> tuple[str, ...]:
    """``"edit_distance+repetition"`` → ``("edit_distance", "repetition")``; names from :data:`TASK_LOSSES`."""
    if not isinstance(spec, str):
        raise TypeError(f"task loss must be a str such as 'edit_distance+repetition', got {type(spec).__name__}")
    names = tuple(s.strip() for s in spec.split("+"))
    bad = [n for n in names if n not in TASK_LOSSES]
    if not names or bad:
        raise ValueError(f"unknown task loss term(s) {bad or [spec]}; choose from {TASK_LOSSES}, joined by '+'")
    if len(set(names)) != len(names):
        raise ValueError(f"task loss {spec!r} repeats a term")
    return names


def task_loss_terms(hyp: torch.Tensor, refs, *, eos_id: int, pad_id: int,
                    names: Sequence[str] = TASK_LOSSES, ngram: int = 4) -> dict[str, torch.Tensor]:
    """Per-sequence task losses of continuations ``hyp`` (LongTensor ``[B, N]``, padded after EOS as
    :func:`greedy_decode` returns them) → ``{name: float [B]}``, each in [0, 1], lower is better:

    - ``edit_distance``: token Levenshtein distance to the reference ``refs`` (``[B, C]`` padded with
      ``pad_id``, or a list of token lists), divided by the reference length, capped at 1;
    - ``repetition``: ``1 − |unique n-grams| / |n-grams|`` (``ngram``, default 4) of the continuation;
    - ``token_repeat_rate``: fraction of tokens that already occurred earlier in the continuation;
    - ``non_termination``: 1 if no ``eos_id`` among the ``N`` tokens.

    Sequences are cut at their first EOS (or ``pad_id``). See :mod:`taskloss.metrics`.
    """
    if not isinstance(hyp, torch.Tensor) or hyp.ndim != 2:
        raise ValueError(f"hyp must be a [B, N] LongTensor, got {getattr(hyp, 'shape', type(hyp).__name__)}")
    check_nonempty("hyp", hyp)
    names = tuple(names)
    for n in names:
        if n not in TASK_LOSSES:
            raise ValueError(f"unknown task loss {n!r}; choose from {TASK_LOSSES}")
    out: dict[str, torch.Tensor] = {}
    if "edit_distance" in names:
        nref = refs.shape[0] if isinstance(refs, torch.Tensor) else len(refs)
        if nref != hyp.shape[0]:
            raise ValueError(f"batch sizes differ: {hyp.shape[0]} continuations, {nref} references")
        out["edit_distance"] = metrics.edit_distance(hyp, refs, eos_id=eos_id, pad_id=pad_id)
    if "repetition" in names:
        out["repetition"] = metrics.repetition(hyp, ngram, eos_id=eos_id, pad_id=pad_id)
    if "token_repeat_rate" in names:
        out["token_repeat_rate"] = metrics.token_repeat_rate(hyp, eos_id=eos_id, pad_id=pad_id)
    if "non_termination" in names:
        out["non_termination"] = metrics.non_termination(hyp, eos_id)
    dev = hyp.device
    return {k: v.to(dev) for k, v in out.items()}


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, width: int | None = None,
                  device: str | torch.device | None = None) -> torch.Tensor:
    """List of token lists → LongTensor ``[B, width]`` right-padded with ``pad_id`` (width: the longest)."""
    check_nonempty("seqs", seqs)
    check_int("pad_id", pad_id, minimum=0)
    lens = [len(s) for s in seqs]
    width = max(lens) if width is None else check_int("width", width, minimum=max(lens))
    out = torch.full((len(seqs), max(width, 1)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out if device is None else out.to(device)


@dataclass
class CompletionBatch:
    """Prefixes ``[B, P]`` and their reference continuations ``[B, C]`` (right-padded with ``pad_id``), plus
    optional LM ``blocks`` ``[M, T + 1]`` for the MLE loss (when absent, the windows prefix ⊕ reference)."""

    prefixes: torch.Tensor
    refs: torch.Tensor
    blocks: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("prefixes", "refs") + (("blocks",) if self.blocks is not None else ()):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.is_floating_point() or t.dtype == torch.bool:
                raise ValueError(f"{name} must be a [B, T] LongTensor")
            check_nonempty(name, t)
        if self.prefixes.shape[0] != self.refs.shape[0]:
            raise ValueError(f"batch sizes differ: {self.prefixes.shape[0]} prefixes, {self.refs.shape[0]} refs")
        if self.blocks is not None and self.blocks.shape[1] < 2:
            raise ValueError("blocks must hold at least 2 tokens per row")

    def __len__(self) -> int:
        return self.prefixes.shape[0]

    def __getitem__(self, idx) -> "CompletionBatch":
        """Rows ``idx`` of prefixes/refs (blocks are kept whole)."""
        return CompletionBatch(self.prefixes[idx], self.refs[idx], self.blocks)

    def to(self, device) -> "CompletionBatch":
        return CompletionBatch(self.prefixes.to(device), self.refs.to(device),
                               None if self.blocks is None else self.blocks.to(device))


def window_nll(model: nn.Module, prefixes: torch.Tensor, refs: torch.Tensor, pad_id: int,
               eos_id: int | None = None) -> torch.Tensor:
    """Teacher-forced mean token NLL of the windows ``prefix ⊕ reference``: every token after the first is
    predicted; reference positions equal to ``pad_id`` (or after the reference's first ``eos_id``, which
    itself counts) are skipped. Scalar, differentiable."""
    if not isinstance(prefixes, torch.Tensor) or not isinstance(refs, torch.Tensor):
        raise TypeError("prefixes and refs must be LongTensors")
    if prefixes.shape[0] != refs.shape[0]:
        raise ValueError(f"batch sizes differ: {prefixes.shape[0]} prefixes, {refs.shape[0]} refs")
    check_nonempty("prefixes", prefixes)
    keep = refs != pad_id
    if eos_id is not None:
        is_eos = refs == eos_id
        after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        keep = (keep | is_eos) & ~after
    win = torch.cat([prefixes.long(), refs.long()], dim=1)
    mask = torch.cat([torch.ones_like(prefixes[:, 1:], dtype=torch.bool), keep], dim=1)  # targets win[:, 1:]
    logits = model(win[:, :-1])
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1), reduction="none")
    mask = mask.reshape(-1).to(nll.dtype)
    return (nll * mask).sum() / mask.sum().clamp_min(1)


def block_nll(model: nn.Module, blocks: torch.Tensor) -> torch.Tensor:
    """Mean next-token NLL of LM blocks ``[M, T + 1]`` (the pretraining objective). Scalar, differentiable."""
    if not isinstance(blocks, torch.Tensor) or blocks.ndim != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be a [M, T+1] LongTensor with T ≥ 1, got {getattr(blocks, 'shape', None)}")
    check_nonempty("blocks", blocks)
    logits = model(blocks[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))


class CompletionTask:
    """The text-completion objective: decode ``decode_len`` greedy tokens after each prefix, score them by
    ``task_loss`` (terms of :data:`TASK_LOSSES` joined by ``+``; the loss is their sum per sequence).

    Methods shaped for the optimizers:

    - ``surrogate_loss(model, batch)`` → the MLE loss (MGS's guide, and the MLE baseline's loss):
      :func:`block_nll` of ``batch.blocks`` when present, else :func:`window_nll` of the prefix ⊕ reference;
    - ``decode(call, batch)`` → ``[B, decode_len]`` greedy tokens (MGS's ``forward_fn``; vmappable);
    - ``batch_task_loss(hyp, batch)`` → 0-dim mean task loss (MGS's ``task_loss_fn``);
    - ``per_sequence(hyp, refs)`` → ``[B]`` (the ``task_loss`` of :func:`~taskloss.policy_gradient.sequence_reinforce`);
    - ``terms(hyp, refs)`` → every term of :data:`TASK_LOSSES` (for reporting).
    """

    def __init__(self, task_loss: str, decode_len: int, eos_id: int, pad_id: int, ngram: int = 4,
                 cache: bool = True):
        self.names = parse_task_loss(task_loss)
        self.spec = "+".join(self.names)
        self.decode_len = check_int("decode_len", decode_len, minimum=1)
        self.eos_id = check_int("eos_id", eos_id, minimum=0)
        self.pad_id = check_int("pad_id", pad_id, minimum=0)
        self.ngram = check_int("ngram", ngram, minimum=1)
        self.cache = bool(cache)

    def surrogate_loss(self, model: nn.Module, batch: CompletionBatch) -> torch.Tensor:
        if batch.blocks is not None:
            return block_nll(model, batch.blocks)
        return window_nll(model, batch.prefixes, batch.refs, self.pad_id, self.eos_id)

    def decode(self, call: Callable, batch: CompletionBatch) -> torch.Tensor:
        return greedy_decode(call, batch.prefixes, self.decode_len, self.eos_id, self.pad_id, cache=self.cache)

    def terms(self, hyp: torch.Tensor, refs) -> dict[str, torch.Tensor]:
        return task_loss_terms(hyp, refs, eos_id=self.eos_id, pad_id=self.pad_id, ngram=self.ngram)

    def per_sequence(self, hyp: torch.Tensor, refs) -> torch.Tensor:
        t = task_loss_terms(hyp, refs, eos_id=self.eos_id, pad_id=self.pad_id, names=self.names, ngram=self.ngram)
        return torch.stack([t[n] for n in self.names]).sum(0)

    def batch_task_loss(self, hyp: torch.Tensor, batch: CompletionBatch) -> torch.Tensor:
        return self.per_sequence(hyp, batch.refs).mean()

    def __repr__(self) -> str:
        return f"CompletionTask({self.spec!r}, decode_len={self.decode_len})"


# ------------------------------------------------------------------------------------------------- data
def _encoded(split: str, tokenizer, path, chunk: int = 2048):
    """Token ids of the split's lines, encoded lazily ``chunk`` lines at a time (a large corpus such as
    WikiText-103 is not tokenized beyond what is consumed)."""
    from .text import load_corpus

    lines = load_corpus(split, path)
    for i in range(0, len(lines), chunk):
        yield from tokenizer.encode_batch(lines[i:i + chunk])


def completion_pairs(split: str, tokenizer, prefix_len: int, cont_len: int, max_items: int | None = None,
                     path: str | os.PathLike | None = None, with_eos: bool = False) -> CompletionBatch:
    """Prefix/reference pairs of a corpus split as a :class:`CompletionBatch` (references padded with the
    tokenizer's ``pad_id``). A :class:`taskloss.text.Tokenizer` goes through
    :func:`taskloss.text.prefix_continuations`; any other tokenizer with ``encode_batch`` (e.g.
    :class:`HFTokenizer`) through the same rule here: the first ``prefix_len`` tokens of each line with at
    least ``prefix_len + cont_len`` tokens (``with_eos``: ``prefix_len + 1``, the reference then ends with EOS
    when the line ends within ``cont_len`` tokens), in corpus order, at most ``max_items``."""
    from . import text

    check_int("prefix_len", prefix_len, minimum=1)
    check_int("cont_len", cont_len, minimum=1)
    if max_items is not None:
        check_int("max_items", max_items, minimum=1)
    if isinstance(tokenizer, text.Tokenizer):
        pre, conts = text.prefix_continuations(split, prefix_len, cont_len, tokenizer, max_items=max_items,
                                               path=path, with_eos=with_eos)
        return CompletionBatch(pre, pad_sequences(conts, tokenizer.pad_id))
    if not callable(getattr(tokenizer, "encode_batch", None)):
        raise TypeError(f"tokenizer must have encode_batch, got {type(tokenizer).__name__}")
    need = prefix_len + (1 if with_eos else cont_len)
    pre, conts = [], []
    for ids in _encoded(split, tokenizer, path):
        if len(ids) < need:
            continue
        pre.append(ids[:prefix_len])
        cont = list(ids[prefix_len:prefix_len + cont_len])
        if with_eos and len(ids) <= prefix_len + cont_len:
            cont.append(tokenizer.eos_id)
        conts.append(cont)
        if max_items is not None and len(conts) == max_items:
            break
    if not conts:
        raise ValueError(f"no line of split {split!r} has {need} tokens (prefix_len={prefix_len}, cont_len={cont_len})")
    return CompletionBatch(torch.tensor(pre, dtype=torch.long), pad_sequences(conts, tokenizer.pad_id))


def heldout_blocks(split: str, tokenizer, block_size: int, path: str | os.PathLike | None = None,
                   max_blocks: int | None = None) -> torch.Tensor:
    """LongTensor ``[N, block_size + 1]`` of consecutive blocks of the split's token stream (each line
    followed by EOS) for :func:`perplexity`; :func:`taskloss.text.lm_blocks` for a taskloss Tokenizer, the same
    rule for other tokenizers. ``max_blocks`` keeps the first N."""
    from . import text

    check_int("block_size", block_size, minimum=1)
    if max_blocks is not None:
        check_int("max_blocks", max_blocks, minimum=1)
    if isinstance(tokenizer, text.Tokenizer):
        blocks = text.lm_blocks(split, block_size, tokenizer, path=path)
    else:
        need = None if max_blocks is None else max_blocks * block_size + 1
        stream: list[int] = []
        for ids in _encoded(split, tokenizer, path):
            stream.extend(ids)
            stream.append(tokenizer.eos_id)
            if need is not None and len(stream) >= need:
                break
        n = (len(stream) - 1) // block_size
        if n < 1:
            raise ValueError(f"split {split!r} has {len(stream)} tokens, too few for one block of {block_size}")
        s = torch.tensor(stream[: n * block_size + 1], dtype=torch.long)
        blocks = s.unfold(0, block_size + 1, block_size).contiguous()
    return blocks if max_blocks is None else blocks[:max_blocks]


# ----------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def perplexity(model: nn.Module, blocks: torch.Tensor, batch_size: int = 32) -> float:
    """``exp(mean token NLL)`` of ``blocks`` ``[N, T + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``), the
    model in eval mode (its mode is restored)."""
    if not isinstance(blocks, torch.Tensor) or blocks.ndim != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be a [N, T+1] LongTensor with T ≥ 1, got {getattr(blocks, 'shape', None)}")
    check_nonempty("blocks", blocks)
    check_int("batch_size", batch_size, minimum=1)
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, blocks.shape[0], batch_size):
            b = blocks[i:i + batch_size].to(dev)
            logits = model(b[:, :-1]).float()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1),
                                           reduction="sum"))
            count += b[:, 1:].numel()
    finally:
        model.train(was)
    ppl = math.exp(total / count)
    if not math.isfinite(ppl):
        raise ValueError("perplexity is not finite (the model produced inf/NaN log-probabilities)")
    return ppl


@torch.no_grad()
def evaluate_completions(model: nn.Module, batch: CompletionBatch, task: CompletionTask,
                         batch_size: int = 64) -> tuple[dict[str, float], torch.Tensor]:
    """Greedy-decode every prefix of ``batch`` (model in eval mode) and average each term of
    :data:`TASK_LOSSES` plus ``"task_loss"`` (``task``'s combination) → (``{name: mean}``, continuations
    ``[B, decode_len]``)."""
    if not isinstance(batch, CompletionBatch):
        raise TypeError(f"batch must be a CompletionBatch, got {type(batch).__name__}")
    if not isinstance(task, CompletionTask):
        raise TypeError(f"task must be a CompletionTask, got {type(task).__name__}")
    check_int("batch_size", batch_size, minimum=1)
    dev = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        hyp = torch.cat([greedy_decode(model, batch.prefixes[i:i + batch_size].to(dev), task.decode_len,
                                       task.eos_id, task.pad_id, cache=task.cache)
                         for i in range(0, len(batch), batch_size)])
    finally:
        model.train(was)
    terms = task.terms(hyp, batch.refs.to(dev))
    out = {k: float(v.mean()) for k, v in terms.items()}
    out["task_loss"] = float(sum(terms[n] for n in task.names).mean())
    return out, hyp
