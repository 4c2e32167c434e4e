"""Half precision in taskloss.dynamics: clipping computes its norms and coefficients in float32/float64 (the float16
cases that zeroed, NaN'd, exceeded 1 or refused a finite gradient), the gradient penalties and flooding compute their
scalars in float32, and the second-order probes refuse float16/bfloat16 with a message that says what to pass."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskloss.dynamics as D

HALF = (torch.float16, torch.bfloat16)


def _soft64(norm: float, gamma: float) -> float:
    return gamma / (norm + gamma)


# ------------------------------------------------------------------------------------------ the cases
def test_soft_clipping_of_a_float16_norm_of_6e4_is_not_zero():
    c = D.clip_coefficient(torch.tensor(6e4, dtype=torch.float16), 1e4, "soft")
    assert c.dtype == torch.float32
    assert float(c) == pytest.approx(_soft64(float(torch.tensor(6e4, dtype=torch.float16)), 1e4), rel=1e-6)


@pytest.mark.parametrize("gamma", [1e-8, 1e-7, 1e-6, 3e-5])
def test_soft_clipping_of_a_zero_float16_gradient_is_one_not_nan(gamma):
    c = D.clip_coefficient(torch.tensor(0.0, dtype=torch.float16), gamma, "soft")
    assert float(c) == 1.0
    p = torch.zeros(4, dtype=torch.float16, requires_grad=True)
    p.grad = torch.zeros(4, dtype=torch.float16)
    D.clip_grad_([p], gamma, "soft")
    assert torch.equal(p.grad, torch.zeros(4, dtype=torch.float16))         # no NaN written


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_coefficients_lie_in_0_1_and_equal_the_float64_formula(dtype, mode):
    norms = torch.tensor([0.0, 6e-8, 1e-6, 1e-3, 0.1, 1.0, 3.0, 100.0, 6e4], dtype=dtype)
    for gamma in (1e-8, 1e-6, 1e-3, 0.1, 1.0, 1e3, 1e4, 6e4, 1e6):
        c = D.clip_coefficient(norms, gamma, mode)
        n = norms.double()
        want = (gamma / n).clamp(max=1.0) if mode == "hard" else gamma / (n + gamma)
        assert bool(((c > 0) & (c <= 1)).all()), (gamma, c)
        torch.testing.assert_close(c.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_a_finite_float16_gradient_with_a_norm_above_65504_is_clipped(per_tensor):
    a = torch.zeros(100, dtype=torch.float16, requires_grad=True)
    b = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    a.grad = torch.full((100,), 3e4, dtype=torch.float16)       # ‖a.grad‖ = 3e5 > 65504, every entry finite
    b.grad = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float16)
    g64 = [a.grad.double(), b.grad.double()]
    norm = D.clip_grad_([a, b], 1.0, per_tensor=per_tensor)
    want = torch.stack([g.norm() for g in g64]) if per_tensor else torch.cat(g64).norm()
    assert norm.dtype == torch.float32
    torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
    coef = (1.0 / want).clamp(max=1.0)
    for i, (p, g) in enumerate(zip((a, b), g64)):
        expect = g * (coef[i] if per_tensor else coef)
        torch.testing.assert_close(p.grad.double(), expect.to(torch.float16).double(), rtol=0, atol=0)


def test_a_small_coefficient_does_not_flush_a_float16_gradient_to_zero():
    p = torch.zeros(2, dtype=torch.float16, requires_grad=True)
    p.grad = torch.tensor([3e4, 4e4], dtype=torch.float16)       # ‖g‖ = 5e4, γ = 1e-3: c = 2e-8 < float16's tiniest
    D.clip_grad_([p], 1e-3)
    torch.testing.assert_close(p.grad.double(), torch.tensor([6e-4, 8e-4], dtype=torch.float64), rtol=1e-3, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_clipped_sgd_steps_a_half_model_like_float64_rounded(dtype):
    torch.manual_seed(0)
    w = torch.randn(6).mul(50).to(dtype)
    g = torch.randn(6).mul(2e4).to(dtype)
    p = w.clone().requires_grad_(True)
    p.grad = g.clone()
    opt = D.ClippedSGD([p], lr=0.1, gamma=2.0, mode="soft")
    opt.step()
    n = g.double().norm()
    want = w.double() - 0.1 * (2.0 / (n + 2.0)) * g.double()
    torch.testing.assert_close(p.detach().double(), want.to(dtype).double(), rtol=0, atol=float(torch.finfo(dtype).eps
                                                                                                * want.abs().max()))
    assert opt.last_norms[0].dtype == torch.float32


# ------------------------------------------------------------------------------ every public name, half
def _net(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)


X, Y = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 1, 0, 1])


def _penalty(c):
    w = c(torch.tensor([300.0, -200.0, 1.0])).requires_grad_(True)
    return D.gradient_norm_penalty(((w / 100) * w).sum(), [w])


def _per_example(c):
    m = _net(torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(c(p))
    m = m.to(c(torch.zeros(())).dtype)
    return D.per_example_gradient_penalty(m, lambda o, y: F.cross_entropy(o, y), c(X), Y)


def _sgd(c):
    p = c(torch.tensor([1.0, -2.0, 3.0])).requires_grad_(True)
    p.grad = c(torch.tensor([3e4, 4e4, 0.0]))
    D.ClippedSGD([p], lr=0.5, gamma=1.0).step()
    return p.detach()


def _clip(c):
    p = c(torch.zeros(3)).requires_grad_(True)
    p.grad = c(torch.tensor([3e4, 4e4, 1.0]))
    return torch.cat([D.clip_grad_([p], 10.0, "soft").reshape(1).double(), p.grad.double()])


def _trajectory(c):
    p = c(torch.tensor([1.0, 2.0, -1.0])).requires_grad_(True)
    probe = D.TrajectorySmoothness([p])
    (p * p).sum().backward()
    probe.before_step()
    with torch.no_grad():
        p.sub_(0.25 * p.grad)
    return torch.tensor(probe.after_step(lambda: (p * p).sum()).smoothness)


QUAD = lambda p: (p * p).sum()  # noqa: E731
#: name → function of ``c`` (the cast of the floating inputs): computed in float32 for half inputs
COMPUTES = {
    "clip_coefficient": lambda c: D.clip_coefficient(c(torch.tensor([0.0, 1.0, 6e4])), 1e4, "soft"),
    "clip_grad_": _clip,
    "ClippedSGD": _sgd,
    "gradient_norm_penalty": _penalty,
    "per_example_gradient_penalty": _per_example,
    "flooding": lambda c: D.flooding(c(torch.tensor(0.3)), 0.1),
    "TrajectorySmoothness": _trajectory,
}
#: name → function of a half dtype: refused (second-order probes)
REFUSES = {
    "loss_gradient": lambda dt: D.loss_gradient(QUAD, torch.ones(3, dtype=dt)),
    "hessian_vector_product": lambda dt: D.hessian_vector_product(QUAD, torch.ones(3, dtype=dt), torch.ones(3)),
    "top_hessian_eigenvalue": lambda dt: D.top_hessian_eigenvalue(QUAD, {"w": torch.ones(3, dtype=dt)}),
    "local_smoothness": lambda dt: D.local_smoothness(QUAD, torch.ones(3, dtype=dt), torch.zeros(3, dtype=dt)),
    "modified_loss": lambda dt: D.modified_loss(QUAD, torch.ones(3, dtype=dt), 0.1),
    "modified_gradient": lambda dt: D.modified_gradient(QUAD, torch.ones(3, dtype=dt), 0.1),
    "gradient_flow": lambda dt: D.gradient_flow(QUAD, torch.ones(3, dtype=dt), 0.1),
    "integrate_flow": lambda dt: D.integrate_flow(lambda y: -y, torch.ones(3, dtype=dt), 0.1, rtol=0.1),
}
NOT_TENSORS = {"CLIP_MODES", "native_kernels", "fit_l0_l1",           # a constant, a context, floats in
               "EigenResult", "SmoothnessSample", "SmoothnessFit", "FlowResult"}   # result records


def test_every_public_name_has_a_half_precision_policy():
    assert set(D.__all__) == set(COMPUTES) | set(REFUSES) | NOT_TENSORS


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(COMPUTES))
def test_half_inputs_get_float32_scalars(name, dtype):
    got = COMPUTES[name](lambda t: t.to(dtype))
    want = COMPUTES[name](lambda t: t.to(dtype).double())        # the same half values, in float64
    assert torch.isfinite(got).all()
    if name in ("ClippedSGD",):                                   # the step itself stays in the parameters' dtype
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.to(dtype).double(), rtol=0, atol=0)
        return
    if name == "clip_grad_":                                      # the norm in float32, the gradient in its dtype
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(got[1:], want[1:].to(dtype).double(), rtol=0, atol=0)
        return
    assert got.dtype == torch.float32 or name == "TrajectorySmoothness", got.dtype
    rtol = 2e-2 if name == "per_example_gradient_penalty" else 1e-6      # a half model's forward and gradients
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(REFUSES))
def test_second_order_probes_refuse_half_precision(name, dtype):
    with pytest.raises(TypeError, match=rf"{dtype}: the second-order probes .* run in float32 or float64"):
        REFUSES[name](dtype)


def test_gradient_norm_penalty_of_float16_gradients_above_256():
    w = torch.tensor([300.0, -200.0], dtype=torch.float16, requires_grad=True)
    pen = D.gradient_norm_penalty((w * (w * 0.5)).sum(), [w])    # ∇ = w: 300² overflows float16
    assert pen.dtype == torch.float32 and math.isclose(float(pen), 300.0 ** 2 + 200.0 ** 2, rel_tol=1e-6)
