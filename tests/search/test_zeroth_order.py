"""Zeroth-order estimators against closed forms (quadratic, cosine), autograd, and the REINFORCE identity."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from taskloss.search import policy_gradient as PG
from taskloss.search import zeroth_order as ZO
from taskloss.parameter_vectors import functional_loss


def quadratic(d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(d, d, dtype=torch.float64, generator=g)
    A = Q @ Q.T / d + torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, dtype=torch.float64, generator=g)
    theta = torch.randn(d, dtype=torch.float64, generator=g)
    return (lambda t: 0.5 * t @ A @ t + b @ t), A @ theta + b, theta


@pytest.mark.parametrize("baseline", ["none", "value", "loo", "antithetic"])
def test_gaussian_smoothing_unbiased_on_quadratic(baseline):
    """For a quadratic, ∇E[f(θ+σε)] = Aθ + b exactly; the estimate converges to it (error ~ 1/√n)."""
    f, grad, theta = quadratic()
    sigma, n = 0.3, 200_000
    est = ZO.gaussian_smoothing_grad(f, theta, sigma, n, baseline=baseline, generator=torch.Generator().manual_seed(1))
    tol = (40.0 if baseline == "none" else 1.0) * 4 / math.sqrt(n) * grad.norm().item()
    assert (est - grad).norm().item() < tol


def test_gaussian_smoothing_targets_the_smoothed_gradient():
    """f = Σ cos θ_i: ∇E[f(θ+σε)] = -sin θ · exp(-σ²/2) ≠ ∇f — the estimator finds the smoothed one."""
    theta = torch.linspace(-2, 2, 5, dtype=torch.float64)
    sigma = 1.0
    est = ZO.gaussian_smoothing_grad(lambda t: torch.cos(t).sum(), theta, sigma, 400_000, baseline="antithetic",
                                     generator=torch.Generator().manual_seed(0))
    smoothed = -torch.sin(theta) * math.exp(-sigma ** 2 / 2)
    torch.testing.assert_close(est, smoothed, atol=1e-2, rtol=0)
    assert (est - (-torch.sin(theta))).abs().max() > 0.2


def test_gaussian_smoothing_is_reinforce_with_gaussian_score():
    """Same samples: the ZO estimate equals −∇ of the REINFORCE surrogate with log N(θ'; θ, σ²I)."""
    f, _, theta = quadratic(seed=3)
    sigma = 0.5
    for baseline in ("none", "value"):
        g_zo, eps, vals = ZO.gaussian_smoothing_grad(f, theta, sigma, 64, baseline=baseline, return_samples=True,
                                                     generator=torch.Generator().manual_seed(2))
        th = theta.clone().requires_grad_(True)
        samples = theta + sigma * eps                                   # θ' ~ N(θ, σ²I), held fixed
        logq = -((samples - th) ** 2).sum(1) / (2 * sigma ** 2)         # + const
        b = f(theta) if baseline == "value" else None
        # REINFORCE on the *loss* f: ∇E[f] = E[(f - b) ∇log q]; the surrogate's gradient is −that
        g_pg = -torch.autograd.grad(PG.reinforce_loss(logq, vals, b), th)[0]
        torch.testing.assert_close(g_zo, g_pg)


def test_baselines_cut_variance():
    f, _, theta = quadratic(seed=4)
    theta = theta + 3.0                      # large f(θ): the plain estimator suffers most
    gen = torch.Generator().manual_seed(5)
    var = {}
    for baseline in ("none", "value", "loo", "antithetic"):
        ests = torch.stack([ZO.gaussian_smoothing_grad(f, theta, 1.0, 8, baseline=baseline, generator=gen)
                            for _ in range(200)])
        var[baseline] = ests.var(0).sum().item()
    assert var["value"] < 0.2 * var["none"]
    assert var["loo"] < 0.2 * var["none"]
    # for a quadratic the central difference removes the curvature term σ/2·εᵀAε of the forward difference,
    # which dominates near the minimum-ish original θ (small gradient, σ = 1)
    f, _, theta = quadratic(seed=4)
    v = {b: torch.stack([ZO.gaussian_smoothing_grad(f, theta, 1.0, 8, baseline=b, generator=gen)
                         for _ in range(200)]).var(0).sum().item() for b in ("value", "antithetic")}
    assert v["antithetic"] < 0.3 * v["value"]


def test_vmap_equals_loop_and_dict_params_with_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    X = torch.randn(20, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (20,))
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), X)
    a = ZO.gaussian_smoothing_grad(f, theta, 1e-4, 16, baseline="antithetic", generator=torch.Generator().manual_seed(0))
    b = ZO.gaussian_smoothing_grad(f, theta, 1e-4, 16, baseline="antithetic", vectorize=False,
                                   generator=torch.Generator().manual_seed(0))
    c = ZO.gaussian_smoothing_grad(f, theta, 1e-4, 16, baseline="antithetic", chunk_size=5,
                                   generator=torch.Generator().manual_seed(0))
    for k in theta:
        torch.testing.assert_close(a[k], b[k])
        torch.testing.assert_close(a[k], c[k])
    # many directions + tiny σ → the true gradient
    est = ZO.gaussian_smoothing_grad(f, theta, 1e-5, 60_000, baseline="antithetic", chunk_size=20_000,
                                     generator=torch.Generator().manual_seed(1))
    F.cross_entropy(model(X), y).backward()
    flat_e = torch.cat([est[k].reshape(-1) for k, _ in model.named_parameters()])
    flat_g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert F.cosine_similarity(flat_e, flat_g, dim=0) > 0.95


def test_spsa_unbiased_on_quadratic():
    f, grad, theta = quadratic(seed=6)
    est = ZO.spsa_grad(f, theta, 0.2, 100_000, generator=torch.Generator().manual_seed(0))
    assert (est - grad).norm() < 0.03 * grad.norm() * 6


def test_zeroth_order_bad_inputs():
    f, _, theta = quadratic()
    with pytest.raises(ValueError):
        ZO.gaussian_smoothing_grad(f, theta, 0.0, 4)
    with pytest.raises(ValueError):
        ZO.gaussian_smoothing_grad(f, theta, -1.0, 4)
    with pytest.raises(ValueError):
        ZO.gaussian_smoothing_grad(f, theta, 0.1, 0)
    with pytest.raises(TypeError):
        ZO.gaussian_smoothing_grad(f, theta, 0.1, 2.5)
    with pytest.raises(ValueError, match="baseline"):
        ZO.gaussian_smoothing_grad(f, theta, 0.1, 4, baseline="median")
    with pytest.raises(ValueError, match="loo"):
        ZO.gaussian_smoothing_grad(f, theta, 0.1, 1, baseline="loo")
    with pytest.raises(TypeError, match="floating"):
        ZO.gaussian_smoothing_grad(f, torch.arange(6), 0.1, 4)
    with pytest.raises(TypeError):
        ZO.gaussian_smoothing_grad(f, [theta], 0.1, 4)
    with pytest.raises(ValueError, match="NaN"):
        ZO.gaussian_smoothing_grad(f, theta * float("nan"), 0.1, 4)
    with pytest.raises(ValueError, match="NaN"):
        ZO.gaussian_smoothing_grad(lambda t: t.sum() / 0 * 0, theta, 0.1, 4)
    with pytest.raises(ValueError, match="scalar"):
        ZO.gaussian_smoothing_grad(lambda t: t, theta, 0.1, 4, baseline="value", vectorize=False)
    with pytest.raises(ValueError):
        ZO.spsa_grad(f, theta, 0.0)
    with pytest.raises(TypeError):
        functional_loss("model", lambda o: o)


# ----------------------------------------------------------------------------------------------------- MeZO
def test_mezo_step_matches_manual_update_and_restores():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    X, Y = torch.randn(10, 3, dtype=torch.float64), torch.randn(10, 2, dtype=torch.float64)
    loss = lambda: F.mse_loss(model(X), Y)
    before = [p.detach().clone() for p in model.parameters()]
    opt = ZO.MeZO(model.parameters(), lr=0.1, sigma=1e-2, seed=3)
    calls = []
    lp = opt.step(lambda: calls.append(1) or loss())
    assert len(calls) == 2
    # manual: the same seed stream, the same per-parameter noise order
    s = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(3)))
    gen = torch.Generator().manual_seed(s)
    zs = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in before]

    def f(params):
        return F.mse_loss(X @ params[0].T + params[1], Y)

    lp_ref = f([p + 1e-2 * z for p, z in zip(before, zs)])
    lm_ref = f([p - 1e-2 * z for p, z in zip(before, zs)])
    g = (lp_ref - lm_ref) / 2e-2
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-6, atol=0)
    assert opt.last_projected_grads[0] == pytest.approx(g.item(), rel=1e-5)
    for p, p0, z in zip(model.parameters(), before, zs):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g * z)


def test_mezo_trains_and_is_reproducible():
    def run(seed):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 1)
        X = torch.randn(64, 5)
        Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [3.0]])
        opt = ZO.MeZO(model.parameters(), lr=0.02, sigma=1e-3, seed=seed, n_samples=2, weight_decay=1e-4)
        l0 = F.mse_loss(model(X), Y).item()
        for _ in range(400):
            opt.step(lambda: F.mse_loss(model(X), Y))
        return l0, F.mse_loss(model(X), Y).item(), [p.detach().clone() for p in model.parameters()]

    l0, l1, p1 = run(1)
    assert l1 < 0.1 * l0
    _, _, p1b = run(1)
    _, _, p2 = run(2)
    assert all(torch.equal(a, b) for a, b in zip(p1, p1b))
    assert not all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_mezo_bad_inputs_and_nan_restores():
    model = torch.nn.Linear(2, 1)
    for kw in (dict(lr=0.0), dict(sigma=0.0), dict(sigma=-1.0), dict(weight_decay=-1.0), dict(n_samples=0)):
        with pytest.raises(ValueError):
            ZO.MeZO(model.parameters(), **kw)
    opt = ZO.MeZO(model.parameters())
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="NaN"):
        opt.step(lambda: torch.tensor(float("nan")))
    for p, p0 in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), p0)        # restored up to float rounding


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_zeroth_order_on_cuda():
    f, grad, theta = quadratic()
    est = ZO.gaussian_smoothing_grad(f, theta.cuda(), 0.3, 100_000, baseline="antithetic",
                                     generator=torch.Generator(device="cuda").manual_seed(0))
    assert est.device.type == "cuda"
    assert (est.cpu() - grad).norm() < 0.05 * grad.norm()
    model = torch.nn.Linear(3, 1).cuda()
    X = torch.randn(8, 3, device="cuda")
    opt = ZO.MeZO(model.parameters(), lr=0.01, sigma=1e-3)
    opt.step(lambda: model(X).pow(2).mean())
    assert all(p.device.type == "cuda" for p in model.parameters())


def test_mezo_leaves_frozen_parameters_and_steps_shared_ones_once():
    """Issue cases: MeZO moved a bias with requires_grad=False (−0.582 → −0.531); a parameter listed twice was
    stepped twice. Frozen tensors are neither perturbed nor updated; a repeated tensor is one parameter."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    model.bias.requires_grad_(False)
    X, y = torch.randn(16, 3), torch.randn(16)
    bias = model.bias.detach().clone()
    opt = ZO.MeZO(model.parameters(), lr=0.1, sigma=1e-2, seed=0)
    opt.step(lambda: F.mse_loss(model(X).squeeze(-1), y))
    assert torch.equal(model.bias, bias)
    twice, once = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    once.load_state_dict(twice.state_dict())
    a = ZO.MeZO([twice.weight, twice.weight, twice.bias], lr=0.1, sigma=1e-2, seed=0)
    b = ZO.MeZO([once.weight, once.bias], lr=0.1, sigma=1e-2, seed=0)
    a.step(lambda: F.mse_loss(twice(X).squeeze(-1), y))
    b.step(lambda: F.mse_loss(once(X).squeeze(-1), y))
    assert torch.equal(twice.weight, once.weight) and torch.equal(twice.bias, once.bias)


def test_mezo_sigma_and_n_samples_are_shared_by_the_groups():
    model = torch.nn.Linear(3, 1)
    opt = ZO.MeZO([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}], sigma=1e-2)
    opt.param_groups[1]["sigma"] = 0.1
    with pytest.raises(ValueError, match="one sigma shared by all parameter groups"):
        opt.step(lambda: model(torch.ones(1, 3)).sum())


def test_mezo_draws_a_large_parameters_noise_in_blocks_with_the_same_numbers(monkeypatch):
    # 4 x 96 = 384 entries in blocks of 64 (NOISE_BLOCK patched down): no randn call larger than a block, and the
    # same step as one draw of the whole parameter (CPU: blocks of a multiple of 16 continue one another exactly)
    def run(block):
        monkeypatch.setattr(ZO, "NOISE_BLOCK", block)
        torch.manual_seed(0)
        model = torch.nn.Linear(96, 4).double()
        X, Y = torch.randn(8, 96, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
        sizes, randn = [], torch.randn

        def recording(*shape, **kw):
            out = randn(*shape, **kw)
            sizes.append(out.numel())
            return out

        monkeypatch.setattr(ZO.torch, "randn", recording)
        opt = ZO.MeZO(model.parameters(), lr=0.1, sigma=1e-2, n_samples=2, seed=3)
        losses = [opt.step(lambda: F.mse_loss(model(X), Y)) for _ in range(2)]
        monkeypatch.setattr(ZO.torch, "randn", randn)
        return [p.detach().clone() for p in model.parameters()], losses, max(sizes)

    (w_blocks, b_blocks), losses_blocks, largest = run(64)
    (w_whole, b_whole), losses_whole, largest_whole = run(1 << 20)
    assert largest == 64 and largest_whole == 384
    assert torch.equal(w_blocks, w_whole) and torch.equal(b_blocks, b_whole)
    assert [float(v) for v in losses_blocks] == [float(v) for v in losses_whole]
