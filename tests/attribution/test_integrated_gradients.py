"""IntegratedGradients against Captum's (the reference implementation) on an MLP and a CNN, for every rule, chunked
and unchunked, with every form of target and baseline; expected gradients against the mean of Captum runs.

Captum computes in the inputs' dtype but casts the quadrature weights to float32, so float64 runs agree to about
1e-9, well inside the 1e-5 asked for. Captum's ``riemann_trapezoid`` weights sum to (m−1)/m (see
``taskloss.attribution.quadrature``): its attributions are compared after that factor.
"""
from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients as CaptumIG

from taskloss.attribution import METHODS, IntegratedGradients, baseline_set, captum_trapezoid_factor
from taskloss.models import MLP, SmallCNN

TOL = dict(rtol=1e-5, atol=1e-5)


def _mlp(seed=0, activation="tanh"):
    torch.manual_seed(seed)
    return MLP(12, (16, 16), 5, activation=activation).double().eval()


def _cnn(seed=0):
    torch.manual_seed(seed)
    return SmallCNN(width=4).double().eval()


def _captum(model, x, method, n_steps, **kw):
    attr, delta = CaptumIG(model).attribute(x, n_steps=n_steps, method=method, return_convergence_delta=True, **kw)
    if method == "riemann_trapezoid":        # Captum's weights are (m−1)/m of the trapezoid rule's
        attr = attr / captum_trapezoid_factor(n_steps)
    return attr, delta


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["mlp_tanh", "mlp_relu", "cnn"])
def test_equals_captum(method, kind):
    gen = torch.Generator().manual_seed(1)
    if kind == "cnn":
        model, x = _cnn(), torch.rand(4, 1, 8, 8, generator=gen, dtype=torch.float64)
    else:
        model, x = _mlp(activation=kind.split("_")[1]), torch.randn(4, 12, generator=gen, dtype=torch.float64)
    base = 0.3 * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    ours = IntegratedGradients(model).attribute(x, baselines=base, target=2, n_steps=16, method=method)
    ref, delta = _captum(model, x, method, 16, baselines=base, target=2)
    torch.testing.assert_close(ours.attributions, ref, **TOL)
    if method != "riemann_trapezoid":        # same weights → same convergence delta
        torch.testing.assert_close(ours.completeness_error, delta, **TOL)
    with torch.no_grad():
        f = model(x)[:, 2] - model(base)[:, 2]
    torch.testing.assert_close(ours.output_difference, f, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.completeness_error, ours.attributions.sum(1 if x.ndim == 2 else (1, 2, 3)) - f,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batch_size", [1, 3, 7, 20, 1000])
def test_chunking_does_not_change_the_result(batch_size):
    model, x = _mlp(), torch.randn(5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = IntegratedGradients(model).attribute(x, target=1, n_steps=9, method="riemann_trapezoid")
    part = IntegratedGradients(model).attribute(x, target=1, n_steps=9, method="riemann_trapezoid",
                                                internal_batch_size=batch_size)
    # chunks change only the order of the float64 sums
    for a, b in zip(full, part):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_chunks_bound_the_rows_per_forward_pass():
    model, x = _mlp(), torch.randn(6, 12, dtype=torch.float64)
    rows = []

    def fwd(z):
        rows.append(z.shape[0])
        return model(z)

    IntegratedGradients(fwd).attribute(x, target=0, n_steps=10, internal_batch_size=14)
    path, ends = rows[:-1], rows[-1]      # the last call: F(x) and F(x′) together, for the completeness error
    assert max(path) <= 14 and sum(path) == 60 and ends == 12
    rows.clear()
    IntegratedGradients(fwd).attribute(x, target=0, n_steps=10, internal_batch_size=4)   # one step > 4 rows
    assert max(rows) <= 4 and sum(rows) == 60 + 12


def test_targets_per_example_tuple_and_function_match_captum():
    model, x = _mlp(), torch.randn(3, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ig = IntegratedGradients(model)
    per_example = torch.tensor([4, 0, 2])
    ref, _ = _captum(model, x, "gausslegendre", 12, target=per_example)
    torch.testing.assert_close(ig.attribute(x, target=per_example, n_steps=12).attributions, ref, **TOL)
    torch.testing.assert_close(ig.attribute(x, target=[4, 0, 2], n_steps=12).attributions, ref, **TOL)
    ref_t, _ = _captum(model, x, "gausslegendre", 12, target=(1,))
    torch.testing.assert_close(ig.attribute(x, target=(1,), n_steps=12).attributions, ref_t, **TOL)
    # a scalar function of the output: log-probability of class 3
    fn = lambda out: out.log_softmax(-1)[:, 3]                                  # noqa: E731
    ref_f, _ = _captum(lambda z: model(z).log_softmax(-1), x, "gausslegendre", 12, target=3)
    got = ig.attribute(x, target=fn, n_steps=12)
    torch.testing.assert_close(got.attributions, ref_f, **TOL)
    assert got.completeness_error.abs().max() < 1e-8


def test_scalar_output_needs_no_target_and_constant_baseline():
    model = _mlp()
    f = lambda z: model(z).logsumexp(-1)                                        # noqa: E731
    x = torch.randn(2, 12, dtype=torch.float64)
    ref, _ = _captum(f, x, "riemann_middle", 20, baselines=0.5)
    torch.testing.assert_close(IntegratedGradients(f).attribute(x, baselines=0.5, n_steps=20,
                                                               method="riemann_middle").attributions, ref, **TOL)


def test_additional_forward_args_follow_their_example():
    model = _mlp()
    f = lambda z, scale, shift: model(z * scale[:, None]) + shift                # noqa: E731
    x, scale = torch.randn(3, 12, dtype=torch.float64), torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    ref, _ = _captum(f, x, "gausslegendre", 8, target=1, additional_forward_args=(scale, 3.0))
    got = IntegratedGradients(f).attribute(x, target=1, n_steps=8, additional_forward_args=(scale, 3.0),
                                           internal_batch_size=5)
    torch.testing.assert_close(got.attributions, ref, **TOL)


def test_expected_gradients_is_the_mean_over_the_baseline_set():
    model = _cnn()
    gen = torch.Generator().manual_seed(4)
    x, data = torch.rand(3, 1, 8, 8, generator=gen, dtype=torch.float64), torch.rand(30, 1, 8, 8, generator=gen,
                                                                                      dtype=torch.float64)
    refs = baseline_set(data, 4, generator=gen)                                   # [4, 1, 1, 8, 8]
    got = IntegratedGradients(model).attribute(x, baselines=refs, target=5, n_steps=10, internal_batch_size=7)
    runs = [_captum(model, x, "gausslegendre", 10, baselines=refs[k], target=5)[0] for k in range(4)]
    torch.testing.assert_close(got.attributions, torch.stack(runs).mean(0), **TOL)
    with torch.no_grad():
        f = model(x)[:, 5] - torch.stack([model(refs[k])[:, 5].expand(3) for k in range(4)]).mean(0)
    torch.testing.assert_close(got.output_difference, f, rtol=1e-12, atol=1e-12)
    # per-example sets [K, B, ...] work too
    per = data[:8].view(2, 4, 1, 8, 8)[:, :3]
    got2 = IntegratedGradients(model).attribute(x, baselines=per, target=5, n_steps=10)
    runs2 = [_captum(model, x, "gausslegendre", 10, baselines=per[k], target=5)[0] for k in range(2)]
    torch.testing.assert_close(got2.attributions, torch.stack(runs2).mean(0), **TOL)


def test_inputs_that_require_grad_are_not_part_of_the_graph():
    model, x = _mlp(), torch.randn(2, 12, dtype=torch.float64, requires_grad=True)
    base = torch.zeros(2, 12, dtype=torch.float64, requires_grad=True)
    got = IntegratedGradients(model).attribute(x, baselines=base, target=0, n_steps=6)
    assert not got.attributions.requires_grad and x.grad is None
    ref = IntegratedGradients(model).attribute(x.detach(), target=0, n_steps=6)
    torch.testing.assert_close(got.attributions, ref.attributions, rtol=1e-12, atol=1e-14)


def test_float32_model_follows_its_inputs():
    torch.manual_seed(0)
    model = SmallCNN(width=4).eval()
    x = torch.rand(2, 1, 8, 8)
    got = IntegratedGradients(model).attribute(x, baselines=torch.zeros(1, 1, 8, 8, dtype=torch.float64), target=0)
    assert got.attributions.dtype == torch.float32 and got.attributions.shape == x.shape
    ref, _ = _captum(model, x, "gausslegendre", 50, target=0)
    torch.testing.assert_close(got.attributions, ref, rtol=1e-4, atol=1e-5)   # float32 sums in another order


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model, x = _cnn(), torch.rand(3, 1, 8, 8, dtype=torch.float64)
    cpu = IntegratedGradients(model).attribute(x, target=1, n_steps=12)
    gpu = IntegratedGradients(model.cuda()).attribute(x.cuda(), target=1, n_steps=12, internal_batch_size=8)
    assert gpu.attributions.device.type == "cuda"
    torch.testing.assert_close(gpu.attributions.cpu(), cpu.attributions, rtol=1e-9, atol=1e-9)
