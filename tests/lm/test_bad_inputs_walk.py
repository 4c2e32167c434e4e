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


@pytest.mark.parametrize("refs", [object(), 3, torch.tensor(1.0), "ab"])
def test_task_loss_terms_refuses_refs_that_are_not_token_lists(refs):
    from taskloss.lm import task_loss_terms
    with pytest.raises(TypeError, match="refs must be"):
        task_loss_terms(torch.tensor([[1, 2, 3]]), refs, eos_id=3, pad_id=0)


def test_task_loss_terms_ids_checked_and_value():
    from taskloss.lm import task_loss_terms
    with pytest.raises(TypeError, match="pad_id must be an int"):
        task_loss_terms(torch.tensor([[1, 2, 3]]), [[1, 2]], eos_id=3, pad_id=None)
    out = task_loss_terms(torch.tensor([[1, 2, 3]]), [[1, 4]], eos_id=3, pad_id=0)
    assert float(out["edit_distance"][0]) == pytest.approx(0.5)      # [1, 2] vs [1, 4]: one substitution of two
