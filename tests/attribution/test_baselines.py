"""Baselines: the blur against scipy.ndimage.gaussian_filter, reproducible noise, the reference set's shape."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from taskloss.attribution import baseline_set, blurred_baseline, gaussian_noise_baseline, uniform_noise_baseline


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_blur_matches_scipy(sigma):
    x = torch.rand(3, 2, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    radius = max(1, math.ceil(3 * sigma))
    # torch's "reflect" padding (d c b | a b c d) is scipy's "mirror"
    ref = gaussian_filter(x.numpy(), sigma=sigma, mode="mirror", radius=radius, axes=(2, 3))
    np.testing.assert_allclose(blurred_baseline(x, sigma).numpy(), ref, rtol=1e-12, atol=1e-12)


def test_wide_blur_tends_to_a_flat_image_and_keeps_the_mean_of_a_constant():
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    wide = blurred_baseline(x, 50.0)
    assert float(wide.std(dim=(2, 3)).max()) < 0.25 * float(x.std(dim=(2, 3)).min())
    c = torch.full((1, 1, 8, 8), 0.3, dtype=torch.float64)
    torch.testing.assert_close(blurred_baseline(c, 1.3), c)


def test_noise_baselines_are_reproducible_and_shaped_like_the_inputs():
    x = torch.rand(4, 5)
    a = gaussian_noise_baseline(x, 0.1, generator=torch.Generator().manual_seed(3))
    b = gaussian_noise_baseline(x, 0.1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)
    assert abs(float((a - x).std()) - 0.1) < 0.05
    u = uniform_noise_baseline(x, -1.0, 2.0, generator=torch.Generator().manual_seed(0))
    assert u.shape == x.shape and float(u.min()) >= -1.0 and float(u.max()) < 2.0


def test_baseline_set_draws_distinct_rows():
    data = torch.arange(20, dtype=torch.float32).view(10, 2)
    s = baseline_set(data, 4, generator=torch.Generator().manual_seed(0))
    assert s.shape == (4, 1, 2)
    rows = {tuple(r.tolist()) for r in s[:, 0]}
    assert len(rows) == 4 and rows <= {tuple(r.tolist()) for r in data}
