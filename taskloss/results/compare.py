"""Paired comparisons of two methods run on the same seeds: estimand, effect, confidence interval, p-value,
minimum detectable effect and a verdict, and the family-wise view of a table of them.

Every notebook that compares methods goes through :func:`paired_comparison`, so "better" always means the same
thing: the two methods ran with the same seeds and budget, the per-seed differences ``d_s = a_s − b_s`` were
measured, and a test whose false-positive rate is measured (``tests/results/test_calibration.py``) rejects "no
difference" for the declared **estimand** on the better side. Otherwise the verdict is ``"inconclusive"`` — never a
win or a loss — and the table says how large an effect the comparison could have detected (its MDE).

The estimands (``estimand=``), each with the test that holds its level for it
(:mod:`taskloss.results.procedures` derives them):

- ``"median"`` (default): the median of the per-seed differences — does a beat b on a typical seed, by how much.
  Exact sign test and the order-statistic interval: the false-positive rate stays at or under the nominal level
  for every outcome shape (normal, heavy-tailed, skewed). It needs seeds: at least 6 to reach p < 0.05 at all,
  about 10 for a Holm family of ten comparisons.
- ``"win-rate"``: the probability that a beats b on the same seed (ties count half); the same exact sign test,
  with a Clopper–Pearson interval.
- ``"mean"``: the mean difference, Student's t (``method="t"``) or the exact sign-flip permutation test
  (``method="sign-flip"``). Both hold their level only when the differences are symmetric about their mean; no
  test of a mean can do without such an assumption (Bahadur & Savage 1956), and on skewed differences the t-test
  declares 10–30 % false differences at 3–10 seeds. So a mean is decided only when the caller declares
  ``symmetric=True`` (differences normal or symmetric by construction); otherwise its interval and p-value are
  reported and the verdict is ``"inconclusive"`` with the reason in ``note``.

No verdict is decided from fewer than :data:`~taskloss.results.compare.MIN_SEEDS` seeds, nor by the t-test from
differences that are the same on every seed (a zero-width interval and p = 0 would be an artefact). With fewer
than 2 seeds nothing can be computed: an error.

The **minimum detectable effect** (``mde``) is the smallest effect the comparison detects with 80 % probability at
its level, from the recorded spread of the differences (:func:`~taskloss.results.procedures.minimum_detectable_effect`):
in the outcome's units for ``"mean"`` and ``"median"`` (the latter through a normal shift model), a win
probability for ``"win-rate"``; ``inf`` when the seeds cannot decide anything at that level.

A table of many comparisons decides some by chance. :func:`~taskloss.results.compare.adjust` applies a Holm
(family-wise error) or Benjamini–Hochberg (false discovery rate) correction across a family of comparisons and
gives each its adjusted p-value, verdict and the MDE at the family's strictest level (α/m); :func:`comparison_table`
prints both and labels the per-comparison interval "uncorrected", and :meth:`taskloss.results.run.Run.comparison_table`
records the corrected verdicts for the closing text.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np

from taskloss.results.procedures import median_interval, minimum_detectable_effect, sign_test, win_rate_interval
from taskloss.validation import check_probability

__all__ = ["Comparison", "paired_comparison", "comparison_table", "adjust", "VERDICTS", "METHODS", "CORRECTIONS",
           "ESTIMANDS", "MIN_SEEDS", "POWER"]

VERDICTS = ("better", "worse", "inconclusive")
ESTIMANDS = ("median", "win-rate", "mean")
METHODS = ("sign", "t", "sign-flip")     # the sign test (median, win-rate); t and sign-flip (mean)
POWER = 0.8                              # the power at which every minimum detectable effect is stated
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
    effect: float             # the estimand's estimate: median or mean of a − b, or P(a beats b)
    ci_low: float             # confidence interval of the effect (per comparison: uncorrected for a family)
    ci_high: float
    p_value: float            # NaN where no test applies (see ``note``)
    confidence: float
    lower_is_better: bool
    verdict: str              # "better" / "worse" / "inconclusive": a against b
    method: str               # "sign", "t" or "sign-flip"
    note: str = ""            # why no verdict was decided, when that is not the test
    estimand: str = "median"  # "median", "win-rate" or "mean" (see the module docstring)
    sd: float = math.nan      # standard deviation of the per-seed differences (the spread the MDE uses)
    mde: float = math.nan     # minimum detectable effect at 80 % power, level 1 − confidence
    n_tested: int | None = None  # seeds the test used (the sign test drops tied seeds)
    p_adjusted: float | None = None       # after a family-wise correction (:func:`~taskloss.results.compare.adjust`)
    verdict_adjusted: str | None = None
    correction: str | None = None         # "holm" or "bh"
    family_size: int | None = None        # comparisons in the family
    mde_family: float | None = None       # minimum detectable effect at the family's strictest level, α/m

    def as_dict(self) -> dict[str, Any]:
        """Every field as a dict (what :meth:`taskloss.results.run.Run.compare` records)."""
        return asdict(self)

    def sentence(self, fmt: str = ".3g") -> str:
        """One sentence a notebook can print or render: the verdict with its numbers (the family-corrected one
        when :func:`~taskloss.results.compare.adjust` was applied; the interval is then labelled uncorrected)."""
        _check_fmt(fmt)
        pct = f"{100 * self.confidence:.0f} %"
        unc = " (uncorrected)" if self.correction is not None else ""
        ci = f"{pct} CI{unc} [{self.ci_low:{fmt}}, {self.ci_high:{fmt}}]"
        what = {"median": "median difference", "mean": "mean difference", "win-rate": "win rate"}[self.estimand]
        eff = f"{self.effect:{fmt}}" if self.estimand == "win-rate" else f"{self.effect:+{fmt}}"
        diff = f"{self.metric} {self.mean_a:{fmt}} vs {self.mean_b:{fmt}} (means), {what} {eff}"
        p = "p undefined" if math.isnan(self.p_value) else f"p = {self.p_value:.2g}"
        stats = f"{ci}, {p}, {self.n} seeds, {_mde_text(self, fmt)}"
        if self.correction is not None:
            stats += (f"; {_CORRECTION_NAMES[self.correction]} across {self.family_size} comparisons: "
                      f"adjusted p = {self.p_adjusted:.2g}")
        verdict = self.verdict if self.verdict_adjusted is None else self.verdict_adjusted
        if verdict == "inconclusive":
            why = self.note or ("not significant after the correction" if self.verdict != "inconclusive"
                                else "the test does not reject no difference")
            return f"{self.name} vs {self.baseline}: inconclusive ({diff}; {stats}; {why})."
        return f"{self.name} is {verdict} than {self.baseline} ({diff}; {stats})."

    def detectable(self, fmt: str = ".3g") -> str:
        """What this comparison could detect, for a sentence: the minimum detectable effect at 80 % power (at the
        family's level once :func:`~taskloss.results.compare.adjust` was applied), or that its untied seeds can
        decide no difference of any size at that level.

        Args:
            fmt: the format of the effect.
        """
        _check_fmt(fmt)
        return _detectable(self, fmt)


def _detectable(c: Comparison, fmt: str) -> str:
    mde = c.mde if c.mde_family is None else c.mde_family
    if math.isnan(mde):
        return "no detectable effect defined (no spread recorded)"
    if math.isinf(mde):
        return f"no difference of any size is decidable at {c.n_tested if c.n_tested is not None else c.n} untied seeds"
    after = "" if c.mde_family is None else " after the correction"
    unit = " win rate" if c.estimand == "win-rate" else ""
    return f"smallest effect detectable{after} {mde:{fmt}}{unit}"


def _mde_text(c: Comparison, fmt: str) -> str:
    mde = c.mde if c.mde_family is None else c.mde_family
    level = "" if c.mde_family is None else " at the family's level"
    if math.isnan(mde):
        return "MDE undefined"
    if math.isinf(mde):
        return f"no effect detectable with {c.n} seeds{level}"
    unit = " win rate" if c.estimand == "win-rate" else ""
    return f"MDE{level} {mde:{fmt}}{unit}"


def _check_fmt(fmt) -> None:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format spec string such as '.3g', got {type(fmt).__name__}")
    try:
        format(1.0, fmt)
    except ValueError as e:
        raise ValueError(f"fmt {fmt!r} is not a format spec for floats: {e}") from None


_CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini–Hochberg"}


def _as_1d(name: str, x) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.dtype.kind in "fiu" and x.ndim == 1:      # the common case, fast
        arr = x.astype(np.float64)
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or inf: {arr.tolist()}")
        return arr
    if isinstance(x, np.ndarray) and x.dtype.kind == "c":
        raise TypeError(f"{name} must hold real numbers (one per seed), got complex values")
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


@functools.lru_cache(maxsize=None)
def _t_quantile(df: int, q: float) -> float:
    from scipy import special

    return float(special.stdtrit(df, q))


def _verdict(effect_sign: float, lower_is_better: bool) -> str:
    a_higher = effect_sign > 0
    return "worse" if a_higher == lower_is_better else "better"


def paired_comparison(a: Sequence[float], b: Sequence[float], *, name: str = "a", baseline: str = "b",
                      metric: str = "metric", lower_is_better: bool = False, confidence: float = 0.95,
                      estimand: str = "median", symmetric: bool = False, method: str | None = None,
                      seed: int = 0) -> Comparison:
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
        estimand: ``"median"`` (default) or ``"win-rate"`` — the exact sign test, valid for every outcome shape —
            or ``"mean"`` (see the module docstring).
        symmetric: for ``estimand="mean"`` only: declare that the per-seed differences are symmetric about their
            mean (normal outcomes, or symmetric by construction); without it a mean is reported but not decided.
        method: the test; ``None`` picks the estimand's (``"sign"`` for median and win rate, ``"t"`` for the
            mean); ``"sign-flip"`` is the exact permutation test of a mean (under the same symmetry).
        seed: the generator of the Monte Carlo sign patterns of ``"sign-flip"`` beyond 12 seeds (an int).

    Returns:
        A :class:`Comparison`; ``verdict`` is ``"better"``/``"worse"`` when the test rejects "no difference" for
        the estimand on that side for ``a`` against ``b`` (and there are at least
        :data:`~taskloss.results.compare.MIN_SEEDS` seeds), else ``"inconclusive"`` (with the reason in ``note``
        when it is not the test); ``mde`` the minimum detectable effect at 80 % power.

    Raises:
        ValueError: fewer than 2 pairs, different lengths, NaN/inf values, confidence outside (0, 1), an unknown
            estimand or method, a method that does not test the estimand.
        TypeError: non-numeric values, a non-bool ``lower_is_better`` or ``symmetric``, a non-int ``seed``,
            non-string labels.
    """
    from scipy import special

    av, bv = _as_1d("a", a), _as_1d("b", b)
    if av.shape != bv.shape:
        raise ValueError(f"a and b must hold one value per seed for the same seeds, got {av.size} and {bv.size}")
    if av.size < 2:
        raise ValueError(f"a paired comparison needs at least 2 seeds, got {av.size}")
    for flag, value in (("lower_is_better", lower_is_better), ("symmetric", symmetric)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
    for label, value in (("name", name), ("baseline", baseline), ("metric", metric)):
        if not isinstance(value, str):
            raise TypeError(f"{label} must be a str, got {type(value).__name__}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    confidence = check_probability("confidence", confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if estimand not in ESTIMANDS:
        raise ValueError(f"estimand must be one of {ESTIMANDS}, got {estimand!r}")
    if method is None:
        method = "t" if estimand == "mean" else "sign"
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (or None for the estimand's own), got {method!r}")
    if (method == "sign") != (estimand != "mean"):
        raise ValueError(f"method {method!r} does not test the {estimand}: the sign test decides the median and the "
                         "win rate, 't' and 'sign-flip' the mean")
    if symmetric and estimand != "mean":
        raise ValueError("symmetric=True is a declaration for estimand='mean'; the sign test needs no assumption")
    d = av - bv
    n = d.size
    sd = float(d.std(ddof=1))
    alpha, note = 1.0 - confidence, ""
    if method == "sign":
        pos, neg = int((d > 0).sum()), int((d < 0).sum())
        ties = n - pos - neg
        p = sign_test(pos, neg)
        if estimand == "median":
            effect = float(np.median(d))
            lo, hi = median_interval(d, alpha)
        else:
            a_wins, a_loses = (neg, pos) if lower_is_better else (pos, neg)
            effect = (a_wins + ties / 2) / n
            lo, hi = win_rate_interval(a_wins, a_loses, ties, alpha)
        direction = float(pos - neg)
        if 2.0 / 2 ** (pos + neg) >= alpha:
            note = (f"{pos + neg} seeds with a difference: the sign test cannot reach p < {alpha:g} below "
                    f"{_min_sign_n(alpha)}")
        null = 0.0 if estimand == "median" else 0.5
        decided = p < alpha and (lo > null or hi < null) and not note     # the test and its interval agree
        mde = minimum_detectable_effect(estimand, pos + neg, sd, alpha, POWER)
        n_tested = pos + neg
    else:
        mean = float(d.mean())
        effect = mean
        if method == "t":
            if sd == 0.0:       # identical differences on every seed: no spread to estimate
                lo = hi = mean
                p = 1.0 if mean == 0.0 else math.nan
                if mean != 0.0:
                    note = "the same difference on every seed: no spread, so no t interval (estimand='median' applies)"
            else:
                half = _t_quantile(n - 1, 0.5 + confidence / 2) * sd / math.sqrt(n)
                lo, hi = mean - half, mean + half
                p = float(2 * special.stdtr(n - 1, -abs(mean) / (sd / math.sqrt(n))))
        else:
            signs = _sign_patterns(n, int(seed))
            p = _sign_flip_p(d, signs) if np.any(d != 0) else 1.0
            lo, hi = _sign_flip_interval(d, signs, alpha) if np.any(d != 0) else (0.0, 0.0)
            if 2.0 / 2 ** n > alpha and n <= _EXACT_MAX_N:
                note = f"{n} seeds: the sign-flip test cannot reach p < {alpha:g} below {_min_sign_n(alpha)} seeds"
        direction = mean
        decided = (lo > 0 or hi < 0) and not note
        if decided and not symmetric:
            note = ("a mean of possibly skewed differences is not decided: no test holds its level for it at a few "
                    "seeds; declare symmetric=True if the differences are symmetric, or compare medians")
            decided = False
        exact_cannot = method == "sign-flip" and 2.0 / 2 ** n >= alpha
        mde = math.inf if exact_cannot else minimum_detectable_effect("mean", n, sd, alpha, POWER)
        n_tested = n
    if n < MIN_SEEDS:
        note, decided = f"{n} seeds: no verdict from fewer than {MIN_SEEDS}", False
    verdict = _verdict(direction, lower_is_better) if decided else "inconclusive"
    return Comparison(name=name, baseline=baseline, metric=metric, n=n, mean_a=float(av.mean()),
                      mean_b=float(bv.mean()), effect=float(effect), ci_low=float(lo), ci_high=float(hi),
                      p_value=float(p), confidence=confidence, lower_is_better=bool(lower_is_better),
                      verdict=verdict, method=method, note=note, estimand=estimand, sd=sd, mde=float(mde),
                      n_tested=n_tested)


def _min_sign_n(alpha: float) -> int:
    """The fewest non-tied seeds at which an exact sign or sign-flip test can reach p < alpha (2/2^n < alpha)."""
    return next(k for k in range(1, 64) if 2.0 / 2 ** k < alpha)


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
        n_used = c.n if c.n_tested is None else c.n_tested
        mde_family = minimum_detectable_effect(c.estimand, n_used, c.sd, alpha / m, POWER) if m > 1 else c.mde
        out.append(replace(c, p_adjusted=float(pa), verdict_adjusted=c.verdict if keep else "inconclusive",
                           correction=method, family_size=m, mde_family=float(mde_family)))
    return out


def comparison_table(comparisons: Sequence[Comparison], fmt: str = ".4g", *, correction: str | None = None) -> str:
    """A Markdown table of comparisons: metric, a vs b, estimand, seeds, means, effect, interval, p, minimum
    detectable effect, verdict — and, with ``correction`` (``"holm"`` or ``"bh"``, see
    :func:`~taskloss.results.compare.adjust`; comparisons already adjusted keep theirs), the adjusted p-value, the
    MDE at the family's level and the corrected verdict, under a line saying how many comparisons the family holds
    and how many of its decided verdicts survive. In a corrected table the interval and p of each row are
    labelled uncorrected.

    Raises:
        ValueError: no comparisons, a ``fmt`` that does not format floats, an unknown correction.
        TypeError: an element that is not a :class:`Comparison`, a non-string ``fmt``.
    """
    if isinstance(comparisons, (str, bytes, dict, Comparison)) or not hasattr(comparisons, "__iter__") \
            or getattr(comparisons, "ndim", 1) == 0:
        raise TypeError(f"comparisons must be a sequence of Comparison objects, got {type(comparisons).__name__}")
    comps = list(comparisons)
    if not comps:
        raise ValueError("comparison_table needs at least one Comparison")
    _check_fmt(fmt)
    for c in comps:
        if not isinstance(c, Comparison):
            raise TypeError(f"expected Comparison objects, got {type(c).__name__}")
    if correction is not None:
        comps = adjust(comps, correction)
    adjusted = all(c.correction is not None for c in comps)
    unc = " (uncorrected)" if adjusted else ""
    head = (f"| metric | comparison | estimand | seeds | mean a | mean b | effect | CI{unc} | p{unc} "
            f"| MDE (80 % power) | verdict{unc} |")
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    if adjusted:
        head, rule = head + " adjusted p | MDE at the family's level | verdict after correction |", rule + "---|---|---|"
    lines = [head, rule]

    def mde(value: float, c: Comparison) -> str:
        if math.isnan(value):
            return "—"
        if math.isinf(value):
            return f"none at {c.n_tested if c.n_tested is not None else c.n} seeds"
        return f"{value:{fmt}}"

    for c in comps:
        arrow = "↓" if c.lower_is_better else "↑"
        p = "—" if math.isnan(c.p_value) else f"{c.p_value:.2g}"
        verdict = f"**{c.verdict}**" + (f" ({c.note})" if c.note else "")
        effect = f"{c.effect:{fmt}}" if c.estimand == "win-rate" else f"{c.effect:+{fmt}}"
        row = (f"| {c.metric} {arrow} | {c.name} vs {c.baseline} | {_ESTIMAND_LABELS[c.estimand]} | {c.n} "
               f"| {c.mean_a:{fmt}} | {c.mean_b:{fmt}} | {effect} | [{c.ci_low:{fmt}}, {c.ci_high:{fmt}}] | {p} "
               f"| {mde(c.mde, c)} | {verdict} |")
        if adjusted:
            row += f" {c.p_adjusted:.2g} | {mde(c.mde_family, c)} | **{c.verdict_adjusted}** |"
        lines.append(row)
    if adjusted:
        decided = sum(c.verdict != "inconclusive" for c in comps)
        kept = sum(c.verdict_adjusted != "inconclusive" for c in comps)
        name = _CORRECTION_NAMES[comps[0].correction]
        lines.insert(0, f"{len(comps)} comparisons; {name} correction across them: {kept} of the {decided} "
                        f"decided verdicts survive.\n")
    return "\n".join(lines)


_ESTIMAND_LABELS = {"median": "median a − b", "mean": "mean a − b", "win-rate": "P(a beats b)"}
