"""The comparison procedure measured before it is trusted: false-positive rates by simulation.

Every verdict in the notebooks comes from :func:`taskloss.results.compare.paired_comparison`. Here it is fed
per-seed differences drawn under the null of its declared estimand, in the outcome shapes the notebooks produce
(normal; heavy-tailed symmetric, t with 2 degrees of freedom; skewed, exponential and lognormal σ = 1 — steps to a
target, divergence-prone final losses, perplexities), at the seed counts the notebooks use, 2,000 replications a
cell, and the share of replications that end in a verdict ("better" or "worse") is the procedure's false-positive
rate. The nominal level is 0.05; a cell passes at ≤ 0.06 (the issue's bound; the simulation's own standard error
at 2,000 replications is 0.005).

`python tests/results/test_calibration.py` prints the table.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from taskloss.results.compare import adjust, paired_comparison

REPS = 2000
SEEDS = (3, 5, 8, 10, 20)          # the notebooks' seed counts (3–5 before this round's, 8–20 after)
BOUND = 0.06


def _null_draws(shape: str, estimand: str, size, rng) -> np.ndarray:
    """Differences whose median (``estimand="median"``/``"win-rate"``) or mean (``"mean"``) is exactly 0."""
    center = {"median": {"exponential": math.log(2), "lognormal": 1.0},
              "mean": {"exponential": 1.0, "lognormal": math.exp(0.5)}}["mean" if estimand == "mean" else "median"]
    if shape == "normal":
        return rng.normal(size=size)
    if shape == "t2":
        return rng.standard_t(2, size=size)
    if shape == "exponential":
        return rng.exponential(size=size) - center["exponential"]
    return rng.lognormal(0.0, 1.0, size=size) - center["lognormal"]


def false_positive_rate(shape: str, n: int, estimand: str, reps: int = REPS, seed: int = 0, **kw) -> float:
    rng = np.random.default_rng([seed, n, ("normal", "t2", "exponential", "lognormal").index(shape)])
    d = _null_draws(shape, estimand, (reps, n), rng)
    zero = np.zeros(n)
    return float(np.mean([paired_comparison(x, zero, estimand=estimand, **kw).verdict != "inconclusive"
                          for x in d]))


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["normal", "t2", "exponential", "lognormal"])
def test_the_median_holds_its_level_on_every_shape(shape):
    """The default procedure (median, exact sign test): ≤ 0.06 in every cell, and no verdict below 6 seeds."""
    rates = {n: false_positive_rate(shape, n, "median") for n in SEEDS}
    assert all(r <= BOUND for r in rates.values()), rates
    assert rates[3] == rates[5] == 0.0, rates          # 2/2^5 > 0.05: the sign test cannot decide


@pytest.mark.parametrize("shape", ["normal", "lognormal"])
def test_the_win_rate_decides_exactly_when_the_median_does(shape):
    """Same sign test, its own interval: on continuous outcomes (no ties) the two estimands' verdicts coincide,
    so the median's rates above are the win rate's too."""
    rng = np.random.default_rng(5)
    d = _null_draws(shape, "median", (400, 10), rng) + 0.6      # some decided, some not
    zero = np.zeros(10)
    for x in d:
        assert (paired_comparison(x, zero).verdict == paired_comparison(x, zero, estimand="win-rate").verdict)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["normal", "t2"])
def test_a_declared_symmetric_mean_holds_its_level(shape):
    """The mean under the declared symmetry (t-test): ≤ 0.06 on normal and heavy-tailed symmetric differences."""
    rates = {n: false_positive_rate(shape, n, "mean", symmetric=True) for n in SEEDS}
    assert all(r <= BOUND for r in rates.values()), rates


@pytest.mark.parametrize("shape", ["exponential", "lognormal"])
def test_an_undeclared_mean_never_decides_and_why(shape):
    """Without the declaration a mean gets no verdict (rate 0); with it, on skewed differences, the t-test would
    declare far more than 5 % — the measured reason it must be declared (the issue measured 0.16–0.18 at
    lognormal σ = 1)."""
    assert false_positive_rate(shape, 10, "mean", reps=300) == 0.0
    forced = false_positive_rate(shape, 5, "mean", symmetric=True)
    assert forced > (0.08 if shape == "exponential" else 0.12), forced


@pytest.mark.slow
def test_holm_over_ten_null_comparisons_holds_the_family_wise_rate():
    """Ten null comparisons of skewed outcomes at 10 seeds, Holm-corrected: P(≥ 1 false verdict) ≤ 0.06 (the
    t-test's was 0.17–0.28)."""
    rng = np.random.default_rng(11)
    zero = np.zeros(10)
    families = 1000
    d = _null_draws("lognormal", "median", (families, 10, 10), rng)
    any_false = 0
    for fam in d:
        comps = adjust([paired_comparison(x, zero) for x in fam], "holm")
        any_false += any(c.verdict_adjusted != "inconclusive" for c in comps)
    assert any_false / families <= BOUND, any_false / families


if __name__ == "__main__":       # the table the module docstring describes
    print("| estimand | shape | " + " | ".join(f"n = {n}" for n in SEEDS) + " |")
    print("|---|---|" + "---|" * len(SEEDS))
    for est, kw, shapes in (("median", {}, ("normal", "t2", "exponential", "lognormal")),
                            ("mean (declared symmetric)", {"symmetric": True},
                             ("normal", "t2", "exponential", "lognormal"))):
        for shape in shapes:
            rates = [false_positive_rate(shape, n, "mean" if est.startswith("mean") else "median", **kw)
                     for n in SEEDS]
            print(f"| {est} | {shape} | " + " | ".join(f"{r:.3f}" for r in rates) + " |")
