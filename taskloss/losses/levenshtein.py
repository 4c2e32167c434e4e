"""Batched token Levenshtein distance, the two kernels behind :func:`taskloss.losses.metrics.edit_distance`.

Both take padded integer rows ``h [B, T_h]``, ``r [B, T_r]`` with their lengths ``lh``, ``lr`` (LongTensor
``[B]``; already cut at EOS/pad) and return the distances as a LongTensor ``[B]`` on ``h``'s device:

- :func:`levenshtein_rapidfuzz` — rapidfuzz's bit-parallel C++ kernel for the whole batch
  (``rapidfuzz.process.cpdist`` with ``rapidfuzz.distance.Levenshtein.distance``); the ids reach it as Python
  strings of code points made by one NumPy view of the batch (the CPU path);
- :func:`levenshtein_torch` — a dynamic programme vectorized over the batch and the hypothesis positions, on the
  tensors' device (the GPU path: no host round trip).

They return the same integers (tested against each other and against rapidfuzz pair by pair);
``benchmarks/bench_metrics.py`` times them against a Python loop over rapidfuzz. Used by the sequence task losses
of notebooks 04 and 05.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["levenshtein_torch", "levenshtein_rapidfuzz"]   # kernels of metrics.edit_distance, which validates


def levenshtein_torch(h: torch.Tensor, lh: torch.Tensor, r: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """Batched Levenshtein distance between ``h[b,:lh[b]]`` and ``r[b,:lr[b]]`` → LongTensor [B], on the
    tensors' device (the GPU path of :func:`edit_distance`).

    Dynamic programme row by row over reference positions, vectorized over the batch and over hypothesis
    positions: with ``a_j = min(D[i-1, j] + 1, D[i-1, j-1] + [h_j != r_i])`` and ``a_0 = i``, the insertion
    chain ``D[i, j] = min(a_j, D[i, j-1] + 1)`` is the prefix minimum ``D[i, j] = j + cummin_k (a_k - k)``.
    """
    B = h.shape[0]
    th, tr = int(lh.max()), int(lr.max())
    h, r = h[:, :th], r[:, :tr]
    cols = torch.arange(th + 1, device=h.device)
    prev = cols.expand(B, th + 1)
    out = lh.clone()                                  # reference empty: distance = hypothesis length
    for i in range(1, tr + 1):
        sub = prev[:, :-1] + (h != r[:, i - 1: i]).long()
        a = torch.cat([torch.full((B, 1), i, dtype=torch.long, device=h.device),
                       torch.minimum(prev[:, 1:] + 1, sub)], dim=1)
        cur = torch.cummin(a - cols, dim=1).values + cols
        out = torch.where(lr == i, cur.gather(1, lh[:, None]).squeeze(1), out)
        prev = cur
    return out


_MAX_CODE = 0x10FFFF      # the largest Unicode code point a Python str can hold


def _code_points(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """int32 ``[B, T]`` code points ``id + 1`` inside each row and 0 after it, or ``None`` when some id inside a
    row lies outside ``[0, 0x10FFFE]`` (a code point must be in ``[1, 0x10FFFF]``). NumPy on the CPU copy."""
    T = tokens.shape[1]
    inside = np.arange(T) < lengths[:, None]
    if tokens.size and (tokens.min() < 0 or tokens.max() >= _MAX_CODE):   # usually decided here (padding included)
        kept = np.where(inside, tokens, 0)
        if kept.min() < 0 or kept.max() >= _MAX_CODE:
            return None
        tokens = kept
    pts = np.add(tokens, 1, dtype=np.int32, casting="unsafe")            # in range: the cast is exact
    pts *= inside
    return pts


def _as_strings(points: np.ndarray) -> list[str]:
    """Rows of int32 code points ``[B, T]`` (0 past each row's end) as Python strings, through one NumPy view:
    such an array *is* a ``U{T}`` string array, and NumPy drops the trailing zeros."""
    B, T = points.shape
    if T == 0:
        return [""] * B
    return np.ascontiguousarray(points).view(np.dtype(("U", T))).ravel().tolist()


def levenshtein_rapidfuzz(h: torch.Tensor, lh: torch.Tensor, r: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """Same as :func:`levenshtein_torch` through ``rapidfuzz.process.cpdist`` with ``Levenshtein.distance``
    (rapidfuzz's bit-parallel C++ kernel, one call for the batch) on token strings; LongTensor [B] on ``h``'s
    device. Token ids outside ``[0, 0x10FFFE]`` are first renumbered jointly for both sides (equality, all
    that Levenshtein looks at, is kept)."""
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    hn, ln, rn, rln = (x.detach().cpu().numpy() for x in (h, lh, r, lr))
    hp, rp = _code_points(hn, ln), _code_points(rn, rln)
    if hp is None or rp is None:
        _, inv = np.unique(np.concatenate([hn.ravel(), rn.ravel()]), return_inverse=True)
        if inv.size and inv.max() >= _MAX_CODE:       # over a million distinct ids: compare lists of ints instead
            hs = [row[:n] for row, n in zip(hn.tolist(), ln.tolist())]
            rs = [row[:n] for row, n in zip(rn.tolist(), rln.tolist())]
            d = process.cpdist(hs, rs, scorer=Levenshtein.distance, dtype=np.int64)
            return torch.from_numpy(np.asarray(d, dtype=np.int64).reshape(-1)).to(h.device)
        inv = inv.reshape(-1)
        hp = _code_points(inv[:hn.size].reshape(hn.shape), ln)
        rp = _code_points(inv[hn.size:].reshape(rn.shape), rln)
    d = process.cpdist(_as_strings(hp), _as_strings(rp), scorer=Levenshtein.distance, dtype=np.int64)
    return torch.from_numpy(np.asarray(d, dtype=np.int64).reshape(-1)).to(h.device)
