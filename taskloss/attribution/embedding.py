"""Integrated gradients of a token model in its embedding space.

Derived in notebook 15_integrated_gradients. Token ids are discrete, so the path from a baseline to the input runs
through the *output of the embedding layer*: with e = E[x] ∈ ℝ^{T×d} the input's token embeddings and e′ the
baseline's (zeros, the embeddings of a baseline token such as ``[PAD]``, or any tensor),

    IG_{t,j} = (e_{t,j} − e′_{t,j}) Σ_k w_k ∂F/∂e_{t,j}(e′ + α_k(e − e′)),    IG_t = Σ_j IG_{t,j},

one score per token (the sum over the embedding dimension), and completeness Σ_t IG_t = F(e) − F(e′) holds in
embedding space. The model runs unchanged: a forward hook on the embedding module replaces its output by the
path points while ``forward_fn(input_ids)`` executes — what Captum's ``LayerIntegratedGradients`` does on an
embedding layer (``captum/attr/_core/layer/layer_integrated_gradients.py``, captum 0.9.0), here through the shared
chunked core :func:`taskloss.attribution.integrated_gradients.integrate_gradients`. Positional embeddings added
after the hooked layer are part of the model, not of the path.

Works with :class:`taskloss.models.TransformerLM` (hook ``model.tok_emb``), the pretrained small LM of
:func:`taskloss.lm.load_pretrained_lm`, and Hugging Face models (their input-embedding module).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from taskloss.attribution.integrated_gradients import (
    Attribution,
    _attribute_pairs,
    _check_batch_size,
    _check_forward,
    _check_target,
    _expand_args,
    _format_args,
    _format_baselines,
    select_target,
)
from taskloss.validation import check_bool, check_int

__all__ = ["EmbeddingIntegratedGradients"]


class EmbeddingIntegratedGradients:
    """Integrated gradients along a straight path in the output space of ``embedding`` (one score per token).

    Args:
        forward_fn: ``forward_fn(input_ids [n, T], *additional_forward_args) → output [n, ...]`` that calls
            ``embedding`` exactly once (e.g. ``lambda ids: model(ids)[:, -1]`` for next-token logits).
        embedding: the module whose output is interpolated (e.g. ``model.tok_emb``); its output for ``[n, T]`` ids
            must be ``[n, T, d]``.
    """

    def __init__(self, forward_fn: Callable[..., Tensor], embedding: nn.Module):
        if not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable, got {type(forward_fn).__name__}")
        if not isinstance(embedding, nn.Module):
            raise TypeError(f"embedding must be an nn.Module, got {type(embedding).__name__}")
        self.forward_fn, self.embedding = forward_fn, embedding

    def _embed(self, ids: Tensor) -> Tensor:
        with torch.no_grad():
            return self.embedding(ids)

    def _baseline_embeddings(self, baselines, ids: Tensor, emb: Tensor) -> Tensor:
        if isinstance(baselines, int) and not isinstance(baselines, bool):
            check_int("baselines (token id)", baselines, minimum=0)
            return self._embed(torch.full_like(ids, baselines)).unsqueeze(0)
        if isinstance(baselines, Tensor) and not baselines.is_floating_point():
            if baselines.dtype == torch.bool:
                raise TypeError("baselines must be token ids (integer) or embeddings (floating), got dtype bool")
            if baselines.ndim != 2 or baselines.shape[1] != ids.shape[1] or baselines.shape[0] not in (1, ids.shape[0]):
                raise ValueError(f"baseline token ids must have shape [{ids.shape[0]} or 1, {ids.shape[1]}], got "
                                 f"{tuple(baselines.shape)}")
            return self._embed(baselines.to(ids.device).expand_as(ids)).unsqueeze(0)
        return _format_baselines(baselines, emb)

    def attribute(self, input_ids: Tensor, baselines: Tensor | int | None = None, target: Any = None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size: int | None = None,
                  additional_forward_args: Any = None, sum_embedding: bool = True) -> Attribution:
        """Attribute ``F(e) − F(e′)`` to the tokens of each sequence.

        Args:
            input_ids: ``[B, T]`` integer token ids.
            baselines: e′ — ``None`` (zero embeddings), an int token id (its embedding at every position), baseline
                token ids ``[B or 1, T]``, baseline embeddings ``[B or 1, T, d]``, or a set ``[K, B or 1, T, d]``
                (expected gradients).
            target: as in :meth:`taskloss.attribution.IntegratedGradients.attribute`.
            n_steps: number of quadrature nodes.
            method: quadrature rule, one of :data:`taskloss.attribution.quadrature.METHODS`.
            internal_batch_size: at most this many sequences (path points) per forward/backward pass, whatever
                ``n_steps``: the activation memory is one pass of this many sequences, and a value below B splits
                a step's sequences (Captum's chunks hold whole steps, at least B rows). For a long context, let
                ``forward_fn`` compute only the logits it reads (e.g. ``logits_to_keep=1`` in Hugging Face models).
            additional_forward_args: extra arguments of ``forward_fn``; tensors with ``B`` rows follow their example.
            sum_embedding: sum the attributions over the embedding dimension (``[B, T]``); else ``[B, T, d]``.

        Returns:
            :class:`~taskloss.attribution.integrated_gradients.Attribution`.

        Raises:
            TypeError / ValueError: non-integer or empty ids, bad baselines, targets or ``n_steps``, a forward that
                does not call ``embedding`` exactly once, NaN/inf outputs.
        """
        sum_embedding = check_bool("sum_embedding", sum_embedding)
        _check_forward(self.forward_fn)
        if not isinstance(input_ids, Tensor) or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
            raise TypeError("input_ids must be an integer tensor of token ids [B, T]")
        if input_ids.ndim != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must have shape [B, T] with B, T ≥ 1, got {tuple(input_ids.shape)}")
        if isinstance(self.embedding, nn.Embedding):
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= self.embedding.num_embeddings:
                raise ValueError(f"input_ids hold token ids in [{lo}, {hi}], outside [0, "
                                 f"{self.embedding.num_embeddings})")
        emb = self._embed(input_ids)
        if not isinstance(emb, Tensor) or emb.ndim != 3 or emb.shape[:2] != input_ids.shape:
            raise ValueError(f"embedding must map ids [B, T] to [B, T, d], got {tuple(getattr(emb, 'shape', ()))}")
        bases = self._baseline_embeddings(baselines, input_ids, emb)
        bs = _check_batch_size(internal_batch_size)
        B = input_ids.shape[0]
        tgt = _check_target(target, B, input_ids.device)
        args = _format_args(additional_forward_args)

        def scalar_fn(points: Tensor, pair_index: Tensor) -> Tensor:
            example = pair_index % B
            calls = []

            def replace(module, inputs, output):
                calls.append(tuple(output.shape))
                if len(calls) > 1:
                    raise ValueError("forward_fn called the embedding module more than once per forward pass")
                if output.shape != points.shape:
                    raise ValueError(f"embedding output {tuple(output.shape)} does not match the path points "
                                     f"{tuple(points.shape)}")
                return points

            handle = self.embedding.register_forward_hook(replace)
            try:
                out = self.forward_fn(input_ids[example], *_expand_args(args, example, B))
            finally:
                handle.remove()
            if not calls:
                raise ValueError("forward_fn did not call the embedding module; pass the module it embeds tokens with")
            return select_target(out, tgt, example)

        attr, error, diff = _attribute_pairs(scalar_fn, emb, bases, n_steps, method, bs,
                                             "EmbeddingIntegratedGradients.attribute")
        return Attribution((attr.sum(-1) if sum_embedding else attr).to(emb.dtype), error, diff)
