"""Issue 42: the validators of taskloss.validation validate their own flags and bounds, refuse meta tensors with the
argument's name, and one helper refuses train-mode Dropout / BatchNorm wherever a deterministic forward is needed."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from taskloss import validation as U


@pytest.mark.parametrize("flag", ["no", "False", 0, 1, None, 1.0])
def test_check_positive_refuses_a_flag_that_is_not_a_bool(flag):
    with pytest.raises(TypeError, match="allow_inf must be a bool"):
        U.check_positive("x", 1.0, allow_inf=flag)


def test_check_positive_flag_still_works():
    assert U.check_positive("x", float("inf"), allow_inf=np.bool_(True)) == float("inf")
    with pytest.raises(ValueError, match="x must be > 0 and finite"):
        U.check_positive("x", float("inf"), allow_inf=False)


def test_check_device_and_check_int_and_check_steps_check_their_own_arguments():
    with pytest.raises(TypeError, match="allow_none must be a bool"):
        U.check_device("device", None, allow_none="yes")
    with pytest.raises(TypeError, match="check_int's minimum must be an int"):
        U.check_int("n", 3, minimum="1")
    with pytest.raises(TypeError, match="check_int's maximum must be an int"):
        U.check_int("n", 3, maximum=2.5)
    with pytest.raises(ValueError, match="bytes_per_step must be a number"):
        U.check_steps("n", 3, bytes_per_step=float("nan"))
    assert U.check_int("n", np.int64(3), minimum=np.int64(1)) == 3


@pytest.mark.parametrize("check", [
    lambda t: U.check_finite("logits", t), lambda t: U.check_floating("logits", t),
    lambda t: U.check_ndim("logits", t, 2), lambda t: U.check_dtype("logits", t, U.FLOAT_DTYPES),
    lambda t: U.check_no_nan("logits", t), lambda t: U.check_positive("logits", t[0, :1]),
])
def test_tensor_validators_refuse_meta_tensors_by_name(check):
    with pytest.raises(ValueError, match="logits is on the meta device"):
        check(torch.empty(2, 3, device="meta"))


def test_check_token_ids_refuses_meta():
    with pytest.raises(ValueError, match="idx is on the meta device"):
        U.check_token_ids("idx", torch.zeros(2, 3, dtype=torch.long, device="meta"), 10)


def test_steps_helper_refuses_before_allocating():
    with pytest.raises(ValueError, match=r"width=10\*\*12.*would allocate about 7.28 TiB"):
        U.check_steps("width", 10**12, bytes_per_step=8, what="width=10**12", limit=2**40)
    assert U.check_steps("width", 7, bytes_per_step=8, limit=2**40) == 7


@pytest.mark.parametrize("module", [nn.Dropout(0.5), nn.BatchNorm1d(3)])
def test_one_eval_mode_helper(module):
    model = nn.Sequential(nn.Linear(3, 3), module)
    with pytest.raises(ValueError, match=rf"module '1' \({type(module).__name__}\) is in training mode.*model.eval"):
        U.check_eval_mode(model, purpose="x is undefined", fix="x")
    U.check_eval_mode(model.eval())
    U.check_eval_mode(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0)))       # p = 0 is deterministic
    U.check_eval_mode(lambda x: x)                                             # a function has no mode


def test_curvature_uses_the_same_helper():
    from taskloss.curvature import kfac, model_io
    assert model_io.check_eval_mode is U.check_eval_mode
    assert kfac.random_modules is U.random_modules and kfac.train_mode_error is U.train_mode_error


@pytest.mark.parametrize("bad", [torch.tensor(1.0), 3, "abc", None, np.array([object()], dtype=object)])
def test_container_validators_refuse_non_collections(bad):
    with pytest.raises(TypeError, match="xs must be a collection"):
        U.check_iterable("xs", bad)
    with pytest.raises(TypeError):
        U.check_tensors("xs", bad)
    with pytest.raises(TypeError, match="params must be (an iterable|a collection)"):
        U.check_param_list(bad)


def test_container_validators_accept_collections():
    t = torch.ones(2)
    assert U.check_tensors("xs", {"a": t}) == [t] and U.check_tensors("xs", (t,)) == [t]
    with pytest.raises(TypeError, match=r"xs\[1\] must be a torch.Tensor"):
        U.check_tensors("xs", [t, 1.0])
    with pytest.raises(TypeError, match="m must be an nn.Module"):
        U.check_module("m", t)
    with pytest.raises(ValueError, match="m is on the meta device"):
        U.check_module("m", nn.Linear(2, 2, device="meta"))


def test_check_choice_refuses_unhashable_and_elementwise_values():
    for bad in ([1], {"a": 1}, torch.tensor([1, 2]), np.array([1, 2])):
        with pytest.raises(ValueError, match="mode must be one of"):
            U.check_choice("mode", bad, ("a", "b"))
    assert U.check_choice("mode", "a", ("a", "b")) == "a"
    assert U.check_choice("k", np.int64(2), (1, 2)) == 2
    with pytest.raises(ValueError):
        U.check_choice("k", True, (1, 2))


def test_eval_mode_checks_at_the_call():
    with pytest.raises(TypeError, match="enabled must be a bool"):
        U.eval_mode(nn.Linear(2, 2), "no")
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        U.eval_mode(torch.ones(2))
