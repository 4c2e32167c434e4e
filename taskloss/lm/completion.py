"""Text completion as a task-loss problem: greedy continuations of prefixes, scored by sequence task losses.

The setting of *MLE-guided parameter search for task loss minimization in neural sequence modeling*: a language
model receives a prefix and continues it greedily; the continuation is scored by non-differentiable task
losses (repetition, single-token repeats, non-termination, edit distance to the reference continuation).
This module is the glue between the models (:mod:`taskloss.lm.causal_lm` over :mod:`taskloss.models` or a Hugging
Face causal LM), the text data (:mod:`taskloss.datasets.corpus`), the metrics (:mod:`taskloss.losses.metrics`) and the optimizers
(:class:`taskloss.search.mgs.MGS`, :func:`taskloss.search.policy_gradient.sequence_reinforce`):

- :func:`task_loss_terms` / :class:`CompletionTask` — the per-sequence task losses and the three callables
  MGS needs (surrogate, decoding, task loss) plus the per-sequence loss policy gradient needs.
- :func:`completion_pairs`, :func:`heldout_blocks`, :func:`perplexity`, :func:`evaluate_completions`.

The model adapter and fixed-length greedy decoding live in :mod:`taskloss.lm.causal_lm`.

Derived in notebook 04_sequence_task_losses.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.datasets.corpus import lm_blocks, load_corpus, prefix_continuations
from taskloss.datasets.tokenizer import Tokenizer
from taskloss.lm.causal_lm import greedy_decode
from taskloss.losses import metrics
from taskloss.validation import (
    INDEX_DTYPES,
    check_bool,
    check_device,
    check_dtype,
    check_int,
    check_nonempty,
    check_steps,
    eval_mode,
    is_transformed,
)

__all__ = [
    "TASK_LOSSES", "parse_task_loss",
    "task_loss_terms", "CompletionBatch", "CompletionTask", "pad_sequences", "completion_pairs",
    "heldout_blocks", "window_nll", "block_nll", "perplexity", "evaluate_completions",
]

#: Per-sequence task losses of a continuation, each in [0, 1], lower is better.
TASK_LOSSES = ("edit_distance", "repetition", "token_repeat_rate", "non_termination")


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
    """Per-sequence task losses ``{name: float [B]}`` of continuations ``hyp``, each in [0, 1], lower is better.

    ``hyp``: LongTensor ``[B, N]``, padded after EOS as :func:`greedy_decode` returns them.

    - ``edit_distance``: token Levenshtein distance to the reference ``refs`` (``[B, C]`` padded with
      ``pad_id``, or a list of token lists), divided by the reference length, capped at 1;
    - ``repetition``: ``1 − |unique n-grams| / |n-grams|`` (``ngram``, default 4) of the continuation;
    - ``token_repeat_rate``: fraction of tokens that already occurred earlier in the continuation;
    - ``non_termination``: 1 if no ``eos_id`` among the ``N`` tokens.

    Sequences are cut at their first EOS (or ``pad_id``). See :mod:`taskloss.losses.metrics`.
    """
    if not isinstance(hyp, torch.Tensor) or hyp.ndim != 2:
        raise ValueError(f"hyp must be a [B, N] LongTensor, got {getattr(hyp, 'shape', type(hyp).__name__)}")
    check_nonempty("hyp", hyp)
    names = tuple(names)
    for n in names:
        if n not in TASK_LOSSES:
            raise ValueError(f"unknown task loss {n!r}; choose from {TASK_LOSSES}")
    out: dict[str, torch.Tensor] = {}
    check_int("eos_id", eos_id, minimum=0)
    check_int("pad_id", pad_id, minimum=0)
    if "edit_distance" in names:
        if isinstance(refs, torch.Tensor) and refs.ndim != 2 or isinstance(refs, (str, bytes)) or \
                not isinstance(refs, (torch.Tensor, Sequence)):
            raise TypeError(f"refs must be a [B, C] tensor or a list of token lists, got "
                            f"{type(refs).__name__}{f' of shape {tuple(refs.shape)}' if isinstance(refs, torch.Tensor) else ''}")
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
    if isinstance(seqs, (str, bytes)) or not isinstance(seqs, Sequence):
        raise TypeError(f"seqs must be a list of token lists, got {type(seqs).__name__}")
    check_nonempty("seqs", seqs)
    check_int("pad_id", pad_id, minimum=0)
    device = check_device("device", device, allow_none=True)
    for k, row in enumerate(seqs):
        if isinstance(row, (torch.Tensor, np.ndarray)):
            kind_ok = row.dtype.kind in "iu" if isinstance(row, np.ndarray) else \
                not (row.is_floating_point() or row.is_complex() or row.dtype == torch.bool)
            if not kind_ok or row.ndim != 1:
                raise TypeError(f"seqs[{k}] must be a 1-D integer array, got {row.dtype} {tuple(row.shape)}")
        elif isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or \
                not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in row):
            raise TypeError(f"seqs[{k}] must be a sequence of int token ids")
    lens = [len(s) for s in seqs]
    width = max(lens) if width is None else check_steps("width", width, bytes_per_step=8.0 * len(seqs),
                                                        minimum=max(lens), what=f"pad_sequences(width={width!r})")
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
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.is_floating_point() or t.is_complex() \
                    or t.dtype == torch.bool or t.is_meta:
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
        """The batch on ``device``."""
        return CompletionBatch(self.prefixes.to(device), self.refs.to(device),
                               None if self.blocks is None else self.blocks.to(device))


def window_nll(model: nn.Module, prefixes: torch.Tensor, refs: torch.Tensor, pad_id: int,
               eos_id: int | None = None) -> torch.Tensor:
    """Teacher-forced mean token NLL of the windows ``prefix ⊕ reference``: every token after the first is
    predicted; reference positions equal to ``pad_id`` (or after the reference's first ``eos_id``, which
    itself counts) are skipped. Scalar, differentiable."""
    for name, t in (("prefixes", prefixes), ("refs", refs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a LongTensor, got {type(t).__name__}")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.ndim != 2:
            raise TypeError(f"{name} must be a [B, T] integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if prefixes.shape[0] != refs.shape[0]:
        raise ValueError(f"batch sizes differ: {prefixes.shape[0]} prefixes, {refs.shape[0]} refs")
    check_nonempty("prefixes", prefixes)
    check_int("pad_id", pad_id)
    if eos_id is not None:
        check_int("eos_id", eos_id)
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
    """Mean next-token NLL of LM blocks ``[M, T + 1]`` (the pretraining objective). Scalar, differentiable.

    Token ids may be int64 or int32, as the models take them (:data:`taskloss.validation.INDEX_DTYPES`)."""
    _check_blocks(blocks)
    logits = model(blocks[:, :-1])
    targets = blocks[:, 1:]
    _check_targets(targets, logits.shape[-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).long())


def _check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    """The last column of a block is a target only, never an input: the model's own id check does not see it."""
    if not is_transformed(targets):
        lo, hi = int(targets.min()), int(targets.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"blocks hold target ids in [{lo}, {hi}], outside the model's [0, {vocab_size})")


def _check_blocks(blocks) -> None:
    if not isinstance(blocks, torch.Tensor) or blocks.ndim != 2 or blocks.shape[1] < 2:
        raise ValueError(f"blocks must be a [M, T+1] LongTensor with T ≥ 1, got {getattr(blocks, 'shape', None)}")
    check_dtype("blocks", blocks, INDEX_DTYPES, "integer token ids")
    check_nonempty("blocks", blocks)


class CompletionTask:
    """The text-completion objective: decode ``decode_len`` greedy tokens after each prefix, score them by
    ``task_loss`` (terms of :data:`TASK_LOSSES` joined by ``+``; the loss is their sum per sequence).

    Methods shaped for the optimizers:

    - ``surrogate_loss(model, batch)`` → the MLE loss (MGS's guide, and the MLE baseline's loss):
      :func:`block_nll` of ``batch.blocks`` when present, else :func:`window_nll` of the prefix ⊕ reference;
    - ``decode(call, batch)`` → ``[B, decode_len]`` greedy tokens (MGS's ``forward_fn``; vmappable);
    - ``batch_task_loss(hyp, batch)`` → 0-dim mean task loss (MGS's ``task_loss_fn``);
    - ``per_sequence(hyp, refs)`` → ``[B]`` (the ``task_loss`` of :func:`~taskloss.search.policy_gradient.sequence_reinforce`);
    - ``terms(hyp, refs)`` → every term of :data:`TASK_LOSSES` (for reporting).
    """

    def __init__(self, task_loss: str, decode_len: int, eos_id: int, pad_id: int, ngram: int = 4,
                 cache: bool = True):
        cache = check_bool("cache", cache)
        self.names = parse_task_loss(task_loss)
        self.spec = "+".join(self.names)
        self.decode_len = check_int("decode_len", decode_len, minimum=1)
        self.eos_id = check_int("eos_id", eos_id, minimum=0)
        self.pad_id = check_int("pad_id", pad_id, minimum=0)
        self.ngram = check_int("ngram", ngram, minimum=1)
        self.cache = bool(cache)

    def surrogate_loss(self, model: nn.Module, batch: CompletionBatch) -> torch.Tensor:
        """The MLE surrogate of the batch: the token NLL of its blocks, else of the prefixes' references."""
        if batch.blocks is not None:
            return block_nll(model, batch.blocks)
        return window_nll(model, batch.prefixes, batch.refs, self.pad_id, self.eos_id)

    def decode(self, call: Callable, batch: CompletionBatch) -> torch.Tensor:
        """Greedy continuations ``[B, decode_len]`` of the batch's prefixes by ``call``."""
        return greedy_decode(call, batch.prefixes, self.decode_len, self.eos_id, self.pad_id, cache=self.cache)

    def terms(self, hyp: torch.Tensor, refs) -> dict[str, torch.Tensor]:
        """The task loss's terms per sequence, by name."""
        return task_loss_terms(hyp, refs, eos_id=self.eos_id, pad_id=self.pad_id, ngram=self.ngram)

    def per_sequence(self, hyp: torch.Tensor, refs) -> torch.Tensor:
        """The task loss per sequence ``[B]`` (the sum of the selected terms)."""
        t = task_loss_terms(hyp, refs, eos_id=self.eos_id, pad_id=self.pad_id, names=self.names, ngram=self.ngram)
        return torch.stack([t[n] for n in self.names]).sum(0)

    def batch_task_loss(self, hyp: torch.Tensor, batch: CompletionBatch) -> torch.Tensor:
        """The mean task loss of the batch (0-dim)."""
        return self.per_sequence(hyp, batch.refs).mean()

    def __repr__(self) -> str:
        return f"CompletionTask({self.spec!r}, decode_len={self.decode_len})"


# ------------------------------------------------------------------------------------------------- data
def _encoded(split: str, tokenizer, path, chunk: int = 2048):
    """Token ids of the split's lines, encoded lazily ``chunk`` lines at a time (a large corpus such as
    WikiText-103 is not tokenized beyond what is consumed)."""
    lines = load_corpus(split, path)
    for i in range(0, len(lines), chunk):
        yield from tokenizer.encode_batch(lines[i:i + chunk])


def completion_pairs(split: str, tokenizer, prefix_len: int, cont_len: int, max_items: int | None = None,
                     path: str | os.PathLike | None = None, with_eos: bool = False) -> CompletionBatch:
    """Prefix/reference pairs of a corpus split as a :class:`CompletionBatch` (references padded with the
    tokenizer's ``pad_id``). A :class:`taskloss.datasets.tokenizer.Tokenizer` goes through
    :func:`taskloss.datasets.corpus.prefix_continuations`; any other tokenizer with ``encode_batch`` (e.g.
    :class:`HFTokenizer`) through the same rule here: the first ``prefix_len`` tokens of each line with at
    least ``prefix_len + cont_len`` tokens (``with_eos``: ``prefix_len + 1``, the reference then ends with EOS
    when the line ends within ``cont_len`` tokens), in corpus order, at most ``max_items``."""
    with_eos = check_bool("with_eos", with_eos)
    check_int("prefix_len", prefix_len, minimum=1)
    check_int("cont_len", cont_len, minimum=1)
    if max_items is not None:
        check_int("max_items", max_items, minimum=1)
    if isinstance(tokenizer, Tokenizer):
        pre, conts = prefix_continuations(split, prefix_len, cont_len, tokenizer, max_items=max_items,
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
    followed by EOS) for :func:`perplexity`; :func:`taskloss.datasets.corpus.lm_blocks` for a taskloss Tokenizer, the same
    rule for other tokenizers. ``max_blocks`` keeps the first N."""
    check_int("block_size", block_size, minimum=1)
    if max_blocks is not None:
        check_int("max_blocks", max_blocks, minimum=1)
    if isinstance(tokenizer, Tokenizer):
        blocks = lm_blocks(split, block_size, tokenizer, path=path)
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
    _check_blocks(blocks)
    check_int("batch_size", batch_size, minimum=1)
    dev = next(model.parameters()).device
    total, count = 0.0, 0
    with eval_mode(model):
        for i in range(0, blocks.shape[0], batch_size):
            b = blocks[i:i + batch_size].to(dev)
            logits = model(b[:, :-1]).float()
            _check_targets(b[:, 1:], logits.shape[-1])
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1).long(),
                                           reduction="sum"))
            count += b[:, 1:].numel()
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
    with eval_mode(model):
        hyp = torch.cat([greedy_decode(model, batch.prefixes[i:i + batch_size].to(dev), task.decode_len,
                                       task.eos_id, task.pad_id, cache=task.cache)
                         for i in range(0, len(batch), batch_size)])
    terms = task.terms(hyp, batch.refs.to(dev))
    out = {k: float(v.mean()) for k, v in terms.items()}
    out["task_loss"] = float(sum(terms[n] for n in task.names).mean())
    return out, hyp
