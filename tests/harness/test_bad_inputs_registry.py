"""Issue 42: the rule registry refuses to replace a rule unless asked; Problem.grad_hessian refuses a train-mode
Dropout / BatchNorm model through the package's one eval-mode helper, and agrees with torch.autograd in eval."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from taskloss import harness as H


class _Rule:
    def __init__(self, problem, lr=0.1):
        self.problem, self.lr = problem, lr

    def step(self):
        return None


def test_register_refuses_to_replace_a_built_in():
    before = H.RULES["sgd"]
    with pytest.raises(ValueError, match="'sgd' is already registered.*replace=True"):
        H.register("sgd", torch.optim.SGD)
    assert H.RULES["sgd"] is before


def test_register_replaces_only_when_asked_with_a_bool():
    H.register("walk-rule", _Rule)
    with pytest.raises(ValueError, match="already registered"):
        H.register("walk-rule", _Rule, {"lr": 0.5})
    with pytest.raises(TypeError, match="replace must be a bool"):
        H.register("walk-rule", _Rule, replace="yes")
    try:
        assert H.register("walk-rule", _Rule, {"lr": 0.5}, replace=True).defaults == {"lr": 0.5}
    finally:
        del H.RULES["walk-rule"]


def _problem(module):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2)).double()
    return H.Problem(model, torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 2, (6,)))


@pytest.mark.parametrize("module", [nn.Dropout(0.5), nn.BatchNorm1d(4)])
def test_grad_hessian_refuses_train_mode(module):
    p = _problem(module)
    with pytest.raises(ValueError, match=rf"\({type(module).__name__}\) is in training mode.*grad_hessian"):
        p.grad_hessian()


def test_grad_hessian_in_eval_mode_matches_autograd():
    p = _problem(nn.Dropout(0.5))
    p.model.eval()
    g, Hm = p.grad_hessian()
    theta = torch.cat([q.detach().reshape(-1) for q in p.params])
    f = p.flat_loss()
    _close = torch.testing.assert_close
    _close(g, torch.autograd.functional.jacobian(f, theta), rtol=1e-10, atol=1e-12)
    _close(Hm, torch.autograd.functional.hessian(f, theta), rtol=1e-8, atol=1e-10)
