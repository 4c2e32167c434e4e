"""Issue 42: per_example_gradient_penalty needs one deterministic, row-wise forward and refuses train-mode Dropout /
BatchNorm through the package's one helper; in eval mode it equals a loop over single examples; the optimizers and
clip_grad_ refuse a params argument that is not a collection of tensors with their own message."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss import dynamics as D


def _model(mid):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), mid, nn.Linear(4, 2)).double()


@pytest.mark.parametrize("mid", [nn.Dropout(0.3), nn.BatchNorm1d(4)])
def test_per_example_penalty_refuses_train_mode(mid):
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    with pytest.raises(ValueError, match=rf"\({type(mid).__name__}\) is in training mode.*per_example_gradient_penalty"):
        D.per_example_gradient_penalty(_model(mid), F.cross_entropy, x, y)


def test_per_example_penalty_eval_matches_a_loop():
    m = _model(nn.Dropout(0.3))
    m.eval()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    got = D.per_example_gradient_penalty(m, F.cross_entropy, x, y)
    want = 0.0
    for i in range(5):
        g = torch.autograd.grad(F.cross_entropy(m(x[i:i + 1]), y[i:i + 1]), list(m.parameters()))
        want += sum(float((t ** 2).sum()) for t in g) / 5
    assert float(got) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("params", [torch.tensor(1.0), 10**12, "p", {"params": []}])
def test_params_that_are_not_a_collection(params):
    with pytest.raises(TypeError, match="params"):
        D.ClippedSGD(params, lr=0.1)
    if not isinstance(params, dict):
        with pytest.raises(TypeError, match="params"):
            D.clip_grad_(params if not isinstance(params, torch.Tensor) else 3, 1.0)
