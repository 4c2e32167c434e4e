"""Tiny Hugging Face models for the gradient-flow probes, built offline from configs (seeded, under 100K parameters):
GPT-2 and BERT with eager attention (which returns its probabilities), and GPT-2 with SDPA (which does not)."""
from __future__ import annotations

import warnings

import pytest
import torch


def _quiet(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


@pytest.fixture
def hf_gpt2():
    """A function ``attn → GPT2LMHeadModel`` (2 layers, 2 heads, width 32), in eval mode."""
    transformers = pytest.importorskip("transformers")

    def build(attn: str = "eager"):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=32,
                                      bos_token_id=96, eos_token_id=96, attn_implementation=attn)
        return _quiet(lambda: transformers.GPT2LMHeadModel(cfg).eval())

    return build


@pytest.fixture
def hf_bert():
    """A ``BertModel`` (2 layers, 2 heads, width 32) with eager attention, in eval mode."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                                  vocab_size=97, max_position_embeddings=32, attn_implementation="eager")
    return _quiet(lambda: transformers.BertModel(cfg).eval())
