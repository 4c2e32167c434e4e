"""Higher-order derivatives and torch.func transforms through the EMO loss: Hessian-vector products (double
backward) against the dense float64 Hessian of the reference formula, and torch.func grad / vmap / jvp / hessian
against plain autograd."""
from __future__ import annotations

import pytest
import torch
from helpers import emo_official_reference
from torch.func import grad, hessian, jacrev, jvp, vmap

from taskloss.losses import COMBINES, VARIANTS, EMOLoss, emo_and_mle_per_token, emo_loss, emo_soft_upper_bound

F64 = torch.float64


def _inputs(n=5, v=6, d=3, seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g, dtype=F64) * 1.5
    t = torch.randint(0, v, (n,), generator=g)
    if pad:
        t[1] = -100
    e = torch.randn(v, d, generator=g, dtype=F64)
    return x, t, e


def _hvp_double_backward(f, x, vec):
    x = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * vec).sum(), x)
    return hv


def _dense_hessian(f, x):
    n = x.numel()
    return torch.autograd.functional.hessian(lambda z: f(z.reshape(x.shape)), x.reshape(-1)).reshape(n, n)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_hvp_matches_dense_float64_hessian(combine, variant, reduction):
    """Double backward through the fused loss equals H·v of the dense reference formula (the combinations' ratios
    are stop-gradient in both, so their Hessian is that of the frozen-ratio objective)."""
    x, t, e = _inputs()
    vec = torch.randn(x.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    ours = _hvp_double_backward(lambda z: emo_loss(z, t, e, combine=combine, variant=variant, reduction=reduction,
                                                   chunk_size=2), x, vec)
    h = _dense_hessian(lambda z: emo_official_reference(z, t, e, combine=combine, variant=variant,
                                                        reduction=reduction), x)
    assert h.abs().max() > 1e-3  # a Hessian that is not zero
    torch.testing.assert_close(ours, (h @ vec.reshape(-1)).reshape(x.shape), rtol=1e-9, atol=1e-11)


def test_hvp_of_per_token_outputs_and_module():
    x, t, e = _inputs(seed=2)
    vec = torch.randn(x.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    w = torch.rand(x.shape[0], dtype=F64, generator=torch.Generator().manual_seed(4))

    def per_token(z):
        emo, mle, _ = emo_and_mle_per_token(z, t, e, chunk_size=2)
        return (w * emo + (1 - w) * mle).sum()

    def reference(z):
        emo = emo_official_reference(z, t, e, reduction="none")
        mle = emo_official_reference(z, t, e, combine="mle", reduction="none")
        return (w * emo + (1 - w) * mle).sum()

    h = _dense_hessian(reference, x)
    torch.testing.assert_close(_hvp_double_backward(per_token, x, vec), (h @ vec.reshape(-1)).reshape(x.shape),
                               rtol=1e-9, atol=1e-11)
    crit = EMOLoss(e, combine="emo_mle_ratio", reduction="none")
    h2 = _dense_hessian(lambda z: emo_official_reference(z, t, e, combine="emo_mle_ratio").mul(4), x)
    torch.testing.assert_close(_hvp_double_backward(lambda z: crit(z, t).sum(), x, vec),
                               (h2 @ vec.reshape(-1)).reshape(x.shape), rtol=1e-9, atol=1e-11)


def test_gradgradcheck_fused_and_per_token():
    x, t, e = _inputs(n=4, v=5, d=3, seed=5)
    x.requires_grad_()
    # (the ratio combinations are left out: finite differences of their gradient see the stop-gradient ratios move)
    assert torch.autograd.gradgradcheck(lambda z: emo_loss(z, t, e, variant="patch"), (x,))
    assert torch.autograd.gradgradcheck(lambda z: emo_loss(z, t, e, combine="mle", reduction="sum"), (x,))
    assert torch.autograd.gradgradcheck(lambda z: emo_and_mle_per_token(z, t, e)[:2], (x,))


def test_hvp_of_soft_bound_in_logits_and_targets():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, generator=g, dtype=F64)
    tl = torch.randn(3, 5, generator=g, dtype=F64)
    e = torch.randn(5, 3, generator=g, dtype=F64)
    eh = e / e.norm(dim=1, keepdim=True)

    def ours(z):
        return emo_soft_upper_bound(z[:3], z[3:].softmax(-1), e, reduction="sum")

    def reference(z):  # Σ_ij p_i τ_j c_ij with the dense cost
        return (z[:3].softmax(-1) @ (1 - eh @ eh.T) * z[3:].softmax(-1)).sum()

    z = torch.cat([x, tl])
    vec = torch.randn(z.shape, dtype=F64, generator=g)
    h = _dense_hessian(reference, z)
    torch.testing.assert_close(_hvp_double_backward(ours, z, vec), (h @ vec.reshape(-1)).reshape(z.shape),
                               rtol=1e-9, atol=1e-11)


# ------------------------------------------------------------------------------------------ torch.func
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("combine", COMBINES)
def test_func_grad_and_jvp_match_autograd(combine, variant):
    x, t, e = _inputs(seed=7)
    f = lambda z: emo_loss(z, t, e, combine=combine, variant=variant)  # noqa: E731
    xr = x.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(f(xr), xr)
    torch.testing.assert_close(grad(f)(x), g_ref, rtol=1e-12, atol=1e-14)
    vec = torch.randn(x.shape, dtype=F64, generator=torch.Generator().manual_seed(8))
    value, tangent = jvp(f, (x,), (vec,))
    torch.testing.assert_close(value, f(x))
    torch.testing.assert_close(tangent, (g_ref * vec).sum(), rtol=1e-12, atol=1e-14)


def test_func_hessian_and_jacrev_match_reference():
    x, t, e = _inputs(seed=9)
    h = hessian(lambda z: emo_loss(z, t, e, combine="mle_scaled_by_emo"))(x).reshape(x.numel(), x.numel())
    ref = _dense_hessian(lambda z: emo_official_reference(z, t, e, combine="mle_scaled_by_emo"), x)
    torch.testing.assert_close(h, ref, rtol=1e-9, atol=1e-11)
    jac = jacrev(lambda z: emo_loss(z, t, e, reduction="none"))(x)  # [N, N, V]
    xr = x.clone().requires_grad_()
    per = emo_loss(xr, t, e, reduction="none")
    rows = torch.stack([torch.autograd.grad(per[i], xr, retain_graph=True)[0] for i in range(x.shape[0])])
    torch.testing.assert_close(jac, rows)


def test_vmap_over_sequences_and_per_sample_gradients():
    x, t, e = _inputs(n=6, seed=10)
    xs = torch.stack([x, x * 0.5, x + torch.linspace(0, 1, x.shape[1], dtype=F64)])  # [S, N, V]
    ts = torch.stack([t, t.roll(1), t.flip(0)])
    f = lambda z, tt: emo_loss(z, tt, e, combine="emo_mle_ratio", ratio_max=3.0)  # noqa: E731
    torch.testing.assert_close(vmap(f)(xs, ts), torch.stack([f(a, b) for a, b in zip(xs, ts)]))
    per_sample = vmap(grad(f))(xs, ts)
    loop = []
    for a, b in zip(xs, ts):
        a = a.clone().requires_grad_()
        loop.append(torch.autograd.grad(f(a, b), a)[0])
    torch.testing.assert_close(per_sample, torch.stack(loop))
    # vmap over a non-leading dimension, with targets shared
    torch.testing.assert_close(vmap(lambda z: f(z, t), in_dims=1)(xs.transpose(0, 1)), vmap(f)(xs, t.expand(3, -1)))


def test_bad_input_still_raises_inside_transforms():
    x, t, e = _inputs()
    bad = torch.stack([x, x.clone()])
    bad[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        vmap(lambda z: emo_loss(z, t, e))(bad)
    with pytest.raises(ValueError, match="NaN"):
        grad(lambda z: emo_loss(z, t, e))(bad[1])
    t_bad = t.clone()
    t_bad[0] = 99
    with pytest.raises(ValueError, match="targets must lie in"):
        grad(lambda z: emo_loss(z, t_bad, e))(x)


def test_second_backward_through_a_retained_graph_recomputes():
    x, t, e = _inputs(seed=11)
    x.requires_grad_()
    loss = emo_loss(x, t, e, combine="emo_mle_ratio", variant="patch")
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    (g2,) = torch.autograd.grad(loss, x, torch.tensor(2.0, dtype=F64))
    # the first hands over the gradient built in the forward pass, the second recomputes it through autograd
    torch.testing.assert_close(g2, 2 * g1, rtol=1e-12, atol=1e-15)
