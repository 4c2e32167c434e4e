"""Bad input across the public EMO API (taskloss.losses.emo and emo_kernel): NaN, empty, wrong shape, wrong dtype,
out-of-range targets, ignore_index, option names and numbers. Each case asserts the exception type and its
message; nothing returns NaN silently."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from taskloss.losses import (
    COMBINES,
    VARIANTS,
    EMOLoss,
    combine_emo_mle,
    emo_and_mle_per_token,
    emo_cost_matrix,
    emo_loss,
    emo_soft_upper_bound,
    normalize_cost_embeddings,
)

V, D, N = 13, 4, 9
UNDEFINED = "logits contain NaN or +inf (or a row that is entirely -inf): the loss is undefined"


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, V, generator=g).to(dtype)
    t = torch.randint(0, V, (N,), generator=g)
    t[2] = -100
    e = torch.randn(V, D, generator=g).to(dtype)
    return x, t, e


def _exact(msg: str) -> str:
    return "^" + re.escape(msg) + "$"


# every entry point that takes (logits, targets, cost): the function, the per-token function, the module, and the
# fused (requires_grad) path of the function
def _fn(x, t, e, **kw):
    return emo_loss(x, t, e, **kw)


def _fused(x, t, e, **kw):
    return emo_loss(x.detach().requires_grad_(), t, e, **kw) if isinstance(x, torch.Tensor) and \
        x.is_floating_point() else emo_loss(x, t, e, **kw)


def _per_token(x, t, e, **kw):
    return emo_and_mle_per_token(x, t, e, **kw)


def _module(x, t, e, **kw):
    return EMOLoss(e, **kw)(x, t)


ENTRIES = [_fn, _fused, _per_token, _module]


@pytest.mark.parametrize("entry", ENTRIES)
def test_logits_wrong_type_dtype_shape_empty(entry):
    x, t, e = _inputs()
    with pytest.raises(TypeError, match=_exact("logits must be a torch.Tensor, got list")):
        entry(x.tolist(), t, e)
    with pytest.raises(TypeError, match=_exact("logits must be a floating-point tensor, got dtype torch.int64")):
        entry(x.long(), t, e)
    with pytest.raises(ValueError, match=re.escape("logits must have ndim in (2, 3), got shape (13,)")):
        entry(x[0], t[0], e)
    with pytest.raises(ValueError, match=re.escape("logits must have ndim in (2, 3), got shape (1, 1, 9, 13)")):
        entry(x[None, None], t[None, None], e)
    with pytest.raises(ValueError, match=_exact("logits is empty (shape (0, 13))")):
        entry(x[:0], t[:0], e)
    if entry is not _module:  # (the module refuses an empty [0, d] table at construction: tested below)
        with pytest.raises(ValueError, match=_exact("logits is empty (shape (9, 0))")):
            entry(x[:, :0], t, e[:0])


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("where", ["valid row", "padding row"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "all -inf"])
def test_non_finite_logits_raise_everywhere(entry, where, bad):
    x, t, e = _inputs()
    row = 0 if where == "valid row" else 2  # t[2] is ignore_index: its logits are still checked
    if bad == "all -inf":
        x[row] = float("-inf")
    else:
        x[row, 3] = bad
    with pytest.raises(ValueError, match=_exact(UNDEFINED)):
        entry(x, t, e, **({} if entry is _per_token else {"combine": "emo_mle_ratio"}))


@pytest.mark.parametrize("entry", ENTRIES)
def test_minus_inf_target_logit_raises_and_masked_tokens_are_fine(entry):
    x, t, e = _inputs()
    x[0, t[0]] = float("-inf")  # the target has probability 0: MLE is infinite
    with pytest.raises(ValueError, match=_exact(UNDEFINED)):
        entry(x, t, e, **({} if entry is _per_token else {"combine": "mle"}))
    x, t, e = _inputs()
    x[:, 5] = float("-inf")  # a banned token that is never a target
    out = entry(x, t.masked_fill(t == 5, 0), e, **({} if entry is _per_token else {"combine": "mle"}))
    out = out[0] if isinstance(out, tuple) else out
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("entry", ENTRIES)
def test_targets_wrong_type_dtype_shape_range(entry):
    x, t, e = _inputs()
    with pytest.raises(TypeError, match=_exact("targets must be a torch.Tensor, got list")):
        entry(x, t.tolist(), e)
    with pytest.raises(TypeError, match=_exact("targets must be an integer tensor (token ids), got dtype "
                                               "torch.float32")):
        entry(x, t.float(), e)
    with pytest.raises(TypeError, match=re.escape("got dtype torch.bool")):
        entry(x, t > 0, e)
    with pytest.raises(ValueError, match=_exact("targets shape (8,) does not match logits (9, 13) (expected (9,))")):
        entry(x, t[:-1], e)
    with pytest.raises(ValueError, match=re.escape("targets shape (9, 1)")):
        entry(x, t[:, None], e)
    for bad in (V, -1, 10**6):
        t_bad = t.clone()
        t_bad[0] = bad
        with pytest.raises(ValueError, match=_exact(f"targets must lie in [0, 13) or equal ignore_index=-100; "
                                                    f"found [{bad}]")):
            entry(x, t_bad, e)


@pytest.mark.parametrize("entry", ENTRIES)
def test_ignore_index_values_and_types(entry):
    x, t, e = _inputs()
    for bad in (1.5, True, "pad", None):
        with pytest.raises(TypeError, match=_exact(f"ignore_index must be an int, got {type(bad).__name__}")):
            entry(x, t, e, ignore_index=bad)
    # -100 is not padding when ignore_index is another value: it is then an out-of-range target
    with pytest.raises(ValueError, match=re.escape("equal ignore_index=-1; found [-100]")):
        entry(x, t, e, ignore_index=-1)


@pytest.mark.parametrize("ignore_index", [-100, -1, 0, V, 10**9])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("combine", COMBINES)
def test_ignore_index_everywhere_zeroes_positions_and_gradients(ignore_index, variant, combine):
    """Ignored positions contribute 0 to the value and get zero gradient rows; the mean is over the others only."""
    x, t, e = _inputs(torch.float64)
    t = t.masked_fill(t == -100, 1)
    t[t == 0] = 1  # token 0 appears only where it is ignore_index
    ign = torch.tensor([2, 5, 6])
    t[ign] = ignore_index
    keep = torch.ones(N, dtype=torch.bool)
    keep[ign] = False
    xr = x.clone().requires_grad_()
    loss = emo_loss(xr, t, e, ignore_index=ignore_index, combine=combine, variant=variant)
    loss.backward()
    assert torch.equal(xr.grad[ign], torch.zeros_like(xr.grad[ign]))
    ref = emo_loss(x[keep], t[keep], e, ignore_index=ignore_index, combine=combine, variant=variant)
    torch.testing.assert_close(loss, ref)
    per = emo_loss(x, t, e, ignore_index=ignore_index, combine=combine, variant=variant, reduction="none")
    assert torch.equal(per[ign], torch.zeros(3, dtype=per.dtype))
    emo, mle, valid = emo_and_mle_per_token(x, t, e, ignore_index=ignore_index, variant=variant)
    assert torch.equal(valid, keep) and (emo[ign] == 0).all() and (mle[ign] == 0).all()
    if combine == "mle":
        torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(x, t, ignore_index=ignore_index))


@pytest.mark.parametrize("entry", ENTRIES)
def test_cost_embeddings_bad(entry):
    x, t, e = _inputs()
    with pytest.raises(TypeError, match=_exact("cost_embeddings must be a torch.Tensor, got list")):
        entry(x, t, e.tolist())
    with pytest.raises(TypeError, match=_exact("cost_embeddings must be a floating-point tensor, got dtype "
                                               "torch.int64")):
        entry(x, t, e.long())
    with pytest.raises(ValueError, match=re.escape("cost_embeddings must have ndim in (2,), got shape (13,)")):
        entry(x, t, e[:, 0])
    if entry is not _module:  # the module knows no vocabulary before forward
        with pytest.raises(ValueError, match=_exact("vocabulary mismatch: logits have V=13 classes but "
                                                    "cost_embeddings has 12 rows")):
            entry(x, t, e[:-1])
    with pytest.raises(ValueError, match=_exact("cost_embeddings must be non-empty [V, d], got (13, 0)")):
        entry(x, t, e[:, :0])
    for bad in (float("nan"), float("inf"), float("-inf")):
        e_bad = e.clone()
        e_bad[4, 1] = bad
        with pytest.raises(ValueError, match=_exact("cost_embeddings contain NaN or inf")):
            entry(x, t, e_bad)


@pytest.mark.parametrize("entry", [_fn, _fused, _module])
def test_options_bad(entry):
    x, t, e = _inputs()
    cases = [
        (ValueError, "reduction must be one of ('mean', 'sum', 'none'), got 'avg'", {"reduction": "avg"}),
        (ValueError, f"combine must be one of {COMBINES}, got 'both'", {"combine": "both"}),
        (ValueError, f"combine must be one of {COMBINES}, got 0.5", {"combine": 0.5}),
        (ValueError, "variant must be one of ('plain', 'patch'), got 'fixed'", {"variant": "fixed"}),
        (ValueError, "ratio_max must be > 0, got 0.0", {"combine": "emo_mle_ratio", "ratio_max": 0.0}),
        (ValueError, "ratio_max must be > 0, got -3", {"combine": "emo_mle_ratio", "ratio_max": -3}),
        (ValueError, "ratio_max must be > 0, got nan", {"combine": "emo_mle_ratio", "ratio_max": float("nan")}),
        (TypeError, "ratio_max must be a number, got str", {"combine": "emo_mle_ratio", "ratio_max": "3"}),
        (ValueError, "ratio_max applies to combine='emo_mle_ratio' only, got combine='emo'", {"ratio_max": 3.0}),
        (ValueError, "eps must be > 0 and finite, got 0", {"eps": 0}),
        (ValueError, "eps must be > 0 and finite, got inf", {"eps": float("inf")}),
        (ValueError, "chunk_size must be >= 1, got 0", {"chunk_size": 0}),
        (TypeError, "chunk_size must be an int, got float", {"chunk_size": 2.0}),
        (TypeError, "chunk_size must be an int, got bool", {"chunk_size": True}),
    ]
    for exc, msg, kw in cases:
        with pytest.raises(exc, match=_exact(msg)):
            entry(x, t, e, **kw)


def test_per_token_options_bad():
    x, t, e = _inputs()
    with pytest.raises(ValueError, match=_exact("variant must be one of ('plain', 'patch'), got 'x'")):
        emo_and_mle_per_token(x, t, e, variant="x")
    with pytest.raises(TypeError, match=_exact("need_mle must be a bool (True or False), got int 1")):
        emo_and_mle_per_token(x, t, e, need_mle=1)
    with pytest.raises(ValueError, match=_exact("chunk_size must be >= 1, got -2")):
        emo_and_mle_per_token(x, t, e, chunk_size=-2)


def test_the_former_mix_keyword_is_gone():
    """``mix`` names MGS's λ alone: EMO's mode is ``combine`` (no shim for the old name)."""
    x, t, e = _inputs()
    with pytest.raises(TypeError, match="mix"):
        emo_loss(x, t, e, mix="emo_mle_ratio")
    with pytest.raises(TypeError, match="mix"):
        EMOLoss(e, mix="mle_scaled_by_emo")


# ------------------------------------------------------------------------------------------ combine_emo_mle
def test_combine_emo_mle_bad():
    emo, mle = torch.rand(5), torch.rand(5) + 1
    cases = [
        (TypeError, "emo must be a torch.Tensor, got list", (emo.tolist(), mle), {}),
        (TypeError, "mle must be a torch.Tensor, got float", (emo, 1.0), {}),
        (TypeError, "emo must be a floating-point tensor, got dtype torch.int64", (emo.long(), mle), {}),
        (ValueError, "emo and mle must have the same shape, got (5,) and (4,)", (emo, mle[:4]), {}),
        (TypeError, "emo and mle must have the same dtype, got torch.float32 and torch.float64",
         (emo, mle.double()), {}),
        (ValueError, "emo is empty (shape (0,))", (emo[:0], mle[:0]), {}),
        (ValueError, "emo contains NaN or inf", (emo.index_fill(0, torch.tensor([1]), float("nan")), mle), {}),
        (ValueError, "mle contains NaN or inf", (emo, mle.index_fill(0, torch.tensor([1]), float("inf"))), {}),
        (ValueError, f"combine must be one of {COMBINES}, got 'kl'", (emo, mle, "kl"), {}),
        (ValueError, "ratio_max must be > 0, got -1.0", (emo, mle, "emo_mle_ratio"), {"ratio_max": -1.0}),
        (ValueError, "ratio_max applies to combine='emo_mle_ratio' only, got combine='mle_scaled_by_emo'",
         (emo, mle, "mle_scaled_by_emo"), {"ratio_max": 3.0}),
        (ValueError, "eps must be > 0 and finite, got -1e-10", (emo, mle, "emo_mle_ratio"), {"eps": -1e-10}),
    ]
    for exc, msg, args, kw in cases:
        with pytest.raises(exc, match=_exact(msg)):
            combine_emo_mle(*args, **kw)
    # zero EMO and MLE (a perfect prediction under the ratios' ε): finite
    z = torch.zeros(3)
    for c in COMBINES:
        assert torch.isfinite(combine_emo_mle(z, z, c)).all()


# ------------------------------------------------------------------------------------------ soft bound
def test_soft_bound_bad():
    x, _, e = _inputs()
    tau = x.softmax(-1)
    cases = [
        (TypeError, "target_probs must be a torch.Tensor, got list", (x, tau.tolist(), e), {}),
        (TypeError, "target_probs must be a floating-point tensor, got dtype torch.int64", (x, tau.long(), e), {}),
        (ValueError, "target_probs shape (8, 13) must equal logits shape (9, 13)", (x, tau[:-1], e), {}),
        (ValueError, "target_probs must be finite and non-negative", (x, tau - 0.5, e), {}),
        (ValueError, "target_probs must be finite and non-negative",
         (x, tau.index_fill(0, torch.tensor([0]), float("nan")), e), {}),
        (ValueError, "target_probs rows must sum to 1 (within atol=0.0001)", (x, tau * 2, e), {}),
        (ValueError, "atol must be > 0 and finite, got 0", (x, tau, e), {"atol": 0}),
        (ValueError, "reduction must be one of ('mean', 'sum', 'none'), got 'x'", (x, tau, e), {"reduction": "x"}),
        (ValueError, "vocabulary mismatch: logits have V=13 classes but cost_embeddings has 11 rows",
         (x, tau, e[:-2]), {}),
        (ValueError, "logits is empty (shape (0, 13))", (x[:0], tau[:0], e), {}),
        (TypeError, "logits must be a floating-point tensor, got dtype torch.int64", (x.long(), tau, e), {}),
        (ValueError, "chunk_size must be >= 1, got 0", (x, tau, e), {"chunk_size": 0}),
    ]
    for exc, msg, args, kw in cases:
        with pytest.raises(exc, match=_exact(msg)):
            emo_soft_upper_bound(*args, **kw)
    bad = x.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(ValueError, match=_exact(UNDEFINED)):
        emo_soft_upper_bound(bad, tau, e)


# ------------------------------------------------------------------------------------------ cost tables
def test_normalize_and_cost_matrix_bad():
    _, _, e = _inputs()
    for fn in (normalize_cost_embeddings, emo_cost_matrix):
        with pytest.raises(TypeError, match=_exact("cost_embeddings must be a torch.Tensor, got ndarray")):
            fn(e.numpy())
        with pytest.raises(TypeError, match=_exact("cost_embeddings must be a floating-point tensor, got dtype "
                                                   "torch.int32")):
            fn(e.int())
        with pytest.raises(ValueError, match=re.escape("cost_embeddings must have ndim in (2,), got shape (2, 13, 4)")):
            fn(torch.stack([e, e]))
        with pytest.raises(ValueError, match=_exact("cost_embeddings must be non-empty [V, d], got (0, 4)")):
            fn(e[:0])
        with pytest.raises(ValueError, match=_exact("cost_embeddings contain NaN or inf")):
            fn(e.index_fill(0, torch.tensor([3]), float("nan")))
    with pytest.raises(TypeError, match=_exact("dtype must be a floating torch.dtype or None, got torch.int64")):
        normalize_cost_embeddings(e, dtype=torch.int64)


def test_module_constructor_bad():
    _, _, e = _inputs()
    with pytest.raises(ValueError, match=_exact("cost_embeddings contain NaN or inf")):
        EMOLoss(e.index_fill(0, torch.tensor([0]), float("inf")))
    with pytest.raises(TypeError, match=_exact("ignore_index must be an int, got float")):
        EMOLoss(e, ignore_index=-100.0)
    with pytest.raises(ValueError, match=_exact("ratio_max must be > 0, got 0")):
        EMOLoss(e, combine="emo_mle_ratio", ratio_max=0)
    crit = EMOLoss(e)
    x, t, _ = _inputs()
    with pytest.raises(ValueError, match=_exact("vocabulary mismatch: logits have V=12 classes but "
                                                "cost_embeddings has 13 rows")):
        crit(x[:, :-1], t.clamp_max(11))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_precision_and_double_logits_stay_finite(dtype):
    x, t, e = _inputs()
    x = (x * 30).to(dtype).requires_grad_()
    for c in COMBINES:
        loss = emo_loss(x, t, e, combine=c)
        (g,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(loss) and torch.isfinite(g).all() and g.dtype == dtype
        assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
