"""The quadrature rules: nodes equal Captum's, weights sum to 1, polynomial exactness, and the completeness error
of integrated gradients shrinking with the number of steps at the rate each rule predicts (fitted slopes)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from captum.attr import IntegratedGradients as CaptumIG
from captum.attr._utils.approximation_methods import approximation_parameters

from taskloss.attribution import (
    METHODS,
    IntegratedGradients,
    captum_trapezoid_factor,
    convergence_order,
    quadrature_rule,
)
from taskloss.models import MLP


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [2, 3, 10, 51])
def test_nodes_match_captum_and_weights_sum_to_one(method, n):
    alphas, weights = quadrature_rule(method, n)
    step_sizes, ref_alphas = approximation_parameters(method)
    np.testing.assert_allclose(alphas.numpy(), ref_alphas(n), rtol=0, atol=1e-7)   # torch.linspace in float32
    expected = np.asarray(step_sizes(n))
    if method == "riemann_trapezoid":
        expected = expected / captum_trapezoid_factor(n)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert abs(float(weights.sum()) - 1.0) < 1e-13
    assert bool((alphas >= 0).all() and (alphas <= 1).all() and (alphas.diff() > 0).all())


def test_returned_tensors_are_copies_with_the_requested_dtype():
    a, w = quadrature_rule("gausslegendre", 5, dtype=torch.float32)
    assert a.dtype == w.dtype == torch.float32
    a, w = quadrature_rule("gausslegendre", 5)
    assert a.dtype == w.dtype == torch.float64
    a[0] = 7.0
    assert float(quadrature_rule("gausslegendre", 5)[0][0]) != 7.0, "the cache must not be mutable from outside"


@pytest.mark.parametrize("method,exact_degree", [
    ("riemann_left", 0), ("riemann_right", 0), ("riemann_middle", 1), ("riemann_trapezoid", 1)])
def test_polynomial_exactness_of_newton_cotes_rules(method, exact_degree):
    a, w = quadrature_rule(method, 6)
    for deg in range(exact_degree + 2):
        err = float((w * a ** deg).sum()) - 1.0 / (deg + 1)
        assert (abs(err) < 1e-14) == (deg <= exact_degree), (deg, err)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_gauss_legendre_is_exact_to_degree_2n_minus_1(n):
    a, w = quadrature_rule("gausslegendre", n)
    for deg in range(2 * n + 1):
        err = float((w * a ** deg).sum()) - 1.0 / (deg + 1)
        assert (abs(err) < 1e-13) == (deg <= 2 * n - 1), (deg, err)


def test_completeness_error_is_the_quadrature_error_of_a_polynomial_path():
    """F(x) = Σ x_i⁴ along x′ → x is a polynomial of degree 4 in α: its integrand has degree 3, so Gauss–Legendre
    with 2 nodes is exact and the midpoint rule's error is −(g′(1) − g′(0))/(24 m²) exactly (g‴ constant)."""
    f = lambda z: (z ** 4).sum(-1)                                                 # noqa: E731
    x, base = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64)
    ig = IntegratedGradients(f)
    assert abs(float(ig.attribute(x, baselines=base, n_steps=2).completeness_error)) < 1e-12
    c = float((x ** 4).sum())                        # F(γ(α)) = c α⁴, g(α) = 4cα³, g′(1) − g′(0) = 12c
    for m in (3, 10):
        err = float(ig.attribute(x, baselines=base, n_steps=m, method="riemann_middle").completeness_error)
        np.testing.assert_allclose(err, -12 * c / (24 * m ** 2), rtol=1e-10)


def _errors(method, steps, seeds=(0, 1)):
    """Mean |completeness error| over a few smooth (tanh) MLPs and inputs, per number of steps."""
    out = np.zeros(len(steps))
    for seed in seeds:
        torch.manual_seed(seed)
        model = MLP(12, (16, 16), 5, activation="tanh").double().eval()
        x = 2 * torch.randn(2, 12, dtype=torch.float64)
        ig = IntegratedGradients(model)
        out += [float(ig.attribute(x, target=0, n_steps=m, method=method).completeness_error.abs().mean())
                for m in steps]
    return out / len(seeds)


@pytest.mark.parametrize("method", ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"])
def test_completeness_error_falls_at_the_predicted_power(method):
    steps = np.array([16, 32, 64, 128, 256])
    slope = np.polyfit(np.log(steps), np.log(_errors(method, steps)), 1)[0]
    # asymptotic regime: the leading Euler–Maclaurin term dominates from m ≈ 16 on for these paths
    assert abs(slope + convergence_order(method)) < 0.15, slope


def test_gauss_legendre_error_falls_geometrically():
    steps = np.arange(2, 13)
    err = _errors("gausslegendre", steps)
    per_node = np.polyfit(steps, np.log(err), 1)[0]
    assert per_node < -1.0, per_node                  # ≥ e-fold per extra node on average
    power = np.polyfit(np.log(steps), np.log(err), 1)[0]
    assert power < -6.0, power                        # far steeper than any fixed power of the Riemann rules
    assert err[-1] < 1e-6 * err[0]
    assert convergence_order("gausslegendre") == float("inf")


def test_captum_trapezoid_error_falls_only_as_one_over_m():
    """The deviation named in the quadrature module, measured: Captum's trapezoid weights sum to (m−1)/m."""
    torch.manual_seed(0)
    model = MLP(12, (16, 16), 5, activation="tanh").double().eval()
    x = 2 * torch.randn(2, 12, dtype=torch.float64)
    steps = np.array([16, 32, 64, 128])
    deltas = [float(CaptumIG(model).attribute(x, target=0, n_steps=int(m), method="riemann_trapezoid",
                                              return_convergence_delta=True)[1].abs().mean()) for m in steps]
    assert abs(np.polyfit(np.log(steps), np.log(deltas), 1)[0] + 1.0) < 0.1
    ours = _errors("riemann_trapezoid", steps, seeds=(0,))
    assert (ours < 0.05 * np.asarray(deltas)).all()
