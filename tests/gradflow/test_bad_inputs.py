"""Bad input to every public name of taskloss.gradflow gives a clear error (type and message), never NaN.

``CASES`` maps each name of ``taskloss.gradflow.__all__`` to calls that must raise; a test checks that no public
name is missing from it."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import V, make_lm, tokens
from torch import nn

import taskloss.gradflow as gf


def lstm():
    torch.manual_seed(0)
    return nn.LSTM(3, 4, batch_first=True)


def x(T=5, B=2, d=3):
    return torch.randn(B, T, d)


def nan_model():
    m = make_lm("pre")
    with torch.no_grad():
        m.blocks[0].fc1.weight[0, 0] = math.nan
    return m


def blocks(B=3, T=9):
    return tokens(B, T)


def lag_jac(kind="rnn"):
    module = nn.RNN(3, 4, batch_first=True) if kind == "rnn" else lstm()
    return gf.lag_jacobians(module, x())


CASES = {
    "lag_jacobians": [
        (lambda: gf.lag_jacobians(nn.Linear(3, 4), x()), TypeError, "non-recurrent"),
        (lambda: gf.lag_jacobians(make_lm("pre"), tokens(2, 5)), TypeError, "RNNLM"),
        (lambda: gf.lag_jacobians(lstm(), x(), max_lag=6), ValueError, "beyond the sequence"),
        (lambda: gf.lag_jacobians(lstm(), x(), t=2, max_lag=4), ValueError, "only 3 earlier states"),
        (lambda: gf.lag_jacobians(lstm(), x(), max_lag=0), ValueError, "max_lag must be >= 1"),
        (lambda: gf.lag_jacobians(lstm(), x(), t=5), ValueError, "outside the sequence"),
        (lambda: gf.lag_jacobians(lstm(), x(), t=-6), ValueError, "outside the sequence"),
        (lambda: gf.lag_jacobians(lstm(), x(), t=1.5), TypeError, "t must be an int"),
        (lambda: gf.lag_jacobians(lstm(), x(), layer=1), ValueError, "layer=1 is outside"),
        (lambda: gf.lag_jacobians(lstm(), x(), method="forward"), ValueError, "method"),
        (lambda: gf.lag_jacobians(lstm(), x().masked_fill(torch.rand(2, 5, 3) > 0.5, math.nan)), ValueError, "NaN"),
        (lambda: gf.lag_jacobians(lstm(), x(d=2)), ValueError, "input_size=3"),
        (lambda: gf.lag_jacobians(lstm(), torch.randn(5, 3)), ValueError, "shape"),
        (lambda: gf.lag_jacobians(lstm(), x(T=0)), ValueError, "empty"),
        (lambda: gf.lag_jacobians(lstm(), x().long()), TypeError, "floating-point"),
        (lambda: gf.lag_jacobians(lstm(), [[0.0]]), TypeError, "floating-point"),
        (lambda: gf.lag_jacobians(nn.LSTM(3, 4, bidirectional=True), x()), ValueError, "bidirectional"),
        (lambda: gf.lag_jacobians(nn.LSTM(3, 4, proj_size=2), x()), ValueError, "proj_size"),
        (lambda: gf.lag_jacobians(lstm(), x(), state=torch.zeros(1, 2, 4)), TypeError, r"tuple \(h0, c0\)"),
        (lambda: gf.lag_jacobians(lstm(), x(), state=(torch.zeros(1, 3, 4),) * 2), ValueError, "shape"),
        (lambda: gf.lag_jacobians(lstm(), x(), state=(torch.full((1, 2, 4), math.nan),) * 2), ValueError, "NaN"),
        (lambda: gf.lag_jacobians(make_lm("lstm"), torch.full((2, 4), V)), ValueError, "vocab_size"),
        (lambda: gf.lag_jacobians(make_lm("lstm"), torch.zeros(2, 4)), TypeError, "dtype"),
    ],
    "jacobian_norms": [
        (lambda: gf.jacobian_norms(torch.zeros(3)), ValueError, "stack of matrices"),
        (lambda: gf.jacobian_norms(torch.zeros(0, 2, 2)), ValueError, "non-empty"),
        (lambda: gf.jacobian_norms(torch.full((2, 2), math.nan)), ValueError, "NaN"),
        (lambda: gf.jacobian_norms(torch.eye(2), ord=3), ValueError, "ord"),
        (lambda: gf.jacobian_norms(torch.eye(2, dtype=torch.long)), TypeError, "floating-point"),
        (lambda: gf.jacobian_norms([[1.0]]), TypeError, "floating-point"),
    ],
    "gate_product_error": [
        (lambda: gf.gate_product_error(torch.eye(2)), TypeError, "LagJacobians"),
        (lambda: gf.gate_product_error(lag_jac("rnn")), ValueError, "LSTM and GRU"),
    ],
    "LagJacobians": [
        (lambda: lag_jac("rnn").cc, ValueError, "only for LSTMs"),
        (lambda: lag_jac("rnn").cc_total, ValueError, "only for LSTMs"),
    ],
    "init_recurrent_": [
        (lambda: gf.init_recurrent_(nn.Linear(2, 2)), TypeError, "RNNLM"),
        (lambda: gf.init_recurrent_(lstm(), gain=0.0), ValueError, "gain must be > 0"),
        (lambda: gf.init_recurrent_(lstm(), gain=math.nan), ValueError, "gain"),
        (lambda: gf.init_recurrent_(lstm(), gain="1"), TypeError, "gain must be a number"),
        (lambda: gf.init_recurrent_(nn.GRU(3, 4), forget_bias=1.0), ValueError, "LSTMs only"),
        (lambda: gf.init_recurrent_(lstm(), forget_bias=math.inf), ValueError, "finite"),
    ],
    "attention_probabilities": [
        (lambda: gf.attention_probabilities(make_lm("lstm"), tokens(2, 5)), TypeError, "TransformerLM"),
        (lambda: gf.attention_probabilities(make_lm("pre"), torch.zeros(2, 5)), TypeError, "dtype"),
        (lambda: gf.attention_probabilities(make_lm("pre"), tokens(2, 30)), ValueError, "max_len"),
    ],
    "attention_entropy": [
        (lambda: gf.attention_entropy(make_lm("pre"), tokens(2, 1)), ValueError, "at least 2 positions"),
        (lambda: gf.attention_entropy(nn.Linear(2, 2), tokens(2, 5)), TypeError, "TransformerLM"),
        (lambda: gf.attention_entropy(make_lm("post"), torch.full((2, 5), -1)), ValueError, "vocab_size"),
    ],
    "layer_gradient_norms": [
        (lambda: gf.layer_gradient_norms(nan_model(), blocks()), ValueError, "not finite"),
        (lambda: gf.layer_gradient_norms(make_lm("pre"), tokens(2, 1)), ValueError, "at least 2 tokens"),
        (lambda: gf.layer_gradient_norms(make_lm("lstm"), blocks()), TypeError, "TransformerLM"),
        (lambda: gf.layer_gradient_norms(make_lm("pre"), tokens(0, 4)), ValueError, "empty"),
    ],
    "LayerGradients": [
        (lambda: gf.LayerGradients(torch.zeros(2)), TypeError, "missing"),
    ],
    "train_lm": [
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=0, lr=1e-3), ValueError, "steps must be >= 1"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=0.0), ValueError, "lr must be > 0"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=math.nan), ValueError, "lr"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=1e-3, clip=-1.0), ValueError, "clip"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=1e-3, warmup_steps=-1), ValueError,
         "warmup_steps"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=1e-3, betas=(0.9, 1.0)), ValueError,
         "betas"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=1e-3, batch_size=0), ValueError,
         "batch_size"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), blocks(), steps=1, lr=1e-3, divergence_ppl=0.0), ValueError,
         "divergence_ppl"),
        (lambda: gf.train_lm(make_lm("pre"), tokens(3, 1), blocks(), steps=1, lr=1e-3), ValueError, r"\[N, T\+1\]"),
        (lambda: gf.train_lm(make_lm("pre"), blocks(), torch.full((2, 5), V), steps=1, lr=1e-3), ValueError,
         "vocab_size"),
        (lambda: gf.train_lm(make_lm("pre"), blocks().float(), blocks(), steps=1, lr=1e-3), TypeError, "dtype"),
        (lambda: gf.train_lm("model", blocks(), blocks(), steps=1, lr=1e-3), TypeError, "nn.Module"),
    ],
    "evaluate_nll": [
        (lambda: gf.evaluate_nll(make_lm("pre"), tokens(0, 5)), ValueError, "empty"),
        (lambda: gf.evaluate_nll(make_lm("pre"), blocks(), batch_size=0), ValueError, "batch_size"),
        (lambda: gf.evaluate_nll(None, blocks()), TypeError, "nn.Module"),
    ],
    "TrainResult": [
        (lambda: gf.TrainResult(0.0), TypeError, "missing"),
    ],
    "xavier_init_": [
        (lambda: gf.xavier_init_(make_lm("pre")), ValueError, "tie_weights=False"),
        (lambda: gf.xavier_init_(make_lm("lstm")), TypeError, "TransformerLM"),
    ],
}


def test_every_public_name_has_bad_input_cases():
    assert set(gf.__all__) == set(CASES), set(gf.__all__) ^ set(CASES)


@pytest.mark.parametrize("name, i", [(n, i) for n, cases in CASES.items() for i in range(len(cases))],
                         ids=lambda v: str(v))
def test_bad_input_raises_clearly(name, i):
    call, exc, match = CASES[name][i]
    with pytest.raises(exc, match=match):
        call()


def test_unknown_residual_mode_is_rejected_by_the_model():
    from taskloss.models import TransformerLM

    with pytest.raises(ValueError, match="residual must be one of"):
        TransformerLM(V, residual="sandwich")
