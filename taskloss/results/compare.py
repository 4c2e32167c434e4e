"""Paired comparisons of two methods run on the same seeds: effect, confidence interval, p-value and a verdict,
and the family-wise view of a table of them.

Every notebook that compares methods goes through :func:`paired_comparison`, so "better" always means the same
thing: the two methods ran with the same seeds and budget, the per-seed differences ``d_s = a_s − b_s`` were
measured, and the confidence interval of their mean excludes zero on the better side. An interval that covers
zero is reported as ``"inconclusive"`` — never as a win or a loss.

Two tests, both two-sided at level ``1 − confidence``:

- ``method="t"`` (default): Student's t on the paired differences (``mean ± t_{n−1, 1−(1−c)/2} · sd/√n``;
  ``scipy.stats.ttest_rel`` gives the same p). It assumes the mean difference is close to normal. With 3 seeds
  the 95 % interval is ``±4.30·sd/√3``: only large, consistent effects are decided. When the two methods'
  outcomes are exchangeable under the null (they could swap on any seed), its false-positive rate stays at or
  under the nominal level even for skewed outcomes (``tests/results/test_compare.py`` checks it by simulation
  at n = 3, 5, 10); for methods whose outcomes differ in shape but not in mean, skewed differences push it above
  (12 % at n = 3 for exponential differences) — no test of a mean escapes that at a few seeds.
- ``method="sign-flip"``: the exact permutation test of the mean difference under the exchangeability null
  (each ``d_s`` equally likely to carry either sign), its interval the test's inversion. Its false-positive rate
  is at most the nominal level for any distribution under that null. Its smallest two-sided p-value is
  ``2 / 2ⁿ``, so **at n ≤ 5 it cannot reach p < 0.05**: its verdicts need 6 or more seeds (its 95 % interval is
  then unbounded, ``(−inf, inf)``).

No verdict is decided from fewer than :data:`~taskloss.results.compare.MIN_SEEDS` seeds, nor by the t-test from differences that are the
same on every seed (no spread to estimate: a zero-width interval and p = 0 would be an artefact); such a
comparison reads ``"inconclusive"`` and says why in ``note``. With fewer than 2 seeds nothing can be computed:
an error.

A table of many comparisons decides some by chance. :func:`~taskloss.results.compare.adjust` applies a Holm (family-wise error) or
Benjamini–Hochberg (false discovery rate) correction across a family of comparisons and gives each its adjusted
p-value and verdict; :func:`comparison_table` prints both, and :meth:`taskloss.results.run.Run.comparison_table`
records the corrected verdicts for the closing text.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from taskloss.utils import check_probability

__all__ = ["Comparison", "paired_comparison", "comparison_table", "adjust", "VERDICTS", "METHODS", "CORRECTIONS",
           "MIN_SEEDS"]

VERDICTS = ("better", "worse", "inconclusive")
METHODS = ("t", "sign-flip")
CORRECTIONS = ("holm", "bh")
MIN_SEEDS = 3
_EXACT_MAX_N = 12            # sign-flip: every one of the 2ⁿ sign patterns up to here, a Monte Carlo sample beyond
_MC_FLIPS = 20_000


@dataclass(frozen=True)
class Comparison:
    """The outcome of :func:`paired_comparison` (``a`` against ``b``; ``effect`` = mean of ``a − b``), with the
    family-wise fields filled in by :func:`~taskloss.results.compare.adjust` (``None`` until then)."""

    name: str                 # what ``a`` is, e.g. "MGS"
    baseline: str             # what ``b`` is, e.g. "MLE"
    metric: str               # e.g. "test accuracy"
    n: int                    # number of paired seeds
    mean_a: float
    mean_b: float
    effect: float             # mean of a − b (in the metric's units)
    ci_low: float             # confidence interval of the effect
    ci_high: float
    p_value: float            # NaN where no test applies (see ``note``)
    confidence: float
    lower_is_better: bool
    verdict: str              # "better" / "worse" / "inconclusive": a against b
    method: str               # "t" or "sign-flip"
    note: str = ""            # why no verdict was decided, when that is not the interval
    p_adjusted: float | None = None       # after a family-wise correction (:func:`~taskloss.results.compare.adjust`)
    verdict_adjusted: str | None = None
    correction: str | None = None         # "holm" or "bh"
    family_size: int | None = None        # comparisons in the family

    def as_dict(self) -> dict[str, Any]:
        """Every field as a dict (what :meth:`taskloss.results.run.Run.compare` records)."""
        return asdict(self)

    def sentence(self, fmt: str = ".3g") -> str:
        """One sentence a notebook can print or render: the verdict with its numbers (the family-corrected one
        when :func:`~taskloss.results.compare.adjust` was applied)."""
        pct = f"{100 * self.confidence:.0f} %"
        ci = f"{pct} CI [{self.ci_low:{fmt}}, {self.ci_high:{fmt}}]"
        diff = f"{self.metric} {self.mean_a:{fmt}} vs {self.mean_b:{fmt}}, difference {self.effect:+{fmt}}"
        p = "p undefined" if math.isnan(self.p_value) else f"p = {self.p_value:.2g}"
        stats = f"{ci}, {p}, {self.n} seeds"
        if self.correction is not None:
            stats += (f"; {_CORRECTION_NAMES[self.correction]} across {self.family_size} comparisons: "
                      f"adjusted p = {self.p_adjusted:.2g}")
        verdict = self.verdict if self.verdict_adjusted is None else self.verdict_adjusted
        if verdict == "inconclusive":
            why = self.note or ("not significant after the correction" if self.verdict != "inconclusive"
                                else "the interval covers 0")
            return f"{self.name} vs {self.baseline}: inconclusive ({diff}; {stats}; {why})."
        return f"{self.name} is {verdict} than {self.baseline} ({diff}; {stats})."


_CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini–Hochberg"}


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


def _sign_patterns(n: int, seed: int) -> np.ndarray:
    """Every sign pattern (n ≤ 12), else a Monte Carlo sample of them (with the identity pattern first)."""
    if n <= _EXACT_MAX_N:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    rng = np.random.default_rng(seed)
    flips = rng.choice((1.0, -1.0), size=(_MC_FLIPS, n))
    flips[0] = 1.0
    return flips


def _sign_flip_p(d: np.ndarray, signs: np.ndarray) -> float:
    """Two-sided p of the mean under sign flips: the share of patterns whose |mean| reaches the observed one."""
    obs = abs(float(d.mean()))
    null = np.abs(signs @ d) / d.size
    return float(np.mean(null >= obs * (1 - 1e-12) - 1e-300))


def _sign_flip_interval(d: np.ndarray, signs: np.ndarray, alpha: float) -> tuple[float, float]:
    """The shifts δ whose sign-flip test of ``d − δ`` does not reject at ``alpha`` (bisection on each side);
    ``(−inf, inf)`` when no shift can be rejected (``2/2ⁿ > alpha``)."""
    if 2.0 / 2 ** d.size > alpha and d.size <= _EXACT_MAX_N:
        return -math.inf, math.inf
    mean, span = float(d.mean()), float(d.max() - d.min()) or max(abs(float(d.mean())), 1.0)

    def rejects(delta: float) -> bool:
        return _sign_flip_p(d - delta, signs) <= alpha

    bounds = []
    for direction in (-1.0, 1.0):
        inside, step = mean, span
        outside = mean + direction * step
        tries = 0
        while not rejects(outside):
            inside, step = outside, 2 * step
            outside = mean + direction * step
            tries += 1
            if tries > 60:
                return -math.inf, math.inf
        for _ in range(60):
            mid = 0.5 * (inside + outside)
            if rejects(mid):
                outside = mid
            else:
                inside = mid
        bounds.append(inside)
    return bounds[0], bounds[1]


def _verdict(effect_sign: float, lower_is_better: bool) -> str:
    a_higher = effect_sign > 0
    return "worse" if a_higher == lower_is_better else "better"


def paired_comparison(a: Sequence[float], b: Sequence[float], *, name: str = "a", baseline: str = "b",
                      metric: str = "metric", lower_is_better: bool = False, confidence: float = 0.95,
                      method: str = "t", seed: int = 0) -> Comparison:
    """Compare method ``a`` with method ``b`` from per-seed values measured on the same seeds and budget.

    Args:
        a: one value of method a per seed; ``a[s]`` and ``b[s]`` come from the same seed ``s`` (the pairing
            removes the seed-to-seed variation the two methods share).
        b: one value of method b (the baseline) per seed.
        name: what ``a`` is, used in :meth:`Comparison.sentence` and :func:`comparison_table`.
        baseline: what ``b`` is.
        metric: what the values measure.
        lower_is_better: ``True`` for losses and error rates, ``False`` for accuracies and scores.
        confidence: level of the interval, in (0, 1); the verdict is decided at ``1 − confidence``.
        method: ``"t"`` (paired t interval and test) or ``"sign-flip"`` (exact permutation test and its
            inverted interval; see the module docstring for what each assumes).
        seed: the generator of the Monte Carlo sign patterns of ``"sign-flip"`` beyond 12 seeds.

    Returns:
        A :class:`Comparison`; ``verdict`` is ``"better"``/``"worse"`` when the interval excludes 0 on that
        side for ``a`` against ``b`` (and there are at least :data:`~taskloss.results.compare.MIN_SEEDS` seeds and, for ``"t"``, a
        spread), else ``"inconclusive"`` (with the reason in ``note`` when it is not the interval).

    Raises:
        ValueError: fewer than 2 pairs, different lengths, NaN/inf values, confidence outside (0, 1),
            an unknown method.
        TypeError: non-numeric values, a non-bool ``lower_is_better``.
    """
    from scipy import stats

    av, bv = _as_1d("a", a), _as_1d("b", b)
    if av.shape != bv.shape:
        raise ValueError(f"a and b must hold one value per seed for the same seeds, got {av.size} and {bv.size}")
    if av.size < 2:
        raise ValueError(f"a paired comparison needs at least 2 seeds, got {av.size}")
    if not isinstance(lower_is_better, (bool, np.bool_)):
        raise TypeError(f"lower_is_better must be a bool, got {type(lower_is_better).__name__}")
    confidence = check_probability("confidence", confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    d = av - bv
    n, mean = d.size, float(d.mean())
    sd = float(d.std(ddof=1))
    alpha, note = 1.0 - confidence, ""
    if method == "t":
        if sd == 0.0:       # identical differences on every seed: no spread to estimate
            lo = hi = mean
            p = 1.0 if mean == 0.0 else math.nan
            if mean != 0.0:
                note = "the same difference on every seed: no spread, so no t interval (method='sign-flip' applies)"
        else:
            half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
            lo, hi = mean - half, mean + half
            p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:
        signs = _sign_patterns(n, seed)
        p = _sign_flip_p(d, signs) if np.any(d != 0) else 1.0
        lo, hi = _sign_flip_interval(d, signs, alpha) if np.any(d != 0) else (0.0, 0.0)
        if 2.0 / 2 ** n > alpha and n <= _EXACT_MAX_N:
            note = f"{n} seeds: the sign-flip test cannot reach p < {alpha:g} below {_min_sign_flip_n(alpha)} seeds"
    decided = (lo > 0 or hi < 0) and not note
    if n < MIN_SEEDS:
        note, decided = f"{n} seeds: no verdict from fewer than {MIN_SEEDS}", False
    verdict = _verdict(lo if lo > 0 else -1.0, lower_is_better) if decided else "inconclusive"
    return Comparison(name=name, baseline=baseline, metric=metric, n=n, mean_a=float(av.mean()),
                      mean_b=float(bv.mean()), effect=mean, ci_low=lo, ci_high=hi, p_value=p,
                      confidence=confidence, lower_is_better=bool(lower_is_better), verdict=verdict, method=method,
                      note=note)


def _min_sign_flip_n(alpha: float) -> int:
    return next(k for k in range(1, 64) if 2.0 / 2 ** k <= alpha)


def adjust(comparisons: Sequence[Comparison], method: str = "holm") -> list[Comparison]:
    """The comparisons of one family with adjusted p-values and verdicts: ``"holm"`` (Holm's step-down,
    family-wise error at ``1 − confidence``) or ``"bh"`` (Benjamini–Hochberg, false discovery rate). A
    comparison keeps its verdict only when its adjusted p-value is below ``1 − confidence`` (and it was decided
    at all); a comparison without a p-value (see ``note``) counts in the family and stays inconclusive.

    Raises:
        ValueError: an empty family, an unknown method, comparisons at different confidence levels.
        TypeError: an element that is not a :class:`Comparison`.
    """
    comps = list(comparisons)
    if not comps:
        raise ValueError("adjust needs at least one Comparison")
    for c in comps:
        if not isinstance(c, Comparison):
            raise TypeError(f"expected Comparison objects, got {type(c).__name__}")
    if method not in CORRECTIONS:
        raise ValueError(f"method must be one of {CORRECTIONS}, got {method!r}")
    levels = {c.confidence for c in comps}
    if len(levels) > 1:
        raise ValueError(f"a family's comparisons must share one confidence level, got {sorted(levels)}")
    alpha, m = 1.0 - levels.pop(), len(comps)
    p = np.array([1.0 if math.isnan(c.p_value) else c.p_value for c in comps])
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p[i]))
            adj[i] = running
    else:
        running = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            running = min(running, min(1.0, m * p[i] / (rank + 1)))
            adj[i] = running
    out = []
    for c, pa in zip(comps, adj):
        keep = c.verdict != "inconclusive" and pa < alpha
        out.append(replace(c, p_adjusted=float(pa), verdict_adjusted=c.verdict if keep else "inconclusive",
                           correction=method, family_size=m))
    return out


def comparison_table(comparisons: Sequence[Comparison], fmt: str = ".4g", *, correction: str | None = None) -> str:
    """A Markdown table of comparisons: metric, a vs b, seeds, means, effect, interval, p, verdict — and, with
    ``correction`` (``"holm"`` or ``"bh"``, see :func:`~taskloss.results.compare.adjust`; comparisons already adjusted keep theirs), the
    adjusted p-value and verdict, under a line saying how many comparisons the family holds and how many of
    its decided verdicts survive."""
    if not comparisons:
        raise ValueError("comparison_table needs at least one Comparison")
    comps = list(comparisons)
    for c in comps:
        if not isinstance(c, Comparison):
            raise TypeError(f"expected Comparison objects, got {type(c).__name__}")
    if correction is not None:
        comps = adjust(comps, correction)
    adjusted = all(c.correction is not None for c in comps)
    head = "| metric | comparison | seeds | mean a | mean b | effect (a − b) | CI | p | verdict |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if adjusted:
        head, rule = head + " adjusted p | verdict after correction |", rule + "---|---|"
    lines = [head, rule]
    for c in comps:
        arrow = "↓" if c.lower_is_better else "↑"
        p = "—" if math.isnan(c.p_value) else f"{c.p_value:.2g}"
        verdict = f"**{c.verdict}**" + (f" ({c.note})" if c.note else "")
        row = (f"| {c.metric} {arrow} | {c.name} vs {c.baseline} | {c.n} | {c.mean_a:{fmt}} | {c.mean_b:{fmt}} "
               f"| {c.effect:+{fmt}} | [{c.ci_low:{fmt}}, {c.ci_high:{fmt}}] | {p} | {verdict} |")
        if adjusted:
            row += f" {c.p_adjusted:.2g} | **{c.verdict_adjusted}** |"
        lines.append(row)
    if adjusted:
        decided = sum(c.verdict != "inconclusive" for c in comps)
        kept = sum(c.verdict_adjusted != "inconclusive" for c in comps)
        name = _CORRECTION_NAMES[comps[0].correction]
        lines.insert(0, f"{len(comps)} comparisons; {name} correction across them: {kept} of the {decided} "
                        f"decided verdicts survive.\n")
    return "\n".join(lines)
