"""Figure helpers shared by the notebooks: seed bands, bars with intervals, small multiples, labelled axes, and a
figure shown with its caption.

Every figure in the notebooks should be readable at its committed size and say no more than its data do:

- labelled axes with units, tick labels on every axis, a legend, the direction that is better stated on the axis;
- an interval wherever three or more seeds exist, and the seeds themselves below three (a Student-t band from
  two seeds has ``t = 12.7`` at 95 % and fills the panel);
- an interval inside the quantity's range: a helper given ``bounds=(lo, hi)`` (:data:`FRACTION`,
  :data:`NONNEGATIVE`) refuses data outside it and, asked to draw an interval that leaves it, raises — or clips
  the interval to the range with ``clip=True``;
- small multiples (:func:`small_multiples`) instead of many overlapping lines, ``constrained_layout``;
- a caption under the figure (:func:`show`), its numbers rendered from the recorded results.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["mean_interval", "seed_band", "bars_with_interval", "label_axes", "FRACTION", "NONNEGATIVE",
           "MIN_SEEDS_FOR_INTERVAL", "bounded_interval", "small_multiples", "check_tick_labels", "show",
           "CAPTION_PREFIX"]

#: The range of a fraction or a probability (error rates, normalized entropies, ESS fractions).
FRACTION = (0.0, 1.0)
#: The range of a nonnegative quantity (entropies, norms, losses, perplexities).
NONNEGATIVE = (0.0, math.inf)
#: Fewer seeds than this get no interval: the seeds are drawn instead.
MIN_SEEDS_FOR_INTERVAL = 3
# data may leave a declared range by this much (float32 rounding of a quantity computed at its bound)
_BOUNDS_ATOL = 1e-6


def _check_bounds(bounds) -> tuple[float, float]:
    if bounds is None:
        return -math.inf, math.inf
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (low, high) of numbers, got {bounds!r}") from None
    if math.isnan(lo) or math.isnan(hi) or not lo < hi:
        raise ValueError(f"bounds must satisfy low < high, got {bounds!r}")
    return lo, hi


def _check_data_in_bounds(values: np.ndarray, bounds, what: str) -> None:
    lo, hi = _check_bounds(bounds)
    if values.size and (values.min() < lo - _BOUNDS_ATOL or values.max() > hi + _BOUNDS_ATOL):
        raise ValueError(f"{what}: values span [{values.min():.4g}, {values.max():.4g}], outside the declared range "
                         f"[{lo:g}, {hi:g}]")


def bounded_interval(low, high, bounds, *, clip: bool = False, what: str = "interval"):
    """An interval ``(low, high)`` (arrays) checked against a quantity's range ``bounds = (lo, hi)``: returned as
    it is when inside; outside, clipped to the range with ``clip=True``, else refused.

    Raises:
        ValueError: the interval leaves the range and ``clip`` is false (the message names the extreme and says
            what to do instead), or malformed ``bounds``.
    """
    lo, hi = _check_bounds(bounds)
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    if (low < lo - _BOUNDS_ATOL).any() or (high > hi + _BOUNDS_ATOL).any():
        if not clip:
            raise ValueError(f"{what} reaches [{low.min():.4g}, {high.max():.4g}], outside the quantity's range "
                             f"[{lo:g}, {hi:g}]: pass clip=True to draw it clipped to the range, or draw the seeds "
                             "(or a quantile band) instead")
    return np.clip(low, lo, hi), np.clip(high, lo, hi)


def mean_interval(values, confidence: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean of ``values`` along ``axis`` (the seeds) and its Student-t interval, ``(mean, low, high)``.

    With one seed the interval collapses to the mean. A figure draws the interval only from
    :data:`MIN_SEEDS_FOR_INTERVAL` seeds; the numbers stay available for tables.
    """
    from scipy import stats

    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_interval needs at least one value")
    if not np.isfinite(v).all():
        raise ValueError("mean_interval: values contain NaN or inf")
    n = v.shape[axis]
    mean = v.mean(axis)
    if n < 2:
        return mean, mean.copy(), mean.copy()
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * v.std(axis, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def _seeds_2d(x, ys, what: str) -> np.ndarray:
    ys = np.asarray(ys, dtype=np.float64)
    if ys.ndim == 1:
        ys = ys[None]
    if ys.ndim != 2 or ys.shape[1] != len(x) or ys.shape[0] == 0:
        raise ValueError(f"ys must have shape [seeds, {len(x)}], got {ys.shape}")
    if not np.isfinite(ys).all():
        raise ValueError(f"{what}: ys contain NaN or inf")
    return ys


def _draw_seeds(ax, x, ys: np.ndarray, color, plot_kw: dict) -> None:
    """Each seed as a thin line of the centre line's colour (what a figure shows below three seeds)."""
    kw = {k: v for k, v in plot_kw.items() if k in ("ls", "linestyle", "marker", "ms", "markersize")}
    for y in ys:
        ax.plot(x, y, color=color, alpha=0.45, lw=0.8, **kw)


def seed_band(ax, x: Sequence[float], ys, label: str | None = None, color=None, confidence: float = 0.95,
              alpha: float = 0.2, *, bounds=None, clip: bool = False, **plot_kw):
    """Plot the mean over seeds of ``ys`` ``[seeds, len(x)]`` against ``x``: with at least
    :data:`MIN_SEEDS_FOR_INTERVAL` seeds a shaded Student-t ``confidence`` band, with two the seeds themselves as
    thin lines. ``bounds`` declares the quantity's range (see :func:`bounded_interval`). Returns the mean line.

    Raises:
        ValueError: ``ys`` of the wrong shape or not finite, values outside ``bounds``, or a band leaving
            ``bounds`` without ``clip=True``.
    """
    ys = _seeds_2d(x, ys, "seed_band")
    _check_data_in_bounds(ys, bounds, "seed_band")
    mean, lo, hi = mean_interval(ys, confidence)
    n = ys.shape[0]
    if label is None:
        lab = None
    elif n >= MIN_SEEDS_FOR_INTERVAL:
        lab = f"{label} (mean of {n}, {100 * confidence:.0f} % CI)"
    else:
        lab = f"{label} (mean of {n}, seeds shown)" if n > 1 else label
    (line,) = ax.plot(x, mean, label=lab, color=color, **plot_kw)
    if n >= MIN_SEEDS_FOR_INTERVAL:
        lo, hi = bounded_interval(lo, hi, bounds, clip=clip, what=f"the {100 * confidence:.0f} % band of {label!r}")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=alpha, linewidth=0)
    elif n > 1:
        _draw_seeds(ax, x, ys, line.get_color(), plot_kw)
    return line


def bars_with_interval(ax, labels: Sequence[str], values: Sequence[Sequence[float]], confidence: float = 0.95,
                       colors=None, zero_based: bool = True, *, bounds=None, clip: bool = False):
    """Bars of the per-method means of ``values`` (one sequence of per-seed values per label) with their
    intervals as error bars — from :data:`MIN_SEEDS_FOR_INTERVAL` values; a bar of fewer shows its values as dots
    instead. The y-axis starts at 0 unless ``zero_based=False`` (then the range is stated by the axis, never
    silently cut); ``bounds`` declares the quantity's range (see :func:`bounded_interval`). Returns the bar
    container."""
    if len(labels) != len(values) or not labels:
        raise ValueError("bars_with_interval needs one sequence of values per label")
    arrays = [np.asarray(v, dtype=np.float64).ravel() for v in values]
    for a, lab in zip(arrays, labels):
        _check_data_in_bounds(a, bounds, f"bars_with_interval ({lab!r})")
    stats = [mean_interval(a, confidence) for a in arrays]
    means = np.array([float(m) for m, _, _ in stats])
    low, high = bounded_interval([float(lo) for _, lo, _ in stats], [float(hi) for _, _, hi in stats], bounds,
                                 clip=clip, what=f"a {100 * confidence:.0f} % interval")
    few = np.array([a.size < MIN_SEEDS_FOR_INTERVAL for a in arrays])
    err = np.where(few, np.nan, np.stack([means - low, high - means]))
    bars = ax.bar(range(len(labels)), means, yerr=err, capsize=4, color=colors)
    for i in np.flatnonzero(few):
        ax.plot(np.full(arrays[i].size, i), arrays[i], "o", color="k", ms=3, zorder=3)
    ax.set_xticks(range(len(labels)), labels)
    if zero_based and (means >= 0).all():
        ax.set_ylim(bottom=0)
    return bars


def small_multiples(n: int, ncols: int = 4, *, panel_size: tuple[float, float] = (3.2, 2.4), sharex: bool = True,
                    sharey: bool = True, **subplots_kw):
    """A grid of ``n`` small panels (constrained layout, unused cells removed) for one line per panel instead of
    ``n`` overlapping lines. Returns ``(figure, axes)`` with ``axes`` a flat list of length ``n``.

    Raises:
        ValueError: ``n`` or ``ncols`` below 1.
    """
    import matplotlib.pyplot as plt

    if int(n) != n or n < 1 or int(ncols) != ncols or ncols < 1:
        raise ValueError(f"small_multiples needs n >= 1 and ncols >= 1, got n={n!r}, ncols={ncols!r}")
    ncols = min(int(ncols), int(n))
    nrows = math.ceil(n / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows), sharex=sharex,
                             sharey=sharey, layout="constrained", squeeze=False, **subplots_kw)
    axes = list(grid.ravel())
    for ax in axes[n:]:
        ax.remove()
    for ax in axes[:n]:                  # a shared axis still labels its ticks on every panel
        ax.tick_params(labelbottom=True, labelleft=True)
    return fig, axes[:n]


def label_axes(ax, xlabel: str, ylabel: str, title: str | None = None, *, lower_is_better: bool | None = None,
               legend: bool = True, logx: bool = False, logy: bool = False) -> None:
    """Label both axes (units in the label), add '(lower is better)' / '(higher is better)' to the y label
    when given, set log scales, and draw a legend when there are labelled artists."""
    if lower_is_better is not None:
        ylabel = f"{ylabel} ({'lower' if lower_is_better else 'higher'} is better)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


# ---- appended: median bands for heavy-tailed per-seed values, and a forest plot of paired comparisons ----
__all__ += ["median_band", "comparison_forest"]


def median_band(ax, x: Sequence[float], ys, label: str | None = None, color=None,
                quantiles: tuple[float, float] = (0.25, 0.75), alpha: float = 0.2, *, bounds=None, **plot_kw):
    """Plot the median over seeds of ``ys [seeds, len(x)]`` against ``x`` with a shaded band between two
    quantiles over the seeds (default the interquartile range) from :data:`MIN_SEEDS_FOR_INTERVAL` seeds, and
    the seeds themselves below that. For heavy-tailed per-seed values (estimation errors, effective sample sizes)
    where a mean and its t-interval mislead. The band lies within the data, so within ``bounds`` (the quantity's
    range) whenever the data do. Returns the line.

    Raises:
        ValueError: ``ys`` of the wrong shape, empty, with NaN/inf, outside ``bounds``, or quantiles not
            ``0 <= low < high <= 1``.
    """
    ys = _seeds_2d(x, ys, "median_band")
    _check_data_in_bounds(ys, bounds, "median_band")
    q_lo, q_hi = (float(q) for q in quantiles)
    if not 0.0 <= q_lo < q_hi <= 1.0:
        raise ValueError(f"quantiles must satisfy 0 <= low < high <= 1, got {quantiles}")
    n = ys.shape[0]
    band = "IQR" if (q_lo, q_hi) == (0.25, 0.75) else f"{100 * q_lo:.0f}–{100 * q_hi:.0f} % quantiles"
    if label is None:
        lab = None
    elif n >= MIN_SEEDS_FOR_INTERVAL:
        lab = f"{label} (median of {n}, {band})"
    else:
        lab = f"{label} (median of {n}, seeds shown)" if n > 1 else label
    (line,) = ax.plot(x, np.median(ys, 0), label=lab, color=color, **plot_kw)
    if n >= MIN_SEEDS_FOR_INTERVAL:
        ax.fill_between(x, np.quantile(ys, q_lo, 0), np.quantile(ys, q_hi, 0), color=line.get_color(),
                        alpha=alpha, linewidth=0)
    elif n > 1:
        _draw_seeds(ax, x, ys, line.get_color(), plot_kw)
    return line


_VERDICT_COLORS = {"better": "C2", "worse": "C3", "inconclusive": "0.45"}


def comparison_forest(ax, comparisons, labels: Sequence[str] | None = None, *, xlabel: str | None = None):
    """A forest plot of paired comparisons (:class:`taskloss.results.compare.Comparison`): one row per
    comparison with its effect (the estimand's estimate: median or mean of a − b, or the win rate) and confidence
    interval, a vertical line at "no difference" (0, or ½ for win rates), coloured by verdict — the
    family-corrected one where :func:`~taskloss.results.compare.adjust` was applied (better green, worse red,
    inconclusive grey). An interval the seeds cannot bound (too few seeds for the exact test) is drawn to the
    plot's edge and labelled "unbounded". Rows read top to bottom in the given order; the x label says the
    estimand, the unit and which side is better when all comparisons share one metric and direction.
    Returns the list of error-bar containers.

    Raises:
        ValueError: no comparisons, ``labels`` of another length, win rates mixed with differences.
        TypeError: an element that is not a ``Comparison``.
    """
    from taskloss.results.compare import Comparison

    comparisons = list(comparisons)
    if not comparisons:
        raise ValueError("comparison_forest needs at least one Comparison")
    for c in comparisons:
        if not isinstance(c, Comparison):
            raise TypeError(f"expected Comparison objects, got {type(c).__name__}")
    if labels is None:
        labels = [f"{c.name} vs {c.baseline}" for c in comparisons]
    if len(labels) != len(comparisons):
        raise ValueError(f"need one label per comparison, got {len(labels)} for {len(comparisons)}")
    win = {c.estimand == "win-rate" for c in comparisons}
    if len(win) > 1:
        raise ValueError("win rates and differences have different scales: draw them in two forests")
    null = 0.5 if win.pop() else 0.0
    finite = [v for c in comparisons for v in (c.effect, c.ci_low, c.ci_high) if np.isfinite(v)] + [null]
    reach = 1.2 * max(abs(v - null) for v in finite) or 1.0
    rows = np.arange(len(comparisons))[::-1]
    out = []
    for y, c in zip(rows, comparisons):
        lo = c.ci_low if np.isfinite(c.ci_low) else null - reach
        hi = c.ci_high if np.isfinite(c.ci_high) else null + reach
        verdict = c.verdict if c.verdict_adjusted is None else c.verdict_adjusted
        out.append(ax.errorbar([c.effect], [y], xerr=[[c.effect - lo], [hi - c.effect]], fmt="o", capsize=4,
                               color=_VERDICT_COLORS[verdict]))
        if not (np.isfinite(c.ci_low) and np.isfinite(c.ci_high)):
            ax.annotate("unbounded", (c.effect, y), xytext=(0, 6), textcoords="offset points", ha="center",
                        fontsize="x-small", color="0.4")
    ax.axvline(null, color="k", lw=0.8)
    ax.set_yticks(rows, labels)
    metrics = {(c.metric, c.lower_is_better) for c in comparisons}
    estimands = {c.estimand for c in comparisons}
    what = estimands.pop() if len(estimands) == 1 else "effect"
    if xlabel is None:
        if null == 0.5:
            xlabel = "P(a beats b on a seed) (above ½ = a better)"
        elif len(metrics) == 1:
            metric, lower = metrics.pop()
            xlabel = f"{what} of a − b on {metric} ({'negative' if lower else 'positive'} = a better)"
        else:
            xlabel = f"{what} of a − b (metric units)"
    ax.set_xlabel(xlabel)
    shown = [c.verdict if c.verdict_adjusted is None else c.verdict_adjusted for c in comparisons]
    for verdict, color in _VERDICT_COLORS.items():
        if verdict in shown:
            ax.plot([], [], "o", color=color, label=verdict)
    corrected = " (uncorrected)" if any(c.correction is not None for c in comparisons) else ""
    ax.legend(fontsize="small", title=f"{100 * comparisons[0].confidence:.0f} % CI{corrected}",
              title_fontsize="small")
    return out


# ---- a figure and its caption --------------------------------------------------------------------------------

#: How a caption starts, in a Markdown output under a figure or in the Markdown cell after it (the book reads it).
CAPTION_PREFIX = "*What to see:*"


def _labels_its_ticks(axis) -> bool:
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * max(abs(lo), abs(hi), 1.0)
    return any(lo - slack <= tick.get_loc() <= hi + slack and
               any(lab.get_visible() and lab.get_text().strip() for lab in (tick.label1, tick.label2))
               for tick in axis.get_major_ticks() + axis.get_minor_ticks())


def check_tick_labels(fig) -> None:
    """Raise unless every axis of every panel with data labels its ticks (a panel sharing an axis with one that
    labels them counts as labelled). Panels that show only images (pixel grids) and colour bars are exempt, as are
    panels with their axes switched off. Draws the figure to know its ticks.

    Raises:
        ValueError: naming each panel (by title) and axis without a tick label.
    """
    fig.canvas.draw()
    missing = []
    for ax in fig.axes:
        if getattr(ax, "_colorbar", None) is not None or not ax.axison:
            continue
        if not (ax.lines or ax.collections or ax.patches):       # nothing drawn, or only images
            continue
        for name, axis, shared in (("x", ax.xaxis, ax.get_shared_x_axes()), ("y", ax.yaxis, ax.get_shared_y_axes())):
            others = [getattr(a, f"{name}axis") for a in shared.get_siblings(ax)]
            if axis.get_visible() and not any(_labels_its_ticks(o) for o in others):
                missing.append(f"{ax.get_title() or 'untitled panel'!r}: {name} axis")
    if missing:
        raise ValueError("axes without tick labels: " + "; ".join(missing))


def show(fig, caption: str, *, run=None, **values) -> None:
    """Show ``fig`` in the notebook with its caption under it, and close it. The caption is Markdown starting with
    :data:`CAPTION_PREFIX` (added when missing), which is how the book finds it (its alt text, its place under the
    figure). With ``run`` (a :class:`taskloss.results.run.Run`) it is a template rendered by :meth:`Run.say
    <taskloss.results.run.Run.say>`: ``{key:fmt}`` reads a recorded result, ``values`` add names of their own —
    so a number in a caption comes from the run. The figure gets constrained layout when it has no layout engine
    and must label the ticks of every axis (:func:`check_tick_labels`). Returns nothing, so that a cell ending in
    ``show(...)`` shows no ``Out[]`` line beside the caption.

    Raises:
        ValueError: an empty caption or a figure with an axis without tick labels.
        KeyError: a template field that is neither recorded nor given.
    """
    import matplotlib.pyplot as plt

    if not isinstance(caption, str) or not caption.strip():
        raise ValueError("show() needs a caption: what the reader should see in the figure")
    if values and run is None:
        raise ValueError("show(): values are rendered into the caption through run.say; pass run=")
    text = caption.strip()
    if not text.startswith(CAPTION_PREFIX):
        text = f"{CAPTION_PREFIX} {text}"
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    check_tick_labels(fig)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        interactive = get_ipython() is not None
    except ImportError:  # pragma: no cover - IPython ships with the notebook stack
        interactive = False
    if interactive:
        display(fig)
    plt.close(fig)
    if run is not None:
        run.say(text, **values)
    elif interactive:
        display(Markdown(text))
    else:
        print(text)
