"""Issue 42: MeZO's load_state_dict refuses a state saved over parameters of other shapes, and a closure's
n_examples must be a whole number ((loss, 2.5) was taken as 2.5 examples)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from taskloss.search import MeZO


def _opt(shape):
    torch.manual_seed(0)
    m = nn.Linear(*shape).double()
    return m, MeZO(m.parameters(), lr=0.01, sigma=1e-3, seed=1)


def test_load_state_dict_over_other_shapes_refused():
    _, a = _opt((3, 2))
    _, b = _opt((4, 2))
    with pytest.raises(ValueError, match="saved over parameters of shapes"):
        b.load_state_dict(a.state_dict())


def test_load_state_dict_same_shapes_resumes_bit_identically():
    x = torch.randn(5, 3, dtype=torch.float64)
    m1, a = _opt((3, 2))
    a.step(lambda: m1(x).pow(2).mean())
    state = a.state_dict()
    m2, b = _opt((3, 2))
    m2.load_state_dict(m1.state_dict())
    b.load_state_dict(state)
    a.step(lambda: m1(x).pow(2).mean())
    b.step(lambda: m2(x).pow(2).mean())
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("n", [2.5, torch.tensor(0.5)])
def test_closure_count_must_be_whole(n):
    m, opt = _opt((3, 1))
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="whole number"):
        opt.step(lambda: (m(x).pow(2).mean(), n))


def test_closure_count_whole_float_accepted():
    m, opt = _opt((3, 1))
    x = torch.randn(4, 3, dtype=torch.float64)
    opt.step(lambda: (m(x).pow(2).mean(), 4.0))


@pytest.mark.parametrize("fn", ["gaussian_smoothing_grad", "spsa_grad"])
def test_sample_count_beyond_memory_refused_before_drawing(fn):
    from taskloss import search as S
    theta = {"w": torch.zeros(3, dtype=torch.float64)}
    with pytest.raises(ValueError, match="n_samples=1000000000000 would allocate"):
        getattr(S, fn)(lambda t: t["w"].sum(), theta, 0.1, 10**12)
    est = getattr(S, fn)(lambda t: t["w"].sum() * 0 + 1.0, theta, 0.1, 4)
    est = est[0] if isinstance(est, tuple) else est
    assert torch.equal(est["w"], torch.zeros(3, dtype=torch.float64))
