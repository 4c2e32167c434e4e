"""Did a run reproduce the committed notebook? Its headline results held to the committed ones, and the short
table a sweep prints at its end.

A run at the notebook's default parameters computes the values its committed ``.ipynb`` holds
(``metadata["taskloss"]["headline"]``, written by ``make notebooks``). :func:`reproduction` compares them with the
tolerances ``make test`` applies (:mod:`taskloss.results.headlines`): exactly (``rtol`` 1e-3) when the run's
numerics fingerprint equals the committed one, else at each headline's cross-machine tolerance (the
``across_machines`` the notebook declared, a comparison's own seed spread, round-off otherwise). The runner
records the answer in ``meta.json`` (``reproduced``) and ``SUMMARY.md`` says "k/n" per notebook;
:func:`terminal_table` is the short form printed at the end of ``make run`` (every line at most
:data:`TERMINAL_WIDTH` characters; the Markdown keeps the details).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taskloss.results.fingerprint import same_numerics
from taskloss.results.headlines import METADATA_KEY, Tolerance, headline_difference, portable_difference

__all__ = ["TERMINAL_WIDTH", "committed_metadata", "reproduction", "reproduced_text", "terminal_table"]

TERMINAL_WIDTH = 120


def committed_metadata(notebook: Path) -> dict[str, Any] | None:
    """The committed headline results and fingerprint beside a notebook source (``NN_topic.ipynb`` next to
    ``NN_topic.py``), or ``None`` when there is no committed notebook or it records no headlines."""
    path = Path(notebook).with_suffix(".ipynb")
    try:
        ours = json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get(METADATA_KEY) or {}
    except (OSError, ValueError, AttributeError):
        return None
    headline = ours.get("headline")
    if not isinstance(headline, dict) or not headline:
        return None
    return {"headline": headline, "fingerprint": ours.get("fingerprint")}


def reproduction(committed: dict[str, Any] | None, results: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{"reproduced": k, "of": n, "same_numerics": bool, "differences": {key: sentence}}`` for a run's
    ``results.json`` content against :func:`committed_metadata`; ``None`` when either is missing.

    A committed headline the run did not record counts as not reproduced ("not recorded").
    """
    if not committed or not isinstance(results, dict):
        return None
    fresh = results.get("results") if isinstance(results.get("results"), dict) else {}
    tolerances = results.get("across_machines") if isinstance(results.get("across_machines"), dict) else {}
    same = same_numerics(committed.get("fingerprint"), results.get("fingerprint"))
    differences = {}
    for key, value in committed["headline"].items():
        if key not in fresh:
            differences[key] = "not recorded"
            continue
        if same:
            diff = headline_difference(value, fresh[key])
        else:
            tol = tolerances.get(key)
            try:
                tol = Tolerance(**tol) if isinstance(tol, dict) else None
            except (TypeError, ValueError):
                tol = None
            diff = portable_difference(value, fresh[key], tol)
        if diff:
            differences[key] = diff
    n = len(committed["headline"])
    return {"reproduced": n - len(differences), "of": n, "same_numerics": same, "differences": differences}


def reproduced_text(rep: Any) -> str:
    """``"5/5"``, ``"4/5"`` or ``""`` (not at the default parameters, or nothing committed to compare with)."""
    if not isinstance(rep, dict) or not isinstance(rep.get("of"), int):
        return ""
    return f"{rep.get('reproduced')}/{rep['of']}"


def _fit(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 1] + "…"


def terminal_table(rows: list[dict[str, Any]], width: int = TERMINAL_WIDTH) -> str:
    """A plain-text table of a sweep's runs (rows of :func:`taskloss.runner.store.summary_rows`): notebook, run
    folder, status, seconds, claims held and headlines reproduced, each line at most ``width`` characters (a
    failed run's reason is cut to fit; ``SUMMARY.md`` has it whole)."""
    head = ("notebook", "run", "status", "s", "claims", "reproduced")
    body = []
    for r in rows:
        claims = r.get("claims_count") or ""
        body.append((str(r.get("notebook", "")), str(r.get("folder", "")), str(r.get("status", "?")),
                     f"{r['seconds']:.0f}" if isinstance(r.get("seconds"), (int, float)) else "",
                     claims, reproduced_text(r.get("reproduced"))))
    caps = (36, 28, 9, 6, 7, 10)
    widths = [min(cap, max([len(h)] + [len(b[i]) for b in body])) for i, (h, cap) in enumerate(zip(head, caps))]

    def line(cells) -> str:
        return "  ".join(_fit(c, w).ljust(w) if i < 3 else _fit(c, w).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [line(head), line(tuple("-" * w for w in widths))]
    for r, b in zip(rows, body):
        lines.append(line(b))
        if r.get("status") not in ("ok", None) and r.get("error"):
            lines.append(_fit(f"    {r['error']}", width))
    reps = [r.get("reproduced") for r in rows if isinstance(r.get("reproduced"), dict)]
    if reps:
        k, n = sum(x["reproduced"] for x in reps), sum(x["of"] for x in reps)
        lines.append(f"{k} of {n} committed headlines reproduced in {len(reps)} run(s) at default parameters"
                     + ("" if k == n else " (SUMMARY.md names each difference)"))
    return "\n".join(_fit(ln, width) if len(ln) > width else ln for ln in lines)
