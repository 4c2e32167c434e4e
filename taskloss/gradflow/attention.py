"""Per-layer probes of a Transformer LM: attention probabilities and their entropy, and gradient norms by layer.

The three residual layouts of :class:`~taskloss.models.transformer.TransformerLM` differ in the paths a gradient
takes from the loss back to layer ``l`` (derived in notebook 14_realformer):

- Post-LN, ``x_{l+1} = LN(x_l + F(x_l))``: every path crosses ``∂LN/∂z = (γ/σ_z)(I − 𝟙𝟙ᵀ/d − ẑẑᵀ/d)``, so the
  gradient reaching a low layer is rescaled by the product of ``1/σ`` of the layers above it;
- Pre-LN, ``x_{l+1} = x_l + F(LN(x_l))``: ``∂x_{l+1}/∂x_l = I + ∂F/∂x``, an identity path from every layer to the
  final LayerNorm;
- RealFormer, Post-LN whose attention scores are carried, ``S_l = Q_l K_lᵀ/√d_h + S_{l−1}``: besides the Post-LN
  paths, ``∂S_{l+1}/∂S_l = I`` adds an identity path along the scores, so ``∂ℓ/∂S_l = ∂ℓ/∂S_l|_{local} +
  ∂ℓ/∂S_{l+1}``.

Xiong et al., *On Layer Normalization in the Transformer Architecture* (ICML 2020) bound the gradient of the last
layers at initialisation (large for Post-LN, shrinking like ``1/√L`` for Pre-LN); He et al., *RealFormer:
Transformer Likes Residual Attention* (Findings of ACL 2021) report sparser attention (lower entropy) in
RealFormer. :func:`layer_gradient_norms` and :func:`attention_entropy` measure both.

The attention probes read a Hugging Face model's attention too (GPT-2, Llama, BERT, …: ``output_attentions=True``,
which needs eager attention; a padding ``attention_mask`` is honoured), so the same entropies compare a pretrained
model with the package's own; the gradient norms by layer name the package's block layout and stay with it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from taskloss.lm.completion import block_nll
from taskloss.models.transformer import TransformerLM
from taskloss.validation import check_bool, check_token_ids

__all__ = ["attention_probabilities", "attention_entropy", "LayerGradients", "layer_gradient_norms"]


def _check_model(model) -> TransformerLM:
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a taskloss.models.TransformerLM, got {type(model).__name__}")
    return model


def _is_hf(model) -> bool:
    """A Hugging Face ``PreTrainedModel`` (without importing transformers when nothing has)."""
    tf = sys.modules.get("transformers")
    return tf is not None and isinstance(model, tf.PreTrainedModel)


def _hf_limits(model) -> tuple[int, int | None]:
    cfg = model.config
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        raise TypeError(f"cannot read the vocabulary size of {type(model).__name__} from its config")
    n = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    return vocab, int(n) if n else None


def _check_mask(attention_mask, idx: torch.Tensor) -> torch.Tensor | None:
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a tensor [B, T] of 0/1, got {type(attention_mask).__name__}")
    if attention_mask.shape != idx.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, idx {tuple(idx.shape)}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold 0/1 integers or bools, got dtype {attention_mask.dtype}")
    m = attention_mask.to(torch.bool)
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 and 1")
    if not bool(m.any(1).all()):
        raise ValueError("attention_mask has a row without any token")
    return m


def attention_probabilities(model, idx: torch.Tensor, attention_mask: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, ...]:
    """Every layer's attention probabilities ``A_l = softmax(mask(S_l))``, a tuple of ``[B, H, T, T]`` (rows sum
    to 1 over the keys a query may attend to: ``j ≤ i`` in a causal model, the unpadded keys of
    ``attention_mask``; the others are 0). Dropout is not applied by a taskloss model (a Hugging Face model runs as it
    is set: call ``model.eval()`` for deterministic maps).

    Args:
        model: a taskloss TransformerLM (any residual layout), or a Hugging Face model (GPT-2, Llama, BERT, …) whose
            attention returns its probabilities (``output_attentions=True``: eager attention; SDPA and flash
            attention return none and are refused with what to do).
        idx: token ids ``[B, T]``.
        attention_mask: Hugging Face models only: ``[B, T]`` 1 for tokens, 0 for padding (``None``: all tokens).

    Returns:
        One ``[B, H, T, T]`` tensor per layer.

    Raises:
        TypeError: another kind of model, non-integer ids, a mask for a TransformerLM.
        ValueError: ids out of the vocabulary, a sequence longer than the model's positions, a model that returned no
            attention probabilities.
    """
    if _is_hf(model):
        vocab, max_len = _hf_limits(model)
        check_token_ids("idx", idx, vocab, max_len)
        mask = _check_mask(attention_mask, idx)
        out = model(input_ids=idx, attention_mask=None if mask is None else mask.long(), output_attentions=True)
        attn = getattr(out, "attentions", None)
        if not attn:
            impl = getattr(model.config, "_attn_implementation", "?")
            raise ValueError(f"{type(model).__name__} computes attention with {impl!r}, which returns no attention "
                             "probabilities: build or load it with attn_implementation='eager' (or call "
                             "model.set_attn_implementation('eager') first)")
        return tuple(attn)
    _check_model(model)
    if attention_mask is not None:
        raise TypeError("attention_mask applies to Hugging Face models; a TransformerLM attends to every earlier "
                        "token")
    check_token_ids("idx", idx, model.vocab_size, model.max_len)
    _, scores = model(idx, return_scores=True)
    T = idx.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    return tuple(torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) for s in scores)


def attention_entropy(model, idx: torch.Tensor, normalized: bool = False,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy (nats) of the attention rows of every layer and head → ``[n_layers, n_heads]``.

    A query row attends over its ``n`` allowed keys (the unpadded ``j ≤ i`` in a causal model — read from the
    probabilities of the unpadded queries, exactly 0 above the diagonal there — or every unpadded key in a
    bidirectional one such as BERT), so its
    entropy lies in ``[0, log n]``; rows with one allowed key (entropy 0 by construction: a causal model's first row)
    and padded query rows are left out of the mean. ``normalized=True`` divides each row's entropy by ``log n`` first
    (1 = uniform attention, 0 = one key). Lower entropy is sparser attention.

    Args:
        model: a TransformerLM or a Hugging Face model with eager attention (:func:`attention_probabilities`).
        idx: token ids ``[B, T]`` with ``T ≥ 2``.
        normalized: divide by the row's maximal entropy.
        attention_mask: Hugging Face models only: ``[B, T]`` 1 for tokens, 0 for padding.

    Returns:
        float64 ``[n_layers, n_heads]``.

    Raises:
        As :func:`attention_probabilities`; ``ValueError`` for ``T < 2``.
    """
    normalized = check_bool("normalized", normalized)
    if not _is_hf(model):
        _check_model(model)
    if isinstance(idx, torch.Tensor) and idx.ndim == 2 and idx.shape[1] < 2:
        raise ValueError(f"idx must hold at least 2 positions (the first row attends to one key), got "
                         f"T={idx.shape[1]}")
    with torch.no_grad():
        probs = torch.stack(attention_probabilities(model, idx, attention_mask)).double()   # [L, B, H, T, T]
    L, B, H, T, _ = probs.shape
    keys = torch.ones(B, T, dtype=torch.bool, device=probs.device) if attention_mask is None \
        else attention_mask.to(device=probs.device, dtype=torch.bool)
    allowed = keys[:, None, :].expand(B, T, T)                                              # [B, query, key]
    upper = probs.triu(1).masked_fill(~keys[None, :, None, :, None], 0.0)   # padded queries attend anywhere
    if bool((upper == 0).all()):                                                            # causal
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=probs.device).tril()
    n_keys = allowed.sum(-1)                                                                # [B, T]
    rows = keys & (n_keys >= 2)                                                             # queries averaged
    ent = -(probs * torch.log(probs.clamp_min(1e-300))).sum(-1)                             # [L, B, H, T]
    if normalized:
        ent = ent / torch.log(n_keys.clamp_min(2).to(ent.dtype))[None, :, None, :]
    w = rows.to(ent.dtype)[None, :, None, :]
    return (ent * w).sum(dim=(1, 3)) / w.sum(dim=(1, 3))


@dataclass(frozen=True)
class LayerGradients:
    """Gradient norms of the LM loss by layer (index 0 = the layer next to the embeddings).

    ``block`` ``[L]``: all parameters of block ``l``; ``attention`` and ``feedforward`` ``[L]``: its attention
    (``qkv``, ``proj``) and feed-forward (``fc1``, ``fc2``) weights; ``stream`` ``[L]``: the gradient with respect
    to block ``l``'s input ``x_l`` (``[B, T, d]``, Frobenius); ``total``: all parameters (what global-norm
    clipping compares with its threshold)."""

    block: torch.Tensor
    attention: torch.Tensor
    feedforward: torch.Tensor
    stream: torch.Tensor
    total: float


def layer_gradient_norms(model: TransformerLM, blocks: torch.Tensor) -> LayerGradients:
    """Gradient norms by layer of the mean next-token NLL of ``blocks`` ``[B, T + 1]`` (inputs ``blocks[:, :-1]``,
    targets ``blocks[:, 1:]``), as measured at initialisation in Xiong et al. (ICML 2020). The model's
    ``.grad`` fields are left untouched (``torch.autograd.grad``); the block inputs are read by forward
    pre-hooks that are removed before returning.

    Args:
        model: a TransformerLM.
        blocks: token ids ``[B, T + 1]``, ``T ≥ 1``.
    """
    if _is_hf(model):
        raise TypeError(f"layer_gradient_norms reads the block layout of a taskloss.models.TransformerLM (attention "
                        f"qkv/proj, feed-forward fc1/fc2), got {type(model).__name__}; attention_probabilities and "
                        "attention_entropy read Hugging Face models")
    _check_model(model)
    check_token_ids("blocks", blocks, model.vocab_size)
    if blocks.shape[1] < 2:
        raise ValueError(f"blocks must hold at least 2 tokens per row ([B, T+1]), got shape {tuple(blocks.shape)}")
    inputs: list[torch.Tensor] = []
    handles = [b.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for b in model.blocks]
    try:
        loss = block_nll(model, blocks)
    finally:
        for h in handles:
            h.remove()
    if not torch.isfinite(loss):
        raise ValueError(f"the loss is not finite ({loss.item()}): the model's weights hold NaN or inf")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named] + inputs, allow_unused=True)
    pgrads = {n: g for (n, _), g in zip(named, grads[: len(named)]) if g is not None}

    def norm(prefixes) -> float:
        sq = [g.double().pow(2).sum() for n, g in pgrads.items() if n.startswith(prefixes)]
        return float(torch.stack(sq).sum().sqrt()) if sq else 0.0

    L = len(model.blocks)
    per = {key: torch.tensor([norm(tuple(f"blocks.{i}.{s}" for s in subs)) for i in range(L)], dtype=torch.float64)
           for key, subs in (("block", ("",)), ("attention", ("attn.",)), ("feedforward", ("fc1.", "fc2.")))}
    stream = torch.stack([g.double().norm() for g in grads[len(named):]]).cpu()
    return LayerGradients(per["block"], per["attention"], per["feedforward"], stream, norm(("",)))
