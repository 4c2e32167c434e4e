"""Implicit gradient regularization: penalties against torch.func and per-example loops, the modified gradient
against the gradient of the modified loss, RK4 against the closed-form linear flow, and the backward-error
orders O(h) / O(h²) on a quadratic where every flow has a closed form."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import V, make_lm, tokens
from torch.func import grad


from taskloss.dynamics import (
    flooding,
    gradient_flow,
    gradient_norm_penalty,
    hessian_vector_product,
    integrate_flow,
    modified_gradient,
    modified_loss,
    native_kernels,
    per_example_gradient_penalty,
)
from taskloss.models import MLP
from taskloss.parameter_vectors import flatten, functional_loss

D = torch.float64


def _problem(seed: int = 0, n: int = 12):
    torch.manual_seed(seed)
    model = MLP(4, (6,), 3, activation="tanh").to(D)
    x = torch.randn(n, 4, dtype=D)
    y = torch.randint(0, 3, (n,))
    return model, x, y


def test_penalty_matches_torch_func_value_and_gradient():
    model, x, y = _problem()
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), x)
    pen = gradient_norm_penalty(F.cross_entropy(model(x), y), model.parameters())
    ref_value = flatten(grad(f)(theta)).pow(2).sum()
    torch.testing.assert_close(pen, ref_value)
    pen.backward()
    ref_grad = grad(lambda p: flatten(grad(f)(p)).pow(2).sum())(theta)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grad[k])
    # ∇‖∇L‖² = 2·∇²L·∇L
    hg = hessian_vector_product(f, theta, grad(f)(theta))
    for k in theta:
        torch.testing.assert_close(ref_grad[k], 2 * hg[k])


def test_penalty_through_an_lstm_and_a_transformer_inside_native_kernels():
    for kind in ("lstm", "pre"):
        model = make_lm(kind).double()
        x, y = tokens(2, 6), tokens(2, 6, seed=3)
        with native_kernels():
            pen = gradient_norm_penalty(F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)), model.parameters())
            pen.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_per_example_penalty_matches_a_loop_and_bounds_the_batch_penalty():
    model, x, y = _problem(n=7)
    pen = per_example_gradient_penalty(model, F.cross_entropy, x, y)
    loop = sum(gradient_norm_penalty(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), model.parameters())
               for i in range(7)) / 7
    torch.testing.assert_close(pen, loop)
    batch = gradient_norm_penalty(F.cross_entropy(model(x), y), model.parameters(), create_graph=False)
    assert float(pen.detach()) >= float(batch)                    # mean of squares ≥ square of mean (Jensen)
    g_vmap = torch.autograd.grad(pen, list(model.parameters()))
    g_loop = torch.autograd.grad(loop, list(model.parameters()))
    for a, b in zip(g_vmap, g_loop):
        torch.testing.assert_close(a, b)


def test_modified_gradient_is_the_gradient_of_the_modified_loss():
    model, x, y = _problem()
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), x)
    h = 0.3
    ref = grad(lambda p: modified_loss(f, p, h))(theta)
    out = modified_gradient(f, theta, h)
    for k in theta:
        torch.testing.assert_close(out[k], ref[k])
    torch.testing.assert_close(modified_loss(f, theta, h), f(theta) + h / 4 * flatten(grad(f)(theta)).pow(2).sum())
    torch.testing.assert_close(flatten(modified_gradient(f, theta, 0.0)), flatten(grad(f)(theta)))


def _spd(n: int = 5, seed: int = 0) -> torch.Tensor:
    q = torch.linalg.qr(torch.randn(n, n, dtype=D, generator=torch.Generator().manual_seed(seed)))[0]
    return q @ torch.diag(torch.linspace(0.2, 2.0, n, dtype=D)) @ q.T


def test_rk4_matches_the_closed_form_linear_flow_with_fourth_order_error():
    A = _spd()
    y0 = torch.ones(5, dtype=D)
    exact = torch.linalg.matrix_exp(-1.5 * A) @ y0
    res = integrate_flow(lambda y: -A @ y, y0, 1.5, rtol=1e-13, atol=0.0)
    true_err = float((res.y - exact).norm())
    assert true_err < 1e-12 and res.error < 1e-12
    errs = []
    for n in (8, 16, 32, 64):           # rtol = 1 accepts the first doubling: y = y_{2n}, error = ‖y_{2n} − y_n‖/15
        r = integrate_flow(lambda y: -A @ y, y0, 1.5, n_steps=n, rtol=1.0, max_doublings=1)
        errs.append(float((r.y - exact).norm()))
        assert r.error == pytest.approx(errs[-1], rel=0.3)   # the step-doubling estimate is accurate
    slope = np.polyfit(np.log([16, 32, 64, 128]), np.log(errs), 1)[0]
    assert -4.3 < slope < -3.7


def test_gradient_flow_of_dict_params_equals_flat_and_raises_when_float32_cannot_meet_the_tolerance():
    model, x, y = _problem()
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), x)
    r_dict = gradient_flow(f, theta, 0.5, h=0.1, rtol=1e-10)
    names = list(theta)

    def f_flat(v):
        out, i = {}, 0
        for k in names:
            out[k] = v[i:i + theta[k].numel()].view_as(theta[k])
            i += theta[k].numel()
        return f(out)

    r_flat = gradient_flow(f_flat, flatten(theta), 0.5, h=0.1, rtol=1e-10)
    torch.testing.assert_close(flatten(r_dict.y), r_flat.y)
    with pytest.raises(ValueError, match="round-off"):
        integrate_flow(lambda v: -v, torch.ones(3), 1.0, rtol=1e-10, atol=0.0)
    with pytest.raises(RuntimeError, match="tolerance"):
        integrate_flow(lambda v: -v, torch.ones(3, dtype=D), 1.0, n_steps=1, rtol=1e-14, atol=0.0, max_doublings=2)


def test_backward_error_orders_on_a_quadratic():
    """L = ½θᵀAθ: GD gives (I − hA)^n θ0, the flow of L gives e^{−TA}θ0, the flow of
    L̃_h = ½θᵀ(A + (h/2)A²)θ gives e^{−T(A + hA²/2)}θ0 — the gaps shrink like h and h²."""
    A, theta0, T = _spd(), torch.ones(5, dtype=D), 2.0
    hs = [T / n for n in (64, 128, 256, 512)]          # hλ_max ≤ 1/16: the asymptotic regime
    gap_l, gap_mod = [], []
    flow = gradient_flow(lambda t: 0.5 * t @ A @ t, theta0, T, rtol=1e-9).y      # gaps ≥ 1e-6 ≫ 1e-9
    torch.testing.assert_close(flow, torch.linalg.matrix_exp(-T * A) @ theta0, rtol=1e-8, atol=0)
    for h in hs:
        gd = torch.linalg.matrix_power(torch.eye(5, dtype=D) - h * A, round(T / h)) @ theta0
        mod = gradient_flow(lambda t: 0.5 * t @ A @ t, theta0, T, h=h, rtol=1e-9).y
        torch.testing.assert_close(mod, torch.linalg.matrix_exp(-T * (A + h / 2 * A @ A)) @ theta0,
                                   rtol=1e-8, atol=0)
        gap_l.append(float((gd - flow).norm()))
        gap_mod.append(float((gd - mod).norm()))
    s1 = np.polyfit(np.log(hs), np.log(gap_l), 1)[0]
    s2 = np.polyfit(np.log(hs), np.log(gap_mod), 1)[0]
    assert 0.95 < s1 < 1.05 and 1.9 < s2 < 2.1


def test_flooding_descends_above_and_ascends_below_the_level():
    w = torch.tensor(2.0, dtype=D, requires_grad=True)
    for level, sign in ((1.0, 1.0), (9.0, -1.0)):
        loss = w ** 2
        out = flooding(loss, level)
        assert float(out.detach()) == pytest.approx(abs(4.0 - level) + level)
        (g,) = torch.autograd.grad(out, w)
        assert float(g) == pytest.approx(sign * 4.0)


def test_gradient_norm_penalty_counts_a_shared_parameter_once():
    """Issue case: a parameter listed twice doubled gradient_norm_penalty; a frozen one is left out."""
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    loss = (w ** 2).sum() + frozen.sum()
    once = gradient_norm_penalty(loss, [w])
    torch.testing.assert_close(gradient_norm_penalty(loss, [w, w, frozen]), once)
    torch.testing.assert_close(once, torch.tensor(20.0))
