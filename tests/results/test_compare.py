"""Paired comparisons (taskloss.results.compare), Run.compare / Run.say, and the plotting helpers."""
from __future__ import annotations

import dataclasses
import math

import matplotlib
import numpy as np
import pytest
from scipy import stats

import taskloss.results.run as tn
from taskloss.results import comparison_table, paired_comparison
from taskloss.results.plotting import bars_with_interval, label_axes, mean_interval, seed_band

matplotlib.use("Agg")


def test_t_interval_and_p_value_match_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 12)
    b = a - 0.3 + rng.normal(0, 0.2, 12)
    c = paired_comparison(a, b, name="A", baseline="B", metric="acc")
    ref = stats.ttest_rel(a, b)
    assert c.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    ci = ref.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert c.effect == pytest.approx(float(np.mean(a - b))) and c.n == 12
    assert c.verdict == "better"                                    # higher accuracy, interval above 0
    assert paired_comparison(a, b, lower_is_better=True).verdict == "worse"
    assert paired_comparison(b, a).verdict == "worse"


def test_interval_covering_zero_is_inconclusive():
    a = [0.50, 0.52, 0.49]
    b = [0.51, 0.50, 0.50]
    c = paired_comparison(a, b)
    assert c.ci_low < 0 < c.ci_high and c.verdict == "inconclusive"
    assert "inconclusive" in c.sentence() and "covers 0" in c.sentence()


def test_three_seeds_need_a_large_consistent_effect():
    # 2 standard errors is not enough with 3 seeds (t_{0.975, 2} = 4.30)
    d = np.array([1.0, 2.0, 3.5])
    a, b = d, np.zeros(3)
    se = d.std(ddof=1) / math.sqrt(3)
    assert d.mean() > 2 * se
    assert paired_comparison(a, b).verdict == ("better" if d.mean() > 4.303 * se else "inconclusive")


def test_identical_differences_and_identical_values():
    """No spread, no t verdict: a zero-width interval with p = 0 would decide from nothing."""
    c = paired_comparison([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert c.ci_low == c.ci_high == 0.5 and math.isnan(c.p_value) and c.verdict == "inconclusive"
    assert "no spread" in c.note and "no spread" in c.sentence()
    c = paired_comparison([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert c.verdict == "inconclusive" and c.p_value == 1.0 and c.note == ""
    # the exact test still applies to a consistent difference: p = 2/2^n
    c = paired_comparison(np.arange(8.0) + 1, np.arange(8.0), method="sign-flip")
    assert c.p_value == pytest.approx(2 / 2 ** 8) and c.verdict == "better"


def test_fewer_than_three_seeds_decide_nothing():
    c = paired_comparison([1.0, 1.1], [0.0, 0.05])
    assert c.verdict == "inconclusive" and "fewer than 3" in c.note


def test_sign_flip_matches_an_explicit_enumeration_and_inverts_to_its_interval():
    import itertools

    rng = np.random.default_rng(1)
    b = rng.normal(size=9)
    a = b + 0.8 + rng.standard_t(2, size=9) * 0.2
    c = paired_comparison(a, b, method="sign-flip")
    d = a - b
    null = [abs(np.mean(np.array(s) * d)) for s in itertools.product((1, -1), repeat=9)]
    assert c.p_value == pytest.approx(np.mean(np.array(null) >= abs(d.mean()) - 1e-12))
    assert c.ci_low < c.effect < c.ci_high and c.verdict == "better"
    # the interval is the set of shifts the test does not reject
    for shift, inside in ((c.ci_low + 1e-3, True), (c.ci_high - 1e-3, True), (c.ci_low - 0.05, False),
                          (c.ci_high + 0.05, False)):
        p = paired_comparison(a - shift, b, method="sign-flip").p_value
        assert (p > 0.05) == inside, (shift, p)


@pytest.mark.parametrize("n", [3, 4, 5])
def test_sign_flip_cannot_decide_at_five_seeds_or_fewer(n):
    c = paired_comparison(np.arange(n) + 10.0, np.zeros(n), method="sign-flip")
    assert c.p_value == pytest.approx(2 / 2 ** n) and c.p_value > 0.05
    assert c.verdict == "inconclusive" and "cannot reach" in c.note
    assert c.ci_low == -math.inf and c.ci_high == math.inf


@pytest.mark.parametrize("n", [3, 5, 10])
@pytest.mark.parametrize("outcome", ["normal", "lognormal", "exponential"])
@pytest.mark.parametrize("method", ["t", "sign-flip"])
def test_false_positive_rate_under_the_null_by_simulation(n, outcome, method):
    """Two exchangeable methods (the same outcome distribution on every seed, skewed or not): the helper declares
    a difference at most 5 % of the time, up to the simulation's binomial noise."""
    rng = np.random.default_rng(100 + n)
    trials = 1500 if method == "t" else 600
    shared = rng.normal(size=(trials, n))                    # what a seed does to both methods
    draw = {"normal": lambda size: rng.normal(size=size),
            "lognormal": lambda size: rng.lognormal(0.0, 1.5, size=size),
            "exponential": lambda size: rng.exponential(size=size)}[outcome]
    a, b = shared + draw((trials, n)), shared + draw((trials, n))
    rate = np.mean([paired_comparison(a[i], b[i], method=method).verdict != "inconclusive"
                    for i in range(trials)])
    noise = 3 * math.sqrt(0.05 * 0.95 / trials)
    assert rate <= 0.05 + noise, rate
    if method == "sign-flip" and n <= 5:
        assert rate == 0.0


def test_holm_and_bh_adjustments_match_their_definitions():
    from taskloss.results.compare import adjust

    ps = [0.01, 0.04, 0.03, 0.2]
    comps = [paired_comparison([1.0, 2.0, 3.5], [0.0, 0.1, 0.2]) for _ in ps]
    comps = [dataclasses.replace(c, p_value=p, verdict="better") for c, p in zip(comps, ps)]
    holm = adjust(comps, "holm")      # sorted p 0.01, 0.03, 0.04, 0.2 → 4·0.01, 3·0.03, max(0.09, 2·0.04), 0.2
    assert [c.p_adjusted for c in holm] == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert [c.verdict_adjusted for c in holm] == ["better", "inconclusive", "inconclusive", "inconclusive"]
    bh = adjust(comps, "bh")          # m·p/rank: 0.04, 0.06, 0.053, 0.2 → running minima from the top
    assert [c.p_adjusted for c in bh] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    assert [c.verdict_adjusted for c in bh] == ["better", "inconclusive", "inconclusive", "inconclusive"]
    assert {c.family_size for c in holm} == {4}
    with pytest.raises(ValueError, match="method"):
        adjust(comps, "bonferroni")
    with pytest.raises(ValueError, match="at least one"):
        adjust([])
    with pytest.raises(TypeError):
        adjust([0.1])
    table = comparison_table(comps, correction="holm")
    assert table.startswith("4 comparisons; Holm correction across them: 1 of the 4 decided verdicts survive.")
    assert "verdict after correction" in table
    assert "Holm across 4 comparisons" in holm[0].sentence()
    assert "not significant after the correction" in holm[1].sentence()


@pytest.mark.parametrize("a, b, exc, msg", [
    ([1.0], [2.0], ValueError, "at least 2"),
    ([1.0, 2.0], [1.0, 2.0, 3.0], ValueError, "same seeds"),
    ([1.0, float("nan")], [1.0, 2.0], ValueError, "NaN"),
    (["x", "y"], [1.0, 2.0], TypeError, "numbers"),
    ([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]], ValueError, "one-dimensional"),
])
def test_bad_inputs(a, b, exc, msg):
    with pytest.raises(exc, match=msg):
        paired_comparison(a, b)


def test_bad_options():
    with pytest.raises(ValueError, match="confidence"):
        paired_comparison([1, 2], [2, 3], confidence=1.0)
    with pytest.raises(ValueError, match="method"):
        paired_comparison([1, 2], [2, 3], method="z")
    with pytest.raises(ValueError, match="at least one"):
        comparison_table([])


def test_run_compare_records_and_say_renders(tmp_path, capsys):
    run = tn.start("00_test", str(tmp_path), device="cpu", seed=0)
    c = run.compare("x/acc", [0.9, 0.91, 0.92, 0.95], [0.8, 0.82, 0.8, 0.83], name="new", baseline="old",
                    metric="accuracy")
    assert run.results["x/acc"]["verdict"] == c.verdict == "better"
    table = run.comparison_table()
    assert "new vs old" in table and "**better**" in table
    run.record("x/loss", 0.123456)
    text = run.render("loss {x/loss:.3f}; verdict {x/acc.verdict}; effect {x/acc.effect:+.2f}; n={n}", n=4)
    assert text == "loss 0.123; verdict better; effect +0.11; n=4"
    capsys.readouterr()
    assert run.say("loss {x/loss:.3f}") is None                     # shown once, not also returned
    assert "loss 0.123" in capsys.readouterr().out
    with pytest.raises(KeyError, match="no recorded result"):
        run.say("{missing}")


def test_plotting_helpers():
    import matplotlib.pyplot as plt

    mean, lo, hi = mean_interval([[1.0, 2.0], [3.0, 4.0]])
    assert mean.tolist() == [2.0, 3.0] and (lo < mean).all() and (hi > mean).all()
    fig, ax = plt.subplots()
    line = seed_band(ax, [0, 1], [[1.0, 2.0], [3.0, 4.0]], label="m")
    assert "mean of 2" in line.get_label()
    bars_with_interval(ax, ["a", "b"], [[1.0, 1.2], [2.0, 2.1]])
    label_axes(ax, "step", "loss", lower_is_better=True)
    assert ax.get_ylabel() == "loss (lower is better)" and ax.get_legend() is not None
    with pytest.raises(ValueError, match="shape"):
        seed_band(ax, [0, 1, 2], [[1.0, 2.0]])
    plt.close(fig)


def test_bars_with_interval_draws_the_interval_at_the_confidence_asked_for():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [[1.0, 1.5, 0.7, 1.2]]
    half_width = {}
    for conf in (0.68, 0.95):
        fig, ax = plt.subplots()
        bars = bars_with_interval(ax, ["a"], values, confidence=conf)
        segments = bars.errorbar.lines[2][0].get_segments()
        half_width[conf] = float(segments[0][1][1] - segments[0][0][1]) / 2
        m, lo, hi = mean_interval(np.asarray(values[0]), conf)
        assert np.isclose(half_width[conf], float(hi - m))
        plt.close(fig)
    assert half_width[0.68] < half_width[0.95]
