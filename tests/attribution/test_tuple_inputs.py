"""IntegratedGradients on a tuple of inputs against Captum's: tuple baselines (tensors, numbers, mixed), one number
for every input, additional forward arguments, every rule, chunked passes; and the tuple path's own invariants."""
from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients as CaptumIG

from taskloss.attribution import METHODS, IntegratedGradients, captum_trapezoid_factor
from taskloss.models import MLP

TOL = dict(rtol=1e-5, atol=1e-5)
B = 4


def _model(seed=0):
    torch.manual_seed(seed)
    return MLP(12, (16,), 5, activation="tanh").double().eval()


def _two_inputs(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, 6, generator=gen, dtype=torch.float64),
            torch.randn(B, 2, 3, generator=gen, dtype=torch.float64))


def _forward(model):
    """A function of two inputs that mixes them nonlinearly (a product term couples the two)."""
    def f(a, b, *args):
        scale = args[0][:, None] if args else 1.0
        shift = args[1] if len(args) > 1 else 0.0
        return model(torch.cat([a * scale, b.flatten(1) * a[:, :1]], dim=1)) + shift
    return f


def _captum(f, xs, method, n_steps, **kw):
    attr, delta = CaptumIG(f).attribute(xs, n_steps=n_steps, method=method, return_convergence_delta=True, **kw)
    if method == "riemann_trapezoid":
        attr = tuple(a / captum_trapezoid_factor(n_steps) for a in attr)
    return attr, delta


def _close(ours, ref, **tol):
    assert isinstance(ours, tuple) and len(ours) == len(ref)
    for a, r in zip(ours, ref):
        assert a.shape == r.shape
        torch.testing.assert_close(a, r, **tol)


@pytest.mark.parametrize("method", METHODS)
def test_tuple_baselines_equal_captum(method):
    f, xs = _forward(_model()), _two_inputs()
    gen = torch.Generator().manual_seed(2)
    bases = (0.3 * torch.randn(B, 6, generator=gen, dtype=torch.float64),
             0.3 * torch.randn(1, 2, 3, generator=gen, dtype=torch.float64))
    ours = IntegratedGradients(f).attribute(xs, baselines=bases, target=2, n_steps=12, method=method)
    ref, delta = _captum(f, xs, method, 12, baselines=bases, target=2)
    _close(ours.attributions, ref, **TOL)
    if method != "riemann_trapezoid":
        torch.testing.assert_close(ours.completeness_error, delta, **TOL)
    with torch.no_grad():
        diff = f(*xs)[:, 2] - f(bases[0], bases[1].expand(B, 2, 3))[:, 2]
    torch.testing.assert_close(ours.output_difference, diff, rtol=1e-12, atol=1e-12)
    total = ours.attributions[0].sum(1) + ours.attributions[1].sum((1, 2))
    torch.testing.assert_close(ours.completeness_error, total - diff, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("baselines", [(0.5, -1.0), (None, 0.25), (0.5, torch.full((B, 2, 3), 0.1))])
def test_scalar_and_mixed_baselines_equal_captum(baselines):
    f, xs = _forward(_model()), _two_inputs(3)
    captum_bases = tuple(0.0 if b is None else b for b in baselines)
    ours = IntegratedGradients(f).attribute(xs, baselines=baselines, target=1, n_steps=16)
    ref, delta = _captum(f, xs, "gausslegendre", 16, baselines=captum_bases, target=1)
    _close(ours.attributions, ref, **TOL)
    torch.testing.assert_close(ours.completeness_error, delta, **TOL)


def test_one_number_is_the_baseline_of_every_input():
    f, xs = _forward(_model()), _two_inputs(4)
    one = IntegratedGradients(f).attribute(xs, baselines=0.2, target=0, n_steps=10)
    each = IntegratedGradients(f).attribute(xs, baselines=(0.2, 0.2), target=0, n_steps=10)
    _close(one.attributions, each.attributions, rtol=0, atol=0)
    ref, _ = _captum(f, xs, "gausslegendre", 10, baselines=(0.2, 0.2), target=0)
    _close(one.attributions, ref, **TOL)


def test_additional_forward_args_and_chunks_equal_captum():
    f, xs = _forward(_model()), _two_inputs(5)
    scale = torch.tensor([0.5, 1.0, 2.0, -1.0], dtype=torch.float64)
    per_example = torch.tensor([4, 0, 2, 1])
    ref, delta = _captum(f, xs, "gausslegendre", 9, target=per_example, additional_forward_args=(scale, 3.0))
    for bs in (None, 3, 8, 1000):
        got = IntegratedGradients(f).attribute(xs, target=per_example, n_steps=9, internal_batch_size=bs,
                                               additional_forward_args=(scale, 3.0))
        _close(got.attributions, ref, **TOL)
        torch.testing.assert_close(got.completeness_error, delta, **TOL)


def test_chunks_bound_the_rows_of_every_input():
    model, xs = _model(), _two_inputs(6)
    rows = []

    def f(a, b):
        assert a.shape[0] == b.shape[0] and a.shape[1:] == (6,) and b.shape[1:] == (2, 3)
        rows.append(a.shape[0])
        return _forward(model)(a, b)

    IntegratedGradients(f).attribute(xs, target=0, n_steps=10, internal_batch_size=9)
    assert max(rows[:-1]) <= 9 and sum(rows[:-1]) == 10 * B and rows[-1] == 2 * B


def test_a_one_tuple_equals_the_tensor_and_sets_of_baselines_average():
    model, (x, _) = _model(), _two_inputs(7)
    g = lambda a: model(torch.cat([a, a], 1))                                        # noqa: E731
    single = IntegratedGradients(g).attribute(x, baselines=0.1, target=3, n_steps=8)
    one = IntegratedGradients(g).attribute((x,), baselines=(0.1,), target=3, n_steps=8)
    torch.testing.assert_close(one.attributions[0], single.attributions, rtol=1e-12, atol=1e-12)
    # a set of K = 3 baselines for each input: the mean of three Captum runs
    f, xs = _forward(model), _two_inputs(8)
    gen = torch.Generator().manual_seed(9)
    sets = (torch.randn(3, 1, 6, generator=gen, dtype=torch.float64),
            torch.randn(3, B, 2, 3, generator=gen, dtype=torch.float64))
    got = IntegratedGradients(f).attribute(xs, baselines=sets, target=2, n_steps=8)
    runs = [_captum(f, xs, "gausslegendre", 8, baselines=(sets[0][k], sets[1][k]), target=2)[0] for k in range(3)]
    for j in range(2):
        torch.testing.assert_close(got.attributions[j], torch.stack([r[j] for r in runs]).mean(0), **TOL)
