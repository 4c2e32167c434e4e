"""taskloss.curvature.kfac: exactness where theory says so (dense GGN / EF blocks), curvlinops parity, the inverse, errors."""
import math

import pytest
import torch
from torch import nn

import taskloss.curvature as C
from taskloss.curvature import KFAC
from taskloss.curvature.kfac_math import input_moment, layer_rows

curvlinops = pytest.importorskip("curvlinops")


def _block_mask(model, modules):
    sizes = [sum(p.numel() for p in m.parameters()) for m in modules]
    P = sum(p.numel() for p in model.parameters())
    mask, i = torch.zeros(P, P, dtype=torch.float64), 0
    for s in sizes:
        mask[i:i + s, i:i + s] = 1
        i += s
    return mask


def _kfac_dense(model, X, targets=None, **kw):
    k = KFAC(model, decay=0.0, **kw)
    k.update_statistics(outputs=model(X), targets=targets)
    return k, k.to_dense()


def test_deep_linear_squared_error_one_point_is_exact_block_ggn():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3), nn.Linear(3, 2)).double()
    X = torch.randn(1, 4, dtype=torch.float64)
    mask = _block_mask(net, list(net))
    ggn = C.ggn_matrix(net, None, X, "gaussian")
    _, K = _kfac_dense(net, X, fisher_type="exact", likelihood="gaussian")
    torch.testing.assert_close(K, ggn * mask)
    # the MC version is exact in expectation: with more samples its error shrinks
    errs = []
    for S in (8, 512):
        _, Kmc = _kfac_dense(net, X, fisher_type="mc", likelihood="gaussian", n_samples=S,
                             generator=torch.Generator().manual_seed(0))
        errs.append(((Kmc - ggn * mask).norm() / ggn.norm()).item())
    assert errs[1] < errs[0] / 3 and errs[1] < 0.15, errs


def test_cross_entropy_one_point_is_exact_block_fisher_and_ef():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    X, y = torch.randn(1, 4, dtype=torch.float64), torch.tensor([2])
    lin = [m for m in net if isinstance(m, nn.Linear)]
    mask = _block_mask(net, lin)
    _, K = _kfac_dense(net, X, fisher_type="exact")
    torch.testing.assert_close(K, C.ggn_matrix(net, None, X) * mask)
    _, Kef = _kfac_dense(net, X, y, fisher_type="empirical")
    torch.testing.assert_close(Kef, C.empirical_fisher(net, None, X, y) * mask)


def _cnn():
    torch.manual_seed(2)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3, stride=2, dilation=1),
                         nn.Flatten(), nn.Linear(2 * 3 * 3, 4)).double()


@pytest.mark.parametrize("fisher_type,clv_type", [("exact", "type-2"), ("empirical", "empirical")])
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_agrees_with_curvlinops_kfac(fisher_type, clv_type, arch):
    torch.manual_seed(3)
    if arch == "cnn":
        net, X = _cnn(), torch.randn(6, 2, 8, 8, dtype=torch.float64)
    else:
        net, X = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)).double(), torch.randn(6, 5).double()
    y = torch.randint(0, 4, (6,))
    _, K = _kfac_dense(net, X, y, fisher_type=fisher_type)
    params = list(net.parameters())
    op = curvlinops.KFACLinearOperator(net, nn.CrossEntropyLoss(), params, [(X[:3], y[:3]), (X[3:], y[3:])],
                                       fisher_type=clv_type, separate_weight_and_bias=False,
                                       check_deterministic=False)
    torch.testing.assert_close(K, op @ torch.eye(sum(p.numel() for p in params), dtype=torch.float64))


def _grads(net):
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize("mode", ["eigen", "pi"])
def test_step_applies_damped_inverse(mode):
    net, X = _cnn(), torch.randn(5, 2, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (5,))
    lam = 0.05
    k = KFAC(net, damping=lam, damping_mode=mode, fisher_type="empirical", decay=0.0, trust_region=None)
    out = net(X)
    k.update_statistics(outputs=out, targets=y)
    C.nll_loss(out, y).backward()
    g = _grads(net)
    k.precondition_()
    blocks = []
    for name, mod in k.modules.items():
        A, G = k.factors.A[name], k.factors.G[name]
        if mode == "eigen":
            M = torch.kron(G, A) + lam * torch.eye(A.shape[0] * G.shape[0], dtype=A.dtype)
        else:
            pi = math.sqrt((A.trace() / A.shape[0]) / (G.trace() / G.shape[0]))
            M = torch.kron(G + math.sqrt(lam) / pi * torch.eye(G.shape[0], dtype=A.dtype),
                           A + math.sqrt(lam) * pi * torch.eye(A.shape[0], dtype=A.dtype))
        out_dim, d = G.shape[0], A.shape[0]
        idx = torch.arange(out_dim * d).view(out_dim, d)
        order = torch.cat([idx[:, :-1].reshape(-1), idx[:, -1]])
        blocks.append(M[order][:, order])
    M = torch.block_diag(*blocks)
    torch.testing.assert_close(_grads(net), torch.linalg.solve(M, g))


def test_kl_clip_running_average_and_intervals():
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    X, y = torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 3, (8,))
    # running average: F = decay·F_old + (1 − decay)·F_batch
    k = KFAC(net, fisher_type="exact", decay=0.75, factor_update_interval=1)
    k.update_statistics(outputs=net(X[:4]))
    A1 = {n: a.clone() for n, a in k.factors.A.items()}
    k.update_statistics(outputs=net(X[4:]))
    k0 = KFAC(net, fisher_type="exact", decay=0.0)
    k0.update_statistics(outputs=net(X[4:]))
    for n in k.factors.A:
        torch.testing.assert_close(k.factors.A[n], 0.75 * A1[n] + 0.25 * k0.factors.A[n])
    # factor interval 2: the second update is skipped
    k2 = KFAC(net, fisher_type="exact", decay=0.0, factor_update_interval=2)
    k2.update_statistics(outputs=net(X[:4]))
    A1 = {n: a.clone() for n, a in k2.factors.A.items()}
    k2.update_statistics(outputs=net(X[4:]))
    assert all(torch.equal(k2.factors.A[n], A1[n]) for n in A1)
    # KL clipping: ν = min(1, sqrt(kl_clip / (lr² Σ gᵀF⁻¹g)))
    lr, clip = 0.5, 1e-4
    kc = KFAC(net, fisher_type="empirical", decay=0.0, kl_clip=clip, trust_region=None,
              optimizer=torch.optim.SGD(net.parameters(), lr=lr))
    ku = KFAC(net, fisher_type="empirical", decay=0.0, trust_region=None)
    out = net(X)
    kc.update_statistics(outputs=out, targets=y)
    ku.update_statistics(outputs=net(X), targets=y)
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    g = _grads(net)
    assert ku.precondition_() == 1.0
    v = _grads(net)
    net.zero_grad()
    C.nll_loss(net(X), y).backward()
    nu = kc.precondition_()
    assert nu == pytest.approx(min(1.0, math.sqrt(clip / (lr**2 * float(v @ g)))))
    assert nu < 1.0
    torch.testing.assert_close(_grads(net), nu * v)


def test_training_with_kfac_reduces_loss_faster_than_plain_sgd():
    torch.manual_seed(5)
    X = torch.randn(64, 6)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 1).long()
    finals = {}
    for use_kfac in (False, True):
        torch.manual_seed(6)
        net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        k = KFAC(net, damping=1e-2, fisher_type="mc", generator=torch.Generator().manual_seed(0)) if use_kfac else None
        for _ in range(30):
            out = net(X)
            loss = C.nll_loss(out, y)
            if k:
                k.update_statistics(outputs=out, targets=y)
            opt.zero_grad()
            loss.backward()
            if k:
                k.precondition_()
            opt.step()
        finals[use_kfac] = C.nll_loss(net(X), y).item()
    assert finals[True] < 0.5 * finals[False], finals


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    X, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    with pytest.raises(ValueError, match="damping"):
        KFAC(net, damping=0.0)
    with pytest.raises(ValueError, match="damping"):
        KFAC(net, damping=-1e-3)
    with pytest.raises(ValueError, match="fisher_type"):
        KFAC(net, fisher_type="true")
    with pytest.raises(ValueError, match="kl_clip needs optimizer"):
        KFAC(net, kl_clip=1e-3)
    with pytest.raises(ValueError, match="inverse_update_interval"):
        KFAC(net, inverse_update_interval=0)
    with pytest.raises(ValueError, match="decay"):
        KFAC(net, decay=1.0)

    class WithLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    lstm_net = WithLSTM()
    with pytest.raises(ValueError, match="LSTM"):
        KFAC(lstm_net)
    k = KFAC(lstm_net, skip_unsupported=True, fisher_type="empirical")
    assert k.skipped == ["lstm"] and list(k.modules) == ["head"]
    Xs = torch.randn(5, 2, 3)
    out = lstm_net(Xs)
    k.update_statistics(outputs=out, targets=y)
    nn.functional.cross_entropy(out, y).backward()
    g_lstm = [p.grad.clone() for p in lstm_net.lstm.parameters()]
    k.precondition_()
    assert all(torch.equal(a, p.grad) for a, p in zip(g_lstm, lstm_net.lstm.parameters()))
    with pytest.raises(ValueError, match="no trainable"):
        KFAC(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="groups"):
        KFAC(nn.Sequential(nn.Conv2d(2, 2, 3, groups=2)))

    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(RuntimeError, match="update"):
        k.precondition_()
    with pytest.raises(ValueError, match="targets"):
        k.update_statistics(outputs=net(X))
    with pytest.raises(ValueError, match="shape"):
        k.update_statistics(outputs=net(X), targets=y[:3])
    with pytest.raises(ValueError, match="batch size"):
        net(X)  # the layers saw 5 examples; outputs claim 3
        k.update_statistics(outputs=torch.zeros(3, 2, requires_grad=True), targets=y[:3])
    with pytest.raises(ValueError, match="graph"):
        k.update_statistics(outputs=net(X).detach(), targets=y)
    with pytest.raises(RuntimeError, match="exactly once"):
        k.update_statistics(outputs=torch.zeros(5, 2, requires_grad=True), targets=y)  # no forward since the last update

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    shared = Shared()
    ks = KFAC(shared, fisher_type="empirical")
    with pytest.raises(RuntimeError, match="exactly once"):
        ks.update_statistics(outputs=shared(torch.randn(4, 2)), targets=torch.randint(0, 2, (4,)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)).double()
    X = torch.randn(6, 5, dtype=torch.float64)
    v = torch.randn(sum(p.numel() for p in net.parameters()), dtype=torch.float64)
    results = {}
    for dev in ("cpu", "cuda"):
        n = net.to(dev)
        k = KFAC(n, fisher_type="exact", decay=0.0)
        k.update_statistics(outputs=n(X.to(dev)))
        results[dev] = (C.ggn_vector_product(n, None, X.to(dev), v.to(dev)).cpu(), k.to_dense().cpu(),
                        C.mc_fisher_diagonal(n, None, X.to(dev), n_samples=2,
                                             generator=torch.Generator().manual_seed(0)).cpu())
    for a, b in zip(results["cpu"], results["cuda"]):
        torch.testing.assert_close(a, b)


def test_linear_on_sequences_uses_the_expand_convention_like_curvlinops():
    """A Linear layer applied to [N, T, D] inputs (weight sharing over T), pooled to [N, C] outputs."""
    torch.manual_seed(8)

    class SeqNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.lin(x)).mean(1))

    net = SeqNet().double()
    X, y = torch.randn(5, 6, 3, dtype=torch.float64), torch.randint(0, 2, (5,))
    _, K = _kfac_dense(net, X, y, fisher_type="empirical")
    params = list(net.parameters())
    op = curvlinops.KFACLinearOperator(net, nn.CrossEntropyLoss(), params, [(X, y)], fisher_type="empirical",
                                       separate_weight_and_bias=False, check_deterministic=False)
    torch.testing.assert_close(K, op @ torch.eye(sum(p.numel() for p in params), dtype=torch.float64))


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=2), dict(padding=(1, 2), stride=(2, 1)),
                                    dict(padding=1, bias=False), dict(dilation=2, padding=1)])
def test_conv_patches_equal_unfold(kwargs):
    """The strided-view patch extraction equals unfold → transpose → reshape (→ append ones for the bias)."""
    conv = nn.Conv2d(3, 4, (3, 2), **kwargs)
    x = torch.randn(2, 3, 7, 6)
    ref = nn.functional.unfold(x, conv.kernel_size, dilation=conv.dilation, padding=conv.padding,
                               stride=conv.stride).transpose(1, 2).reshape(-1, 3 * 3 * 2)
    if conv.bias is not None:
        ref = torch.cat([ref, ref.new_ones(ref.shape[0], 1)], dim=1)
    assert torch.equal(layer_rows(conv, x, conv.bias is not None), ref)


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=2), dict(padding=(1, 2), stride=(2, 1)),
                                    dict(padding=1, bias=False), dict(dilation=2, padding=1)])
def test_input_moment_equals_the_second_moment_of_the_patch_rows(kwargs):
    """The channels-last patch path of ``input_moment`` is a permutation of the unfold rows' columns, so every
    entry of ``A`` is the same sum over the same rows; float64 reference, float32 compared at float32 resolution
    (the GEMM may block the columns differently, which may change how its partial sums are rounded)."""
    conv = nn.Conv2d(3, 4, (3, 2), **kwargs)
    x = torch.randn(5, 3, 7, 6)
    bias = conv.bias is not None
    ref = layer_rows(conv, x.double(), bias)
    ref = ref.T @ ref / ref.shape[0]
    torch.testing.assert_close(input_moment(conv, x.double(), bias), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(input_moment(conv, x, bias), ref.float(), rtol=1e-5, atol=1e-6)
