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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from taskloss.lm.completion import block_nll
from taskloss.models.transformer import TransformerLM
from taskloss.utils import check_bool, check_token_ids

__all__ = ["attention_probabilities", "attention_entropy", "LayerGradients", "layer_gradient_norms"]


def _check_model(model) -> TransformerLM:
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a taskloss.models.TransformerLM, got {type(model).__name__}")
    return model


def attention_probabilities(model: TransformerLM, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every layer's attention probabilities ``A_l = softmax(mask(S_l))``, a tuple of ``[B, H, T, T]`` (rows sum
    to 1 over keys ``j ≤ i``; entries ``j > i`` are 0). Dropout is not applied (the model is run as it is set,
    call ``model.eval()`` for deterministic maps).

    Args:
        model: a TransformerLM (any residual layout).
        idx: token ids ``[B, T]``.
    """
    _check_model(model)
    check_token_ids("idx", idx, model.vocab_size, model.max_len)
    _, scores = model(idx, return_scores=True)
    T = idx.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    return tuple(torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) for s in scores)


def attention_entropy(model: TransformerLM, idx: torch.Tensor, normalized: bool = False) -> torch.Tensor:
    """Mean entropy (nats) of the attention rows of every layer and head → ``[n_layers, n_heads]``.

    Row ``i`` attends over ``i + 1`` keys, so its entropy lies in ``[0, log(i + 1)]``; the first row (one key,
    entropy 0 by construction) is left out of the mean. ``normalized=True`` divides each row's entropy by
    ``log(i + 1)`` first (1 = uniform attention, 0 = one key). Lower entropy is sparser attention.

    Args:
        model: a TransformerLM.
        idx: token ids ``[B, T]`` with ``T ≥ 2``.
        normalized: divide by the row's maximal entropy.
    """
    normalized = check_bool("normalized", normalized)
    _check_model(model)
    check_token_ids("idx", idx, model.vocab_size, model.max_len)
    T = idx.shape[1]
    if T < 2:
        raise ValueError(f"idx must hold at least 2 positions (the first row attends to one key), got T={T}")
    with torch.no_grad():
        probs = torch.stack(attention_probabilities(model, idx)).double()              # [L, B, H, T, T]
    ent = -(probs * torch.log(probs.clamp_min(1e-300))).sum(-1)[..., 1:]               # [L, B, H, T-1]
    if normalized:
        ent = ent / torch.log(torch.arange(2, T + 1, dtype=ent.dtype, device=ent.device))
    return ent.mean(dim=(1, 3))


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
