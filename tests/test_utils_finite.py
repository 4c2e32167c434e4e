"""``taskloss.validation.all_finite`` (behind ``check_finite`` and every input check of the package) decides from the sum
first and falls back to the entrywise test when the sum is not finite. Reference: ``torch.isfinite(t).all()``."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taskloss.validation import all_finite, check_finite

SPECIALS = [float("nan"), float("inf"), -float("inf")]


@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                                 st.sampled_from(SPECIALS + [3e38, -3e38])), min_size=1, max_size=40),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
def test_all_finite_equals_the_entrywise_test(values, dtype):
    t = torch.tensor(values, dtype=torch.float64).to(dtype)       # float16 overflows to inf as torch does
    assert all_finite(t) == bool(torch.isfinite(t).all())


def test_overflowing_sum_of_finite_entries_is_finite_and_bad_entries_are_found():
    big = torch.full((1000,), 3e38)                     # the float32 sum overflows; every entry is finite
    assert not torch.isfinite(big.sum()) and all_finite(big)
    mixed = torch.tensor([float("inf"), -float("inf"), 1.0])     # the sum is NaN, not ±inf
    assert not all_finite(mixed)
    x = torch.randn(64, 128)
    x[17, 5] = float("nan")
    assert not all_finite(x) and not all_finite(x.t())              # non-contiguous
    assert all_finite(torch.randn(3, 4, dtype=torch.complex64))
    assert not all_finite(torch.tensor([1 + 0j, complex(float("nan"), 0)]))
    assert all_finite(torch.empty(0)) and all_finite(torch.arange(5))
    with pytest.raises(ValueError, match="contains NaN or inf"):
        check_finite("x", x)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        check_finite("x", [1.0])
