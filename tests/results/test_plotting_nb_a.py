"""The appended plotting helpers: median_band (median and quantile band over seeds) and comparison_forest."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from taskloss.results import paired_comparison
from taskloss.results.plotting import comparison_forest, median_band

matplotlib.use("Agg")


@pytest.fixture
def ax():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_median_band_draws_median_and_quantiles(ax):
    rng = np.random.default_rng(0)
    ys = rng.lognormal(size=(9, 4))
    line = median_band(ax, [1, 2, 3, 4], ys, label="err")
    np.testing.assert_allclose(line.get_ydata(), np.median(ys, 0))       # reference: numpy's median
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    lo, hi = np.quantile(ys, 0.25, 0), np.quantile(ys, 0.75, 0)
    assert np.isclose(band.min(), lo.min()) and np.isclose(band.max(), hi.max())
    assert line.get_label() == "err (median of 9, IQR)"
    line = median_band(ax, [1, 2, 3, 4], ys, label="e", quantiles=(0.1, 0.9))
    assert "10–90 % quantiles" in line.get_label()


def test_median_band_one_seed_has_no_band(ax):
    line = median_band(ax, [0, 1], [3.0, 4.0], label="one")
    assert line.get_label() == "one" and not ax.collections


@pytest.mark.parametrize("ys, kw, msg", [
    ([[1.0, 2.0]], {"x": [0, 1, 2]}, "shape"),
    ([[1.0, float("nan")]], {"x": [0, 1]}, "NaN"),
    ([[1.0, 2.0]], {"x": [0, 1], "quantiles": (0.8, 0.2)}, "quantiles"),
    (np.zeros((0, 2)), {"x": [0, 1]}, "shape"),
])
def test_median_band_bad_inputs(ax, ys, kw, msg):
    x = kw.pop("x")
    with pytest.raises(ValueError, match=msg):
        median_band(ax, x, ys, **kw)


def test_comparison_forest_rows_colours_and_label(ax):
    better = paired_comparison([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], [0.0, 0.1, 0.1, 0.2, 0.3, 0.3, 0.5, 0.4],
                               name="A", baseline="B", metric="acc")
    unsure = paired_comparison([1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.4, 0.6], name="C", baseline="B", metric="acc")
    bars = comparison_forest(ax, [better, unsure])
    assert len(bars) == 2
    xs = [float(b.lines[0].get_xdata()[0]) for b in bars]
    assert xs == pytest.approx([better.effect, unsure.effect])
    rows = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks()))
    assert rows["A vs B"] > rows["C vs B"]                          # the first comparison is the top row
    assert ax.get_xlabel() == "median of a − b on acc (positive = a better)"
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"better", "inconclusive"}


def test_comparison_forest_bad_inputs(ax):
    c = paired_comparison([1.0, 2.0], [0.0, 0.5])
    with pytest.raises(ValueError, match="at least one"):
        comparison_forest(ax, [])
    with pytest.raises(TypeError, match="Comparison"):
        comparison_forest(ax, [c, 3.0])
    with pytest.raises(ValueError, match="one label per"):
        comparison_forest(ax, [c], labels=["a", "b"])
