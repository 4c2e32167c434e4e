"""Committed records of larger runs: what a notebook quotes when its CI-sized defaults cannot decide a verdict.

A notebook's defaults run in about a minute, and some questions need more seeds than that allows (a Holm family of
ten comparisons decided by the exact sign test needs about ten seeds that agree). Such a notebook has a
``params/NN_topic/full.yaml`` sized for its verdicts; that set is run once (``python -m taskloss.runner run NN --set
full``), and :func:`save_record` copies the finished run's ``results.json`` and ``meta.json`` into
``data/records/NN_topic/full/``, where they are committed. The notebook then reads the record with
:func:`load_record` and prints its verdicts — never a prediction of what more seeds would show.

A record is *re-decided*, not trusted: :class:`Record` recomputes every recorded comparison from its per-seed values
(``a`` and ``b``) through today's :func:`~taskloss.results.compare.paired_comparison` and refuses a record whose
recorded p-value or verdict the procedure no longer gives (the procedure changed since: rerun the set). Its
:meth:`Record.comparison_table` applies the family-wise correction to the family the notebook names, so the
notebook's reading of a record and of its own run go through the same code. ``tests/results/test_records.py``
checks every committed record against its set's parameters and the procedure.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from taskloss.results.compare import Comparison, adjust, comparison_table, paired_comparison
from taskloss.utils import DATA_DIR

__all__ = ["RECORDS_DIR", "Record", "RecordMismatch", "load_record", "save_record", "record_path", "corrected_phrase"]

RECORDS_DIR = DATA_DIR / "records"
FILES = ("results.json", "meta.json")
_SKEW_NOTE = "a mean of possibly skewed differences"
_COMPARED = ("n", "mean_a", "mean_b", "effect", "ci_low", "ci_high", "p_value", "verdict", "note", "estimand",
             "method", "n_tested")


class RecordMismatch(ValueError):
    """A committed record that today's code does not reproduce (its procedure or its parameters changed)."""


def record_path(notebook: str, set_name: str = "full", root: Path | None = None) -> Path:
    """The folder of a notebook's record of a named parameter set: ``data/records/<notebook>/<set_name>``.

    Args:
        notebook: the notebook's name.
        set_name: the parameter set's name.
        root: the records' folder (default: the clone's ``data/records``).
    """
    for label, value in (("notebook", notebook), ("set_name", set_name)):
        if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
            raise ValueError(f"{label} must be a plain folder name such as '04_sequence_task_losses', got {value!r}")
    return (RECORDS_DIR if root is None else Path(root)) / notebook / set_name


def _number(value: Any) -> float:
    """A recorded float ('inf' strings included: results.json stores infinities as text)."""
    return float(value)


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, (int, float, str)) and isinstance(y, (int, float, str)) and not (
            isinstance(x, str) and isinstance(y, str)):
        try:
            fx, fy = _number(x), _number(y)
        except ValueError:
            return False
        if math.isnan(fx) or math.isnan(fy):
            return math.isnan(fx) and math.isnan(fy)
        return fx == fy or math.isclose(fx, fy, rel_tol=1e-9, abs_tol=1e-12)
    return x == y


def _redecide(key: str, rec: dict[str, Any]) -> Comparison:
    """The comparison recomputed from a record's per-seed values; RecordMismatch when it differs from the record."""
    missing = [f for f in ("a", "b", "estimand", "method", "confidence", "lower_is_better") if f not in rec]
    if missing:
        raise RecordMismatch(f"record comparison {key!r} lacks {missing}: it predates per-seed values in results.json; "
                             "rerun the set and save the record again")
    symmetric = rec["estimand"] == "mean" and not str(rec.get("note", "")).startswith(_SKEW_NOTE)
    c = paired_comparison(rec["a"], rec["b"], name=rec["name"], baseline=rec["baseline"], metric=rec["metric"],
                          lower_is_better=bool(rec["lower_is_better"]), confidence=float(rec["confidence"]),
                          estimand=rec["estimand"], symmetric=symmetric, method=rec["method"])
    if rec["estimand"] == "mean" and rec.get("verdict") != "inconclusive" and not symmetric:
        raise RecordMismatch(f"record comparison {key!r}: a decided mean without the symmetry declaration")
    now = c.as_dict()
    differ = [f for f in _COMPARED if f in rec and not _same(rec[f], now[f])]
    if differ:
        detail = ", ".join(f"{f}: recorded {rec[f]!r}, now {now[f]!r}" for f in differ)
        raise RecordMismatch(f"record comparison {key!r} is not what today's paired_comparison gives ({detail}): "
                             "the procedure changed since the record was made; rerun the set and save it again")
    return c


@dataclass(frozen=True)
class Record:
    """A committed run: its notebook, parameter set, parameters, results and comparisons (re-decided)."""

    notebook: str
    set_name: str
    path: Path
    meta: dict[str, Any]
    results: dict[str, Any]               # results.json's "results"
    comparisons: dict[str, Comparison]    # every recorded comparison, recomputed from its per-seed values

    @property
    def parameters(self) -> dict[str, Any]:
        """The parameters the recorded run executed with (the notebook's defaults and the set's values)."""
        return dict(self.meta.get("parameters", {}))

    def describe(self) -> str:
        """One line: which set, when, on what machine, at what cost and from which commit."""
        fp = self.meta.get("fingerprint", {})
        git = self.meta.get("git", {}) or {}
        commit = str(git.get("commit") or "unknown")[:10] + (" (uncommitted changes)" if git.get("dirty") else "")
        when = str(self.meta.get("recorded_at", ""))[:10]
        cpu = fp.get("cpu", "unknown CPU")
        threads = fp.get("threads", "?")
        minutes = float(self.meta.get("seconds", math.nan)) / 60
        cpu_min = float(self.meta.get("cpu_seconds", math.nan)) / 60
        cost = f"{minutes:.0f} min wall" + (f", {cpu_min:.0f} min CPU" if math.isfinite(cpu_min) else "")
        date = f", recorded {when}" if when else ""
        return (f"record of `params/{self.notebook}/{self.set_name}.yaml` (`data/records/{self.notebook}/"
                f"{self.set_name}`{date}): run on {fp.get('device', 'cpu')} ({cpu}, {threads} thread{'' if threads == 1 else 's'}) in {cost}, "
                f"commit {commit}")

    def family(self, keys: Sequence[str], correction: str = "holm") -> dict[str, Comparison]:
        """The comparisons ``keys`` as one family, corrected (:func:`~taskloss.results.compare.adjust`)."""
        keys = list(keys)
        missing = [k for k in keys if k not in self.comparisons]
        if missing:
            raise KeyError(f"the record {self.path} holds no comparison {missing}; it holds {sorted(self.comparisons)}")
        return dict(zip(keys, adjust([self.comparisons[k] for k in keys], correction)))

    def comparison_table(self, keys: Sequence[str], correction: str = "holm") -> dict[str, Comparison]:
        """Print the Markdown table of the family ``keys`` (as :meth:`taskloss.results.run.Run.comparison_table`
        does for a notebook's own run) and return its corrected comparisons."""
        fam = self.family(keys, correction)
        print(comparison_table(list(fam.values())))
        return fam


def load_record(notebook: str, set_name: str = "full", *, root: Path | None = None) -> Record | None:
    """The committed record of ``notebook``'s parameter set ``set_name`` with every comparison re-decided, or
    ``None`` when none is committed (a pip install carries no ``data/records``: the notebook then says so).

    Args:
        notebook: the notebook's name, e.g. ``"04_sequence_task_losses"``.
        set_name: the parameter set the record ran (``params/<notebook>/<set_name>.yaml``).
        root: the records' folder (default: the clone's ``data/records``).

    Raises:
        RecordMismatch: a recorded comparison that today's procedure does not reproduce, a record of another
            notebook, a run that did not finish.
        ValueError: a malformed name.
    """
    path = record_path(notebook, set_name, root)
    if not (path / "results.json").is_file():
        return None
    results = json.loads((path / "results.json").read_text())
    meta = json.loads((path / "meta.json").read_text()) if (path / "meta.json").is_file() else {}
    if results.get("notebook") != notebook or meta.get("notebook", notebook) != notebook:
        raise RecordMismatch(f"{path} is a record of {results.get('notebook')!r}, not {notebook!r}")
    if meta.get("status", "ok") != "ok":
        raise RecordMismatch(f"{path} records a run with status {meta.get('status')!r}; only finished runs are records")
    values = results.get("results", {})
    comps = {k: _redecide(k, v) for k, v in values.items()
             if isinstance(v, dict) and {"verdict", "a", "b"} <= set(v)}
    return Record(notebook=notebook, set_name=set_name, path=path, meta=meta, results=values, comparisons=comps)


def save_record(run_dir: str | Path, set_name: str = "full", *, root: Path | None = None) -> Path:
    """Copy a finished run's ``results.json`` and ``meta.json`` into ``data/records/<notebook>/<set_name>`` (what
    ``python -m taskloss.runner record RUN_DIR`` does), after checking the run finished and that every one of its
    comparisons is reproduced by today's procedure. Returns the record's folder.

    Args:
        run_dir: the finished run's folder (``runs/<notebook>/<set_name>``).
        set_name: the parameter set it ran.
        root: the records' folder (default: the clone's ``data/records``).

    Raises:
        FileNotFoundError: a folder without the two files.
        RecordMismatch: a run that did not finish, or whose comparisons today's procedure does not reproduce.
    """
    src = Path(run_dir)
    for f in FILES:
        if not (src / f).is_file():
            raise FileNotFoundError(f"{src} holds no {f}: pass the folder of a finished run (runs/.../<notebook>/...)")
    meta = json.loads((src / "meta.json").read_text())
    if meta.get("status") != "ok":
        raise RecordMismatch(f"{src} is a run with status {meta.get('status')!r}; only finished runs become records")
    notebook = meta["notebook"]
    dest = record_path(notebook, set_name, root)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "results.json", dest / "results.json")
    meta["recorded_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    try:
        load_record(notebook, set_name, root=root)
    except RecordMismatch:
        for f in FILES:
            (dest / f).unlink()
        raise
    return dest


def corrected_phrase(c: Comparison, fmt: str = ".3f") -> str:
    """A corrected comparison in one phrase for a notebook's closing text: its effect, the uncorrected interval and
    the corrected verdict; for an undecided one also the smallest effect detectable at the family's level (or that
    its seeds decide no difference of any size). A decided verdict carries no MDE: the MDE is a power statement
    from the seeds' standard deviation, which skewed differences inflate far above an effect the test decided.

    Args:
        c: a comparison after :func:`~taskloss.results.compare.adjust` (e.g. from :meth:`Record.family`).
        fmt: the format of the effect, interval and MDE.

    Raises:
        TypeError: not a Comparison.
        ValueError: a comparison that was not corrected as part of a family.
    """
    if not isinstance(c, Comparison):
        raise TypeError(f"expected a Comparison, got {type(c).__name__}")
    if c.correction is None or c.mde_family is None:
        raise ValueError("corrected_phrase needs a comparison corrected in its family (Record.family, adjust)")
    pct = f"{100 * c.confidence:.0f} %"
    text = f"{c.effect:+{fmt}} (uncorrected {pct} CI [{c.ci_low:{fmt}}, {c.ci_high:{fmt}}]) → **{c.verdict_adjusted}**"
    if c.verdict_adjusted != "inconclusive":
        return text
    return f"{text}, {c.detectable(fmt)}"
