"""A tiny Hugging Face classifier for the harness tests, built offline from a config (seeded, 22,499 parameters):
BERT with SDPA attention and learned embeddings, wrapped so that ``model(inputs) → logits [N, C]``."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn


class LogitsOf(nn.Module):
    """``forward(input_ids) = hf_model(input_ids=...).logits``: a Hugging Face classifier as a Problem's model."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids):
        return self.hf(input_ids=input_ids).logits


@pytest.fixture
def bert_classifier():
    """``(model, inputs [6, 5], labels [6])``: a wrapped ``BertForSequenceClassification`` with 3 labels."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                                  vocab_size=97, max_position_embeddings=32, num_labels=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LogitsOf(transformers.BertForSequenceClassification(cfg).eval())
    g = torch.Generator().manual_seed(1)
    return model, torch.randint(0, 97, (6, 5), generator=g), torch.tensor([0, 1, 2, 0, 1, 2])
