"""The entry points of taskloss.search refuse meta-device models and tensors with a message (materialize the model
first) instead of ``Tensor.item() cannot be called on meta tensors`` deep inside a step."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskloss.search as S

with torch.device("meta"):
    NET = nn.Linear(3, 2)

CASES = {
    "MGS": lambda: S.MGS(NET, torch.optim.SGD(NET.parameters(), lr=1.0), lambda o, b: F.cross_entropy(o, b[1])),
    "MeZO": lambda: S.MeZO(NET.parameters()),
    "gaussian_smoothing_grad": lambda: S.gaussian_smoothing_grad(lambda p: p["w"].sum(),
                                                                 {"w": torch.ones(3, device="meta")}, 0.1, 2),
    "spsa_grad": lambda: S.spsa_grad(lambda p: p.sum(), torch.ones(3, device="meta"), 0.1),
    "classification_reinforce": lambda: S.classification_reinforce(torch.zeros(4, 2, device="meta"),
                                                                   torch.zeros(4, dtype=torch.long), 2),
    "reinforce_loss": lambda: S.reinforce_loss(torch.zeros(3, device="meta"), torch.zeros(3, device="meta")),
    "expected_reward": lambda: S.expected_reward(torch.zeros(2, 3, device="meta"), torch.zeros(2, 3, device="meta")),
    "sequence_reinforce": lambda: S.sequence_reinforce(NET, torch.zeros(2, 3, dtype=torch.long),
                                                       torch.zeros(2, 3, dtype=torch.long),
                                                       lambda h, r: torch.zeros(len(h)), n_samples=2,
                                                       max_new_tokens=2, eos_id=None, pad_id=0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_inputs_are_refused_clearly(name):
    with pytest.raises(ValueError, match="on the meta device .*materialize it first"):
        CASES[name]()
