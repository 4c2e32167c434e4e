r"""Distribution-level quality of generated text: a divergence-frontier score and the unbiased MMD².

Used in notebook 09_emo_loss to compare sampled continuations with human ones. Both scores act on a *set* of
embeddings per side (one row per text), not on single texts.

**frontier score** (:func:`frontier_score`) — the recipe of *MAUVE: Measuring the Gap Between Neural Text and
Human Text using Divergence Frontiers*, applied to whatever embeddings are passed in:

1. stack the reference rows ``P`` over the generated rows ``Q`` (float64);
2. PCA keeping the fewest leading components whose explained variance exceeds 90 %;
3. k-means (scikit-learn, k-means++, ``n_init=5``, ``random_state=seed``) on the union, ``k = max(2,
   round(min(n_P, n_Q) / 10))`` clusters by default;
4. cluster histograms ``p`` (reference) and ``q`` (generated);
5. the divergence frontier: for ``λ`` on ``linspace(1e-6, 1 - 1e-6, n_lambda)`` and ``R_λ = λ p + (1-λ) q``,
   the points ``(exp(-c·KL(q‖R_λ)), exp(-c·KL(p‖R_λ)))`` with ``c = scale``, closed by ``(0, 1)`` and ``(1, 0)``;
6. the area under that curve (trapezoid rule), in ``[0, 1]``: ``1`` iff ``p = q``; for disjoint supports it
   tends to ``c·B(c, c+1)`` (``1/252`` at ``c = 5``) as ``n_lambda`` grows.

How it differs from the official ``mauve-text`` package (``mauve.compute_mauve``):

* **no GPT-2 featurizer** — the official score embeds text with GPT-2-large; here the caller supplies the
  features (notebook 09 uses MiniLM sentence embeddings, :func:`embed_texts`). Values are therefore *not*
  comparable with published MAUVE numbers; call it "frontier-MiniLM" when MiniLM features are used;
* the official package L2-normalizes the features first (a no-op for MiniLM sentence embeddings, which are
  unit-norm) and quantizes with faiss k-means (``nredo=5``, 500 iterations) instead of scikit-learn's, so on
  data without a clear cluster structure the histograms — and the score — differ by the k-means noise;
* ``mauve-text`` ≥ 0.3 averages the area under ``y(x)`` and under ``x(y)``; along the frontier ``x`` falls
  and ``y`` rises monotonically with ``λ``, so both areas are that of the same polygon and equal the single
  area computed here (up to rounding). Given the same histograms, :func:`frontier_area` reproduces the
  official number; ``tests/losses/test_text_quality.py`` checks both against the package when it is importable.
  The smoothed MAUVE* and the frontier integral are not computed.

**MMD²** (:func:`mmd2`) — the unbiased estimate of the squared maximum mean discrepancy (*A Kernel
Two-Sample Test*) with the Gaussian kernel ``k(x, y) = exp(-‖x - y‖² / h)``; by default ``h`` is the median
of the positive squared pairwise distances of the pooled sample (the lower middle value for an even count,
the ``torch.median`` convention). ``0`` in expectation when both sets come from the same distribution; the
estimate can be slightly negative.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from taskloss.validation import all_finite, check_int, check_not_meta, check_positive, check_steps

__all__ = ["frontier_score", "cluster_histograms", "divergence_frontier", "frontier_area", "mmd2",
           "embed_texts"]

_LAMBDA_EPS = 1e-6


def _as_matrix(name: str, x) -> np.ndarray:
    """A real ``[n, d]`` array-like (numpy or torch) → float64 numpy array; clear errors otherwise."""
    if isinstance(x, torch.Tensor):
        check_not_meta(name, x)
        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
        x = x.detach().to("cpu", torch.float64).numpy()
    elif isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
        x = x.astype(np.float64)
    else:
        raise TypeError(f"{name} must be a numpy array or torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n, d] (one embedding per row), got shape {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _check_pair(ref_name: str, ref: np.ndarray, gen_name: str, gen: np.ndarray) -> None:
    if ref.shape[1] != gen.shape[1]:
        raise ValueError(f"embedding dimensions differ: {ref_name} has {ref.shape[1]}, {gen_name} has "
                         f"{gen.shape[1]}")


def cluster_histograms(ref_emb, gen_emb, n_clusters: int | None = None, seed: int = 0,
                       explained_variance: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Quantize both sets jointly (PCA → k-means) and return the cluster histograms ``(p, q)``.

    ``ref_emb`` ``[n_P, d]``, ``gen_emb`` ``[n_Q, d]`` (numpy or torch, any real dtype; used in float64).
    PCA keeps the fewest leading components whose cumulative explained variance exceeds
    ``explained_variance``; k-means (scikit-learn, ``n_init=5``, ``random_state=seed``) runs on the union with
    ``n_clusters`` clusters (default ``max(2, round(min(n_P, n_Q) / 10))``, MAUVE's rule). Returns float64
    histograms ``p`` (reference) and ``q`` (generated), each ``[n_clusters]`` summing to 1. If all rows are
    identical there is a single point to cluster: every row goes to cluster 0. Steps 1–4 of the module recipe.
    """
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA

    ref, gen = _as_matrix("ref_emb", ref_emb), _as_matrix("gen_emb", gen_emb)
    _check_pair("ref_emb", ref, "gen_emb", gen)
    check_int("seed", seed, minimum=0)
    ev = check_positive("explained_variance", explained_variance)
    if ev >= 1.0:
        raise ValueError(f"explained_variance must lie in (0, 1), got {explained_variance}")
    n_ref, n_all = len(ref), len(ref) + len(gen)
    k = max(2, int(round(min(len(ref), len(gen)) / 10))) if n_clusters is None else n_clusters
    check_int("n_clusters", k, minimum=1)
    if k > n_all:
        raise ValueError(f"n_clusters={k} exceeds the number of embeddings ({n_all})")
    x = np.concatenate([ref, gen])
    if np.ptp(x, axis=0).max() == 0.0:                       # one distinct point: nothing to cluster
        labels = np.zeros(n_all, dtype=np.int64)
    else:
        x = PCA(n_components=ev, svd_solver="full").fit_transform(x)
        labels = KMeans(n_clusters=k, n_init=5, random_state=seed).fit(x).labels_
    p = np.bincount(labels[:n_ref], minlength=k) / n_ref
    q = np.bincount(labels[n_ref:], minlength=k) / (n_all - n_ref)
    return p.astype(np.float64), q.astype(np.float64)


def _as_histogram(name: str, h) -> np.ndarray:
    if isinstance(h, torch.Tensor):
        check_not_meta(name, h)
        if h.is_complex() or h.dtype == torch.bool:    # .to(float64) would drop the imaginary part with a warning
            raise TypeError(f"{name} must hold real numbers, got dtype {h.dtype}")
        h = h.detach().to("cpu", torch.float64).numpy()
    elif isinstance(h, (list, tuple, np.ndarray)):
        h = np.asarray(h)
        if h.dtype.kind not in "fiu":
            raise TypeError(f"{name} must hold real numbers, got dtype {h.dtype}")
        h = h.astype(np.float64)
    else:
        raise TypeError(f"{name} must be a numpy array, torch.Tensor or list, got {type(h).__name__}")
    if h.ndim != 1 or h.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D histogram, got shape {h.shape}")
    if not np.isfinite(h).all():
        raise ValueError(f"{name} contains NaN or inf")
    if (h < 0).any():
        raise ValueError(f"{name} has negative entries")
    if h.sum() <= 0:
        raise ValueError(f"{name} sums to 0")
    return h / h.sum()


def _check_n_lambda(n_lambda, n_bins: int) -> int:
    """``n_lambda`` ≥ 2 whose ``[n_lambda, k]`` float64 mixtures (three at once) fit in memory."""
    return check_steps("n_lambda", n_lambda, bytes_per_step=8.0 * 3 * max(n_bins, 1), minimum=2)


def divergence_frontier(p, q, scale: float = 5.0, n_lambda: int = 25) -> tuple[np.ndarray, np.ndarray]:
    """Points ``(x, y)`` of the divergence frontier between histograms ``p`` (reference) and ``q`` (generated).

    ``p``, ``q``: non-negative ``[k]`` (counts or probabilities; each is normalized to sum 1). For ``λ`` on
    ``linspace(1e-6, 1 - 1e-6, n_lambda)`` and ``R_λ = λ p + (1-λ) q``: ``x = exp(-scale·KL(q‖R_λ))``,
    ``y = exp(-scale·KL(p‖R_λ))`` (``0·log 0 = 0``), ordered by decreasing ``λ`` (so ``x`` rises and ``y``
    falls) and closed by ``(0, 1)`` in front and ``(1, 0)`` at the end: two float64 arrays ``[n_lambda + 2]``.
    ``n_lambda >= 2`` (the grid is symmetric about ½, which makes the area symmetric in ``p`` and ``q``).
    Step 5 of the module recipe (MAUVE's ``get_divergence_curve_for_multinomials``, same points).
    """
    p, q = _as_histogram("p", p), _as_histogram("q", q)
    if p.shape != q.shape:
        raise ValueError(f"histograms have different numbers of bins: p {p.shape[0]}, q {q.shape[0]}")
    c = check_positive("scale", scale)
    _check_n_lambda(n_lambda, p.size)
    lam = np.linspace(_LAMBDA_EPS, 1 - _LAMBDA_EPS, n_lambda)[::-1, None]      # decreasing λ: x rises
    r = lam * p + (1 - lam) * q                                                 # > 0 wherever p or q is

    def kl(a: np.ndarray) -> np.ndarray:                                         # KL(a ‖ R_λ) for every λ
        safe = np.where(a > 0, a, 1.0)
        kl_sum = np.where(a > 0, a * np.log(safe / np.where(a > 0, r, 1.0)), 0.0).sum(-1)
        return np.maximum(kl_sum, 0.0)   # KL ≥ 0: rounding must not push a frontier point past 1

    x = np.concatenate([[0.0], np.exp(-c * kl(q)), [1.0]])
    y = np.concatenate([[1.0], np.exp(-c * kl(p)), [0.0]])
    return x, y


def frontier_area(p, q, scale: float = 5.0, n_lambda: int = 25) -> float:
    """Area under the divergence frontier of histograms ``p``, ``q`` (trapezoid rule), a float in ``[0, 1]``.

    ``1`` iff ``p = q``; symmetric in ``p`` and ``q``; for disjoint supports it tends to ``scale·B(scale,
    scale+1)`` as ``n_lambda`` grows. With the histograms of ``mauve.compute_mauve`` (its ``p_hist``,
    ``q_hist``) and the same ``scale``/``n_lambda`` this is its ``.mauve``. Step 6 of the module recipe.
    """
    x, y = divergence_frontier(p, q, scale=scale, n_lambda=n_lambda)
    return float(np.clip(np.trapezoid(y, x), 0.0, 1.0))


def frontier_score(ref_emb, gen_emb, n_clusters: int | None = None, seed: int = 0, scale: float = 5.0,
                   n_lambda: int = 25) -> float:
    """MAUVE's divergence-frontier area between two embedding sets, a float in ``[0, 1]`` (1 = same histogram).

    ``ref_emb`` ``[n_P, d]`` (reference/human), ``gen_emb`` ``[n_Q, d]`` (model), numpy or torch. Quantizes
    with :func:`cluster_histograms` (PCA to 90 % variance, k-means with ``n_clusters``, default
    ``max(2, round(min(n_P, n_Q)/10))``, seeded by ``seed``) and integrates the frontier with
    :func:`frontier_area` (``scale`` = MAUVE's constant ``c``, ``n_lambda`` mixture weights). The same ``seed``
    gives the same score. See the module docstring for the differences from the official MAUVE (no GPT-2
    featurizer, scikit-learn k-means, no L2 normalization). Derived in notebook 09_emo_loss.
    """
    check_positive("scale", scale)
    _check_n_lambda(n_lambda, 1)          # the bins are known after clustering; refuse a huge grid before it
    p, q = cluster_histograms(ref_emb, gen_emb, n_clusters=n_clusters, seed=seed)
    return frontier_area(p, q, scale=scale, n_lambda=n_lambda)


def mmd2(xe: torch.Tensor, ye: torch.Tensor, bandwidth: float | None = None) -> float:
    """Unbiased MMD² between the rows of ``xe`` ``[n, d]`` and ``ye`` ``[m, d]`` (n, m ≥ 2), as a float.

    ``k(a, b) = exp(-‖a - b‖² / h)``, ``h = bandwidth`` or, when ``None``, the median of the positive squared
    pairwise distances of the pooled ``n + m`` rows (lower middle value for an even count). Returns
    ``Σ_{i≠j} k(x_i, x_j)/(n(n-1)) + Σ_{i≠j} k(y_i, y_j)/(m(m-1)) - 2 Σ_{i,j} k(x_i, y_j)/(nm)``, computed in
    float64 on the inputs' device. If all pooled rows coincide the kernel is constant and the result is 0.
    Can be slightly negative (unbiased). Derived in notebook 09_emo_loss.
    """
    for name, t in (("xe", xe), ("ye", ye)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers, got dtype {t.dtype}")
        if t.ndim != 2:
            raise ValueError(f"{name} must be 2-D [n, d], got shape {tuple(t.shape)}")
        if t.shape[0] < 2 or t.shape[1] == 0:
            raise ValueError(f"{name} needs at least 2 rows and 1 column for the unbiased estimate, got shape "
                             f"{tuple(t.shape)}")
        if not all_finite(t):
            raise ValueError(f"{name} contains NaN or inf")
    if xe.shape[1] != ye.shape[1]:
        raise ValueError(f"embedding dimensions differ: xe has {xe.shape[1]}, ye has {ye.shape[1]}")
    if xe.device != ye.device:
        raise ValueError(f"xe and ye are on different devices ({xe.device}, {ye.device})")
    if bandwidth is not None:
        bandwidth = check_positive("bandwidth", bandwidth)
    z = torch.cat([xe, ye]).double()
    d2 = torch.cdist(z, z).pow(2)
    if bandwidth is None:
        positive = d2[d2 > 0]
        if positive.numel() == 0:                           # every row identical: constant kernel
            return 0.0
        bandwidth = positive.median()
    kern = torch.exp(-d2 / bandwidth)
    n, m = len(xe), len(ye)
    kxx, kyy, kxy = kern[:n, :n], kern[n:, n:], kern[:n, n:]
    return float((kxx.sum() - kxx.trace()) / (n * (n - 1)) + (kyy.sum() - kyy.trace()) / (m * (m - 1))
                 - 2 * kxy.mean())


def embed_texts(texts: Sequence[str], device: str | torch.device = "cpu", batch_size: int = 64) -> torch.Tensor:
    """MiniLM (all-MiniLM-L6-v2) sentence embeddings of ``texts`` as a CPU float32 tensor ``[n, 384]``.

    Mean-pooled, L2-normalized (:func:`taskloss.datasets.minilm.sentence_embeddings`, run on ``device``, offline) — the
    featurizer of "frontier-MiniLM" in notebook 09_emo_loss, in place of MAUVE's GPT-2-large.
    """
    from taskloss.datasets.minilm import sentence_embeddings  # loads transformers: only when called

    return sentence_embeddings(texts, batch_size=batch_size, device=device).cpu()
