"""EMO's cost depends on the directions of the embedding rows only: rows of any finite scale — tiny (whose squares
underflow), huge (whose squares overflow), subnormal, mixed within one table — give the cost of the unit rows."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taskloss.losses import EMOLoss, emo_cost_matrix, emo_loss, normalize_cost_embeddings

F64 = torch.float64


def _inputs(v=12, d=6, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g, dtype=F64) * 2
    t = torch.randint(0, v, (n,), generator=g)
    e = torch.randn(v, d, generator=g, dtype=F64)
    return x, t, e


def _unit64(e):
    return e / e.norm(dim=1, keepdim=True)


# float32 tables: 1e-35 rows have entries down to ~1e-38 (subnormal range) and squares that underflow; 1e35 rows
# have squares that overflow float32
SCALES32 = [1e-35, 1e-25, 1e-19, 1.0, 1e19, 1e25, 1e35]
SCALES64 = [1e-300, 1e-200, 1e-160, 1.0, 1e160, 1e200, 1e300]


@pytest.mark.parametrize("scale", SCALES32)
def test_float32_rows_of_any_scale(scale):
    x, t, e = _inputs()
    ref = emo_loss(x, t, _unit64(e), reduction="none")
    e32 = (e * scale).float()
    assert torch.isfinite(e32).all() and (e32 != 0).all()
    ours = emo_loss(x.float(), t, e32, reduction="none")
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(normalize_cost_embeddings(e32).double(), _unit64(e), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", SCALES64)
def test_float64_rows_of_any_scale(scale):
    x, t, e = _inputs(seed=1)
    ref = emo_loss(x, t, _unit64(e), reduction="none")
    torch.testing.assert_close(emo_loss(x, t, e * scale, reduction="none"), ref, rtol=1e-12, atol=1e-13)
    # a float64 table of tiny rows used with float32 logits: normalized before the cast (no underflow to 0)
    torch.testing.assert_close(emo_loss(x.float(), t, e * scale, reduction="none").double(), ref,
                               rtol=1e-5, atol=1e-6)


def test_mixed_scale_rows_in_one_table_and_low_precision_tables():
    x, t, e = _inputs(v=14, seed=2)
    scales = torch.tensor([1e-35, 1e35, 1.0, 1e-20, 1e20, 3e-38, 1e-30, 1e30, 1.0, 1e-10, 1e10, 1e-37, 1e37, 0.5],
                          dtype=F64)
    mixed = (e * scales[:, None]).float()
    ref = emo_loss(x, t, _unit64(e), reduction="none")
    torch.testing.assert_close(emo_loss(x.float(), t, mixed, reduction="none").double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(EMOLoss(mixed, reduction="none")(x.float(), t).double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(emo_cost_matrix(mixed).double(), 1 - _unit64(e) @ _unit64(e).T, rtol=1e-5, atol=1e-6)
    # bf16 / fp16 tables (bf16 has float32's exponent range): rows of 1e-30 in bf16
    for dt, s in ((torch.bfloat16, 1e-30), (torch.float16, 1e-3)):
        low = (e * s).to(dt)
        ref_low = emo_loss(x, t, _unit64(low.double()), reduction="none")
        torch.testing.assert_close(emo_loss(x.float(), t, low, reduction="none").double(), ref_low,
                                   rtol=1e-5, atol=1e-6)


def test_zero_rows_stay_zero_next_to_tiny_rows():
    x, t, e = _inputs()
    e[3] = 0.0
    e[4] *= 1e-300
    e_hat = normalize_cost_embeddings(e)
    assert torch.equal(e_hat[3], torch.zeros_like(e_hat[3]))
    torch.testing.assert_close(e_hat[4].norm(), torch.tensor(1.0, dtype=F64))
    t[0] = 3
    per = emo_loss(x, t, e, reduction="none")
    assert per[0].item() == pytest.approx(1.0)  # a zero row costs 1 to every token


def test_unit_table_is_used_without_a_copy():
    _, _, e = _inputs()
    unit = normalize_cost_embeddings(e.float())
    assert normalize_cost_embeddings(unit).data_ptr() == unit.data_ptr()
    unit[2] = 0.0  # zero rows allowed in a unit table
    assert normalize_cost_embeddings(unit).data_ptr() == unit.data_ptr()
    tiny = unit.clone()
    tiny[5] *= 1e-30  # not unit: normalized (a copy)
    out = normalize_cost_embeddings(tiny)
    assert out.data_ptr() != tiny.data_ptr()
    torch.testing.assert_close(out[5].norm(), torch.tensor(1.0))


@settings(max_examples=40, deadline=None)
@given(exponent=st.floats(-37.0, 37.0), seed=st.integers(0, 1000))
def test_property_scale_invariance_float32(exponent, seed):
    x, t, e = _inputs(v=7, d=4, n=5, seed=seed)
    scaled = (e * 10.0 ** exponent).float()
    if not (torch.isfinite(scaled).all() and (scaled.abs().amax(1) > 0).all()):
        return  # rows flushed to 0 or overflowed by the float32 cast itself: not this property's input
    ours = emo_loss(x.float(), t, scaled, reduction="none")
    torch.testing.assert_close(ours.double(), emo_loss(x, t, _unit64(e), reduction="none"), rtol=1e-4, atol=1e-5)
