"""Shampoo against independent implementations: pytorch_optimizer's Shampoo where the definitions coincide, the
grafted base optimizers (torch.optim.Adam / SGD) bit for bit before preconditioning starts, and the closed forms of
one full-batch step (the polar factor for e = −1/4, the transposed pseudo-inverse for e = −1/2) and of one example
per step (rank-one gradients). Plus the torch.optim conventions."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from taskloss.curvature import Shampoo, matrix_power

po = pytest.importorskip("pytorch_optimizer")

D = torch.float64


def _mlp(bias: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7, bias=bias), nn.Tanh(), nn.Linear(7, 3, bias=bias)).to(D)


def _data(seed: int = 1, n: int = 64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g, dtype=D), torch.randn(n, 3, generator=g, dtype=D)


def _run(model: nn.Module, opt, steps: int = 6, batch: int = 24) -> torch.Tensor:
    X, Y = _data()
    for s in range(steps):
        x, y = X[s * 6: s * 6 + batch], Y[s * 6: s * 6 + batch]
        opt.step(lambda: _loss(model, x, y))
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _loss(model, x, y):
    for p in model.parameters():
        p.grad = None
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    return loss


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_equals_pytorch_optimizer_shampoo_without_momentum_or_grafting(eps):
    # pytorch_optimizer.Shampoo(momentum=0): L = εI + Σ GGᵀ, R = εI + Σ GᵀG, step L^{-1/4} G R^{-1/4}, roots by SVD;
    # ours with β₂ = 1 (sums), grafting="none" adds ε to the eigenvalues of the sums: the same matrices. Matrices
    # only: its 1-D tensors get a full [d, d] factor with exponent −1/2, ours the diagonal; its momentum mixes the
    # previous *preconditioned* step into the gradient, ours is a running mean of gradients.
    a, b = _mlp(), _mlp()
    ours = _run(a, Shampoo(a.parameters(), lr=0.1, grafting="none", epsilon=eps))
    theirs = _run(b, po.Shampoo(b.parameters(), lr=0.1, matrix_eps=eps))
    assert (ours - _flat(_mlp())).abs().max() > 1e-2          # it moved
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


def test_preconditioner_disabled_is_torch_adam_bit_for_bit():
    a, b = _mlp(bias=True), _mlp(bias=True)
    ours = _run(a, Shampoo(a.parameters(), lr=0.01, start_preconditioning_step=100, weight_decay=0.1))
    theirs = _run(b, torch.optim.Adam(b.parameters(), lr=0.01, weight_decay=0.1, foreach=False))
    assert torch.equal(ours, theirs)


def test_preconditioner_disabled_is_torch_sgd_bit_for_bit():
    a, b = _mlp(bias=True), _mlp(bias=True)
    ours = _run(a, Shampoo(a.parameters(), lr=0.05, grafting="sgd", start_preconditioning_step=100))
    theirs = _run(b, torch.optim.SGD(b.parameters(), lr=0.05, foreach=False))
    assert torch.equal(ours, theirs)


def test_grafting_takes_the_direction_of_shampoo_and_the_norm_of_adam():
    a, b, c = _mlp(), _mlp(), _mlp()
    x, y = _data()
    for m in (a, b, c):
        _loss(m, x, y)
    Shampoo(a.parameters(), lr=0.01, epsilon=1e-10).step()
    Shampoo(b.parameters(), lr=0.01, epsilon=1e-10, grafting="none").step()
    torch.optim.Adam(c.parameters(), lr=0.01).step()
    w0 = _mlp()
    for pa, pb, pc, p0 in zip(a.parameters(), b.parameters(), c.parameters(), w0.parameters()):
        da, db, dc = pa - p0, pb - p0, pc - p0
        torch.testing.assert_close(da.norm(), dc.norm(), rtol=1e-10, atol=0)
        assert torch.nn.functional.cosine_similarity(da.flatten(), db.flatten(), dim=0) > 1 - 1e-12


def _one_step(g: torch.Tensor, exponent: float, eps: float) -> torch.Tensor:
    w = nn.Parameter(torch.zeros_like(g))
    w.grad = g.clone()
    Shampoo([w], lr=1.0, exponent=exponent, epsilon=eps, grafting="none").step()
    return -w.detach()


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4)])
def test_one_step_with_exponent_minus_quarter_is_the_polar_factor(shape):
    # L^{-1/4} G R^{-1/4} = U S^{-1/2} Uᵀ · U S Vᵀ · V S^{-1/2} Vᵀ = U Vᵀ: Muon's target, exactly
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=D)
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    torch.testing.assert_close(_one_step(g, -0.25, 1e-24), u @ vh, rtol=0, atol=1e-8)


@pytest.mark.parametrize("shape", [(6, 6), (4, 9)])
def test_one_step_with_exponent_minus_half_is_the_transposed_pseudo_inverse(shape):
    # L^{-1/2} G R^{-1/2} = U S^{-1} Vᵀ = (G⁺)ᵀ; ε^{-1/2} multiplies the round-off of G on the null space of R, so ε
    # stays far above 1e-32 (ε/σ³ is the bias it leaves)
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=D)
    torch.testing.assert_close(_one_step(g, -0.5, 1e-16), torch.linalg.pinv(g).T, rtol=1e-6, atol=1e-6)


def test_one_example_per_step_exponent_minus_half_matches_the_rank_one_closed_form():
    # a linear layer s = W a, one example per step: G_t = g_t a_tᵀ, so L_T = Σ ‖a_t‖² g_t g_tᵀ and
    # R_T = Σ ‖g_t‖² a_t a_tᵀ (Morwani et al., arXiv:2406.17748, section 3); built here from the vectors a_t, g_t
    torch.manual_seed(5)
    lin = nn.Linear(4, 3, bias=False).to(D)
    opt = Shampoo(lin.parameters(), lr=0.1, exponent=-0.5, epsilon=1e-3, grafting="none")
    gen = torch.Generator().manual_seed(6)
    L, R = torch.zeros(3, 3, dtype=D), torch.zeros(4, 4, dtype=D)
    for _ in range(5):
        a, y = torch.randn(4, generator=gen, dtype=D), torch.randn(3, generator=gen, dtype=D)
        w = lin.weight.detach().clone()
        gvec = w @ a - y                                # ∂(½‖Wa − y‖²)/∂s
        L += (a @ a) * torch.outer(gvec, gvec)
        R += (gvec @ gvec) * torch.outer(a, a)
        lin.weight.grad = None
        (0.5 * ((lin(a) - y) ** 2).sum()).backward()
        opt.step()

        def root(m):
            u, s, _ = torch.linalg.svd(m)
            return u @ torch.diag((s + 1e-3) ** -0.5) @ u.T
        want = w - 0.1 * root(L) @ torch.outer(gvec, a) @ root(R)
        torch.testing.assert_close(lin.weight.detach(), want, rtol=0, atol=1e-12)


def test_one_dimensional_tensors_get_the_diagonal_factor():
    b = nn.Parameter(torch.zeros(5, dtype=D))
    g = torch.randn(5, generator=torch.Generator().manual_seed(7), dtype=D)
    opt = Shampoo([b], lr=1.0, grafting="none", epsilon=1e-4)
    for k in (1, 2):
        b.grad = g.clone()
        before = b.detach().clone()
        opt.step()
        torch.testing.assert_close(before - b.detach(), g / (k * g * g + 1e-4).sqrt(), rtol=1e-13, atol=0)


def test_matrix_power_is_the_eigen_power():
    m = torch.randn(5, 5, generator=torch.Generator().manual_seed(8), dtype=D)
    m = m @ m.T
    r = matrix_power(m, -0.5, 1e-9)
    torch.testing.assert_close(r @ r @ (m + 1e-9 * torch.eye(5, dtype=D)), torch.eye(5, dtype=D), rtol=0, atol=1e-8)


def test_precondition_interval_reuses_the_roots():
    a, b = _mlp(), _mlp()
    x, y = _data()
    oa = Shampoo(a.parameters(), lr=0.01, precondition_interval=3)
    ob = Shampoo(b.parameters(), lr=0.01, precondition_interval=1)
    for opt, m in ((oa, a), (ob, b)):
        for _ in range(3):
            opt.step(lambda: _loss(m, x, y))
    w = a[0].weight
    roots = oa.state[w]["roots"]
    want = matrix_power(oa.state[w]["factors"][0], -0.25, 1e-12)
    assert not torch.allclose(roots[0], want)          # computed at step 1, not refreshed at 2, 3
    assert torch.allclose(ob.state[b[0].weight]["roots"][0],
                          matrix_power(ob.state[b[0].weight]["factors"][0], -0.25, 1e-12))


# ------------------------------------------------------------------------------------------ torch.optim conventions
def test_closure_scheduler_frozen_and_shared_params():
    a = _mlp(bias=True)
    a[2].bias.requires_grad_(False)
    a[2].bias.grad = torch.ones_like(a[2].bias)            # stale gradient on a frozen parameter
    frozen = a[2].bias.detach().clone()
    opt = Shampoo(list(a.parameters()) + [a[0].weight], lr=0.05)   # listed twice: stepped once
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = _data()
    loss = opt.step(lambda: _loss(a, x, y))
    assert torch.is_tensor(loss) and torch.equal(a[2].bias, frozen)
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.025
    b = _mlp(bias=True)
    b[2].bias.requires_grad_(False)
    ob = Shampoo(b.parameters(), lr=0.05)
    ob.step(lambda: _loss(b, x, y))
    assert torch.equal(_flat(a), _flat(b))


def test_state_dict_resume_is_bit_identical():
    a = _mlp(bias=True)
    opt = Shampoo(a.parameters(), lr=0.02, betas=(0.9, 0.99), precondition_interval=2)
    ref_model = copy.deepcopy(a)
    ref = Shampoo(ref_model.parameters(), lr=0.02, betas=(0.9, 0.99), precondition_interval=2)
    x, y = _data()
    for _ in range(6):
        ref.step(lambda: _loss(ref_model, x, y))
    for _ in range(3):
        opt.step(lambda: _loss(a, x, y))
    saved, model_saved = copy.deepcopy(opt.state_dict()), copy.deepcopy(a.state_dict())
    b = _mlp(bias=True)
    b.load_state_dict(model_saved)
    ob = Shampoo(b.parameters(), lr=0.02, betas=(0.9, 0.99), precondition_interval=2)
    ob.load_state_dict(saved)
    for _ in range(3):
        ob.step(lambda: _loss(b, x, y))
    assert torch.equal(_flat(b), _flat(ref_model))


@pytest.mark.parametrize("kw, err", [
    ({"lr": float("nan")}, ValueError), ({"lr": -1.0}, ValueError), ({"exponent": 0.25}, ValueError),
    ({"exponent": float("nan")}, ValueError), ({"epsilon": 0.0}, ValueError), ({"betas": (1.0, 1.0)}, ValueError),
    ({"betas": (0.0, float("nan"))}, ValueError), ({"grafting": "adagrad"}, ValueError),
    ({"precondition_interval": 0}, ValueError), ({"precondition_interval": 1.5}, TypeError),
    ({"start_preconditioning_step": True}, TypeError), ({"graft_betas": (0.9, 1.0)}, ValueError),
    ({"weight_decay": -0.1}, ValueError), ({"betas": 0.9}, TypeError),
])
def test_bad_arguments_are_refused(kw, err):
    with pytest.raises(err):
        Shampoo(_mlp().parameters(), **kw)


def test_nonfinite_gradient_is_refused_and_group_edits_are_checked():
    w = nn.Parameter(torch.zeros(3, 3, dtype=D))
    opt = Shampoo([w])
    w.grad = torch.full_like(w, math.nan)
    with pytest.raises(ValueError, match="NaN"):
        opt.step()
    w.grad = torch.ones_like(w)
    opt.param_groups[0]["exponent"] = 1.0
    with pytest.raises(ValueError, match="exponent"):
        opt.step()


@pytest.mark.parametrize("args, err", [
    ((torch.eye(3)[:2], -0.5, 1e-6), ValueError), ((torch.eye(3, dtype=torch.long), -0.5, 1e-6), TypeError),
    ((torch.eye(3), float("nan"), 1e-6), ValueError), ((torch.eye(3), -0.5, 0.0), ValueError),
    ((torch.full((2, 2), math.inf), -0.5, 1e-6), ValueError), ((torch.eye(3), True, 1e-6), TypeError),
])
def test_matrix_power_refuses_bad_input(args, err):
    with pytest.raises(err):
        matrix_power(*args)


def test_matrix_power_survives_lapack_convergence_failures(monkeypatch):
    """On some CPU code paths LAPACK's eigh gives up on an ill-conditioned factor (a wrapped HF classifier under
    ATEN_CPU_CAPABILITY=default did): the root is then taken from a float64 retry, equal to the direct answer."""
    from taskloss.curvature import shampoo

    g = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    m = g @ g.T                                                       # rank 3 of 6: repeated zero eigenvalues
    want = shampoo.matrix_power(m.double(), -0.25, 1e-3).float()      # the fallback computes in float64
    real, calls = torch.linalg.eigh, []

    def flaky(x):
        calls.append(x.dtype)
        if x.dtype != torch.float64:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return real(x)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    got = shampoo.matrix_power(m, -0.25, 1e-3)
    assert calls == [torch.float32, torch.float64] and got.dtype == m.dtype
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
