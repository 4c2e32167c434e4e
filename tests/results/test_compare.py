"""Paired comparisons (taskloss.results.compare), Run.compare / Run.say, and the plotting helpers."""
from __future__ import annotations

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
    c = paired_comparison([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert c.ci_low == c.ci_high == 0.5 and c.p_value == 0.0 and c.verdict == "better"
    c = paired_comparison([1.0, 2.0], [1.0, 2.0])
    assert c.verdict == "inconclusive" and c.p_value == 1.0


def test_wilcoxon_method():
    rng = np.random.default_rng(1)
    b = rng.normal(size=20)
    a = b + 0.5 + rng.standard_t(2, size=20) * 0.1
    c = paired_comparison(a, b, method="wilcoxon")
    assert c.p_value == pytest.approx(stats.wilcoxon(a - b).pvalue)
    assert c.ci_low < c.effect < c.ci_high and c.verdict == "better"


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
    text = run.say("loss {x/loss:.3f}; verdict {x/acc.verdict}; effect {x/acc.effect:+.2f}; n={n}", n=4)
    assert text == "loss 0.123; verdict better; effect +0.11; n=4"
    assert text in capsys.readouterr().out
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
