"""Tests for taskloss.gradflow.attention: attention maps against a float64 hand computation, entropies against
scipy.stats.entropy, gradient norms against plain ``loss.backward()``."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import MODES, make_lm, tokens
from scipy.stats import entropy as scipy_entropy

from taskloss.gradflow import attention_entropy, attention_probabilities, layer_gradient_norms


def sharpened(kind, **kw):
    model = make_lm(kind, **kw).double().eval()
    with torch.no_grad():
        model.tok_emb.weight.mul_(20)
        model.pos_emb.weight.mul_(20)
        for b in model.blocks:
            b.attn.qkv.weight.mul_(10)
    return model


@pytest.mark.parametrize("kind", MODES)
def test_probabilities_reproduce_the_attention_output(kind):
    model = sharpened(kind, n_layers=1)
    x = tokens(2, 10)
    (A,) = attention_probabilities(model, x)
    assert A.shape == (2, 4, 10, 10)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 4, 10, dtype=A.dtype))
    assert torch.equal(A.triu(1), torch.zeros_like(A))
    blk = model.blocks[0]
    emb = model.tok_emb(x) + model.pos_emb(torch.arange(10))
    inp = blk.ln1(emb) if kind == "pre" else emb
    _, _, v = blk.attn.qkv(inp).view(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)
    y = blk.attn.proj((A @ v).transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(y, blk.attn(inp)[0])               # the fused kernel's output


@pytest.mark.parametrize("kind", MODES)
def test_entropy_matches_scipy(kind):
    model = sharpened(kind, n_layers=3)
    x = tokens(3, 12)
    probs = attention_probabilities(model, x)
    ent = attention_entropy(model, x)
    ent_n = attention_entropy(model, x, normalized=True)
    assert ent.shape == ent_n.shape == (3, 4)
    for layer, A in enumerate(probs):
        rows = A.detach().numpy()
        ref = np.array([[np.mean([scipy_entropy(rows[b, h, i, : i + 1]) for b in range(3) for i in range(1, 12)])
                         for h in range(4)]])
        refn = np.array([[np.mean([scipy_entropy(rows[b, h, i, : i + 1]) / math.log(i + 1) for b in range(3)
                                   for i in range(1, 12)]) for h in range(4)]])
        np.testing.assert_allclose(ent[layer].numpy(), ref[0], rtol=1e-10)
        np.testing.assert_allclose(ent_n[layer].numpy(), refn[0], rtol=1e-10)
    assert (ent_n >= 0).all() and (ent_n <= 1 + 1e-12).all()


def test_uniform_attention_has_normalized_entropy_one():
    model = make_lm("post").double()
    with torch.no_grad():
        for b in model.blocks:
            b.attn.qkv.weight[:64].zero_()                         # q = k = bias = 0 → scores 0
            b.attn.qkv.bias.zero_()
    x = tokens(2, 8)
    torch.testing.assert_close(attention_entropy(model, x, normalized=True), torch.ones(2, 4, dtype=torch.float64))
    expected = np.mean([math.log(i + 1) for i in range(1, 8)])
    torch.testing.assert_close(attention_entropy(model, x), torch.full((2, 4), expected, dtype=torch.float64))


@pytest.mark.parametrize("kind", MODES)
def test_layer_gradient_norms_match_backward(kind):
    model = make_lm(kind, n_layers=3).double()
    blocks = tokens(4, 11)
    g = layer_gradient_norms(model, blocks)
    assert all(p.grad is None for p in model.parameters())        # .grad untouched
    # reference: plain backward, and block inputs recomputed by hand with retain_grad
    emb = model.tok_emb(blocks[:, :-1]) + model.pos_emb(torch.arange(10))
    xs, x, carried = [], emb, None
    for blk in model.blocks:
        x.retain_grad()
        xs.append(x)
        x, scores = blk(x, carried)
        carried = scores
    logits = model.head(model.ln_f(x))
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))
    loss.backward()
    tol = dict(rtol=1e-6, atol=1e-9)     # block_nll takes the cross-entropy of float32 logits; the reference float64
    for i, blk in enumerate(model.blocks):
        ref = torch.cat([p.grad.reshape(-1) for p in blk.parameters()]).norm()
        torch.testing.assert_close(g.block[i], ref, **tol)
        ff = torch.cat([p.grad.reshape(-1) for m in (blk.fc1, blk.fc2) for p in m.parameters()]).norm()
        at = torch.cat([p.grad.reshape(-1) for p in blk.attn.parameters()]).norm()
        torch.testing.assert_close(g.feedforward[i], ff, **tol)
        torch.testing.assert_close(g.attention[i], at, **tol)
        torch.testing.assert_close(g.stream[i], xs[i].grad.norm(), **tol)
    total = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item()
    assert math.isclose(g.total, total, rel_tol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = make_lm("realformer").double()
    x = tokens(2, 9)
    torch.testing.assert_close(attention_entropy(model.cuda(), x.cuda()).cpu(), attention_entropy(model.cpu(), x))
    g_gpu = layer_gradient_norms(model.cuda(), tokens(3, 9).cuda())
    g_cpu = layer_gradient_norms(model.cpu(), tokens(3, 9))
    torch.testing.assert_close(g_gpu.block, g_cpu.block)
