"""The plotting helpers keep figures honest: intervals inside a quantity's declared range (refused, or clipped when
asked), no interval from fewer than three seeds (the seeds instead), small multiples, tick labels on every axis,
and a caption under every figure rendered from the recorded results."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from scipy import stats

from taskloss.results.plotting import (
    CAPTION_PREFIX,
    FRACTION,
    NONNEGATIVE,
    bars_with_interval,
    bounded_interval,
    check_tick_labels,
    median_band,
    seed_band,
    show,
    small_multiples,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


# three seeds of a fraction near 0 whose t-interval reaches below 0 (t(2) = 4.30 at 95 %)
NEAR_ZERO = np.array([[0.00, 0.02], [0.01, 0.00], [0.09, 0.01]])


def test_t_band_leaving_a_declared_range_is_refused(ax):
    mean = NEAR_ZERO.mean(0)
    half = stats.t.ppf(0.975, 2) * NEAR_ZERO.std(0, ddof=1) / np.sqrt(3)
    assert (mean - half < 0).any()                           # the reference says the band leaves [0, 1]
    with pytest.raises(ValueError, match=r"outside the quantity's range \[0, 1\].*clip=True"):
        seed_band(ax, [0, 1], NEAR_ZERO, label="error rate", bounds=FRACTION)
    with pytest.raises(ValueError, match="outside the quantity's range"):
        bars_with_interval(ax, ["a", "b"], NEAR_ZERO.T, bounds=FRACTION)


def test_t_band_is_clipped_to_the_range_when_asked(ax):
    seed_band(ax, [0, 1], NEAR_ZERO, label="error rate", bounds=FRACTION, clip=True)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    mean = NEAR_ZERO.mean(0)
    half = stats.t.ppf(0.975, 2) * NEAR_ZERO.std(0, ddof=1) / np.sqrt(3)
    assert band.min() == 0.0                                 # clipped at the bound ...
    assert np.isclose(band.max(), (mean + half).max())       # ... the inside edge untouched
    bars = bars_with_interval(ax, ["a", "b"], NEAR_ZERO.T, bounds=FRACTION, clip=True)
    low_ends = [seg[0][1] for seg in bars.errorbar.lines[2][0].get_segments()]
    assert min(low_ends) == 0.0


def test_bounded_interval_passes_inside_and_checks_its_arguments():
    lo, hi = bounded_interval([0.1, 0.2], [0.3, 0.9], FRACTION)
    assert lo.tolist() == [0.1, 0.2] and hi.tolist() == [0.3, 0.9]
    lo, hi = bounded_interval([-1.0], [2.0], NONNEGATIVE, clip=True)
    assert lo.tolist() == [0.0] and hi.tolist() == [2.0]
    for bad in ((1.0, 0.0), (0.0,), "ab", (0.0, float("nan"))):
        with pytest.raises(ValueError, match="bounds"):
            bounded_interval([0.0], [1.0], bad)


def test_data_outside_the_declared_range_are_refused_even_with_clip(ax):
    with pytest.raises(ValueError, match="outside the declared range"):
        seed_band(ax, [0, 1], [[0.5, 1.2], [0.4, 0.6], [0.5, 0.5]], bounds=FRACTION, clip=True)
    with pytest.raises(ValueError, match="outside the declared range"):
        median_band(ax, [0, 1], [[-0.5, 1.0], [0.0, 1.0], [0.1, 0.2]], bounds=NONNEGATIVE)


@pytest.mark.parametrize("helper", [seed_band, median_band])
def test_two_seeds_draw_the_seeds_not_a_band(ax, helper):
    ys = np.array([[1.0, 2.0, 3.0], [1.5, 2.5, 2.0]])
    line = helper(ax, [0, 1, 2], ys, label="m", marker="o")
    assert not ax.collections                                # no band
    assert len(ax.lines) == 3 and "seeds shown" in line.get_label()
    drawn = sorted(tuple(ln.get_ydata()) for ln in ax.lines[1:])
    assert drawn == sorted(tuple(y) for y in ys)
    assert all(ln.get_color() == line.get_color() for ln in ax.lines)


def test_three_seeds_get_the_t_band(ax):
    ys = np.array([[1.0, 2.0], [1.5, 2.5], [1.2, 2.1]])
    line = seed_band(ax, [0, 1], ys, label="m")
    assert "95 % CI" in line.get_label() and len(ax.collections) == 1 and len(ax.lines) == 1


def test_bars_from_fewer_than_three_values_show_dots(ax):
    bars = bars_with_interval(ax, ["two", "four"], [[1.0, 1.4], [2.0, 2.2, 1.9, 2.1]])
    segments = [seg for seg in bars.errorbar.lines[2][0].get_segments() if len(seg)]
    assert len(segments) == 1 and segments[0][0][0] == 1     # only the bar with four values has an error bar
    dots = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(dots) == 1 and sorted(dots[0].get_ydata()) == [1.0, 1.4]


def test_small_multiples_labels_every_panel():
    fig, axes = small_multiples(6, ncols=4)
    try:
        assert len(axes) == 6 and len(fig.axes) == 6          # two spare cells removed
        assert fig.get_layout_engine().__class__.__name__ == "ConstrainedLayoutEngine"
        for i, a in enumerate(axes):
            a.plot([0, 1], [i, i + 1])
            a.set_title(f"rule {i}")
        check_tick_labels(fig)
        assert all(t.get_visible() for t in axes[5].get_yticklabels())     # shared y, labels kept
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="n >= 1"):
        small_multiples(0)


def test_check_tick_labels_finds_an_axis_without_labels():
    fig, axes = plt.subplots(1, 2)
    try:
        for a in axes:
            a.plot([0.01, 0.03], [160, 180])
        axes[0].set_yscale("log")
        axes[0].minorticks_off()              # a log axis inside one decade with its minor labels off: none left
        axes[0].set_title("sweep")
        with pytest.raises(ValueError, match="'sweep': y axis"):
            check_tick_labels(fig)
    finally:
        plt.close(fig)
    fig, axes = plt.subplots(1, 2)                # a pixel grid without ticks and its colour bar are exempt
    try:
        im = axes[0].imshow(np.eye(3))
        axes[0].set_xticks([]), axes[0].set_yticks([])
        fig.colorbar(im, ax=axes[0])
        axes[1].plot([0, 1], [0, 1])
        check_tick_labels(fig)
    finally:
        plt.close(fig)


class _FakeRun:
    """The part of Run that show() uses: say() renders a template from recorded results (and shows it)."""
    def __init__(self, results):
        self.results, self.said = results, []

    def say(self, template, **values):
        self.said.append(template.format_map({**self.results, **values}))
        return self.said[-1]


def test_show_renders_the_caption_and_closes_the_figure(capsys):
    fig, a = plt.subplots()
    a.plot([0, 1], [0, 1])
    run = _FakeRun({"err": 0.123})
    assert show(fig, "the error falls to {err:.2f}.", run=run) is None       # no Out[] line in a notebook
    assert run.said == [f"{CAPTION_PREFIX} the error falls to 0.12."]
    assert not plt.fignum_exists(fig.number)
    fig, a = plt.subplots()
    a.plot([0, 1], [0, 1])
    show(fig, f"{CAPTION_PREFIX} a line.")
    assert capsys.readouterr().out.strip() == f"{CAPTION_PREFIX} a line."      # the prefix not doubled
    fig, a = plt.subplots()
    with pytest.raises(ValueError, match="needs a caption"):
        show(fig, "  ")
    with pytest.raises(ValueError, match="run="):
        show(fig, "{x}", x=1)
    plt.close(fig)


def test_show_with_the_real_run_reads_recorded_results(tmp_path, capsys):
    from taskloss.results import start

    run = start("00_plotting_test", str(tmp_path))
    run.record("sweep/best", 155.29)
    fig, a = plt.subplots()
    a.plot([0, 1], [0, 1])
    show(fig, "best perplexity {sweep/best:.0f}", run=run)
    assert capsys.readouterr().out.strip() == f"{CAPTION_PREFIX} best perplexity 155"
