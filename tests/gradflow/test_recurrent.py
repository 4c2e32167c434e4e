"""Tests for taskloss.gradflow.recurrent. The reference is autograd through the module's *own* forward
(``torch.autograd.functional.jacobian`` of ``nn.LSTM``/``nn.GRU``/``nn.RNN`` run from the state at ``t − k``), in
float64, plus the closed forms ``diag(1 − h²) W_hh`` (tanh RNN) and ``∂c_t/∂c_{t−1} = diag(f_t)`` (LSTM)."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import V, make_lm, tokens
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from taskloss.gradflow import gate_product_error, init_recurrent_, jacobian_norms, lag_jacobians

D = torch.float64


def make_rnn(kind: str, layers: int = 2, batch_first: bool = True, seed: int = 0, bias: bool = True):
    torch.manual_seed(seed)
    kw = dict(num_layers=layers, batch_first=batch_first, bias=bias)
    mod = {"lstm": lambda: nn.LSTM(5, 6, **kw), "gru": lambda: nn.GRU(5, 6, **kw),
           "rnn_tanh": lambda: nn.RNN(5, 6, **kw), "rnn_relu": lambda: nn.RNN(5, 6, nonlinearity="relu", **kw)}[kind]()
    return mod.double()


def reference(module, x, t, k, layer, state=None):
    """``[B, S, S]``: ∂s_t/∂s_{t−k} of ``layer`` by autograd through the module's own forward (batch-first x)."""
    lstm = isinstance(module, nn.LSTM)
    B = x.shape[0]
    call = (lambda seq, s: module(seq, s)) if module.batch_first else (
        lambda seq, s: module(seq.transpose(0, 1), s))
    if t - k + 1 > 0:
        _, s0 = call(x[:, : t - k + 1], state)
    else:
        zeros = torch.zeros(module.num_layers, B, 6, dtype=D)
        s0 = state if state is not None else ((zeros, zeros) if lstm else zeros)
    H = module.hidden_size

    def f(s_layer):
        if lstm:
            h, c = s0[0].clone(), s0[1].clone()
            h[layer], c[layer] = s_layer[:, :H], s_layer[:, H:]
            hn, cn = call(x[:, t - k + 1: t + 1], (h, c))[1]
            return torch.cat([hn[layer], cn[layer]], -1)
        h = s0.clone()
        h[layer] = s_layer
        return call(x[:, t - k + 1: t + 1], h)[1][layer]

    start = torch.cat([s0[0][layer], s0[1][layer]], -1) if lstm else s0[layer]
    J = torch.autograd.functional.jacobian(f, start)            # [B, S, B, S]
    return torch.stack([J[b, :, b, :] for b in range(B)])


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("method", ["reverse", "product"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_matches_autograd_through_the_module(kind, method, batch_first):
    module = make_rnn(kind, batch_first=batch_first)
    x = torch.randn(3, 7, 5, dtype=D, generator=torch.Generator().manual_seed(2))
    for layer, t in ((0, 6), (1, 6), (1, 4), (-1, -2)):
        jac = lag_jacobians(module, x if batch_first else x.transpose(0, 1), t=t, layer=layer, method=method)
        tt = t % 7
        assert jac.t == tt and jac.lags.tolist() == list(range(1, tt + 2))
        assert jac.state.shape == (tt + 1, 3, 12 if kind == "lstm" else 6, 12 if kind == "lstm" else 6)
        for k in (1, 2, tt + 1):
            torch.testing.assert_close(jac.state[k - 1], reference(module, x, tt, k, layer % 2), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "rnn"])
def test_rnnlm_and_given_initial_state(kind):
    model = make_lm(kind).double()   # RNNLM: embedding 16 → 2 layers of 24
    idx = tokens(2, 9)
    g = torch.Generator().manual_seed(3)
    h0 = torch.randn(2, 2, 24, dtype=D, generator=g)
    state = (h0, torch.randn(2, 2, 24, dtype=D, generator=g)) if kind == "lstm" else h0
    jac = lag_jacobians(model, idx, max_lag=5, state=state)
    assert jac.state.shape[0] == 5
    x = model.tok_emb(idx)
    for k in (1, 3, 5):
        torch.testing.assert_close(jac.state[k - 1], reference(model.rnn, x, 8, k, 1, state), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(lag_jacobians(model, idx, max_lag=5, state=state, method="product").state, jac.state)


def test_tanh_rnn_closed_form_product():
    module = make_rnn("rnn_tanh", layers=1)
    x = torch.randn(2, 6, 5, dtype=D, generator=torch.Generator().manual_seed(4))
    out, _ = module(x)                                          # h_0..h_5 [B, T, H]
    W = module.weight_hh_l0
    jac = lag_jacobians(module, x)
    for b in range(2):
        acc = torch.eye(6, dtype=D)
        for k in range(1, 7):
            acc = acc @ (torch.diag(1 - out[b, 6 - k] ** 2) @ W)    # A_t ⋯ A_{t−k+1}
            torch.testing.assert_close(jac.hh[k - 1, b], acc)


def lstm_gates(module, x):
    """Forget gates ``[B, T, H]`` of a one-layer LSTM, recomputed from its weights with nn.LSTMCell."""
    cell = nn.LSTMCell(5, 6).double()
    cell.load_state_dict({k.replace("_l0", ""): v for k, v in module.state_dict().items()})
    h = c = torch.zeros(x.shape[0], 6, dtype=D)
    fs = []
    for t in range(x.shape[1]):
        pre = x[:, t] @ cell.weight_ih.T + cell.bias_ih + h @ cell.weight_hh.T + cell.bias_hh
        fs.append(torch.sigmoid(pre.chunk(4, -1)[1]))
        h, c = cell(x[:, t], (h, c))
    return torch.stack(fs, 1)


def test_lstm_cell_block_is_the_forget_gate_at_lag_one_and_the_product_is_f():
    module = make_rnn("lstm", layers=1)
    x = torch.randn(3, 8, 5, dtype=D, generator=torch.Generator().manual_seed(5))
    jac = lag_jacobians(module, x)
    f = lstm_gates(module, x)
    torch.testing.assert_close(jac.cc[0], torch.diag_embed(f[:, 7]), rtol=0, atol=1e-15)
    for k in range(1, 9):
        torch.testing.assert_close(jac.gate_product[k - 1], f[:, 8 - k:].prod(1))
    err = gate_product_error(jac, total=False)
    assert err.shape == (8, 3) and float(err[0].abs().max()) < 1e-14
    assert float(err[1:].min()) > 0                             # the h-paths make it inexact from k = 2 on
    assert float(gate_product_error(jac)[:-1].min()) > 0        # the total derivative differs already at k = 1
    # the error by its definition
    J, Dg = jac.cc[3], torch.diag_embed(jac.gate_product[3])
    num = torch.linalg.matrix_norm(J - Dg)
    torch.testing.assert_close(err[3], num / torch.maximum(torch.linalg.matrix_norm(J), torch.linalg.matrix_norm(Dg)))


def test_gru_gate_product_is_z():
    module = make_rnn("gru", layers=1)
    x = torch.randn(2, 5, 5, dtype=D, generator=torch.Generator().manual_seed(6))
    jac = lag_jacobians(module, x)
    h, zs = torch.zeros(2, 6, dtype=D), []
    for t in range(5):
        z = torch.sigmoid(x[:, t] @ module.weight_ih_l0[6:12].T + module.bias_ih_l0[6:12]
                          + h @ module.weight_hh_l0[6:12].T + module.bias_hh_l0[6:12])
        zs.append(z)
        h = module(x[:, : t + 1])[0][:, -1]
    torch.testing.assert_close(jac.gate_product[1], zs[4] * zs[3])
    assert gate_product_error(jac).shape == (5, 2)


def test_float32_module_and_no_bias():
    module = make_rnn("lstm", bias=False).float()
    x = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(7))
    jac = lag_jacobians(module, x)
    assert jac.state.dtype == torch.float32
    ref = lag_jacobians(module.double(), x.double())
    torch.testing.assert_close(jac.state.double(), ref.state, rtol=1e-4, atol=1e-5)   # float32 rounding


@settings(max_examples=25)      # each example is two float64 Jacobian computations
@given(t=st.integers(0, 9), k=st.integers(1, 10), seed=st.integers(0, 50))
def test_reverse_equals_product_property(t, k, seed):
    k = min(k, t + 1)
    module = make_rnn("lstm", seed=seed)
    x = torch.randn(2, 10, 5, dtype=D, generator=torch.Generator().manual_seed(seed))
    a = lag_jacobians(module, x, t=t, max_lag=k)
    b = lag_jacobians(module, x, t=t, max_lag=k, method="product")
    torch.testing.assert_close(a.state, b.state, rtol=1e-10, atol=1e-13)
    assert torch.isfinite(a.state).all() and (gate_product_error(a) <= 2 + 1e-12).all()


def test_jacobian_norms_match_singular_values():
    J = torch.randn(4, 3, 5, 5, dtype=D, generator=torch.Generator().manual_seed(8))
    s = torch.linalg.svdvals(J)
    torch.testing.assert_close(jacobian_norms(J, 2), s[..., 0])
    torch.testing.assert_close(jacobian_norms(J), s.pow(2).sum(-1).sqrt())
    torch.testing.assert_close(jacobian_norms(J, "nuc"), s.sum(-1))


def test_init_recurrent_scale_and_forget_bias():
    torch.manual_seed(0)
    lstm = nn.LSTM(8, 300)
    init_recurrent_(lstm, gain=0.5, forget_bias=2.0, generator=torch.Generator().manual_seed(1))
    W = lstm.weight_hh_l0
    for block in W.chunk(4):
        assert abs(block.std().item() / (0.5 / math.sqrt(300)) - 1) < 0.02       # 90 000 draws: ±0.5 % sd
        radius = torch.linalg.eigvals(block.double()).abs().max().item()
        assert abs(radius - 0.5) < 0.05                                  # circular law, H = 300
    assert torch.equal(lstm.bias_ih_l0[300:600], torch.full((300,), 2.0))
    assert torch.equal(lstm.bias_hh_l0, torch.zeros(1200))
    rnn = make_lm("rnn")
    assert init_recurrent_(rnn, gain=2.0) is rnn and abs(rnn.rnn.weight_hh_l1.std().item() - 2 / math.sqrt(24)) < 0.1


def test_gain_controls_vanishing_and_exploding_in_a_linearised_rnn():
    """With zero inputs and zero biases a tanh RNN stays at h = 0 where A = W_hh, so ∂h_t/∂h_{t−k} = W^k and
    ‖W^k‖^{1/k} → spectral radius ≈ gain: below 1 vanishing, above 1 exploding."""
    rnn = nn.RNN(4, 200, batch_first=True, bias=False).double()
    for gain in (0.5, 1.5):
        init_recurrent_(rnn, gain=gain, generator=torch.Generator().manual_seed(0))
        jac = lag_jacobians(rnn, torch.zeros(1, 40, 4, dtype=D))
        W = rnn.weight_hh_l0
        torch.testing.assert_close(jac.hh[2, 0], W @ W @ W)
        rate = jacobian_norms(jac.hh[-1, 0], 2).log().item() / 40
        radius = torch.linalg.eigvals(W).abs().max().item()
        assert abs(rate - math.log(radius)) < 0.05, (gain, rate, math.log(radius))


def test_device_follows_inputs_and_vocab_check():
    model = make_lm("lstm")
    jac = lag_jacobians(model, tokens(1, 4))
    assert jac.state.device == model.tok_emb.weight.device
    with pytest.raises(ValueError, match="vocab_size"):
        lag_jacobians(model, torch.full((1, 4), V))


def test_lstm_total_cell_derivative_matches_a_perturbed_cell_loop():
    """``dc_t/dc_{t−k}`` as backpropagation sees it: add δ to c_{t−k} right after it is computed (so that
    h_{t−k} = o ⊙ tanh(c_{t−k} + δ) moves too) in a hand-written float64 LSTM loop, and differentiate."""
    module = make_rnn("lstm", layers=1)
    x = torch.randn(2, 7, 5, dtype=D, generator=torch.Generator().manual_seed(9))
    jac = lag_jacobians(module, x)
    Wi, Wh, b = module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0 + module.bias_hh_l0

    def c_last(delta, k, row):
        h = c = torch.zeros(6, dtype=D)
        for t in range(7):
            i, f, g, o = (Wi @ x[row, t] + Wh @ h + b).chunk(4)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            if t == 6 - k:
                c = c + delta
            h = torch.sigmoid(o) * torch.tanh(c)
        return c

    for k in (1, 3, 6):
        for row in range(2):
            ref = torch.autograd.functional.jacobian(lambda d: c_last(d, k, row), torch.zeros(6, dtype=D))
            torch.testing.assert_close(jac.cc_total[k - 1, row], ref)
    torch.testing.assert_close(jac.cc_total[6], jac.cc[6])      # lag t+1: the initial (h, c) are both given


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = make_lm("lstm").double()
    idx = tokens(2, 8)
    cpu = lag_jacobians(model, idx)
    gpu = lag_jacobians(model.cuda(), idx.cuda())
    assert gpu.state.is_cuda
    torch.testing.assert_close(gpu.state.cpu(), cpu.state)
    torch.testing.assert_close(gpu.cc_total.cpu(), cpu.cc_total)
