"""taskloss.curvature.kfac's fast paths give the results of the straightforward ones: the flat-buffer step equals
the per-layer step, and detaching the hooks between factor updates records exactly the batches that the factors
use (the same factors as feeding only those batches), across checkpoints."""
import pytest
import torch
from torch import nn

import taskloss.curvature as C
from taskloss.curvature import KFAC


def _net(kind, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    if kind == "mlp":
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    elif kind == "frozen":  # a bias-only block and a layer without bias between ordinary ones
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5, bias=False), nn.Tanh(), nn.Linear(5, 3))
        net[0].weight.requires_grad_(False)
    else:
        net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 2, stride=2), nn.Flatten(),
                            nn.Linear(2 * 3 * 3, 3))
    return net.to(dtype)


def _batches(kind, n_batches, dtype=torch.float64, bs=8):
    g = torch.Generator().manual_seed(1)
    shape = (bs, 4) if kind != "cnn" else (bs, 1, 6, 6)
    return [(torch.randn(*shape, generator=g, dtype=dtype), torch.randint(0, 3, (bs,), generator=g))
            for _ in range(n_batches)]


def _train(kind, flat, dtype=torch.float64, steps=12, **kw):
    net = _net(kind, dtype=dtype)
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    kfac = KFAC(net, optimizer=opt, generator=torch.Generator().manual_seed(2), **kw)
    kfac.use_flat_buffers = flat
    grads, nus = [], []
    for x, y in _batches(kind, steps, dtype):
        out = net(x)
        loss = C.nll_loss(out, y)
        kfac.update_statistics(outputs=out, targets=y)
        opt.zero_grad()
        loss.backward()
        nus.append(kfac.precondition_())
        grads.append([p.grad.clone() for p in net.parameters() if p.grad is not None])
        opt.step()
    assert (kfac.gradients._flat is not None) == flat  # the path under test was taken
    return grads, nus


@pytest.mark.parametrize("kind", ["mlp", "frozen", "cnn"])
@pytest.mark.parametrize("kw", [dict(damping_mode="pi", kl_clip=1e-2), dict(damping_mode="eigen", kl_clip=1e-2),
                                dict(damping_mode="eigen"), dict(damping_mode="pi")])
def test_flat_buffer_step_equals_the_per_layer_step(kind, kw):
    """Same preconditioned gradients and KL factors over 12 steps (factors every 3rd, inverses every 2nd step).
    The matmuls are the same; only Σ vᵀg of the KL clip is one dot product over all layers instead of a sum of
    per-layer ones (another float summation order), so float64 agrees to ~1e-15 and float32 to float32
    resolution amplified by the 12 steps of training that follow (compared at 1e-4)."""
    kw = dict(kw, factor_update_interval=3, inverse_update_interval=2, damping=0.1, fisher_type="mc")
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-4)):
        (g_flat, nu_flat), (g_ref, nu_ref) = _train(kind, True, dtype, **kw), _train(kind, False, dtype, **kw)
        torch.testing.assert_close(nu_flat, nu_ref, rtol=tol, atol=0)
        for a, b in zip(g_flat, g_ref):
            for ga, gb in zip(a, b):
                torch.testing.assert_close(ga, gb, rtol=tol, atol=tol * float(gb.abs().max()))


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_hooks_detached_between_factor_updates_record_exactly_the_factor_batches(kind):
    """T_cov = 3 over 9 batches gives bit-for-bit the factors of T_cov = 1 over batches 0, 3, 6 (the same kernels
    on the same numbers in the same process; the MC generator draws only at factor updates in both), and the hooks
    are attached only while the next update computes factors."""
    batches = _batches(kind, 9)
    net = _net(kind)
    every3 = KFAC(net, fisher_type="mc", factor_update_interval=3, generator=torch.Generator().manual_seed(5))
    attached = []
    for x, y in batches:
        attached.append(_hooks(net) > 0)
        every3.update_statistics(outputs=net(x), targets=y)
    assert attached == [True, False, False] * 3
    net1 = _net(kind)
    each = KFAC(net1, fisher_type="mc", factor_update_interval=1, generator=torch.Generator().manual_seed(5))
    for x, y in batches[::3]:
        each.update_statistics(outputs=net1(x), targets=y)
    for k in every3.modules:
        assert torch.equal(every3.factors.A[k], each.factors.A[k]) and torch.equal(every3.factors.G[k], each.factors.G[k]), k


def test_hooks_follow_interval_changes_checkpoints_and_removal():
    net = _net("mlp")
    (x, y), = _batches("mlp", 1)
    k = KFAC(net, factor_update_interval=2)
    k.update_statistics(outputs=net(x), targets=y)
    assert _hooks(net) == 0                      # the next update skips the factors: nothing to record
    k.factor_update_interval = 1                 # ... until the interval says otherwise
    assert _hooks(net) == 4
    k.update_statistics(outputs=net(x), targets=y)                          # records and folds this batch
    assert k._n_updates == 2
    k.factor_update_interval = 3
    assert _hooks(net) == 0
    state = k.state_dict()
    fresh = KFAC(net, factor_update_interval=1)
    assert _hooks(net) == 4                      # fresh's hooks (k has none now)
    fresh.load_state_dict(state)                 # n_updates = 2, interval 3: detached like the saved object
    assert _hooks(net) == 0
    fresh.update_statistics(outputs=net(x), targets=y)                      # n_updates = 3 next: attached again
    assert _hooks(net) == 4
    fresh.remove()
    k.remove()
    assert _hooks(net) == 0
    k.factor_update_interval = 1                 # a removed KFAC never re-attaches
    assert _hooks(net) == 0
    with pytest.raises(RuntimeError, match="hooks were removed"):
        k.update_statistics(outputs=net(x), targets=y)


# ---------------------------------------------------------------------------------------- the factor update path
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
@pytest.mark.parametrize("decay", [0.0, 0.5, 0.95])
def test_fold_moment_is_the_running_average(dtype, tol, decay):
    """One in-place addmm equals scaling the old average and adding the batch moment (the two-pass formula it
    replaced): the same sums, rounded in another order inside the GEMM — hence a tolerance at the dtype's
    resolution, not equality; without an old average (or decay 0) it is the batch moment itself, exactly."""
    from taskloss.curvature.kfac_math import fold_moment, second_moment
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(37, 6, generator=g, dtype=dtype), torch.randn(50, 6, generator=g, dtype=dtype)
    old = second_moment(y, 50)
    ref = old * decay + second_moment(x, 37) * (1 - decay)
    assert torch.equal(fold_moment(None, x, 37, decay), second_moment(x, 37))
    out = fold_moment(old.clone(), x, 37, decay)
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    if decay > 0:
        kept = old.clone()
        assert fold_moment(kept, x, 37, decay) is kept  # in place: no new [D, D] tensor


@pytest.mark.parametrize("kind", ["mlp", "frozen", "cnn"])
def test_running_factors_match_the_two_pass_average_of_batch_factors(kind):
    """Over 5 batches with decay 0.9 the running factors equal the average built from each batch's own factors
    (decay 0 gives exactly the batch factors) with the scale-and-add formula in float64: the in-place fold of
    ``update`` computes the same average (to float64 rounding)."""
    batches = _batches(kind, 5)
    net = _net(kind)
    running = KFAC(net, decay=0.9, generator=torch.Generator().manual_seed(3))
    fresh = KFAC(_net(kind), decay=0.0, generator=torch.Generator().manual_seed(3))
    fresh.model.load_state_dict(net.state_dict())
    ref_A, ref_G = {}, {}
    for x, y in batches:
        running.update_statistics(outputs=net(x), targets=y)
        fresh.update_statistics(outputs=fresh.model(x), targets=y)  # the same MC draws: the generators advance alike
        for k in fresh.modules:
            a, gg = fresh.factors.A[k], fresh.factors.G[k]
            ref_A[k] = a.clone() if k not in ref_A else ref_A[k] * 0.9 + a * 0.1
            ref_G[k] = gg.clone() if k not in ref_G else ref_G[k] * 0.9 + gg * 0.1
    for k in running.modules:
        torch.testing.assert_close(running.factors.A[k], ref_A[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(running.factors.G[k], ref_G[k], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n_samples", [1, 3])
def test_mc_cotangents_reuse_one_softmax_with_the_same_draws(n_samples):
    """The MC output gradients are computed from one softmax for the draws and the gradients: bit-for-bit what
    ``sample_targets`` then ``softmax − onehot`` give with an identically seeded generator (the same kernels on the
    same numbers)."""
    from taskloss.curvature.fisher import nll_grad
    net = _net("mlp")
    out = net(_batches("mlp", 1)[0][0]).detach()
    k = KFAC(net, fisher_type="mc", n_samples=n_samples, generator=torch.Generator().manual_seed(7))
    got = k._output_cotangents(out, None)
    ys = C.sample_targets(out, "categorical", n_samples, torch.Generator().manual_seed(7))
    want = torch.stack([nll_grad(out, y, "categorical") for y in ys])
    if n_samples > 1:
        want = want / n_samples**0.5
    assert torch.equal(got, want)


def test_non_finite_inputs_and_outputs_still_raise_on_the_mc_path():
    """The MC path checks the outputs at every factor update, and non-finite factors (an inf input behind a
    saturating tanh leaves the outputs finite) are caught at the next inverse refresh."""
    net = _net("mlp")
    (x, y), = _batches("mlp", 1)
    k = KFAC(net, fisher_type="mc", generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="outputs contains NaN"):
        k.update_statistics(outputs=net(x) * float("nan"), targets=y)
    x = x.clone()
    x[0, 0] = float("inf")
    out = net(x)
    assert bool(torch.isfinite(out).all())
    k.update_statistics(outputs=out, targets=y)
    C.nll_loss(out, y).backward()
    with pytest.raises(ValueError, match=r"factors of layers \['0'\] contain NaN or inf"):
        k.precondition_()


@pytest.mark.parametrize("mode", ["eigen", "pi"])
def test_precondition_into_work_buffers_equals_the_allocating_products(mode):
    """``precondition(..., out=, work=)`` runs the same products in the same order into preallocated buffers (views
    of one shared scratch, as the flat step uses them): equal to the allocating form up to the GEMM library's
    alignment-dependent blocking (float64, 1e-12)."""
    from taskloss.curvature.kfac_math import eigen_inverse, pi_inverse, precondition, second_moment
    g = torch.Generator().manual_seed(0)
    A = second_moment(torch.randn(40, 7, generator=g, dtype=torch.float64), 40)
    G = second_moment(torch.randn(40, 5, generator=g, dtype=torch.float64), 40)
    inv = eigen_inverse(A, G, 0.1) if mode == "eigen" else pi_inverse(A, G, 0.1)
    m = torch.randn(5, 7, generator=g, dtype=torch.float64)
    scratch = torch.full((2, 50), float("nan"), dtype=torch.float64)
    out = torch.empty(5, 7, dtype=torch.float64)
    got = precondition(inv, m, out=out, work=(scratch[0, :35].view(5, 7), scratch[1, :35].view(5, 7)))
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got, precondition(inv, m), rtol=1e-12, atol=1e-12)
