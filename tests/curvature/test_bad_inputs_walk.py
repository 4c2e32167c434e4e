"""Issue 42: the Gaussian Monte Carlo estimators refuse a sample count beyond memory before drawing it (10**12
reached torch's allocator); a valid count still gives the closed form's mean."""
from __future__ import annotations

import pytest
import torch

from taskloss import curvature as C


@pytest.mark.parametrize("which", ["gaussian_samples", "bonnet_gradient", "price_gradient",
                                   "gaussian_natural_gradient"])
def test_sample_count_beyond_memory(which):
    m, V = torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64)
    args = (m, V, 10**12) if which == "gaussian_samples" else (lambda z: (z ** 2).sum(), m, V, 10**12)
    with pytest.raises(ValueError, match="n_samples=1000000000000 would allocate"):
        getattr(C, which)(*args)


def test_bonnet_gradient_of_a_quadratic():
    m, V = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.eye(2, dtype=torch.float64)
    est = C.bonnet_gradient(lambda z: (z ** 2).sum(), m, V, 64, torch.Generator().manual_seed(0))
    torch.testing.assert_close(est.mean, 2 * m, rtol=0, atol=6 * float(est.stderr.max()) + 1e-12)
