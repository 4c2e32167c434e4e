"""Which modules K-FAC preconditions, which it leaves alone and why, and what fraction of a model that covers.

:func:`find_layers` walks a model once for :class:`taskloss.curvature.kfac.KFAC` and returns its layers
(:class:`~taskloss.curvature.kfac_factors.KFACLayer`) together with a :class:`KFACCoverage` report. Derived in notebook
07_fisher_approximations.

The rules, in order, for every module that owns trainable parameters:

1. ``nn.Linear``, ``nn.Conv2d`` (``groups=1``, zero padding given as numbers) and ``transformers``' ``Conv1D`` (GPT-2's
   attention and MLP projections, ``y = x W + b`` with ``W`` stored ``[in, out]``) are preconditioned.
2. **Shared parameters.** A parameter that more than one module holds (GPT-2's and Llama's tied ``lm_head.weight is
   wte.weight``) is never preconditioned: its gradient sums every use (the embedding lookup's and the output
   layer's), and one use's factors would rewrite all of it. It is left as its plain gradient and reported; the
   module's other parameters are preconditioned as if the shared one were frozen (a bias-only block, or nothing).
3. ``nn.Embedding`` (a lookup: its input factor would be the diagonal of the token counts) and modules whose
   trainable parameters are all vectors (normalization scales and shifts: ``LayerNorm``, ``RMSNorm``, …) are left as
   their plain gradients, by default.
4. Any other module with trainable parameters (``nn.LSTM``, grouped convolutions, …) raises ``ValueError`` unless
   ``skip_unsupported=True``, which leaves it as its plain gradient too.

Every module left alone is listed with its reason; ``fraction`` is the share of the model's trainable scalars (each
shared tensor counted once) whose gradients K-FAC rewrites.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from torch import Tensor, nn

from taskloss.curvature.kfac_factors import KFACLayer

__all__ = ["KFACCoverage", "CoverageRow", "find_layers", "conv1d_class"]

PRECONDITIONED, SKIPPED = "preconditioned", "skipped"


def conv1d_class() -> type | None:
    """``transformers.pytorch_utils.Conv1D`` when transformers has been imported (no model can hold one before)."""
    mod = sys.modules.get("transformers.pytorch_utils")
    return getattr(mod, "Conv1D", None)


@dataclass(frozen=True)
class CoverageRow:
    """One module with trainable parameters: its name, type, trainable scalars, status and the reason.

    ``unable``: a layer K-FAC would precondition but cannot (a tied weight, an unsupported module or convolution),
    as opposed to what it leaves alone by design (embeddings, norms)."""

    name: str
    kind: str
    n_params: int
    status: str
    reason: str
    unable: bool = False


@dataclass(frozen=True)
class KFACCoverage:
    """What K-FAC covers: one :class:`CoverageRow` per module with trainable parameters, and the totals.

    ``covered`` counts the trainable scalars whose gradients are preconditioned, ``total`` those of the whole model
    (a shared tensor once); ``str(coverage)`` is a table.
    """

    rows: tuple[CoverageRow, ...]
    covered: int
    total: int

    @property
    def fraction(self) -> float:
        """``covered / total`` (0 for a model without trainable parameters)."""
        return self.covered / self.total if self.total else 0.0

    @property
    def preconditioned(self) -> list[str]:
        """Names of the modules K-FAC preconditions (fully or in part)."""
        return [r.name for r in self.rows if r.status == PRECONDITIONED]

    @property
    def unable(self) -> dict[str, str]:
        """Names of the layers K-FAC cannot precondition (a tied weight, an unsupported module) with the reason;
        :class:`~taskloss.curvature.kfac.KFAC` warns about each when it is built."""
        return {r.name: r.reason for r in self.rows if r.unable}

    @property
    def skipped(self) -> dict[str, str]:
        """Names of the modules left as their plain gradients, with the reason."""
        return {r.name: r.reason for r in self.rows if r.status == SKIPPED}

    def __str__(self) -> str:
        width = max([len("module")] + [len(r.name) for r in self.rows])
        kind_w = max([len("type")] + [len(r.kind) for r in self.rows])
        lines = [f"{'module':<{width}}  {'type':<{kind_w}}  {'params':>8}  status          reason",
                 f"{'-' * width}  {'-' * kind_w}  {'-' * 8}  --------------  ------"]
        for r in self.rows:
            lines.append(f"{r.name:<{width}}  {r.kind:<{kind_w}}  {r.n_params:>8}  {r.status:<14}  {r.reason}")
        lines.append(f"K-FAC preconditions {self.covered} of {self.total} trainable parameters "
                     f"({100 * self.fraction:.1f} %) in {len(self.preconditioned)} modules; "
                     f"{len(self.skipped)} modules keep their plain gradients")
        return "\n".join(lines)


def _owners(model: nn.Module) -> dict[int, list[str]]:
    """For every parameter (by identity), the names of the modules that hold it."""
    owners: dict[int, list[str]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        for p in mod.parameters(recurse=False):
            if name not in owners.setdefault(id(p), []):
                owners[id(p)].append(name)
    return owners


def _kind(mod: nn.Module) -> str | None:
    """``"linear"``, ``"conv1d"`` (transformers' Conv1D) or ``"conv2d"`` for a supported layer, else None."""
    conv1d = conv1d_class()
    if conv1d is not None and isinstance(mod, conv1d):
        return "conv1d"
    if isinstance(mod, nn.Linear):
        return "linear"
    if isinstance(mod, nn.Conv2d):
        return "conv2d"
    return None


def _layer(name: str, mod: nn.Module, kind: str, weight: Tensor | None, bias: Tensor | None) -> KFACLayer:
    w = mod.weight
    fan_in = w.shape[0] if kind == "conv1d" else math.prod(w.shape[1:])
    return KFACLayer(name, mod, weight, bias, fan_in, transposed=kind == "conv1d")


def find_layers(model: nn.Module, skip_unsupported: bool) -> tuple[list[KFACLayer], KFACCoverage]:
    """The layers K-FAC preconditions and the coverage report (the rules of the module docstring).

    Args:
        model: the network.
        skip_unsupported: leave unsupported modules as their plain gradients instead of raising.

    Returns:
        ``(layers, coverage)``.

    Raises:
        ValueError: an unsupported module with matrix parameters (without ``skip_unsupported``), or no layer to
            precondition.
    """
    owners = _owners(model)
    first_owner = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            first_owner.setdefault(id(p), name)
    layers, rows = [], []
    for name, mod in model.named_modules():
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        n_own = sum(p.numel() for p in own if first_owner[id(p)] == name)
        kind_name = type(mod).__name__
        shared = {id(p): [o for o in owners[id(p)] if o != name] for p in own if len(owners[id(p)]) > 1}
        kind, reason = _kind(mod), ""
        if kind == "conv2d" and mod.weight.requires_grad and (
                mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str)):
            if not skip_unsupported:
                raise ValueError(f"Conv2d {name!r}: only groups=1, padding_mode='zeros' and numeric padding are "
                                 "supported (or pass skip_unsupported=True)")
            kind, reason = None, "Conv2d with groups, non-zero padding mode or string padding (skip_unsupported)"
        elif kind is None and isinstance(mod, nn.Embedding):
            reason = "embedding lookup (K-FAC's input factor would be the token counts): plain gradient"
        elif kind is None and all(p.ndim <= 1 for p in own):
            reason = "vector parameters only (a normalization's scale / shift): plain gradient"
        elif kind is None:
            if not skip_unsupported:
                raise ValueError(f"module {name!r} ({kind_name}) has trainable parameters but K-FAC supports only "
                                 "nn.Linear, nn.Conv2d and transformers' Conv1D; pass skip_unsupported=True to "
                                 "leave its gradients unpreconditioned")
            reason = "unsupported module (skip_unsupported=True): plain gradient"
        if shared:
            with_ = ", ".join(repr(o) for o in sorted({o for names in shared.values() for o in names}))
            what = "weight" if id(getattr(mod, "weight", None)) in shared else "a parameter"
            note = f"{what} shared with {with_} (tied): left as the plain gradient of all its uses"
            reason = note if kind is not None else f"{reason}; {note}"
        unable = (kind is not None and any(p.ndim > 1 and id(p) in shared for p in own)) or reason.startswith(
            ("Conv2d with", "unsupported"))
        if kind is None:
            rows.append(CoverageRow(name, kind_name, n_own, SKIPPED, reason, unable))
            continue
        w = mod.weight if mod.weight.requires_grad and id(mod.weight) not in shared else None
        b = mod.bias if mod.bias is not None and mod.bias.requires_grad and id(mod.bias) not in shared else None
        if w is None and b is None:
            rows.append(CoverageRow(name, kind_name, n_own, SKIPPED, reason, unable))
            continue
        layers.append(_layer(name, mod, kind, w, b))
        rows.append(CoverageRow(name, kind_name, n_own, PRECONDITIONED, f"bias only: {reason}" if shared else "A ⊗ G",
                                unable))
    if not layers:
        raise ValueError("model has no trainable nn.Linear / nn.Conv2d / Conv1D layer (tied or shared weights are "
                         "not preconditioned)")
    covered = sum(p.numel() for layer in layers for p in layer.params)
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return layers, KFACCoverage(tuple(rows), covered, total)
