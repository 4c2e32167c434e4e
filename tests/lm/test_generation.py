"""Decoding and sequence log-probabilities (taskloss.lm.generation): greedy decoding against a naive token-by-token
loop, EOS/pad handling, seeded sampling, log-probabilities against a manual gather."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import MODES, V, make_lm, tokens
from torch import nn

from taskloss.lm import generate, sequence_logprob


def naive_greedy(model, prefix_row, n, eos_id, pad_id, max_len):
    ctx = prefix_row[None].clone()
    out = []
    for _ in range(n):
        c = ctx if max_len is None else ctx[:, -max_len:]
        tok = int(model(c)[0, -1].argmax())
        out.append(tok)
        ctx = torch.cat([ctx, torch.tensor([[tok]])], 1)
        if tok == eos_id:
            break
    return out + [pad_id] * (n - len(out))


@pytest.mark.parametrize("kind", ["pre", "realformer", "lstm"])
def test_greedy_generate_equals_naive_loop(kind):
    model = make_lm(kind, max_len=12) if kind in MODES else make_lm(kind)
    model.train()
    prefix = tokens(4, 6, seed=3)
    free = generate(model, prefix, 10, eos_id=None, pad_id=0)  # 6 + 10 > max_len=12: context is cropped
    assert model.training  # mode restored
    eos = int(free[0, 2])  # row 0 stops at step ≤ 2
    out = generate(model, prefix, 10, eos_id=eos, pad_id=0)
    assert out.shape == (4, 10) and out.dtype == torch.long
    model.eval()
    for i in range(4):
        ref = naive_greedy(model, prefix[i], 10, eos, 0, getattr(model, "max_len", None))
        assert out[i].tolist() == ref
        assert generate(model, prefix[i:i + 1], 10, eos_id=eos, pad_id=0)[0].tolist() == ref
    first = int((out[0] == eos).nonzero()[0])
    assert first <= 2 and (out[0, first + 1:] == 0).all()


class ConstantLM(nn.Module):
    """Stand-in LM with fixed next-token logits; counts forward calls."""

    def __init__(self, logits):
        super().__init__()
        self.vocab_size = logits.numel()
        self.register_buffer("logits", logits)
        self.calls = 0

    def forward(self, idx):
        self.calls += 1
        return self.logits.expand(idx.shape[0], idx.shape[1], -1)


def test_eos_pad_and_early_stop():
    lm = ConstantLM(torch.tensor([0.0, 0.0, 5.0, 1.0]))  # argmax = 2
    out = generate(lm, torch.zeros(3, 2, dtype=torch.long), 6, eos_id=2, pad_id=1)
    assert out.tolist() == [[2, 1, 1, 1, 1, 1]] * 3 and lm.calls == 1
    lm.calls = 0
    out = generate(lm, torch.zeros(3, 2, dtype=torch.long), 6, eos_id=3, pad_id=1)
    assert out.tolist() == [[2] * 6] * 3 and lm.calls == 6


def test_sampling_reproducible_topk_and_distribution():
    model = make_lm("post")
    prefix = tokens(5, 4)
    kw = dict(eos_id=None, pad_id=0, greedy=False, temperature=2.0)
    a = generate(model, prefix, 8, generator=torch.Generator().manual_seed(7), **kw)
    b = generate(model, prefix, 8, generator=torch.Generator().manual_seed(7), **kw)
    c = generate(model, prefix, 8, generator=torch.Generator().manual_seed(8), **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = generate(model, prefix, 8, eos_id=None, pad_id=0)
    assert torch.equal(generate(model, prefix, 8, generator=torch.Generator().manual_seed(1),
                                **{**kw, "temperature": 0.5}, top_k=1), g)
    # empirical distribution of one sampled token vs softmax(logits / T) over the top-k
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    lm = ConstantLM(logits)
    n = 20000
    s = generate(lm, torch.zeros(n, 1, dtype=torch.long), 1, eos_id=None, pad_id=0, greedy=False,
                 temperature=1.5, top_k=3, generator=torch.Generator().manual_seed(0))[:, 0]
    freq = torch.bincount(s, minlength=5).double() / n
    p = torch.softmax(logits.double()[:3] / 1.5, 0)
    assert freq[3:].sum() == 0
    assert (freq[:3] - p).abs().max() < 4 * math.sqrt(0.25 / n)


@pytest.mark.parametrize("kind", ["pre", "rnn"])
def test_sequence_logprob_matches_manual_gather(kind):
    model = make_lm(kind)
    prefix, cont = tokens(3, 5), tokens(3, 6, seed=2)
    cont[1, 3:] = 0  # padded tail (pad_id = 0)
    cont[1, 2] = 4   # EOS
    lp = sequence_logprob(model, prefix, cont, pad_id=0)
    ref = torch.zeros(3)
    for i in range(3):
        full = torch.cat([prefix[i], cont[i]])[None]
        logp = torch.log_softmax(model(full)[0].double(), -1)
        for j in range(6):
            if cont[i, j] != 0:
                ref[i] += logp[5 + j - 1, cont[i, j]].float()
    torch.testing.assert_close(lp, ref)
    # eos_id == pad_id: the first EOS counts, everything after it does not
    cont2 = cont.clone()
    cont2[1, 2] = 0
    lp2 = sequence_logprob(model, prefix, cont2, pad_id=0, eos_id=0)
    full = torch.cat([prefix[1], cont2[1]])[None]
    logp = torch.log_softmax(model(full)[0], -1)
    torch.testing.assert_close(lp2[1], sum(logp[4 + j, cont2[1, j]] for j in range(3)))
    lp.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.tok_emb.weight.grad.abs().sum() > 0


def test_generation_errors():
    model = make_lm("pre")
    p = tokens(2, 3)
    ok = dict(max_new_tokens=4, eos_id=1, pad_id=0)
    for bad, exc, msg in (({"temperature": 0.0, "greedy": False}, ValueError, "temperature"),
                          ({"top_k": 0}, ValueError, "top_k"),
                          ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
                          ({"eos_id": V}, ValueError, "eos_id"),
                          ({"pad_id": -1}, ValueError, "pad_id"),
                          ({"generator": 3}, TypeError, "generator")):
        with pytest.raises(exc, match=msg):
            generate(model, p, **{**ok, **bad})
    with pytest.raises(ValueError, match="empty"):
        generate(model, p[:0], **ok)
    with pytest.raises(TypeError, match="vocab_size"):
        generate(nn.Linear(2, 2), p, **ok)
    with pytest.raises(ValueError, match="NaN"):
        generate(ConstantLM(torch.tensor([0.0, float("nan")])), torch.zeros(1, 1, dtype=torch.long), **ok)
    with pytest.raises(ValueError, match="batch sizes"):
        sequence_logprob(model, p, tokens(3, 2), pad_id=0)
    with pytest.raises(ValueError, match="max_len"):
        sequence_logprob(model, p, tokens(2, 23), pad_id=0)
    with pytest.raises(ValueError, match="empty"):
        sequence_logprob(model, p, p[:, :0], pad_id=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_path_matches_cpu():
    x = tokens(3, 10)
    for kind in MODES + ("lstm",):
        model = make_lm(kind).eval()
        ref = model(x)
        gpu = model.cuda()
        torch.testing.assert_close(gpu(x.cuda()).cpu(), ref, rtol=1e-3, atol=1e-3)
        out = generate(gpu, x.cuda(), 5, eos_id=None, pad_id=0, greedy=False, top_k=5,
                       generator=torch.Generator("cuda").manual_seed(0))
        assert out.device.type == "cuda" and out.shape == (3, 5)
        gpu.train()  # cuDNN RNN backward requires train mode (dropout is 0)
        lp = sequence_logprob(gpu, x.cuda(), out, pad_id=0)
        lp.sum().backward()
        assert lp.device.type == "cuda" and torch.isfinite(lp).all()
    with pytest.raises(ValueError, match="model is on"):
        generate(make_lm("pre"), x.cuda(), 3, eos_id=None, pad_id=0)
