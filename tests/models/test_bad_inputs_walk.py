"""Issue 42: the models refuse an input of another dtype than their weights (and meta inputs) with a clear error,
and take numpy integers for their sizes (torch's layers refuse them)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from taskloss.models import MLP, RNNLM, SmallCNN, TransformerLM


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_mlp_other_dtype(dtype):
    with pytest.raises(TypeError, match=rf"MLP input has dtype {dtype} but its parameters are torch.float32"):
        MLP(4, (3,), 2)(torch.randn(2, 4).to(dtype))
    m = MLP(4, (3,), 2).to(dtype)
    x = torch.randn(2, 4).to(dtype)
    assert m(x).dtype == dtype


def test_smallcnn_other_dtype_and_meta():
    with pytest.raises(TypeError, match="SmallCNN input has dtype torch.float64"):
        SmallCNN()(torch.randn(2, 1, 8, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="SmallCNN input is on the meta device"):
        SmallCNN()(torch.randn(2, 1, 8, 8, device="meta"))
    m = SmallCNN().double()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), m.fc(m.pool(torch.relu(m.conv2(torch.relu(m.conv1(x))))).flatten(1)))


def test_numpy_integer_sizes():
    torch.manual_seed(0)
    a = RNNLM(10, d_model=np.int64(4), hidden=np.int32(6))
    torch.manual_seed(0)
    b = RNNLM(10, d_model=4, hidden=6)
    assert a.d_model == 4 and type(a.d_model) is int
    idx = torch.randint(0, 10, (2, 5))
    torch.testing.assert_close(a(idx), b(idx))
    t = TransformerLM(np.int64(11), d_model=np.int64(8), n_layers=np.int64(1), n_heads=np.int64(2),
                      max_len=np.int64(6))
    assert t(torch.randint(0, 11, (1, 6))).shape == (1, 6, 11)
    m = MLP(np.int64(3), np.int64(5), np.int64(2))
    assert m.hidden == (5,) and m(torch.randn(1, 3)).shape == (1, 2)
    assert SmallCNN(np.int64(1), np.int64(3), np.int64(2))(torch.randn(1, 64)).shape == (1, 3)
