"""Tests for taskloss.losses.emo: EMO equals the float64 O(V²) transport cost, gradients, chunking, stability, bounds."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from taskloss.losses import (
    COMBINES,
    VARIANTS,
    EMOLoss,
    emo_and_mle_per_token,
    emo_cost_matrix,
    emo_loss,
    emo_soft_upper_bound,
    normalize_cost_embeddings,
)

F64 = torch.float64


def _inputs(n=9, v=13, d=6, seed=0, dtype=F64, zero_row=True, pad=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=g, dtype=F64) * 2).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    e = torch.randn(v, d, generator=g, dtype=F64)
    if zero_row:
        e[3] = 0.0
        t[1] = 3  # a target whose embedding is zero
    if pad:
        t[2] = -100
    return x, t, e


def direct_cost(e):
    """Dense O(V²) float64 cost c_ij = 1 - cos(e_i, e_j) with the documented zero-row convention (ê = 0)."""
    e = e.double()
    norm = e.norm(dim=1, keepdim=True)
    eh = torch.where(norm > 0, e / norm.clamp_min(1e-300), torch.zeros_like(e))
    return 1.0 - eh @ eh.T


def direct_emo_tokens(x, t, e):
    """Σ_ij γ_ij c_ij with the dense one-hot transport plan γ_ij = p_i [j = t] (the only feasible plan)."""
    x = x.double()
    p = x.softmax(-1)
    one_hot = F.one_hot(t.clamp_min(0), x.shape[-1]).double()
    plan = p[:, :, None] * one_hot[:, None, :]  # [N, V, V]
    return (plan * direct_cost(e)).sum((1, 2))


def direct_loss(x, t, e, combine="emo", reduction="mean", ratio_max=None, eps=1e-10):
    valid = t != -100
    emo = direct_emo_tokens(x, t, e) * valid
    mle = F.cross_entropy(x.double(), t, reduction="none", ignore_index=-100)
    if combine == "emo":
        per = emo
    elif combine == "mle":
        per = mle
    elif combine == "emo_mle_ratio":
        r = (mle / (emo + eps)).detach()
        per = 0.5 * ((r if ratio_max is None else r.clamp_max(ratio_max)) * emo + mle)
    else:
        per = (emo / (mle + eps)).detach() * mle + emo
    per = per * valid
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.sum() / valid.sum().clamp_min(1)


def emd_lp(p, tau, c):
    """Exact earth mover distance by linear programming (scipy HiGHS)."""
    v = len(p)
    a_eq = np.zeros((2 * v, v * v))
    for i in range(v):
        a_eq[i, i * v:(i + 1) * v] = 1.0  # row marginals = p
        a_eq[v + i, i::v] = 1.0  # column marginals = τ
    res = linprog(c.reshape(-1), A_eq=a_eq, b_eq=np.concatenate([p, tau]), bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun


# ------------------------------------------------------------------------------------------ values
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_equals_float64_direct_transport(combine, reduction):
    x, t, e = _inputs()
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    ours = emo_loss(x1, t, e, combine=combine, reduction=reduction, chunk_size=4)
    ref = direct_loss(x2, t, e, combine=combine, reduction=reduction)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(ours.shape, dtype=F64)
    (ours * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_ratio_max_combination_matches_direct():
    x, t, e = _inputs(seed=3)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = emo_loss(x1, t, e, combine="emo_mle_ratio", ratio_max=3.0)
    b = direct_loss(x2, t, e, combine="emo_mle_ratio", ratio_max=3.0)
    torch.testing.assert_close(a, b)
    a.backward(), b.backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    # the detached ratios: "emo_mle_ratio" has the value of MLE, "mle_scaled_by_emo" twice that of EMO
    torch.testing.assert_close(emo_loss(x, t, e, combine="emo_mle_ratio"), emo_loss(x, t, e, combine="mle"))
    torch.testing.assert_close(emo_loss(x, t, e, combine="mle_scaled_by_emo"), 2 * emo_loss(x, t, e))


def test_three_dim_logits_and_mle_equals_cross_entropy():
    x, t, e = _inputs(n=12)
    x3, t3 = x.reshape(3, 4, -1), t.reshape(3, 4)
    torch.testing.assert_close(emo_loss(x3, t3, e), emo_loss(x, t, e))
    assert emo_loss(x3, t3, e, reduction="none").shape == (3, 4)
    torch.testing.assert_close(emo_loss(x3, t3, e, combine="mle"), F.cross_entropy(x, t, ignore_index=-100))


def test_closed_form_inner_product():
    x, t, e = _inputs(pad=False)
    eh = normalize_cost_embeddings(e)
    closed = 1.0 - (x.softmax(-1) @ eh * eh[t]).sum(-1)  # O(V·d)
    torch.testing.assert_close(emo_loss(x, t, e, reduction="none"), closed)
    torch.testing.assert_close(emo_cost_matrix(e), direct_cost(e))


def test_identity_cost_gives_one_minus_p_target():
    x, t, _ = _inputs(v=10, pad=False, zero_row=False)
    per = emo_loss(x, t, torch.eye(10, dtype=F64), reduction="none")
    torch.testing.assert_close(per, 1.0 - x.softmax(-1).gather(1, t[:, None]).squeeze(1))


# ------------------------------------------------------------------------------------------ gradients
def test_gradcheck_per_token_emo_and_mle():
    x, t, e = _inputs(n=6, v=7, d=4)
    x.requires_grad_()
    fn = lambda x: emo_and_mle_per_token(x, t, e, chunk_size=4)[:2]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gradcheck_emo_loss(reduction):
    x, t, e = _inputs(n=6, v=7, d=4, seed=1)
    x.requires_grad_()
    # nondet_tol: gradcheck runs backward several times; the first hands over the gradient the fused loss built in
    # its forward pass, later ones recompute it through plain autograd (equal up to float64 rounding)
    assert torch.autograd.gradcheck(lambda x: emo_loss(x, t, e, reduction=reduction, chunk_size=2), (x,),
                                    nondet_tol=1e-12)


def test_gradcheck_soft_bound_logits_and_targets():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 6, generator=g, dtype=F64, requires_grad=True)
    tau_logits = torch.randn(5, 6, generator=g, dtype=F64, requires_grad=True)
    e = torch.randn(6, 3, generator=g, dtype=F64)
    fn = lambda x, tl: emo_soft_upper_bound(x, tl.softmax(-1), e, chunk_size=2, reduction="none")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, tau_logits))


def test_emo_gradient_closed_form():
    """∂EMO/∂x_i = p_i (c_it - EMO)."""
    x, t, e = _inputs(pad=False)
    x.requires_grad_()
    per = emo_loss(x, t, e, reduction="none")
    per.sum().backward()
    p = x.detach().softmax(-1)
    c_t = direct_cost(e)[:, t].T  # [N, V]
    torch.testing.assert_close(x.grad, p * (c_t - per.detach()[:, None]))


# ------------------------------------------------------------------------------------------ chunking
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("combine", COMBINES)
def test_chunked_equals_unchunked_in_both_kernels(combine, variant):
    """The fused loss (gradient built in the forward pass) and the per-token kernel (reduction="none", then the
    mean), each at several chunk sizes, give one value and one gradient."""
    x, t, e = _inputs(n=23, v=17, d=5, seed=4, dtype=torch.float32)
    grads, values = [], []
    for chunk in (1, 5, 23, None):
        for per_token in (False, True):
            xi = x.clone().requires_grad_()
            if per_token:
                per = emo_loss(xi, t, e.float(), combine=combine, variant=variant, chunk_size=chunk, reduction="none")
                loss = per.sum() / (t != -100).sum()
            else:
                loss = emo_loss(xi, t, e.float(), combine=combine, variant=variant, chunk_size=chunk)
            loss.backward()
            values.append(loss.detach())
            grads.append(xi.grad)
    for v_, g_ in zip(values[1:], grads[1:]):  # float32, summation orders differ between chunkings
        torch.testing.assert_close(v_, values[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(g_, grads[0], rtol=1e-5, atol=1e-8)
    with torch.no_grad():  # without autograd the per-token kernel runs: same value
        torch.testing.assert_close(emo_loss(x, t, e.float(), combine=combine, variant=variant), values[0],
                                   rtol=1e-6, atol=1e-7)


def test_module_equals_function_and_holds_frozen_buffer():
    x, t, e = _inputs()
    head = torch.nn.Parameter(e.clone())
    crit = EMOLoss(head, combine="emo_mle_ratio", ratio_max=3.0, chunk_size=3)
    assert not crit.cost_embeddings.requires_grad and "cost_embeddings" in dict(crit.named_buffers())
    with torch.no_grad():
        head.add_(1.0)  # training the head later must not change the cost
    torch.testing.assert_close(crit(x, t), emo_loss(x, t, e, combine="emo_mle_ratio", ratio_max=3.0))
    assert "combine='emo_mle_ratio'" in repr(crit)


# ------------------------------------------------------------------------------------------ stability
def test_zero_norm_rows_cost_one_and_finite():
    x, t, e = _inputs()
    e[:, :] = 0.0
    x.requires_grad_()
    per = emo_loss(x, t, e, reduction="none")
    valid = t != -100
    torch.testing.assert_close(per[valid], torch.ones(int(valid.sum()), dtype=F64))
    per.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() < 1e-12  # constant cost → no gradient


@pytest.mark.parametrize("combine", COMBINES)
def test_extreme_logits_finite(combine):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(8, 50, generator=g) * 1e4).requires_grad_()
    t = torch.randint(0, 50, (8,), generator=g)
    e = torch.randn(50, 8, generator=g)
    loss = emo_loss(x, t, e, combine=combine)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    per = emo_loss(x.detach().double(), t, e.double(), reduction="none")
    torch.testing.assert_close(per, direct_emo_tokens(x.detach(), t, e), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combine", COMBINES)
def test_all_padding_is_zero_with_zero_grad(combine):
    x, _, e = _inputs()
    x.requires_grad_()
    t = torch.full((x.shape[0],), -100)
    loss = emo_loss(x, t, e, combine=combine)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_gradients_match_float32(dtype):
    g = torch.Generator().manual_seed(6)
    lin = torch.nn.Linear(16, 40)
    h = torch.randn(32, 16, generator=g)
    t = torch.randint(0, 40, (32,), generator=g)
    e = torch.randn(40, 8, generator=g)
    with torch.autocast("cpu", dtype=dtype):
        logits = lin(h)
        assert logits.dtype == dtype
        loss = emo_loss(logits, t, e, combine="emo_mle_ratio", chunk_size=7)
        per = emo_loss(logits, t, e, combine="emo_mle_ratio", chunk_size=7, reduction="none")
    assert loss.dtype == torch.float32 and per.dtype == torch.float32
    (g_ours,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g_per,) = torch.autograd.grad(per.mean(), logits)
    assert g_ours.dtype == dtype and g_per.dtype == dtype
    torch.testing.assert_close(g_per.float(), g_ours.float(), rtol=2e-2, atol=1e-4)
    ref_logits = logits.detach().float().requires_grad_()
    ref = direct_loss(ref_logits, t, e, combine="emo_mle_ratio")
    ref.backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_ours.float(), ref_logits.grad.float(), rtol=2e-2, atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), v=st.integers(2, 9), scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
       seed=st.integers(0, 10_000))
def test_property_bounds_and_finite(n, v, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=g, dtype=F64) * scale).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    e = torch.randn(v, 3, generator=g, dtype=F64)
    per = emo_loss(x, t, e, reduction="none")
    per.sum().backward()
    assert torch.isfinite(per).all() and torch.isfinite(x.grad).all()
    assert (per >= -1e-12).all() and (per <= 2 + 1e-12).all()  # 0 ≤ 1 - cos ≤ 2
    # invariance: adding a constant to every logit of a row changes nothing
    torch.testing.assert_close(emo_loss(x.detach() + 7.0, t, e, reduction="none"), per.detach(),
                               rtol=1e-9, atol=1e-9 * max(scale, 1))


# ------------------------------------------------------------------------------------------ soft targets
def test_soft_bound_above_lp_emd_and_tight_for_one_hot():
    g = torch.Generator().manual_seed(7)
    v = 6
    e = torch.randn(v, 3, generator=g, dtype=F64)
    c = direct_cost(e).numpy()
    x = torch.randn(4, v, generator=g, dtype=F64)
    tau = torch.softmax(torch.randn(4, v, generator=g, dtype=F64) * 2, -1)
    bound = emo_soft_upper_bound(x, tau, e, reduction="none")
    p = x.softmax(-1)
    for i in range(4):
        exact = emd_lp(p[i].numpy(), tau[i].numpy(), c)
        assert bound[i].item() >= exact - 1e-9
        indep = float(p[i] @ torch.from_numpy(c) @ tau[i])
        assert abs(bound[i].item() - indep) < 1e-10
    # one-hot τ: the bound is the EMD and equals emo_loss
    t = torch.tensor([0, 5, 2, 2])
    one_hot = F.one_hot(t, v).double()
    b1 = emo_soft_upper_bound(x, one_hot, e, reduction="none")
    for i in range(4):
        assert abs(b1[i].item() - emd_lp(p[i].numpy(), one_hot[i].numpy(), c)) < 1e-8
    torch.testing.assert_close(b1, emo_loss(x, t, e, reduction="none"))


def test_soft_bound_strictly_loose_for_spread_targets():
    # p = τ spread over tokens: the exact EMD is 0, the independent plan is not
    e = torch.eye(4, dtype=F64)
    tau = torch.full((1, 4), 0.25, dtype=F64)
    bound = emo_soft_upper_bound(tau.log(), tau, e)
    assert abs(emd_lp(tau[0].numpy(), tau[0].numpy(), direct_cost(e).numpy())) < 1e-10
    torch.testing.assert_close(bound, torch.tensor(0.75, dtype=F64))


# ------------------------------------------------------------------------------------------ masking (bad input: test_emo_bad_input.py)
def test_nan_in_padding_row_still_raises_and_minus_inf_is_allowed():
    x, t, e = _inputs()
    bad = x.clone()
    bad[2, 0] = float("nan")  # row 2 is padding
    with pytest.raises(ValueError, match="NaN"):
        emo_loss(bad, t, e)
    ok = x.clone().requires_grad_()
    masked = ok.masked_fill(torch.arange(x.shape[1]) == 5, float("-inf"))  # a banned token, as in masking
    loss = emo_loss(masked, t.masked_fill(t == 5, 0), e, combine="emo_mle_ratio")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(ok.grad).all() and (ok.grad[:, 5] == 0).all()


def test_soft_bound_under_autocast_is_float32():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 30, generator=g)
    tau = torch.softmax(torch.randn(6, 30, generator=g), -1)
    e = torch.randn(30, 5, generator=g)
    ref = emo_soft_upper_bound(x.double(), tau.double(), e.double(), reduction="none")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = emo_soft_upper_bound(x.bfloat16(), tau, e, reduction="none")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), emo_soft_upper_bound(x.bfloat16().double(), tau.double(), e.double(),
                                                                  reduction="none"), rtol=1e-5, atol=1e-6)
    assert (out.double() - ref).abs().max() < 0.05


# ------------------------------------------------------------------------------------------ CUDA (skipped here)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_and_stays_within_cross_entropy_memory():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(9)
    n, v, d = 1024, 8000, 64
    x = torch.randn(n, v, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    e = torch.randn(v, d, generator=g)
    xc = x.to(dev).requires_grad_()
    for combine in COMBINES:
        loss = emo_loss(xc, t.to(dev), e.to(dev), combine=combine)
        (grad,) = torch.autograd.grad(loss, xc)
        xr = x.double().requires_grad_()
        ref = emo_loss(xr, t, e.double(), combine=combine)
        ref.backward()
        torch.testing.assert_close(loss.double().cpu(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double().cpu(), xr.grad, rtol=1e-4, atol=1e-7)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lb = emo_loss(xc.bfloat16(), t.to(dev), e.to(dev))
    assert lb.dtype == torch.float32 and torch.isfinite(lb)

    def peak(fn):
        xc.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    e_dev, t_dev = e.to(dev), t.to(dev)
    ours = peak(lambda: emo_loss(xc, t_dev, e_dev))
    ce = peak(lambda: F.cross_entropy(xc, t_dev))
    assert ours <= 1.1 * ce, (ours, ce)
