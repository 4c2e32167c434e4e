"""``ClippedSGD`` skips a parameter group without gradients as ``torch.optim.SGD`` does (a frozen or unused part of
a model), still refuses a step where no group has one, and the entry points of taskloss.dynamics refuse meta-device
tensors and models with a message instead of ``Tensor.item() cannot be called on meta tensors``."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskloss.dynamics as D


def _two_heads():
    torch.manual_seed(0)
    return nn.ModuleDict({"body": nn.Linear(3, 4), "used": nn.Linear(4, 2), "unused": nn.Linear(4, 2)})


def _step(make_opt, gamma):
    model = _two_heads()
    opt = make_opt([{"params": model["body"].parameters()}, {"params": model["unused"].parameters(), "lr": 0.3},
                    {"params": model["used"].parameters(), "lr": 0.05}])
    X, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1] * 4)
    F.cross_entropy(model["used"](torch.tanh(model["body"](X))), y).backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("gamma", [math.inf, 0.05])
def test_a_group_without_gradients_is_skipped_like_torch_sgd(gamma):
    ours, opt = _step(lambda g: D.ClippedSGD(g, lr=0.1, gamma=gamma), gamma)
    ref, _ = _step(lambda g: torch.optim.SGD(g, lr=0.1), gamma)
    assert opt.last_norms[1] is None and opt.last_norms[0] is not None
    torch.testing.assert_close(ours["unused"].weight, ref["unused"].weight, rtol=0, atol=0)   # not moved
    if math.isinf(gamma):
        for k in ("body", "used"):
            torch.testing.assert_close(ours[k].weight, ref[k].weight, rtol=0, atol=0)
    else:
        assert not torch.equal(ours["body"].weight, ref["body"].weight)   # clipped: a shorter step


def test_a_step_without_any_gradient_is_still_refused():
    with pytest.raises(ValueError, match="no gradients: no parameter of any group"):
        D.ClippedSGD(_two_heads().parameters(), lr=0.1).step()


def _meta(*shape):
    return torch.ones(*shape, device="meta")


def _meta_param():
    p = _meta(3).requires_grad_(True)
    p.grad = _meta(3)
    return p


with torch.device("meta"):
    META_NET = nn.Linear(3, 2)
QUAD = lambda p: (p * p).sum()  # noqa: E731

META_CASES = {
    "clip_coefficient": lambda: D.clip_coefficient(_meta(3), 1.0),
    "clip_grad_": lambda: D.clip_grad_([_meta_param()], 1.0),
    "ClippedSGD": lambda: D.ClippedSGD([_meta_param()], lr=0.1),
    "gradient_norm_penalty": lambda: D.gradient_norm_penalty(META_NET(_meta(4, 3)).sum(), META_NET.parameters()),
    "per_example_gradient_penalty": lambda: D.per_example_gradient_penalty(
        META_NET, lambda o, t: F.cross_entropy(o, t), torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)),
    "flooding": lambda: D.flooding(_meta(()), 0.1),
    "loss_gradient": lambda: D.loss_gradient(QUAD, _meta(3)),
    "hessian_vector_product": lambda: D.hessian_vector_product(QUAD, _meta(3), _meta(3)),
    "top_hessian_eigenvalue": lambda: D.top_hessian_eigenvalue(QUAD, _meta(3)),
    "local_smoothness": lambda: D.local_smoothness(QUAD, _meta(3), _meta(3)),
    "modified_loss": lambda: D.modified_loss(QUAD, _meta(3), 0.1),
    "modified_gradient": lambda: D.modified_gradient(QUAD, _meta(3), 0.1),
    "gradient_flow": lambda: D.gradient_flow(QUAD, _meta(3), 0.1),
    "integrate_flow": lambda: D.integrate_flow(lambda y: -y, _meta(3), 0.1),
    "TrajectorySmoothness": lambda: D.TrajectorySmoothness(META_NET.parameters()),
}


@pytest.mark.parametrize("name", sorted(META_CASES))
def test_meta_tensors_are_refused_clearly(name):
    with pytest.raises(ValueError, match="on the meta device .*materialize it first"):
        META_CASES[name]()
