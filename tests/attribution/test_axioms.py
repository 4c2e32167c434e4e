"""The axioms of Sundararajan, Taly & Yan (ICML 2017) on constructed examples: sensitivity (a) and (b),
implementation invariance, completeness, linearity and symmetry preservation; and a closed form for separable
functions (property test)."""
from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from taskloss.attribution import METHODS, IntegratedGradients

D = torch.float64


def test_sensitivity_a_on_the_saturated_relu():
    """f(x) = 1 − ReLU(1 − x): f(0) = 0, f(2) = 1, but ∂f/∂x(2) = 0. The plain gradient gives the only feature that
    changed the output zero credit; integrated gradients gives it all of f(2) − f(0) = 1 (even m: the integrand
    2·[α < ½] is split exactly by the symmetric rules)."""
    f = lambda z: 1 - torch.relu(1 - z[:, 0])                                     # noqa: E731
    x = torch.tensor([[2.0]], dtype=D, requires_grad=True)
    (grad,) = torch.autograd.grad(f(x).sum(), x)
    assert float(grad) == 0.0
    for method in ("riemann_middle", "gausslegendre"):
        res = IntegratedGradients(f).attribute(x.detach(), n_steps=8, method=method)
        assert abs(float(res.attributions) - 1.0) < 1e-12 and abs(float(res.completeness_error)) < 1e-12


def test_sensitivity_b_features_the_function_ignores_get_zero():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 1)).double()
    with torch.no_grad():
        net[0].weight[:, [1, 4]] = 0.0
    x = torch.randn(3, 6, dtype=D)
    attr = IntegratedGradients(net).attribute(x, baselines=torch.randn(3, 6, dtype=D), target=0).attributions
    assert bool((attr[:, [1, 4]] == 0).all()) and bool((attr[:, [0, 2, 3, 5]] != 0).all())


def _split_units(net: nn.Sequential) -> nn.Sequential:
    """The same function by another network: every hidden unit duplicated with both copies' outgoing weights
    halved (w·ReLU(h) = w/2·ReLU(h) + w/2·ReLU(h)), and the hidden units permuted."""
    lin1, lin2 = net[0], net[2]
    h = lin1.out_features
    big = nn.Sequential(nn.Linear(lin1.in_features, 2 * h), nn.ReLU(), nn.Linear(2 * h, lin2.out_features)).double()
    perm = torch.randperm(2 * h, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        w1, b1 = torch.cat([lin1.weight, lin1.weight]), torch.cat([lin1.bias, lin1.bias])
        w2 = torch.cat([lin2.weight, lin2.weight], dim=1) / 2
        big[0].weight.copy_(w1[perm]), big[0].bias.copy_(b1[perm])
        big[2].weight.copy_(w2[:, perm]), big[2].bias.copy_(lin2.bias)
    return big


def test_implementation_invariance():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).double()
    twin = _split_units(net)
    x, base = torch.randn(4, 5, dtype=D), torch.randn(4, 5, dtype=D)
    with torch.no_grad():
        torch.testing.assert_close(net(x), twin(x), rtol=1e-12, atol=1e-12)       # functionally equal networks
    for method in METHODS:
        a = IntegratedGradients(net).attribute(x, baselines=base, target=2, n_steps=10, method=method)
        b = IntegratedGradients(twin).attribute(x, baselines=base, target=2, n_steps=10, method=method)
        torch.testing.assert_close(a.attributions, b.attributions, rtol=1e-10, atol=1e-12)


@given(st.sampled_from(METHODS), st.integers(2, 7))
def test_completeness_is_exact_for_linear_models(method, n_steps):
    torch.manual_seed(n_steps)
    w, c = torch.randn(6, dtype=D), torch.randn((), dtype=D)
    f = lambda z: z @ w + c                                                       # noqa: E731
    x, base = torch.randn(3, 6, dtype=D), torch.randn(3, 6, dtype=D)
    res = IntegratedGradients(f).attribute(x, baselines=base, n_steps=n_steps, method=method)
    torch.testing.assert_close(res.attributions, w * (x - base), rtol=1e-12, atol=1e-12)
    assert res.completeness_error.abs().max() < 1e-12


def test_linearity_and_symmetry_preservation():
    torch.manual_seed(0)
    f1 = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    f2 = nn.Sequential(nn.Linear(4, 6), nn.Softplus(), nn.Linear(6, 1)).double()
    x = torch.randn(3, 4, dtype=D)
    ig = lambda f: IntegratedGradients(f).attribute(x, target=0, n_steps=12).attributions   # noqa: E731
    torch.testing.assert_close(ig(lambda z: 2 * f1(z) - 3 * f2(z)), 2 * ig(f1) - 3 * ig(f2), rtol=1e-10, atol=1e-12)
    # F symmetric in (x0, x1); input and baseline with x0 = x1 get equal attributions on both
    sym = lambda z: torch.sigmoid(z[:, 0] * z[:, 1] + z[:, 0] + z[:, 1] + z[:, 2])   # noqa: E731
    xs = torch.tensor([[0.7, 0.7, -1.0], [2.0, 2.0, 0.5]], dtype=D)
    a = IntegratedGradients(sym).attribute(xs, n_steps=16).attributions
    torch.testing.assert_close(a[:, 0], a[:, 1], rtol=1e-12, atol=1e-14)


@given(st.lists(st.floats(-3, 3), min_size=4, max_size=4), st.lists(st.floats(-3, 3), min_size=4, max_size=4))
def test_separable_functions_get_their_own_differences(xs, bs):
    """F(x) = Σ_i a_i tanh(b_i x_i): each feature's integrated gradient is a_i (tanh(b_i x_i) − tanh(b_i x′_i))."""
    a, b = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=D), torch.tensor([0.5, 1.0, 2.0, -1.0], dtype=D)
    f = lambda z: (a * torch.tanh(b * z)).sum(-1)                                 # noqa: E731
    x, base = torch.tensor([xs], dtype=D), torch.tensor([bs], dtype=D)
    got = IntegratedGradients(f).attribute(x, baselines=base, n_steps=48).attributions
    torch.testing.assert_close(got, a * (torch.tanh(b * x) - torch.tanh(b * base)), rtol=1e-8, atol=1e-9)
