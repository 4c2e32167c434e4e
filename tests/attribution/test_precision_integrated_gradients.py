"""Half precision in integrated gradients (issue 45, found by benchmarks/bench_precision.py): the gradient integral
is weighted and summed in float32 for float16 / bfloat16 inputs. Summed in the half dtype, 1024 nodes in chunks of
one node lost 40 % of a bfloat16 attribution (relative error 0.42 against float64 on the same inputs) and its
completeness error read 0.14 on outputs of size ~1; the reference here is the same model and inputs in float64."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from taskloss.attribution import EmbeddingIntegratedGradients, IntegratedGradients, integrate_gradients

HALF = (torch.bfloat16, torch.float16)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double().eval()


X = torch.randn(8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("n_steps,internal_batch_size", [(16, None), (1024, 8)])
def test_half_attributions_stay_within_a_few_rounding_units_of_float64(dtype, n_steps, internal_batch_size):
    x = X.to(dtype)
    got = IntegratedGradients(_mlp().to(dtype)).attribute(x, target=0, n_steps=n_steps,
                                                          internal_batch_size=internal_batch_size)
    want = IntegratedGradients(_mlp().to(dtype).double()).attribute(x.double(), target=0, n_steps=n_steps,
                                                                    internal_batch_size=internal_batch_size)
    eps = torch.finfo(dtype).eps
    assert got.attributions.dtype == dtype
    assert got.completeness_error.dtype == torch.float32 and got.output_difference.dtype == torch.float32
    assert _relative(got.attributions, want.attributions) < 2 * eps          # was 0.42 in bfloat16 at 1024 nodes
    # the completeness error is the half forward's rounding (a few eps of the outputs), not the sums' (was 0.14)
    scale = float(want.output_difference.abs().max())
    assert float(got.completeness_error.abs().max()) < 4 * eps * max(scale, 1.0)
    torch.testing.assert_close(got.output_difference.double(), want.output_difference, rtol=4 * eps, atol=4 * eps)


def test_the_core_returns_float32_sums_for_half_points_and_keeps_float64():
    f = lambda pts, idx: (pts ** 2).sum(-1)  # noqa: E731  ∫₀¹ 2(s + α(e − s)) dα = s + e
    alphas, weights = torch.linspace(0, 1, 3, dtype=torch.float64), torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    s, e = torch.zeros(2, 3, dtype=torch.float64), torch.full((2, 3), 100.0, dtype=torch.float64)
    g64, v64 = integrate_gradients(f, s, e, alphas, weights)
    assert g64.dtype == v64.dtype == torch.float64
    torch.testing.assert_close(g64, s + e)
    g16, v16 = integrate_gradients(f, s.half(), e.half(), alphas.half(), weights.half())
    assert g16.dtype == v16.dtype == torch.float32
    torch.testing.assert_close(g16.double(), g64, rtol=1e-3, atol=0)
    assert float(v16[-1, 0]) == 3 * 100.0 ** 2


def test_a_half_weight_times_a_small_gradient_does_not_underflow_float16():
    # w_k ≈ 1e-3 times ∂f ≈ 1e-5 is ≈ 1e-8, below float16's smallest subnormal (6e-8): folded into the backward
    # pass in float16 it flushed to zero; weighted in float32 it survives
    f = lambda pts, idx: 1e-5 * pts.sum(-1)  # noqa: E731
    m = 1000
    alphas = torch.linspace(0, 1, m, dtype=torch.float16)
    weights = torch.full((m,), 1.0 / m, dtype=torch.float16)
    g, _ = integrate_gradients(f, torch.zeros(1, 4, dtype=torch.float16), torch.ones(1, 4, dtype=torch.float16),
                               alphas, weights)
    slope = float(torch.tensor(1e-5, dtype=torch.float16))                  # the constant as float16 holds it
    torch.testing.assert_close(g.double(), torch.full((1, 4), slope * float(weights.double().sum()),
                                                      dtype=torch.float64), rtol=1e-3, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_embedding_attributions_sum_their_dimensions_in_float32(dtype):
    torch.manual_seed(0)
    emb64 = nn.Embedding(11, 64).double()
    head64 = nn.Linear(64, 3).double()

    def run(emb, head):
        ig = EmbeddingIntegratedGradients(lambda ids: head(emb(ids).tanh().mean(1)), emb)
        return ig.attribute(torch.tensor([[1, 2, 3, 4, 5]]), target=0, n_steps=512, internal_batch_size=1)

    got = run(emb64.to(dtype), head64.to(dtype))
    want = run(emb64.to(dtype).double(), head64.to(dtype).double())
    assert got.attributions.dtype == dtype
    assert _relative(got.attributions, want.attributions) < 4 * torch.finfo(dtype).eps
