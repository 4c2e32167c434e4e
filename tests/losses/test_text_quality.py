"""taskloss.losses.text_quality: the divergence-frontier score (MAUVE's recipe) and the unbiased MMD².

References: float64 direct computations (double loops, the frontier recipe written out), the closed form of the
frontier area for disjoint supports, permutation noise of MMD², and the official ``mauve-text`` package when it
is importable (it is not a dependency of the project: it pulls faiss).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import beta

from taskloss.losses import cluster_histograms, divergence_frontier, frontier_area, frontier_score, mmd2
from taskloss.losses import text_quality as tq

D = torch.float64


def _gauss(n, d, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=D)
    x[:, 0] += shift
    return x


# ------------------------------------------------------------------------------------------ references
def _frontier_area_direct(p, q, scale=5.0, n_lambda=25):
    """The recipe written out with Python loops and math.log in float64."""
    p = [float(v) / sum(p) for v in p]
    q = [float(v) / sum(q) for v in q]

    def kl(a, r):  # KL ≥ 0; rounding can make a near-zero sum slightly negative (x = e^{-c·KL} > 1)
        return max(0.0, sum(ai * math.log(ai / ri) for ai, ri in zip(a, r) if ai > 0))

    pts = [(0.0, 1.0), (1.0, 0.0)]
    for i in range(n_lambda):
        lam = 1e-6 + i * (1 - 2e-6) / (n_lambda - 1)
        r = [lam * pi + (1 - lam) * qi for pi, qi in zip(p, q)]
        pts.append((math.exp(-scale * kl(q, r)), math.exp(-scale * kl(p, r))))
    pts.sort(key=lambda t: (t[0], -t[1]))                  # x rising; at equal x, higher y first
    return sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))


def _mmd2_loop(x, y, h=None):
    x, y = x.double().tolist(), y.double().tolist()
    z = x + y

    def sq(a, b):
        return sum((ai - bi) ** 2 for ai, bi in zip(a, b))

    if h is None:
        pos = sorted(sq(a, b) for i, a in enumerate(z) for j, b in enumerate(z) if i != j and sq(a, b) > 0)
        h = pos[(len(pos) - 1) // 2]                          # lower median
    k = lambda a, b: math.exp(-sq(a, b) / h)                  # noqa: E731
    n, m = len(x), len(y)
    kxx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    kyy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    kxy = sum(k(a, b) for a in x for b in y) / (n * m)
    return kxx + kyy - 2 * kxy


# ------------------------------------------------------------------------------------------ frontier
def test_frontier_area_matches_direct_recipe_on_hand_made_3_bin_histograms():
    cases = [([0.5, 0.3, 0.2], [0.1, 0.3, 0.6]),
             ([0.5, 0.5, 0.0], [0.0, 0.4, 0.6]),          # empty bins on each side
             ([5, 3, 2], [5, 3, 2]),                       # counts, identical → 1
             ([0.7, 0.2, 0.1], [0.2, 0.2, 0.6])]
    for p, q in cases:
        for scale, n_lambda in [(5.0, 25), (1.0, 7), (2.5, 2)]:
            assert frontier_area(p, q, scale=scale, n_lambda=n_lambda) == pytest.approx(
                _frontier_area_direct(p, q, scale, n_lambda), abs=1e-12, rel=1e-12)
    assert frontier_area([5, 3, 2], [5, 3, 2]) == pytest.approx(1.0, abs=1e-12)
    assert frontier_area([0.5, 0.3, 0.2], [0.1, 0.3, 0.6]) < 0.9


@pytest.mark.parametrize("c", [1.0, 2.0, 5.0])
def test_frontier_area_disjoint_supports_closed_form(c):
    # disjoint p, q: KL(q‖R_λ) = -log(1-λ), KL(p‖R_λ) = -log λ → the curve y = (1 - x^{1/c})^c, area c·B(c, c+1)
    got = frontier_area([0.2, 0.8, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5], scale=c, n_lambda=4001)
    assert got == pytest.approx(c * beta(c, c + 1), rel=1e-5)


def test_divergence_frontier_shape_and_monotone():
    x, y = divergence_frontier([0.6, 0.3, 0.1], [0.2, 0.2, 0.6], n_lambda=25)
    assert x.shape == y.shape == (27,)
    assert (x[0], y[0], x[-1], y[-1]) == (0.0, 1.0, 1.0, 0.0)
    assert (np.diff(x) >= -1e-15).all() and (np.diff(y) <= 1e-15).all()
    assert ((x >= 0) & (x <= 1) & (y >= 0) & (y <= 1)).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=8),
       st.floats(0.1, 20), st.integers(2, 40))
def test_frontier_area_properties(pairs, scale, n_lambda):
    p, q = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    if p.sum() == 0 or q.sum() == 0:
        return
    a = frontier_area(p, q, scale=scale, n_lambda=n_lambda)
    assert 0.0 <= a <= 1.0 and math.isfinite(a)
    assert a == pytest.approx(frontier_area(q, p, scale=scale, n_lambda=n_lambda), abs=1e-12)   # symmetric
    assert frontier_area(p, p, scale=scale, n_lambda=n_lambda) == pytest.approx(1.0, abs=1e-12)
    assert a == pytest.approx(_frontier_area_direct(p, q, scale, n_lambda), abs=1e-10)


def test_identical_sets_score_one():
    x = _gauss(120, 8, 0)
    for seed in range(3):
        assert frontier_score(x, x, seed=seed) == pytest.approx(1.0, abs=1e-9)
        assert frontier_score(x.numpy().astype(np.float32), x.numpy().astype(np.float32), seed=seed) == \
            pytest.approx(1.0, abs=1e-9)
    same = np.ones((10, 3))                                   # one distinct point: nothing to cluster
    assert frontier_score(same, same) == pytest.approx(1.0, abs=1e-12)


def test_disjoint_clouds_hit_the_disjoint_support_value():
    x = _gauss(100, 6, 1)
    far = _gauss(100, 6, 2, shift=50.0)
    floor = frontier_area([1, 0], [0, 1])                     # any disjoint histograms give this value
    for seed in range(2):
        got = frontier_score(x, far, seed=seed)
        assert got == pytest.approx(floor, abs=1e-12)
    assert floor < 0.005


def test_shift_monotonicity_and_same_distribution():
    x, z = _gauss(200, 5, 3), _gauss(200, 5, 4)
    fs, ms = [], []
    for shift in [0.0, 1.0, 2.0, 4.0]:
        y = z.clone()
        y[:, 0] += shift
        fs.append(frontier_score(x, y, seed=0))
        ms.append(mmd2(x, y))
    assert all(b <= a + 0.03 for a, b in zip(fs, fs[1:])), fs
    assert fs[0] > 0.85 and fs[-1] < 0.1, fs
    assert all(b > a for a, b in zip(ms, ms[1:])), ms
    assert mmd2(x, z + torch.tensor([50.0, 0, 0, 0, 0], dtype=D)) > max(ms)


def test_seed_reproducibility_and_input_types():
    x, y = _gauss(80, 10, 5), _gauss(80, 10, 6, shift=0.7)
    a = frontier_score(x, y, seed=3)
    assert frontier_score(x, y, seed=3) == a
    assert frontier_score(x.numpy(), y.numpy(), seed=3) == a
    p1, q1 = cluster_histograms(x, y, seed=3)
    p2, q2 = cluster_histograms(x, y, seed=3)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(q1, q2)
    assert p1.shape == (8,) and p1.sum() == pytest.approx(1) and q1.sum() == pytest.approx(1)
    assert cluster_histograms(x, y, n_clusters=3)[0].shape == (3,)
    assert a == pytest.approx(frontier_area(p1, q1), abs=1e-15)


def test_frontier_matches_official_mauve_when_available():
    mauve = pytest.importorskip("mauve")
    rng = np.random.default_rng(0)
    # histograms: frontier_area reproduces compute_mauve's number from its own histograms
    a = rng.normal(size=(150, 8))
    b = rng.normal(size=(150, 8)) + 0.3
    out = mauve.compute_mauve(p_features=a, q_features=b, seed=1)
    assert frontier_area(out.p_hist, out.q_hist) == pytest.approx(out.mauve, abs=1e-12)
    # well-separated unit-norm blobs: both k-means recover the blobs, so the whole pipelines agree
    centers = np.eye(8)[:4] * 10
    def blobs(counts):                                                         # noqa: E306
        pts = np.concatenate([c + rng.normal(scale=0.05, size=(n, 8)) for c, n in zip(centers, counts)])
        return pts / np.linalg.norm(pts, axis=1, keepdims=True)
    p_feat, q_feat = blobs([40, 30, 20, 10]), blobs([10, 20, 30, 40])
    ref = mauve.compute_mauve(p_features=p_feat, q_features=q_feat, num_buckets=4, seed=1).mauve
    assert frontier_score(p_feat, q_feat, n_clusters=4) == pytest.approx(ref, abs=1e-9)


# ------------------------------------------------------------------------------------------ MMD²
def test_mmd2_matches_float64_double_loop():
    for seed, (n, m, d) in enumerate([(5, 7, 3), (6, 6, 2), (4, 9, 5)]):
        x, y = _gauss(n, d, 10 + seed), _gauss(m, d, 20 + seed, shift=0.5)
        assert mmd2(x, y) == pytest.approx(_mmd2_loop(x, y), abs=1e-12)
        assert mmd2(x, y, bandwidth=2.5) == pytest.approx(_mmd2_loop(x, y, h=2.5), abs=1e-12)
        assert mmd2(x.float(), y.float()) == pytest.approx(_mmd2_loop(x.float(), y.float()), abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6), st.integers(2, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_mmd2_property_double_loop(n, m, d, seed):
    x, y = _gauss(n, d, seed), _gauss(m, d, seed + 1, shift=1.0)
    assert mmd2(x, y) == pytest.approx(_mmd2_loop(x, y), abs=1e-10)
    assert mmd2(x, y) == pytest.approx(mmd2(y, x), abs=1e-12)


def test_mmd2_identical_and_same_distribution_within_noise():
    n = 150
    x = _gauss(n, 6, 7)
    same = mmd2(x, x)
    # with a shared sample: 2·(mean off-diagonal kernel − 1)/n, slightly negative (h from the pooled 2n rows)
    d2_pooled = torch.cdist(torch.cat([x, x]), torch.cat([x, x])).pow(2)
    h = d2_pooled[d2_pooled > 0].median()
    kern = torch.exp(-torch.cdist(x, x).pow(2) / h)
    off = (kern.sum() - kern.trace()) / (n * (n - 1))
    assert same == pytest.approx(float(2 * (off - 1) / n), abs=1e-12)
    assert -2 / n <= same <= 0
    # independent samples of one distribution: inside the permutation null of the statistic
    y = _gauss(n, 6, 8)
    pooled = torch.cat([x, y])
    g = torch.Generator().manual_seed(0)
    null = []
    for _ in range(60):
        perm = torch.randperm(2 * n, generator=g)
        null.append(mmd2(pooled[perm[:n]], pooled[perm[n:]]))
    null = np.array(null)
    value = mmd2(x, y)
    assert abs(value - null.mean()) < 4 * null.std(), (value, null.mean(), null.std())
    assert abs(null.mean()) < 2 * null.std() / math.sqrt(len(null)) + 1e-3     # unbiased: null centred on 0
    shifted = mmd2(x, _gauss(n, 6, 8, shift=1.0))
    assert shifted > null.max() + 4 * null.std()


def test_mmd2_constant_inputs_and_device():
    assert mmd2(torch.ones(3, 2), torch.ones(4, 2)) == 0.0
    x = _gauss(5, 3, 0)
    assert isinstance(mmd2(x, x + 1), float)


# ------------------------------------------------------------------------------------------ bad inputs
def test_frontier_score_bad_inputs():
    x = np.random.default_rng(0).normal(size=(30, 4))
    with pytest.raises(ValueError, match="empty"):
        frontier_score(np.zeros((0, 4)), x)
    with pytest.raises(ValueError, match="empty"):
        frontier_score(x, np.zeros((0, 4)))
    with pytest.raises(ValueError, match="dimensions differ"):
        frontier_score(x, x[:, :3])
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        frontier_score(x, bad)
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        frontier_score(bad, x)
    with pytest.raises(ValueError, match="2-D"):
        frontier_score(x[0], x[1])
    with pytest.raises(TypeError, match="numpy array or torch.Tensor"):
        frontier_score(x.tolist(), x)
    with pytest.raises(TypeError, match="real numbers"):
        frontier_score(x.astype(complex), x)
    with pytest.raises(TypeError, match="real numbers"):
        frontier_score(torch.ones(3, 4, dtype=torch.bool), torch.from_numpy(x))
    with pytest.raises(ValueError, match="n_clusters"):
        frontier_score(x, x, n_clusters=0)
    with pytest.raises(ValueError, match="exceeds"):
        frontier_score(x, x, n_clusters=61)
    with pytest.raises(ValueError, match="scale"):
        frontier_score(x, x, scale=0.0)
    with pytest.raises(ValueError, match="n_lambda"):
        frontier_score(x, x, n_lambda=0)
    with pytest.raises(ValueError, match="seed"):
        frontier_score(x, x, seed=-1)
    with pytest.raises(ValueError, match="explained_variance"):
        cluster_histograms(x, x, explained_variance=1.0)


def test_frontier_area_bad_inputs():
    with pytest.raises(ValueError, match="different numbers of bins"):
        frontier_area([0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="negative"):
        frontier_area([1.2, -0.2], [0.5, 0.5])
    with pytest.raises(ValueError, match="sums to 0"):
        frontier_area([0.0, 0.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="NaN"):
        frontier_area([np.nan, 1.0], [0.5, 0.5])
    with pytest.raises(ValueError, match="1-D"):
        frontier_area(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="1-D"):
        frontier_area([], [])
    with pytest.raises(TypeError):
        frontier_area("ab", [0.5, 0.5])
    with pytest.raises(ValueError, match="scale"):
        divergence_frontier([0.5, 0.5], [0.5, 0.5], scale=-1.0)
    with pytest.raises(ValueError, match="n_lambda"):
        divergence_frontier([0.5, 0.5], [0.5, 0.5], n_lambda=1)


def test_mmd2_bad_inputs():
    x = _gauss(5, 3, 0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        mmd2(x.numpy(), x)
    with pytest.raises(ValueError, match="at least 2 rows"):
        mmd2(x[:1], x)
    with pytest.raises(ValueError, match="at least 2 rows"):
        mmd2(x, torch.zeros(0, 3, dtype=D))
    with pytest.raises(ValueError, match="dimensions differ"):
        mmd2(x, x[:, :2])
    with pytest.raises(ValueError, match="2-D"):
        mmd2(x[0], x[1])
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        mmd2(x, bad)
    with pytest.raises(TypeError, match="real numbers"):
        mmd2(x > 0, x > 0)
    with pytest.raises(ValueError, match="bandwidth"):
        mmd2(x, x, bandwidth=0.0)


@pytest.mark.slow
def test_embed_texts_is_minilm_sentence_embeddings():
    from taskloss.datasets import minilm

    sents = ["The cat sat on the mat.", "A dog barked.", "Stock prices fell sharply."]
    emb = tq.embed_texts(sents, batch_size=2)
    assert emb.shape == (3, 384) and emb.device.type == "cpu" and emb.dtype == torch.float32
    torch.testing.assert_close(emb, minilm.sentence_embeddings(sents))
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert frontier_score(emb, emb) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(TypeError):
        tq.embed_texts("one string")
    with pytest.raises(ValueError, match="empty"):
        tq.embed_texts([])
