"""taskloss.curvature.kfac beyond the factors: damping and gradients checked at use, bias-only blocks, per-token
outputs (against curvlinops), the float64 Cholesky retry, hook ownership, KL clipping under a learning-rate
schedule, eigenbasis reuse, and the preconditioned step against curvlinops' KFACInverseLinearOperator."""
import gc
import math

import pytest
import torch
from torch import nn

import taskloss.curvature as C
from taskloss.curvature import KFAC
from taskloss.curvature.kfac_math import eigen_inverse, eigenvalues_in_basis, pi_inverse, precondition

curvlinops = pytest.importorskip("curvlinops")
D = torch.float64


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def _batch(seed=1, n=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g, dtype=D), torch.randint(0, 3, (n,), generator=g)


def _grads(net):
    return torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None])


def _ready(net, k, X, y):
    out = net(X)
    k.update_statistics(outputs=out, targets=y)
    net.zero_grad()
    C.nll_loss(out, y).backward()


def _eye(params):
    return torch.eye(sum(p.numel() for p in params), dtype=D)


# ------------------------------------------------------------------------------ damping checked at use
@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf"), -float("inf")])
def test_damping_changed_after_construction_is_checked(bad):
    net, (X, y) = _mlp(), _batch()
    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(ValueError, match="damping must be > 0"):
        k.damping = bad
    _ready(net, k, X, y)
    k._damping = bad  # bypassing the setter is still caught when the damping is used
    with pytest.raises(ValueError, match="damping must be > 0"):
        k.precondition_()


@pytest.mark.parametrize("mode", ["eigen", "pi"])
def test_changed_damping_takes_effect_at_the_next_step(mode):
    net, (X, y) = _mlp(), _batch()
    k = KFAC(net, fisher_type="empirical", decay=0.0, damping=1e-2, damping_mode=mode, inverse_update_interval=100)
    _ready(net, k, X, y)
    k.precondition_()                      # inverses built with λ = 1e-2; the next refresh would be at step 100
    k.damping = 0.3
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    g = _grads(net)
    k.precondition_()
    if mode == "eigen":
        expected = torch.linalg.solve(k.to_dense() + 0.3 * _eye(net.parameters()), g)
    else:
        expected = _pi_reference(k, g, 0.3)
    torch.testing.assert_close(_grads(net), expected)


def _pi_reference(k, g, lam):
    blocks = []
    for name in k.modules:
        A, G = k.factors.A[name], k.factors.G[name]
        pi = math.sqrt((A.trace() / A.shape[0]) / (G.trace() / G.shape[0]))
        M = torch.kron(G + math.sqrt(lam) / pi * torch.eye(G.shape[0], dtype=D),
                       A + math.sqrt(lam) * pi * torch.eye(A.shape[0], dtype=D))
        idx = torch.arange(M.shape[0]).view(G.shape[0], A.shape[0])
        order = torch.cat([idx[:, :-1].reshape(-1), idx[:, -1]])
        blocks.append(M[order][:, order])
    return torch.linalg.solve(torch.block_diag(*blocks), g)


# ------------------------------------------------------------------------------- non-finite gradients / factors
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["0.weight", "2.bias"])
@pytest.mark.parametrize("kl_clip", [None, 1e-3])
def test_nonfinite_gradient_raises_in_step(value, where, kl_clip):
    net, (X, y) = _mlp(), _batch()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    k = KFAC(net, fisher_type="empirical", kl_clip=kl_clip, optimizer=opt)
    _ready(net, k, X, y)
    dict(net.named_parameters())[where].grad.view(-1)[1] = value
    layer = where.split(".")[0]
    with pytest.raises(ValueError, match=rf"gradients of K-FAC layers \['{layer}'\] contain NaN or inf"):
        k.precondition_()


@pytest.mark.parametrize("factor", ["A", "G"])
@pytest.mark.parametrize("mode", ["eigen", "pi"])
def test_nonfinite_factor_raises_in_step(factor, mode):
    net, (X, y) = _mlp(), _batch()
    k = KFAC(net, fisher_type="empirical", damping_mode=mode)
    _ready(net, k, X, y)
    getattr(k.factors, factor)["2"][0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"factors of layers \['2'\] contain NaN or inf"):
        k.precondition_()


def test_nonfinite_activations_are_caught_before_the_factors():
    net, (X, y) = _mlp(), _batch()
    k = KFAC(net, fisher_type="empirical")
    X[0, 0] = float("nan")
    with pytest.raises(ValueError, match="outputs contains NaN"):
        k.update_statistics(outputs=net(X), targets=y)


# ------------------------------------------------------------------------------------- bias-only blocks
@pytest.mark.parametrize("arch", ["linear", "conv"])
def test_frozen_weight_trainable_bias_gets_the_bias_block(arch):
    torch.manual_seed(3)
    if arch == "conv":
        net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 4)).double()
        X = torch.randn(6, 2, 5, 5, dtype=D)
    else:
        net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)).double()
        X = torch.randn(6, 5, dtype=D)
    y = torch.randint(0, 4, (6,))
    net[0].weight.requires_grad_(False)
    k = KFAC(net, fisher_type="empirical", decay=0.0, trust_region=None)
    k.update_statistics(outputs=net(X), targets=y)
    params = [p for p in net.parameters() if p.requires_grad]
    op = curvlinops.KFACLinearOperator(net, nn.CrossEntropyLoss(), params, [(X, y)], fisher_type="empirical",
                                       separate_weight_and_bias=False, check_deterministic=False)
    torch.testing.assert_close(k.to_dense(), op @ _eye(params))
    assert k.factors.A["0"].shape == (1, 1)
    # the step solves the (damped) bias block and leaves the frozen weight alone
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    g = _grads(net)
    k.precondition_()
    assert net[0].weight.grad is None
    torch.testing.assert_close(_grads(net), torch.linalg.solve(k.to_dense() + 1e-3 * _eye(params), g))


def test_weight_and_bias_both_frozen_layer_is_ignored():
    net = _mlp()
    for p in net[0].parameters():
        p.requires_grad_(False)
    assert list(KFAC(net).modules) == ["2"]


# ------------------------------------------------------------------------------------- per-token outputs
class _TokenNet(nn.Module):
    """Linear layers applied to every token: [N, T, D] → [N, T, C] (optionally [N, C, T] for curvlinops' CE)."""

    def __init__(self, class_dim_first=False):
        super().__init__()
        torch.manual_seed(4)
        self.inp, self.out = nn.Linear(3, 5), nn.Linear(5, 4)
        self.class_dim_first = class_dim_first

    def forward(self, x):
        out = self.out(torch.tanh(self.inp(x)))
        return out.transpose(1, 2) if self.class_dim_first else out


@pytest.mark.parametrize("fisher_type,clv_type", [("exact", "type-2"), ("empirical", "empirical")])
@pytest.mark.parametrize("likelihood,loss", [("categorical", "cross_entropy"), ("gaussian", "mse")])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_per_token_outputs_agree_with_curvlinops(fisher_type, clv_type, likelihood, loss, reduction):
    N, T = 5, 6
    X = torch.randn(N, T, 3, dtype=D, generator=torch.Generator().manual_seed(5))
    ours = _TokenNet().double()
    if likelihood == "categorical":
        y = torch.randint(0, 4, (N, T), generator=torch.Generator().manual_seed(6))
    else:
        y = torch.randn(N, T, 4, dtype=D, generator=torch.Generator().manual_seed(6))
    k = KFAC(ours, fisher_type=fisher_type, likelihood=likelihood, decay=0.0)
    k.update_statistics(outputs=ours(X), targets=y)
    theirs = _TokenNet(class_dim_first=likelihood == "categorical").double()
    theirs.load_state_dict(ours.state_dict())
    loss_fn = nn.CrossEntropyLoss(reduction=reduction) if loss == "cross_entropy" else nn.MSELoss(reduction=reduction)
    params = list(theirs.parameters())
    op = curvlinops.KFACLinearOperator(theirs, loss_fn, params, [(X[:2], y[:2]), (X[2:], y[2:])],
                                       fisher_type=clv_type, separate_weight_and_bias=False,
                                       check_deterministic=False)
    scale = C.curvature_scale(fisher_type, loss, reduction, N * T, 4)
    torch.testing.assert_close(op @ _eye(params), scale * k.to_dense())


def test_per_token_targets_must_match_the_outputs():
    net = _TokenNet().double()
    X = torch.randn(2, 3, 3, dtype=D)
    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(ValueError, match=r"targets must have shape \(2, 3\)"):
        k.update_statistics(outputs=net(X), targets=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="must lie in"):
        k.update_statistics(outputs=net(X), targets=torch.full((2, 3), 4))


# ------------------------------------------------------------------------------- π-damping float64 retry
@pytest.mark.parametrize("rel", [1e-8, 1e-9, 1e-10])
def test_pi_cholesky_retries_in_float64_like_curvlinops(rel):
    """An exactly PSD, rank-3 factor (small integers: every float32 product is exact) damped by δ ≈ rel·‖A‖ below
    float32's resolution: float32 Cholesky fails, float64 (damping added in float64) succeeds."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randint(-3, 4, (256, 3), generator=g) @ torch.randint(-3, 4, (3, 40), generator=g)).float()
    A, G = a.T @ a / 256, torch.eye(3)
    pi = math.sqrt((float(A.trace()) / 40) / (float(G.trace()) / 3))
    delta = rel * float(torch.linalg.matrix_norm(A.double(), 2))
    lam = (delta / pi) ** 2                                    # so that π√λ = δ
    assert int(torch.linalg.cholesky_ex(A + delta * torch.eye(40))[1]) != 0        # float32 fails …
    inv_a, inv_g = pi_inverse(A, G, lam, "layer")                                    # … the retry succeeds
    assert inv_a.dtype == torch.float32 and bool(torch.isfinite(inv_a).all())
    ref = torch.cholesky_inverse(torch.linalg.cholesky(A.double() + math.sqrt(lam) * pi * torch.eye(40, dtype=D)))
    torch.testing.assert_close(inv_a, ref.float())
    # through KFAC: the same factors give a finite step
    net = nn.Sequential(nn.Linear(39, 3)).float()
    k = KFAC(net, fisher_type="empirical", damping_mode="pi", damping=lam)
    k.factors.A, k.factors.G = {"0": A}, {"0": G}
    net[0].weight.grad, net[0].bias.grad = torch.ones(3, 39), torch.ones(3)
    k.precondition_()
    assert bool(torch.isfinite(net[0].weight.grad).all())


def test_pi_cholesky_failing_in_float64_too_raises_a_clear_error():
    A, G = torch.diag(torch.tensor([1.0, 1.0, 1.0, -2.5])), torch.eye(3)   # positive trace, indefinite
    with pytest.raises(ValueError, match=r"Cholesky of factor A .* of layer 'x' failed in torch.float32 and in "
                                         r"float64 .*increase the damping"):
        pi_inverse(A, G, 1e-6, "x")
    with pytest.raises(ValueError, match="failed even in float64"):
        pi_inverse(A.double(), G.double(), 1e-6, "x")
    with pytest.raises(ValueError, match="negative trace"):
        pi_inverse(-torch.eye(4), G, 1e-6, "x")


# ------------------------------------------------------------------------------------------ hook ownership
def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_hooks_are_owned_removed_and_never_left_behind():
    net, (X, y) = _mlp(), _batch()
    with KFAC(net, fisher_type="empirical") as k:
        assert _hooks(net) == 3                     # two layers + the model's pre-hook
        _ready(net, k, X, y)
        k.precondition_()
    assert _hooks(net) == 0
    with pytest.raises(RuntimeError, match="hooks were removed"):
        k.update_statistics(outputs=net(X), targets=y)
    k2 = KFAC(net)
    k2.remove()
    k2.remove()                                     # idempotent
    assert _hooks(net) == 0
    KFAC(net)                                       # dropped at once: garbage collection removes its hooks
    gc.collect()
    assert _hooks(net) == 0
    a, b = KFAC(net, fisher_type="empirical"), KFAC(net, fisher_type="empirical")
    _ready(net, a, X, y)                            # two owners on one model record independently
    b.update_statistics(outputs=net(X), targets=y)
    a.remove()
    b.remove()
    assert _hooks(net) == 0


# ---------------------------------------------------------------------------------- KL clip follows the lr
def test_kl_clip_reads_the_current_learning_rate_under_a_schedule():
    net, (X, y) = _mlp(), _batch()
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    clip = 1e-4
    k = KFAC(net, fisher_type="empirical", decay=0.0, kl_clip=clip, trust_region=None, optimizer=opt)
    free = KFAC(net, fisher_type="empirical", decay=0.0, trust_region=None)
    for lr in (0.5, 0.05):
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)
        out = net(X)
        k.update_statistics(outputs=out, targets=y)
        free.update_statistics(outputs=net(X), targets=y)
        net.zero_grad()
        C.nll_loss(net(X), y).backward()
        g = _grads(net)
        free.precondition_()
        v = _grads(net)
        net.zero_grad()
        C.nll_loss(net(X), y).backward()
        nu = k.precondition_()
        assert nu == pytest.approx(min(1.0, math.sqrt(clip / (lr**2 * float(v @ g)))))
        opt.step()
        sched.step()


def test_kl_clip_with_one_learning_rate_per_parameter():
    net, (X, y) = _mlp(), _batch()
    lrs = {"0.weight": 0.3, "0.bias": 0.2, "2.weight": 0.1, "2.bias": 0.05}
    opt = torch.optim.SGD([{"params": [p], "lr": lrs[n]} for n, p in net.named_parameters()])
    k = KFAC(net, fisher_type="empirical", decay=0.0, kl_clip=1e-6, trust_region=None, optimizer=opt)
    free = KFAC(net, fisher_type="empirical", decay=0.0, trust_region=None)
    k.update_statistics(outputs=net(X), targets=y)
    free.update_statistics(outputs=net(X), targets=y)
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    g = {n: p.grad.clone() for n, p in net.named_parameters()}
    free.precondition_()
    v = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    total = sum(lrs[n] ** 2 * float((v[n] * g[n]).sum()) for n in lrs)
    assert k.precondition_() == pytest.approx(min(1.0, math.sqrt(1e-6 / total)))


def test_kl_clip_needs_an_optimizer_that_holds_the_layers():
    net = _mlp()
    with pytest.raises(ValueError, match="kl_clip needs optimizer"):
        KFAC(net, kl_clip=1e-3)
    with pytest.raises(ValueError, match="does not hold"):
        KFAC(net, kl_clip=1e-3, optimizer=torch.optim.SGD(net[0].parameters(), lr=0.1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    k = KFAC(net, kl_clip=1e-3, optimizer=opt, fisher_type="empirical")
    X, y = _batch()
    _ready(net, k, X, y)
    opt.param_groups[0]["lr"] = 0.0
    with pytest.raises(ValueError, match="learning rate"):
        k.precondition_()


# ------------------------------------------------------------------------------------------ eigenbasis reuse
def test_eigenvalues_in_an_eigenbasis_are_the_eigenvalues():
    torch.manual_seed(8)
    M = torch.randn(6, 6, dtype=D)
    F = M @ M.T
    lam, Q = torch.linalg.eigh(F)
    torch.testing.assert_close(eigenvalues_in_basis(F, Q), lam)
    F2 = F + 0.1 * torch.eye(6, dtype=D) @ M @ M.T  # a new factor: the diagonal of Qᵀ F₂ Q
    torch.testing.assert_close(eigenvalues_in_basis(F2, Q), torch.diagonal(Q.T @ F2 @ Q))


def test_eigenbasis_reuse_keeps_bases_and_rescales_eigenvalues():
    net, (X, y) = _mlp(), _batch(n=16)
    k = KFAC(net, fisher_type="empirical", decay=0.5, inverse_update_interval=2, eigenbasis_update_interval=4)
    ref = KFAC(net, fisher_type="empirical", decay=0.5, inverse_update_interval=2)
    bases = []
    for step in range(5):
        xb, yb = X[step % 2 * 8:(step % 2 + 1) * 8], y[step % 2 * 8:(step % 2 + 1) * 8]
        for kk in (k, ref):
            _ready(net, kk, xb, yb)
            kk.precondition_()
        bases.append(k.factors.inverses["2"][0].clone())
        if step == 2:  # a refresh between eigendecompositions: old basis, eigenvalues diag(Qᵀ F Q)
            qa, qg, la, lg, inv_den = k.factors.inverses["2"]
            assert torch.equal(qa, bases[1])
            torch.testing.assert_close(la, torch.diagonal(qa.T @ k.factors.A["2"] @ qa))
            torch.testing.assert_close(lg, torch.diagonal(qg.T @ k.factors.G["2"] @ qg))
        if step == 4:  # a fresh eigendecomposition again: equal to the plain K-FAC
            torch.testing.assert_close(k.factors.inverses["2"][4], ref.factors.inverses["2"][4])
    assert torch.equal(bases[0], bases[1]) and not torch.equal(bases[3], bases[4])
    with pytest.raises(ValueError, match="multiple"):
        KFAC(net, inverse_update_interval=3, eigenbasis_update_interval=4)
    with pytest.raises(ValueError, match="eigen"):
        KFAC(net, damping_mode="pi", eigenbasis_update_interval=20)


# ------------------------------------------------------------------------- the step against curvlinops
@pytest.mark.parametrize("mode", ["eigen", "pi"])
def test_preconditioned_gradient_equals_curvlinops_inverse(mode):
    net, (X, y) = _mlp(), _batch()
    lam = 1e-2
    k = KFAC(net, fisher_type="empirical", decay=0.0, damping=lam, damping_mode=mode, trust_region=None)
    _ready(net, k, X, y)
    grads = [p.grad.clone() for p in net.parameters()]
    k.precondition_()
    params = list(net.parameters())
    op = curvlinops.KFACLinearOperator(net, nn.CrossEntropyLoss(), params, [(X, y)], fisher_type="empirical",
                                       separate_weight_and_bias=False, check_deterministic=False)
    inv = curvlinops.KFACInverseLinearOperator(op, damping=lam, use_heuristic_damping=mode == "pi",
                                               use_exact_damping=mode == "eigen")
    for ours, theirs in zip([p.grad for p in params], inv @ grads):
        torch.testing.assert_close(ours, theirs)


def test_eigen_inverse_solves_the_damped_kronecker_system():
    torch.manual_seed(9)
    a, g = torch.randn(10, 4, dtype=D), torch.randn(10, 3, dtype=D)
    A, G = a.T @ a, g.T @ g
    m = torch.randn(3, 4, dtype=D)
    x = precondition(eigen_inverse(A, G, 0.1), m)
    # (A ⊗ G + λI) vec(X) in the row-major convention of the module: G X A + λX = M
    torch.testing.assert_close(G @ x @ A + 0.1 * x, m)


def test_a_layer_the_outputs_do_not_use_raises_and_changes_nothing():
    class Aux(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 2)

        def forward(self, x):
            self.unused(x)
            return self.used(x)

    net = Aux().double()
    X, y = _batch()
    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(ValueError, match=r"do not depend on layers \['unused'\]"):
        k.update_statistics(outputs=net(X), targets=y)
    assert not k.factors.A and k.state_dict()["n_updates"] == 0
