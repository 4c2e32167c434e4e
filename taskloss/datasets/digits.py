"""Handwritten digits: scikit-learn's 8×8 digits with fixed, stratified train/valid/test splits.

The classification notebooks (accuracy and macro-F1 as task losses, the curvature notebooks) share one
small, real data set that needs no download: the 1797 handwritten digits (UCI "Optical Recognition of
Handwritten Digits", shipped inside scikit-learn). Pixels (0..16) are scaled to ``[0, 1]`` float32.

The splits are a pure function of the seed: a NumPy ``Generator(PCG64(seed))`` permutes the indices of
each class separately and cuts it 60/20/20, so the same indices come out on every machine and NumPy
version (PCG64 and ``Generator.permutation`` are stable across platforms).
See ``data/README.md`` (source, license, sizes, index checksums).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from taskloss.validation import check_finite, check_int, check_ndim, check_not_meta

__all__ = ["DigitsSplits", "load_digits_splits", "digits_images", "split_indices", "indices_checksum",
           "N_DIGITS", "N_FEATURES", "N_CLASSES", "SPLIT_FRACTIONS"]

N_DIGITS = 1797
N_FEATURES = 64
N_CLASSES = 10
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)

Split = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DigitsSplits:
    """``train``, ``valid``, ``test``: each ``(X float32 [n, 64] in [0, 1], y int64 [n])``.

    ``indices`` holds the row indices into ``sklearn.datasets.load_digits()`` of each split (int64 arrays).
    """

    train: Split
    valid: Split
    test: Split
    indices: dict
    seed: int

    def __iter__(self):  # ``train, valid, test = load_digits_splits()``
        return iter((self.train, self.valid, self.test))


def split_indices(y: np.ndarray, seed: int = 0, fractions=SPLIT_FRACTIONS) -> dict[str, np.ndarray]:
    """Stratified split of ``range(len(y))`` into ``{"train", "valid", "test"}`` sorted index arrays.

    Per class ``c`` with ``n_c`` members (permuted by ``Generator(PCG64(seed))``, classes in ascending order):
    ``round(n_c * f_train)`` go to train, ``round(n_c * f_valid)`` to valid — at most the ``n_c − n_train`` left, as
    when both fractions round up (``(0.5, 0.5, 0)`` with ``n_c = 3``: 2 and 1) — and the rest to test.
    """
    check_int("seed", seed, minimum=0)
    if isinstance(y, torch.Tensor):
        check_not_meta("y", y)
        y = y.detach().cpu().numpy()
    y = np.asarray(y)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"y must be a non-empty 1-D array, got shape {y.shape}")
    if y.dtype.kind not in "iu":
        raise TypeError(f"y must hold integer class labels, got dtype {y.dtype}")
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, (tuple, list, np.ndarray)) or \
            not all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in fractions):
        raise TypeError(f"fractions must be three numbers (train, valid, test), got {fractions!r}")
    f = tuple(float(v) for v in fractions)
    if len(f) != 3 or not all(math.isfinite(v) for v in f) or min(f) < 0 or abs(sum(f) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    rng = np.random.Generator(np.random.PCG64(seed))
    parts: dict[str, list] = {"train": [], "valid": [], "test": []}
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_tr = int(round(len(idx) * f[0]))
        n_va = int(round(len(idx) * f[1]))
        parts["train"].append(idx[:n_tr])
        parts["valid"].append(idx[n_tr:n_tr + n_va])
        parts["test"].append(idx[n_tr + n_va:])
    return {k: np.sort(np.concatenate(v)).astype(np.int64) for k, v in parts.items()}


def indices_checksum(indices: dict[str, np.ndarray]) -> str:
    """sha256 (hex) of the split indices as little-endian int64, in the order train, valid, test."""
    if not isinstance(indices, dict) or set(indices) != {"train", "valid", "test"}:
        raise ValueError("indices must be a dict with exactly the keys 'train', 'valid', 'test'")
    for k, v in indices.items():
        if np.asarray(v).dtype.kind not in "iu":
            raise TypeError(f"indices[{k!r}] must hold integers, got dtype {np.asarray(v).dtype}")
    h = hashlib.sha256()
    for k in ("train", "valid", "test"):
        h.update(k.encode())
        h.update(np.asarray(indices[k], dtype="<i8").tobytes())
    return h.hexdigest()


def load_digits_splits(seed: int = 0) -> DigitsSplits:
    """The 1797 digits as float32 features in ``[0, 1]`` with fixed stratified 60/20/20 splits.

    Returns a :class:`DigitsSplits` whose ``.train/.valid/.test`` are ``(X [n, 64] float32, y [n] int64)``
    (sizes 1078/359/360 for every seed). Used by notebooks 03, 05, 06 and 07.
    """
    check_int("seed", seed, minimum=0)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    if X.shape != (N_DIGITS, N_FEATURES):
        raise RuntimeError(f"unexpected digits data shape {X.shape}; expected ({N_DIGITS}, {N_FEATURES})")
    idx = split_indices(y, seed)
    Xt = torch.from_numpy(X.astype(np.float32))
    yt = torch.from_numpy(y)
    parts = {k: (Xt[torch.from_numpy(v)].contiguous(), yt[torch.from_numpy(v)].contiguous())
             for k, v in idx.items()}
    return DigitsSplits(parts["train"], parts["valid"], parts["test"], idx, seed)


def digits_images(X: torch.Tensor) -> torch.Tensor:
    """Reshape flat digit features ``[n, 64]`` (or one ``[64]``) to images ``[n, 1, 8, 8]`` (a view)."""
    check_ndim("X", X, (1, 2))
    if X.shape[-1] != N_FEATURES:
        raise ValueError(f"X must have {N_FEATURES} features in its last dimension, got shape {tuple(X.shape)}")
    check_finite("X", X)
    return X.reshape(-1, 1, 8, 8)
