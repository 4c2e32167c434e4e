"""Baselines x′ for integrated gradients: what the explanation is measured against.

Derived in notebook 15_integrated_gradients. The attributions split F(x) − F(x′), so the baseline decides the
question being answered: the zero image asks "why this class rather than what the model says for black?", a
blurred copy asks about fine detail only, noise asks about the input against random inputs nearby, and a set of
references drawn from the data (expected gradients; Erion et al., Nature Machine Intelligence 2021) asks about
the input against the data distribution. Sturmfels, Lundberg & Lee, *Visualizing the Impact of Feature Attribution
Baselines* (Distill 2020) compare these choices; the blur follows their Gaussian-blur baseline.

Every function returns a tensor on the device and dtype of its input, shaped as
:meth:`taskloss.attribution.IntegratedGradients.attribute` reads it (``[B, *feat]``, or ``[K, 1, *feat]`` for a set).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from taskloss.validation import check_finite, check_generator, check_int, check_not_meta, check_positive, check_steps

__all__ = ["blurred_baseline", "gaussian_noise_baseline", "uniform_noise_baseline", "baseline_set"]


def _check_images(name: str, images) -> Tensor:
    if not isinstance(images, Tensor) or not images.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor")
    if images.ndim != 4 or images.numel() == 0:
        raise ValueError(f"{name} must be a non-empty image batch [B, C, H, W], got shape {tuple(images.shape)}")
    return check_finite(name, images)


def blurred_baseline(images: Tensor, sigma: float) -> Tensor:
    """Each channel convolved with a normalised Gaussian of standard deviation ``sigma`` pixels (kernel radius
    ⌈3σ⌉, reflection padding, separable).

    Args:
        images: ``[B, C, H, W]``.
        sigma: blur width in pixels (> 0); σ → 0 returns the image, σ → ∞ its mean colour.

    Returns:
        ``[B, C, H, W]`` blurred copy.
    """
    images = _check_images("images", images)
    sigma = check_positive("sigma", sigma)
    # the kernel's 2·⌈3σ⌉ + 1 taps (and the padded rows they meet), refused before a σ of 10**12 is allocated
    check_steps("sigma", math.ceil(3 * sigma), bytes_per_step=2.0 * images.element_size() * max(images.shape[-2:]),
                what=f"blurred_baseline(sigma={sigma!r})")
    B, C, H, W = images.shape
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    x = images.reshape(B * C, 1, H, W)
    for dim, size in ((3, W), (2, H)):          # separable: rows, then columns
        pad = min(radius, size - 1)
        kern = k[radius - pad: radius + pad + 1]
        kern = kern / kern.sum()
        shape = (1, 1, 1, -1) if dim == 3 else (1, 1, -1, 1)
        padding = (pad, pad, 0, 0) if dim == 3 else (0, 0, pad, pad)
        x = F.conv2d(F.pad(x, padding, mode="reflect") if pad else x, kern.view(shape))
    return x.reshape(B, C, H, W)


def gaussian_noise_baseline(inputs: Tensor, std: float, generator: torch.Generator | None = None) -> Tensor:
    """``x + std·ε`` with ε ~ N(0, I): a baseline near the input (what SmoothGrad-style noise asks about).

    Args:
        inputs: ``[B, *feat]`` floating tensor.
        std: noise standard deviation (> 0).
        generator: a ``torch.Generator`` on the inputs' device for reproducible noise (another device, or a seed in
            place of a generator, is refused: ``ValueError`` / ``TypeError``).
    """
    if not isinstance(inputs, Tensor) or not inputs.is_floating_point() or inputs.numel() == 0 or inputs.ndim == 0:
        raise TypeError("inputs must be a non-empty floating-point tensor [B, *feat]")
    check_finite("inputs", inputs)
    std = check_positive("std", std)
    check_generator("generator", generator, inputs.device)
    return inputs + std * torch.randn(inputs.shape, generator=generator, device=inputs.device, dtype=inputs.dtype)


def uniform_noise_baseline(inputs: Tensor, low: float = 0.0, high: float = 1.0,
                           generator: torch.Generator | None = None) -> Tensor:
    """Independent uniform noise on ``[low, high)`` shaped like ``inputs`` (the "uniform" baseline of Sturmfels et
    al. 2020): a baseline that carries no image at all.

    Args:
        inputs: ``[B, *feat]`` floating tensor (its shape, device and dtype are used).
        low, high: the range, ``low < high``.
        generator: a ``torch.Generator`` on the inputs' device (as in :func:`gaussian_noise_baseline`).
    """
    if not isinstance(inputs, Tensor) or not inputs.is_floating_point() or inputs.numel() == 0 or inputs.ndim == 0:
        raise TypeError("inputs must be a non-empty floating-point tensor [B, *feat]")
    check_not_meta("inputs", inputs)
    check_generator("generator", generator, inputs.device)
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float))) or not (
            math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"need finite low < high, got low={low}, high={high}")
    u = torch.rand(inputs.shape, generator=generator, device=inputs.device, dtype=inputs.dtype)
    return low + (high - low) * u


def baseline_set(data: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """``k`` references drawn without replacement from the rows of ``data`` as a set ``[k, 1, *feat]`` (shared by
    every input): the baselines of expected gradients.

    Args:
        data: ``[N, *feat]`` reference data (e.g. the training inputs).
        k: number of references, ``1 ≤ k ≤ N``.
        generator: a CPU ``torch.Generator`` for the draw (the permutation is drawn on the CPU whatever the
            device of ``data``).
    """
    check_generator("generator", generator, "cpu")
    if not isinstance(data, Tensor) or not data.is_floating_point():
        raise TypeError("data must be a floating-point tensor [N, *feat]")
    if data.ndim < 1 or data.shape[0] == 0:
        raise ValueError(f"data must have at least one row, got shape {tuple(data.shape)}")
    check_finite("data", data)
    k = check_int("k", k, minimum=1, maximum=data.shape[0])
    idx = torch.randperm(data.shape[0], generator=generator)[:k].to(data.device)
    return data[idx].unsqueeze(1)
