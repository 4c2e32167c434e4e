"""One LM-training harness for architecture comparisons: same data, budget and optimizer for every model, with
divergence detected and the gradient norm of every step recorded.

``train_lm`` trains any causal LM ``idx [B, T] → logits [B, T, V]`` (a Transformer LM of any residual layout, a
recurrent LM) on ``[N, T + 1]`` blocks with AdamW, an optional linear warm-up and optional global-norm
clipping, and evaluates the mean next-token NLL on held-out blocks. A run *diverges* when a training loss turns
non-finite (training stops there) or when its final validation NLL is above the NLL it started from (training
made it worse); ``divergence_ppl`` optionally adds a perplexity ceiling. Runs that merely stall (for instance at the
unigram perplexity, ``taskloss.datasets.unigram_perplexity``) are not called diverged: the notebooks report them
separately. The step's gradient norm before clipping is recorded, so the scales a clipping threshold would cut
can be read off.

``xavier_init_`` re-initialises a Transformer LM as in the analysis of Xiong et al., *On Layer Normalization in
the Transformer Architecture* (ICML 2020): Xavier-uniform matrices and unit-variance embeddings, where the
residual stream has unit scale (the repository's default GPT-2 initialisation keeps it at 0.02).
Used by 13_recurrent_gradients (training the recurrent LMs) and 14_realformer (the Post-LN / Pre-LN / RealFormer
comparison).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from taskloss.lm.completion import block_nll
from taskloss.models.transformer import TransformerLM
from taskloss.validation import (
    check_generator,
    check_int,
    check_nonnegative,
    check_positive,
    check_token_ids,
    eval_mode,
)

__all__ = ["TrainResult", "train_lm", "evaluate_nll", "xavier_init_"]


@dataclass
class TrainResult:
    """Outcome of :func:`train_lm`: ``initial_nll`` and ``valid_nll`` (nats/token before and after training;
    ``valid_nll`` is ``inf`` after a non-finite training loss), ``diverged``, per-step ``train_loss`` and
    ``grad_norm`` (global norm before clipping), ``steps_run``."""

    initial_nll: float
    valid_nll: float
    diverged: bool
    steps_run: int
    train_loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)

    @property
    def valid_ppl(self) -> float:
        """``exp(valid_nll)`` (``inf`` for a run whose loss became non-finite)."""
        return math.exp(self.valid_nll) if math.isfinite(self.valid_nll) and self.valid_nll < 700 else math.inf


def _check_blocks(name: str, blocks, vocab_size: int | None) -> torch.Tensor:
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"{name} must be a LongTensor [N, T+1], got {type(blocks).__name__}")
    if blocks.ndim != 2 or blocks.shape[1] < 2:
        raise ValueError(f"{name} must have shape [N, T+1] with T ≥ 1, got {tuple(blocks.shape)}")
    check_token_ids(name, blocks, vocab_size if vocab_size is not None else int(blocks.max()) + 1)
    return blocks


@torch.no_grad()
def evaluate_nll(model: nn.Module, blocks: torch.Tensor, batch_size: int = 64) -> float:
    """Mean next-token NLL (nats/token) of ``blocks`` ``[N, T + 1]`` in eval mode, in chunks of ``batch_size``;
    the model's train/eval mode is restored afterwards."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    _check_blocks("blocks", blocks, getattr(model, "vocab_size", None))
    check_int("batch_size", batch_size, minimum=1)
    dev = next(model.parameters()).device
    total = 0.0
    with eval_mode(model):
        for i in range(0, len(blocks), batch_size):
            b = blocks[i:i + batch_size].to(dev)
            total += float(block_nll(model, b).double()) * len(b)
    return total / len(blocks)


def train_lm(model: nn.Module, train_blocks: torch.Tensor, valid_blocks: torch.Tensor, *, steps: int, lr: float,
             batch_size: int = 16, warmup_steps: int = 0, clip: float | None = None, weight_decay: float = 0.0,
             betas: tuple[float, float] = (0.9, 0.98), seed: int = 0, divergence_ppl: float | None = None,
             eval_batch_size: int = 64, progress=None) -> TrainResult:
    """Train ``model`` in place on random batches of ``train_blocks`` with AdamW and report the held-out NLL.

    Args:
        model: a causal LM (``idx [B, T] → logits [B, T, V]``), on the device to train on.
        train_blocks: token blocks ``[N, T + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``).
        valid_blocks: held-out blocks of the same form.
        steps: optimizer steps (≥ 1).
        lr: peak learning rate (> 0).
        batch_size: rows per batch, drawn with replacement in an order seeded by ``seed``.
        warmup_steps: with ``warmup_steps > 0`` the learning rate rises linearly from ``lr/warmup_steps``.
        clip: global gradient-norm threshold (``None``: no clipping, so divergence is visible).
        weight_decay: AdamW's.
        betas: AdamW's (β₂ = 0.98 as in the Transformer papers).
        seed: seeds the batch order (the model's initialisation is the caller's).
        divergence_ppl: a final validation perplexity above this also counts as diverged (``None``: only
            non-finite losses and ending above the initial validation NLL count).
        eval_batch_size: rows per forward of the held-out evaluation.
        progress: optional callable ``progress(step)`` (e.g. a tqdm bar's ``update``).

    Returns:
        :class:`TrainResult`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    vocab = getattr(model, "vocab_size", None)
    _check_blocks("train_blocks", train_blocks, vocab)
    _check_blocks("valid_blocks", valid_blocks, vocab)
    check_int("steps", steps, minimum=1)
    lr = check_positive("lr", lr)
    check_int("batch_size", batch_size, minimum=1)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("seed", seed, minimum=0)
    if clip is not None:
        clip = check_positive("clip", clip)
    check_nonnegative("weight_decay", weight_decay)
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
    if divergence_ppl is not None:
        divergence_ppl = check_positive("divergence_ppl", divergence_ppl)
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup_steps) if warmup_steps else 1.0)
    gen = torch.Generator().manual_seed(seed)
    result = TrainResult(initial_nll=evaluate_nll(model, valid_blocks, eval_batch_size), valid_nll=math.inf,
                         diverged=False, steps_run=0)
    model.train()
    for step in range(steps):
        b = train_blocks[torch.randint(len(train_blocks), (batch_size,), generator=gen)].to(dev)
        loss = block_nll(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip is not None else math.inf)
        result.train_loss.append(float(loss.detach()))
        result.grad_norm.append(float(norm))
        result.steps_run = step + 1
        if progress is not None:
            progress(1)
        if not (math.isfinite(result.train_loss[-1]) and math.isfinite(result.grad_norm[-1])):
            result.diverged = True
            return result
        opt.step()
        sched.step()
    result.valid_nll = evaluate_nll(model, valid_blocks, eval_batch_size)
    result.diverged = (not math.isfinite(result.valid_nll) or result.valid_nll > result.initial_nll
                       or (divergence_ppl is not None and result.valid_ppl > divergence_ppl))
    return result


@torch.no_grad()
def xavier_init_(model: TransformerLM, generator: torch.Generator | None = None) -> TransformerLM:
    """Re-initialise a Transformer LM in place as in Xiong et al. (ICML 2020): Xavier-uniform weights for every
    linear layer of the blocks, zero biases, unit LayerNorms, token and position embeddings ``N(0, 1)`` (a
    residual stream of unit scale, as fairseq's √d-scaled embeddings give) and an untied output layer
    ``N(0, 1/d)``. Requires ``tie_weights=False`` (a tied ``N(0, 1)`` output layer would start with logits of
    scale ``√d``). Returns the model."""
    if not isinstance(model, TransformerLM):
        raise TypeError(f"model must be a taskloss.models.TransformerLM, got {type(model).__name__}")
    if model.tie_weights:
        raise ValueError("xavier_init_ needs an untied output layer: build the model with tie_weights=False")
    check_generator("generator", generator)
    on = generator.device if generator is not None else torch.device("cpu")    # draws where the generator lives

    def uniform_(p, bound):
        p.copy_((torch.rand(p.shape, generator=generator, dtype=p.dtype, device=on) * 2 - 1).mul_(bound).to(p.device))

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name != "head":
            fan_out = m.out_features // 3 if name.endswith("qkv") else m.out_features   # Q, K, V: three d × d maps
            uniform_(m.weight, math.sqrt(6.0 / (m.in_features + fan_out)))
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()
    for emb, std in ((model.tok_emb.weight, 1.0), (model.pos_emb.weight, 1.0),
                     (model.head.weight, model.d_model ** -0.5)):
        emb.copy_(torch.randn(emb.shape, generator=generator, dtype=emb.dtype, device=on).mul_(std).to(emb.device))
    return model
