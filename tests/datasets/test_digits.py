"""Digits data: real scikit-learn data, fixed stratified splits, deterministic across machines."""
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from taskloss.datasets import N_DIGITS, digits_images, indices_checksum, load_digits_splits, split_indices

# sha256 of the int64 little-endian split indices (train, valid, test) — PCG64 permutations are
# platform-independent, so these must match on every machine.
CHECKSUM_SEED0 = "eeeffa8b6128df9067e3535cc4b29c9ba716fee4d1fbe215087d2f7417a1be38"
CHECKSUM_SEED1 = "1a57ddeb294650ce56d70695a536bb64f9f789b0eddc9c73383a8e9e89822f3a"


@pytest.fixture(scope="module")
def splits():
    return load_digits_splits(0)


def test_sizes_types_ranges(splits):
    sizes = [len(s[1]) for s in splits]
    assert sizes == [1078, 359, 360] and sum(sizes) == N_DIGITS
    for X, y in splits:
        assert X.dtype == torch.float32 and y.dtype == torch.int64
        assert X.shape[1] == 64 and X.min() >= 0 and X.max() <= 1
        assert set(y.tolist()) == set(range(10))


def test_split_checksums_are_fixed():
    assert indices_checksum(load_digits_splits(0).indices) == CHECKSUM_SEED0
    assert indices_checksum(load_digits_splits(1).indices) == CHECKSUM_SEED1


def test_splits_partition_and_match_sklearn(splits):
    allidx = np.concatenate([splits.indices[k] for k in ("train", "valid", "test")])
    assert np.array_equal(np.sort(allidx), np.arange(N_DIGITS))  # disjoint and complete
    ref = load_digits()
    for k, (X, y) in zip(("train", "valid", "test"), splits):
        idx = splits.indices[k]
        np.testing.assert_allclose(X.numpy(), ref.data[idx] / 16.0, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(y.numpy(), ref.target[idx])


def test_stratified(splits):
    full = np.bincount(load_digits().target, minlength=10) / N_DIGITS
    for _, y in splits:
        frac = np.bincount(y.numpy(), minlength=10) / len(y)
        assert np.abs(frac - full).max() < 0.01


def test_deterministic_and_seed_dependent():
    a, b, c = load_digits_splits(0), load_digits_splits(0), load_digits_splits(3)
    assert torch.equal(a.train[0], b.train[0]) and torch.equal(a.test[1], b.test[1])
    assert not np.array_equal(a.indices["train"], c.indices["train"])


def test_digits_images(splits):
    X = splits.valid[0]
    img = digits_images(X)
    assert img.shape == (len(X), 1, 8, 8)
    ref = load_digits().images[splits.indices["valid"]] / 16.0
    np.testing.assert_allclose(img[:, 0].numpy(), ref, atol=1e-7)
    assert digits_images(X[0]).shape == (1, 1, 8, 8)


def test_bad_inputs():
    with pytest.raises(ValueError):
        load_digits_splits(-1)
    with pytest.raises(TypeError):
        load_digits_splits(0.5)
    with pytest.raises(ValueError, match="64 features"):
        digits_images(torch.zeros(3, 63))
    with pytest.raises(ValueError, match="ndim"):
        digits_images(torch.zeros(2, 3, 64))
    with pytest.raises(TypeError):
        digits_images(np.zeros((3, 64)))
    with pytest.raises(ValueError, match="fractions"):
        split_indices(np.arange(10) % 2, 0, fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="non-empty"):
        split_indices(np.array([]), 0)
