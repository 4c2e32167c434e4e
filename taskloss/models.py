"""Shared models: a small causal Transformer LM (Post-LN, Pre-LN, RealFormer), an RNN/LSTM LM, an MLP and a
small CNN for the 8×8 digits, plus :func:`count_parameters`.

Batched decoding (:func:`generate`) and sequence log-probabilities (:func:`sequence_logprob`) live in
:mod:`taskloss.generation` and are re-exported here.

Used throughout the notebooks: MLP/SmallCNN by MGS (02–04), zeroth-order vs policy gradient (05) and the
natural-gradient notebooks (06–08); the language models by MGS on text, policy gradient and EMO (09).
The three residual layouts follow "Attention Is All You Need" (Post-LN), "On Layer Normalization in the
Transformer Architecture" (Pre-LN) and "RealFormer: Transformer Likes Residual Attention".
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .generation import _is_transformed, check_token_ids, generate, sequence_logprob
from .utils import check_int, check_probability

__all__ = ["TransformerLM", "RNNLM", "MLP", "SmallCNN", "generate", "sequence_logprob", "count_parameters"]

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
        if not explicit_scores and not _is_transformed(x):
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

    def forward(self, x: torch.Tensor, prev_scores: torch.Tensor | None = None):
        """``x`` [B, T, d] → (``x`` [B, T, d], scores [B, H, T, T] for RealFormer else None)."""
        if self.residual == "pre":
            x = x + self.drop(self.attn(self.ln1(x))[0])
            return x + self._ff(self.ln2(x)), None
        a, scores = self.attn(x, prev_scores, explicit_scores=self.residual == "realformer")
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
        super().__init__()
        for name, val in (("vocab_size", vocab_size), ("d_model", d_model), ("n_layers", n_layers),
                          ("n_heads", n_heads), ("max_len", max_len)):
            check_int(name, val, minimum=1)
        d_ff = 4 * d_model if d_ff is None else check_int("d_ff", d_ff, minimum=1)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if residual not in RESIDUAL_MODES:
            raise ValueError(f"residual must be one of {RESIDUAL_MODES}, got {residual!r}")
        check_probability("dropout", dropout)
        if dropout == 1.0:
            raise ValueError("dropout must be < 1")
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

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[B, T, d]`` (after the final LayerNorm for Pre-LN) that feed the output layer."""
        if self.validate_inputs:
            check_token_ids("idx", idx, self.vocab_size, self.max_len)
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        scores = None
        for block in self.blocks:
            x, scores = block(x, scores)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, return_hidden: bool = False):
        """``idx`` LongTensor ``[B, T]`` (``T ≤ max_len``) → logits ``[B, T, V]`` (or ``(logits, hidden)``)."""
        h = self.hidden_states(idx)
        logits = self.head(h)
        return (logits, h) if return_hidden else logits


class RNNLM(nn.Module):
    """Recurrent language model: embedding → ``nn.LSTM`` or ``nn.RNN`` (tanh), batch-first → linear output.

    ``forward(idx [B, T], state=None, return_state=False)`` → logits ``[B, T, V]`` (and the final state:
    ``(h, c)`` each ``[n_layers, B, hidden]`` for LSTM, ``h`` for RNN). With ``tie_weights`` the output layer
    shares the token embedding; when ``hidden != d_model`` a bias-free projection ``hidden → d_model`` is
    inserted first. ``output_embedding`` is the output weight ``[V, d_out]``.
    """

    is_recurrent = True

    def __init__(self, vocab_size: int, d_model: int = 128, hidden: int = 256, n_layers: int = 1,
                 cell: str = "lstm", tie_weights: bool = False, dropout: float = 0.0):
        super().__init__()
        for name, val in (("vocab_size", vocab_size), ("d_model", d_model), ("hidden", hidden),
                          ("n_layers", n_layers)):
            check_int(name, val, minimum=1)
        if cell not in ("lstm", "rnn"):
            raise ValueError(f"cell must be 'lstm' or 'rnn', got {cell!r}")
        check_probability("dropout", dropout)
        if dropout == 1.0:
            raise ValueError("dropout must be < 1")
        self.vocab_size, self.d_model, self.hidden, self.n_layers = vocab_size, d_model, hidden, n_layers
        self.cell, self.tie_weights, self.max_len = cell, bool(tie_weights), None
        self.validate_inputs = True
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        rnn_cls = nn.LSTM if cell == "lstm" else nn.RNN
        kw = {} if cell == "lstm" else {"nonlinearity": "tanh"}
        self.rnn = rnn_cls(d_model, hidden, num_layers=n_layers, batch_first=True,
                           dropout=dropout if n_layers > 1 else 0.0, **kw)
        self.drop = nn.Dropout(dropout)
        d_out = hidden
        self.out_proj = None
        if self.tie_weights and hidden != d_model:
            self.out_proj = nn.Linear(hidden, d_model, bias=False)
            d_out = d_model
        self.head = nn.Linear(d_out, vocab_size, bias=not self.tie_weights)
        nn.init.normal_(self.tok_emb.weight, std=0.1)
        if self.tie_weights:
            self.head.weight = self.tok_emb.weight

    @property
    def output_embedding(self) -> torch.Tensor:
        """Weight ``[V, d_out]`` of the output layer."""
        return self.head.weight

    def hidden_states(self, idx: torch.Tensor, state=None) -> torch.Tensor:
        """Hidden states ``[B, T, d_out]`` that feed the output layer (``logits = h @ output_embedding.T (+ b)``)."""
        return self.forward(idx, state, return_hidden=True)[1]

    def forward(self, idx: torch.Tensor, state=None, return_state: bool = False, return_hidden: bool = False):
        """``idx`` ``[B, T]`` → logits ``[B, T, V]``; extra outputs in the order (logits, hidden, state)."""
        if self.validate_inputs:
            check_token_ids("idx", idx, self.vocab_size)
        out, state = self.rnn(self.drop(self.tok_emb(idx)), state)
        h = self.drop(out)
        if self.out_proj is not None:
            h = self.out_proj(h)
        logits = self.head(h)
        extra = ((h,) if return_hidden else ()) + ((state,) if return_state else ())
        return (logits, *extra) if extra else logits


_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class MLP(nn.Sequential):
    """Multi-layer perceptron ``[n, in_dim] → [n, out_dim]`` as an ``nn.Sequential`` of ``nn.Linear`` layers
    with ``activation`` between them (no activation after the last layer). ``hidden`` is an int or a
    sequence of widths (``()`` gives a linear model). PyTorch's default Linear initialisation."""

    def __init__(self, in_dim: int, hidden: int | Sequence[int] = (64,), out_dim: int | None = None,
                 activation: str = "relu", bias: bool = True):
        check_int("in_dim", in_dim, minimum=1)
        if out_dim is None:
            raise TypeError("MLP needs out_dim")
        check_int("out_dim", out_dim, minimum=1)
        hidden = (hidden,) if isinstance(hidden, int) and not isinstance(hidden, bool) else tuple(hidden)
        for i, h in enumerate(hidden):
            check_int(f"hidden[{i}]", h, minimum=1)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        dims = (in_dim, *hidden, out_dim)
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b, bias=bias))
            if i < len(dims) - 2:
                layers.append(_ACTIVATIONS[activation]())
        super().__init__(*layers)
        self.in_dim, self.out_dim, self.hidden, self.activation = in_dim, out_dim, hidden, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.ndim < 1 or x.shape[-1] != self.in_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MLP expects input [..., {self.in_dim}], got {shape}")
        return super().forward(x)


class SmallCNN(nn.Module):
    """Small CNN for 8×8 digit images: Conv3×3(in→w) → ReLU → Conv3×3(w→2w) → ReLU → MaxPool2 → Linear.

    Input ``[n, in_channels, 8, 8]`` (or flat ``[n, in_channels·64]``) → logits ``[n, n_classes]``.
    Only ``nn.Conv2d`` and ``nn.Linear`` carry parameters (what K-FAC hooks look for)."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, width: int = 16):
        super().__init__()
        check_int("in_channels", in_channels, minimum=1)
        check_int("n_classes", n_classes, minimum=2)
        check_int("width", width, minimum=1)
        self.in_channels, self.n_classes, self.width = in_channels, n_classes, width
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * width * 4 * 4, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"SmallCNN expects a tensor, got {type(x).__name__}")
        if x.ndim == 2 and x.shape[1] == self.in_channels * 64:
            x = x.reshape(-1, self.in_channels, 8, 8)
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_channels, 8, 8):
            raise ValueError(f"SmallCNN expects [n, {self.in_channels}, 8, 8] (or [n, {self.in_channels * 64}]),"
                             f" got {tuple(x.shape)}")
        x = self.pool(F.relu(self.conv2(F.relu(self.conv1(x)))))
        return self.fc(x.flatten(1))


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``model`` (tied weights counted once)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
