"""Committed headline numbers, checked against a fresh run.

``make notebooks`` stores each notebook's headline results (``run.record(key, value, headline=True)``) in the
committed ``.ipynb`` metadata under ``metadata["taskloss"]["headline"]``. ``make test`` executes every notebook with
``TASKLOSS_CHECK_HEADLINES=1``; then each headline ``record`` compares the fresh value with the committed one and
raises :class:`HeadlineMismatch` (the cell fails, so nbval fails) when they differ by more than the tolerance.
So a committed output cannot drift from what the code produces, and cannot be edited by hand unnoticed.

Tolerance: ``|fresh − committed| <= atol + rtol·|committed|`` elementwise, with ``rtol = 1e-3`` and
``atol = 1e-8`` by default. On the machine that refreshed the notebooks (same library builds, one BLAS thread in
both ``make notebooks`` and ``make test``) the values agree exactly; the tolerance absorbs the last-bit changes of
another CPU's kernels or thread count, which training loops amplify. Strings (e.g. a comparison's verdict) must
match exactly. A notebook passes ``rtol=``/``atol=`` to ``record`` for a value known to vary more.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from taskloss.utils import REPO_ROOT

__all__ = ["HEADLINE_RTOL", "HEADLINE_ATOL", "METADATA_KEY", "CHECK_ENV", "HeadlineMismatch",
           "committed_headlines", "headline_difference"]

HEADLINE_RTOL = 1e-3
HEADLINE_ATOL = 1e-8
METADATA_KEY = "taskloss"
CHECK_ENV = "TASKLOSS_CHECK_HEADLINES"


class HeadlineMismatch(AssertionError):
    """A fresh headline result differs from the one committed in the notebook."""


def committed_headlines(name: str) -> dict[str, Any] | None:
    """The committed headline results of ``notebooks/<name>.ipynb`` when ``TASKLOSS_CHECK_HEADLINES`` is set
    (``None`` otherwise, or when the notebook is not one of the repository's)."""
    if not os.environ.get(CHECK_ENV):
        return None
    path = REPO_ROOT / "notebooks" / f"{name}.ipynb"
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return None
    return (meta.get(METADATA_KEY) or {}).get("headline", {})


def headline_difference(committed: Any, fresh: Any, *, rtol: float = HEADLINE_RTOL,
                        atol: float = HEADLINE_ATOL, path: str = "") -> str | None:
    """``None`` when ``fresh`` matches ``committed`` (numbers within tolerance, recursively through lists and
    dicts), else a sentence naming the first difference."""
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
