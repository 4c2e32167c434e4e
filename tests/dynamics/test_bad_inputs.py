"""Every public name of taskloss.dynamics meets bad input with a clear exception: γ ≤ 0, h ≤ 0, NaN gradients,
non-scalar losses, empty parameter lists, mismatched shapes. The walk covers ``__all__``: a new public function
without bad-input cases here fails ``test_every_public_name_is_walked``."""
from __future__ import annotations

import math

import pytest
import torch

import taskloss.dynamics as dyn

D = torch.float64
# Result containers and constants take no user input.
NOT_CALLABLE_WITH_INPUT = {"CLIP_MODES", "SmoothnessSample", "EigenResult", "SmoothnessFit", "FlowResult"}


def _with_grad(value=1.0):
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.full((3,), value)
    return p


def quad(t):
    return 0.5 * (t ** 2).sum()


def vec_loss(t):
    return t ** 2                    # not reduced: a non-scalar loss


def _sgd_nan_step():
    p = _with_grad(math.nan)
    dyn.ClippedSGD([p], lr=0.1, gamma=1.0).step()


def _sgd_no_grad_step():
    dyn.ClippedSGD([torch.ones(2, requires_grad=True)], lr=0.1).step()


def _probe_before_without_grad():
    dyn.TrajectorySmoothness([torch.ones(2, requires_grad=True)]).before_step()


def _probe_after_first():
    dyn.TrajectorySmoothness([_with_grad()]).after_step(lambda: torch.tensor(1.0))


def _probe_nonscalar():
    p = torch.ones(3, requires_grad=True)
    probe = dyn.TrajectorySmoothness([p])
    (p ** 2).sum().backward()
    probe.before_step()
    with torch.no_grad():
        p.sub_(0.1)
    probe.after_step(lambda: p ** 2)


def _leaf():
    return torch.ones(3, dtype=D, requires_grad=True)


def _native_kernels_with_argument():
    with dyn.native_kernels(True):
        pass


def _per_example(inputs, targets, loss=torch.nn.functional.cross_entropy):
    return dyn.per_example_gradient_penalty(torch.nn.Linear(3, 2), loss, inputs, targets)


x3, y3 = torch.randn(4, 3), torch.randint(0, 2, (4,))
ONES = torch.ones(3, dtype=D)

CASES = {
    "clip_coefficient": [
        (lambda: dyn.clip_coefficient(1.0, 0.0), ValueError, "gamma"),
        (lambda: dyn.clip_coefficient(1.0, -2.0, "soft"), ValueError, "gamma"),
        (lambda: dyn.clip_coefficient(1.0, math.nan), ValueError, "gamma"),
        (lambda: dyn.clip_coefficient(math.nan, 1.0), ValueError, "NaN"),
        (lambda: dyn.clip_coefficient(torch.tensor([-1.0]), 1.0), ValueError, "norm"),
        (lambda: dyn.clip_coefficient(torch.tensor([1]), 1.0), TypeError, "floating"),
        (lambda: dyn.clip_coefficient(1.0, 1.0, "medium"), ValueError, "mode"),
        (lambda: dyn.clip_coefficient(1.0, 1.0, eps=-1.0), ValueError, "eps"),
    ],
    "clip_grad_": [
        (lambda: dyn.clip_grad_([], 1.0), ValueError, "empty"),
        (lambda: dyn.clip_grad_([torch.ones(2, requires_grad=True)], 1.0), ValueError, "gradient"),
        (lambda: dyn.clip_grad_([_with_grad(math.nan)], 1.0), ValueError, "NaN"),
        (lambda: dyn.clip_grad_([_with_grad(math.inf)], 1.0, per_tensor=True), ValueError, "NaN or inf"),
        (lambda: dyn.clip_grad_([_with_grad()], 0.0), ValueError, "gamma"),
        (lambda: dyn.clip_grad_([_with_grad()], 1.0, norm_type=0.0), ValueError, "norm_type"),
        (lambda: dyn.clip_grad_(["not a tensor"], 1.0), TypeError, "tensors"),
    ],
    "ClippedSGD": [
        (lambda: dyn.ClippedSGD([], lr=0.1), ValueError, "empty"),
        (lambda: dyn.ClippedSGD([_with_grad()], lr=0.0), ValueError, "lr"),
        (lambda: dyn.ClippedSGD([_with_grad()], lr=0.1, gamma=-1.0), ValueError, "gamma"),
        (lambda: dyn.ClippedSGD([_with_grad()], lr=0.1, momentum=1.0), ValueError, "momentum"),
        (lambda: dyn.ClippedSGD([_with_grad()], lr=0.1, mode="x"), ValueError, "mode"),
        (_sgd_nan_step, ValueError, "NaN"),
        (_sgd_no_grad_step, ValueError, "no gradients"),
    ],
    "native_kernels": [(_native_kernels_with_argument, TypeError, "argument")],
    "loss_gradient": [
        (lambda: dyn.loss_gradient(vec_loss, ONES), ValueError, "scalar"),
        (lambda: dyn.loss_gradient(quad, torch.tensor([1.0, math.nan])), ValueError, "NaN"),
        (lambda: dyn.loss_gradient(quad, {}), ValueError, "empty"),
        (lambda: dyn.loss_gradient(quad, torch.ones(0)), ValueError, "empty"),
        (lambda: dyn.loss_gradient(quad, torch.ones(3, dtype=torch.long)), TypeError, "floating"),
        (lambda: dyn.loss_gradient(lambda t: t.sum() * math.nan, ONES), ValueError, "not finite"),
        (lambda: dyn.loss_gradient(lambda t: t.sqrt().sum(), -ONES), ValueError, "not finite"),
        (lambda: dyn.loss_gradient("quad", ONES), TypeError, "callable"),
    ],
    "hessian_vector_product": [
        (lambda: dyn.hessian_vector_product(quad, ONES, torch.ones(2, dtype=D)), ValueError, "shape"),
        (lambda: dyn.hessian_vector_product(vec_loss, ONES, ONES), ValueError, "scalar"),
        (lambda: dyn.hessian_vector_product(quad, {"a": ONES}, {"b": ONES}), ValueError, "keys"),
        (lambda: dyn.hessian_vector_product(quad, ONES, ONES * math.nan), ValueError, "NaN"),
    ],
    "local_smoothness": [
        (lambda: dyn.local_smoothness(quad, ONES, ONES.clone()), ValueError, "did not move"),
        (lambda: dyn.local_smoothness(quad, ONES, torch.ones(4, dtype=D)), ValueError, "shape"),
        (lambda: dyn.local_smoothness(vec_loss, ONES, 2 * ONES), ValueError, "scalar"),
    ],
    "TrajectorySmoothness": [
        (lambda: dyn.TrajectorySmoothness([]), ValueError, "empty"),
        (lambda: dyn.TrajectorySmoothness([torch.ones(2, dtype=torch.long)]), TypeError, "floating"),
        (_probe_before_without_grad, ValueError, "no parameter has a gradient"),
        (_probe_after_first, RuntimeError, "before_step"),
        (_probe_nonscalar, ValueError, "scalar"),
    ],
    "top_hessian_eigenvalue": [
        (lambda: dyn.top_hessian_eigenvalue(quad, ONES, which="smallest"), ValueError, "which"),
        (lambda: dyn.top_hessian_eigenvalue(quad, ONES, max_iter=0), ValueError, "max_iter"),
        (lambda: dyn.top_hessian_eigenvalue(quad, ONES, tol=0.0), ValueError, "tol"),
        (lambda: dyn.top_hessian_eigenvalue(vec_loss, ONES), ValueError, "scalar"),
    ],
    "fit_l0_l1": [
        (lambda: dyn.fit_l0_l1([1.0, 2.0], [1.0]), ValueError, "same length"),
        (lambda: dyn.fit_l0_l1([1.0], [1.0]), ValueError, "at least 2"),
        (lambda: dyn.fit_l0_l1([1.0, math.nan], [1.0, 2.0]), ValueError, "finite"),
        (lambda: dyn.fit_l0_l1([1.0, 2.0], [-1.0, 2.0]), ValueError, ">= 0"),
        (lambda: dyn.fit_l0_l1([1.0, 1.0], [1.0, 2.0]), ValueError, "equal"),
    ],
    "gradient_norm_penalty": [
        (lambda: dyn.gradient_norm_penalty(_leaf() ** 2, [_leaf()]), ValueError, "scalar"),
        (lambda: dyn.gradient_norm_penalty(torch.tensor(1.0, requires_grad=True), []), ValueError, "empty"),
        (lambda: dyn.gradient_norm_penalty(torch.tensor(math.nan, requires_grad=True), [ONES]), ValueError,
         "not finite"),
        (lambda: dyn.gradient_norm_penalty(1.0, [ONES]), TypeError, "tensor"),
    ],
    "per_example_gradient_penalty": [
        (lambda: _per_example(x3[:0], y3[:0]), ValueError, "empty"),
        (lambda: _per_example(x3, y3[:3]), ValueError, "batch size"),
        (lambda: _per_example(x3, y3, lambda o, y: torch.nn.functional.cross_entropy(o, y, reduction="none")),
         ValueError, "scalar"),
        (lambda: _per_example(x3 * math.nan, y3), ValueError, "NaN"),
        (lambda: dyn.per_example_gradient_penalty("model", None, x3, y3), TypeError, "nn.Module"),
    ],
    "modified_loss": [
        (lambda: dyn.modified_loss(quad, ONES, 0.0), ValueError, "h"),
        (lambda: dyn.modified_loss(quad, ONES, -0.1), ValueError, "h"),
        (lambda: dyn.modified_loss(quad, ONES, math.nan), ValueError, "h"),
        (lambda: dyn.modified_loss(vec_loss, ONES, 0.1), ValueError, "scalar"),
        (lambda: dyn.modified_loss(quad, ONES * math.nan, 0.1), ValueError, "NaN"),
    ],
    "modified_gradient": [
        (lambda: dyn.modified_gradient(quad, ONES, -0.1), ValueError, "h"),
        (lambda: dyn.modified_gradient(quad, ONES * math.inf, 0.1), ValueError, "NaN or inf"),
        (lambda: dyn.modified_gradient(vec_loss, ONES, 0.1), ValueError, "scalar"),
        (lambda: dyn.modified_gradient(quad, {}, 0.1), ValueError, "empty"),
    ],
    "integrate_flow": [
        (lambda: dyn.integrate_flow(lambda y: -y, ONES, 0.0), ValueError, "T"),
        (lambda: dyn.integrate_flow(lambda y: -y, ONES, -1.0), ValueError, "T"),
        (lambda: dyn.integrate_flow(lambda y: -y[:2], ONES, 1.0), ValueError, "shaped like"),
        (lambda: dyn.integrate_flow(lambda y: -y, ONES * math.nan, 1.0), ValueError, "NaN"),
        (lambda: dyn.integrate_flow(lambda y: -y, ONES, 1.0, rtol=0.0, atol=0.0), ValueError, "both be 0"),
        (lambda: dyn.integrate_flow(lambda y: y * math.nan, ONES, 1.0), ValueError, "NaN"),
        (lambda: dyn.integrate_flow(lambda y: -y, ONES, 1.0, n_steps=0), ValueError, "n_steps"),
    ],
    "gradient_flow": [
        (lambda: dyn.gradient_flow(quad, ONES, 1.0, h=-0.5), ValueError, "h"),
        (lambda: dyn.gradient_flow(quad, ONES, 0.0), ValueError, "T"),
        (lambda: dyn.gradient_flow(quad, {}, 1.0), ValueError, "empty"),
        (lambda: dyn.gradient_flow(vec_loss, ONES, 1.0), ValueError, "scalar"),
    ],
    "flooding": [
        (lambda: dyn.flooding(torch.tensor(1.0), -0.1), ValueError, "b"),
        (lambda: dyn.flooding(torch.tensor(1.0), math.inf), ValueError, "b"),
        (lambda: dyn.flooding(torch.ones(3), 0.1), ValueError, "scalar"),
        (lambda: dyn.flooding(torch.tensor(math.nan), 0.1), ValueError, "not finite"),
    ],
}


def test_every_public_name_is_walked():
    public = set(dyn.__all__) - NOT_CALLABLE_WITH_INPUT
    assert public == set(CASES), f"missing bad-input cases: {sorted(public - set(CASES))}; " \
                                 f"stale: {sorted(set(CASES) - public)}"


@pytest.mark.parametrize("name, i", [(n, i) for n, cases in CASES.items() for i in range(len(cases))],
                         ids=lambda v: str(v))
def test_bad_input_raises_a_clear_error(name, i):
    call, exc, match = CASES[name][i]
    with pytest.raises(exc, match=match):
        call()
