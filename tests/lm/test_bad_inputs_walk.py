"""Issue 42: pad_sequences refuses a width beyond memory before allocating it, with the argument's name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from taskloss.lm import pad_sequences


def test_pad_sequences_huge_width_refused():
    with pytest.raises(ValueError, match=r"pad_sequences\(width=1000000000000\) would allocate"):
        pad_sequences([[1, 2]], 0, width=10**12)


def test_pad_sequences_width_valid():
    out = pad_sequences([[1, 2], [3]], 0, width=np.int64(4))
    assert torch.equal(out, torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]]))
    with pytest.raises(ValueError, match="width must be >= 2"):
        pad_sequences([[1, 2], [3]], 0, width=1)
