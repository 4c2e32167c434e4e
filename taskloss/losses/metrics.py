"""Task losses and metrics: what we evaluate, as opposed to the cross-entropy we train.

Everything is batched and device-agnostic (outputs live on the device of the input tensors). Conventions:

* A *metric* is "higher is better" (:func:`accuracy`, :func:`macro_f1`, :func:`bleu`, :func:`sentence_bleu`);
  each has a ``1 - metric`` *loss* helper (:func:`zero_one_loss`, :func:`macro_f1_loss`, :func:`bleu_loss`).
* A *loss* is "lower is better" and lies in ``[0, 1]`` (:func:`edit_distance` when normalized,
  :func:`repetition`, :func:`token_repeat_rate`, :func:`non_termination`).
* Token sequences are given either as a padded integer tensor ``[B, T]`` (optionally with ``lengths [B]``, or
  a ``pad_id`` whose first occurrence ends a row) or as a list of lists of ints / 1-D integer tensors.
  When ``eos_id`` is given every sequence is cut at its first EOS (the EOS itself is not scored), see
  :func:`cut_at_eos`. Token ids (``eos_id``, ``pad_id``) must be ints (Python or NumPy; not bool, float or
  str): a negative id is allowed and matches only equal tokens (e.g. ``-100``).
* :func:`edit_distance` runs on rapidfuzz's batched C++ Levenshtein (``rapidfuzz.process.cpdist``) for CPU
  input and on a batched torch dynamic programme for GPU tensors; both give the same integers.

Used as rewards by :mod:`taskloss.search.policy_gradient`, :mod:`taskloss.search.zeroth_order` and
:mod:`taskloss.search.mgs`; exercised in notebooks 02–05 (first in 05_policy_gradient_vs_zeroth_order).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from taskloss.losses.levenshtein import levenshtein_rapidfuzz, levenshtein_torch
from taskloss.validation import check_bool, check_device, check_int, check_nonempty, check_steps

__all__ = [
    "cut_at_eos", "to_lists",
    "accuracy", "zero_one_loss", "macro_f1", "macro_f1_loss",
    "edit_distance", "EDIT_DISTANCE_BACKENDS", "repetition", "token_repeat_rate", "non_termination",
    "bleu", "sentence_bleu", "bleu_loss", "bleu_from_ids",
]

#: ``edit_distance(backend=...)``: "auto" (rapidfuzz for CPU input, the torch kernel on a GPU), or either one.
EDIT_DISTANCE_BACKENDS = ("auto", "rapidfuzz", "torch")


def _check_id(name: str, value, *, optional: bool = True) -> int | None:
    """A token id: ``None`` (when optional) or an int — never a bool, float or str (``int()`` would accept
    ``0.5`` or ``"2"`` and silently compare against another id)."""
    if value is None and optional:
        return None
    return check_int(name, value)

# ---------------------------------------------------------------------------------------------- token input
def _check_int_tensor(name: str, t: torch.Tensor) -> None:
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must hold integer token/class ids, got dtype {t.dtype}")


def _list_to_padded(name: str, seqs, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for k, s in enumerate(seqs):
        if isinstance(s, torch.Tensor):
            _check_int_tensor(f"{name}[{k}]", s)
            if s.ndim != 1:
                raise ValueError(f"{name}[{k}] must be 1-D, got shape {tuple(s.shape)}")
            rows.append(s.to(device=device, dtype=torch.long))
        elif isinstance(s, (list, tuple)):
            for v in s:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"{name}[{k}] must contain ints, got {type(v).__name__}")
            rows.append(torch.tensor([int(v) for v in s], dtype=torch.long, device=device))
        else:
            raise TypeError(f"{name}[{k}] must be a list of ints or a 1-D integer tensor, got {type(s).__name__}")
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device)
    tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0)
    return tokens, lengths


def _first(hit: torch.Tensor) -> torch.Tensor:
    """Position of the first True per row of a bool ``[B, T]`` (``T`` where there is none), LongTensor [B].

    (``argmax`` returns the first maximum; on the bool mask read as uint8 it is several times faster than a min
    over positions, and whether the row has a True at all is read off at that position.)"""
    B, T = hit.shape
    if T == 0:
        return torch.zeros(B, dtype=torch.long, device=hit.device)
    first = hit.view(torch.uint8).argmax(1)
    return torch.where(hit.gather(1, first[:, None]).squeeze(1), first, T)


def cut_at_eos(seqs, eos_id: int | None = None, *, lengths: torch.Tensor | None = None,
               pad_id: int | None = None, name: str = "seqs",
               device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalize token input to ``(tokens LongTensor [B, T], lengths LongTensor [B])``, cut at the first EOS.

    ``seqs``: padded integer tensor ``[B, T]`` or a list of lists of ints / 1-D integer tensors.
    Row ``b`` is ``tokens[b, :lengths[b]]``. Its length is, in this order: ``lengths[b]`` when given; else the
    position of the first ``pad_id`` when ``pad_id`` is given (tensor input); else ``T`` (or the list length).
    Then, when ``eos_id`` is given, the length is shortened to the position of the first EOS inside the row
    (EOS excluded). Raises ``ValueError`` on an empty batch and ``TypeError`` on non-integer ids (in ``seqs``,
    ``lengths``, ``eos_id`` or ``pad_id``).
    """
    eos_id = _check_id("eos_id", eos_id)
    pad_id = _check_id("pad_id", pad_id)
    device = check_device("device", device, allow_none=True)
    if isinstance(seqs, torch.Tensor):
        _check_int_tensor(name, seqs)
        if seqs.ndim != 2:
            raise ValueError(f"{name} must be a padded [B, T] tensor, got shape {tuple(seqs.shape)}")
        if seqs.shape[0] == 0:
            raise ValueError(f"{name} is empty (batch size 0)")
        tokens = seqs.to(dtype=torch.long, device=device if device is not None else seqs.device)
        B, T = tokens.shape
        given = lengths is not None
        if not given:
            if pad_id is not None:      # position of the first pad id (T when there is none)
                lengths = _first(tokens == pad_id)
            else:
                lengths = torch.full((B,), T, dtype=torch.long, device=tokens.device)
    elif isinstance(seqs, (list, tuple)):
        check_nonempty(name, seqs)
        tokens, own = _list_to_padded(name, seqs, device if device is not None else torch.device("cpu"))
        B, T = tokens.shape
        given = lengths is not None
        lengths = lengths if given else own
    else:
        raise TypeError(f"{name} must be a [B, T] integer tensor or a list of token lists, "
                        f"got {type(seqs).__name__}")
    if given:                           # lengths from the caller: check them
        if not isinstance(lengths, torch.Tensor):
            lengths = torch.as_tensor(lengths)
        _check_int_tensor(f"{name} lengths", lengths)
        lengths = lengths.to(device=tokens.device, dtype=torch.long)
        if lengths.shape != (B,):
            raise ValueError(f"{name} lengths must have shape ({B},), got {tuple(lengths.shape)}")
        if bool(((lengths < 0) | (lengths > T)).any()):
            raise ValueError(f"{name} lengths must lie in [0, {T}]")
    if eos_id is not None:      # cut at the first EOS inside the row
        lengths = torch.minimum(lengths, _first(tokens == eos_id))
    return tokens, lengths


def to_lists(tokens: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Inverse of :func:`cut_at_eos`: ``[tokens[b, :lengths[b]] for b]`` as Python lists (for decoding).
    ``tokens``: integer ``[B, T]``; ``lengths``: integer ``[B]`` in ``[0, T]``."""
    for name, t, nd in (("tokens", tokens, 2), ("lengths", lengths, 1)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _check_int_tensor(name, t)
        if t.ndim != nd:
            raise ValueError(f"{name} must have {nd} dimension(s), got shape {tuple(t.shape)}")
    if lengths.shape[0] != tokens.shape[0]:
        raise ValueError(f"batch sizes differ: tokens {tuple(tokens.shape)}, lengths {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > tokens.shape[1]):
        raise ValueError(f"lengths must lie in [0, {tokens.shape[1]}]")
    rows = tokens.detach().cpu().tolist()
    return [r[:n] for r, n in zip(rows, lengths.detach().cpu().tolist())]


def _pair(hyp, ref, eos_id, pad_id, hyp_lengths, ref_lengths):
    dev = hyp.device if isinstance(hyp, torch.Tensor) else ref.device if isinstance(ref, torch.Tensor) else None
    h, lh = cut_at_eos(hyp, eos_id, lengths=hyp_lengths, pad_id=pad_id, name="hyp", device=dev)
    r, lr = cut_at_eos(ref, eos_id, lengths=ref_lengths, pad_id=pad_id, name="ref", device=dev)
    if h.shape[0] != r.shape[0]:
        raise ValueError(f"batch sizes differ: hyp has {h.shape[0]}, ref has {r.shape[0]}")
    return h, lh, r, lr


# ------------------------------------------------------------------------------------------ classification
def _check_labels(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    for name, t in (("pred", pred), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of class ids, got {type(t).__name__}")
        _check_int_tensor(name, t)
        if t.ndim == 0:
            raise ValueError(f"{name} must have a batch dimension, got a scalar")
    if pred.shape[-1] == 0 or target.shape[-1] == 0:
        raise ValueError("empty batch (last dimension of pred/target is 0)")
    if pred.shape[-1] != target.shape[-1]:
        raise ValueError(f"batch sizes differ: pred {tuple(pred.shape)} vs target {tuple(target.shape)}")
    pred, target = pred.long(), target.long()      # any integer dtype (int32 ids as the models take): one type
    try:
        pred, target = torch.broadcast_tensors(pred, target.to(pred.device))
    except RuntimeError as e:
        raise ValueError(f"pred {tuple(pred.shape)} and target {tuple(target.shape)} do not broadcast") from e
    return pred, target


def accuracy(pred: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Fraction of correct class predictions (higher is better); matches ``sklearn.metrics.accuracy_score``.

    ``pred``: integer class ids ``[..., N]`` (e.g. ``[S, N]`` for S sampled label vectors); ``target``: ``[N]``
    or broadcastable to ``pred``. ``reduction="mean"`` → float ``[...]`` (mean over the last dim),
    ``"none"`` → per-example correctness ``[..., N]`` in {0., 1.} (a per-example reward).
    """
    pred, target = _check_labels(pred, target)
    correct = (pred == target).to(torch.get_default_dtype())
    if reduction == "none":
        return correct
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    return correct.mean(-1)


def zero_one_loss(pred: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """``1 - accuracy`` (the 0-1 loss), same shapes as :func:`accuracy`."""
    return 1.0 - accuracy(pred, target, reduction=reduction)


def macro_f1(pred: torch.Tensor, target: torch.Tensor, num_classes: int, *, labels: str = "all",
             zero_division: float = 0.0) -> torch.Tensor:
    """Macro-averaged F1 (higher is better), batched over leading dimensions.

    ``pred``: integer class ids ``[..., N]``; ``target``: ``[N]`` or broadcastable. Returns float ``[...]``.
    Per class c: ``F1_c = 2 TP / (2 TP + FP + FN)``; when ``2 TP + FP + FN = 0`` (c absent from both pred and
    target) ``F1_c = zero_division``.

    ``labels="all"`` averages over all ``num_classes`` classes — equal to
    ``sklearn.metrics.f1_score(target, pred, labels=range(num_classes), average="macro",
    zero_division=zero_division)``; a class absent from the batch then contributes ``zero_division``
    (default 0, sklearn's ``"warn"`` behaviour without the warning). ``labels="present"`` averages only over
    classes occurring in pred or target — equal to sklearn's default ``labels=None``.
    """
    num_classes = check_int("num_classes", num_classes, minimum=1)
    if labels not in ("all", "present"):
        raise ValueError(f"labels must be 'all' or 'present', got {labels!r}")
    if zero_division not in (0, 1, 0.0, 1.0):
        raise ValueError(f"zero_division must be 0 or 1, got {zero_division!r}")
    pred, target = _check_labels(pred, target)
    lo = min(int(pred.min()), int(target.min()))
    hi = max(int(pred.max()), int(target.max()))
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"class ids must lie in [0, {num_classes - 1}], got range [{lo}, {hi}]")
    dt = torch.get_default_dtype()
    # two int64 one-hots [..., N, C] and their float copies: refused before they are allocated
    check_steps("num_classes", num_classes, bytes_per_step=2.0 * (8 + torch.finfo(dt).bits // 8) * pred.numel(),
                what=f"macro_f1(num_classes={num_classes}) over {pred.numel()} predictions")
    p1 = torch.nn.functional.one_hot(pred, num_classes).to(dt)     # [..., N, C]
    t1 = torch.nn.functional.one_hot(target, num_classes).to(dt)
    tp = (p1 * t1).sum(-2)
    denom = p1.sum(-2) + t1.sum(-2)                                   # 2TP + FP + FN
    f1 = torch.where(denom > 0, 2 * tp / denom.clamp_min(1), torch.full_like(denom, float(zero_division)))
    if labels == "all":
        return f1.mean(-1)
    present = (denom > 0).to(dt)
    return (f1 * present).sum(-1) / present.sum(-1)


def macro_f1_loss(pred: torch.Tensor, target: torch.Tensor, num_classes: int, **kw) -> torch.Tensor:
    """``1 - macro_f1`` (same arguments and shapes as :func:`macro_f1`)."""
    return 1.0 - macro_f1(pred, target, num_classes, **kw)


# -------------------------------------------------------------------------------------------- sequences
def edit_distance(hyp, ref, eos_id: int | None = None, pad_id: int | None = None, normalize: bool = True, *,
                  hyp_lengths: torch.Tensor | None = None, ref_lengths: torch.Tensor | None = None,
                  backend: str = "auto") -> torch.Tensor:
    """Token-level Levenshtein distance (insertions, deletions, substitutions cost 1), batched.

    Args:
      hyp: padded integer tensor ``[B, T_h]`` (with optional ``hyp_lengths`` or a ``pad_id``) or a list of token
        lists, cut at its first ``eos_id`` (see :func:`cut_at_eos`).
      ref: the same for the references ``[B, T_r]``.
      eos_id: the end-of-sequence id (``None``: no cut).
      pad_id: the padding id of tensor inputs (``None``: lengths from ``*_lengths`` or the full width).
      hyp_lengths: optional ``[B]`` lengths of ``hyp``'s rows.
      ref_lengths: optional ``[B]`` lengths of ``ref``'s rows.
      normalize: ``True`` (a loss in [0, 1]): ``min(d / |ref|, 1)``; for an empty reference it is 1 if the
        hypothesis is non-empty else 0 (that is ``min(d / max(|ref|, 1), 1)``). ``False``: the raw distance as
        a LongTensor [B] (equal to ``rapidfuzz.distance.Levenshtein.distance`` pair by pair).
      backend: ``"auto"`` — ``rapidfuzz.process.cpdist`` for CPU input (a C++ bit-parallel kernel; the ids go
        to it as strings of code points, one NumPy view for the batch), the batched torch dynamic programme
        (O(T_r) steps of O(B·T_h) work, no host round trip) for GPU tensors; ``"rapidfuzz"`` or ``"torch"``
        force one (they return the same integers).

    Returns ``[B]`` on the device of the input tensors. Raises ``TypeError``/``ValueError`` on non-integer or
    empty input, mismatched batch sizes, lengths out of range, or an unknown backend. Used as a task loss in
    notebooks 04 and 05; ``benchmarks/bench_metrics.py`` times both backends against a rapidfuzz loop.
    """
    normalize = check_bool("normalize", normalize)
    if backend not in EDIT_DISTANCE_BACKENDS:
        raise ValueError(f"backend must be one of {EDIT_DISTANCE_BACKENDS}, got {backend!r}")
    h, lh, r, lr = _pair(hyp, ref, eos_id, pad_id, hyp_lengths, ref_lengths)
    use_torch = backend == "torch" or (backend == "auto" and h.device.type != "cpu")
    d = (levenshtein_torch if use_torch else levenshtein_rapidfuzz)(h, lh, r, lr)
    if not normalize:
        return d
    dt = torch.get_default_dtype()
    return (d.to(dt) / lr.clamp_min(1).to(dt)).clamp_max(1.0)


def repetition(seqs, n: int = 4, *, eos_id: int | None = None, pad_id: int | None = None,
               lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Sequence-level n-gram repetition ``1 - |unique n-grams| / |n-grams|`` per sequence → float [B] in [0, 1).

    This is "seq-rep-n" of *Neural Text Generation with Unlikelihood Training*. A sequence with fewer than
    ``n`` tokens has no n-gram and is defined to have repetition 0. Sequences are cut at their first EOS.
    Vectorized with an all-pairs n-gram comparison: memory O(B·T²).
    """
    n = check_int("n", n, minimum=1)
    tokens, L = cut_at_eos(seqs, eos_id, lengths=lengths, pad_id=pad_id)
    B, T = tokens.shape
    dt = torch.get_default_dtype()
    M = T - n + 1
    if M <= 0:
        return torch.zeros(B, dtype=dt, device=tokens.device)
    grams = tokens.unfold(1, n, 1)                               # [B, M, n]
    pos = torch.arange(M, device=tokens.device)
    valid = pos[None, :] + n <= L[:, None]                        # [B, M]
    eq = torch.ones(B, M, M, dtype=torch.bool, device=tokens.device)
    for k in range(n):
        eq &= grams[:, :, None, k] == grams[:, None, :, k]
    earlier = pos[None, :] < pos[:, None]                          # [i, j]: j < i
    dup = (eq & earlier & valid[:, None, :]).any(-1)
    total = valid.sum(1).to(dt)
    unique = (valid & ~dup).sum(1).to(dt)
    return torch.where(total > 0, 1.0 - unique / total.clamp_min(1), torch.zeros_like(total))


def token_repeat_rate(seqs, window: int | None = None, *, eos_id: int | None = None,
                      pad_id: int | None = None, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Single-token repeat rate per sequence → float [B] in [0, 1).

    The "rep/ℓ" measure of *Neural Text Generation with Unlikelihood Training* applied to a sequence
    ``x_1..x_L``: the fraction of its ``L`` positions t whose token already occurred among the previous
    ``ℓ = window`` tokens ``x_{t-ℓ}, …, x_{t-1}`` (``window=None``: among all previous tokens). The first token
    is never a repeat but counts in the denominator; an empty sequence has rate 0. Cut at the first EOS.
    """
    if window is not None:
        window = check_int("window", window, minimum=1)
    tokens, L = cut_at_eos(seqs, eos_id, lengths=lengths, pad_id=pad_id)
    B, T = tokens.shape
    dt = torch.get_default_dtype()
    if T == 0:
        return torch.zeros(B, dtype=dt, device=tokens.device)
    pos = torch.arange(T, device=tokens.device)
    gap = pos[:, None] - pos[None, :]                             # [t, s] = t - s
    prev = (gap > 0) if window is None else (gap > 0) & (gap <= window)
    eq = tokens[:, :, None] == tokens[:, None, :]
    rep = (eq & prev).any(-1) & (pos[None, :] < L[:, None])        # s < t < L
    Lf = L.to(dt)
    return torch.where(L > 0, rep.sum(1).to(dt) / Lf.clamp_min(1), torch.zeros_like(Lf))


def non_termination(seqs, eos_id: int, *, max_len: int | None = None,
                    lengths: torch.Tensor | None = None) -> torch.Tensor:
    """1.0 where a sequence has no ``eos_id`` within its first ``max_len`` tokens, else 0.0 → float [B].

    ``max_len=None`` searches the whole row (its ``lengths`` when given, else the tensor width / list length).
    """
    eos_id = _check_id("eos_id", eos_id, optional=False)
    tokens, L = cut_at_eos(seqs, None, lengths=lengths)
    if max_len is not None:
        L = L.clamp_max(check_int("max_len", max_len, minimum=1))
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    found = ((tokens == eos_id) & (pos[None, :] < L[:, None])).any(1)
    return (~found).to(torch.get_default_dtype())


# ---------------------------------------------------------------------------------------------------- BLEU
def _check_strings(hyps, refs) -> None:
    for name, xs in (("hyps", hyps), ("refs", refs)):
        if isinstance(xs, str) or not isinstance(xs, (list, tuple)):
            raise TypeError(f"{name} must be a list of strings, got {type(xs).__name__}")
        check_nonempty(name, xs)
        if not all(isinstance(x, str) for x in xs):
            raise TypeError(f"{name} must contain only strings")
    if len(hyps) != len(refs):
        raise ValueError(f"batch sizes differ: {len(hyps)} hypotheses vs {len(refs)} references")


def bleu(hyps: list[str], refs: list[str], **sacrebleu_kwargs) -> float:
    """Corpus BLEU of ``hyps`` against one reference each, through ``sacrebleu.corpus_bleu``, scaled to [0, 1].

    ``sacrebleu_kwargs`` go to ``sacrebleu.corpus_bleu`` (e.g. ``tokenize="none"``, ``smooth_method``).
    """
    import sacrebleu

    _check_strings(hyps, refs)
    return sacrebleu.corpus_bleu(list(hyps), [list(refs)], **sacrebleu_kwargs).score / 100.0


def sentence_bleu(hyps: list[str], refs: list[str], **bleu_kwargs) -> torch.Tensor:
    """Per-sentence BLEU in [0, 1] → float tensor [B]; equals ``sacrebleu.sentence_bleu(h, [r]).score / 100``
    (exponential smoothing, effective order) unless ``bleu_kwargs`` (for ``sacrebleu.metrics.BLEU``) say
    otherwise."""
    from sacrebleu.metrics import BLEU

    _check_strings(hyps, refs)
    kw = {"effective_order": True, **bleu_kwargs}
    scorer = BLEU(**kw)
    scores = [scorer.sentence_score(h, [r]).score / 100.0 for h, r in zip(hyps, refs)]
    return torch.tensor(scores, dtype=torch.get_default_dtype())


def bleu_loss(hyps: list[str], refs: list[str], **bleu_kwargs) -> torch.Tensor:
    """``1 - sentence_bleu`` per sentence → float tensor [B] in [0, 1]."""
    return 1.0 - sentence_bleu(hyps, refs, **bleu_kwargs)


def bleu_from_ids(hyp, ref, decode: Callable[[list[int]], str], *, eos_id: int | None = None,
                  pad_id: int | None = None, sentence: bool = False, **kw):
    """BLEU on token ids: cut at EOS/pad (:func:`cut_at_eos`), decode each row with ``decode`` (e.g.
    ``tokenizer.decode``), then :func:`sentence_bleu` (``sentence=True``, tensor [B] on the input's device) or
    :func:`bleu` (corpus, float)."""
    sentence = check_bool("sentence", sentence)
    if not callable(decode):
        raise TypeError("decode must be a callable list[int] -> str")
    h, lh, r, lr = _pair(hyp, ref, eos_id, pad_id, None, None)
    hs = [decode(x) for x in to_lists(h, lh)]
    rs = [decode(x) for x in to_lists(r, lr)]
    if sentence:
        return sentence_bleu(hs, rs, **kw).to(h.device)
    return bleu(hs, rs, **kw)
