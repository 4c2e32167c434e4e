"""Run folders on disk: their names, keys, locks, ``meta.json`` and the ``SUMMARY.md`` of a sweep.

- **Folder names** show every override as ``name=value`` (sorted by name, ``__`` between them:
  ``lr=0.001__seed=2``), whole — never cut inside a pair, so a sweep's axis stays readable. Numbers, booleans,
  lists of numbers and short strings of ``[A-Za-z0-9._+-]`` name a folder exactly; a value that had to be
  sanitized or shortened (or a name over :data:`NAME_CHARS` characters) gets a short hash of all the overrides
  after ``~`` (``label=a-b~5d41402a``), so two parameter sets never share a folder. No overrides: ``default``.
- **Keys.** A run is *finished* when its ``meta.json`` says ``ok``, its key equals the key of the run asked for —
  a hash of the resolved parameters, of the notebook source that was executed, of the package's source
  (``taskloss/**/*.py``) and of the data it reads (:func:`data_hash`: the committed ``data/pretrained/`` and any
  file or folder a ``*_path``/``*_folder`` parameter names) — and its outputs are still there and unchanged
  (``results.json`` and the executed notebook, whose hashes ``meta.json`` records). Any edit, committed or not,
  makes the old result stale.
- **Locks.** Each run folder holds a ``.lock`` file locked (``flock``) while a process executes the run: two
  sweeps into one ``--out`` never execute the same run at once; the second waits and then finds it finished.
- **Summary.** ``SUMMARY.md`` is rebuilt from every run folder in the sweep folder (under a lock of its own), so
  two sweeps into one folder both end up in it and the last writer cannot drop the other's runs. It has a column
  per parameter the sweep's runs override, lists each run's claims as held / not held and, for a run at the
  default parameters, how many committed headlines it reproduced (:mod:`taskloss.runner.report`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from taskloss.results.run import RESULTS_FILE
from taskloss.utils import REPO_ROOT, atomic_write_text

__all__ = ["META_FILE", "LOCK_FILE", "SUMMARY_FILE", "NAME_CHARS", "folder_name", "canonical", "source_hash",
           "package_hash", "data_hash", "run_key", "output_hashes", "read_meta", "write_meta",
           "recorded_fingerprint", "is_finished", "run_lock", "RunBusy", "clear_run_folder", "summary_rows",
           "write_summary", "check_writable"]

META_FILE = "meta.json"
LOCK_FILE = ".lock"
SUMMARY_FILE = "SUMMARY.md"
PACKAGE_DIR = REPO_ROOT / "taskloss"
# committed data the notebooks read by default: a clone's data/pretrained, else the small LM a wheel carries
# (taskloss/lm/small_lm, see setup.py)
DATA_DIRS = ((REPO_ROOT / "data" / "pretrained",) if (REPO_ROOT / "data" / "pretrained").is_dir()
             or not (PACKAGE_DIR / "lm" / "small_lm").is_dir() else (PACKAGE_DIR / "lm" / "small_lm",))
NAME_CHARS = 150            # a folder name's length before the hash (file systems allow 255)
_VALUE_CHARS = 40           # a value's text before it is shortened
_SAFE = re.compile(r"[A-Za-z0-9._+-]+")


def canonical(value: Any) -> str:
    """The JSON text that identifies a parameter set (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _value_text(v: Any) -> tuple[str, bool]:
    """A value as folder-name text, and whether that text identifies it exactly."""
    if isinstance(v, bool) or v is None:
        return str(v), True
    if isinstance(v, int):
        return str(v), True
    if isinstance(v, float):
        return repr(v), True
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        text = ",".join(repr(float(x)) if isinstance(x, float) else str(x) for x in v)
        return (text, True) if len(text) <= _VALUE_CHARS else (text[:_VALUE_CHARS - 1] + "…", False)
    text = str(v) if not isinstance(v, (list, dict)) else canonical(v)
    exact = bool(_SAFE.fullmatch(text)) and len(text) <= _VALUE_CHARS and not isinstance(v, (list, dict))
    clean = re.sub(r"[^A-Za-z0-9._+,=-]", "-", text).strip(".") or "-"
    if len(clean) > _VALUE_CHARS:
        clean = clean[:_VALUE_CHARS - 1] + "…"
    return clean, exact


def folder_name(overrides: dict[str, Any], first: Iterable[str] = ()) -> str:
    """``name=value__name=value``, every override whole; ``~<8 hex>`` of the exact overrides appended when a value
    had to be sanitized or shortened (see the module docstring), so different values never map to one folder;
    ``default`` without overrides.

    Args:
        overrides: the run's parameter values that differ from the notebook's defaults.
        first: names written before the others (a sweep's axes), so that a name shortened to fit keeps the values
            that tell its runs apart; the others follow in sorted order.
    """
    if not overrides:
        return "default"
    lead = sorted(k for k in set(first) if k in overrides)
    parts, exact = [], True
    for k in lead + sorted(k for k in overrides if k not in lead):
        text, ok = _value_text(overrides[k])
        parts.append(f"{k}={text}")
        exact = exact and ok
    name = "__".join(parts)
    if len(name) > NAME_CHARS:
        name, exact = name[:NAME_CHARS - 1] + "…", False
    return name if exact else f"{name}~{_sha(canonical(overrides))[:8]}"


def source_hash(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return _sha(Path(path).read_bytes())


def package_hash(root: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the package's Python sources (relative paths and bytes, in sorted order)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _hash_path(h, path: Path) -> None:
    path = Path(path)
    if path.is_file():
        h.update(b"f\0" + path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    elif path.is_dir():
        for p in sorted(q for q in path.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
            h.update(p.relative_to(path).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    else:
        h.update(b"missing\0" + str(path).encode())


def data_hash(parameters: dict[str, Any] | None = None, data_names: Iterable[str] = (),
              roots: tuple[Path, ...] = DATA_DIRS) -> str:
    """SHA-256 over the data a run reads: the committed data folders (``roots``) and, for every parameter in
    ``data_names`` (those a notebook tags ``[data]``) with a non-empty value, that file or that folder's files."""
    h = hashlib.sha256()
    for root in roots:
        _hash_path(h, root)
    for name in sorted(set(data_names)):
        value = (parameters or {}).get(name)
        if isinstance(value, str) and value:
            h.update(name.encode() + b"=")
            _hash_path(h, Path(value).expanduser())
    return h.hexdigest()


def run_key(parameters: dict[str, Any], notebook: Path, package: str | None = None, data: str | None = None, *,
            source: str | bytes | None = None) -> dict[str, str]:
    """The hashes that decide whether a finished run can be reused: ``run`` combines the other four.
    ``source``: the notebook text that will be executed (the runner reads it once, hashes it and executes those
    bytes); the file at ``notebook`` when ``None``."""
    text = Path(notebook).read_bytes() if source is None else source
    key = {"parameters": _sha(canonical(parameters)), "notebook": _sha(text),
           "package": package or package_hash(), "data": data or data_hash(parameters)}
    key["run"] = _sha(canonical(key))
    return key


def output_hashes(folder: Path, notebook_name: str) -> dict[str, str] | None:
    """SHA-256 of a run's outputs — the executed notebook and, when the notebook recorded results,
    ``results.json`` — or ``None`` without an executed notebook (recorded in ``meta.json``; a finished run is
    reused only while every recorded output is still there and unchanged)."""
    folder = Path(folder)
    out = {}
    for name in (f"{notebook_name}.ipynb", RESULTS_FILE):
        try:
            out[name] = _sha((folder / name).read_bytes())
        except OSError:
            if name != RESULTS_FILE:
                return None
    return out


def _outputs_unchanged(folder: Path, recorded: dict[str, str]) -> bool:
    for name, digest in recorded.items():
        try:
            if _sha((Path(folder) / name).read_bytes()) != digest:
                return False
        except OSError:
            return False
    return True


def read_meta(folder: Path) -> dict[str, Any] | None:
    """The folder's ``meta.json`` as a dict, or ``None`` when it is missing, unreadable or not a JSON object."""
    try:
        meta = json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (readers see the old file or the new one, never half of one)."""
    atomic_write_text(Path(folder) / META_FILE, json.dumps(meta, indent=1, default=str))


def recorded_fingerprint(folder: Path) -> dict[str, Any] | None:
    """The numerics fingerprint the notebook's kernel recorded in ``results.json``
    (:mod:`taskloss.results.fingerprint`), or ``None`` when the run recorded none."""
    try:
        fp = json.loads((Path(folder) / RESULTS_FILE).read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return fp if isinstance(fp, dict) else None


def is_finished(folder: Path, key: str | None = None) -> bool:
    """``meta.json`` says ``ok``, was made with ``key`` (when given), and the outputs it recorded are still there
    and unchanged (a run whose ``results.json`` or executed notebook was deleted or edited is redone)."""
    meta = read_meta(folder)
    if meta is None or meta.get("status") != "ok":
        return False
    if key is not None and (meta.get("key") or {}).get("run") != key:
        return False
    recorded = meta.get("outputs")
    if not isinstance(recorded, dict) or not recorded:
        return key is None     # a meta without output hashes (written by hand or an old runner): never reused
    return _outputs_unchanged(folder, recorded)


class RunBusy(RuntimeError):
    """Another process holds the run folder's lock."""


@contextlib.contextmanager
def run_lock(folder: Path, *, wait: bool = True, poll: float = 0.5, cancelled=None,
             name: str = LOCK_FILE) -> Iterator[None]:
    """Hold the run folder's ``.lock`` (an exclusive ``flock``) for the block.

    With ``wait`` the call polls until the lock is free (or ``cancelled()`` turns true, which raises
    :class:`RunBusy`); without it a held lock raises :class:`RunBusy` at once.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or (cancelled is not None and cancelled()):
                    raise RunBusy(f"{folder} is being run by another process") from None
                time.sleep(poll)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _is_locked(folder: Path) -> bool:
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def clear_run_folder(folder: Path) -> None:
    """Empty a run folder before a run, keeping its lock and any nested run folder (another sweep's)."""
    for child in Path(folder).iterdir():
        if child.name in (LOCK_FILE, ".summary.lock"):
            continue
        if child.is_dir() and not child.is_symlink():
            if (child / META_FILE).exists() or (child / LOCK_FILE).exists():
                continue
            shutil.rmtree(child)
        else:
            child.unlink()


def check_writable(folder: Path) -> None:
    """Create ``folder`` and write a probe file into it; raise ``PermissionError``/``OSError`` with the folder
    named when that fails (a read-only ``--out``)."""
    import tempfile

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write into {folder}: {exc.strerror or exc}") from exc


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return f"[{', '.join(_fmt(x) for x in v[:4])}{', …' if len(v) > 4 else ''}]"
    if isinstance(v, dict) and "effect" in v and "verdict" in v:  # a recorded paired comparison
        return f"{v['verdict']} ({_fmt(v['effect'])})"
    return str(v)


def _read_results(folder: Path) -> dict[str, Any]:
    try:
        res = json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return res if isinstance(res, dict) else {}


def _headline(res: dict[str, Any]) -> str:
    """The headline results; a recorded comparison shows its family-corrected verdict where the run corrected it
    (``results.json``'s ``adjusted``), marked "uncorrected" where it did not."""
    try:
        results, keys = res.get("results", {}), res.get("headline", [])
        adjusted = res.get("adjusted", {}) or {}
        out = []
        for k in keys:
            if k not in results:
                continue
            v = results[k]
            if isinstance(v, dict) and "effect" in v and "verdict" in v:
                adj = adjusted.get(k) if isinstance(adjusted, dict) else None
                verdict = (f"{adj['verdict_adjusted']} after {adj.get('correction', 'correction')}"
                           if isinstance(adj, dict) and adj.get("verdict_adjusted") else f"{v['verdict']} (uncorrected)")
                out.append(f"{k} = {verdict} ({_fmt(v['effect'])})")
            else:
                out.append(f"{k} = {_fmt(v)}")
        return "<br>".join(out)
    except (AttributeError, TypeError, KeyError):
        return ""


def _claims(res: dict[str, Any]) -> str:
    claims = res.get("claims")
    if not isinstance(claims, dict) or not claims:
        return ""
    held = [k for k, c in claims.items() if isinstance(c, dict) and c.get("held") is True]
    text = f"{len(held)}/{len(claims)} held"
    missed = [k for k in claims if k not in held]
    return text + (f"; not held: {', '.join(missed)}" if missed else "")


def summary_rows(sweep: Path) -> list[dict[str, Any]]:
    """One row per run folder directly inside ``sweep``: its meta (or the state of a folder without one), its
    headline results and its claims."""
    rows = []
    for folder in sorted(p for p in Path(sweep).iterdir() if p.is_dir() and not p.name.startswith(".")):
        has_meta = (folder / META_FILE).exists()
        if not has_meta and not (folder / LOCK_FILE).exists():
            continue
        meta = read_meta(folder)
        if meta is None:
            state = "corrupt meta.json" if has_meta else ("running" if _is_locked(folder) else "incomplete")
            meta = {"status": state}
        res = _read_results(folder)
        rows.append({**meta, "folder": folder.name, "headline": _headline(res), "claims": _claims(res),
                     "claims_count": _claims(res).split(" held")[0]})
    return rows


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _reproduced_cell(rep: Any) -> str:
    from taskloss.runner.report import reproduced_text

    text = reproduced_text(rep)
    if text and rep.get("differences"):
        text += "; " + "; ".join(f"{k}: {_cell(v)[:160]}" for k, v in rep["differences"].items())
    return text


def write_summary(sweep: Path, title: str = "Summary") -> str:
    """Rebuild ``sweep/SUMMARY.md`` from every run folder in ``sweep`` and return its text: a column per
    overridden parameter (those whose value varies across the runs first), status, seconds, claims, headline."""
    sweep = Path(sweep)
    with run_lock(sweep, wait=True, name=".summary.lock"):
        rows = summary_rows(sweep)
        ok = sum(r.get("status") == "ok" for r in rows)
        overrides = [r.get("overrides") if isinstance(r.get("overrides"), dict) else {} for r in rows]
        names = sorted({k for o in overrides for k in o})
        varies = [k for k in names if len({canonical(o.get(k)) for o in overrides}) > 1]
        columns = varies + [k for k in names if k not in varies]
        reps = [r["reproduced"] for r in rows if isinstance(r.get("reproduced"), dict)]
        lines = [f"# {title}", "", f"{ok} of {len(rows)} runs succeeded."
                 + (f" {sum(x['reproduced'] for x in reps)} of {sum(x['of'] for x in reps)} committed headlines "
                    f"reproduced ({len(reps)} run(s) at default parameters, held to the tolerances `make test` "
                    "uses)." if reps else ""), "",
                 "| notebook | run | " + "".join(f"{c} | " for c in columns)
                 + "status | seconds | claims | headlines reproduced | headline results |",
                 "|---|---|" + "---|" * len(columns) + "---|---:|---|---|---|"]
        for r, o in zip(rows, overrides):
            status = r.get("status", "?")
            if status != "ok":
                reason = _cell(r.get("error", ""))[:200]
                status = f"**{status}**" + (f": {reason}" if reason else "")
            values = "".join(f"{_cell(_fmt(o[c])) if c in o else ''} | " for c in columns)
            lines.append(f"| {r.get('notebook', '')} | {r['folder']} | {values}{status} | {r.get('seconds', '')} "
                         f"| {_cell(r['claims'])} | {_reproduced_cell(r.get('reproduced'))} | {r['headline']} |")
        text = "\n".join(lines) + "\n"
        atomic_write_text(sweep / SUMMARY_FILE, text)
    return text
