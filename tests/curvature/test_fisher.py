"""taskloss.curvature.fisher against float64 references (autograd Jacobians, torch.linalg.solve) and curvlinops."""
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

import taskloss.curvature as C
from taskloss.parameter_vectors import flatten, unflatten

curvlinops = pytest.importorskip("curvlinops")

N, D, H, K = 7, 4, 5, 3


def _mlp(seed=0, out=K):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, out)).double()


@pytest.fixture
def setup():
    torch.manual_seed(1)
    m = _mlp()
    X = torch.randn(N, D, dtype=torch.float64)
    y = torch.randint(0, K, (N,))
    Y = torch.randn(N, K, dtype=torch.float64)
    return m, X, y, Y


def _params(m):
    return {k: p.detach() for k, p in m.named_parameters()}


def _jacobian(m, X):
    params = _params(m)
    theta = flatten(params)
    f = lambda t: functional_call(m, unflatten(t, params), (X,))  # noqa: E731
    return torch.autograd.functional.jacobian(f, theta), f(theta)  # [N, C, P], [N, C]


def _reference_ggn(m, X, likelihood):
    J, out = _jacobian(m, X)
    if likelihood == "gaussian":
        Hs = torch.eye(K, dtype=out.dtype).expand(N, K, K)
    else:
        p = out.softmax(-1)
        Hs = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndq->pq", J, Hs, J) / N


def _per_example_grads(m, X, targets, likelihood):
    rows = []
    for n in range(N):
        m.zero_grad()
        C.nll_loss(m(X[n:n + 1]), targets[n:n + 1], likelihood).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
    return torch.stack(rows)


# ------------------------------------------------------------------------------------------------ likelihoods
def test_nll_loss_convention(setup):
    m, X, y, Y = setup
    out = m(X)
    torch.testing.assert_close(C.nll_loss(out, y), nn.functional.cross_entropy(out, y))
    torch.testing.assert_close(C.nll_loss(out, Y, "gaussian"), 0.5 * ((out - Y) ** 2).sum() / N)


def test_output_hessian_sqrt_squares_to_hessian(setup):
    m, X, _, _ = setup
    out = m(X).detach()
    L = C.output_hessian_sqrt(out)
    p = out.softmax(-1)
    torch.testing.assert_close(L @ L.transpose(1, 2), torch.diag_embed(p) - p[:, :, None] * p[:, None, :])
    # and it is the Hessian of the per-example cross-entropy
    y = setup[2]
    Hs = torch.func.vmap(torch.func.hessian(lambda f, t: nn.functional.cross_entropy(f, t)))(out, y)
    torch.testing.assert_close(L @ L.transpose(1, 2), Hs)


def test_sample_targets_follow_the_model():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    s = C.sample_targets(logits, n_samples=20000, generator=torch.Generator().manual_seed(0))
    assert s.shape == (20000, 2)
    freq = torch.stack([(s == c).double().mean(0) for c in range(3)], -1)
    torch.testing.assert_close(freq, logits.softmax(-1), atol=0.015, rtol=0)
    g = C.sample_targets(logits, "gaussian", 20000, torch.Generator().manual_seed(0))
    torch.testing.assert_close(g.mean(0), logits, atol=0.03, rtol=0)
    torch.testing.assert_close(g.var(0), torch.ones_like(logits), atol=0.05, rtol=0)


# ---------------------------------------------------------------------------------------- dense & diagonal
@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_ggn_matrix_matches_jacobian_reference(setup, likelihood):
    m, X, _, _ = setup
    ref = _reference_ggn(m, X, likelihood)
    torch.testing.assert_close(C.ggn_matrix(m, None, X, likelihood), ref)
    torch.testing.assert_close(C.ggn_diagonal(m, None, X, likelihood), ref.diagonal())
    # a plain function fn(params, inputs) gives the same
    fn = lambda p, x: functional_call(m, p, (x,))  # noqa: E731
    torch.testing.assert_close(C.fisher_matrix(fn, _params(m), X, likelihood), ref)


def test_ggn_is_hessian_for_linear_model_with_squared_error():
    torch.manual_seed(0)
    lin = nn.Linear(D, K).double()
    X, Y = torch.randn(N, D, dtype=torch.float64), torch.randn(N, K, dtype=torch.float64)
    params = _params(lin)
    loss = lambda t: C.nll_loss(functional_call(lin, unflatten(t, params), (X,)), Y, "gaussian")  # noqa
    hess = torch.autograd.functional.hessian(loss, flatten(params))
    torch.testing.assert_close(C.ggn_matrix(lin, None, X, "gaussian"), hess)


@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_empirical_fisher_matches_per_example_gradients(setup, likelihood):
    m, X, y, Y = setup
    t = y if likelihood == "categorical" else Y
    g = _per_example_grads(m, X, t, likelihood)
    torch.testing.assert_close(C.empirical_fisher(m, None, X, t, likelihood), g.T @ g / N)
    torch.testing.assert_close(C.empirical_fisher_diagonal(m, None, X, t, likelihood), (g**2).mean(0))


@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_mc_fisher_converges_like_inverse_sqrt_samples(setup, likelihood):
    m, X, _, _ = setup
    exact = C.ggn_matrix(m, None, X, likelihood)

    def rms_err(S):
        errs = [(C.mc_fisher(m, None, X, likelihood, S, torch.Generator().manual_seed(s)) - exact).norm()
                for s in range(6)]
        return math.sqrt(sum(e.item() ** 2 for e in errs) / len(errs)) / exact.norm().item()

    e_small, e_big = rms_err(16), rms_err(1024)
    # 64× the samples should shrink the error 8×; accept anything between 4× and 16×
    assert e_big < e_small / 4 and e_big > e_small / 16, (e_small, e_big)
    # the MC diagonal is the diagonal of the MC matrix drawn with the same labels
    d = C.mc_fisher_diagonal(m, None, X, likelihood, 3, torch.Generator().manual_seed(7))
    F = C.mc_fisher(m, None, X, likelihood, 3, torch.Generator().manual_seed(7))
    torch.testing.assert_close(d, F.diagonal())


# ---------------------------------------------------------------------------------------------- matrix-free
@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_ggn_vector_product_equals_dense(setup, likelihood):
    m, X, _, _ = setup
    G = _reference_ggn(m, X, likelihood)
    v = torch.randn(G.shape[0], dtype=torch.float64)
    torch.testing.assert_close(C.ggn_vector_product(m, None, X, v, likelihood), G @ v)
    vd = unflatten(v, _params(m))
    out = C.ggn_vector_product(m, None, X, vd, likelihood)
    assert isinstance(out, dict) and out.keys() == vd.keys()
    torch.testing.assert_close(flatten(out), G @ v)


def test_conjugate_gradient_matches_solve():
    torch.manual_seed(0)
    M = torch.randn(20, 12, dtype=torch.float64)
    A = M.T @ M / 20  # PSD, mildly conditioned
    b = torch.randn(12, dtype=torch.float64)
    for damping in (0.0, 0.1):
        x, info = C.conjugate_gradient(lambda v: A @ v, b, damping=damping, max_iter=100, tol=1e-12,
                                       return_info=True)
        torch.testing.assert_close(x, torch.linalg.solve(A + damping * torch.eye(12, dtype=A.dtype), b))
        assert info["converged"] and info["iterations"] <= 40
    # warm start at the solution converges immediately; dict inputs are solved blockwise-flattened
    x_star = torch.linalg.solve(A, b)
    _, info = C.conjugate_gradient(lambda v: A @ v, b, x0=x_star, tol=1e-8, return_info=True)
    assert info["iterations"] == 0
    like = {"a": torch.zeros(5, dtype=A.dtype), "b": torch.zeros(7, dtype=A.dtype)}
    xd = C.conjugate_gradient(lambda d: unflatten(A @ flatten(d), like), unflatten(b, like),
                              max_iter=100, tol=1e-12)
    torch.testing.assert_close(flatten(xd), x_star)


def test_hessian_free_direction_solves_damped_ggn(setup):
    m, X, y, _ = setup
    G = _reference_ggn(m, X, "categorical")
    g = torch.randn(G.shape[0], dtype=torch.float64)
    d = C.hessian_free_direction(m, None, X, g, damping=0.05, cg_iters=200, tol=1e-12)
    torch.testing.assert_close(d, torch.linalg.solve(G + 0.05 * torch.eye(G.shape[0], dtype=G.dtype), g))


# ---------------------------------------------------------------------------------------------- curvlinops
LOSSES = [("cross_entropy", "mean"), ("cross_entropy", "sum"), ("mse", "mean"), ("mse", "sum")]


def _loss_module(loss, reduction):
    return nn.CrossEntropyLoss(reduction=reduction) if loss == "cross_entropy" else nn.MSELoss(reduction=reduction)


@pytest.mark.parametrize("loss,reduction", LOSSES)
def test_curvature_scale_converts_to_curvlinops_ggn_and_ef(setup, loss, reduction):
    m, X, y, Y = setup
    likelihood, t = ("categorical", y) if loss == "cross_entropy" else ("gaussian", Y)
    params = list(m.parameters())
    eye = torch.eye(sum(p.numel() for p in params), dtype=torch.float64)
    data = [(X[:4], t[:4]), (X[4:], t[4:])]  # two mini-batches: curvlinops accumulates over the data set
    fn = _loss_module(loss, reduction)
    ggn = curvlinops.GGNLinearOperator(m, fn, params, data, check_deterministic=False) @ eye
    ef = curvlinops.EFLinearOperator(m, fn, params, data, check_deterministic=False) @ eye
    torch.testing.assert_close(ggn, C.curvature_scale("ggn", loss, reduction, N, K)
                               * C.ggn_matrix(m, None, X, likelihood))
    torch.testing.assert_close(ef, C.curvature_scale("empirical", loss, reduction, N, K)
                               * C.empirical_fisher(m, None, X, t, likelihood))


@pytest.mark.parametrize("fisher_type,clv_type", [("exact", "type-2"), ("empirical", "empirical")])
@pytest.mark.parametrize("loss,reduction", LOSSES)
def test_curvature_scale_converts_to_curvlinops_kfac(setup, fisher_type, clv_type, loss, reduction):
    m, X, y, Y = setup
    likelihood, t = ("categorical", y) if loss == "cross_entropy" else ("gaussian", Y)
    k = C.KFAC(m, fisher_type=fisher_type, likelihood=likelihood, decay=0.0)
    k.update_statistics(outputs=m(X), targets=t)
    k.remove()
    params = list(m.parameters())
    op = curvlinops.KFACLinearOperator(m, _loss_module(loss, reduction), params, [(X[:4], t[:4]), (X[4:], t[4:])],
                                       fisher_type=clv_type, separate_weight_and_bias=False,
                                       check_deterministic=False)
    eye = torch.eye(sum(p.numel() for p in params), dtype=torch.float64)
    torch.testing.assert_close(op @ eye, C.curvature_scale(fisher_type, loss, reduction, N, K) * k.to_dense())


def test_curvature_scale_table_and_bad_input():
    # the sum-reduced squared error without ½ scales the empirical Fisher by 4N (gradients double), the GGN by 2N
    assert C.curvature_scale("empirical", "mse", "sum", 10, 3) == 40.0
    assert C.curvature_scale("ggn", "mse", "sum", 10, 3) == 20.0
    assert C.curvature_scale("mc", "mse", "mean", 10, 4) == 0.5
    assert C.curvature_scale("empirical", "mse", "mean", 10, 4) == 1.0
    assert C.curvature_scale("fisher", "cross_entropy", "sum", 10, 4) == 10.0
    assert C.curvature_scale("exact", "cross_entropy", "mean", 10, 4) == 1.0
    with pytest.raises(ValueError, match="curvature must be one of"):
        C.curvature_scale("hessian", "mse", "sum", 10, 3)
    with pytest.raises(ValueError, match="loss must be"):
        C.curvature_scale("ggn", "nll", "sum", 10, 3)
    with pytest.raises(ValueError, match="reduction must be"):
        C.curvature_scale("ggn", "mse", "none", 10, 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        C.curvature_scale("ggn", "mse", "sum", 0, 3)
    with pytest.raises(TypeError, match="c must be an int"):
        C.curvature_scale("ggn", "mse", "sum", 10, 3.0)


# ---------------------------------------------------------------------------------------------- optimizers
def test_hessian_free_one_step_solves_least_squares():
    torch.manual_seed(0)
    lin = nn.Linear(D, K).double()
    X, Y = torch.randn(30, D, dtype=torch.float64), torch.randn(30, K, dtype=torch.float64)
    opt = C.HessianFree(lin.parameters(), lin, lr=1.0, damping=1e-9, cg_iters=50, cg_tol=1e-14,
                        likelihood="gaussian", adapt_damping=False)

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(lin(X), Y, "gaussian")
        loss.backward()
        return loss, X

    opt.step(closure)
    Xa = torch.cat([X, torch.ones(30, 1, dtype=X.dtype)], 1)
    sol = torch.linalg.lstsq(Xa, Y).solution  # [D+1, K]
    torch.testing.assert_close(lin.weight.detach(), sol[:-1].T, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(lin.bias.detach(), sol[-1], atol=1e-8, rtol=1e-8)


def test_hessian_free_never_increases_the_loss(setup):
    m, X, y, _ = setup
    opt = C.HessianFree(m.parameters(), m, lr=1.0, damping=1e-4, cg_iters=10)

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(m(X), y)
        loss.backward()
        return loss, X

    losses = [float(opt.step(closure).detach()) for _ in range(8)]
    assert all(b <= a + 1e-12 for a, b in zip(losses, losses[1:]))
    assert losses[-1] < 0.5 * losses[0]
    assert {"rho", "damping", "accepted", "iterations"} <= opt.last_info.keys()


def test_fisher_diagonal_preconditioner(setup):
    m, X, y, _ = setup
    pre = C.FisherDiagonalPreconditioner(m, "exact", damping=0.1, decay=0.5)
    d1 = pre.update_statistics(X, y).clone()
    torch.testing.assert_close(d1, C.ggn_diagonal(m, None, X))
    d2 = C.ggn_diagonal(m, None, X[:3])
    torch.testing.assert_close(pre.update_statistics(X[:3]), 0.5 * d1 + 0.5 * d2)
    m.zero_grad()
    C.nll_loss(m(X), y).backward()
    g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    pre.precondition_()
    torch.testing.assert_close(torch.cat([p.grad.reshape(-1) for p in m.parameters()]), g / (pre.diagonal + 0.1))
    ef = C.FisherDiagonalPreconditioner(m, "empirical", power=0.5)
    torch.testing.assert_close(ef.update_statistics(X, y), C.empirical_fisher_diagonal(m, None, X, y))


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise(setup):
    m, X, y, Y = setup
    with pytest.raises(ValueError, match="likelihood"):
        C.ggn_matrix(m, None, X, "poisson")
    with pytest.raises(ValueError, match="empty"):
        C.ggn_matrix(m, None, X[:0])
    with pytest.raises(ValueError, match="NaN"):
        C.ggn_matrix(m, None, torch.full_like(X, float("nan")))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):  # per-token outputs [N, T, C] take targets [N, T]
        C.nll_loss(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \[N, C\]"):
        C.nll_loss(torch.zeros(4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="lie in"):
        C.empirical_fisher(m, None, X, torch.full((N,), K))
    with pytest.raises(ValueError, match="shape"):
        C.empirical_fisher(m, None, X, Y[:, :2], "gaussian")
    with pytest.raises(ValueError, match="n_samples"):
        C.mc_fisher(m, None, X, n_samples=0)
    with pytest.raises(ValueError, match="params must be given"):
        C.ggn_matrix(lambda p, x: x, None, X)
    with pytest.raises(TypeError):
        C.ggn_matrix(42, None, X)
    with pytest.raises(ValueError, match="flat vector"):
        C.ggn_vector_product(m, None, X, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="damping"):
        C.conjugate_gradient(lambda v: v, torch.ones(3), damping=-1.0)
    with pytest.raises(ValueError, match="max_iter"):
        C.conjugate_gradient(lambda v: v, torch.ones(3), max_iter=0)
    with pytest.raises(ValueError, match="NaN"):
        C.conjugate_gradient(lambda v: v, torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="damping"):
        C.hessian_free_direction(m, None, X, torch.zeros(38, dtype=torch.float64), damping=0.0)
    with pytest.raises(ValueError, match="lr"):
        C.HessianFree(m.parameters(), m, lr=0.0)
    with pytest.raises(ValueError, match="closure"):
        C.HessianFree(m.parameters(), m).step(None)
    with pytest.raises(ValueError, match="belong"):
        C.HessianFree([nn.Parameter(torch.zeros(2))], m)
    with pytest.raises(ValueError, match="fisher_type"):
        C.FisherDiagonalPreconditioner(m, "true")
    with pytest.raises(ValueError, match="decay"):
        C.FisherDiagonalPreconditioner(m, decay=1.0)
    with pytest.raises(RuntimeError, match="update"):
        C.FisherDiagonalPreconditioner(m).precondition_()
    with pytest.raises(ValueError, match="targets"):
        C.FisherDiagonalPreconditioner(m, "empirical").update_statistics(X)
