"""TransformerLM's ``return_scores`` (every layer's pre-softmax attention scores) and the three residual layouts
against an independent implementation: x-transformers' ``Decoder`` (``pre_norm`` and ``residual_attn`` = He et al.'s
RealFormer), with our weights copied in; a float64 hand-written reference lives in tests/models/test_models.py."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import MODES, make_lm, tokens

x_transformers = pytest.importorskip("x_transformers")


def sharpen(model):
    """Larger embeddings and attention weights than the GPT-2 init, so the attention pattern (and RealFormer's
    carried scores) change the output."""
    with torch.no_grad():
        model.tok_emb.weight.mul_(20)
        model.pos_emb.weight.mul_(20)
        for b in model.blocks:
            b.attn.qkv.weight.mul_(10)
            b.attn.proj.weight.mul_(20)
    return model


@pytest.mark.parametrize("kind", MODES)
def test_scores_do_not_change_the_output_and_match_qk(kind):
    model = sharpen(make_lm(kind)).double().eval()
    x = tokens(2, 9)
    logits, hidden, scores = model(x, return_hidden=True, return_scores=True)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(hidden, model.hidden_states(x))
    assert len(scores) == 2 and all(s.shape == (2, 4, 9, 9) for s in scores)
    # layer 0's scores are Q Kᵀ/√d_h of its input; RealFormer's layer 1 adds layer 0's
    emb = model.tok_emb(x) + model.pos_emb(torch.arange(9))
    blk = model.blocks[0]
    inp = blk.ln1(emb) if kind == "pre" else emb
    q, k, _ = blk.attn.qkv(inp).view(2, 9, 3, 4, 8).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(scores[0], q @ k.transpose(-2, -1) / math.sqrt(8))
    h1, own1 = model.blocks[0](emb)[0], None
    b1 = model.blocks[1]
    q1, k1, _ = b1.attn.qkv(b1.ln1(h1) if kind == "pre" else h1).view(2, 9, 3, 4, 8).permute(2, 0, 3, 1, 4)
    own1 = q1 @ k1.transpose(-2, -1) / math.sqrt(8)
    torch.testing.assert_close(scores[1], own1 + scores[0] if kind == "realformer" else own1)


def set_gain(norm, weight):
    """x-transformers' LayerNorm multiplies by ``gamma + unit_offset`` (its Decoder sets ``unit_offset=True``)."""
    norm.gamma.copy_(weight - float(norm.unit_offset))


def to_x_transformers(model):
    """An x-transformers Decoder with the same weights as ``model`` (biases that Decoder lacks — qkv, proj and
    LayerNorm shifts — are zeroed in ``model`` first)."""
    from x_transformers import Decoder

    with torch.no_grad():
        for b in model.blocks:
            for p in (b.attn.qkv.bias, b.attn.proj.bias, b.ln1.bias, b.ln2.bias):
                p.zero_()
        if model.residual == "pre":
            model.ln_f.bias.zero_()
    dec = Decoder(dim=model.d_model, depth=model.n_layers, heads=model.n_heads,
                  attn_dim_head=model.d_model // model.n_heads, ff_mult=model.d_ff // model.d_model,
                  pre_norm=model.residual == "pre", residual_attn=model.residual == "realformer").double()
    d = model.d_model
    with torch.no_grad():
        for i, b in enumerate(model.blocks):
            (norm_a, attn, _), (norm_f, ff, _) = dec.layers[2 * i], dec.layers[2 * i + 1]
            attn.to_q.weight.copy_(b.attn.qkv.weight[:d])
            attn.to_k.weight.copy_(b.attn.qkv.weight[d:2 * d])
            attn.to_v.weight.copy_(b.attn.qkv.weight[2 * d:])
            attn.to_out.weight.copy_(b.attn.proj.weight)
            ff.ff[0][0].weight.copy_(b.fc1.weight)
            ff.ff[0][0].bias.copy_(b.fc1.bias)
            ff.ff[2].weight.copy_(b.fc2.weight)
            ff.ff[2].bias.copy_(b.fc2.bias)
            ln_a = norm_a[0] if model.residual == "pre" else norm_a[2]     # pre-branch vs post-branch norm
            ln_f = norm_f[0] if model.residual == "pre" else norm_f[2]
            set_gain(ln_a, b.ln1.weight)
            set_gain(ln_f, b.ln2.weight)
        if model.residual == "pre":
            set_gain(dec.final_norm, model.ln_f.weight)
    return dec


@pytest.mark.parametrize("kind", MODES)
@pytest.mark.parametrize("n_layers", [1, 3])
def test_matches_x_transformers(kind, n_layers):
    model = sharpen(make_lm(kind, n_layers=n_layers)).double().eval()
    with torch.no_grad():
        for b in model.blocks:                       # non-trivial LayerNorm gains
            b.ln1.weight.uniform_(0.5, 1.5)
            b.ln2.weight.uniform_(0.5, 1.5)
    dec = to_x_transformers(model).eval()
    x = tokens(2, 11)
    emb = model.tok_emb(x) + model.pos_emb(torch.arange(11))
    ours = model.hidden_states(x)
    theirs = dec(emb)
    # x-transformers computes the softmax in float32 (attend.py), so float64 models agree to ~1e-7, not 1e-15
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    if kind == "realformer" and n_layers == 3:       # the carried scores matter: Post-LN weights give another output
        post = make_lm("post", n_layers=3).double()
        post.load_state_dict(model.state_dict())
        assert (post.hidden_states(x) - ours).abs().max() > 1e-2
