"""Issue 42: integrated gradients refuse a train-mode Dropout / BatchNorm forward (the package's one eval-mode
helper) and integrate_gradients validates its own inputs (internal_batch_size ≤ 0 gave all-zero attributions,
NaN weights NaN ones); a valid call matches the closed form of a linear function."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from taskloss import attribution as A


def _linear(w):
    return lambda points, pair_index: points @ w


def _path():
    g = torch.Generator().manual_seed(0)
    w, x0, x1 = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((4,), (3, 4), (3, 4)))
    alphas, weights = A.quadrature_rule("gausslegendre", 5, dtype=torch.float64)
    return w, x0, x1, alphas, weights


@pytest.mark.parametrize("module", [nn.Dropout(0.5), nn.BatchNorm1d(3)])
def test_integrated_gradients_refuse_train_mode(module):
    model = nn.Sequential(nn.Linear(4, 3), module).train()
    x = torch.randn(3, 4)
    for fn in (model, model.forward):
        with pytest.raises(ValueError, match=rf"\({type(module).__name__}\) is in training mode.*attributing"):
            A.IntegratedGradients(fn).attribute(x, target=0)
        with pytest.raises(ValueError, match="training mode"):
            A.IntegratedGradients(fn).attribute((x,), target=0)
    r = A.IntegratedGradients(model.eval()).attribute(x, target=0, n_steps=20)
    torch.testing.assert_close(r.completeness_error, torch.zeros(3), rtol=0, atol=1e-3)


def test_embedding_integrated_gradients_refuse_train_mode():
    emb = nn.Embedding(5, 4)
    model = nn.Sequential(emb, nn.Dropout(0.5), nn.Flatten(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match=r"\(Dropout\) is in training mode"):
        A.EmbeddingIntegratedGradients(model, emb).attribute(torch.tensor([[1, 2]]), target=0)


@pytest.mark.parametrize("ibs,err,msg", [(-1, ValueError, "internal_batch_size must be >= 1"),
                                         (0, ValueError, "internal_batch_size must be >= 1"),
                                         (1.5, TypeError, "internal_batch_size must be an int")])
def test_integrate_gradients_batch_size(ibs, err, msg):
    w, x0, x1, a, wt = _path()
    with pytest.raises(err, match=msg):
        A.integrate_gradients(_linear(w), x0, x1, a, wt, internal_batch_size=ibs)


@pytest.mark.parametrize("fault", ["nan weights", "inf alphas", "complex", "meta", "shape", "dtype", "nodes 2-D",
                                   "empty", "list", "not callable"])
def test_integrate_gradients_refuses_bad_inputs(fault):
    w, x0, x1, a, wt = _path()
    fn = _linear(w)
    if fault == "nan weights":
        wt = wt.clone()
        wt[0] = math.nan
    elif fault == "inf alphas":
        a = a.clone()
        a[-1] = math.inf
    elif fault == "complex":
        x0 = x0.to(torch.complex128)
    elif fault == "meta":
        x1 = x1.to("meta")
    elif fault == "shape":
        x1 = x1[:2]
    elif fault == "dtype":
        x1 = x1.float()
    elif fault == "nodes 2-D":
        a = a[None]
    elif fault == "empty":
        x0, x1 = x0[:0], x1[:0]
    elif fault == "list":
        x0 = x0.tolist()
    else:
        fn = "f"
    with pytest.raises((TypeError, ValueError)) as info:
        A.integrate_gradients(fn, x0, x1, a, wt)
    assert str(info.value)


@pytest.mark.parametrize("ibs", [None, 1, 2, 7])
def test_integrate_gradients_linear_closed_form(ibs):
    w, x0, x1, a, wt = _path()
    total, values = A.integrate_gradients(_linear(w), x0, x1, a, wt, internal_batch_size=ibs)
    torch.testing.assert_close(total, w.expand(3, 4) * wt.sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(values, (x0 + a[:, None, None] * (x1 - x0)) @ w, rtol=1e-12, atol=1e-12)


def test_noise_baselines_need_a_batch_and_data():
    for fn in (A.uniform_noise_baseline, A.gaussian_noise_baseline):
        with pytest.raises(TypeError, match=r"\[B, \*feat\]"):
            fn(torch.tensor(0.5), *(() if fn is A.uniform_noise_baseline else (0.1,)))
        with pytest.raises(ValueError, match="inputs is on the meta device"):
            fn(torch.ones(2, 3, device="meta"), *(() if fn is A.uniform_noise_baseline else (0.1,)))


def test_blur_width_beyond_memory_refused_before_the_kernel():
    x = torch.rand(1, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"blurred_baseline\(sigma=1000000000000.0\) would allocate"):
        A.blurred_baseline(x, 1e12)
    b = A.blurred_baseline(x, 1e3)                  # a wide blur: convex combinations of the pixels
    assert b.shape == x.shape and bool((b >= x.min() - 1e-12).all() & (b <= x.max() + 1e-12).all())
