"""Rank correlation against scipy.stats (ties included) and the randomized model copies of the sanity check."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import rankdata, spearmanr

from taskloss.attribution import average_ranks, cascading_randomization, randomized_copy, spearman_correlation
from taskloss.models import SmallCNN

values = st.lists(st.integers(-3, 3), min_size=3, max_size=12)     # small integers: many ties


@given(values)
def test_average_ranks_match_scipy(v):
    np.testing.assert_allclose(average_ranks(torch.tensor(v, dtype=torch.float64)).numpy(), rankdata(v))


@given(st.integers(3, 12).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-3, 3), min_size=n, max_size=n), st.lists(st.integers(-3, 3), min_size=n, max_size=n))),
    st.booleans())
def test_spearman_matches_scipy(ab, absolute):
    a, b = (np.asarray(v, dtype=np.float64) for v in ab)
    ra, rb = (np.abs(a), np.abs(b)) if absolute else (a, b)
    if len(set(ra)) == 1 or len(set(rb)) == 1:              # undefined: must raise, not return NaN
        try:
            spearman_correlation(torch.from_numpy(a), torch.from_numpy(b), absolute=absolute)
        except ValueError:
            return
        raise AssertionError("a constant row must raise")
    got = float(spearman_correlation(torch.from_numpy(a), torch.from_numpy(b), absolute=absolute))
    np.testing.assert_allclose(got, spearmanr(ra, rb).statistic, rtol=1e-12, atol=1e-12)


def test_batched_rows_are_independent():
    a, b = torch.randn(5, 3, 20), torch.randn(5, 3, 20)
    got = spearman_correlation(a, b)
    assert got.shape == (5, 3)
    ref = [[spearmanr(a[i, j], b[i, j]).statistic for j in range(3)] for i in range(5)]
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-10, atol=1e-12)


def test_randomized_copy_changes_only_the_chosen_modules():
    torch.manual_seed(0)
    model = SmallCNN(width=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r1 = randomized_copy(model, ["fc"], seed=3)
    r2 = randomized_copy(model, ["fc"], seed=3)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), "the original must stay untouched"
        changed = not torch.equal(r1.state_dict()[k], v)
        assert changed == k.startswith("fc."), k
        assert torch.equal(r1.state_dict()[k], r2.state_dict()[k]), "same seed, same weights"
    assert not torch.equal(randomized_copy(model, ["fc"], seed=4).fc.weight, r1.fc.weight)


def test_cascade_goes_from_the_output_layer_down():
    torch.manual_seed(0)
    model = SmallCNN(width=4)
    cascade = cascading_randomization(model, seed=1)
    assert [name for name, _ in cascade] == ["fc", "conv2", "conv1"]
    for i, (_, copy) in enumerate(cascade):
        same = [torch.equal(getattr(copy, m).weight, getattr(model, m).weight) for m in ("fc", "conv2", "conv1")]
        assert same == [j > i for j in range(3)]
