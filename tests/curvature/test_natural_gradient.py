"""Tests for taskloss.curvature.natural_gradient: references are float64 direct computation, closed forms,
torch.distributions and scipy.optimize."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from torch.distributions import MultivariateNormal, kl_divergence
from torch import nn

from taskloss.curvature import (
    CoupledGaussian,
    NaturalGaussianVI,
    NaturalGradientDescent,
    bonnet_gradient,
    gaussian_fisher,
    gaussian_from_expectation,
    gaussian_from_natural,
    gaussian_kl,
    gaussian_log_partition,
    gaussian_natural_fisher,
    gaussian_natural_gradient,
    gaussian_samples,
    gaussian_to_expectation,
    gaussian_to_natural,
    gaussian_vi_natural_update,
    natural_gradient,
    price_gradient,
    sym_to_vec,
    trust_region_step,
    vec_to_sym,
)

D = torch.float64


def spd(d, seed, batch=()):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, d, d, generator=g, dtype=D)
    return A @ A.transpose(-1, -2) + 0.5 * torch.eye(d, dtype=D)


def vec(d, seed, batch=()):
    return torch.randn(*batch, d, generator=torch.Generator().manual_seed(seed), dtype=D)


# ------------------------------------------------------------------------------- natural gradient step
def test_natural_gradient_matches_solve_batched_and_damped():
    F, g = spd(4, 0, (3,)), vec(4, 1, (3,))
    torch.testing.assert_close(natural_gradient(F, g), torch.linalg.solve(F, g))
    torch.testing.assert_close(natural_gradient(F, g, damping=0.7),
                               torch.linalg.solve(F + 0.7 * torch.eye(4, dtype=D), g))


def test_natural_gradient_singular_needs_damping():
    u = vec(3, 2)
    F = torch.outer(u, u)                                        # rank 1
    with pytest.raises(ValueError, match="positive definite"):
        natural_gradient(F, u)
    out = natural_gradient(F, u, damping=1e-3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, u / (u @ u + 1e-3))


@pytest.mark.parametrize("F,g,kw,err", [
    (torch.eye(3, dtype=D), torch.ones(2, dtype=D), {}, ValueError),             # shape mismatch
    (torch.ones(3, 2, dtype=D), torch.ones(2, dtype=D), {}, ValueError),         # not square
    (torch.eye(2, dtype=D), torch.tensor([1.0, float("nan")], dtype=D), {}, ValueError),
    (torch.eye(2, dtype=D), torch.ones(2, dtype=D), {"damping": -1.0}, ValueError),
    (torch.eye(2, dtype=torch.long), torch.ones(2, dtype=D), {}, TypeError),
    (torch.eye(2, dtype=D), torch.ones(0, dtype=D), {}, ValueError),
    (-torch.eye(2, dtype=D), torch.ones(2, dtype=D), {}, ValueError),            # negative definite
    (torch.tensor([[2.0, 1.0], [0.0, 2.0]], dtype=D), torch.ones(2, dtype=D), {}, ValueError),  # not symmetric
])
def test_natural_gradient_bad_input(F, g, kw, err):
    with pytest.raises(err):
        natural_gradient(F, g, **kw)


@pytest.mark.parametrize("eps", [1e-3, 0.1, 2.0])
def test_trust_region_step_matches_slsqp(eps):
    F, g = spd(3, 5), vec(3, 6)
    delta = trust_region_step(F, g, eps)
    Fn, gn = F.numpy(), g.numpy()
    res = minimize(lambda x: gn @ x, np.zeros(3), jac=lambda x: gn, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda x: eps - 0.5 * x @ Fn @ x,
                                 "jac": lambda x: -Fn @ x}], options={"ftol": 1e-12, "maxiter": 500})
    assert res.success
    np.testing.assert_allclose(delta.numpy(), res.x, rtol=1e-4, atol=1e-6 * math.sqrt(eps))
    torch.testing.assert_close(0.5 * delta @ F @ delta, torch.tensor(eps, dtype=D))   # constraint active


def test_trust_region_step_zero_gradient_and_bad_input():
    assert torch.equal(trust_region_step(torch.eye(2, dtype=D), torch.zeros(2, dtype=D), 0.1),
                       torch.zeros(2, dtype=D))
    with pytest.raises(ValueError):
        trust_region_step(torch.eye(2, dtype=D), torch.ones(2, dtype=D), 0.0)
    with pytest.raises(ValueError):
        trust_region_step(torch.eye(2, dtype=D), torch.ones(2, dtype=D), float("nan"))


def test_optimizer_one_newton_step_on_least_squares():
    X, y = vec(3, 7, (20,)), vec(20, 8)
    model = torch.nn.Linear(3, 1, bias=False).to(D)
    H = X.T @ X / 20                                             # Gauss-Newton = Fisher for unit-variance Gaussian
    opt = NaturalGradientDescent(model.parameters(), fisher=lambda: H, lr=1.0)

    def closure():
        opt.zero_grad()
        loss = 0.5 * (model(X).squeeze(-1) - y).square().mean()
        loss.backward()
        return loss

    loss0 = opt.step(closure)
    assert loss0 > 0
    w_star = torch.linalg.solve(X.T @ X, X.T @ y)
    torch.testing.assert_close(model.weight.detach().squeeze(0), w_star)


def test_optimizer_bad_input():
    p = torch.nn.Parameter(torch.zeros(2, dtype=D))
    with pytest.raises(TypeError):
        NaturalGradientDescent([p], fisher=torch.eye(2))
    with pytest.raises(ValueError):
        NaturalGradientDescent([p], fisher=lambda: torch.eye(2, dtype=D), lr=0.0)
    with pytest.raises(ValueError):
        NaturalGradientDescent([p], fisher=lambda: torch.eye(2, dtype=D), damping=-1.0)
    opt = NaturalGradientDescent([p], fisher=lambda: torch.eye(3, dtype=D))
    opt.step()                                    # no parameter has a gradient: nothing to do (as torch.optim)
    assert torch.equal(p, torch.zeros(2, dtype=D))
    p.grad = torch.ones(2, dtype=D)
    with pytest.raises(ValueError, match="shape"):
        opt.step()
    opt.param_groups[0]["damping"] = -1.0         # hyperparameters are checked when used
    with pytest.raises(ValueError, match="damping"):
        opt.step()
    opt.param_groups[0].update(damping=0.0, lr=float("nan"))
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    p.grad = torch.tensor([1.0, float("nan")], dtype=D)
    opt2 = NaturalGradientDescent([p], fisher=lambda: torch.eye(2, dtype=D))
    with pytest.raises(ValueError, match="gradient contains NaN"):
        opt2.step()
    with pytest.raises(TypeError, match="must return a tensor"):
        p.grad = torch.ones(2, dtype=D)
        NaturalGradientDescent([p], fisher=lambda: [[1.0]]).step()


def test_optimizer_skips_parameters_without_gradient_and_damps_per_group():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).to(D)
    X, y = vec(3, 1, (10,)), torch.randint(0, 2, (10,), generator=torch.Generator().manual_seed(2))
    model[0].weight.requires_grad_(False)                    # frozen: no .grad, skipped as torch.optim does
    from taskloss.curvature import ggn_matrix, nll_loss
    groups = [{"params": model[0].parameters(), "damping": 0.5}, {"params": model[2].parameters(), "lr": 0.3}]
    for full in (False, True):
        w0 = [p.detach().clone() for p in model.parameters()]
        params = {k: p for k, p in model.named_parameters()} if full else None
        opt = NaturalGradientDescent(groups if not full else
                                     [{"params": model[0].parameters(), "damping": 0.5},
                                      {"params": model[2].parameters(), "lr": 0.3}],
                                     fisher=lambda: ggn_matrix(model, params, X), lr=0.7, damping=0.1)
        opt.zero_grad()
        nll_loss(model(X), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        F = ggn_matrix(model, None, X)                       # the trainable parameters only
        lam = torch.tensor([0.5] * 4 + [0.1] * 10, dtype=D)  # bias of layer 0 (group 1), then layer 2 (group 2)
        step = torch.linalg.solve(F + torch.diag(lam), g)
        opt.step()
        torch.testing.assert_close(model[0].weight, w0[0], rtol=0, atol=0)
        torch.testing.assert_close(model[0].bias, w0[1] - 0.7 * step[:4])
        torch.testing.assert_close(torch.cat([model[2].weight.reshape(-1), model[2].bias]),
                                   torch.cat([w0[2].reshape(-1), w0[3]]) - 0.3 * step[4:])
        with torch.no_grad():
            for p, w in zip(model.parameters(), w0):
                p.copy_(w)


# ------------------------------------------------------------------------------------ Gaussian geometry
@pytest.mark.parametrize("d", [1, 2, 5])
def test_gaussian_kl_matches_torch_distributions(d):
    m0, m1, V0, V1 = vec(d, 1, (4,)), vec(d, 2, (4,)), spd(d, 3, (4,)), spd(d, 4, (4,))
    ref = kl_divergence(MultivariateNormal(m0, V0), MultivariateNormal(m1, V1))
    torch.testing.assert_close(gaussian_kl(m0, V0, m1, V1), ref)
    torch.testing.assert_close(gaussian_kl(m0, V0, m0, V0), torch.zeros(4, dtype=D), atol=1e-12, rtol=0)


def test_gaussian_kl_bad_input():
    m, V = vec(2, 0), spd(2, 0)
    with pytest.raises(ValueError, match="positive definite"):
        gaussian_kl(m, -V, m, V)
    with pytest.raises(ValueError):
        gaussian_kl(vec(3, 0), V, m, V)
    with pytest.raises(ValueError):
        gaussian_kl(m, V, vec(3, 0), spd(3, 0))
    with pytest.raises(TypeError):
        gaussian_kl(m.long(), V, m, V)


def _mean_logstd(theta):
    """1-D Gaussian with mean θ₀ and log-std θ₁: Fisher diag(1/σ², 2)."""
    return theta[:1], torch.exp(2 * theta[1]).reshape(1, 1)


def test_gaussian_fisher_closed_forms_and_kl_hessian():
    theta = torch.tensor([0.3, -0.4], dtype=D)
    s2 = math.exp(-0.8)
    torch.testing.assert_close(gaussian_fisher(_mean_logstd, theta), torch.tensor([[1 / s2, 0], [0, 2.0]], dtype=D))
    cg = CoupledGaussian()
    torch.testing.assert_close(gaussian_fisher(lambda t: (cg.mean(t), torch.eye(2, dtype=D)), theta), cg.fisher())

    def fam(t):                                                  # nonlinear 2-D family, correlated covariance
        L = torch.stack([torch.stack([t[2].exp(), 0 * t[0]]), torch.stack([torch.tanh(t[0]), t[3].exp()])])
        return torch.stack([t[0] * t[1], t[1] ** 2]), L @ L.T

    t = torch.tensor([0.5, -0.7, 0.2, -0.3], dtype=D)
    m, V = fam(t)
    kl_hess = torch.func.hessian(lambda dl: gaussian_kl(m, V, *fam(t + dl)))(torch.zeros(4, dtype=D))
    torch.testing.assert_close(gaussian_fisher(fam, t), kl_hess)
    with pytest.raises(ValueError):
        gaussian_fisher(fam, t.reshape(2, 2))


def test_coupled_gaussian_closed_forms():
    cg = CoupledGaussian()
    F = cg.fisher()
    torch.testing.assert_close(F, torch.tensor([[9 + 1 / 9, 1.0], [1.0, 1 / 9]], dtype=D))
    theta = torch.tensor([0.4, 1.3], dtype=D, requires_grad=True)
    (g,) = torch.autograd.grad(cg.loss(theta), theta)
    torch.testing.assert_close(cg.grad(theta.detach()), g)
    x = vec(2, 3, (5,))
    ref = MultivariateNormal(cg.mean(theta.detach()), torch.eye(2, dtype=D)).log_prob(x)
    torch.testing.assert_close(cg.log_prob(x, theta.detach()), ref)
    # KL(N(0,I) || p_theta) equals the loss
    torch.testing.assert_close(cg.loss(theta.detach()),
                               gaussian_kl(torch.zeros(2, dtype=D), torch.eye(2, dtype=D),
                                           cg.mean(theta.detach()), torch.eye(2, dtype=D)))


@pytest.mark.parametrize("natural,lr", [(False, 1 / 45), (True, 0.2)])
def test_coupled_gaussian_closed_form_trajectory(natural, lr):
    cg = CoupledGaussian()
    theta = torch.tensor([1.0, -1.0], dtype=D)
    F = cg.fisher()
    sim = [cg.loss(theta)]
    for _ in range(300):
        g = cg.grad(theta)
        theta = theta - lr * (natural_gradient(F, g) if natural else g)
        sim.append(cg.loss(theta))
    steps = torch.tensor([0, 1, 10, 100, 300])
    torch.testing.assert_close(cg.kl_after_steps(torch.tensor([1.0, -1.0], dtype=D), lr, steps, natural),
                               torch.stack(sim)[steps], rtol=1e-9, atol=1e-300)
    with pytest.raises(ValueError):
        cg.kl_after_steps(torch.ones(2, dtype=D), lr, -1, natural)
    with pytest.raises(ValueError):
        cg.mean(torch.ones(3, dtype=D))


# -------------------------------------------------------------------- exponential-family parameters
@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_conversions_round_trip(d, seed):
    m, V = vec(d, seed), spd(d, seed + 1)
    torch.testing.assert_close(gaussian_from_natural(*gaussian_to_natural(m, V)), (m, V))
    torch.testing.assert_close(gaussian_from_expectation(*gaussian_to_expectation(m, V)), (m, V))
    l1, l2 = gaussian_to_natural(m, V)
    torch.testing.assert_close(l2, -0.5 * torch.linalg.inv(V))
    torch.testing.assert_close(vec_to_sym(sym_to_vec(V)), V)
    torch.testing.assert_close(sym_to_vec(V) @ sym_to_vec(l2), (V * l2).sum())      # isometry


def test_log_partition_normalizes_and_gradient_is_expectation():
    m, V = vec(3, 0), spd(3, 1)
    l1, l2 = gaussian_to_natural(m, V)
    z = vec(3, 2, (6,))
    logq = z @ l1 + torch.einsum("si,ij,sj->s", z, l2, z) - gaussian_log_partition(l1, l2)
    torch.testing.assert_close(logq, MultivariateNormal(m, V).log_prob(z))
    v = torch.cat([l1, sym_to_vec(l2)]).requires_grad_()
    (gA,) = torch.autograd.grad(gaussian_log_partition(v[:3], vec_to_sym(v[3:])), v)
    mu1, mu2 = gaussian_to_expectation(m, V)
    torch.testing.assert_close(gA, torch.cat([mu1, sym_to_vec(mu2)]))


def test_natural_fisher_1d_closed_form_and_sufficient_statistic_covariance():
    m, v = 0.7, 1.9
    l1, l2 = gaussian_to_natural(torch.tensor([m], dtype=D), torch.tensor([[v]], dtype=D))
    ref = torch.tensor([[v, 2 * m * v], [2 * m * v, 2 * v ** 2 + 4 * m ** 2 * v]], dtype=D)  # Cov[(z, z²)]
    torch.testing.assert_close(gaussian_natural_fisher(l1, l2), ref)
    mm, V = vec(2, 3), spd(2, 4)
    F = gaussian_natural_fisher(*gaussian_to_natural(mm, V))
    z = gaussian_samples(mm, V, 200_000, torch.Generator().manual_seed(0))
    T = torch.cat([z, sym_to_vec(z.unsqueeze(-1) * z.unsqueeze(-2))], -1)
    torch.testing.assert_close(F, torch.cov(T.T), rtol=0.05, atol=0.05)


def test_conversion_bad_input():
    with pytest.raises(ValueError, match="negative definite"):
        gaussian_from_natural(torch.ones(2, dtype=D), torch.eye(2, dtype=D))
    with pytest.raises(ValueError):
        gaussian_from_expectation(torch.ones(2, dtype=D), torch.eye(2, dtype=D))   # μ₂ - μ₁μ₁ᵀ not PD
    with pytest.raises(ValueError):
        vec_to_sym(torch.ones(4, dtype=D))
    with pytest.raises(ValueError):
        gaussian_to_natural(torch.ones(2, dtype=D), torch.ones(2, 3, dtype=D))
    with pytest.raises(ValueError):
        gaussian_natural_fisher(torch.ones(2, 2, dtype=D), -torch.eye(2, dtype=D))
    with pytest.raises(ValueError):
        gaussian_log_partition(torch.ones(2, dtype=D), torch.eye(2, dtype=D))


# ------------------------------------------------------------------------------------ Bonnet / Price
A_VEC = torch.tensor([0.3, -0.5], dtype=D)


def f_exp(z):
    return torch.exp(z @ A_VEC)


def exact_exp(m, V):                                             # E[exp(aᵀz)] = exp(aᵀm + ½aᵀVa)
    return torch.exp(A_VEC @ m + 0.5 * A_VEC @ V @ A_VEC)


def test_bonnet_price_unbiased_against_closed_form():
    m, V = torch.tensor([0.2, -0.4], dtype=D), spd(2, 9)
    mr, Vr = m.clone().requires_grad_(), V.clone().requires_grad_()
    gm, gV = torch.autograd.grad(exact_exp(mr, Vr), (mr, Vr))
    gen = torch.Generator().manual_seed(1)
    # average of many independent small-sample estimates: unbiased => within a few standard errors
    reps_b = torch.stack([bonnet_gradient(f_exp, m, V, 16, gen).mean for _ in range(400)])
    reps_p = torch.stack([price_gradient(f_exp, m, V, 16, gen).mean for _ in range(400)])
    for reps, exact in ((reps_b, gm), (reps_p, gV)):
        se = reps.std(0) / math.sqrt(reps.shape[0])
        assert ((reps.mean(0) - exact).abs() < 4 * se + 1e-12).all()
    est = bonnet_gradient(f_exp, m, V, 4000, gen)
    assert ((est.mean - gm).abs() < 5 * est.stderr).all()


def test_price_exact_for_quadratic_and_natural_gradient():
    B, c = -spd(2, 3), vec(2, 4)
    f = lambda z: 0.5 * z @ B @ z + c @ z
    m, V = vec(2, 5), spd(2, 6)
    est = price_gradient(f, m, V, 5)
    torch.testing.assert_close(est.mean, 0.5 * B)
    torch.testing.assert_close(est.stderr, torch.zeros(2, 2, dtype=D))
    # natural gradient of E[f] w.r.t. λ = gradient w.r.t. μ (autograd through the closed form in μ)
    mu1, mu2 = gaussian_to_expectation(m, V)
    mu1, mu2 = mu1.clone().requires_grad_(), mu2.clone().requires_grad_()
    Ef = 0.5 * (B * (mu2 - torch.outer(mu1, mu1) + torch.outer(mu1, mu1))).sum() + c @ mu1
    g1, g2 = torch.autograd.grad(Ef, (mu1, mu2))
    n1, n2 = gaussian_natural_gradient(f, m, V, 20_000, torch.Generator().manual_seed(0))
    torch.testing.assert_close(n2.mean, g2)
    assert ((n1.mean - g1).abs() < 5 * n1.stderr).all()
    assert (n1.stderr < 0.1).all()


def test_estimators_bad_input():
    m, V = vec(2, 0), spd(2, 0)
    with pytest.raises(ValueError):
        bonnet_gradient(f_exp, m, V, 0)
    with pytest.raises(TypeError):
        price_gradient(f_exp, m, V, 2.5)
    with pytest.raises(ValueError):
        gaussian_samples(m, -V, 3)
    with pytest.raises(ValueError):
        gaussian_samples(m.reshape(1, 2), V, 3)
    with pytest.raises(ValueError):
        gaussian_natural_gradient(f_exp, m, torch.full((2, 2), float("nan"), dtype=D), 3)


# ------------------------------------------------------------------------------- Gaussian VI update
def test_vi_update_is_natural_parameter_interpolation():
    d, rho = 3, 0.3
    m, P, m0, P0 = vec(d, 0), spd(d, 1), vec(d, 2), spd(d, 3)
    g, H = vec(d, 4), -spd(d, 5)
    m_new, P_new = gaussian_vi_natural_update(m, P, g, H, rho, m0, P0)
    l1, l2 = gaussian_to_natural(m, torch.linalg.inv(P))
    p1, p2 = gaussian_to_natural(m0, torch.linalg.inv(P0))
    n1, n2 = (1 - rho) * l1 + rho * (p1 + g - H @ m), (1 - rho) * l2 + rho * (p2 + 0.5 * H)
    ref_m, ref_V = gaussian_from_natural(n1, n2)
    torch.testing.assert_close(m_new, ref_m)
    torch.testing.assert_close(P_new, torch.linalg.inv(ref_V))


def test_vi_conjugate_exact_in_one_step_and_stochastic_convergence():
    d = 2
    B, c = -spd(d, 7), vec(d, 8)                                 # Gaussian log-likelihood ½zᵀBz + cᵀz
    m0, P0 = torch.zeros(d, dtype=D), torch.eye(d, dtype=D)
    P_post = P0 - B
    m_post = torch.linalg.solve(P_post, P0 @ m0 + c)
    m, P = vec(d, 9), spd(d, 10)
    m1, P1 = gaussian_vi_natural_update(m, P, B @ m + c, B, 1.0, m0, P0)   # exact expectations, ρ = 1
    torch.testing.assert_close((m1, P1), (m_post, P_post))
    vi = NaturalGaussianVI(lambda z: 0.5 * z @ B @ z + c @ z, m0, P0, lr=0.2, n_samples=8,
                           generator=torch.Generator().manual_seed(0))
    tail = []
    for t in range(240):
        vi.step()
        if t >= 80:
            tail.append(vi.mean)
    torch.testing.assert_close(vi.precision, P_post)
    torch.testing.assert_close(torch.stack(tail).mean(0), m_post, rtol=0, atol=0.05)
    torch.testing.assert_close(vi.covariance, torch.linalg.inv(P_post))


def test_vi_bad_input():
    d = 2
    m0, P0 = torch.zeros(d, dtype=D), torch.eye(d, dtype=D)
    f = lambda z: -z.square().sum()
    with pytest.raises(ValueError):
        gaussian_vi_natural_update(m0, P0, m0, -P0, 1.5, m0, P0)          # lr > 1
    with pytest.raises(ValueError):
        gaussian_vi_natural_update(m0, P0, torch.zeros(3, dtype=D), -P0, 0.5, m0, P0)
    with pytest.raises(ValueError, match="precision"):
        gaussian_vi_natural_update(m0, P0, m0, 10 * P0, 1.0, m0, P0)       # E[∇²f] positive: P' not PD
    with pytest.raises(TypeError):
        NaturalGaussianVI("not callable", m0, P0)
    with pytest.raises(ValueError):
        NaturalGaussianVI(f, m0, P0, lr=0.0)
    with pytest.raises(ValueError):
        NaturalGaussianVI(f, m0, torch.eye(3, dtype=D))
    with pytest.raises(ValueError):
        NaturalGaussianVI(f, m0, -P0)
    with pytest.raises(ValueError):
        NaturalGaussianVI(f, m0, P0, n_samples=0)



def test_vi_update_batched_equals_loop():
    """Leading batch dimensions (independent runs, one ρ each) give what a loop over the runs gives."""
    d, batch = 3, (4, 2)
    m, P, g, H = vec(d, 11, batch), spd(d, 12, batch), vec(d, 13, batch), -spd(d, 14, batch)
    m0, P0 = vec(d, 15), spd(d, 16)
    rho = torch.tensor([0.05, 0.3, 0.7, 1.0], dtype=D).unsqueeze(-1).expand(batch)
    m_new, P_new = gaussian_vi_natural_update(m, P, g, H, rho, m0, P0)
    assert m_new.shape == m.shape and P_new.shape == P.shape
    for i in range(batch[0]):
        for j in range(batch[1]):
            ref = gaussian_vi_natural_update(m[i, j], P[i, j], g[i, j], H[i, j], float(rho[i, j]), m0, P0)
            torch.testing.assert_close((m_new[i, j], P_new[i, j]), ref)
    with pytest.raises(ValueError, match="lr"):
        gaussian_vi_natural_update(m, P, g, H, torch.full(batch, 1.5, dtype=D), m0, P0)
    with pytest.raises(ValueError, match="lr"):
        gaussian_vi_natural_update(m, P, g, H, torch.full((3,), 0.5, dtype=D), m0, P0)     # does not broadcast
    with pytest.raises(ValueError, match="precision"):
        gaussian_vi_natural_update(m, P[0], g, H, 0.5, m0, P0)
    with pytest.raises(ValueError, match="prior_mean"):
        gaussian_vi_natural_update(m, P, g, H, 0.5, vec(d + 1, 0), P0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_follows_inputs():
    F, g = spd(3, 0).cuda(), vec(3, 1).cuda()
    assert natural_gradient(F, g).device.type == "cuda"
    m, V = vec(2, 0).cuda(), spd(2, 0).cuda()
    assert gaussian_kl(m, V, m, V).device.type == "cuda"
    assert bonnet_gradient(lambda z: z.square().sum(), m, V, 8).mean.device.type == "cuda"
    assert gaussian_natural_fisher(*gaussian_to_natural(m, V)).device.type == "cuda"


def test_natural_gradient_descent_skips_frozen_and_counts_shared_parameters_once():
    """Issue cases: NaturalGradientDescent stepped a parameter listed twice twice; a frozen one with a stale .grad
    must not move."""
    a, b = nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64)), nn.Parameter(torch.ones(1, dtype=torch.float64))
    a.grad, b.grad = torch.tensor([0.5, -1.0], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    b.requires_grad_(False)
    opt = NaturalGradientDescent([a, a, b], fisher=lambda: 2.0 * torch.eye(2, dtype=torch.float64), lr=1.0)
    opt.step()
    torch.testing.assert_close(a.detach(), torch.tensor([0.75, 2.5], dtype=torch.float64))
    assert torch.equal(b, torch.ones(1, dtype=torch.float64))
