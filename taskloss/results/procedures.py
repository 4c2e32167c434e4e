"""The tests behind :func:`~taskloss.results.compare.paired_comparison`, one per estimand, and their power.

Each function takes the per-seed differences ``d_s = a_s − b_s`` (or what the test needs of them) and returns
numbers; the verdict logic lives in :mod:`taskloss.results.compare`.

- **Median and win rate: the exact sign test.** Under the null "a beats b on a seed as often as b beats a"
  (the median difference is 0, the win rate of the non-tied seeds ½) the number of positive differences among
  the ``m`` non-zero ones is Binomial(m, ½) *whatever the shape of the outcomes* (skewed, heavy-tailed, with
  outliers). The two-sided p-value is ``min(1, 2·P(B ≤ min(k, m − k)))``; it holds its level exactly up to the
  discreteness of the binomial, so its false-positive rate never exceeds the nominal one. The price is that few
  seeds cannot reach a small p at all: ``2/2^m`` is the smallest p, so 5 seeds never reach 0.05 and a Holm family
  of 10 needs about 10 seeds. The distribution-free interval of the median is the pair of order statistics
  ``[d_(k), d_(m−k+1)]`` that the same binomial tails define (the test's inversion).
- **Mean: Student's t** (or the sign-flip permutation test), valid when the differences are symmetric about
  their mean — normal or heavy-tailed symmetric outcomes. No test of a mean holds its level over all
  distributions with a finite mean (Bahadur & Savage, *Ann. Math. Statist.* 27 (1956) 1115–1122): on skewed
  differences (steps to a target, divergence-prone losses) the t-test declares 10–30 % false differences at
  3–10 seeds (``tests/results/test_calibration.py``), so the mean is tested only when the caller declares the
  differences symmetric.

Power: :func:`minimum_detectable_effect` is the smallest effect the test detects with probability ``power``
(80 % by default) at level ``alpha`` and the recorded spread — for the sign test a win probability, turned into
the outcome's units through a normal shift model, for the t-test the non-central t's answer.

Defined in ``taskloss.results`` (used by every notebook's comparison tables; the calibration is measured in
``tests/results/test_calibration.py``).
"""
from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

__all__ = ["sign_test", "median_interval", "win_rate_interval", "minimum_detectable_effect",
           "sign_test_mde_win_rate", "t_test_mde_in_sd"]


@lru_cache(maxsize=None)
def _binom_cdf_half(m: int) -> tuple[float, ...]:
    """``P(B ≤ k)`` for B ~ Binomial(m, ½), k = 0 … m (exact integers, then one division)."""
    total, out, acc = 2 ** m, [], 0
    for k in range(m + 1):
        acc += math.comb(m, k)
        out.append(acc / total)
    return tuple(out)


def sign_test(n_pos: int, n_neg: int) -> float:
    """Two-sided exact sign-test p-value of ``n_pos`` positive against ``n_neg`` negative differences (zeros
    dropped beforehand): ``min(1, 2·P(B ≤ min(n_pos, n_neg)))`` with B ~ Binomial(n_pos + n_neg, ½); 1 when no
    difference is non-zero."""
    m = n_pos + n_neg
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * _binom_cdf_half(m)[min(n_pos, n_neg)])


def _order_index(m: int, alpha: float) -> int:
    """The largest ``k ≥ 1`` with ``2·P(B ≤ k − 1) ≤ alpha`` (B ~ Binomial(m, ½)), 0 when none: the interval
    ``[d_(k), d_(m−k+1)]`` then covers the median with probability ≥ 1 − alpha."""
    cdf = _binom_cdf_half(m)
    k = 0
    while k < m and 2.0 * cdf[k] <= alpha:
        k += 1
    return k


def median_interval(d: np.ndarray, alpha: float) -> tuple[float, float]:
    """The distribution-free ``1 − alpha`` interval of the median of ``d`` from its order statistics (the sign
    test's inversion); ``(−inf, inf)`` when ``len(d)`` is too small for any pair to reach that coverage."""
    s = np.sort(np.asarray(d, dtype=np.float64))
    k = _order_index(s.size, alpha)
    if k == 0:
        return -math.inf, math.inf
    return float(s[k - 1]), float(s[s.size - k])


def win_rate_interval(wins: int, losses: int, ties: int, alpha: float) -> tuple[float, float]:
    """Clopper–Pearson ``1 − alpha`` interval of the win probability among non-tied seeds, mapped to the win rate
    with ties counted half (``w = q·(1 − t) + t/2`` at the observed tie share ``t``)."""
    from scipy import special

    m, n = wins + losses, wins + losses + ties
    if m == 0:
        return 0.5, 0.5
    lo = 0.0 if wins == 0 else float(special.betaincinv(wins, losses + 1, alpha / 2))
    hi = 1.0 if losses == 0 else float(special.betaincinv(wins + 1, losses, 1 - alpha / 2))
    t = ties / n
    return lo * (1 - t) + t / 2, hi * (1 - t) + t / 2


@lru_cache(maxsize=None)
def sign_test_mde_win_rate(m: int, alpha: float, power: float = 0.8) -> float:
    """The smallest win probability ``q`` (of a non-tied seed) at which the two-sided sign test on ``m`` seeds
    rejects with probability ≥ ``power`` at level ``alpha``; ``inf`` when even ``q = 1`` cannot (too few seeds:
    ``2/2^m > alpha``). Exact binomial power, bisection on ``q``."""
    from scipy import stats

    if m == 0:
        return math.inf
    cdf = _binom_cdf_half(m)
    reject = [k for k in range(m + 1) if min(1.0, 2.0 * cdf[min(k, m - k)]) < alpha]
    upper = [k for k in reject if k > m / 2]           # the side a winning method lands on
    if not upper:
        return math.inf
    k_min = min(upper)

    def pw(q: float) -> float:
        return float(stats.binom.sf(k_min - 1, m, q))

    if pw(1.0) < power:
        return math.inf
    lo, hi = 0.5, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if pw(mid) >= power else (mid, hi)
    return hi


@lru_cache(maxsize=None)
def t_test_mde_in_sd(n: int, alpha: float, power: float = 0.8) -> float:
    """The smallest mean difference, in units of the differences' standard deviation, that the two-sided paired
    t-test on ``n`` seeds detects with probability ``power`` at level ``alpha`` (non-central t, root on δ)."""
    from scipy import optimize, stats

    if n < 2:
        return math.inf
    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))

    def pw(delta: float) -> float:
        nc = delta * math.sqrt(n)
        out = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
        if math.isnan(out):       # scipy's non-central t loses itself far in the tail (df = 1, large nc)
            return 1.0 if nc > crit else 0.0
        return min(out, 1.0)

    hi = 1.0
    while pw(hi) < power:
        hi *= 2
        if hi > 1e6:
            return math.inf
    return float(optimize.brentq(lambda x: pw(x) - power, 0.0, hi, xtol=1e-10))


def minimum_detectable_effect(estimand: str, n: int, sd: float, alpha: float, power: float = 0.8) -> float:
    """The smallest effect a comparison of ``n`` seeds detects with probability ``power`` at level ``alpha``.

    Args:
        estimand: ``"median"`` (sign test; the effect in the outcome's units through a normal shift model with
            standard deviation ``sd``: a median difference δ wins a seed with probability Φ(δ/sd)), ``"win-rate"``
            (sign test; the effect is the win probability itself, ``sd`` unused) or ``"mean"`` (t-test; δ in the
            outcome's units).
        n: the number of (non-tied) seeds the test uses.
        sd: standard deviation of the per-seed differences.
        alpha: the test's level (``1 − confidence``, or a family-corrected level).
        power: probability of detecting an effect of the returned size.

    Returns:
        The effect size (``inf`` when the test cannot detect any effect at that level with ``n`` seeds).

    Raises:
        ValueError: an unknown estimand, a negative ``n`` or ``sd``, NaN, ``alpha`` or ``power`` outside (0, 1).
        TypeError: a non-integer ``n``, a non-number ``sd``/``alpha``/``power``, a non-string estimand.
    """
    if not isinstance(estimand, str) or estimand not in ("median", "win-rate", "mean"):
        raise ValueError(f"estimand must be 'median', 'win-rate' or 'mean', got {estimand!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int (the seeds the test uses), got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"n must be ≥ 0, got {n}")
    n = int(n)
    for name, value in (("sd", sd), ("alpha", alpha), ("power", power)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    sd, alpha, power = float(sd), float(alpha), float(power)
    if not sd >= 0 or math.isinf(sd):
        raise ValueError(f"sd must be finite and ≥ 0, got {sd}")
    for name, value in (("alpha", alpha), ("power", power)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {value}")
    if estimand == "mean":
        return t_test_mde_in_sd(n, alpha, power) * sd
    q = sign_test_mde_win_rate(n, alpha, power)
    if estimand == "win-rate" or math.isinf(q):
        return q
    return NormalDist().inv_cdf(q) * sd
