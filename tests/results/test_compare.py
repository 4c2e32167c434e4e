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


MEAN = {"estimand": "mean", "symmetric": True}


def test_t_interval_and_p_value_match_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 12)
    b = a - 0.3 + rng.normal(0, 0.2, 12)
    c = paired_comparison(a, b, name="A", baseline="B", metric="acc", **MEAN)
    ref = stats.ttest_rel(a, b)
    assert c.p_value == pytest.approx(ref.pvalue, rel=1e-10) and c.method == "t" and c.estimand == "mean"
    ci = ref.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert c.effect == pytest.approx(float(np.mean(a - b))) and c.n == 12
    assert c.verdict == "better"                                    # higher accuracy, interval above 0
    assert paired_comparison(a, b, lower_is_better=True, **MEAN).verdict == "worse"
    assert paired_comparison(b, a, **MEAN).verdict == "worse"


def test_a_mean_is_decided_only_under_a_declared_symmetry():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 12)
    b = a - 0.3 + rng.normal(0, 0.2, 12)
    c = paired_comparison(a, b, estimand="mean")
    assert c.verdict == "inconclusive" and "symmetric=True" in c.note and c.p_value < 0.01
    with pytest.raises(ValueError, match="symmetric"):
        paired_comparison(a, b, symmetric=True)                     # a declaration the sign test does not need
    with pytest.raises(TypeError, match="symmetric"):
        paired_comparison(a, b, estimand="mean", symmetric="yes")


def test_sign_test_median_and_its_interval_against_scipy():
    rng = np.random.default_rng(3)
    d = rng.lognormal(0.0, 1.0, 15) - 0.4
    c = paired_comparison(d, np.zeros(15), name="A", baseline="B", metric="m")
    k = int((d > 0).sum())
    assert c.p_value == pytest.approx(stats.binomtest(k, 15, 0.5).pvalue, rel=1e-12)
    assert c.effect == pytest.approx(float(np.median(d))) and c.estimand == "median" and c.method == "sign"
    # the order-statistic interval: [d_(k), d_(n-k+1)] with the binomial tails of the sign test
    s = np.sort(d)
    kk = max(j for j in range(1, 16) if 2 * stats.binom.cdf(j - 1, 15, 0.5) <= 0.05)
    assert (c.ci_low, c.ci_high) == (s[kk - 1], s[15 - kk])
    # its coverage of the true median is at least 95 % (simulated)
    true_median = math.exp(0.0) - 0.4
    cover = [paired_comparison(x, np.zeros(15)) for x in rng.lognormal(0.0, 1.0, (400, 15)) - 0.4]
    assert np.mean([c.ci_low <= true_median <= c.ci_high for c in cover]) >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / 400)


def test_win_rate_counts_wins_on_the_better_side_and_ties_half():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    b = a - np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, -1.0])           # a higher on 8 seeds, tied on 1, lower on 1
    c = paired_comparison(a, b, estimand="win-rate")
    assert c.effect == pytest.approx(8.5 / 10) and c.p_value == pytest.approx(stats.binomtest(8, 9).pvalue)
    assert c.ci_low < c.effect < c.ci_high <= 1.0
    low = paired_comparison(a, b, estimand="win-rate", lower_is_better=True)
    assert low.effect == pytest.approx(1.5 / 10)                     # for a loss, a higher value is a loss
    assert {c.verdict, low.verdict} <= {"better", "worse"} and c.verdict != low.verdict


def test_interval_covering_zero_is_inconclusive():
    a = [0.50, 0.52, 0.49, 0.51, 0.5, 0.53, 0.48]
    b = [0.51, 0.50, 0.50, 0.50, 0.52, 0.51, 0.50]
    c = paired_comparison(a, b)
    assert c.ci_low < 0 < c.ci_high and c.verdict == "inconclusive"
    assert "inconclusive" in c.sentence() and "does not reject" in c.sentence()


def test_three_seeds_need_a_large_consistent_effect():
    # 2 standard errors is not enough with 3 seeds (t_{0.975, 2} = 4.30)
    d = np.array([1.0, 2.0, 3.5])
    a, b = d, np.zeros(3)
    se = d.std(ddof=1) / math.sqrt(3)
    assert d.mean() > 2 * se
    assert paired_comparison(a, b, **MEAN).verdict == ("better" if d.mean() > 4.303 * se else "inconclusive")


def test_identical_differences_and_identical_values():
    """No spread, no t verdict: a zero-width interval with p = 0 would decide from nothing."""
    c = paired_comparison([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], **MEAN)
    assert c.ci_low == c.ci_high == 0.5 and math.isnan(c.p_value) and c.verdict == "inconclusive"
    assert "no spread" in c.note and "no spread" in c.sentence()
    c = paired_comparison([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], **MEAN)
    assert c.verdict == "inconclusive" and c.p_value == 1.0 and c.note == ""
    # the exact tests still apply to a consistent difference: p = 2/2^n
    for kw in ({"estimand": "mean", "symmetric": True, "method": "sign-flip"}, {}):
        c = paired_comparison(np.arange(8.0) + 1, np.arange(8.0), **kw)
        assert c.p_value == pytest.approx(2 / 2 ** 8) and c.verdict == "better"
    # all tied: nothing to test
    c = paired_comparison([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert c.verdict == "inconclusive" and c.p_value == 1.0 and c.n_tested == 0


def test_fewer_than_three_seeds_decide_nothing():
    c = paired_comparison([1.0, 1.1], [0.0, 0.05], **MEAN)
    assert c.verdict == "inconclusive" and "fewer than 3" in c.note


def test_sign_flip_matches_an_explicit_enumeration_and_inverts_to_its_interval():
    import itertools

    rng = np.random.default_rng(1)
    b = rng.normal(size=9)
    a = b + 0.8 + rng.standard_t(2, size=9) * 0.2
    kw = {"estimand": "mean", "symmetric": True, "method": "sign-flip"}
    c = paired_comparison(a, b, **kw)
    d = a - b
    null = [abs(np.mean(np.array(s) * d)) for s in itertools.product((1, -1), repeat=9)]
    assert c.p_value == pytest.approx(np.mean(np.array(null) >= abs(d.mean()) - 1e-12))
    assert c.ci_low < c.effect < c.ci_high and c.verdict == "better"
    # the interval is the set of shifts the test does not reject
    for shift, inside in ((c.ci_low + 1e-3, True), (c.ci_high - 1e-3, True), (c.ci_low - 0.05, False),
                          (c.ci_high + 0.05, False)):
        p = paired_comparison(a - shift, b, **kw).p_value
        assert (p > 0.05) == inside, (shift, p)


@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("kw", [{"estimand": "mean", "symmetric": True, "method": "sign-flip"}, {}])
def test_exact_tests_cannot_decide_at_five_seeds_or_fewer(n, kw):
    c = paired_comparison(np.arange(n) + 10.0, np.zeros(n), **kw)
    assert c.p_value == pytest.approx(2 / 2 ** n) and c.p_value > 0.05
    assert c.verdict == "inconclusive" and "cannot reach" in c.note
    assert c.ci_low == -math.inf and c.ci_high == math.inf
    assert math.isinf(c.mde) and "no effect detectable" in c.sentence()


def test_minimum_detectable_effect_is_the_effect_detected_with_80_percent_power():
    """Simulate the test at its MDE: it rejects about 80 % of the time (and far less at half the MDE)."""
    rng = np.random.default_rng(7)
    for kw, n in (({"estimand": "mean", "symmetric": True}, 10), ({}, 12)):
        base = paired_comparison(rng.normal(size=n), np.zeros(n), **kw)
        sd, mde = 1.0, base.mde / base.sd            # the MDE in units of the recorded spread
        rates = []
        for shift in (mde, mde / 2):
            x = rng.normal(shift, sd, size=(1500, n))
            rates.append(np.mean([paired_comparison(r, np.zeros(n), **kw).verdict == "better" for r in x]))
        noise = 3 * math.sqrt(0.8 * 0.2 / 1500)
        assert abs(rates[0] - 0.8) < noise + 0.02, (kw, rates)
        assert rates[1] < 0.6, (kw, rates)


def test_holm_and_bh_adjustments_match_their_definitions():
    from taskloss.results.compare import adjust

    ps = [0.01, 0.04, 0.03, 0.2]
    comps = [paired_comparison([1.0, 2.0, 3.5], [0.0, 0.1, 0.2], **MEAN) for _ in ps]
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
    with pytest.raises(ValueError, match="does not test"):
        paired_comparison([1, 2], [2, 3], method="t")              # the t-test does not test a median
    with pytest.raises(ValueError, match="estimand"):
        paired_comparison([1, 2], [2, 3], estimand="mode")
    with pytest.raises(TypeError, match="seed"):
        paired_comparison([1, 2], [2, 3], seed="1")
    with pytest.raises(TypeError, match="fmt"):
        comparison_table([paired_comparison([1, 2], [2, 3])], fmt=5)
    with pytest.raises(ValueError, match="fmt"):
        comparison_table([paired_comparison([1, 2], [2, 3])], fmt="zz")
    with pytest.raises(ValueError, match="at least one"):
        comparison_table([])


def test_run_compare_records_and_say_renders(tmp_path, capsys):
    run = tn.start("00_test", str(tmp_path), device="cpu", seed=0)
    c = run.compare("x/acc", [0.9, 0.91, 0.92, 0.95], [0.8, 0.82, 0.8, 0.83], name="new", baseline="old",
                    metric="accuracy", **MEAN)
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


def test_detectable_names_the_mde_or_says_no_difference_is_decidable():
    from taskloss.results.compare import adjust

    rng = np.random.default_rng(1)
    b = rng.normal(0, 1, 12)
    c = paired_comparison(b - 1 + rng.normal(0, 0.3, 12), b, lower_is_better=True)
    assert c.detectable(".2f") == f"smallest effect detectable {c.mde:.2f}"
    fam = adjust([c, c])
    assert fam[0].detectable(".2f") == f"smallest effect detectable after the correction {fam[0].mde_family:.2f}"
    few = paired_comparison([1.0, 2.0, 3.0], [0.0, 0.5, 1.0])
    assert few.detectable() == "no difference of any size is decidable at 3 untied seeds"
    wins = paired_comparison(b + 1, b, estimand="win-rate")
    assert wins.detectable().endswith(" win rate")
    with pytest.raises((TypeError, ValueError)):
        c.detectable(3)
