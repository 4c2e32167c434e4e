"""Figure helpers shared by the notebooks: seed bands, bars with intervals, and labelled axes.

Every figure in the notebooks should be readable at its committed size: labelled axes with units, a legend,
an error band or interval wherever several seeds exist, and the direction that is better stated on the axis.
These helpers keep that boilerplate out of the notebook cells.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["mean_interval", "seed_band", "bars_with_interval", "label_axes"]


def mean_interval(values, confidence: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) of ``values`` along ``axis`` (the seeds): Student-t interval of the mean; with one seed
    the interval collapses to the mean."""
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


def seed_band(ax, x: Sequence[float], ys, label: str | None = None, color=None, confidence: float = 0.95,
              alpha: float = 0.2, **plot_kw):
    """Plot the mean over seeds of ``ys`` ``[seeds, len(x)]`` against ``x`` with a shaded ``confidence`` band.
    Returns the line."""
    ys = np.asarray(ys, dtype=np.float64)
    if ys.ndim == 1:
        ys = ys[None]
    if ys.shape[1] != len(x):
        raise ValueError(f"ys must have shape [seeds, {len(x)}], got {ys.shape}")
    mean, lo, hi = mean_interval(ys, confidence)
    n = ys.shape[0]
    lab = None if label is None else (f"{label} (mean of {n}, {100 * confidence:.0f} % CI)" if n > 1 else label)
    (line,) = ax.plot(x, mean, label=lab, color=color, **plot_kw)
    if n > 1:
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=alpha, linewidth=0)
    return line


def bars_with_interval(ax, labels: Sequence[str], values: Sequence[Sequence[float]], confidence: float = 0.95,
                       colors=None, zero_based: bool = True):
    """Bars of the per-method means of ``values`` (one sequence of per-seed values per label) with their
    intervals as error bars; the y-axis starts at 0 unless ``zero_based=False`` (then the range is stated by
    the axis, never silently cut). Returns the bar container."""
    if len(labels) != len(values) or not labels:
        raise ValueError("bars_with_interval needs one sequence of values per label")
    stats = [mean_interval(np.asarray(v, dtype=np.float64), confidence) for v in values]
    means = np.array([float(m) for m, _, _ in stats])
    err = np.array([[float(m - lo) for m, lo, _ in stats], [float(hi - m) for m, _, hi in stats]])
    bars = ax.bar(range(len(labels)), means, yerr=err, capsize=4, color=colors)
    ax.set_xticks(range(len(labels)), labels)
    if zero_based and (means >= 0).all():
        ax.set_ylim(bottom=0)
    return bars


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
                quantiles: tuple[float, float] = (0.25, 0.75), alpha: float = 0.2, **plot_kw):
    """Plot the median over seeds of ``ys [seeds, len(x)]`` against ``x`` with a shaded band between two
    quantiles over the seeds (default the interquartile range). For heavy-tailed per-seed values (estimation
    errors, effective sample sizes) where a mean and its t-interval mislead. Returns the line.

    Raises:
        ValueError: ``ys`` of the wrong shape, empty, with NaN/inf, or quantiles not ``0 <= low < high <= 1``.
    """
    ys = np.asarray(ys, dtype=np.float64)
    if ys.ndim == 1:
        ys = ys[None]
    if ys.ndim != 2 or ys.shape[1] != len(x) or ys.shape[0] == 0:
        raise ValueError(f"ys must have shape [seeds, {len(x)}], got {ys.shape}")
    if not np.isfinite(ys).all():
        raise ValueError("median_band: ys contain NaN or inf")
    q_lo, q_hi = (float(q) for q in quantiles)
    if not 0.0 <= q_lo < q_hi <= 1.0:
        raise ValueError(f"quantiles must satisfy 0 <= low < high <= 1, got {quantiles}")
    n = ys.shape[0]
    band = "IQR" if (q_lo, q_hi) == (0.25, 0.75) else f"{100 * q_lo:.0f}–{100 * q_hi:.0f} % quantiles"
    lab = None if label is None else (f"{label} (median of {n}, {band})" if n > 1 else label)
    (line,) = ax.plot(x, np.median(ys, 0), label=lab, color=color, **plot_kw)
    if n > 1:
        ax.fill_between(x, np.quantile(ys, q_lo, 0), np.quantile(ys, q_hi, 0), color=line.get_color(),
                        alpha=alpha, linewidth=0)
    return line


_VERDICT_COLORS = {"better": "C2", "worse": "C3", "inconclusive": "0.45"}


def comparison_forest(ax, comparisons, labels: Sequence[str] | None = None, *, xlabel: str | None = None):
    """A forest plot of paired comparisons (:class:`taskloss.results.compare.Comparison`): one row per
    comparison with its effect (mean of a − b) and confidence interval, a vertical line at 0, coloured by
    verdict (better green, worse red, inconclusive grey). Rows read top to bottom in the given order; the
    x label says the unit and which side is better when all comparisons share one metric and direction.
    Returns the list of error-bar containers.

    Raises:
        ValueError: no comparisons, or ``labels`` of another length.
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
    rows = np.arange(len(comparisons))[::-1]
    out = []
    for y, c in zip(rows, comparisons):
        err = [[c.effect - c.ci_low], [c.ci_high - c.effect]]
        out.append(ax.errorbar([c.effect], [y], xerr=err, fmt="o", capsize=4, color=_VERDICT_COLORS[c.verdict]))
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_yticks(rows, labels)
    metrics = {(c.metric, c.lower_is_better) for c in comparisons}
    if xlabel is None:
        if len(metrics) == 1:
            metric, lower = metrics.pop()
            xlabel = f"effect on {metric}, a − b ({'negative' if lower else 'positive'} = a better)"
        else:
            xlabel = "effect, a − b (metric units)"
    ax.set_xlabel(xlabel)
    for verdict, color in _VERDICT_COLORS.items():
        if any(c.verdict == verdict for c in comparisons):
            ax.plot([], [], "o", color=color, label=verdict)
    ax.legend(fontsize="small", title=f"{100 * comparisons[0].confidence:.0f} % CI", title_fontsize="small")
    return out
