"""A sweep read back as a table and a figure: one recorded metric against one swept parameter.

``python -m taskloss.runner table runs/02_importance_sampling_and_mgs --metric equal_compute/test_acc_mgs
--by alpha`` reads every finished run folder of the sweep, groups the runs by the value of ``--by`` (and by any
other parameter that varies, each combination its own row and line), and summarizes the runs that differ only in
the replicate parameter (``--over``, ``seed`` by default): their mean, and a 95 % t interval from three
replicates on (fewer: the values themselves, no interval). A recorded comparison contributes its effect. The
Markdown table is printed and written to ``TABLE_<metric>_by_<param>.md`` in the sweep folder, the figure to the
``.png`` of the same name. Runs that failed or never finished are listed under the table, by folder and reason.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskloss.results.run import RESULTS_FILE
from taskloss.runner.store import META_FILE, canonical, read_meta

__all__ = ["SweepPoint", "sweep_points", "unfinished_runs", "tabulate_sweep", "MIN_INTERVAL_RUNS"]

MIN_INTERVAL_RUNS = 3       # no t interval from fewer replicates (the values are shown instead)


@dataclass(frozen=True)
class SweepPoint:
    """The runs of one value of the swept parameter (and one combination of the other varying parameters)."""

    x: Any                      # the value of the swept parameter
    group: dict[str, Any]       # the other varying parameters (the replicate parameter excluded)
    values: list[float]         # the metric of each run
    replicates: list[Any]       # the replicate parameter's value of each run

    @property
    def mean(self) -> float:
        """The mean of the runs' values."""
        return math.fsum(self.values) / len(self.values)

    def interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """The t interval of the mean, or ``None`` below :data:`MIN_INTERVAL_RUNS` replicates."""
        n = len(self.values)
        if n < MIN_INTERVAL_RUNS:
            return None
        from scipy import stats

        m = self.mean
        sd = math.sqrt(math.fsum((v - m) ** 2 for v in self.values) / (n - 1))
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return m - half, m + half


def _metric(results: dict[str, Any], key: str) -> float | None:
    v = results.get(key)
    if isinstance(v, dict) and "effect" in v:
        v = v["effect"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def sweep_points(sweep: Path, metric: str, by: str, over: str = "seed") -> list[SweepPoint]:
    """The finished runs of ``sweep`` grouped by ``by`` (and the other parameters that vary), ``over`` the
    replicate parameter.

    Raises:
        FileNotFoundError: ``sweep`` is not a folder.
        ValueError: no finished run records ``metric`` as a finite number, or ``by`` is not a parameter of them.
    """
    sweep = Path(sweep)
    if not sweep.is_dir():
        raise FileNotFoundError(f"no sweep folder {sweep}")
    runs = []
    for folder in sorted(p for p in sweep.iterdir() if p.is_dir() and (p / META_FILE).exists()):
        meta = read_meta(folder)
        if not meta or meta.get("status") != "ok":
            continue
        try:
            results = json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8")).get("results", {})
        except (OSError, ValueError, AttributeError):
            continue
        value = _metric(results, metric)
        params = meta.get("parameters") or {}
        if value is not None and by in params:
            runs.append((params, value))
    if not runs:
        raise ValueError(f"no finished run in {sweep} records {metric!r} as a number with a parameter {by!r}")
    names = sorted({k for p, _ in runs for k in p})
    varying = [k for k in names if k not in (by, over, "output_dir")
               and len({canonical(p.get(k)) for p, _ in runs}) > 1]
    groups: dict[tuple, list] = {}
    for params, value in runs:
        key = (canonical(params[by]), tuple(canonical(params.get(k)) for k in varying))
        groups.setdefault(key, []).append((params, value))
    points = []
    for members in groups.values():
        params0 = members[0][0]
        points.append(SweepPoint(params0[by], {k: params0.get(k) for k in varying}, [v for _, v in members],
                                 [p.get(over) for p, _ in members]))
    points.sort(key=lambda pt: (canonical(pt.group), pt.x if isinstance(pt.x, (int, float)) else str(pt.x)))
    return points


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def unfinished_runs(sweep: Path) -> list[tuple[str, str]]:
    """``(folder, state)`` of each run folder of ``sweep`` that did not finish: its ``meta.json`` status and error
    (``failed: In [5] …: AssertionError``), or ``no meta.json`` for one that never ended (those runs are in no
    table row: :func:`tabulate_sweep` lists them under the table)."""
    out = []
    for folder in sorted(p for p in Path(sweep).iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta = read_meta(folder)
        if meta is None:
            if (folder / META_FILE).exists() or (folder / ".lock").exists():
                out.append((folder.name, "no readable meta.json (running, interrupted or corrupt)"))
            continue
        if meta.get("status") != "ok":
            error = " ".join(str(meta.get("error", "")).split())[:200]
            out.append((folder.name, f"{meta.get('status', '?')}" + (f": {error}" if error else "")))
    return out


def tabulate_sweep(sweep: Path, metric: str, by: str, over: str = "seed", *, figure: bool = True,
                   logx: bool | None = None) -> str:
    """Print-ready Markdown of ``metric`` against ``by`` (see the module docstring); writes the table, and with
    ``figure`` the plot, into the sweep folder. ``logx``: a log x axis (``None``: when every value is positive
    and they span more than a factor of 10)."""
    sweep = Path(sweep)
    points = sweep_points(sweep, metric, by, over)
    others = list(points[0].group)
    lines = [f"{metric} against {by} ({len(points)} points; mean over {over}, 95 % t interval from "
             f"{MIN_INTERVAL_RUNS} runs on)", "",
             f"| {by} | " + "".join(f"{k} | " for k in others) + "runs | mean | interval or values |",
             "|---|" + "---|" * len(others) + "---:|---:|---|"]
    for pt in points:
        ci = pt.interval()
        spread = f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else ", ".join(f"{v:.4g}" for v in pt.values)
        lines.append(f"| {_fmt(pt.x)} | " + "".join(f"{_fmt(pt.group[k])} | " for k in others)
                     + f"{len(pt.values)} | {pt.mean:.4g} | {spread} |")
    missing = unfinished_runs(sweep)
    if missing:
        lines += ["", f"Not in the table: {len(missing)} run(s) that did not finish:"]
        lines += [f"- {name}: {state}" for name, state in missing]
    text = "\n".join(lines)
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", f"TABLE_{metric}_by_{by}")
    (sweep / f"{stem}.md").write_text(text + "\n", encoding="utf-8")
    if figure:
        _plot(points, metric, by, over, sweep / f"{stem}.png", logx)
    return text


def _plot(points: list[SweepPoint], metric: str, by: str, over: str, path: Path, logx: bool | None) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    numeric = all(isinstance(p.x, (int, float)) and not isinstance(p.x, bool) for p in points)
    if logx is None:
        xs = [p.x for p in points] if numeric else []
        logx = bool(xs) and min(xs) > 0 and max(xs) / min(xs) > 10
    fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
    series: dict[str, list[SweepPoint]] = {}
    for p in points:
        series.setdefault(", ".join(f"{k}={_fmt(v)}" for k, v in p.group.items()) or metric, []).append(p)
    labels = sorted({str(p.x) for p in points}) if not numeric else None
    for i, (label, pts) in enumerate(series.items()):
        xs = [p.x if numeric else labels.index(str(p.x)) for p in pts]
        color = f"C{i % 10}"
        ax.plot(xs, [p.mean for p in pts], "o-", color=color, label=label)
        for x, p in zip(xs, pts):
            ci = p.interval()
            if ci:
                ax.vlines(x, ci[0], ci[1], color=color, lw=2, alpha=0.6)
            else:       # fewer than three runs: the runs themselves, no interval
                ax.plot([x] * len(p.values), p.values, "x", color=color, alpha=0.7)
    if not numeric:
        ax.set_xticks(range(len(labels)), labels)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(by)
    ax.set_ylabel(metric)
    ax.set_title(f"mean over {over}; bars: 95 % t interval (x: single runs below {MIN_INTERVAL_RUNS})", fontsize=8)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
