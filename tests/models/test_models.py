"""Tests for taskloss.models: references are torch's own TransformerEncoderLayer, nn.LSTMCell/RNNCell loops and
float64 hand-written recursions."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import MODES, V, make_lm, tokens
from torch import nn
from torch.func import functional_call, vmap

from taskloss.models import MLP, RNNLM, SmallCNN, TransformerLM
from taskloss.parameter_vectors import count_parameters


# ----------------------------------------------------------------------------------------------- causality
@pytest.mark.parametrize("kind", MODES + ("lstm", "rnn"))
def test_causality_bit_identical(kind):
    model = make_lm(kind).eval()
    x = tokens(3, 16)
    for t in (1, 7, 15):
        y = x.clone()
        y[:, t:] = (y[:, t:] + 1 + torch.arange(16 - t)) % V
        a, b = model(x), model(y)
        assert torch.equal(a[:, :t], b[:, :t])
        assert not torch.equal(a[:, t:], b[:, t:])  # the change is visible where it should be


# ------------------------------------------------------------------------------- parity with torch's layers
def copy_into_encoder_layer(block, layer: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(block.attn.qkv.weight)
        layer.self_attn.in_proj_bias.copy_(block.attn.qkv.bias)
        layer.self_attn.out_proj.weight.copy_(block.attn.proj.weight)
        layer.self_attn.out_proj.bias.copy_(block.attn.proj.bias)
        for ours, theirs in ((block.fc1, layer.linear1), (block.fc2, layer.linear2),
                             (block.ln1, layer.norm1), (block.ln2, layer.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)


@pytest.mark.parametrize("residual", ["post", "pre"])
@pytest.mark.parametrize("train_mode", [False, True])
def test_matches_torch_transformer_encoder(residual, train_mode):
    model = make_lm(residual, d_ff=48)
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(32, 4, dim_feedforward=48, dropout=0.0, activation="gelu", batch_first=True,
                                   norm_first=(residual == "pre")) for _ in range(2))
    for block, layer in zip(model.blocks, layers):
        copy_into_encoder_layer(block, layer)
    model.train(train_mode)
    layers.train(train_mode)
    x = tokens(3, 11)
    mask = nn.Transformer.generate_square_subsequent_mask(11)
    with torch.no_grad():
        h = model.tok_emb(x) + model.pos_emb(torch.arange(11))
        torch.testing.assert_close(model.blocks[0](h)[0], layers[0](h, src_mask=mask, is_causal=True))
        ref = h
        for layer in layers:
            ref = layer(ref, src_mask=mask, is_causal=True)
        ref = model.ln_f(ref)  # Identity for Post-LN
        torch.testing.assert_close(model.hidden_states(x), ref)
        torch.testing.assert_close(model(x), ref @ model.tok_emb.weight.T)


def sharpen(model: TransformerLM) -> TransformerLM:
    """At the GPT-2 init the scores are ≈ 0 and attention writes little into the residual stream; larger
    embeddings and attention projections make the attention pattern (and RealFormer's carried scores) matter."""
    with torch.no_grad():
        model.tok_emb.weight.mul_(20)
        model.pos_emb.weight.mul_(20)
        for b in model.blocks:
            b.attn.qkv.weight.mul_(10)
            b.attn.proj.weight.mul_(20)
    return model


def test_realformer_one_layer_equals_post_ln_and_two_layers_differ():
    post1 = make_lm("post", n_layers=1)
    real1 = make_lm("realformer", n_layers=1, seed=5)
    real1.load_state_dict(post1.state_dict())
    x = tokens(2, 13)
    torch.testing.assert_close(real1(x), post1(x))
    post2 = make_lm("post")
    sharpen(post2)
    real2 = make_lm("realformer", seed=5)
    real2.load_state_dict(post2.state_dict())
    assert (real2(x) - post2(x)).abs().max() > 1e-2


def realformer_reference(model: TransformerLM, x: torch.Tensor) -> torch.Tensor:
    """Float64 hand-written RealFormer: per head S_l = Q Kᵀ/√d + S_{l-1}, softmax over causal positions."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    B, T = x.shape
    H, d = model.n_heads, model.d_model
    dh = d // H
    h = sd["tok_emb.weight"][x] + sd["pos_emb.weight"][:T]
    prev = torch.zeros(B, H, T, T, dtype=torch.float64)

    def ln(z, p):
        mu, var = z.mean(-1, keepdim=True), z.var(-1, unbiased=False, keepdim=True)
        return (z - mu) / torch.sqrt(var + 1e-5) * sd[p + ".weight"] + sd[p + ".bias"]

    for layer in range(model.n_layers):
        p = f"blocks.{layer}."
        qkv = h @ sd[p + "attn.qkv.weight"].T + sd[p + "attn.qkv.bias"]
        heads = [qkv[..., i * d:(i + 1) * d].reshape(B, T, H, dh).transpose(1, 2) for i in range(3)]
        q, k, v = heads
        S = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(dh) + prev
        prev = S
        A = torch.zeros_like(S)
        for i in range(T):  # explicit causal softmax, row by row
            A[..., i, :i + 1] = torch.softmax(S[..., i, :i + 1], dim=-1)
        o = (A @ v).transpose(1, 2).reshape(B, T, d) @ sd[p + "attn.proj.weight"].T + sd[p + "attn.proj.bias"]
        h = ln(h + o, p + "ln1")
        f = F.gelu(h @ sd[p + "fc1.weight"].T + sd[p + "fc1.bias"]) @ sd[p + "fc2.weight"].T + sd[p + "fc2.bias"]
        h = ln(h + f, p + "ln2")
    return h @ sd["head.weight"].T


@pytest.mark.parametrize("n_layers", [1, 3])
def test_realformer_matches_float64_reference(n_layers):
    model = make_lm("realformer", n_layers=n_layers)
    sharpen(model)
    x = tokens(2, 9)
    ref = realformer_reference(model, x)
    torch.testing.assert_close(model.double()(x), ref)
    torch.testing.assert_close(model.float()(x), ref.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cell", ["lstm", "rnn"])
def test_rnnlm_matches_cell_loop(cell):
    model = make_lm(cell, tie_weights=True)  # hidden 24 != d_model 16 → projection before the tied head
    x = tokens(3, 7)
    cells = []
    for layer in range(2):
        c = nn.LSTMCell(16 if layer == 0 else 24, 24) if cell == "lstm" else nn.RNNCell(16 if layer == 0 else 24, 24)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(c, name).copy_(getattr(model.rnn, f"{name}_l{layer}"))
        cells.append(c)
    h = [torch.zeros(3, 24) for _ in range(2)]
    c_state = [torch.zeros(3, 24) for _ in range(2)]
    outs = []
    for t in range(7):
        inp = model.tok_emb(x[:, t])
        for layer, c in enumerate(cells):
            if cell == "lstm":
                h[layer], c_state[layer] = c(inp, (h[layer], c_state[layer]))
            else:
                h[layer] = c(inp, h[layer])
            inp = h[layer]
        outs.append(model.out_proj(inp) @ model.tok_emb.weight.T)
    logits, state = model(x, return_state=True)
    torch.testing.assert_close(logits, torch.stack(outs, 1))
    torch.testing.assert_close(state[0] if cell == "lstm" else state, torch.stack(h))
    # carrying the state: two halves == whole sequence
    a, s = model(x[:, :4], return_state=True)
    torch.testing.assert_close(torch.cat([a, model(x[:, 4:], s)], 1), logits)


# ------------------------------------------------------------------------------------------- misc structure
def test_output_embedding_hidden_and_init():
    model = make_lm("pre", n_layers=4, d_model=64)
    x = tokens(2, 5)
    logits, hidden = model(x, return_hidden=True)
    assert hidden.shape == (2, 5, 64) and model.output_embedding.shape == (V, 64)
    assert model.output_embedding is model.tok_emb.weight
    torch.testing.assert_close(logits, hidden @ model.output_embedding.T)
    torch.testing.assert_close(model.hidden_states(x), hidden)
    assert abs(model.blocks[0].fc1.weight.std().item() - 0.02) < 0.002
    assert abs(model.blocks[0].fc2.weight.std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert count_parameters(model) == sum(p.numel() for p in set(model.parameters()))
    untied = make_lm("pre", n_layers=4, d_model=64, tie_weights=False)
    assert untied.output_embedding is not untied.tok_emb.weight
    assert count_parameters(untied) == count_parameters(model) + V * 64
    rnn = make_lm("lstm")
    rl, rh = rnn(x, return_hidden=True)
    assert rh.shape == (2, 5, 24) and rnn.output_embedding.shape == (V, 24)
    torch.testing.assert_close(rl, rh @ rnn.output_embedding.T + rnn.head.bias)
    torch.testing.assert_close(rnn.hidden_states(x), rh)


def test_mlp_and_cnn():
    torch.manual_seed(0)
    mlp = MLP(64, (32, 16), 10, activation="tanh")
    linears = [m for m in mlp if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(64, 32), (32, 16), (16, 10)]
    x = torch.randn(5, 64)
    ref = x
    for i, l in enumerate(linears):
        ref = l(ref) if i == 2 else torch.tanh(l(ref))
    torch.testing.assert_close(mlp(x), ref)
    assert len(MLP(4, (), 3)) == 1 and MLP(4, 8, out_dim=3, bias=False)[0].bias is None
    assert count_parameters(MLP(4, (8,), 3)) == 4 * 8 + 8 + 8 * 3 + 3
    cnn = SmallCNN(width=4)
    img = torch.rand(6, 1, 8, 8)
    out = cnn(img)
    assert out.shape == (6, 10)
    torch.testing.assert_close(cnn(img.reshape(6, 64)), out)
    param_types = {type(m) for m in cnn.modules() if any(True for _ in m.parameters(recurse=False))}
    assert param_types == {nn.Conv2d, nn.Linear}


def test_gradients_flow():
    x = tokens(2, 8)
    for kind in MODES + ("lstm", "rnn"):
        model = make_lm(kind, dropout=0.1).train()
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, (kind, name)
    for m, inp in ((MLP(64, (8,), 10), torch.rand(4, 64)), (SmallCNN(width=4), torch.rand(4, 1, 8, 8))):
        F.cross_entropy(m(inp), torch.arange(4)).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_dropout_train_vs_eval_and_vmap_over_parameters():
    model = make_lm("pre", dropout=0.3)
    x = tokens(2, 6)
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))
    for kind in MODES:
        model = make_lm(kind).eval()
        params = {k: v.detach() for k, v in model.named_parameters()}
        stacked = {k: torch.stack([v, 1.1 * v]) for k, v in params.items()}
        out = vmap(lambda p: functional_call(model, p, (x,)))(stacked)
        torch.testing.assert_close(out[0], model(x))
        scaled = {k: 1.1 * v for k, v in params.items()}
        torch.testing.assert_close(out[1], functional_call(model, scaled, (x,)))


# ------------------------------------------------------------------------------------------------ decoding


# ---------------------------------------------------------------------------------------------- bad inputs
def test_constructor_errors():
    with pytest.raises(ValueError, match="divisible"):
        TransformerLM(V, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="residual"):
        TransformerLM(V, residual="sandwich")
    with pytest.raises(ValueError, match="vocab_size"):
        TransformerLM(0)
    with pytest.raises(TypeError, match="n_layers"):
        TransformerLM(V, n_layers=2.0)
    with pytest.raises(ValueError, match="dropout"):
        TransformerLM(V, dropout=1.5)
    with pytest.raises(ValueError, match="cell"):
        RNNLM(V, cell="gru")
    with pytest.raises(ValueError, match="hidden"):
        RNNLM(V, hidden=0)
    with pytest.raises(ValueError, match="activation"):
        MLP(4, (8,), 3, activation="swish")
    with pytest.raises(TypeError, match="out_dim"):
        MLP(4, (8,))
    with pytest.raises(ValueError, match="hidden"):
        MLP(4, (8, 0), 3)
    with pytest.raises(ValueError, match="n_classes"):
        SmallCNN(n_classes=1)
    with pytest.raises(TypeError, match="nn.Module"):
        count_parameters(torch.zeros(3))


def test_forward_errors():
    model = make_lm("pre")
    with pytest.raises(TypeError, match="dtype"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((2, 3), V))
    with pytest.raises(ValueError, match="vocab_size"):
        make_lm("lstm")(torch.full((2, 3), -1))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        model(torch.zeros(0, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[\.\.\., 64\]"):
        MLP(64, (8,), 10)(torch.zeros(3, 63))
    with pytest.raises(ValueError, match="8, 8"):
        SmallCNN()(torch.zeros(3, 1, 7, 7))


# ---------------------------------------------------------------------------------------------------- CUDA
