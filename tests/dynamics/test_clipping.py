"""Clipping: both coefficients, the factor-2 sandwich (property test), parity with torch.nn.utils.clip_grad_norm_,
per-tensor clipping against a loop, and ClippedSGD against torch.optim.SGD with a resumable state."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import make_lm, tokens
from hypothesis import given
from hypothesis import strategies as st

from taskloss.dynamics import ClippedSGD, clip_coefficient, clip_grad_


def _with_grads(seed: int = 0, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g, requires_grad=True) for s in [(3, 4), (5,), (2, 2, 2)]]
    for p in params:
        p.grad = scale * torch.randn(p.shape, generator=g)
    return params


@given(st.floats(0.0, 1e8, allow_nan=False), st.floats(1e-6, 1e6, allow_nan=False))
def test_soft_is_sandwiched_between_half_hard_and_hard(norm, gamma):
    """½·min{1, γ/‖g‖} ≤ γ/(‖g‖+γ) ≤ min{1, γ/‖g‖} for every norm ≥ 0 and γ > 0."""
    hard = float(clip_coefficient(norm, gamma, "hard"))
    soft = float(clip_coefficient(norm, gamma, "soft"))
    rel = 1e-12  # float64 rounding of the two divisions
    assert 0.5 * hard * (1 - rel) <= soft <= hard * (1 + rel)
    assert 0 < soft <= 1 and 0 < hard <= 1


def test_coefficients_closed_form():
    n = torch.tensor([0.0, 0.5, 1.0, 2.0, 10.0], dtype=torch.float64)
    torch.testing.assert_close(clip_coefficient(n, 1.0, "hard"), torch.tensor([1, 1, 1, 0.5, 0.1], dtype=torch.float64))
    torch.testing.assert_close(clip_coefficient(n, 1.0, "soft"), 1 / (1 + n))
    assert torch.equal(clip_coefficient(n, math.inf, "soft"), torch.ones_like(n))
    # soft = hard/2 exactly where the sandwich is tight: ‖g‖ = γ
    assert float(clip_coefficient(3.0, 3.0, "soft")) == 0.5 * float(clip_coefficient(3.0, 3.0, "hard"))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("scale", [0.01, 10.0])
def test_global_hard_equals_clip_grad_norm(norm_type, scale):
    ours, ref = _with_grads(scale=scale), _with_grads(scale=scale)
    n_ours = clip_grad_(ours, 1.5, "hard", norm_type=norm_type, eps=1e-6)
    n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.5, norm_type=norm_type)
    torch.testing.assert_close(n_ours, n_ref)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad)   # same coefficient; foreach kernels may round differently


def test_exact_formula_differs_from_torch_only_by_eps():
    ours = _with_grads(scale=10.0)
    norm = clip_grad_(ours, 2.0)                        # eps = 0: exactly γ/‖g‖
    total = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in ours]))
    torch.testing.assert_close(total, torch.tensor(2.0), rtol=1e-6, atol=0)
    assert norm > 2.0


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_per_tensor_equals_a_loop(mode):
    ours, ref = _with_grads(scale=3.0), _with_grads(scale=3.0)
    norms = clip_grad_(ours, 1.0, mode, per_tensor=True)
    for i, p in enumerate(ref):
        n = p.grad.norm()
        c = min(1.0, 1.0 / float(n)) if mode == "hard" else 1.0 / (float(n) + 1.0)
        torch.testing.assert_close(norms[i], n)
        torch.testing.assert_close(ours[i].grad, p.grad * c)


def test_soft_global_scales_by_gamma_over_norm_plus_gamma():
    ours = _with_grads(scale=2.0)
    before = [p.grad.clone() for p in ours]
    n = clip_grad_(ours, 0.7, "soft")
    for p, b in zip(ours, before):
        torch.testing.assert_close(p.grad, b * 0.7 / (n + 0.7))


def test_clipped_sgd_without_clipping_is_torch_sgd():
    m1, m2 = make_lm("lstm"), make_lm("lstm")
    x = tokens(4, 8)
    o1 = ClippedSGD(m1.parameters(), lr=0.3, momentum=0.9)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.3, momentum=0.9)
    for _ in range(3):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            m(x).logsumexp(-1).mean().backward()
            o.step()
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b)


def test_clipped_sgd_equals_clip_grad_norm_then_sgd():
    m1, m2 = make_lm("pre"), make_lm("pre")
    x = tokens(4, 8)
    o1 = ClippedSGD(m1.parameters(), lr=0.5, gamma=0.05, momentum=0.5)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.5, momentum=0.5)
    for _ in range(3):
        o1.zero_grad()
        o2.zero_grad()
        m1(x).logsumexp(-1).mean().backward()
        m2(x).logsumexp(-1).mean().backward()
        torch.nn.utils.clip_grad_norm_(m2.parameters(), 0.05)   # its 1e-6 guard moves the result by ~1e-5 relative
        o1.step()
        o2.step()
        assert float(o1.last_norms[0]) > 0.05                  # clipping was active
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_step_with_closure_returns_loss_and_hyperparameters_live_in_groups():
    m = make_lm("lstm")
    x = tokens(2, 6)
    opt = ClippedSGD([{"params": m.rnn.parameters(), "gamma": 0.1},
                      {"params": [p for n, p in m.named_parameters() if not n.startswith("rnn")]}],
                     lr=0.1, mode="soft")

    def closure():
        opt.zero_grad()
        loss = m(x).logsumexp(-1).mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.ndim == 0 and opt.param_groups[0]["gamma"] == 0.1 and math.isinf(opt.param_groups[1]["gamma"])
    assert len(opt.last_norms) == 2
    opt.param_groups[0]["gamma"] = -1.0
    with pytest.raises(ValueError, match="gamma"):
        opt.step(closure)


def test_state_dict_resume_is_bit_identical():
    torch.manual_seed(0)
    x = tokens(4, 8)
    model = make_lm("lstm")
    opt = ClippedSGD(model.parameters(), lr=0.2, gamma=0.1, momentum=0.9, per_tensor=True)

    def train(m, o, n):
        for _ in range(n):
            o.zero_grad()
            m(x).logsumexp(-1).mean().backward()
            o.step()

    train(model, opt, 2)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    train(model, opt, 3)
    resumed = make_lm("lstm", seed=5)
    resumed.load_state_dict(saved_model)
    ropt = ClippedSGD(resumed.parameters(), lr=1.0)
    ropt.load_state_dict(saved_opt)
    assert ropt.param_groups[0]["gamma"] == 0.1 and ropt.param_groups[0]["per_tensor"]
    train(resumed, ropt, 3)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)     # same ops, same order, same process: identical bits


def test_shared_and_frozen_parameters_are_clipped_and_stepped_once():
    """Issue cases: a parameter listed twice was clipped twice by clip_grad_ (1/6 instead of 0.58) and stepped
    twice by ClippedSGD; a frozen parameter with a stale gradient must not move."""
    w = torch.nn.Parameter(torch.ones(3))
    w.grad = torch.full((3,), 2.0)                       # ‖g‖ = 2√3 ≈ 3.46, γ = 2: c = 0.577
    norm = clip_grad_([w, w], 2.0)
    assert float(norm) == pytest.approx(2 * math.sqrt(3))
    torch.testing.assert_close(w.grad, torch.full((3,), 2.0 * 2.0 / (2 * math.sqrt(3))))
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    a.grad, b.grad = torch.ones(2), torch.ones(1)
    ClippedSGD([a, a, b], lr=0.5).step()
    assert torch.equal(a, torch.full((2,), -0.5)) and torch.equal(b, torch.zeros(1))


@pytest.mark.parametrize("bad", ["no", 1, None])
def test_per_tensor_must_be_a_bool(bad):
    """Issue case: 'no' switched per_tensor on."""
    w = torch.nn.Parameter(torch.ones(2))
    w.grad = torch.ones(2)
    with pytest.raises(TypeError, match="per_tensor must be a bool"):
        clip_grad_([w], 1.0, per_tensor=bad)
    with pytest.raises(TypeError, match="per_tensor must be a bool"):
        ClippedSGD([w], lr=0.1, per_tensor=bad)
