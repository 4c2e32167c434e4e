"""Half precision in the zeroth-order estimators (issue 45, found by benchmarks/bench_precision.py). The perturbation
θ + σz is formed in the parameters' dtype: at σ = 1e-3 most of σz is below bfloat16's resolution near |θ| ≈ 0.3
(2⁻⁹ ≈ 0.002), so the loss differences measure another direction than the z the update uses, and MeZO's
in-place perturb / restore does not return θ. The estimators now refuse a σ below the resolution of half-precision
parameters, naming the σ that would be resolved (an exact in-place restore would need a float32 copy of θ, the memory
MeZO exists to save)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.search import MeZO, gaussian_smoothing_grad
from taskloss.parameter_vectors import functional_loss

X = torch.randn(32, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Y = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(2))


def _wide(t):
    """A half-precision loss input in float32 (as users' losses upcast); float32 / float64 unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _mlp(dtype, rounded_to=None):
    """The MLP in ``dtype``, its values first rounded to ``rounded_to`` (the same numbers in a wider dtype)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double().to(rounded_to or dtype).to(dtype)


class _Float64Noise:
    """``torch.randn`` draws float64 numbers and rounds them to the dtype asked for: the same z in every dtype."""

    def __enter__(self):
        self.randn = torch.randn
        randn = self.randn
        torch.randn = lambda *a, dtype=None, **kw: randn(*a, dtype=torch.float64, **kw).to(dtype or torch.float32)

    def __exit__(self, *exc):
        torch.randn = self.randn


def _mezo_step(dtype, lr, rounded_to=None):
    model = _mlp(dtype, rounded_to)
    before = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    opt = MeZO(model.parameters(), lr=lr, sigma=1e-3, n_samples=4, seed=0)
    with _Float64Noise():
        opt.step(lambda: F.cross_entropy(_wide(model(X.to(rounded_to or dtype).to(dtype))), Y))
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]) - before


def test_float64_noise_patch_gives_every_dtype_the_same_draws():
    with _Float64Noise():
        a = torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=torch.bfloat16)
        b = torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(a, b.to(torch.bfloat16))


def test_mezo_float32_step_follows_float64():           # the comparison itself can pass: float32 resolves σz
    got, want = _mezo_step(torch.float32, 1.0), _mezo_step(torch.float64, 1.0, torch.float32)
    assert float(F.cosine_similarity(got, want, dim=0)) > 0.9999



def test_mezo_refuses_a_sigma_bfloat16_parameters_cannot_resolve():
    """At σ = 1e-3 bfloat16 rounds σz away on a quarter of this MLP's entries: the step pointed elsewhere (cosine 0.96
    with float64) and perturb / restore moved θ by 3 units of resolution. MeZO now refuses, naming a σ that works,
    and leaves the parameters untouched."""
    model = _mlp(torch.bfloat16)
    before = [p.detach().clone() for p in model.parameters()]
    opt = MeZO(model.parameters(), lr=1.0, sigma=1e-3, n_samples=4, seed=0)
    with pytest.raises(ValueError, match=r"below half the resolution of the bfloat16.*Use sigma ≥"):
        opt.step(lambda: F.cross_entropy(_wide(model(X.to(torch.bfloat16))), Y))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_mezo_at_a_resolved_sigma_points_where_float64_points():
    """Above the σ the refusal names (0.0014 here), the bfloat16 step follows float64's on the same rounded model and
    noise (measured cosine 0.997 at σ = 0.004). Perturb / restore in place still rounds θ by a few units of
    bfloat16's resolution per step, whatever σ (the MeZO docstring says so): exact restoring would need a float32
    copy of θ."""
    def step(dtype, rounded_to=None):
        model = _mlp(dtype, rounded_to)
        before = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        opt = MeZO(model.parameters(), lr=1.0, sigma=0.004, n_samples=4, seed=0)
        with _Float64Noise():
            opt.step(lambda: F.cross_entropy(_wide(model(X.to(rounded_to or dtype).to(dtype))), Y))
        return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()]) - before

    got, want = step(torch.bfloat16), step(torch.float64, torch.bfloat16)
    assert float(F.cosine_similarity(got, want, dim=0)) >= 0.99


def _smoothing(dtype):
    model = _mlp(dtype)
    f, theta = functional_loss(model, lambda out: F.cross_entropy(_wide(out), Y), X.to(dtype))
    with _Float64Noise():
        g = gaussian_smoothing_grad(f, theta, 1e-3, 8, baseline="antithetic",
                                    generator=torch.Generator().manual_seed(0))
    return torch.cat([v.reshape(-1).double() for v in g.values()])


def _smoothing_ref():
    model = _mlp(torch.float64, torch.bfloat16)         # the bfloat16 model's values, in float64
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, Y), X.to(torch.bfloat16).double())
    with _Float64Noise():
        g = gaussian_smoothing_grad(f, theta, 1e-3, 8, baseline="antithetic",
                                    generator=torch.Generator().manual_seed(0))
    return torch.cat([v.reshape(-1).double() for v in g.values()])


def test_gaussian_smoothing_refuses_a_sigma_bfloat16_parameters_cannot_resolve():
    """The same refusal for the functional estimator (its bfloat16 gradient had cosine 0.98 with float64), while
    float64 on the same rounded values computes."""
    with pytest.raises(ValueError, match="gaussian_smoothing_grad: sigma = 0.001 is below half the resolution"):
        _smoothing(torch.bfloat16)
    assert torch.isfinite(_smoothing_ref()).all()
