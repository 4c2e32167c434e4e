"""A small causal Transformer LM with three residual layouts: Post-LN, Pre-LN and RealFormer.

The layouts follow Vaswani et al., *Attention Is All You Need* (NeurIPS 2017; Post-LN), Xiong et al., *On Layer
Normalization in the Transformer Architecture* (ICML 2020; Pre-LN) and He et al., *RealFormer: Transformer Likes
Residual Attention* (Findings of ACL 2021; each layer's raw attention scores added to the next layer's).
Used by MGS on text (04), policy gradient and EMO (09); decoding lives in :mod:`taskloss.lm.generation`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from taskloss.validation import (
    check_allocation,
    check_bool,
    check_int,
    check_probability,
    check_token_ids,
    is_transformed,
)

__all__ = ["TransformerLM", "RESIDUAL_MODES"]

RESIDUAL_MODES = ("pre", "post", "realformer")


def _gpt2_init(module: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """GPT-2 initialisation: N(0, 0.02) for Linear/Embedding weights, zero biases, unit LayerNorms, and the
    projections that write into the residual stream (``proj``, ``fc2``) scaled by 1/sqrt(2·n_layers)."""
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            s = std / math.sqrt(2 * n_layers) if name.endswith(("proj", "fc2")) else std
            nn.init.normal_(m.weight, mean=0.0, std=s)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused ``qkv`` projection (same layout as
    ``nn.MultiheadAttention.in_proj_weight``). ``explicit_scores=True`` materialises the pre-softmax scores
    ``S = QKᵀ/√d_head (+ S_prev)`` and returns them (RealFormer); otherwise the fused
    ``F.scaled_dot_product_attention`` kernel is used (except inside torch.func transforms, where the explicit
    path is used: it vectorises, while the fused CPU kernel has no batching rule)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads, self.d_head, self.dropout = n_heads, d_model // n_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, prev_scores: torch.Tensor | None = None, explicit_scores: bool = False):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # [B,H,T,dh]
        p = self.dropout if self.training else 0.0
        if not explicit_scores and not is_transformed(x):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            scores = None
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # [B,H,T,T], raw (unmasked)
            if prev_scores is not None:
                scores = scores + prev_scores
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            y = F.dropout(att, p, self.training) @ v
        y = self.proj(y.transpose(1, 2).reshape(B, T, D))
        return y, scores


class Block(nn.Module):
    """One Transformer layer; ``residual`` selects the layout (see :class:`TransformerLM`).
    Parameter names mirror ``nn.TransformerEncoderLayer`` (qkv ↔ in_proj, proj ↔ out_proj, fc1 ↔ linear1,
    fc2 ↔ linear2, ln1 ↔ norm1, ln2 ↔ norm2; GELU activation)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, residual: str):
        super().__init__()
        self.residual = residual
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))

    def forward(self, x: torch.Tensor, prev_scores: torch.Tensor | None = None, need_scores: bool = False):
        """``x`` [B, T, d] → (``x`` [B, T, d], scores [B, H, T, T] or None).

        The scores are this layer's pre-softmax attention scores (unmasked): RealFormer always returns them
        (``S_l = Q_l K_lᵀ/√d_head + S_{l-1}``, the ``prev_scores`` it was given added); Pre-/Post-LN return
        ``Q_l K_lᵀ/√d_head`` only when ``need_scores`` (then the explicit attention path is used) and ignore
        ``prev_scores``."""
        if self.residual == "pre":
            a, scores = self.attn(self.ln1(x), explicit_scores=need_scores)
            x = x + self.drop(a)
            return x + self._ff(self.ln2(x)), scores
        real = self.residual == "realformer"
        a, scores = self.attn(x, prev_scores if real else None, explicit_scores=real or need_scores)
        x = self.ln1(x + self.drop(a))
        return self.ln2(x + self._ff(x)), scores


class TransformerLM(nn.Module):
    """Small decoder-only causal language model with learned positional embeddings.

    ``forward(idx [B, T]) → logits [B, T, V]``; ``forward(idx, return_hidden=True) → (logits, hidden [B, T, d])``
    where ``logits = hidden @ output_embedding.T`` exactly. :meth:`hidden_states` returns only the hidden
    states (for chunked losses that never materialise ``[B, T, V]``).

    ``residual``:
      - ``"post"`` — original Transformer: ``x = LN(x + sublayer(x))``, no final LayerNorm;
      - ``"pre"``  — ``x = x + sublayer(LN(x))`` with a final LayerNorm;
      - ``"realformer"`` — Post-LN layout whose pre-softmax attention scores are carried per head from layer
        to layer: ``S_l = Q_l K_lᵀ/√d_head + S_{l-1}`` (``S_0 = 0``), ``A_l = softmax(mask(S_l))``.

    Pre/Post use the fused ``F.scaled_dot_product_attention`` kernel; RealFormer materialises the scores.
    Weights follow the GPT-2 initialisation; with ``tie_weights`` the output layer shares the token embedding.
    Set ``model.validate_inputs = False`` to skip the token-range check (it synchronises on GPU).
    """

    def __init__(self, vocab_size: int, d_model: int = 128, n_layers: int = 2, n_heads: int = 4,
                 d_ff: int | None = None, max_len: int = 256, dropout: float = 0.0, residual: str = "pre",
                 tie_weights: bool = True):
        tie_weights = check_bool("tie_weights", tie_weights)
        super().__init__()
        vocab_size, d_model, n_layers, n_heads, max_len = (     # numpy integers become Python ints for torch
            check_int(name, val, minimum=1) for name, val in (
                ("vocab_size", vocab_size), ("d_model", d_model), ("n_layers", n_layers), ("n_heads", n_heads),
                ("max_len", max_len)))
        d_ff = 4 * d_model if d_ff is None else check_int("d_ff", d_ff, minimum=1)
        n_weights = (vocab_size + max_len) * d_model + n_layers * (4 * d_model * d_model + 2 * d_model * d_ff)
        check_allocation(f"TransformerLM(vocab_size={vocab_size}, d_model={d_model}, n_layers={n_layers}, "
                         f"d_ff={d_ff}, max_len={max_len})", 4.0 * n_weights)     # float32 weights, before any
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if residual not in RESIDUAL_MODES:
            raise ValueError(f"residual must be one of {RESIDUAL_MODES}, got {residual!r}")
        check_probability("dropout", dropout)
        if dropout == 1.0:
            raise ValueError("dropout must be < 1")
        if not isinstance(tie_weights, bool):
            raise TypeError(f"tie_weights must be a bool, got {type(tie_weights).__name__}")
        self.vocab_size, self.d_model, self.n_layers, self.n_heads = vocab_size, d_model, n_layers, n_heads
        self.d_ff, self.max_len, self.residual, self.tie_weights = d_ff, max_len, residual, bool(tie_weights)
        self.validate_inputs = True
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, dropout, residual) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model) if residual == "pre" else nn.Identity()
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        _gpt2_init(self, n_layers)
        if self.tie_weights:
            self.head.weight = self.tok_emb.weight

    @property
    def output_embedding(self) -> torch.Tensor:
        """Weight ``[V, d]`` of the output layer (the token embedding when tied)."""
        return self.head.weight

    def hidden_states(self, idx: torch.Tensor, return_scores: bool = False):
        """Final hidden states ``[B, T, d]`` (after the final LayerNorm for Pre-LN) that feed the output layer.

        With ``return_scores`` also every layer's pre-softmax attention scores, a tuple of ``n_layers`` tensors
        ``[B, H, T, T]`` (unmasked; the attention is ``softmax`` over keys ``j ≤ i``). For RealFormer these are
        the carried sums ``S_l``; for Pre-/Post-LN each layer's own ``QKᵀ/√d_head``, computed on the explicit
        attention path (the same maths as the fused kernel, rounded differently)."""
        return_scores = check_bool("return_scores", return_scores)
        if self.validate_inputs:
            check_token_ids("idx", idx, self.vocab_size, self.max_len)
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        carried, all_scores = None, []
        for block in self.blocks:
            x, scores = block(x, carried, need_scores=return_scores)
            carried = scores if self.residual == "realformer" else None
            all_scores.append(scores)
        return (self.ln_f(x), tuple(all_scores)) if return_scores else self.ln_f(x)

    def forward(self, idx: torch.Tensor, return_hidden: bool = False, return_scores: bool = False):
        """``idx`` LongTensor ``[B, T]`` (``T ≤ max_len``) → logits ``[B, T, V]``; extra outputs in the order
        (logits, hidden ``[B, T, d]``, scores: a tuple of ``[B, H, T, T]`` per layer, see :meth:`hidden_states`)."""
        return_hidden = check_bool("return_hidden", return_hidden)
        return_scores = check_bool("return_scores", return_scores)
        out = self.hidden_states(idx, return_scores=return_scores)
        h, scores = out if return_scores else (out, None)
        logits = self.head(h)
        extra = ((h,) if return_hidden else ()) + ((scores,) if return_scores else ())
        return (logits, *extra) if extra else logits


