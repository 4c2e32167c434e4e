"""Committed headline numbers, checked against a fresh run — exactly where the bits can match, within the
notebook's own variability where they cannot.

``make notebooks`` stores each notebook's headline results (``run.record(key, value, headline=True)``) in the
committed ``.ipynb`` metadata under ``metadata["taskloss"]["headline"]``, beside the numerics fingerprint of the
machine that computed them (``metadata["taskloss"]["fingerprint"]``, :mod:`taskloss.results.fingerprint`).
``make test`` executes every notebook with ``TASKLOSS_CHECK_HEADLINES=1``; each headline ``record`` then compares
the fresh value with the committed one and raises :class:`HeadlineMismatch` (the cell fails, so nbval fails) when
they differ by more than the headline's tolerance. Which tolerance depends on the machine:

- **Same numerics** (every entry of :data:`~taskloss.results.fingerprint.NUMERICS_KEYS` equal): the fresh run
  computes the same bits, so ``|fresh − committed| <= atol + rtol·|committed|`` with the strict ``rtol = 1e-3``,
  ``atol = 1e-8`` (a notebook passes ``rtol=``/``atol=`` to ``record`` for a value known to vary more). A
  difference means the code changed or the outputs were edited: refresh them with ``make notebooks``.
- **Other numerics** (another processor, another ``ATEN_CPU_CAPABILITY``, BLAS, thread count or library version):
  vectorized kernels round differently in the last bit, and a training loop amplifies that into another
  trajectory. A headline is then held to its *cross-machine* tolerance: the strict one for a value that is a
  closed form or a fixed-seed estimate (round-off only: the default), a declared :class:`Tolerance` with its
  reason, or one computed from the per-seed values the headline summarizes (:func:`seed_spread`). A recorded
  paired comparison carries its own spread: its effect must lie within ``z`` standard errors of a difference
  between two independent runs (``z·sd(a − b)·√(2/n)``), and its verdict may move to or from
  ``"inconclusive"`` but never reverse. A mismatch message names both fingerprints.

Strings other than verdicts must match exactly on every machine.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

from taskloss.results.fingerprint import describe, fingerprint_differences
from taskloss.utils import REPO_ROOT

__all__ = ["HEADLINE_RTOL", "HEADLINE_ATOL", "SPREAD_Z", "METADATA_KEY", "CHECK_ENV", "HeadlineMismatch",
           "Tolerance", "seed_spread", "correlation_spread", "CommittedRun", "committed_run", "committed_headlines", "headline_difference",
           "portable_difference", "mismatch_message", "check_tolerances"]

HEADLINE_RTOL = 1e-3
HEADLINE_ATOL = 1e-8
SPREAD_Z = 4.0      # standard errors of a difference between two independent runs (two-sided p ≈ 6e-5)
METADATA_KEY = "taskloss"
CHECK_ENV = "TASKLOSS_CHECK_HEADLINES"
_VERDICTS = ("better", "inconclusive", "worse")


class HeadlineMismatch(AssertionError):
    """A fresh headline result differs from the one committed in the notebook."""


@dataclass(frozen=True)
class Tolerance:
    """How far a headline may move on a machine with other numerics: ``|fresh − committed| <= atol +
    rtol·|committed|``, and why (the reason is printed with a mismatch)."""

    rtol: float = HEADLINE_RTOL
    atol: float = HEADLINE_ATOL
    reason: str = "a closed form or fixed-seed estimate: round-off only"

    def __post_init__(self):
        check_tolerances("Tolerance.", rtol=self.rtol, atol=self.atol)
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("a Tolerance needs a reason (why the value varies across machines)")

    def as_dict(self) -> dict[str, Any]:
        """The tolerance as JSON-ready data (stored in ``results.json``)."""
        return {"rtol": self.rtol, "atol": self.atol, "reason": self.reason}


def check_tolerances(prefix: str = "", **tols) -> None:
    """Raise ``ValueError`` unless every tolerance is a finite number ≥ 0 (0: exact; a NaN would make every
    comparison pass or fail silently, a negative one every comparison fail)."""
    for name, v in tols.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{prefix}{name} must be a finite number >= 0, got {v!r}")


def _finite_values(name: str, values: Sequence[float]) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}") from None
    if any(not math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def seed_spread(values: Sequence[float], *, z: float = SPREAD_Z, atol: float = HEADLINE_ATOL) -> Tolerance:
    """The cross-machine tolerance of a headline that averages ``values`` (one per seed): ``z`` standard errors
    of the difference between the means of two independent runs over the same number of seeds,
    ``z·sd·√(2/n)`` (plus ``atol``). Two machines start every seed from the same point and decorrelate during
    training, so the actual difference is usually smaller; a larger one is not explained by the seeds' spread.

    Raises:
        ValueError: fewer than 2 values, a non-finite value, ``z`` not positive.
    """
    v = _finite_values("values", values)
    check_tolerances(atol=atol)
    if len(v) < 2:
        raise ValueError(f"seed_spread needs at least 2 per-seed values, got {len(v)}")
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    n, mean = len(v), math.fsum(v) / len(v)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1))
    return Tolerance(rtol=0.0, atol=z * sd * math.sqrt(2.0 / n) + atol,
                     reason=f"{z:g} standard errors of a difference of two {n}-seed means (seed sd {sd:.3g})")


def correlation_spread(r: float, n: int, *, z: float = SPREAD_Z) -> Tolerance:
    """The cross-machine tolerance of a Pearson correlation ``r`` of ``n`` points of one trajectory: ``z``
    standard errors of the difference of two independent correlations in Fisher's z (``√(2/(n − 3))``), mapped
    back to r at ``r`` (the wider side). Autocorrelated points carry less information than ``n`` independent
    ones, so the bound is, if anything, too narrow — a value outside it is not explained by the sampling
    error of r.

    Raises:
        ValueError: ``r`` outside (−1, 1) or not finite, ``n`` < 4, ``z`` not positive.
    """
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not -1.0 < float(r) < 1.0:
        raise ValueError(f"r must be a correlation in (-1, 1), got {r!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 4:
        raise ValueError(f"n must be an int >= 4, got {n!r}")
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    w = z * math.sqrt(2.0 / (n - 3))
    fz = math.atanh(float(r))
    atol = max(abs(math.tanh(fz + w) - r), abs(math.tanh(fz - w) - r))
    return Tolerance(rtol=0.0, atol=atol, reason=f"{z:g} standard errors of a difference of two correlations "
                                                 f"of {n} points (Fisher z)")


@dataclass(frozen=True)
class CommittedRun:
    """What the committed notebook holds for the check: its headline results and the fingerprint of the machine
    that computed them (``None`` for a notebook committed before fingerprints were recorded)."""

    headline: dict[str, Any]
    fingerprint: dict[str, Any] | None


def committed_run(name: str) -> CommittedRun | None:
    """The committed headline results and fingerprint of ``notebooks/<name>.ipynb`` when
    ``TASKLOSS_CHECK_HEADLINES`` is set (``None`` otherwise, or when the notebook is not one of the repository's)."""
    if not os.environ.get(CHECK_ENV):
        return None
    path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return None
    ours = meta.get(METADATA_KEY) or {}
    return CommittedRun(headline=ours.get("headline", {}), fingerprint=ours.get("fingerprint"))


def committed_headlines(name: str) -> dict[str, Any] | None:
    """The committed headline results of ``notebooks/<name>.ipynb`` (see :func:`committed_run`)."""
    run = committed_run(name)
    return None if run is None else run.headline


def headline_difference(committed: Any, fresh: Any, *, rtol: float = HEADLINE_RTOL,
                        atol: float = HEADLINE_ATOL, path: str = "") -> str | None:
    """``None`` when ``fresh`` matches ``committed`` (numbers within tolerance, recursively through lists and
    dicts), else a sentence naming the first difference.

    Raises:
        ValueError: ``rtol`` or ``atol`` not a finite number ≥ 0."""
    check_tolerances(rtol=rtol, atol=atol)
    where = f" at {path}" if path else ""
    if isinstance(committed, bool) or isinstance(fresh, bool) or isinstance(committed, str):
        same = type(committed) is type(fresh) and committed == fresh
        return None if same else f"{fresh!r} != committed {committed!r}{where}"
    if isinstance(committed, (int, float)) and isinstance(fresh, (int, float)):
        if math.isnan(committed) and math.isnan(fresh):
            return None
        if abs(fresh - committed) <= atol + rtol * abs(committed):
            return None
        return f"{fresh!r} differs from committed {committed!r}{where} (rtol {rtol:g}, atol {atol:g})"
    if isinstance(committed, list) and isinstance(fresh, list):
        if len(committed) != len(fresh):
            return f"{len(fresh)} values, committed {len(committed)}{where}"
        for i, (c, f) in enumerate(zip(committed, fresh)):
            diff = headline_difference(c, f, rtol=rtol, atol=atol, path=f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(committed, dict) and isinstance(fresh, dict):
        if set(committed) != set(fresh):
            return f"keys {sorted(fresh)} != committed {sorted(committed)}{where}"
        for k in committed:
            diff = headline_difference(committed[k], fresh[k], rtol=rtol, atol=atol, path=f"{path}.{k}")
            if diff:
                return diff
        return None
    return None if committed == fresh else f"{fresh!r} != committed {committed!r}{where}"


def _is_comparison(value: Any) -> bool:
    return isinstance(value, dict) and {"effect", "verdict", "a", "b"} <= set(value)


def _comparison_difference(committed: dict, fresh: dict, z: float) -> str | None:
    """A recorded paired comparison on another machine: same seeds count, effect within ``z·sd(a − b)·√(2/n)``
    of the committed one (sd of the committed per-seed differences), verdict not reversed."""
    if not _is_comparison(fresh):
        return f"{fresh!r} is not a recorded comparison like the committed one"
    ca, cb, fa, fb = (_finite_values(k, v) for k, v in
                      (("a", committed["a"]), ("b", committed["b"]), ("a", fresh["a"]), ("b", fresh["b"])))
    if len(fa) != len(ca) or len(fb) != len(cb):
        return f"{len(fa)} seeds, committed {len(ca)}"
    d = [x - y for x, y in zip(ca, cb)]         # the committed run's spread is the reference (a moved run's own
    n, m = len(d), math.fsum(d) / len(d)        # spread would widen the bound it is held to)
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    bound = z * sd * math.sqrt(2.0 / n) + HEADLINE_ATOL + HEADLINE_RTOL * abs(committed["effect"])
    if abs(fresh["effect"] - committed["effect"]) > bound:
        return (f"effect {fresh['effect']:.6g} differs from committed {committed['effect']:.6g} by more than "
                f"{bound:.3g} ({z:g} standard errors of a difference of two {n}-seed runs)")
    cv, fv = committed["verdict"], fresh["verdict"]
    if {cv, fv} == {"better", "worse"}:
        return f"verdict {fv!r} reverses the committed {cv!r}"
    if cv not in _VERDICTS or fv not in _VERDICTS:
        return None if cv == fv else f"verdict {fv!r} != committed {cv!r}"
    return None


def portable_difference(committed: Any, fresh: Any, tolerance: Tolerance | None = None, *,
                        z: float = SPREAD_Z) -> str | None:
    """:func:`headline_difference` for a fresh run on a machine with other numerics: a recorded comparison by its
    spread (see the module docstring), anything else within ``tolerance`` (the strict one when ``None``)."""
    if _is_comparison(committed):
        return _comparison_difference(committed, fresh, z)
    tol = tolerance or Tolerance()
    return headline_difference(committed, fresh, rtol=tol.rtol, atol=tol.atol)


def mismatch_message(notebook: str, key: str, diff: str, *, same: bool, committed_fp: dict | None,
                     fresh_fp: dict | None, tolerance: Tolerance | None = None) -> str:
    """The text of a :class:`HeadlineMismatch`: what differs, under which check, and what to do."""
    head = f"headline {key!r} of {notebook}: {diff}."
    if same:
        return (f"{head} This machine computes the same bits as the one that made the committed outputs "
                f"({describe(fresh_fp)}), so the code or the committed outputs changed: refresh them with "
                "`make notebooks`, or find what changed the result.")
    differ = ", ".join(fingerprint_differences(committed_fp, fresh_fp))
    why = f" Cross-machine tolerance: {tolerance.reason}." if tolerance is not None else ""
    return (f"{head} The committed outputs were computed on another machine ({describe(committed_fp)}); this one "
            f"is {describe(fresh_fp)} (differs in: {differ}), so the value was held to its cross-machine "
            f"tolerance and exceeded it.{why} Either the code changed the result (refresh with `make notebooks` "
            "on any machine), or the value varies across machines more than declared: give its `record` a "
            "wider `across_machines` tolerance, with the reason.")
