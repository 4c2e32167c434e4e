"""taskloss.losses.emo against the EMO authors' code: the dense float64 formula of their training scripts (plain
and ``emo_patch.py`` variants, every combination) and their PyPI package ``emoloss`` (``from emo import EMOLoss``)."""
from __future__ import annotations

import pytest
import torch
from helpers import emo_official_reference

from taskloss.losses import COMBINES, VARIANTS, EMOLoss, emo_and_mle_per_token, emo_loss

F64 = torch.float64


def _inputs(n=10, v=11, d=5, seed=0, pad=True, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=g, dtype=F64) * 2).to(dtype)
    t = torch.randint(0, v, (n,), generator=g)
    if pad:
        t[3] = -100
    e = torch.randn(v, d, generator=g, dtype=F64)
    return x, t, e


def _value_and_grad(fn, x):
    x = x.clone().requires_grad_()
    out = fn(x)
    (g,) = torch.autograd.grad(out.sum(), x)
    return out.detach(), g


# the reference smooths its one-hot target by 1e-15 (V·1e-15 ≈ 1e-14 here): values and gradients agree to ~1e-13
TOL = {"rtol": 1e-10, "atol": 1e-12}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_dense_official_formula(variant, combine, reduction):
    x, t, e = _inputs()
    ours = _value_and_grad(lambda z: emo_loss(z, t, e, combine=combine, variant=variant, reduction=reduction,
                                              chunk_size=3), x)
    ref = _value_and_grad(lambda z: emo_official_reference(z, t, e, combine=combine, variant=variant,
                                                           reduction=reduction), x)
    torch.testing.assert_close(ours[0], ref[0], **TOL)
    torch.testing.assert_close(ours[1], ref[1], **TOL)


@pytest.mark.parametrize("ratio_max", [None, 3.0, 0.5])
def test_patch_ratio_cap_matches_reference(ratio_max):
    x, t, e = _inputs(seed=1)
    ours = _value_and_grad(lambda z: emo_loss(z, t, e, combine="emo_mle_ratio", variant="patch",
                                              ratio_max=ratio_max), x)
    ref = _value_and_grad(lambda z: emo_official_reference(z, t, e, combine="emo_mle_ratio", variant="patch",
                                                           ratio_max=ratio_max), x)
    torch.testing.assert_close(ours[0], ref[0], **TOL)
    torch.testing.assert_close(ours[1], ref[1], **TOL)


def test_patch_adds_detached_target_probability():
    """value: EMO_patch = EMO + p_t ||ê_t||²; the EMO gradient itself is unchanged (the subtracted term is detached)."""
    x, t, e = _inputs(pad=False)
    plain, g_plain = _value_and_grad(lambda z: emo_loss(z, t, e, reduction="none"), x)
    patch, g_patch = _value_and_grad(lambda z: emo_loss(z, t, e, reduction="none", variant="patch"), x)
    torch.testing.assert_close(patch, plain + x.softmax(-1).gather(1, t[:, None]).squeeze(1))
    torch.testing.assert_close(g_patch, g_plain)
    per = emo_and_mle_per_token(x, t, e, variant="patch", need_mle=False)
    torch.testing.assert_close(per[0], patch)
    assert torch.equal(per[1], torch.zeros_like(per[1]))  # need_mle=False still returns zeros for MLE


@pytest.mark.parametrize("combine", ["emo_mle_ratio", "mle_scaled_by_emo"])
def test_variants_give_different_gradients_through_the_ratios(combine):
    """The combinations' detached ratios read EMO's value, so the two variants train differently (the gradients
    differ by several percent) while the pure EMO gradient is the same."""
    x, t, e = _inputs(n=64, v=50, d=8, pad=False)
    x[torch.arange(64), t] += 3.0  # a model that already puts mass on the target (p_t ≈ 0.3): the patch term matters
    _, g_plain = _value_and_grad(lambda z: emo_loss(z, t, e, combine=combine), x)
    _, g_patch = _value_and_grad(lambda z: emo_loss(z, t, e, combine=combine, variant="patch"), x)
    rel = (g_patch - g_plain).norm() / g_plain.norm()
    assert rel > 0.01, float(rel)


# ------------------------------------------------------------------------------------------ the emoloss package
def _shifted(n_seq=3, t_len=6, v=13, d=4, seed=2, dtype=F64):
    """[B, T+1, V] logits and labels as emoloss takes them (it shifts internally), and the aligned [B, T] pair."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n_seq, t_len + 1, v, generator=g, dtype=F64) * 2).to(dtype)
    labels = torch.randint(0, v, (n_seq, t_len + 1), generator=g)
    labels[0, 4] = -100
    labels[2, 2] = -100
    cost = torch.randn(v, d, generator=g, dtype=F64).to(dtype)
    return logits, labels, cost


@pytest.mark.parametrize("mode, combine, ratio_max", [(1, "emo_mle_ratio", 3.0), (2, "mle_scaled_by_emo", None)])
def test_matches_emoloss_package(mode, combine, ratio_max):
    emo_pkg = pytest.importorskip("emo", reason="the authors' package emoloss (pip install emoloss==0.0.3)")
    logits, labels, cost = _shifted()
    a = logits.clone().requires_grad_()
    theirs = emo_pkg.EMOLoss(a, labels, cost, ignore_index=-100, mode=mode)
    theirs.backward()
    b = logits.clone().requires_grad_()
    ours = emo_loss(b[:, :-1], labels[:, 1:], cost, combine=combine, ratio_max=ratio_max)
    ours.backward()
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(b.grad, a.grad, **TOL)
    crit = EMOLoss(cost, combine=combine, ratio_max=ratio_max)
    torch.testing.assert_close(crit(logits[:, :-1], labels[:, 1:]), theirs.detach(), **TOL)


def test_matches_emoloss_package_in_float32():
    emo_pkg = pytest.importorskip("emo", reason="the authors' package emoloss (pip install emoloss==0.0.3)")
    logits, labels, cost = _shifted(v=300, d=16, t_len=20, dtype=torch.float32)
    a = logits.clone().requires_grad_()
    theirs = emo_pkg.EMOLoss(a, labels, cost, mode=1)
    theirs.backward()
    b = logits.clone().requires_grad_()
    ours = emo_loss(b[:, :-1], labels[:, 1:], cost, combine="emo_mle_ratio", ratio_max=3.0)
    ours.backward()
    # float32 on both sides, different summation orders: agreement to float32 rounding
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-7)
