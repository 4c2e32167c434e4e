"""The one small API notebooks use to record results and figures into their run folder.

A notebook's ``parameters`` cell holds ``output_dir = ""``; the runner (``python -m taskloss.runner``) injects a
folder, and a session without one (Jupyter by hand, ``papermill`` without ``-p output_dir``) gets a fresh folder
``runs/interactive/<notebook>/<time>`` of its own, so a second run never overwrites the first::

    run = taskloss.results.start("01_optimization_as_sampling", output_dir, device=device, seed=seed)
    run.record("sampling/ess_ratio", 0.83, headline=True)
    run.compare("mgs_vs_mle/accuracy", acc_mgs, acc_mle, name="MGS", baseline="MLE", metric="accuracy")
    run.savefig(fig, "isotropy.png")
    run.table()
    run.say("The ESS ratio was {sampling/ess_ratio:.2f}.")   # Markdown rendered from the recorded values
    run.claim("mgs/beats_mle", "MGS reaches a lower test error than MLE", c.verdict == "better",
              value=c.effect, bound="verdict 'better'")

Two kinds of statement live in a notebook. An *identity* — a derivation step, a parity with a reference, an
invariant — holds for every valid parameter value: the notebook ``assert``s it. A *claim* — a finding of this run
that depends on scale, seed, model or budget (an effect's sign, one method beating another) — goes through
:meth:`Run.claim`: recorded with its evidence, printed as held or not held, listed in ``SUMMARY.md``, and enforced
(:class:`ClaimNotHeld`) only in the strict mode ``make test`` uses at the default parameters
(``TASKLOSS_CHECK_HEADLINES=1``). A rerun with other parameters or another model completes and reports what held.

``results.json`` is rewritten atomically on every ``record`` so a notebook that fails half-way keeps what it
had measured. The runner reads the ``headline`` keys into ``SUMMARY.md``. Comparisons between methods go
through :meth:`Run.compare` (a paired test on the same seeds, :func:`taskloss.results.compare.paired_comparison`),
and closing text that quotes numbers goes through :meth:`Run.say`, so the prose cannot drift from the outputs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from taskloss.results.compare import Comparison, adjust, comparison_table, paired_comparison
from taskloss.results.fingerprint import numerics_fingerprint, same_numerics
from taskloss.results.headlines import (
    CHECK_ENV,
    HEADLINE_ATOL,
    HEADLINE_RTOL,
    CommittedRun,
    HeadlineMismatch,
    Tolerance,
    check_tolerances,
    committed_run,
    headline_difference,
    mismatch_message,
    portable_difference,
)
from taskloss.utils import RUNS_DIR, atomic_write_text, resolve_device, seed_everything, torch

__all__ = ["Run", "start", "RESULTS_FILE", "ClaimNotHeld"]

RESULTS_FILE = "results.json"


_NONFINITE = ("inf", "-inf", "nan")
_FAMILY_FIELDS = ("p_adjusted", "verdict_adjusted", "correction", "family_size", "mde_family")


class ClaimNotHeld(AssertionError):
    """A claim of the committed run does not hold in strict mode (``make test``, default parameters)."""


def _checked_jsonable(key: str, value: Any) -> Any:
    """``value`` as JSON-ready data, or a ``TypeError`` naming ``key`` — raised before anything is stored, so
    a bad value leaves the run as it was."""
    try:
        out = _jsonable(value)
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot record {key!r}: {type(value).__name__} is not a number, string, bool, list, "
                        f"dict, tensor or array of them ({exc})") from None
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist() if value.numel() != 1 else value.item()
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@dataclass
class Run:
    """Results and figures of one notebook execution (see :func:`start`)."""

    name: str
    dir: Path
    device: torch.device
    seed: int
    results: dict[str, Any] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    committed: CommittedRun | None = None   # headline results and fingerprint of the committed notebook, when checked
    fingerprint: dict[str, Any] | None = None   # this run's numerics (taskloss.results.fingerprint)
    across_machines: dict[str, dict[str, Any]] = field(default_factory=dict)   # declared cross-machine tolerances
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    adjusted: dict[str, dict[str, Any]] = field(default_factory=dict)   # family-wise fields of comparisons
    strict: bool = False        # enforce claims (make test at the default parameters)

    def record(self, key: str, value: Any, *, headline: bool = False, rtol: float = HEADLINE_RTOL,
               atol: float = HEADLINE_ATOL, across_machines: Tolerance | None = None) -> Any:
        """Store ``value`` under ``key`` (e.g. ``"mgs/edit_distance"``) and rewrite ``results.json``.

        A ``headline`` result goes into ``SUMMARY.md`` and the committed notebook's metadata; under ``make test``
        it is compared with the committed value (see :mod:`taskloss.results.headlines`): within ``rtol``/``atol``
        when this machine computes the same bits as the one that made the committed outputs, else within
        ``across_machines`` — a :class:`~taskloss.results.headlines.Tolerance` with its reason, e.g.
        :func:`~taskloss.results.headlines.seed_spread` of the per-seed values the headline averages; ``None``
        holds the value to ``rtol``/``atol`` on every machine (a closed form or fixed-seed estimate). A recorded
        comparison is held to its own seed spread on another machine. A difference raises
        :class:`~taskloss.results.headlines.HeadlineMismatch` (after the value is saved).
        """
        if not isinstance(key, str) or not key:
            raise ValueError("result key must be a non-empty string")
        if not isinstance(headline, bool):
            raise TypeError(f"headline must be a bool, got {type(headline).__name__}")
        if across_machines is not None and not isinstance(across_machines, Tolerance):
            raise TypeError("across_machines must be a taskloss.results.headlines.Tolerance (e.g. seed_spread(...)) "
                            f"or None, got {type(across_machines).__name__}")
        check_tolerances(rtol=rtol, atol=atol)
        stored = _checked_jsonable(key, value)
        self.results[key] = stored
        if headline and key not in self.headline:
            self.headline.append(key)
        if headline and across_machines is not None:
            self.across_machines[key] = across_machines.as_dict()
        self._flush()
        if headline and self.committed is not None:
            self._check_headline(key, rtol, atol, across_machines)
        return value

    def _check_headline(self, key: str, rtol: float, atol: float, across_machines: Tolerance | None) -> None:
        committed = self.committed
        if key not in committed.headline:
            raise HeadlineMismatch(f"headline {key!r} is not in the committed notebooks/{self.name}.ipynb: "
                                   "refresh it with `make notebooks`")
        same = same_numerics(committed.fingerprint, self.fingerprint)
        tol = across_machines or Tolerance(rtol=rtol, atol=atol)
        if same:
            diff = headline_difference(committed.headline[key], self.results[key], rtol=rtol, atol=atol)
        else:
            diff = portable_difference(committed.headline[key], self.results[key], tol)
        if diff:
            raise HeadlineMismatch(mismatch_message(self.name, key, diff, same=same,
                                                    committed_fp=committed.fingerprint,
                                                    fresh_fp=self.fingerprint, tolerance=None if same else tol))

    def compare(self, key: str, a: Sequence[float], b: Sequence[float], *, headline: bool = False,
                **kwargs) -> Comparison:
        """Paired comparison of per-seed values ``a`` and ``b`` (:func:`~taskloss.results.compare.paired_comparison`,
        keyword arguments passed on), recorded under ``key`` (effect, interval, p-value, verdict) and kept for
        :meth:`comparison_table`. Returns the :class:`~taskloss.results.compare.Comparison`."""
        c = paired_comparison(a, b, **kwargs)
        self.comparisons[key] = c
        fields = {k: v for k, v in c.as_dict().items() if k not in _FAMILY_FIELDS}
        self.record(key, {**fields, "a": list(map(float, a)), "b": list(map(float, b))}, headline=headline)
        return c

    def comparison_table(self, keys: Sequence[str] | None = None, *, correction: str | None = "holm") -> str:
        """Print (and return) the Markdown table of the comparisons made so far (or of ``keys``), as one family:
        with ``correction`` (``"holm"``, the default, or ``"bh"``; ``None`` for none) each comparison's adjusted
        p-value and verdict are added to the table and recorded beside it (``results.json``'s ``adjusted``:
        ``p_adjusted``, ``verdict_adjusted``, ``family_size``, ``correction``), where :meth:`say` reads them
        (``{key.verdict_adjusted}``)."""
        keys = list(self.comparisons) if keys is None else list(keys)
        missing = [k for k in keys if k not in self.comparisons]
        if missing:
            raise KeyError(f"comparison_table(): no comparison {missing}; made: {sorted(self.comparisons)}")
        comps = [self.comparisons[k] for k in keys]
        if correction is not None:
            comps = adjust(comps, correction)
            for k, c in zip(keys, comps):
                self.comparisons[k] = c
                self.adjusted[k] = {f: getattr(c, f) for f in _FAMILY_FIELDS}
            self._flush()
        else:
            comps = [dataclasses.replace(c, **dict.fromkeys(_FAMILY_FIELDS)) for c in comps]
        text = comparison_table(comps)
        print(text)
        return text

    def claim(self, key: str, statement: str, held: bool, *, value: Any = None, bound: str | None = None) -> bool:
        """Record a *claim*: a finding of this run, not an identity (see the module docstring).

        Args:
            key: its name, e.g. ``"pg/beats_mle"`` (one per claim; a claim is made once).
            statement: the finding in words, e.g. ``"REINFORCE lowers the task loss by more than 0.03"``.
            held: whether this run shows it (a ``bool``; ``numpy.bool_`` is accepted).
            value: the evidence (a number, a recorded comparison's effect, …), stored with the claim.
            bound: what the evidence was held to, e.g. ``"> 0.03"`` or ``"verdict 'better'"``.

        Returns:
            ``held``. In strict mode a claim that does not hold raises :class:`ClaimNotHeld` after it is saved.
        """
        if not isinstance(key, str) or not key:
            raise ValueError("claim key must be a non-empty string")
        if key in self.claims:
            raise ValueError(f"claim {key!r} was already made in this run")
        if not isinstance(statement, str) or not statement.strip():
            raise ValueError("a claim needs a statement (the finding, in words)")
        if not isinstance(held, (bool, np.bool_)):
            raise TypeError(f"held must be a bool (the claim's outcome), got {type(held).__name__}")
        if bound is not None and not isinstance(bound, str):
            raise TypeError(f"bound must be a str or None, got {type(bound).__name__}")
        entry = {"statement": statement, "held": bool(held), "value": _checked_jsonable(key, value), "bound": bound}
        self.claims[key] = entry
        self._flush()
        evidence = ""
        if value is not None:
            shown = f"{value:.4g}" if isinstance(value, float) else str(entry["value"])
            evidence = f" — {shown}" + (f" (bound {bound})" if bound else "")
        print(f"{'✓ claim holds' if held else '✗ claim does not hold'}: {statement}{evidence} [{key}]")
        if not held and self.strict:
            raise ClaimNotHeld(
                f"claim {key!r} of {self.name} does not hold at the default parameters: {statement}{evidence}. "
                "make test enforces the committed run's findings: a change broke this finding, or the finding "
                "is not robust (give it a margin that holds across seeds, or state it as not holding).")
        return bool(held)

    def claims_table(self) -> str:
        """Print (and return) the Markdown table of this run's claims: statement, evidence, held or not."""
        lines = [f"{sum(c['held'] for c in self.claims.values())} of {len(self.claims)} claims hold.", "",
                 "| claim | statement | evidence | held |", "|---|---|---|---|"]
        for k, c in self.claims.items():
            v = c["value"]
            shown = f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
            if c["bound"]:
                shown += f" ({c['bound']})"
            lines.append(f"| {k} | {c['statement']} | {shown} | {'✓' if c['held'] else '✗ **not held**'} |")
        text = "\n".join(lines)
        print(text)
        return text

    def render(self, template: str, **values: Any) -> str:
        """The Markdown text of ``template`` with its numbers from the recorded results: ``{key:fmt}`` is replaced
        by ``results[key]`` (keys may contain ``/``), ``{key.verdict}`` reads a field of a recorded comparison (or
        of a claim, or a family-corrected field such as ``{key.verdict_adjusted}``), and ``values`` add names of
        their own.

        Raises:
            KeyError: a name that is neither recorded nor in ``values``.
        """
        out = []
        for literal, field_name, spec, conv in string.Formatter().parse(template):
            out.append(literal)
            if field_name is None:
                continue
            value = self._lookup(field_name, values)
            if conv:
                value = {"r": repr, "s": str, "a": ascii}[conv](value)
            elif spec and isinstance(value, str) and value in _NONFINITE:   # recorded as JSON strings
                value = float(value)                                           # an unbounded interval: "inf"
            out.append(format(value, spec or ""))
        return "".join(out)

    def say(self, template: str, **values: Any) -> None:
        """Show :meth:`render`'s text: as Markdown in Jupyter, printed elsewhere. Returns nothing, so a cell that
        ends with ``run.say(...)`` shows the text once (use :meth:`render` for the string)."""
        text = self.render(template, **values)
        try:
            from IPython import get_ipython
            from IPython.display import Markdown, display

            if get_ipython() is not None:
                display(Markdown(text))
                return
        except ImportError:  # pragma: no cover - IPython ships with the notebook stack
            pass
        print(text)

    def _lookup(self, field_name: str, values: dict[str, Any]) -> Any:
        if field_name in values:
            return values[field_name]
        if field_name in self.results:
            return self.results[field_name]
        key, _, attr = field_name.rpartition(".")
        if key in self.results and isinstance(self.results[key], dict) and attr in self.results[key]:
            return self.results[key][attr]
        if key in self.adjusted and attr in self.adjusted[key]:
            return self.adjusted[key][attr]
        if key in self.claims and attr in self.claims[key]:
            return self.claims[key][attr]
        raise KeyError(f"say(): no recorded result {field_name!r}; recorded: {sorted(self.results)}")

    def savefig(self, fig, filename: str, **kwargs) -> Path:
        """Save a matplotlib figure into the run folder (PNG by default) and return its path.

        Args:
            fig: a matplotlib figure (anything with ``savefig``).
            filename: a relative path inside the run folder (``"loss.png"``, ``"figures/loss"``; subfolders are
                created); ``.png`` is added when it has no suffix.
            **kwargs: passed to ``fig.savefig`` (``dpi=110``, ``bbox_inches="tight"`` by default).

        Raises:
            TypeError: ``filename`` not a str / path, or ``fig`` without ``savefig``.
            ValueError: an absolute path, one that leaves the run folder (``..``, a symlink out of it), or the
                run's own results file.
        """
        if not callable(getattr(fig, "savefig", None)):
            raise TypeError(f"fig must be a matplotlib figure (with savefig), got {type(fig).__name__}")
        path = self._inside("filename", filename)
        if path.suffix == "":
            path = path.with_suffix(".png")
        if path == (self.dir / RESULTS_FILE).resolve():
            raise ValueError(f"filename {filename!r} would overwrite the run's {RESULTS_FILE}")
        path.parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("dpi", 110)
        kwargs.setdefault("bbox_inches", "tight")
        fig.savefig(path, **kwargs)
        return path

    def _inside(self, name: str, filename) -> Path:
        """``filename`` resolved inside the run folder, or refused: a path argument never writes outside it."""
        if not isinstance(filename, (str, os.PathLike)):
            raise TypeError(f"{name} must be a str or path, got {type(filename).__name__}")
        rel = Path(filename)
        if not str(filename).strip() or rel.is_absolute():
            raise ValueError(f"{name} must be a relative path inside the run folder, got {str(filename)!r}")
        root = Path(self.dir).resolve()
        path = (root / rel).resolve()
        if path == root or not path.is_relative_to(root):
            raise ValueError(f"{name}={str(filename)!r} resolves to {path}, outside the run folder {root}")
        return path

    def table(self, keys: list[str] | None = None) -> str:
        """Print (and return) a Markdown table of the recorded results."""
        keys = list(self.results) if keys is None else keys
        lines = ["| result | value |", "|---|---|"]
        for k in keys:
            v = self.results[k]
            if isinstance(v, float):
                v = f"{v:.6g}"
            elif isinstance(v, list) and len(v) > 8:
                v = f"[{len(v)} values]"
            lines.append(f"| {k}{' ★' if k in self.headline else ''} | {v} |")
        text = "\n".join(lines)
        print(text)
        return text

    def _flush(self) -> None:
        payload = {"notebook": self.name, "device": str(self.device), "seed": self.seed,
                   "fingerprint": self.fingerprint, "headline": self.headline,
                   "across_machines": self.across_machines, "claims": self.claims, "adjusted": self.adjusted,
                   "strict": self.strict,
                   "results": self.results}
        atomic_write_text(self.dir / RESULTS_FILE, json.dumps(payload, indent=1, sort_keys=False))


def _fresh_folder(parent: Path) -> Path:
    """A new, empty folder under ``parent`` named by the UTC time (``20261206-071502``, ``…-2`` on a clash)."""
    from datetime import datetime, timezone

    parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):
        path = parent / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no fresh run folder under {parent}")


def start(name: str, output_dir: str = "", *, device: str = "auto", seed: int = 0) -> Run:
    """Begin a notebook run: resolve the device, seed everything, create the output folder.

    ``output_dir == ""`` means ``$TASKLOSS_OUTPUT_DIR`` when set (``make notebooks`` sets it), else a fresh
    ``runs/interactive/<name>/<UTC time>`` (what a reader running the notebook by hand, or ``papermill`` without
    ``-p output_dir``, gets: each run its own folder, never one overwriting another's).
    """
    if not isinstance(name, str) or not name.strip() or name in (".", "..") or Path(name).name != name:
        raise ValueError(f"name must be a notebook's name without folders (it names runs/interactive/<name>), "
                         f"got {name!r}")
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"output_dir must be a str or path, got {type(output_dir).__name__}")
    given = output_dir or os.environ.get("TASKLOSS_OUTPUT_DIR")
    out = Path(given) if given else _fresh_folder(RUNS_DIR / "interactive" / name)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(device)
    seed_everything(seed)
    committed = committed_run(name)
    run = Run(name=name, dir=out, device=dev, seed=seed, committed=committed,
              fingerprint=numerics_fingerprint(dev), strict=bool(os.environ.get(CHECK_ENV)))
    run._flush()
    if run.committed is not None and not same_numerics(run.committed.fingerprint, run.fingerprint):
        print(f"Headline results are checked at their cross-machine tolerances: the committed outputs of {name} "
              "were computed with other numerics (taskloss.results.headlines).")
    return run
