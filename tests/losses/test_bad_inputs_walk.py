"""Issue 42: the reference EMO validates like the fused one (NaN / inf logits, complex, meta); the divergence
frontier refuses complex histograms; sizes that set an allocation (macro_f1's num_classes, the frontier's n_lambda)
are refused before anything is allocated, with the argument's name."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from taskloss import losses as L


def _emo_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, 5, generator=g, dtype=torch.float64), torch.randint(0, 5, (2, 3), generator=g),
            torch.randn(5, 4, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("fault", ["nan", "+inf", "row -inf", "complex", "meta", "ids float", "ids range",
                                   "vocab", "ignore_index"])
def test_emo_loss_reference_validates_like_emo_loss(fault):
    x, t, e = _emo_inputs()
    kw = {}
    if fault == "nan":
        x[0, 0, 1] = math.nan
    elif fault == "+inf":
        x[1, 2, 0] = math.inf
    elif fault == "row -inf":
        x[0, 1] = -math.inf
    elif fault == "complex":
        x = x.to(torch.complex128)
    elif fault == "meta":
        x = x.to("meta")
    elif fault == "ids float":
        t = t.double()
    elif fault == "ids range":
        t[0, 0] = 5
    elif fault == "vocab":
        e = e[:4]
    else:
        kw = {"ignore_index": 1.5}
    for fn in (L.emo_loss, L.emo_loss_reference):
        with pytest.raises((TypeError, ValueError)) as info:
            fn(x, t, e, **kw)
        assert str(info.value)


def test_emo_loss_reference_equals_emo_loss_when_valid():
    x, t, e = _emo_inputs()
    x[0, 0, 2] = -math.inf                       # one -inf entry is a zero probability, not an error
    t[1, 1] = -100
    torch.testing.assert_close(L.emo_loss_reference(x, t, e), L.emo_loss(x, t, e), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", [torch.tensor([0.1 + 1j, 0.5]), np.array([0.1 + 1j, 0.5]), [0.1 + 1j, 0.5],
                               torch.tensor([0.1, 0.5], device="meta")])
def test_frontier_refuses_complex_and_meta(p):
    with pytest.raises((TypeError, ValueError), match="p "):
        L.frontier_area(p, torch.tensor([0.2, 0.3]))


def test_sizes_refused_before_allocation():
    with pytest.raises(ValueError, match=r"macro_f1\(num_classes=1000000000000\).*would allocate"):
        L.macro_f1(torch.tensor([0, 1]), torch.tensor([0, 1]), 10**12)
    with pytest.raises(ValueError, match="n_lambda.*would allocate"):
        L.frontier_score(np.random.default_rng(0).normal(size=(20, 3)), np.random.default_rng(1).normal(size=(20, 3)),
                         n_lambda=10**12)
    with pytest.raises(ValueError, match="n_lambda.*would allocate"):
        L.divergence_frontier([1.0, 2.0], [2.0, 1.0], n_lambda=10**12)


def test_frontier_area_real_input_unchanged():
    assert L.frontier_area([1.0, 1.0], np.array([1, 1])) == pytest.approx(1.0)
    from sklearn.metrics import f1_score
    p, t = torch.tensor([0, 2, 1, 1]), torch.tensor([0, 1, 1, 2])
    assert float(L.macro_f1(p, t, 3)) == pytest.approx(f1_score(t, p, labels=[0, 1, 2], average="macro"))
