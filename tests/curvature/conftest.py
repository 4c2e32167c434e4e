"""Fixtures shared by the curvature tests."""
from __future__ import annotations

import pytest
import torch
from torch import nn


class PositionWise(nn.Module):
    """A per-token model whose output at each position depends on that position's input only: its per-token
    curvature equals the ``[N, C]`` curvature of its rows stacked as examples (a reference for masks)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))

    def forward(self, x):
        return self.net(x)


@pytest.fixture(scope="module")
def position_wise():
    """``(model, inputs [3, 5, 4], labels [3, 5])`` in float64 with some ``-100`` labels."""
    torch.manual_seed(0)
    model = PositionWise().double()
    X = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (3, 5), generator=torch.Generator().manual_seed(2))
    y[0, 3:] = -100
    y[2, 0] = -100
    return model, X, y
