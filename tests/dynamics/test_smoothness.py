"""Smoothness probes against references: Hessian-vector products against the dense torch.func Hessian and
double backward, power iteration against eigvalsh, the trajectory ratio against its closed form on a quadratic,
the autograd probe against the functional one, and the (L0, L1) fit against numpy and its own constraints."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import V, make_lm, tokens
from torch.func import hessian
from torch.nn.attention import SDPBackend, sdpa_kernel


from taskloss.dynamics import (
    ClippedSGD,
    TrajectorySmoothness,
    fit_l0_l1,
    hessian_vector_product,
    local_smoothness,
    loss_gradient,
    top_hessian_eigenvalue,
)
from taskloss.models import MLP
from taskloss.parameter_vectors import flatten, functional_loss

D = torch.float64


def _mlp_problem(seed: int = 0):
    torch.manual_seed(seed)
    model = MLP(5, (7,), 3, activation="tanh").to(D)
    x = torch.randn(20, 5, dtype=D)
    y = torch.randint(0, 3, (20,))
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), x)
    return model, f, theta


def _dense_hessian(f, theta) -> torch.Tensor:
    names = list(theta)
    flat = flatten(theta)

    def g(v):
        out, i = {}, 0
        for k in names:
            out[k] = v[i:i + theta[k].numel()].view_as(theta[k])
            i += theta[k].numel()
        return f(out)

    return hessian(g)(flat)


def test_gradient_matches_autograd():
    model, f, theta = _mlp_problem()
    loss, g = loss_gradient(f, theta)
    model.zero_grad()
    ref = f(dict(model.named_parameters()))
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    for k, p in model.named_parameters():
        torch.testing.assert_close(g[k], p.grad)


def test_hvp_matches_dense_hessian():
    _, f, theta = _mlp_problem()
    H = _dense_hessian(f, theta)
    v = {k: torch.randn_like(t) for k, t in theta.items()}
    torch.testing.assert_close(flatten(hessian_vector_product(f, theta, v)), H @ flatten(v))


@pytest.mark.parametrize("kind", ["lstm", "pre", "realformer"])
def test_hvp_on_language_models_matches_double_backward(kind):
    """Forward-over-reverse (with fused RNN kernels disabled) equals reverse-over-reverse."""
    model = make_lm(kind).double()
    x, y = tokens(3, 7), tokens(3, 7, seed=2)
    f, theta = functional_loss(model, lambda lg: F.cross_entropy(lg.reshape(-1, V), y.reshape(-1)), x)
    v = {k: torch.randn_like(t) for k, t in theta.items()}
    params = [p for p in model.parameters()]
    with sdpa_kernel(SDPBackend.MATH):   # the fused CPU attention kernel has no double backward
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        g = torch.autograd.grad(loss, params, create_graph=True)
        ref = torch.autograd.grad(sum((a * b).sum() for a, b in zip(g, v.values())), params)
    out = hessian_vector_product(f, theta, v)
    for r, k in zip(ref, theta):
        torch.testing.assert_close(out[k], r)


@pytest.mark.parametrize("which", ["magnitude", "largest"])
def test_power_iteration_matches_eigvalsh(which):
    _, f, theta = _mlp_problem(seed=1)
    evals = torch.linalg.eigvalsh(_dense_hessian(f, theta))
    ref = evals[evals.abs().argmax()] if which == "magnitude" else evals[-1]
    res = top_hessian_eigenvalue(f, theta, which=which, max_iter=2000, tol=1e-12,
                                 generator=torch.Generator().manual_seed(0))
    assert res.converged
    torch.testing.assert_close(torch.tensor(res.value, dtype=D), ref, rtol=1e-6, atol=1e-8)
    assert res.residual < 1e-3 * abs(res.value)


def test_largest_eigenvalue_when_a_negative_one_dominates():
    A = torch.diag(torch.tensor([-5.0, -1.0, 0.5, 2.0], dtype=D))
    Q = torch.linalg.qr(torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(3)))[0]
    A = Q @ A @ Q.T
    f = lambda t: 0.5 * t @ A @ t  # noqa: E731
    theta = torch.ones(4, dtype=D)
    gen = torch.Generator().manual_seed(1)
    mag = top_hessian_eigenvalue(f, theta, "magnitude", max_iter=500, tol=1e-13, generator=gen)
    top = top_hessian_eigenvalue(f, theta, "largest", max_iter=500, tol=1e-13, generator=gen)
    assert mag.value == pytest.approx(-5.0, rel=1e-8) and top.value == pytest.approx(2.0, rel=1e-6)


def test_local_smoothness_on_a_quadratic_is_the_rayleigh_ratio():
    """f = ½θᵀAθ: ∇f(θ') − ∇f(θ) = A(θ' − θ), so the ratio is ‖Ad‖/‖d‖ exactly, bounded by ‖A‖."""
    g = torch.Generator().manual_seed(0)
    B = torch.randn(6, 6, dtype=D, generator=g)
    A = B @ B.T
    theta, d = torch.randn(6, dtype=D, generator=g), torch.randn(6, dtype=D, generator=g)
    s = local_smoothness(lambda t: 0.5 * t @ A @ t, theta, theta + 0.1 * d)
    assert s.smoothness == pytest.approx(float((A @ d).norm() / d.norm()), rel=1e-12)
    assert s.grad_norm == pytest.approx(float((A @ theta).norm()), rel=1e-12)
    assert s.smoothness <= float(torch.linalg.eigvalsh(A)[-1]) * (1 + 1e-12)


def test_trajectory_probe_equals_functional_probe_and_survives_a_clipping_optimizer():
    model = make_lm("lstm").double()
    x, y = tokens(3, 7), tokens(3, 7, seed=2)

    def closure():
        return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))

    f, theta0 = functional_loss(model, lambda lg: F.cross_entropy(lg.reshape(-1, V), y.reshape(-1)), x)
    theta0 = {k: t.clone() for k, t in theta0.items()}
    opt = ClippedSGD(model.parameters(), lr=0.5, gamma=0.01)
    probe = TrajectorySmoothness(model.parameters())
    opt.zero_grad()
    closure().backward()
    probe.before_step()
    opt.step()                                   # edits .grad in place (clipping); the probe kept the original
    sample = probe.after_step(closure)
    theta1 = {k: p.detach().clone() for k, p in model.named_parameters()}
    ref = local_smoothness(f, theta0, theta1)
    assert sample.smoothness == pytest.approx(ref.smoothness, rel=1e-9)
    assert sample.grad_norm == pytest.approx(ref.grad_norm, rel=1e-9)
    assert sample.step_norm == pytest.approx(0.5 * 0.01, rel=1e-9)   # a hard-clipped step has length η·γ
    with pytest.raises(RuntimeError, match="before_step"):
        probe.after_step(closure)


def test_fit_least_squares_matches_polyfit_and_envelope_bounds_every_point():
    rng = np.random.default_rng(0)
    g = rng.uniform(0, 10, 200)
    s = 1.0 + 2.0 * g - rng.uniform(0, 1, 200)       # points under the line s = 1 + 2g, all positive
    fit = fit_l0_l1(g, s)
    L1, L0 = np.polyfit(g, s, 1)
    assert (fit.L0, fit.L1) == pytest.approx((L0, L1))
    assert fit.r == pytest.approx(np.corrcoef(g, s)[0, 1])
    bound = fit.envelope_L0 + fit.envelope_L1 * g
    assert (bound >= s - 1e-9).all() and np.isclose(bound, s, atol=1e-7).sum() >= 1
    assert fit.envelope_L1 == pytest.approx(2.0, abs=0.1) and fit.envelope_L0 == pytest.approx(1.0, abs=0.5)


def test_fit_recovers_an_exact_line():
    g = np.linspace(0, 5, 30)
    fit = fit_l0_l1(g, 0.5 + 3.0 * g)
    assert (fit.L0, fit.L1, fit.r) == pytest.approx((0.5, 3.0, 1.0))
    assert (fit.envelope_L0, fit.envelope_L1) == pytest.approx((0.5, 3.0), abs=1e-7)


def test_trajectory_probe_counts_a_shared_parameter_once():
    """Issue case: TrajectorySmoothness was √2 off for a parameter listed twice."""
    def run(params_of):
        w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        closure = lambda: (w ** 4).sum()  # noqa: E731
        closure().backward()
        probe = TrajectorySmoothness(params_of(w))
        probe.before_step()
        with torch.no_grad():
            w.sub_(0.01 * w.grad)
        return probe.after_step(closure)

    once, twice = run(lambda w: [w]), run(lambda w: [w, w])
    assert once == twice
