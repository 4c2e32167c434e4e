"""taskloss.curvature.hessian_free: conjugate gradients never return a wrong vector silently (indefinite, singular,
non-convergent, NaN-producing operators), truncated CG on request, and HessianFree's closure conventions."""
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import taskloss.curvature as C

D = torch.float64


def _spd(n, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=g, dtype=D)
    return M @ M.T / n + shift * torch.eye(n, dtype=D)


# ---------------------------------------------------------------------------------- non-positive curvature
@pytest.mark.parametrize("kind", ["indefinite", "negative definite", "zero", "singular, b in the null space"])
def test_nonpositive_curvature_raises_with_iteration_and_curvature(kind):
    n = 6
    b = torch.ones(n, dtype=D)
    if kind == "indefinite":
        A = torch.diag(torch.tensor([3.0, 2.0, 1.0, -1.0, -2.0, -3.0], dtype=D))
    elif kind == "negative definite":
        A = -_spd(n, 0, 0.5)
    elif kind == "zero":
        A = torch.zeros(n, n, dtype=D)
    else:
        A = torch.diag(torch.tensor([1.0, 2.0, 0.0, 0.0, 0.0, 0.0], dtype=D))
        b = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=D)
    with pytest.raises(ValueError, match=r"non-positive curvature pᵀ\(A \+ λI\)p = -?\d.*at iteration \d+"):
        C.conjugate_gradient(lambda v: A @ v, b, max_iter=20)
    # the same class with enough damping is positive definite and solved
    lam = 5.0
    x = C.conjugate_gradient(lambda v: A @ v, b, damping=lam, max_iter=50, tol=1e-12)
    torch.testing.assert_close(x, torch.linalg.solve(A + lam * torch.eye(n, dtype=D), b))


def test_truncated_cg_stops_at_nonpositive_curvature_and_reports_it():
    A = torch.diag(torch.tensor([2.0, 1.0, -1.0], dtype=D))
    b = torch.tensor([1.0, 1.0, 1.0], dtype=D)
    x, info = C.conjugate_gradient(lambda v: A @ v, b, max_iter=10, truncated=True)
    assert info["stop"] == "nonpositive_curvature" and not info["converged"] and info["curvature"] <= 0
    assert bool(torch.isfinite(x).all())
    # truncation by the iteration budget is reported too, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = C.conjugate_gradient(lambda v: _spd(8, 1) @ v, torch.ones(8, dtype=D), max_iter=2, truncated=True)
    assert info["stop"] == "max_iter" and info["iterations"] == 2 and not info["converged"]


def test_singular_operator_with_b_outside_its_range_is_never_silent():
    """A PSD but singular A (rank 3 of 8) and b with a null-space component: no exact solution exists."""
    g = torch.Generator().manual_seed(2)
    U = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=D)).Q
    A = U[:, :3] @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=D)) @ U[:, :3].T
    b = U[:, 0] + U[:, 5]
    outcome = _run_cg(A, b, 0.0, max_iter=30, tol=1e-10)
    assert outcome in ("raised", "warned"), outcome


def test_not_converging_warns_and_return_info_reports_it():
    A = _spd(30, 3, 1e-4)
    b = torch.ones(30, dtype=D)
    with pytest.warns(RuntimeWarning, match=r"did not converge \(max_iter\): relative residual .* after 3 iterations"):
        C.conjugate_gradient(lambda v: A @ v, b, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = C.conjugate_gradient(lambda v: A @ v, b, max_iter=3, return_info=True)
    assert not info["converged"] and info["stop"] == "max_iter" and info["relative_residual"] > 1e-3
    x, info = C.conjugate_gradient(lambda v: A @ v, b, max_iter=500, tol=1e-10, return_info=True)
    assert info["converged"] and info["stop"] == "converged"
    torch.testing.assert_close(A @ x, b)


def test_tol_zero_runs_every_iteration_and_a_solve_reports_it_as_not_converged():
    """``tol=0`` is documented as "no early stop": max_iter products (truncated), the same iterate as a tiny tol
    that is never met, and a solve that says it did not converge rather than claiming an exact solution."""
    A = _spd(12, 5, 1e-3)
    b = torch.ones(12, dtype=D)
    x, info = C.conjugate_gradient(lambda v: A @ v, b, max_iter=4, tol=0.0, truncated=True)
    assert info["iterations"] == 4 and info["stop"] == "max_iter"
    same, _ = C.conjugate_gradient(lambda v: A @ v, b, max_iter=4, tol=1e-300, truncated=True)
    torch.testing.assert_close(x, same, rtol=0, atol=0)
    _, info = C.conjugate_gradient(lambda v: A @ v, b, max_iter=4, tol=0.0, return_info=True)
    assert info["iterations"] == 4 and not info["converged"]
    with pytest.warns(RuntimeWarning, match="did not converge"):
        C.conjugate_gradient(lambda v: A @ v, b, max_iter=4, tol=0.0)


@pytest.mark.parametrize("bad", ["nan", "inf", "shape", "keys"])
def test_a_broken_matvec_raises(bad):
    b = torch.ones(4, dtype=D)
    if bad == "keys":
        with pytest.raises(ValueError, match="keys of b"):
            C.conjugate_gradient(lambda d: {"other": d["w"]}, {"w": b})
        return
    if bad == "shape":
        mv, match = (lambda v: torch.ones(3, dtype=D)), r"matvec returned shape \(3,\) at iteration 0"
    else:
        mv, match = (lambda v: v * float(bad)), "matvec returned NaN or inf at iteration 0"
    with pytest.raises(ValueError, match=match):
        C.conjugate_gradient(mv, b)


def _run_cg(A, b, damping, max_iter, tol):
    """'raised' | 'warned' | 'solved' (the returned x then solves the system to the stated tolerance)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            x = C.conjugate_gradient(lambda v: A @ v, b, damping=damping, max_iter=max_iter, tol=tol)
        except ValueError as e:
            assert "non-positive curvature" in str(e)
            return "raised"
    if any(issubclass(w.category, RuntimeWarning) and "did not converge" in str(w.message) for w in caught):
        return "warned"
    res = float(((A + damping * torch.eye(len(b), dtype=D)) @ x - b).norm())
    assert res <= max(100 * tol, 1e-12) * float(b.norm()), (res, float(b.norm()))
    return "solved"


@settings(max_examples=60)
@given(st.integers(2, 12), st.integers(0, 10**6), st.sampled_from([0.0, 1e-3, 1.0]),
       st.sampled_from(["psd", "indefinite", "singular", "negative"]))
def test_cg_on_any_symmetric_operator_raises_warns_or_solves(n, seed, damping, kind):
    """The class of symmetric operators: CG either raises (non-positive curvature), warns (not converged) or
    returns an x whose true residual meets the tolerance — never a wrong vector without a word."""
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=D)).Q
    lam = torch.rand(n, generator=g, dtype=D) * 3 + 0.1
    if kind == "indefinite":
        lam[: max(1, n // 2)] *= -1
    elif kind == "singular":
        lam[: max(1, n // 2)] = 0
    elif kind == "negative":
        lam = -lam
    A = Q @ torch.diag(lam) @ Q.T
    b = torch.randn(n, generator=g, dtype=D)
    _run_cg(A, b, damping, max_iter=3 * n, tol=1e-9)


# ---------------------------------------------------------------------------------------------- HessianFree
def _least_squares(seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(4, 3).double()
    X, Y = torch.randn(30, 4, dtype=D), torch.randn(30, 3, dtype=D)
    return lin, X, Y


def test_hessian_free_gets_the_ggn_batch_from_the_closure():
    """The one documented way: the closure returns ``(loss, inputs)``; the GGN batch may differ from the loss's."""
    lin, X, Y = _least_squares()
    opt = C.HessianFree(lin.parameters(), lin, lr=0.5, damping=1e-2, cg_iters=60, cg_tol=1e-13, likelihood="gaussian",
                        adapt_damping=False)
    g = []

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(lin(X), Y, "gaussian")
        loss.backward()
        g.append(torch.cat([p.grad.reshape(-1) for p in lin.parameters()]))
        return loss, X[:10]

    before = torch.cat([p.detach().reshape(-1) for p in lin.parameters()])
    opt.step(closure)
    G = C.ggn_matrix(lin, None, X[:10], "gaussian")
    want = torch.linalg.solve(G + 1e-2 * torch.eye(G.shape[0], dtype=D), g[0])      # (G + λI)⁻¹ g on X[:10]
    after = torch.cat([p.detach().reshape(-1) for p in lin.parameters()])
    torch.testing.assert_close(before - after, 0.5 * want, rtol=1e-8, atol=1e-10)


def test_hessian_free_damping_update_uses_the_model_at_the_current_point():
    """ρ = ΔL / q(−lr·d) with q the quadratic model at the parameters *before* the step."""
    lin, X, Y = _least_squares(1)
    opt = C.HessianFree(lin.parameters(), lin, lr=0.7, damping=0.1, cg_iters=2, likelihood="gaussian")

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(lin(X), Y, "gaussian")
        loss.backward()
        return loss, X

    params0 = {k: p.detach().clone() for k, p in lin.named_parameters()}
    loss0 = float(closure()[0].detach())
    g = torch.cat([p.grad.reshape(-1) for p in lin.parameters()])
    G = C.ggn_matrix(lin, params0, X, "gaussian")
    opt.step(closure)
    d = opt.state[next(iter(lin.parameters()))]["direction"]
    predicted = -0.7 * float(g @ d) + 0.5 * 0.49 * float(d @ G @ d)
    new_loss = opt.last_info["new_loss"]
    assert opt.last_info["rho"] == pytest.approx((new_loss - loss0) / predicted, rel=1e-9)
    assert opt.last_info["stop"] in ("converged", "max_iter", "nonpositive_curvature")


def test_hessian_free_step_bad_closures():
    lin, X, Y = _least_squares()
    opt = C.HessianFree(lin.parameters(), lin, likelihood="gaussian")
    with pytest.raises(ValueError, match=r"\(loss, inputs\)"):
        opt.step(lambda: C.nll_loss(lin(X), Y, "gaussian"))          # the GGN batch is missing
    with pytest.raises(ValueError, match="scalar loss"):
        opt.step(lambda: (lin(X), X))
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        opt.step(lambda: (torch.tensor(math.nan), X))
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    with pytest.raises(ValueError, match=r"\(loss, inputs\)"):
        opt.step(lambda: (1.0, X, X))
    with pytest.raises(TypeError, match="GGN inputs"):
        opt.step(lambda: (1.0, "X"))
    opt.param_groups[0]["damping"] = -1.0
    with pytest.raises(ValueError, match="damping must be > 0"):
        opt.step(lambda: (torch.tensor(1.0), X))


def _hf_closure(opt, lin, X, Y):
    def closure():
        opt.zero_grad()
        loss = C.nll_loss(lin(X), Y, "gaussian")
        loss.backward()
        return loss, X
    return closure


def test_hessian_free_leaves_frozen_parameters_and_counts_shared_ones_once():
    """Issue cases: HessianFree moved a frozen bias by 0.03 in a step; a parameter listed twice is one."""
    lin, X, Y = _least_squares()
    lin.bias.requires_grad_(False)
    bias = lin.bias.detach().clone()
    opt = C.HessianFree(lin.parameters(), lin, damping=1e-2, cg_iters=5, likelihood="gaussian")
    opt.step(_hf_closure(opt, lin, X, Y))
    assert torch.equal(lin.bias, bias)
    a, X, Y = _least_squares(1)
    b, _, _ = _least_squares(1)
    oa = C.HessianFree([a.weight, a.bias, a.weight], a, damping=1e-2, cg_iters=5, likelihood="gaussian")
    ob = C.HessianFree([b.weight, b.bias], b, damping=1e-2, cg_iters=5, likelihood="gaussian")
    for _ in range(2):
        oa.step(_hf_closure(oa, a, X, Y))
        ob.step(_hf_closure(ob, b, X, Y))
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_hessian_free_steps_every_group_with_its_learning_rate_and_follows_a_scheduler():
    lin, X, Y = _least_squares(2)
    ref, _, _ = _least_squares(2)
    opt = C.HessianFree([{"params": [lin.weight]}, {"params": [lin.bias], "lr": 0.25}], lin, lr=0.5, damping=1e-2,
                        cg_iters=40, cg_tol=1e-12, likelihood="gaussian", adapt_damping=False)
    one = C.HessianFree(ref.parameters(), ref, lr=1.0, damping=1e-2, cg_iters=40, cg_tol=1e-12, likelihood="gaussian",
                        adapt_damping=False)
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step(_hf_closure(opt, lin, X, Y))
    one.step(_hf_closure(one, ref, X, Y))                      # the full direction d, once
    torch.testing.assert_close(w0 - lin.weight, 0.5 * (w0 - ref.weight))
    torch.testing.assert_close(b0 - lin.bias, 0.25 * (b0 - ref.bias))
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.125]
    opt.param_groups[1]["cg_iters"] = 3
    with pytest.raises(ValueError, match="cg_iters must be the same in every parameter group"):
        opt.step(_hf_closure(opt, lin, X, Y))
    with pytest.raises(TypeError, match="adapt_damping must be a bool"):
        C.HessianFree(lin.parameters(), lin, adapt_damping="no")
