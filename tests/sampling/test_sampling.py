"""Tests for taskloss.sampling.update: SNIS against float64 direct computation, the ε-ball partition function against
numerical quadrature / Monte Carlo / mpmath, the Gaussian (Newton) case, proposals, and bad inputs."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from taskloss.sampling import (
    GaussianMixtureProposal,
    GaussianProposal,
    UniformBallProposal,
    ball_expected_update,
    ball_log_partition,
    ball_log_partition_derivative,
    ball_partition,
    expected_update,
    gaussian_update_distribution,
    log_ball_volume,
    log_target,
    newton_direction,
    self_normalized_is,
    vmap_loss,
)

F64 = torch.float64


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------ SNIS
def snis_reference(lt, lq, values):
    lt, lq, v = (np.asarray(a, dtype=np.float64) for a in (lt, lq, values))
    lw = lt - lq
    m = lw.max()
    w = np.exp(lw - m) / np.exp(lw - m).sum()
    return (w[:, None] * v.reshape(len(w), -1)).sum(0).reshape(v.shape[1:]), w, 1 / (w**2).sum(), \
        m + np.log(np.exp(lw - m).mean())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_snis_matches_float64_direct(dtype):
    g = gen(1)
    lt, lq = 3 * torch.randn(50, generator=g, dtype=dtype), torch.randn(50, generator=g, dtype=dtype)
    values = torch.randn(50, 2, 3, generator=g, dtype=dtype)
    res = self_normalized_is(lt, lq, values)
    est, w, ess, log_z = snis_reference(lt, lq, values)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.estimate, torch.as_tensor(est, dtype=dtype), **tol)
    torch.testing.assert_close(res.weights, torch.as_tensor(w, dtype=dtype), **tol)
    torch.testing.assert_close(res.ess, torch.tensor(ess, dtype=dtype), **tol)
    torch.testing.assert_close(res.log_z, torch.tensor(log_z, dtype=dtype), **tol)
    torch.testing.assert_close(res.log_weights.exp(), res.weights)


def test_snis_batched_equals_loop():
    g = gen(2)
    lt, lq, v = torch.randn(4, 30, generator=g, dtype=F64), torch.randn(4, 30, generator=g, dtype=F64), \
        torch.randn(4, 30, 5, generator=g, dtype=F64)
    res = self_normalized_is(lt, lq, v)
    assert res.estimate.shape == (4, 5) and res.ess.shape == (4,) and res.log_z.shape == (4,)
    for b in range(4):
        one = self_normalized_is(lt[b], lq[b], v[b])
        torch.testing.assert_close(res.estimate[b], one.estimate)
        torch.testing.assert_close(res.ess[b], one.ess)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=40), st.floats(-1e3, 1e3))
def test_snis_ess_bounds_and_shift_invariance(log_w, shift):
    lt = torch.tensor(log_w, dtype=F64)
    lq = torch.zeros_like(lt)
    res = self_normalized_is(lt, lq, torch.ones_like(lt))
    k = len(log_w)
    assert 1 - 1e-9 <= float(res.ess) <= k + 1e-9
    torch.testing.assert_close(res.weights.sum(), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(res.estimate, torch.tensor(1.0, dtype=F64))  # E[1] = 1 whatever the weights
    shifted = self_normalized_is(lt + shift, lq, torch.ones_like(lt))
    torch.testing.assert_close(shifted.weights, res.weights)
    torch.testing.assert_close(shifted.log_z, res.log_z + shift)


@pytest.mark.parametrize("k", [1, 7, 1000])
def test_snis_ess_equals_k_for_equal_weights(k):
    lq = torch.randn(k, generator=gen(3), dtype=F64)
    res = self_normalized_is(lq + 2.5, lq, torch.randn(k, generator=gen(4), dtype=F64))  # p/q constant
    torch.testing.assert_close(res.ess, torch.tensor(float(k), dtype=F64))


def test_snis_ess_one_for_a_single_dominant_weight():
    lt = torch.tensor([0.0, -1e4, -1e4, -math.inf], dtype=F64)
    res = self_normalized_is(lt, torch.zeros(4, dtype=F64), torch.arange(4.0, dtype=F64))
    torch.testing.assert_close(res.ess, torch.tensor(1.0, dtype=F64))
    assert float(res.weights[3]) == 0.0


@pytest.mark.parametrize("scale", [1e4, -1e4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_snis_log_space_stability(scale, dtype):
    lt = torch.tensor([scale, scale - 1.0, scale - 3.0], dtype=dtype)
    lq = torch.zeros(3, dtype=dtype)
    v = torch.tensor([[1.0], [2.0], [3.0]], dtype=dtype)
    res = self_normalized_is(lt, lq, v)
    for t in (res.estimate, res.weights, res.ess, res.log_z):
        assert torch.isfinite(t).all()
    e = np.exp([0.0, -1.0, -3.0])
    # float32 carries ~1e-3 absolute error in log-weights of size 1e4 (its spacing there), float64 ~1e-12
    tol = 2e-3 if dtype == torch.float32 else 1e-10
    assert abs(float(res.estimate) - float((e / e.sum() * [1.0, 2.0, 3.0]).sum())) < tol
    assert abs(float(res.ess) - 1 / float(((e / e.sum()) ** 2).sum())) < tol
    assert abs(float(res.log_z) - (scale + math.log(e.sum() / 3))) < tol * abs(scale) * 1e-2 + tol


def test_snis_bad_inputs():
    ok = torch.zeros(3)
    with pytest.raises(ValueError, match="NaN"):
        self_normalized_is(torch.tensor([0.0, math.nan, 0.0]), ok, ok)
    with pytest.raises(ValueError, match="NaN"):
        self_normalized_is(ok, ok, torch.tensor([0.0, math.nan, 0.0]))
    with pytest.raises(ValueError, match="K >= 1"):
        self_normalized_is(torch.zeros(0), torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="shape"):
        self_normalized_is(ok, torch.zeros(4), ok)
    with pytest.raises(ValueError, match="values shape"):
        self_normalized_is(ok, ok, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\+inf"):
        self_normalized_is(torch.tensor([0.0, math.inf, 0.0]), ok, ok)
    with pytest.raises(ValueError, match="log_proposal"):
        self_normalized_is(ok, torch.tensor([0.0, -math.inf, 0.0]), ok)
    with pytest.raises(ValueError, match="zero target density"):
        self_normalized_is(torch.full((3,), -math.inf), ok, ok)
    with pytest.raises(TypeError):
        self_normalized_is(torch.zeros(3, dtype=torch.long), ok, ok)
    with pytest.raises(ValueError, match="at least one dimension"):
        self_normalized_is(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0))


# ---------------------------------------------------------------------------------------- log_target
def quadratic_loss(g, H):
    return lambda th: th @ g + 0.5 * ((th @ H) * th).sum(-1)


def test_log_target_direct_and_radius():
    g = torch.tensor([1.0, -2.0], dtype=F64)
    H = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=F64)
    loss = quadratic_loss(g, H)
    theta = torch.tensor([0.3, -0.1], dtype=F64)
    deltas = torch.randn(20, 2, generator=gen(5), dtype=F64)
    lt = log_target(loss, theta, deltas, 0.7)
    ref = -(loss(theta + deltas) - loss(theta[None])) / 0.7
    torch.testing.assert_close(lt, ref)
    lt_r = log_target(loss, theta, deltas, 0.7, radius=1.0)
    inside = deltas.norm(dim=-1) <= 1.0
    torch.testing.assert_close(lt_r[inside], ref[inside])
    assert torch.isneginf(lt_r[~inside]).all()


def test_vmap_loss_equals_batched_function():
    point = lambda t: torch.sin(t).sum() + (t**2).prod()  # noqa: E731
    x = torch.randn(9, 4, generator=gen(6), dtype=F64)
    torch.testing.assert_close(vmap_loss(point)(x), torch.stack([point(r) for r in x]))
    torch.testing.assert_close(vmap_loss(point, chunk_size=2)(x), torch.stack([point(r) for r in x]))


def test_log_target_bad_inputs():
    loss = lambda th: (th**2).sum(-1)  # noqa: E731
    th, de = torch.zeros(2), torch.ones(3, 2)
    for alpha in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="alpha"):
            log_target(loss, th, de, alpha)
    with pytest.raises(ValueError, match="dim"):
        log_target(loss, th, torch.ones(3, 5), 1.0)
    with pytest.raises(ValueError, match="empty"):
        log_target(loss, th, torch.ones(0, 2), 1.0)
    with pytest.raises(ValueError, match="ndim"):
        log_target(loss, th, torch.ones(2), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        log_target(loss, th, torch.tensor([[0.0, math.nan]]), 1.0)
    with pytest.raises(ValueError, match=r"\[K, d\] -> \[K\]"):
        log_target(lambda t: t, th, de, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        log_target(lambda t: torch.full((t.shape[0],), math.nan), th, de, 1.0)
    with pytest.raises(ValueError, match="at theta"):
        log_target(lambda t: torch.full((t.shape[0],), math.inf), th, de, 1.0)
    with pytest.raises(ValueError, match="radius"):
        log_target(loss, th, de, 1.0, radius=0.0)


def test_log_target_infinite_loss_is_zero_weight():
    loss = lambda th: torch.where(th[:, 0] > 0.5, torch.full_like(th[:, 0], math.inf), th[:, 0])  # noqa: E731
    de = torch.tensor([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    lt = log_target(loss, torch.zeros(2), de, 1.0)
    assert torch.isneginf(lt[1]) and float(lt[2]) == 1.0


# ------------------------------------------------------------------------------------------ proposals
def test_gaussian_proposal_log_prob_matches_torch_distributions():
    cov = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, -0.2], [0.0, -0.2, 0.5]], dtype=F64)
    mean = torch.tensor([1.0, -1.0, 0.5], dtype=F64)
    x = torch.randn(4, 6, 3, generator=gen(7), dtype=F64)
    ref = torch.distributions.MultivariateNormal(mean, covariance_matrix=cov)
    torch.testing.assert_close(GaussianProposal(mean, cov=cov).log_prob(x), ref.log_prob(x))
    std = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    ref_d = torch.distributions.Normal(mean, std)
    torch.testing.assert_close(GaussianProposal(mean, scale=std).log_prob(x), ref_d.log_prob(x).sum(-1))


def test_gaussian_proposal_sample_moments_and_reproducibility():
    cov = torch.tensor([[2.0, 0.6], [0.6, 0.5]], dtype=F64)
    p = GaussianProposal(torch.tensor([1.0, -2.0], dtype=F64), cov=cov)
    x = p.sample(200_000, gen(8))
    torch.testing.assert_close(x.mean(0), p.mean, atol=0.02, rtol=0)
    torch.testing.assert_close(torch.cov(x.T), cov, atol=0.03, rtol=0)
    torch.testing.assert_close(p.sample(5, gen(9)), p.sample(5, gen(9)))


def test_uniform_ball_proposal():
    for d in (1, 2, 5):
        p = UniformBallProposal(torch.full((d,), 0.5, dtype=F64), 2.0)
        x = p.sample(100_000, gen(d))
        r = (x - p.center).norm(dim=-1) / 2.0
        assert float(r.max()) <= 1.0 + 1e-12
        assert abs(float((r**d).mean()) - 0.5) < 0.01  # (r/R)^d is uniform on [0, 1]
        torch.testing.assert_close(x.mean(0), p.center, atol=0.02, rtol=0)
    p2 = UniformBallProposal(torch.zeros(2, dtype=F64), 2.0)
    lp = p2.log_prob(torch.tensor([[0.0, 1.0], [3.0, 0.0]], dtype=F64))
    assert abs(float(lp[0]) + math.log(math.pi * 4)) < 1e-12 and torch.isneginf(lp[1])
    assert abs(log_ball_volume(3, 2.0) - math.log(4 / 3 * math.pi * 8)) < 1e-12


def test_mixture_proposal_log_prob_and_weights():
    guide = torch.tensor([2.0, -1.0], dtype=F64)
    mix = GaussianMixtureProposal.mgs(guide, 0.5, 0.25)
    x = torch.randn(10, 2, generator=gen(10), dtype=F64)
    n0 = torch.distributions.MultivariateNormal(torch.zeros(2, dtype=F64), 0.25 * torch.eye(2, dtype=F64))
    n1 = torch.distributions.MultivariateNormal(guide, 0.25 * torch.eye(2, dtype=F64))
    ref = torch.logsumexp(torch.stack([n0.log_prob(x) + math.log(0.25), n1.log_prob(x) + math.log(0.75)]), 0)
    torch.testing.assert_close(mix.log_prob(x), ref)
    s = mix.sample(40_000, gen(11))
    frac_near_guide = float(((s - guide).norm(dim=-1) < (s).norm(dim=-1)).double().mean())
    assert abs(frac_near_guide - 0.75) < 0.02
    torch.testing.assert_close(mix.sample(7, gen(12)), mix.sample(7, gen(12)))


def test_proposal_bad_inputs():
    m = torch.zeros(2)
    with pytest.raises(ValueError, match="exactly one"):
        GaussianProposal(m)
    with pytest.raises(ValueError, match="scale"):
        GaussianProposal(m, scale=-1.0)
    with pytest.raises(ValueError, match="positive definite"):
        GaussianProposal(m, cov=torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="symmetric"):
        GaussianProposal(m, cov=torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        GaussianProposal(m, cov=torch.eye(3))
    with pytest.raises(ValueError, match="NaN"):
        GaussianProposal(torch.tensor([math.nan, 0.0]), scale=1.0)
    with pytest.raises(ValueError, match="n must be"):
        GaussianProposal(m, scale=1.0).sample(0)
    with pytest.raises(ValueError, match=r"\[\.\.\., 2\]"):
        GaussianProposal(m, scale=1.0).log_prob(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="radius"):
        UniformBallProposal(m, 0.0)
    with pytest.raises(ValueError, match="weights"):
        GaussianMixtureProposal([GaussianProposal(m, scale=1.0)], [-1.0])
    with pytest.raises(ValueError, match="same dimension"):
        GaussianMixtureProposal([GaussianProposal(m, scale=1.0), GaussianProposal(torch.zeros(3), scale=1.0)], [1, 1])
    with pytest.raises(ValueError, match="mix"):
        GaussianMixtureProposal.mgs(m, 1.0, 1.5)


# ---------------------------------------------------------------------------------- the ε-ball exactly
def z_quad(s, alpha, eps, d, moment=False):
    """Z (or Z' = −∫ Δ·ĝ/α e^{…}) by scipy quadrature over radius and polar angle."""
    if d == 1:
        f = (lambda t: -t / alpha * math.exp(-s * t / alpha)) if moment else (lambda t: math.exp(-s * t / alpha))
        return integrate.quad(f, -eps, eps, epsabs=0, epsrel=1e-12)[0]
    sphere = 2 * math.pi ** ((d - 1) / 2) / math.gamma((d - 1) / 2)  # area of S^{d-2}

    def f(phi, r):
        c = -r * math.cos(phi) / alpha if moment else 1.0
        return c * r ** (d - 1) * math.exp(-s * r * math.cos(phi) / alpha) * math.sin(phi) ** (d - 2)
    return sphere * integrate.dblquad(f, 0, eps, 0, math.pi, epsabs=0, epsrel=1e-11)[0]


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("d", [1, 2, 3, 10])
@pytest.mark.parametrize("s,alpha,eps", [(1.0, 1.0, 1.0), (3.0, 0.5, 0.5), (0.05, 2.0, 1.5), (4.0, 0.1, 1.0)])
def test_ball_partition_matches_quadrature(d, s, alpha, eps):
    z = z_quad(s, alpha, eps, d)
    assert abs(float(ball_partition(s, alpha, eps, d)) / z - 1) < 1e-8
    dz = z_quad(s, alpha, eps, d, moment=True)
    assert abs(float(ball_log_partition_derivative(s, alpha, eps, d)) / (dz / z) - 1) < 1e-7


def test_ball_partition_d1_closed_form_and_zero_gradient():
    s, alpha, eps = 2.0, 0.3, 0.7
    x = s * eps / alpha
    assert abs(float(ball_partition(s, alpha, eps, 1)) - 2 * alpha * math.sinh(x) / s) < 1e-10
    assert abs(float(ball_log_partition_derivative(s, alpha, eps, 1)) - eps / alpha * (1 / math.tanh(x) - 1 / x)) < 1e-12
    for d in (1, 2, 7):
        torch.testing.assert_close(ball_log_partition(0.0, 1.0, eps, d), torch.tensor(log_ball_volume(d, eps), dtype=F64))
        assert float(ball_log_partition_derivative(0.0, 1.0, eps, d)) == 0.0


@pytest.mark.parametrize("d", [2, 3, 10])
def test_ball_partition_and_update_against_monte_carlo(d):
    eps, alpha = 0.8, 0.4
    g = torch.linspace(-1.0, 1.5, d, dtype=F64)
    res = expected_update(lambda th: th @ g, torch.zeros(d, dtype=F64), alpha,
                          UniformBallProposal(torch.zeros(d, dtype=F64), eps), 200_000, gen(d))
    assert abs(float(res.log_z - ball_log_partition(g.norm(), alpha, eps, d))) < 0.01
    exact = ball_expected_update(g, alpha, eps)
    assert float((res.estimate - exact).norm()) < 0.01 * eps


def test_ball_against_mpmath_large_arguments():
    mpmath.mp.dps = 30
    for d, x in [(2, 1e3), (3, 5e4), (10, 700.0), (100, 2e3), (1000, 10.0), (1000, 1e4)]:
        nu = mpmath.mpf(d) / 2
        ref = d * mpmath.log(1) + nu * mpmath.log(2 * mpmath.pi / x) + mpmath.log(mpmath.besseli(nu, x))
        got = float(ball_log_partition(x, 1.0, 1.0, d))
        assert abs(got - float(ref)) < 1e-12 * max(1.0, abs(float(ref)))
        ratio = mpmath.besseli(nu + 1, x) / mpmath.besseli(nu, x)
        assert abs(float(ball_log_partition_derivative(x, 1.0, 1.0, d)) / float(ratio) - 1) < 1e-10


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1e8), st.floats(1e-6, 1e6), st.floats(1e-3, 1e3), st.integers(1, 200_000))
def test_ball_functions_finite_and_bounded(s, alpha, eps, d):
    lz = ball_log_partition(s, alpha, eps, d)
    dl = ball_log_partition_derivative(s, alpha, eps, d)
    assert torch.isfinite(lz) and torch.isfinite(dl)
    assert float(lz) >= log_ball_volume(d, eps) - 1e-9 * max(1.0, abs(log_ball_volume(d, eps)))  # Z ≥ vol
    assert 0.0 <= float(dl) * alpha / eps <= 1.0 + 1e-12  # |Δθ*| ≤ ε


def test_ball_log_partition_monotone_in_g_norm():
    s = torch.logspace(-4, 7, 300, dtype=F64)
    for d in (1, 3, 50, 10_000):
        lz = ball_log_partition(s, 0.1, 1.0, d)
        assert torch.isfinite(lz).all() and bool((lz.diff() >= -1e-9 * lz.abs()[1:]).all())
        r = ball_log_partition_derivative(s, 0.1, 1.0, d) * 0.1
        assert bool((r.diff() >= -1e-12).all())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=6), st.floats(1e-3, 1e3), st.floats(0.01, 10))
def test_ball_expected_update_is_along_minus_g(gl, alpha, eps):
    g = torch.tensor(gl, dtype=F64)
    u = ball_expected_update(g, alpha, eps)
    assert float(u.norm()) <= eps * (1 + 1e-12)
    if float(g.norm()) > 1e-6:
        assert float((u @ g)) <= 0
        cross = u * g.norm() + g * u.norm()  # zero iff u is a non-negative multiple of −g
        assert float(cross.norm()) <= 1e-9 * float(g.norm()) * max(float(u.norm()), 1e-300) + 1e-300
    else:
        assert float(u.norm()) <= eps


def test_ball_limits():
    g = torch.tensor([[3.0, -4.0, 0.0], [0.1, 0.0, 0.0]], dtype=F64)
    eps = 0.5
    torch.testing.assert_close(ball_expected_update(g, 1e-10, eps), -eps * g / g.norm(dim=-1, keepdim=True))
    big = 1e8
    torch.testing.assert_close(ball_expected_update(g, big, eps), -eps**2 * g / ((3 + 2) * big), rtol=1e-6, atol=0)
    assert float(ball_expected_update(g, 1e12, eps).norm()) < 1e-12
    alphas = torch.logspace(-3, 3, 50, dtype=F64)
    norms = ball_expected_update(g[0].expand(50, 3), alphas, eps).norm(dim=-1)
    assert bool((norms.diff() < 0).all())  # monotone: larger α, smaller step
    assert float(ball_expected_update(torch.zeros(3), 1.0, eps).abs().max()) == 0.0


def test_ball_bad_inputs():
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="radius"):
            ball_log_partition(1.0, 1.0, bad, 2)
        with pytest.raises(ValueError, match="alpha"):
            ball_log_partition(1.0, bad, 1.0, 2)
        with pytest.raises(ValueError, match="alpha"):
            ball_expected_update(torch.ones(2), bad, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        ball_log_partition_derivative(1.0, torch.tensor([1.0, -1.0]), 1.0, 2)
    with pytest.raises(ValueError, match="dim"):
        ball_log_partition(1.0, 1.0, 1.0, 0)
    with pytest.raises(ValueError, match="g_norm"):
        ball_log_partition(-1.0, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="g_norm"):
        ball_log_partition(torch.tensor([math.nan]), 1.0, 1.0, 2)
    with pytest.raises(TypeError):
        ball_log_partition("1", 1.0, 1.0, 2)
    with pytest.raises(OverflowError, match="ball_log_partition"):
        ball_partition(1e4, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="NaN"):
        ball_expected_update(torch.tensor([math.nan, 1.0]), 1.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        ball_expected_update(torch.tensor(1.0), 1.0, 1.0)


# --------------------------------------------------------------------------------- the quadratic case
def test_newton_direction_matches_numpy_and_batches():
    g = torch.randn(4, 3, generator=gen(13), dtype=F64)
    A = torch.randn(4, 3, 3, generator=gen(14), dtype=F64)
    H = A @ A.mT + torch.eye(3, dtype=F64)
    got = -newton_direction(H, g)
    ref = -np.linalg.solve(H.numpy(), g.numpy()[..., None])[..., 0]
    torch.testing.assert_close(got, torch.from_numpy(ref))
    torch.testing.assert_close((-newton_direction(H[0], g[0])), got[0])


def test_gaussian_update_distribution_closed_form():
    g = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    H = torch.tensor([[3.0, 1.0, 0.0], [1.0, 2.0, 0.3], [0.0, 0.3, 1.0]], dtype=F64)
    for alpha in (0.01, 1.0, 7.0):
        p = gaussian_update_distribution(H, g, alpha)
        torch.testing.assert_close(p.mean, torch.from_numpy(-np.linalg.solve(H.numpy(), g.numpy())))
        torch.testing.assert_close(p.covariance, alpha * torch.from_numpy(np.linalg.inv(H.numpy())))
        # log p(Δ) − [−(Δᵀg + ½ΔᵀHΔ)/α] is the constant −log Z
        d = torch.randn(5, 3, generator=gen(15), dtype=F64)
        diff = p.log_prob(d) + (d @ g + 0.5 * ((d @ H) * d).sum(-1)) / alpha
        torch.testing.assert_close(diff, diff[0].expand(5))


@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_gaussian_case_monte_carlo_converges_to_newton(alpha):
    g = torch.tensor([1.0, -2.0], dtype=F64)
    H = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=F64)
    res = expected_update(quadratic_loss(g, H), torch.zeros(2, dtype=F64), alpha,
                          GaussianProposal(torch.zeros(2, dtype=F64), scale=3.0), 200_000, gen(16))
    newton = -newton_direction(H, g)
    assert float((res.estimate - newton).norm()) < 0.03 * float(newton.norm())
    d = res.samples - res.estimate
    cov = (res.weights[:, None, None] * d[:, :, None] * d[:, None, :]).sum(0)
    torch.testing.assert_close(cov, alpha * torch.linalg.inv(H), atol=0.05 * alpha, rtol=0)


def test_quadratic_bad_inputs():
    g, H = torch.ones(2), torch.eye(2)
    with pytest.raises(ValueError, match="alpha"):
        gaussian_update_distribution(H, g, 0.0)
    with pytest.raises(ValueError, match="positive definite"):
        gaussian_update_distribution(-H, g, 1.0)
    with pytest.raises(ValueError, match="symmetric"):
        gaussian_update_distribution(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), g, 1.0)
    with pytest.raises(ValueError, match=r"hessian \[\.\.\., d, d\]"):
        newton_direction(torch.eye(3), g)
    with pytest.raises(ValueError, match="singular"):
        newton_direction(torch.zeros(2, 2), g)
    with pytest.raises(ValueError, match="NaN"):
        newton_direction(H, torch.tensor([math.nan, 0.0]))


def test_expected_update_bad_inputs():
    loss = lambda th: (th**2).sum(-1)  # noqa: E731
    prop = GaussianProposal(torch.zeros(2), scale=1.0)
    with pytest.raises(ValueError, match="n_samples"):
        expected_update(loss, torch.zeros(2), 1.0, prop, 0)
    with pytest.raises(TypeError, match="proposal"):
        expected_update(loss, torch.zeros(2), 1.0, object(), 10)
    with pytest.raises(ValueError, match="alpha"):
        expected_update(loss, torch.zeros(2), -1.0, prop, 10)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_follows_device():
    dev = torch.device("cuda")
    g = torch.tensor([1.0, -2.0], device=dev, dtype=F64)
    H = torch.tensor([[3.0, 1.0], [1.0, 2.0]], device=dev, dtype=F64)
    prop = GaussianProposal(torch.zeros(2, device=dev, dtype=F64), scale=3.0)
    res = expected_update(quadratic_loss(g, H), torch.zeros(2, device=dev, dtype=F64), 0.5, prop, 50_000,
                          torch.Generator(device=dev).manual_seed(0))
    assert res.estimate.device.type == "cuda"
    assert float((res.estimate - (-newton_direction(H, g))).norm()) < 0.05
    mix = GaussianMixtureProposal.mgs(torch.ones(2, device=dev), 0.5, 0.5)
    assert mix.sample(10, torch.Generator().manual_seed(0)).device.type == "cuda"
    assert ball_expected_update(g, 0.5, 1.0).device.type == "cuda"
    assert ball_log_partition(g.norm(), 0.5, 1.0, 2).device.type == "cuda"
