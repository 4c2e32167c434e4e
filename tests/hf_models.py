"""Tiny Hugging Face models built offline from configs (no download), shared by the test modules of several
subpackages (importable because pyproject puts ``tests/`` on ``sys.path`` for pytest).

Each builder seeds torch before building, so a model is the same in every process, and stays under ~100K
parameters: a GPT-2 (``Conv1D`` projections, learned positions, tied ``lm_head``), a Llama (RMSNorm, rotary
positions, SwiGLU, tied embeddings) and a BERT classifier (dropout, ``[CLS]`` pooler). Attention is the library's
default (SDPA) unless ``attn_implementation`` says otherwise; the models come back in eval mode.
"""
from __future__ import annotations

import torch

VOCAB = 97
SEQ = 32


def tiny_gpt2(seed: int = 0, *, attn_implementation: str | None = None, dtype: torch.dtype = torch.float32, **kw):
    """``GPT2LMHeadModel`` with 2 layers, 2 heads, width 32, vocabulary 97 (≈ 29K parameters, tied lm_head)."""
    import transformers

    cfg = transformers.GPT2Config(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": VOCAB,
                                     "n_positions": SEQ, "bos_token_id": VOCAB - 1,
                                     "eos_token_id": VOCAB - 1, **kw})
    return _build(transformers.GPT2LMHeadModel, cfg, seed, attn_implementation, dtype)


def tiny_llama(seed: int = 0, *, attn_implementation: str | None = None, dtype: torch.dtype = torch.float32, **kw):
    """``LlamaForCausalLM`` with 2 layers, 2 heads, width 32, vocabulary 97, tied embeddings (≈ 16K parameters)."""
    import transformers

    cfg = transformers.LlamaConfig(**{"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                                      "hidden_size": 32, "intermediate_size": 64, "vocab_size": VOCAB,
                                      "max_position_embeddings": SEQ, "tie_word_embeddings": True, **kw})
    return _build(transformers.LlamaForCausalLM, cfg, seed, attn_implementation, dtype)


def tiny_bert(seed: int = 0, *, num_labels: int = 3, attn_implementation: str | None = None,
              dtype: torch.dtype = torch.float32, **kw):
    """``BertForSequenceClassification`` with 2 layers, 2 heads, width 32, vocabulary 97, ``num_labels`` classes
    (≈ 31K parameters; dropout 0.1 as BERT's default, so train mode is random)."""
    import transformers

    cfg = transformers.BertConfig(**{"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32,
                                     "intermediate_size": 64, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
                                     "num_labels": num_labels, **kw})
    return _build(transformers.BertForSequenceClassification, cfg, seed, attn_implementation, dtype)


def _build(cls, cfg, seed, attn_implementation, dtype):
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype)
    return model.eval()


def token_batch(batch: int = 3, length: int = 8, seed: int = 1, *, lengths: list[int] | None = None):
    """``(input_ids, attention_mask, labels)`` for a causal LM: random ids ``[B, T]``; with ``lengths`` the rows are
    right-padded after ``lengths[b]`` tokens (mask 0, label -100, pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if lengths is not None:
        for b, n in enumerate(lengths):
            mask[b, n:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


#: The causal-LM families of ``tiny_causal_lm``: config class, model class and the config's size arguments
#: (2 layers, 2 heads, width 32, vocabulary 97; tied embeddings where the family ties them by default).
_FAMILIES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": SEQ,
                                               "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                         "hidden_size": 32, "intermediate_size": 64,
                                                         "max_position_embeddings": SEQ}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32,
                                            "ffn_dim": 64, "word_embed_proj_dim": 32, "max_position_embeddings": SEQ,
                                            "pad_token_id": 0}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                  "num_key_value_heads": 2, "hidden_size": 32,
                                                  "intermediate_size": 64, "max_position_embeddings": SEQ,
                                                  "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                        "num_key_value_heads": 1, "hidden_size": 32, "head_dim": 16,
                                                        "intermediate_size": 64, "max_position_embeddings": SEQ}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                  "num_key_value_heads": 2, "hidden_size": 32,
                                                  "intermediate_size": 64, "max_position_embeddings": SEQ}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                  "num_key_value_heads": 1, "hidden_size": 32, "head_dim": 16,
                                                  "intermediate_size": 64, "max_position_embeddings": SEQ}),
    "phi": ("PhiConfig", "PhiForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32,
                                            "intermediate_size": 64, "max_position_embeddings": SEQ}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_layer": 2, "n_head": 2, "hidden_size": 32}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"num_hidden_layers": 2, "num_attention_heads": 2,
                                                     "hidden_size": 32, "max_position_embeddings": SEQ}),
}
FAMILIES = tuple(_FAMILIES)


def tiny_causal_lm(family: str, seed: int = 0, *, dtype: torch.dtype = torch.float32, **kw):
    """A tiny ``…ForCausalLM`` of ``family`` (one of :data:`FAMILIES`): 2 layers, 2 heads, width 32, vocabulary
    97, dropout off, eval mode (≈ 10–40K parameters)."""
    import transformers

    cfg_name, model_name, size = _FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{"vocab_size": VOCAB, **size, **kw})
    for attr in ("dropout", "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                 "activation_dropout", "attention_probs_dropout_prob", "hidden_dropout_prob"):
        if isinstance(getattr(cfg, attr, None), float):
            setattr(cfg, attr, 0.0)
    return _build(getattr(transformers, model_name), cfg, seed, None, dtype)
