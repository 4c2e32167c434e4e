"""Tiny Hugging Face models for the search tests, built offline from configs (seeded, each under 100K parameters):
a GPT-2 (``Conv1D`` projections, tied embeddings, SDPA attention) and a Llama with tied embeddings and RMSNorm."""
from __future__ import annotations

import warnings

import pytest
import torch

VOCAB = 97
#: special ids inside the tiny vocabulary (the configs' defaults, 50256, lie outside it)
BOS, EOS = 95, 96


def tiny_gpt2(seed: int = 0, **kw):
    """``GPT2LMHeadModel`` with 2 layers, 2 heads, width 32 (29,600 parameters), in eval mode."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
                                  bos_token_id=BOS, eos_token_id=EOS, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GPT2LMHeadModel(cfg).eval()


def tiny_llama(seed: int = 0, **kw):
    """``LlamaForCausalLM`` with 2 layers, tied embeddings, grouped-query attention, in eval mode."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   hidden_size=32, intermediate_size=64, vocab_size=VOCAB,
                                   max_position_embeddings=32, tie_word_embeddings=True, bos_token_id=BOS,
                                   eos_token_id=EOS, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def gpt2():
    return tiny_gpt2()


@pytest.fixture
def llama():
    return tiny_llama()
