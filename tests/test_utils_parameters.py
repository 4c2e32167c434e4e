"""Parameters as flat vectors and pure functions (``taskloss.utils``), and the flag and option validators: each
tensor counted once by identity, frozen ones dropped on request, flatten/unflatten inverse to each other, the pure
loss of a model equal to the model's loss, flags never coerced."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.parameter_vectors import (distinct_param_group, flat_gradient, flatten, functional_loss, named_tensors, unflatten, unique_tensors)
from taskloss.validation import check_bool, check_choice


def test_unique_tensors_counts_by_identity_and_drops_frozen_on_request():
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.zeros(3))
    frozen = nn.Parameter(torch.ones(1), requires_grad=False)
    assert unique_tensors([a, b, a, frozen, b]) == [a, b, frozen]
    assert unique_tensors([a, frozen, a], trainable_only=True) == [a]
    assert unique_tensors(a) == [a]
    equal_values = nn.Parameter(torch.ones(2))      # equal values, another tensor: kept
    assert unique_tensors([a, equal_values]) == [a, equal_values]
    with pytest.raises(TypeError, match="expected tensors"):
        unique_tensors([a, 3])
    with pytest.raises(TypeError, match="trainable_only must be a bool"):
        unique_tensors([a], trainable_only="no")


def test_distinct_param_group_keeps_the_hyperparameters():
    a = nn.Parameter(torch.ones(2))
    group = distinct_param_group({"params": [a, a], "lr": 0.3})
    assert group["params"] == [a] and group["lr"] == 0.3
    assert distinct_param_group(a)["params"] == [a]
    with pytest.raises(TypeError, match="parameter group must be a dict"):
        distinct_param_group(3)


def test_flatten_and_unflatten_are_inverse():
    like = {"w": torch.arange(6.0).view(2, 3), "b": torch.tensor([7.0, 8.0])}
    flat = flatten(like)
    assert torch.equal(flat, torch.tensor([0.0, 1, 2, 3, 4, 5, 7, 8]))
    back = unflatten(flat, like)
    assert list(back) == ["w", "b"] and all(torch.equal(back[k], like[k]) for k in like)
    as_list = unflatten(flat, list(like.values()))
    assert isinstance(as_list, list) and torch.equal(as_list[0], like["w"])
    assert torch.equal(flatten(list(like.values())), flat)
    with pytest.raises(ValueError, match="non-empty dict or sequence"):
        flatten({})
    with pytest.raises(ValueError, match=r"shape \(8,\)"):
        unflatten(torch.ones(9), like)
    with pytest.raises(ValueError, match="got list"):
        unflatten([1.0] * 8, like)


def test_flat_gradient_fills_zeros_where_there_is_no_gradient():
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    (a * 2).sum().backward()
    assert torch.equal(flat_gradient([a, b]), torch.tensor([2.0, 2, 0, 0, 0]))
    with pytest.raises(ValueError, match="params is empty"):
        flat_gradient([])


def test_named_tensors_names_each_parameter_once():
    """Issue case: a parameter listed twice was listed twice by named_tensors."""
    m = nn.Linear(2, 2)
    names, tensors = named_tensors([m.weight, m.bias, m.weight], m)
    assert names == ["weight", "bias"] and tensors == [m.weight, m.bias]
    assert named_tensors({"x": m.bias}, None) == (["x"], [m.bias])
    with pytest.raises(ValueError, match="empty parameter list"):
        named_tensors([], m)
    with pytest.raises(ValueError, match="belong to model_fn"):
        named_tensors([nn.Parameter(torch.ones(2))], m)


def test_functional_loss_is_the_models_loss_over_its_trainable_parameters():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    m[0].bias.requires_grad_(False)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    f, theta = functional_loss(m, lambda out: F.cross_entropy(out, y), x)
    assert "0.bias" not in theta and set(theta) == {"0.weight", "2.weight", "2.bias"}
    torch.testing.assert_close(f(theta), F.cross_entropy(m(x), y))
    moved = {k: v + 0.1 for k, v in theta.items()}
    assert not torch.allclose(f(moved), f(theta))               # the frozen bias keeps its value, the rest moves
    with pytest.raises(TypeError, match="nn.Module"):
        functional_loss("model", lambda o: o)
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        functional_loss(m, 3)
    with pytest.raises(ValueError, match="requires_grad"):
        functional_loss(nn.Linear(2, 2).requires_grad_(False), lambda o: o.sum())


@pytest.mark.parametrize("bad", ["no", "False", 0, 1, None, 1.0, torch.tensor(True)])
def test_check_bool_refuses_everything_but_bools(bad):
    with pytest.raises(TypeError, match="flag must be a bool"):
        check_bool("flag", bad)


def test_check_bool_accepts_bools_and_numpy_bools():
    assert check_bool("flag", True) is True and check_bool("flag", np.bool_(False)) is False


def test_check_choice():
    assert check_choice("mode", "hard", ("hard", "soft")) == "hard"
    for bad in ("medium", True, None):
        with pytest.raises(ValueError, match="mode must be one of"):
            check_choice("mode", bad, ("hard", "soft"))
