"""Bad input across ``taskloss.models``' public API: every name in ``__all__`` is walked with NaN, empty,
wrong-shape, wrong-dtype and out-of-range inputs (constructor arguments and forward inputs) and must raise a
clear exception (type and message); a NaN input is refused instead of turned into NaN outputs, except inside
``torch.func`` transforms, where the value check is impossible and skipped."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, vmap

import taskloss.models as Mo

NAN = float("nan")
TLM = Mo.TransformerLM(10, d_model=8, n_heads=2, max_len=6)
RNN = Mo.RNNLM(10, d_model=4, hidden=6)
MLP = Mo.MLP(4, (3,), 2)
CNN = Mo.SmallCNN()
IDS = torch.zeros(1, 3, dtype=torch.long)

CASES = {
    "TransformerLM": [
        ("out-of-range vocab", lambda: Mo.TransformerLM(0), ValueError, "vocab_size must be >= 1"),
        ("wrong-dtype vocab", lambda: Mo.TransformerLM(10.0), TypeError, "vocab_size must be an int"),
        ("wrong-shape heads", lambda: Mo.TransformerLM(10, d_model=10, n_heads=3), ValueError, "divisible"),
        ("out-of-range residual", lambda: Mo.TransformerLM(10, residual="mid"), ValueError, "residual must be one of"),
        ("out-of-range dropout", lambda: Mo.TransformerLM(10, dropout=1.0), ValueError, "dropout must be < 1"),
        ("NaN dropout", lambda: Mo.TransformerLM(10, dropout=NAN), ValueError, r"dropout must lie in \[0, 1\]"),
        ("wrong-dtype tie_weights", lambda: Mo.TransformerLM(10, tie_weights="yes"), TypeError,
         "tie_weights must be a bool"),
        ("out-of-range d_ff", lambda: Mo.TransformerLM(10, d_ff=0), ValueError, "d_ff must be >= 1"),
        ("wrong-dtype idx", lambda: TLM(torch.zeros(1, 3)), TypeError, "integer token ids"),
        ("out-of-range idx", lambda: TLM(torch.full((1, 3), 10)), ValueError, r"outside \[0, vocab_size=10\)"),
        ("out-of-range negative idx", lambda: TLM(torch.full((1, 3), -1)), ValueError, "outside"),
        ("out-of-range length", lambda: TLM(torch.zeros(1, 7, dtype=torch.long)), ValueError, "max_len=6"),
        ("empty", lambda: TLM(torch.zeros(0, 3, dtype=torch.long)), ValueError, "empty"),
        ("wrong-shape", lambda: TLM(torch.zeros(3, dtype=torch.long)), ValueError, r"\[B, T\]"),
        ("wrong-type", lambda: TLM([[1, 2]]), TypeError, "LongTensor"),
    ],
    "RNNLM": [
        ("out-of-range cell", lambda: Mo.RNNLM(10, cell="gru"), ValueError, "cell must be"),
        ("out-of-range vocab", lambda: Mo.RNNLM(0), ValueError, "vocab_size must be >= 1"),
        ("out-of-range dropout", lambda: Mo.RNNLM(10, dropout=1.5), ValueError, r"dropout must lie in \[0, 1\]"),
        ("wrong-dtype idx", lambda: RNN(torch.zeros(1, 3)), TypeError, "integer token ids"),
        ("out-of-range idx", lambda: RNN(torch.full((1, 3), 10)), ValueError, "outside"),
        ("wrong-shape state", lambda: RNN(IDS, state=(torch.zeros(2, 1, 6), torch.zeros(2, 1, 6))), ValueError,
         r"state h must have shape \(1, 1, 6\)"),
        ("NaN state", lambda: RNN(IDS, state=(torch.full((1, 1, 6), NAN), torch.zeros(1, 1, 6))), ValueError,
         "state h contains NaN"),
        ("wrong-type state", lambda: RNN(IDS, state="s"), TypeError, r"tuple \(h, c\)"),
        ("wrong-dtype state", lambda: RNN(IDS, state=(torch.zeros(1, 1, 6, dtype=torch.long),) * 2), TypeError,
         "floating tensor"),
        ("empty", lambda: RNN(torch.zeros(0, 3, dtype=torch.long)), ValueError, "empty"),
    ],
    "MLP": [
        ("out-of-range in_dim", lambda: Mo.MLP(0, out_dim=2), ValueError, "in_dim must be >= 1"),
        ("wrong-type out_dim", lambda: Mo.MLP(2), TypeError, "needs out_dim"),
        ("out-of-range hidden", lambda: Mo.MLP(2, (-1,), 2), ValueError, r"hidden\[0\] must be >= 1"),
        ("wrong-dtype hidden", lambda: Mo.MLP(2, 2.5, 2), TypeError, "hidden must be an int or a sequence"),
        ("wrong-dtype hidden bool", lambda: Mo.MLP(2, True, 2), TypeError, "hidden must be an int or a sequence"),
        ("out-of-range activation", lambda: Mo.MLP(2, 2, 2, activation="swish"), ValueError, "activation"),
        ("wrong-shape x", lambda: MLP(torch.zeros(2, 5)), ValueError, r"input \[\.\.\., 4\]"),
        ("wrong-dtype x", lambda: MLP(torch.zeros(2, 4, dtype=torch.long)), TypeError, "floating-point input"),
        ("NaN x", lambda: MLP(torch.full((2, 4), NAN)), ValueError, "MLP input contains NaN"),
        ("empty x", lambda: MLP(torch.zeros(0, 4)), ValueError, "MLP input is empty"),
        ("wrong-shape scalar", lambda: MLP(torch.tensor(1.0)), ValueError, r"input \[\.\.\., 4\]"),
        ("wrong-type x", lambda: MLP([[0.0] * 4]), TypeError, "expects a tensor"),
    ],
    "SmallCNN": [
        ("out-of-range classes", lambda: Mo.SmallCNN(n_classes=1), ValueError, "n_classes must be >= 2"),
        ("out-of-range width", lambda: Mo.SmallCNN(width=0), ValueError, "width must be >= 1"),
        ("wrong-shape x", lambda: CNN(torch.zeros(2, 1, 7, 7)), ValueError, r"\[n, 1, 8, 8\]"),
        ("wrong-dtype x", lambda: CNN(torch.zeros(2, 64, dtype=torch.long)), TypeError, "floating-point input"),
        ("NaN x", lambda: CNN(torch.full((2, 64), NAN)), ValueError, "SmallCNN input contains NaN"),
        ("empty x", lambda: CNN(torch.zeros(0, 64)), ValueError, "SmallCNN input is empty"),
        ("wrong-type x", lambda: CNN([[0.0] * 64]), TypeError, "expects a tensor"),
    ],
}
EXEMPT = {"RESIDUAL_MODES": "constant"}


def test_every_public_name_is_walked():
    assert set(Mo.__all__) == set(CASES) | set(EXEMPT), set(Mo.__all__) ^ (set(CASES) | set(EXEMPT))


@pytest.mark.parametrize("name,category,thunk,exc,match",
                         [(n, *c) for n, cases in CASES.items() for c in cases],
                         ids=[f"{n}-{c[0]}" for n, cases in CASES.items() for c in cases])
def test_bad_input_raises_clearly(name, category, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_value_checks_step_aside_inside_transforms_and_on_request():
    """vmap over stacked parameters (as MGS and the zeroth-order estimators do) still runs; the flag turns the
    GPU-synchronizing check off."""
    params = {k: torch.stack([v, v + 0.1]) for k, v in MLP.named_parameters()}
    out = vmap(lambda p: functional_call(MLP, p, (torch.ones(3, 4),)))(params)
    assert out.shape == (2, 3, 2) and bool(torch.isfinite(out).all())
    quiet = Mo.MLP(4, (3,), 2)
    quiet.validate_inputs = False
    assert bool(torch.isnan(quiet(torch.full((1, 4), NAN))).all())
