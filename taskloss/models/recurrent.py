"""A recurrent language model (``nn.LSTM`` or tanh ``nn.RNN``) with optional weight tying.

Used by the decoding and sequence-loss code (:mod:`taskloss.lm`) wherever a Transformer LM is, and by the
gradient-flow notebooks on recurrent networks.
"""
from __future__ import annotations

import torch
from torch import nn

from taskloss.validation import (
    check_allocation,
    check_bool,
    check_finite,
    check_int,
    check_probability,
    check_token_ids,
    is_transformed,
)

__all__ = ["RNNLM"]


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
        tie_weights = check_bool("tie_weights", tie_weights)
        super().__init__()
        vocab_size, d_model, hidden, n_layers = (     # numpy integers become Python ints for torch's layers
            check_int(name, val, minimum=1) for name, val in (
                ("vocab_size", vocab_size), ("d_model", d_model), ("hidden", hidden), ("n_layers", n_layers)))
        gates = 4 if cell == "lstm" else 1
        n_weights = 2 * vocab_size * max(d_model, hidden) + n_layers * gates * hidden * (max(d_model, hidden) + hidden)
        check_allocation(f"RNNLM(vocab_size={vocab_size}, d_model={d_model}, hidden={hidden}, n_layers={n_layers})",
                         4.0 * n_weights)                                   # float32 weights, before any
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

    def _check_state(self, state, batch: int) -> None:
        """``state`` as returned by ``forward(..., return_state=True)``: ``(h, c)`` (LSTM) or ``h`` (RNN), each
        ``[n_layers, B, hidden]``, floating, finite."""
        parts = state if self.cell == "lstm" else (state,)
        if self.cell == "lstm" and (not isinstance(state, (tuple, list)) or len(state) != 2):
            raise TypeError("state of an LSTM must be a tuple (h, c) of tensors [n_layers, B, hidden]")
        want = (self.n_layers, batch, self.hidden)
        for name, t in zip(("h", "c"), parts):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"state {name} must be a floating tensor [n_layers, B, hidden], got "
                                f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}")
            if tuple(t.shape) != want:
                raise ValueError(f"state {name} must have shape {want}, got {tuple(t.shape)}")
            if self.validate_inputs and not is_transformed(t):
                check_finite(f"state {name}", t)

    def hidden_states(self, idx: torch.Tensor, state=None) -> torch.Tensor:
        """Hidden states ``[B, T, d_out]`` that feed the output layer (``logits = h @ output_embedding.T (+ b)``)."""
        return self.forward(idx, state, return_hidden=True)[1]

    def forward(self, idx: torch.Tensor, state=None, return_state: bool = False, return_hidden: bool = False):
        """``idx`` ``[B, T]`` → logits ``[B, T, V]``; extra outputs in the order (logits, hidden, state)."""
        return_state = check_bool("return_state", return_state)
        return_hidden = check_bool("return_hidden", return_hidden)
        if self.validate_inputs:
            check_token_ids("idx", idx, self.vocab_size)
        if state is not None:
            self._check_state(state, idx.shape[0])
        out, state = self.rnn(self.drop(self.tok_emb(idx)), state)
        h = self.drop(out)
        if self.out_proj is not None:
            h = self.out_proj(h)
        logits = self.head(h)
        extra = ((h,) if return_hidden else ()) + ((state,) if return_state else ())
        return (logits, *extra) if extra else logits
