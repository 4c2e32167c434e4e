"""Paired comparisons of two methods run on the same seeds: effect, confidence interval, p-value and a verdict.

Every notebook that compares methods goes through :func:`paired_comparison`, so "better" always means the same
thing: the two methods ran with the same seeds and budget, the per-seed differences ``d_s = a_s − b_s`` were
measured, and the confidence interval of their mean excludes zero on the better side. An interval that covers
zero is reported as ``"inconclusive"`` — never as a win or a loss.

The interval is Student's t on the paired differences (``mean ± t_{n−1, 1−(1−c)/2} · sd/√n``) and the p-value is
the paired t-test's (two-sided; ``scipy.stats.ttest_rel`` gives the same number); with ``method="wilcoxon"`` the
p-value is the Wilcoxon signed-rank test's and the interval a bootstrap percentile interval of the mean
difference, for heavy-tailed differences. With fewer than 2 seeds nothing can be decided: an error, not a
verdict. With 3 seeds the 95 % interval is ``±4.30·sd/√3``: only large, consistent effects are decided.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from taskloss.utils import check_probability

__all__ = ["Comparison", "paired_comparison", "comparison_table", "VERDICTS"]

VERDICTS = ("better", "worse", "inconclusive")


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`paired_comparison` (``a`` against ``b``; ``effect`` = mean of ``a − b``)."""

    name: str                 # what ``a`` is, e.g. "MGS"
    baseline: str             # what ``b`` is, e.g. "MLE"
    metric: str               # e.g. "test accuracy"
    n: int                    # number of paired seeds
    mean_a: float
    mean_b: float
    effect: float             # mean of a − b (in the metric's units)
    ci_low: float             # confidence interval of the effect
    ci_high: float
    p_value: float
    confidence: float
    lower_is_better: bool
    verdict: str              # "better" / "worse" / "inconclusive": a against b
    method: str               # "t" or "wilcoxon"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self, fmt: str = ".3g") -> str:
        """One sentence a notebook can print or render: the verdict with its numbers."""
        pct = f"{100 * self.confidence:.0f} %"
        ci = f"{pct} CI [{self.ci_low:{fmt}}, {self.ci_high:{fmt}}]"
        diff = f"{self.metric} {self.mean_a:{fmt}} vs {self.mean_b:{fmt}}, difference {self.effect:+{fmt}}"
        stats = f"{ci}, p = {self.p_value:.2g}, {self.n} seeds"
        if self.verdict == "inconclusive":
            return f"{self.name} vs {self.baseline}: inconclusive ({diff}; {stats} covers 0)."
        return f"{self.name} is {self.verdict} than {self.baseline} ({diff}; {stats})."


def _as_1d(name: str, x) -> np.ndarray:
    try:
        arr = np.asarray([float(v) for v in np.asarray(x, dtype=object).reshape(-1)], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a sequence of numbers (one per seed), got {type(x).__name__}") from e
    if np.ndim(x) > 1 and np.asarray(x).squeeze().ndim > 1:
        raise ValueError(f"{name} must be one-dimensional (one value per seed), got shape {np.shape(x)}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf: {arr.tolist()}")
    return arr


def paired_comparison(a: Sequence[float], b: Sequence[float], *, name: str = "a", baseline: str = "b",
                      metric: str = "metric", lower_is_better: bool = False, confidence: float = 0.95,
                      method: str = "t", n_boot: int = 10_000, seed: int = 0) -> Comparison:
    """Compare method ``a`` with method ``b`` from per-seed values measured on the same seeds and budget.

    Args:
        a, b: one value per seed, ``a[s]`` and ``b[s]`` from the same seed ``s`` (the pairing removes the
            seed-to-seed variation the two methods share).
        name, baseline, metric: labels used in :meth:`Comparison.sentence` and :func:`comparison_table`.
        lower_is_better: ``True`` for losses and error rates, ``False`` for accuracies and scores.
        confidence: level of the interval, in (0, 1); the verdict is decided at ``1 − confidence``.
        method: ``"t"`` (paired t interval and test) or ``"wilcoxon"`` (signed-rank p-value, bootstrap
            percentile interval of the mean difference from ``n_boot`` resamples drawn with ``seed``).

    Returns:
        A :class:`Comparison`; ``verdict`` is ``"better"``/``"worse"`` when the interval excludes 0 on that
        side for ``a`` against ``b``, else ``"inconclusive"``.

    Raises:
        ValueError: fewer than 2 pairs, different lengths, NaN/inf values, confidence outside (0, 1),
            an unknown method.
        TypeError: non-numeric values.
    """
    from scipy import stats

    av, bv = _as_1d("a", a), _as_1d("b", b)
    if av.shape != bv.shape:
        raise ValueError(f"a and b must hold one value per seed for the same seeds, got {av.size} and {bv.size}")
    if av.size < 2:
        raise ValueError(f"a paired comparison needs at least 2 seeds, got {av.size}")
    confidence = check_probability("confidence", confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if method not in ("t", "wilcoxon"):
        raise ValueError(f"method must be 't' or 'wilcoxon', got {method!r}")
    d = av - bv
    n, mean = d.size, float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:   # identical differences on every seed: no spread to estimate
        lo = hi = mean
        p = 1.0 if mean == 0.0 else 0.0
    elif method == "t":
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        lo, hi = mean - half, mean + half
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:
        rng = np.random.default_rng(seed)
        boots = d[rng.integers(0, n, size=(n_boot, n))].mean(1)
        lo, hi = (float(v) for v in np.quantile(boots, [0.5 - confidence / 2, 0.5 + confidence / 2]))
        p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    if lo > 0 or hi < 0:
        a_higher = lo > 0
        verdict = "worse" if a_higher == lower_is_better else "better"
    else:
        verdict = "inconclusive"
    return Comparison(name=name, baseline=baseline, metric=metric, n=n, mean_a=float(av.mean()),
                      mean_b=float(bv.mean()), effect=mean, ci_low=lo, ci_high=hi, p_value=p,
                      confidence=confidence, lower_is_better=bool(lower_is_better), verdict=verdict, method=method)


def comparison_table(comparisons: Sequence[Comparison], fmt: str = ".4g") -> str:
    """A Markdown table of comparisons: metric, a vs b, seeds, means, effect, interval, p, verdict."""
    if not comparisons:
        raise ValueError("comparison_table needs at least one Comparison")
    lines = ["| metric | comparison | seeds | mean a | mean b | effect (a − b) | CI | p | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        if not isinstance(c, Comparison):
            raise TypeError(f"expected Comparison objects, got {type(c).__name__}")
        arrow = "↓" if c.lower_is_better else "↑"
        lines.append(f"| {c.metric} {arrow} | {c.name} vs {c.baseline} | {c.n} | {c.mean_a:{fmt}} | {c.mean_b:{fmt}} "
                     f"| {c.effect:+{fmt}} | [{c.ci_low:{fmt}}, {c.ci_high:{fmt}}] | {c.p_value:.2g} "
                     f"| **{c.verdict}** |")
    return "\n".join(lines)
