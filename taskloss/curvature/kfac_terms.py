"""K-FAC's loss terms: which outputs count, the output-space vectors back-propagated for ``G``, and the rows of each
layer that enter its factors — pure functions of the tensors that :class:`taskloss.curvature.kfac.KFAC` recorded.
Derived in notebook 07_fisher_approximations.

A loss term is one row of the outputs ``[N, ..., C]``. It counts unless its label equals ``ignore_index`` or it is
padding (the padding mask ``[N, T]`` of a per-token model). A term that does not count back-propagates a zero vector
(no Monte-Carlo label is drawn for it) and ``G`` is normalized by the terms that count. A layer whose input is laid
out like the terms or the padding (``[N, T, D]``) drops from both factors the rows at padded positions, and the rows
at positions without a loss term through which no gradient flows in that layer (the output layer there); a position
without a loss term that still carries gradient (a causal LM's prompt in the lower layers) stays, as it appears in
the gradient. ``masked_rows="keep"`` (curvlinops' convention) keeps the rows at positions without a loss term in
every layer; padding leaves the factors either way.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import Tensor

from taskloss.curvature.fisher import (
    check_outputs,
    check_targets,
    draw_categorical,
    nll_grad,
    output_hessian_sqrt,
    sample_targets,
)
from taskloss.curvature.model_io import HALF, loss_term_mask

__all__ = ["output_cotangents", "padding_mask", "loss_terms", "factor_rows"]


def output_cotangents(out: Tensor, targets: Tensor | None, valid: Tensor | None, fisher_type: str,
                      likelihood: str, n_samples: int, generator: torch.Generator | None) -> Tensor:
    """Per-term output-space vectors ``V [K, n_terms, C]`` whose back-propagation gives the ``g`` samples.

    Args:
        out: the checked outputs as rows ``[R, C]``.
        targets: their observed targets (rows), needed by ``"empirical"``.
        valid: the terms that count ``[R]`` (``None``: all); the others get zero vectors and no MC label.
        fisher_type: ``"mc"``, ``"empirical"`` or ``"exact"``.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        n_samples: MC labels per term.
        generator: their RNG.

    Returns:
        ``V`` (``K = 1``, ``C`` or ``n_samples``).

    Raises:
        ValueError: ``"empirical"`` without targets.
    """
    if valid is not None:
        rows = output_cotangents(out[valid], None if targets is None else targets[valid], None, fisher_type,
                                 likelihood, n_samples, generator)
        full = rows.new_zeros(rows.shape[0], out.shape[0], rows.shape[2])
        full[:, valid] = rows
        return full
    if fisher_type == "empirical":
        if targets is None:
            raise ValueError("fisher_type='empirical' needs the observed targets")
        return nll_grad(out, targets, likelihood).unsqueeze(0)
    if fisher_type == "exact":
        return output_hessian_sqrt(out, likelihood).permute(2, 0, 1)
    probs = None
    if likelihood == "categorical":  # one softmax for the draws and the gradients (outputs checked above)
        probs = out.softmax(-1)
        ys = draw_categorical(probs, n_samples, generator)
    else:
        ys = sample_targets(out, likelihood, n_samples, generator)
    if n_samples == 1:  # (dividing by √1 would only cost an allocation)
        return nll_grad(out, ys[0], likelihood, probs).unsqueeze(0)
    return torch.stack([nll_grad(out, y, likelihood, probs) for y in ys]) / math.sqrt(n_samples)


def padding_mask(mask, inputs, n: int) -> Tensor | None:
    """The padding mask ``[N, T]`` as bools (``None``: no padding): ``mask``, else ``inputs["attention_mask"]``.

    Args:
        mask: 1 / True for a real token, or None.
        inputs: the model's inputs (a mapping may hold ``"attention_mask"``).
        n: the batch size.

    Returns:
        The bool mask or None.

    Raises:
        TypeError: not a bool / integer tensor.
        ValueError: another batch size, values other than 0/1, nothing left.
    """
    if mask is None and isinstance(inputs, Mapping) and isinstance(inputs.get("attention_mask"), Tensor):
        mask = inputs["attention_mask"]
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.ndim < 1 or mask.shape[0] != n:
        raise ValueError(f"mask must be a padding mask [N, T] with N = {n}, got "
                         f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}")
    return loss_term_mask(mask, mask.shape, mask.device, "mask")


def loss_terms(outputs: Tensor, targets: Tensor | None, pad: Tensor | None, likelihood: str,
               ignore_index: int) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The outputs as rows, their targets and the terms that count.

    Args:
        outputs: ``[N, ..., C]`` (attached or not).
        targets: ``[N, ...]`` ids (categorical) or ``[N, ..., C]``, or None.
        pad: the padding mask, or None.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        ignore_index: the label of a term that does not count.

    Returns:
        ``(rows [R, C] detached, in float32 for float16 / bfloat16 outputs; target rows (labels of masked terms set
        to 0) or None; valid [R] or None when every term counts)``.

    Raises:
        TypeError: targets that are not a tensor.
        ValueError: bad shapes or values, no term left.
    """
    flat = outputs.detach().reshape(-1, outputs.shape[-1])
    if flat.dtype in HALF:   # the cotangents and factors of float16 / bfloat16 models are computed in float32
        flat = flat.float()
    check_outputs(flat, likelihood)  # value checks only when the factors are computed
    flat_targets, valid = None, None
    if targets is not None:
        if not isinstance(targets, Tensor):
            raise TypeError("targets must be a torch.Tensor")
        want = outputs.shape[:-1] if likelihood == "categorical" else outputs.shape
        if targets.shape != want:
            raise ValueError(f"targets must have shape {tuple(want)} for outputs of shape {tuple(outputs.shape)}, "
                             f"got {tuple(targets.shape)}")
        if likelihood == "categorical":
            flat_targets = targets.reshape(-1)
            labelled = flat_targets != ignore_index
            # one synchronization for both questions: is a label out of range, is any label ignore_index?
            bad, ignored = torch.stack([(((flat_targets < 0) | (flat_targets >= flat.shape[1])) & labelled).any(),
                                        (~labelled).any()]).tolist()
            if bad or targets.dtype not in (torch.int64, torch.int32):
                check_targets(outputs, targets, likelihood, ignore_index)   # raises with the message
            if ignored:
                valid, flat_targets = labelled, flat_targets.masked_fill(~labelled, 0)
        else:
            check_targets(outputs, targets, likelihood)
            flat_targets = targets.reshape(-1, outputs.shape[-1]).to(flat.dtype)
    if pad is not None and tuple(pad.shape) == tuple(outputs.shape[:-1]):
        valid = pad.reshape(-1) if valid is None else valid & pad.reshape(-1)
    if valid is not None and not bool(valid.any()):
        raise ValueError(f"no loss term is left: every label is ignore_index={ignore_index} or padded")
    return flat, flat_targets, valid


def factor_rows(a: Tensor, g: Tensor, terms: Tensor | None, pad: Tensor | None,
                masked_rows: str = "drop") -> Tensor | None:
    """The rows of a Linear / Conv1D layer that enter its factors (see the module docstring).

    Args:
        a: the layer's input ``[*L, D]``.
        g: its output gradients ``[K, *L, out]``.
        terms: the loss terms that count, shaped like the outputs' leading dimensions, or None.
        pad: the padding mask, or None.
        masked_rows: ``"drop"``: a row at a position without a loss term leaves both factors where no gradient flows
            through it in this layer; ``"keep"``: it stays (curvlinops' convention: every position the model
            computes is a row of ``A``, its zero output gradient adds nothing to ``G``). Padding leaves either way.

    Returns:
        A bool mask over the ``prod(L)`` rows, or None when every row enters.
    """
    lead, keep = tuple(a.shape[:-1]), None
    if pad is not None and tuple(pad.shape) == lead:
        keep = pad.reshape(-1)
    if masked_rows == "drop" and terms is not None and tuple(terms.shape) == lead:
        flows = (g != 0).any(-1).any(0)                                                 # [*L]
        t = terms.reshape(-1) | flows.reshape(-1)
        keep = t if keep is None else keep & t
    return None if keep is None or bool(keep.all()) else keep
