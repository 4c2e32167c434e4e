"""EMO's three-line form (``emo_loss_reference``: the cost matrix and the expected cost under the one-hot target)
against the fused, chunked ``emo_loss``: values and gradients, padding and a zero-norm embedding row included."""
from __future__ import annotations

import pytest
import torch

from taskloss.losses import emo_loss, emo_loss_reference


@pytest.mark.parametrize("shape", [(7,), (2, 5)])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_reference_equals_the_fused_loss(shape, chunk_size):
    g = torch.Generator().manual_seed(0)
    V, d = 11, 6
    x = torch.randn(*shape, V, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, V, shape, generator=g)
    t.view(-1)[1] = -100                                       # a padding position
    e = torch.randn(V, d, generator=g, dtype=torch.float64)
    e[4] = 0.0                                                 # a zero-norm row costs 1 to every token
    fast = emo_loss(x, t, e, chunk_size=chunk_size)
    (g_fast,) = torch.autograd.grad(fast, x)
    ref = emo_loss_reference(x, t, e)
    (g_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_fast, g_ref, rtol=1e-10, atol=1e-12)
