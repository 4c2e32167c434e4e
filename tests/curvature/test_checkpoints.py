"""Every optimizer-like class of taskloss.curvature resumes bit-identically: train k steps, save the state dicts
(model, optimizer, preconditioner — through torch.save, as a checkpoint would), restore into fresh objects built
from different seeds, continue — the parameters equal an uninterrupted run exactly (same process, same kernels,
so the arithmetic is deterministic)."""
import io

import pytest
import torch
from torch import nn

import taskloss.curvature as C

D = torch.float64
K_STEPS, MORE_STEPS = 5, 6


def _data(n=48):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 5, generator=g, dtype=D), torch.randint(0, 3, (n,), generator=g)


def _batch(X, y, i, bs=16):
    j = (i * bs) % len(X)
    return X[j:j + bs], y[j:j + bs]


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _resume_matches(build, step):
    """``build(seed) -> objects`` (objects[0] the model; the rest have state_dict); ``step(objects, i)``."""
    X, y = _data()
    ref = build(0)
    for i in range(K_STEPS + MORE_STEPS):
        step(ref, X, y, i)
    first = build(0)
    for i in range(K_STEPS):
        step(first, X, y, i)
    saved = _roundtrip([o.state_dict() for o in first])
    fresh = build(123)  # different initial weights and generator seeds: everything must come from the checkpoint
    for o, s in zip(fresh, saved):
        o.load_state_dict(s)
    for i in range(K_STEPS, K_STEPS + MORE_STEPS):
        step(fresh, X, y, i)
    for a, b in zip(ref[0].parameters(), fresh[0].parameters()):
        assert torch.equal(a, b), float((a - b).abs().max())


@pytest.mark.parametrize("kw", [dict(damping_mode="pi", kl_clip=1e-2),
                                dict(damping_mode="eigen", kl_clip=1e-2),
                                dict(damping_mode="eigen", inverse_update_interval=2, eigenbasis_update_interval=4),
                                dict(damping_mode="eigen", fisher_type="mc", n_samples=3)])
def test_kfac_with_sgd_and_a_schedule_resumes_bit_identically(kw):
    kw = dict(dict(fisher_type="mc", factor_update_interval=2, inverse_update_interval=3, damping=0.05), **kw)

    def build(seed):
        net = _net(seed)
        opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        kfac = C.KFAC(net, generator=torch.Generator().manual_seed(seed), optimizer=opt, **kw)
        return net, opt, sched, kfac

    def step(objs, X, y, i):
        net, opt, sched, kfac = objs
        xb, yb = _batch(X, y, i)
        out = net(xb)
        loss = C.nll_loss(out, yb)
        kfac.update_statistics(outputs=out, targets=yb)
        opt.zero_grad()
        loss.backward()
        kfac.precondition_()
        opt.step()
        sched.step()

    _resume_matches(build, step)


def test_kfac_state_dict_is_checked_on_load():
    net = _net(0)
    X, y = _data()
    k = C.KFAC(net, fisher_type="empirical")
    k.update_statistics(outputs=net(X), targets=y)
    s = k.state_dict()
    with pytest.raises(ValueError, match="saved with"):
        C.KFAC(net, fisher_type="exact").load_state_dict(s)
    with pytest.raises(ValueError, match="layers"):
        C.KFAC(nn.Sequential(nn.Linear(5, 3)).double(), fisher_type="empirical").load_state_dict(s)
    with pytest.raises(ValueError, match="generator"):
        C.KFAC(net, fisher_type="empirical", generator=torch.Generator()).load_state_dict(s)
    with pytest.raises(ValueError, match="not a KFAC state_dict"):
        k.load_state_dict({"A": {}})
    bad = dict(s, A=dict(s["A"], **{"0": s["A"]["0"][:-1, :-1]}))  # a factor of another layer shape
    with pytest.raises(ValueError, match="factors of layer '0' have shapes"):
        C.KFAC(net, fisher_type="empirical").load_state_dict(bad)
    s["damping"] = -1.0
    with pytest.raises(ValueError, match="damping"):
        k.load_state_dict(s)
    s["A"]["0"].fill_(7.0)  # the state_dict holds copies
    assert not torch.equal(k.factors.A["0"], s["A"]["0"])


def test_natural_gradient_descent_resumes_bit_identically():
    def build(seed):
        net = _net(seed)
        X, _ = _data()
        groups = [{"params": net[0].parameters(), "damping": 0.1}, {"params": net[2].parameters(), "lr": 0.3}]
        opt = C.NaturalGradientDescent(groups, fisher=lambda: C.ggn_matrix(net, None, X[:16]), lr=0.5, damping=0.2)
        return net, opt

    def step(objs, X, y, i):
        net, opt = objs
        xb, yb = _batch(X, y, i)

        def closure():
            opt.zero_grad()
            loss = C.nll_loss(net(xb), yb)
            loss.backward()
            return loss

        opt.step(closure)

    _resume_matches(build, step)


def test_hessian_free_resumes_bit_identically():
    def build(seed):
        net = _net(seed)
        return net, C.HessianFree(net.parameters(), net, lr=1.0, damping=0.5, cg_iters=4)

    def step(objs, X, y, i):
        net, opt = objs
        xb, yb = _batch(X, y, i)

        def closure():
            opt.zero_grad()
            loss = C.nll_loss(net(xb), yb)
            loss.backward()
            return loss, xb[:8]

        opt.step(closure)

    _resume_matches(build, step)


def test_fisher_diagonal_preconditioner_with_sgd_resumes_bit_identically():
    def build(seed):
        net = _net(seed)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        pre = C.FisherDiagonalPreconditioner(net, "mc", damping=0.1, decay=0.8, n_samples=2,
                                             generator=torch.Generator().manual_seed(seed))
        return net, opt, pre

    def step(objs, X, y, i):
        net, opt, pre = objs
        xb, yb = _batch(X, y, i)
        opt.zero_grad()
        C.nll_loss(net(xb), yb).backward()
        pre.update_statistics(xb, yb)
        pre.precondition_()
        opt.step()

    _resume_matches(build, step)


def test_fisher_diagonal_state_dict_is_checked_on_load():
    net = _net(0)
    pre = C.FisherDiagonalPreconditioner(net, "exact")
    X, y = _data()
    pre.update_statistics(X, y)
    s = pre.state_dict()
    with pytest.raises(ValueError, match="fisher_type"):
        C.FisherDiagonalPreconditioner(net, "empirical").load_state_dict(s)
    with pytest.raises(ValueError, match="generator"):
        C.FisherDiagonalPreconditioner(net, "exact", generator=torch.Generator()).load_state_dict(s)
    with pytest.raises(ValueError, match="not a FisherDiagonalPreconditioner"):
        pre.load_state_dict({})
