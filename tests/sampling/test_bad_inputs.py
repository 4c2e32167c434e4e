"""Bad input across ``taskloss.sampling``'s public API: every name in ``__all__`` is walked with NaN, empty,
wrong-shape, wrong-dtype and out-of-range inputs and must raise a clear exception (type and message); the ε-ball
formulas stay finite (or refuse) for extreme ‖g‖ε/α instead of returning NaN."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import taskloss.sampling as S

NAN, INF = float("nan"), float("inf")
D = torch.float64
LT, LQ, VALUES = torch.zeros(3), torch.zeros(3), torch.randn(3, 2)
THETA, DELTAS = torch.zeros(2), torch.randn(4, 2, generator=torch.Generator().manual_seed(0))
QUAD = S.vmap_loss(lambda t: (t ** 2).sum())
PROP = S.GaussianProposal(torch.zeros(2), scale=1.0)

CASES = {
    "self_normalized_is": [
        ("NaN", lambda: S.self_normalized_is(torch.tensor([NAN, 0, 0.0]), LQ, VALUES), ValueError, "contains NaN"),
        ("out-of-range +inf", lambda: S.self_normalized_is(torch.tensor([INF, 0, 0.0]), LQ, VALUES), ValueError,
         r"\+inf"),
        ("out-of-range all -inf", lambda: S.self_normalized_is(torch.full((3,), -INF), LQ, VALUES), ValueError,
         "zero target density"),
        ("empty", lambda: S.self_normalized_is(torch.zeros(0), torch.zeros(0), torch.zeros(0, 2)), ValueError,
         "K >= 1"),
        ("wrong-shape", lambda: S.self_normalized_is(LT, torch.zeros(4), VALUES), ValueError, "shape"),
        ("wrong-dtype", lambda: S.self_normalized_is(LT.long(), LQ, VALUES), TypeError, "floating-point"),
        ("NaN values", lambda: S.self_normalized_is(LT, LQ, torch.full((3, 2), NAN)), ValueError, "NaN"),
    ],
    "normalized_log_weights": [
        ("NaN", lambda: S.normalized_log_weights(torch.tensor([NAN, 0, 0.0]), LQ), ValueError, "contains NaN"),
        ("out-of-range all -inf", lambda: S.normalized_log_weights(torch.full((3,), -INF), LQ), ValueError,
         "zero target density"),
        ("out-of-range +inf", lambda: S.normalized_log_weights(torch.tensor([INF, 0, 0.0]), LQ), ValueError, r"\+inf"),
        ("empty", lambda: S.normalized_log_weights(torch.zeros(0), torch.zeros(0)), ValueError, "K >= 1"),
        ("wrong-shape", lambda: S.normalized_log_weights(LT, torch.zeros(4)), ValueError, "shape"),
        ("wrong-dtype", lambda: S.normalized_log_weights(LT.long(), LQ), TypeError, "floating-point"),
        ("out-of-range log_proposal", lambda: S.normalized_log_weights(LT, torch.tensor([-INF, 0, 0.0])), ValueError,
         "log_proposal contains NaN or inf"),
    ],
    "effective_sample_size": [
        ("NaN", lambda: S.effective_sample_size(torch.tensor([NAN, 1.0])), ValueError, "finite non-negative"),
        ("empty", lambda: S.effective_sample_size(torch.zeros(0)), ValueError, "non-empty 1-D"),
        ("wrong-shape", lambda: S.effective_sample_size(torch.ones(2, 2) / 4), ValueError, "1-D"),
        ("out-of-range", lambda: S.effective_sample_size(torch.tensor([0.5, 0.6])), ValueError, "sum to 1"),
        ("wrong-dtype", lambda: S.effective_sample_size("w"), TypeError, "weights must be real numbers"),
    ],
    "log_target": [
        ("out-of-range alpha", lambda: S.log_target(QUAD, THETA, DELTAS, 0.0), ValueError, "alpha must be > 0"),
        ("NaN alpha", lambda: S.log_target(QUAD, THETA, DELTAS, NAN), ValueError, "alpha must be > 0"),
        ("wrong-shape theta", lambda: S.log_target(QUAD, THETA[None], DELTAS, 1.0), ValueError, "ndim"),
        ("empty deltas", lambda: S.log_target(QUAD, THETA, DELTAS[:0], 1.0), ValueError, "empty"),
        ("wrong-shape deltas", lambda: S.log_target(QUAD, THETA, torch.randn(4, 3), 1.0), ValueError, "dim 3"),
        ("NaN theta", lambda: S.log_target(QUAD, THETA * NAN, DELTAS, 1.0), ValueError, "NaN"),
        ("wrong-shape loss", lambda: S.log_target(lambda x: x, THETA, DELTAS, 1.0), ValueError, r"\[K, d\] -> \[K\]"),
        ("NaN loss", lambda: S.log_target(lambda x: x.sum(1) * NAN, THETA, DELTAS, 1.0), ValueError, "NaN"),
        ("out-of-range radius", lambda: S.log_target(QUAD, THETA, DELTAS, 1.0, radius=0), ValueError,
         "radius must be > 0"),
        ("wrong-dtype theta", lambda: S.log_target(QUAD, THETA.long(), DELTAS, 1.0), TypeError, "floating-point"),
        ("wrong-type loss_fn", lambda: S.log_target(3, THETA, DELTAS, 1.0), TypeError, "loss_fn must be callable"),
    ],
    "vmap_loss": [
        ("out-of-range chunk", lambda: S.vmap_loss(lambda t: t.sum(), chunk_size=0), ValueError,
         "chunk_size must be >= 1"),
        ("wrong-type", lambda: S.vmap_loss(3), TypeError, "must be callable"),
    ],
    "expected_update": [
        ("out-of-range n", lambda: S.expected_update(QUAD, THETA, 1.0, PROP, 0), ValueError, "n_samples must be >= 1"),
        ("wrong-type proposal", lambda: S.expected_update(QUAD, THETA, 1.0, "prop", 2), TypeError, "proposal must"),
        ("wrong-type generator", lambda: S.expected_update(QUAD, THETA, 1.0, PROP, 2, generator=3), TypeError,
         "generator must be"),
    ],
    "newton_direction": [
        ("out-of-range singular", lambda: S.newton_direction(torch.zeros(2, 2), torch.ones(2)), ValueError, "singular"),
        ("NaN", lambda: S.newton_direction(torch.eye(2), torch.ones(2) * NAN), ValueError, "NaN"),
        ("wrong-shape", lambda: S.newton_direction(torch.eye(2), torch.ones(3)), ValueError, r"\[\.\.\., d\]"),
        ("wrong-dtype", lambda: S.newton_direction(torch.eye(2), torch.ones(2).long()), TypeError, "floating-point"),
        ("empty", lambda: S.newton_direction(torch.eye(0), torch.ones(0)), ValueError, r"\[\.\.\., d\]"),
    ],
    "gaussian_update_distribution": [
        ("out-of-range indefinite", lambda: S.gaussian_update_distribution(-torch.eye(2), torch.ones(2), 1.0),
         ValueError, "positive definite"),
        ("wrong-shape asymmetric", lambda: S.gaussian_update_distribution(torch.tensor([[1.0, 2], [0, 1]]), torch.ones(2), 1.0),
         ValueError, "symmetric"),
        ("out-of-range alpha", lambda: S.gaussian_update_distribution(torch.eye(2), torch.ones(2), -1.0),
         ValueError, "alpha must be > 0"),
    ],
    "GaussianProposal": [
        ("out-of-range scale", lambda: S.GaussianProposal(torch.zeros(2), scale=0.0), ValueError, "scale must be > 0"),
        ("wrong-shape both", lambda: S.GaussianProposal(torch.zeros(2), scale=1.0, cov=torch.eye(2)), ValueError,
         "exactly one"),
        ("NaN mean", lambda: S.GaussianProposal(torch.full((2,), NAN), scale=1.0), ValueError, "NaN"),
        ("empty mean", lambda: S.GaussianProposal(torch.zeros(0), scale=1.0), ValueError, "empty"),
        ("wrong-shape cov", lambda: S.GaussianProposal(torch.zeros(2), cov=torch.eye(3)), ValueError, "shape"),
        ("out-of-range cov", lambda: S.GaussianProposal(torch.zeros(2), cov=-torch.eye(2)), ValueError,
         "positive definite"),
        ("out-of-range scale tensor", lambda: S.GaussianProposal(torch.zeros(2), scale=torch.tensor([1.0, -1.0])),
         ValueError, "positive"),
        ("wrong-dtype scale", lambda: S.GaussianProposal(torch.zeros(2), scale="1"), TypeError, "number"),
        ("out-of-range sample n", lambda: PROP.sample(0), ValueError, "n must be >= 1"),
        ("wrong-shape log_prob", lambda: PROP.log_prob(torch.zeros(3)), ValueError, r"\[\.\.\., 2\]"),
        ("NaN log_prob", lambda: PROP.log_prob(torch.full((2,), NAN)), ValueError, "NaN"),
        ("wrong-dtype log_prob", lambda: PROP.log_prob(torch.zeros(2).long()), TypeError, "floating-point"),
    ],
    "UniformBallProposal": [
        ("out-of-range radius", lambda: S.UniformBallProposal(torch.zeros(2), 0.0), ValueError, "radius must be > 0"),
        ("NaN center", lambda: S.UniformBallProposal(torch.full((2,), NAN), 1.0), ValueError, "NaN"),
        ("wrong-shape log_prob", lambda: S.UniformBallProposal(torch.zeros(2), 1.0).log_prob(torch.zeros(3)),
         ValueError, r"\[\.\.\., 2\]"),
    ],
    "GaussianMixtureProposal": [
        ("empty", lambda: S.GaussianMixtureProposal([], []), ValueError, "non-empty"),
        ("out-of-range weights", lambda: S.GaussianMixtureProposal([PROP, PROP], [1.0, -1.0]), ValueError,
         "non-negative"),
        ("NaN weights", lambda: S.GaussianMixtureProposal([PROP, PROP], [1.0, NAN]), ValueError, "finite"),
        ("wrong-shape weights", lambda: S.GaussianMixtureProposal([PROP, PROP], [1.0]), ValueError, "2 finite"),
        ("wrong-shape components", lambda: S.GaussianMixtureProposal(
            [PROP, S.GaussianProposal(torch.zeros(3), scale=1.0)], [1.0, 1.0]), ValueError, "same dimension"),
        ("out-of-range mix", lambda: S.GaussianMixtureProposal.mgs(torch.zeros(2), 1.0, 1.5), ValueError,
         r"mix must be a number in \[0, 1\]"),
        ("NaN guide", lambda: S.GaussianMixtureProposal.mgs(torch.full((2,), NAN), 1.0, 0.5), ValueError, "NaN"),
    ],
    "log_ball_volume": [
        ("out-of-range dim", lambda: S.log_ball_volume(0, 1.0), ValueError, "dim must be >= 1"),
        ("NaN radius", lambda: S.log_ball_volume(2, NAN), ValueError, "radius must be > 0"),
    ],
    "ball_log_partition": [
        ("NaN", lambda: S.ball_log_partition(NAN, 1.0, 1.0, 2), ValueError, "g_norm must be finite"),
        ("out-of-range negative", lambda: S.ball_log_partition(-1.0, 1.0, 1.0, 2), ValueError, "g_norm must be >= 0"),
        ("out-of-range alpha", lambda: S.ball_log_partition(1.0, 0.0, 1.0, 2), ValueError, "alpha must be > 0"),
        ("wrong-dtype", lambda: S.ball_log_partition("1", 1.0, 1.0, 2), TypeError, "number or a tensor"),
        ("wrong-dtype bool", lambda: S.ball_log_partition(torch.tensor([True]), 1.0, 1.0, 2), TypeError,
         "real tensor"),
        ("wrong-dtype dim", lambda: S.ball_log_partition(1.0, 1.0, 1.0, 2.5), TypeError, "dim must be an int"),
        ("out-of-range overflow", lambda: S.ball_log_partition(1e300, 1e-300, 1.0, 2), ValueError, "overflows"),
        ("wrong-shape", lambda: S.ball_log_partition(torch.ones(3, dtype=D), torch.ones(2, dtype=D), 1.0, 2),
         ValueError, "do not broadcast"),
    ],
    "ball_partition": [("out-of-range overflow", lambda: S.ball_partition(1e4, 1.0, 1.0, 2), OverflowError,
                        "use ball_log_partition")],
    "ball_log_partition_derivative": [
        ("out-of-range radius", lambda: S.ball_log_partition_derivative(1.0, 1.0, 0.0, 2), ValueError, "radius must be > 0"),
        ("NaN alpha", lambda: S.ball_log_partition_derivative(1.0, NAN, 1.0, 2), ValueError, "alpha must be finite"),
    ],
    "ball_expected_update": [
        ("NaN", lambda: S.ball_expected_update(torch.tensor([NAN, 1.0]), 1.0, 1.0), ValueError, "NaN"),
        ("empty", lambda: S.ball_expected_update(torch.zeros(0), 1.0, 1.0), ValueError, "d >= 1"),
        ("wrong-dtype", lambda: S.ball_expected_update(torch.zeros(2).long(), 1.0, 1.0), TypeError, "floating-point"),
        ("wrong-shape alpha", lambda: S.ball_expected_update(torch.ones(3, 2), torch.ones(2), 1.0), ValueError,
         "do not broadcast"),
    ],
}
EXEMPT = {"SNISResult": "result record of self_normalized_is"}


def test_every_public_name_is_walked():
    assert set(S.__all__) == set(CASES) | set(EXEMPT), set(S.__all__) ^ (set(CASES) | set(EXEMPT))


@pytest.mark.parametrize("name,category,thunk,exc,match",
                         [(n, *c) for n, cases in CASES.items() for c in cases],
                         ids=[f"{n}-{c[0]}" for n, cases in CASES.items() for c in cases])
def test_bad_input_raises_clearly(name, category, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


@pytest.mark.parametrize("dim", [3, 40])
def test_ball_formulas_stay_finite_and_continuous_for_huge_x(dim):
    """Where scipy's scaled Bessel function gives up (x ≳ 1e10), log Z follows the large-x expansion
    log I_ν(x) = x − ½ log(2πx) − (4ν² − 1)/(8x) + O(x⁻²) (NIST DLMF 10.40.1) — no NaN, no jump."""
    nu = dim / 2
    x = torch.tensor([1e6, 1e9, 1e10, 1e12, 1e200], dtype=D)
    got = S.ball_log_partition(x, 1.0, 1.0, dim)
    xn = x.numpy()
    want = nu * np.log(2 * np.pi / xn) + xn - 0.5 * np.log(2 * np.pi * xn) - (4 * nu ** 2 - 1) / (8 * xn)
    assert bool(torch.isfinite(got).all())
    # log Z ≈ x: float64 holds it to ~1e-16·x, so the tolerance is relative (and 1e-6 absolute below 1e10,
    # where the O(x⁻²) remainder of the expansion is already below 1e-11)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-15, atol=1e-6)
    ratio = S.ball_log_partition_derivative(x, 1.0, 1.0, dim)
    assert bool(torch.isfinite(ratio).all()) and bool((ratio <= 1.0).all())
    np.testing.assert_allclose(ratio.numpy(), 1 - (2 * nu + 1) / (2 * xn), rtol=1e-9)  # I_{ν+1}/I_ν, DLMF 10.40.1
    upd = S.ball_expected_update(torch.tensor([[1e200, 0.0], [1e-200, 0.0], [0.0, 0.0]], dtype=D), 1.0, 1.0)
    assert bool(torch.isfinite(upd).all()) and math.isclose(float(upd[0, 0]), -1.0)
