"""The plain K-FAC step (``kfac_math.kfac_precondition_reference``: one dense Kronecker solve per layer, or the
π-damped sandwich, then the KL clip) against the tuned ``KFAC.precondition_`` (kept inverses, flat buffers, work
space), and the one way of feeding statistics shared with the diagonal preconditioner."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from taskloss.curvature import KFAC, FisherDiagonalPreconditioner, nll_loss
from taskloss.curvature.kfac_math import kfac_precondition_reference

D = torch.float64


def _setup(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    X = torch.randn(40, 4, dtype=D, generator=torch.Generator().manual_seed(seed))
    y = torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(seed + 1))
    return net, X, y


def _matrix(layer):
    return torch.cat([layer.weight.grad, layer.bias.grad[:, None]], 1)


@pytest.mark.parametrize("mode", ["eigen", "pi"])
@pytest.mark.parametrize("kl_clip,trust_region", [(None, None), (1e-4, None), (None, 1e-3), (1e-4, 1e-3)])
@pytest.mark.parametrize("flat", [True, False])
def test_reference_step_equals_the_fast_step(mode, kl_clip, trust_region, flat):
    net, X, y = _setup()
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    k = KFAC(net, damping=1e-2, fisher_type="mc", damping_mode=mode, decay=0.5, inverse_update_interval=1,
             kl_clip=kl_clip, trust_region=trust_region, optimizer=opt, generator=torch.Generator().manual_seed(3))
    k.use_flat_buffers = flat
    for it in range(3):
        out = net(X[10 * it:10 * it + 20])
        loss = nll_loss(out, y[10 * it:10 * it + 20])
        k.update_statistics(outputs=out)
        opt.zero_grad()
        loss.backward()
        grads = {"0": _matrix(net[0]), "2": _matrix(net[2])}
        # a KL clip replaces the trust region (KFAC); the reference applies what it is given
        want = kfac_precondition_reference(k.factors.A, k.factors.G, grads, 1e-2, mode, kl_clip=kl_clip, lr=0.3,
                                           trust_region=trust_region if kl_clip is None else None)
        nu = k.precondition_()
        assert (nu < 1) == (kl_clip is not None or trust_region is not None)   # the bounds bind here
        for name, layer in (("0", net[0]), ("2", net[2])):
            torch.testing.assert_close(_matrix(layer), want[name], rtol=1e-8, atol=1e-10)
        opt.step()


def test_update_statistics_runs_the_forward_itself_when_no_outputs_are_given():
    net, X, y = _setup(1)
    twin = copy.deepcopy(net)
    a = KFAC(net, fisher_type="empirical", decay=0.9)
    b = KFAC(twin, fisher_type="empirical", decay=0.9)
    for it in range(2):
        xb, yb = X[8 * it:8 * it + 16], y[8 * it:8 * it + 16]
        a.update_statistics(xb, yb, outputs=net(xb))
        b.update_statistics(xb, yb)
    for name in a.factors.A:
        assert torch.equal(a.factors.A[name], b.factors.A[name]) and torch.equal(a.factors.G[name], b.factors.G[name])
    with pytest.raises(ValueError, match="batch size"):
        a.update_statistics(X[:5], y[:5], outputs=net(X[:6]))
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor"):
        a.update_statistics("X", y)


def test_both_preconditioners_take_statistics_and_precondition_the_same_way():
    """The one protocol: ``update_statistics(inputs, targets)``, then ``precondition_()`` rewrites ``.grad``."""
    for make in (lambda m: KFAC(m, fisher_type="empirical"), lambda m: FisherDiagonalPreconditioner(m, "empirical")):
        net, X, y = _setup(2)
        pre = make(net)
        pre.update_statistics(X, y)
        nll_loss(net(X), y).backward()
        before = [p.grad.clone() for p in net.parameters()]
        pre.precondition_()
        assert any(not torch.equal(p.grad, g) for p, g in zip(net.parameters(), before))
        assert not hasattr(pre, "step") and not hasattr(pre, "update")
