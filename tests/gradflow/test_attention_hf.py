"""The attention probes on Hugging Face models: GPT-2's probabilities rebuilt by hand from its weights (causal,
``Conv1D`` projections) and equal to the attentions transformers returns, BERT's with a padding mask, the entropies
against scipy over exactly the keys each query may attend to, and a clear refusal of SDPA attention (which returns
no probabilities)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from taskloss.gradflow import attention_entropy, attention_probabilities, layer_gradient_norms

IDS = torch.randint(0, 97, (3, 7), generator=torch.Generator().manual_seed(4))
MASK = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])


def test_gpt2_probabilities_equal_a_hand_computation_and_transformers(hf_gpt2):
    model = hf_gpt2().double()
    probs = attention_probabilities(model, IDS)
    assert len(probs) == 2 and probs[0].shape == (3, 2, 7, 7)
    with torch.no_grad():
        want = model(IDS, output_attentions=True).attentions
        for a, b in zip(probs, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        blk = model.transformer.h[0]                         # layer 0 from the weights: ln_1, Conv1D c_attn, causal
        x = model.transformer.wte(IDS) + model.transformer.wpe(torch.arange(7))
        q, k, _ = (blk.ln_1(x) @ blk.attn.c_attn.weight + blk.attn.c_attn.bias).split(32, -1)
        q, k = (t.view(3, 7, 2, 16).transpose(1, 2) for t in (q, k))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(16)).masked_fill(~torch.ones(7, 7).tril().bool(), -math.inf)
        torch.testing.assert_close(probs[0], scores.softmax(-1), rtol=1e-10, atol=1e-12)


def _scipy_means(probs, mask, causal, normalized):
    out = np.zeros((len(probs), probs[0].shape[1]))
    for layer, A in enumerate(probs):
        A = A.detach().double().numpy()
        for h in range(A.shape[1]):
            vals = []
            for b in range(A.shape[0]):
                for i in range(A.shape[2]):
                    keys = [j for j in range(A.shape[3]) if mask[b, j] and (j <= i or not causal)]
                    if not mask[b, i] or len(keys) < 2:
                        continue
                    e = scipy_entropy(A[b, h, i, keys])
                    vals.append(e / math.log(len(keys)) if normalized else e)
            out[layer, h] = np.mean(vals)
    return out


@pytest.mark.parametrize("normalized", [False, True])
def test_gpt2_entropy_matches_scipy_with_left_padding(hf_gpt2, normalized):
    model = hf_gpt2().double()
    left = MASK.flip(1)                                      # causal LMs pad on the left
    probs = attention_probabilities(model, IDS, left)
    ent = attention_entropy(model, IDS, normalized, attention_mask=left)
    assert ent.shape == (2, 2)
    np.testing.assert_allclose(ent.numpy(), _scipy_means(probs, left.bool(), True, normalized), rtol=1e-10)


@pytest.mark.parametrize("normalized", [False, True])
def test_bert_probabilities_and_entropy_with_padding(hf_bert, normalized):
    model = hf_bert.double()
    probs = attention_probabilities(model, IDS, MASK)
    with torch.no_grad():
        want = model(IDS, attention_mask=MASK, output_attentions=True).attentions
    for a, b in zip(probs, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert float(a.masked_select(~MASK.bool()[:, None, None, :].expand_as(a)).abs().max()) == 0.0
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
    assert bool((probs[0].triu(1) != 0).any())                 # bidirectional: every unpadded key
    ent = attention_entropy(model, IDS, normalized, attention_mask=MASK)
    np.testing.assert_allclose(ent.numpy(), _scipy_means(probs, MASK.bool(), False, normalized), rtol=1e-10)


def test_sdpa_attention_is_refused_with_what_to_do(hf_gpt2):
    model = hf_gpt2("sdpa")
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        attention_probabilities(model, IDS)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        attention_entropy(model, IDS)


def test_bad_hf_inputs(hf_gpt2):
    model = hf_gpt2()
    with pytest.raises(ValueError, match="vocab_size"):
        attention_probabilities(model, IDS + 97)
    with pytest.raises(ValueError, match="max_len"):
        attention_probabilities(model, torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        attention_probabilities(model, IDS, MASK[:, :3])
    with pytest.raises(ValueError, match="without any token"):
        attention_probabilities(model, IDS, torch.zeros_like(IDS))
    with pytest.raises(TypeError, match="0/1"):
        attention_probabilities(model, IDS, MASK.float())
    with pytest.raises(TypeError, match="TransformerLM"):
        layer_gradient_norms(model, IDS)
