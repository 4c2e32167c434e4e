"""Feed-forward networks for the 8×8 digits: an MLP and a small CNN (only ``nn.Linear`` / ``nn.Conv2d`` carry
parameters, which is what K-FAC's hooks look for).

Used by MGS (02, 03), zeroth-order vs policy gradient (05) and the natural-gradient notebooks (06–08).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.validation import check_allocation, check_bool, check_finite, check_int, check_not_meta, is_transformed

__all__ = ["MLP", "SmallCNN"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def _check_input(name: str, model: nn.Module, x: torch.Tensor) -> None:
    """Floating inputs in the parameters' dtype (outside autocast), a non-empty batch, no NaN/inf, no meta tensor.
    The value check is skipped inside ``torch.func`` transforms (it needs ``.item()``) and with
    ``model.validate_inputs = False`` (it synchronizes on a GPU)."""
    check_not_meta(f"{name} input", x)
    if not x.is_floating_point():
        raise TypeError(f"{name} expects floating-point input (features, not ids), got {x.dtype}")
    weight = next(model.parameters(), None)
    if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} input has dtype {x.dtype} but its parameters are {weight.dtype}: convert one "
                        f"(x.to({weight.dtype}) or model.to({x.dtype}))")
    if x.ndim > 1 and x.shape[0] == 0:
        raise ValueError(f"{name} input is empty: shape {tuple(x.shape)}")
    if getattr(model, "validate_inputs", True) and not is_transformed(x):
        check_finite(f"{name} input", x)


class MLP(nn.Sequential):
    """Multi-layer perceptron ``[n, in_dim] → [n, out_dim]`` as an ``nn.Sequential`` of ``nn.Linear`` layers
    with ``activation`` between them (no activation after the last layer). ``hidden`` is an int or a
    sequence of widths (``()`` gives a linear model). PyTorch's default Linear initialisation."""

    def __init__(self, in_dim: int, hidden: int | Sequence[int] = (64,), out_dim: int | None = None,
                 activation: str = "relu", bias: bool = True):
        bias = check_bool("bias", bias)
        in_dim = check_int("in_dim", in_dim, minimum=1)        # numpy integers become Python ints for torch
        if out_dim is None:
            raise TypeError("MLP needs out_dim")
        out_dim = check_int("out_dim", out_dim, minimum=1)
        if isinstance(hidden, (bool, float, str)) or not isinstance(hidden, (int, np.integer, Sequence)):
            raise TypeError(f"hidden must be an int or a sequence of ints, got {type(hidden).__name__}")
        hidden = (hidden,) if isinstance(hidden, (int, np.integer)) else tuple(hidden)
        hidden = tuple(check_int(f"hidden[{i}]", h, minimum=1) for i, h in enumerate(hidden))
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        dims = (in_dim, *hidden, out_dim)
        check_allocation(f"MLP(in_dim={in_dim}, hidden={hidden}, out_dim={out_dim})",
                         4.0 * sum(a * b + b for a, b in zip(dims[:-1], dims[1:])))   # float32 weights, before any
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b, bias=bias))
            if i < len(dims) - 2:
                layers.append(_ACTIVATIONS[activation]())
        super().__init__(*layers)
        self.in_dim, self.out_dim, self.hidden, self.activation = in_dim, out_dim, hidden, activation
        self.validate_inputs = True   # False skips the NaN/inf check of the input (a GPU synchronization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., in_dim]`` (the parameters' floating dtype, finite, non-empty) → ``[..., out_dim]``."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MLP expects a tensor [..., {self.in_dim}], got {type(x).__name__}")
        if x.ndim < 1 or x.shape[-1] != self.in_dim:
            raise ValueError(f"MLP expects input [..., {self.in_dim}], got {tuple(x.shape)}")
        _check_input("MLP", self, x)
        return super().forward(x)


class SmallCNN(nn.Module):
    """Small CNN for 8×8 digit images: Conv3×3(in→w) → ReLU → Conv3×3(w→2w) → ReLU → MaxPool2 → Linear.

    Input ``[n, in_channels, 8, 8]`` (or flat ``[n, in_channels·64]``) → logits ``[n, n_classes]``.
    Only ``nn.Conv2d`` and ``nn.Linear`` carry parameters (what K-FAC hooks look for)."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, width: int = 16):
        super().__init__()
        in_channels = check_int("in_channels", in_channels, minimum=1)
        n_classes = check_int("n_classes", n_classes, minimum=2)
        width = check_int("width", width, minimum=1)
        check_allocation(f"SmallCNN(in_channels={in_channels}, n_classes={n_classes}, width={width})",
                         4.0 * (9 * in_channels * width + 18 * width * width + 32 * width * n_classes))
        self.in_channels, self.n_classes, self.width = in_channels, n_classes, width
        self.validate_inputs = True   # False skips the NaN/inf check of the input (a GPU synchronization)
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * width * 4 * 4, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, classes]`` of images ``[N, 1, 8, 8]`` (or flat ``[N, 64]``)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"SmallCNN expects a tensor, got {type(x).__name__}")
        if x.ndim == 2 and x.shape[1] == self.in_channels * 64:
            x = x.reshape(-1, self.in_channels, 8, 8)
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.in_channels, 8, 8):
            raise ValueError(f"SmallCNN expects [n, {self.in_channels}, 8, 8] (or [n, {self.in_channels * 64}]),"
                             f" got {tuple(x.shape)}")
        _check_input("SmallCNN", self, x)
        x = self.pool(F.relu(self.conv2(F.relu(self.conv1(x)))))
        return self.fc(x.flatten(1))
