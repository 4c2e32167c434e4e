"""Issue 42: info_nce_rows (the core the distributed loss calls) refuses τ = 0 and NaN rather than returning
NaN / inf, and agrees with a float64 cross-entropy for a valid τ."""
from __future__ import annotations

import math

import pytest
import torch

from taskloss.contrastive import info_nce_rows


def _batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("tau,err", [(0, ValueError), (0.0, ValueError), (-0.1, ValueError), (math.nan, ValueError),
                                     (math.inf, ValueError), ("0.05", TypeError), (None, TypeError)])
def test_info_nce_rows_refuses_bad_temperature(tau, err):
    q, p = _batch()
    with pytest.raises(err, match="temperature"):
        info_nce_rows(q, p, q, p, tau)


def test_info_nce_rows_matches_cross_entropy():
    q, p = _batch()
    rows = info_nce_rows(q, p, q, p, 0.5)
    ref = torch.nn.functional.cross_entropy(q @ p.T / 0.5, torch.arange(4), reduction="none")
    torch.testing.assert_close(rows, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("group", ["gloo", 0, object()])
def test_world_refuses_a_group_that_is_not_one(group):
    from taskloss.contrastive import world
    with pytest.raises(TypeError, match="group must be None or a torch.distributed.ProcessGroup"):
        world(group)
    assert world(None) == (1, 0)


def test_check_batch_independent_needs_a_callable_encoder():
    from torch import nn

    from taskloss.contrastive import check_batch_independent
    with pytest.raises(TypeError, match="encoder must be callable"):
        check_batch_independent(object())
    check_batch_independent(lambda x: x)                                   # a function: nothing to couple rows
    check_batch_independent(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)))   # Dropout keeps rows apart
    with pytest.raises(ValueError, match="BatchNorm1d"):
        check_batch_independent(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
