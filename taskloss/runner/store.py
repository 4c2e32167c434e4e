"""Run folders on disk: their names, keys, locks, ``meta.json`` and the ``SUMMARY.md`` of a sweep.

- **Folder names** are a readable prefix of the overrides and a short hash of all of them
  (``lr=0.001__seed=2-5d41402a``): two parameter sets never share a folder, whatever sanitizing or truncating
  did to the prefix. A run without overrides goes to ``default``.
- **Keys.** A run is *finished* when its ``meta.json`` says ``ok`` and its key equals the key of the run asked
  for: a hash of the resolved parameters, of the notebook's source and of the package's source
  (``taskloss/**/*.py``), so any edit — committed or not — makes the old result stale.
- **Locks.** Each run folder holds a ``.lock`` file locked (``flock``) while a process executes the run: two
  sweeps into one ``--out`` never execute the same run at once; the second waits and then finds it finished.
- **Summary.** ``SUMMARY.md`` is rebuilt from every run folder in the sweep folder (under a lock of its own), so
  two sweeps into one folder both end up in it and the last writer cannot drop the other's runs.
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
from typing import Any, Iterator

from taskloss.results.run import RESULTS_FILE
from taskloss.utils import REPO_ROOT, atomic_write_text

__all__ = ["META_FILE", "LOCK_FILE", "SUMMARY_FILE", "folder_name", "canonical", "source_hash",
           "package_hash", "run_key", "read_meta", "write_meta", "recorded_fingerprint", "is_finished", "run_lock",
           "RunBusy", "clear_run_folder", "summary_rows", "write_summary", "check_writable"]

META_FILE = "meta.json"
LOCK_FILE = ".lock"
SUMMARY_FILE = "SUMMARY.md"
PACKAGE_DIR = REPO_ROOT / "taskloss"
_PREFIX_CHARS = 60


def canonical(value: Any) -> str:
    """The JSON text that identifies a parameter set (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def folder_name(overrides: dict[str, Any]) -> str:
    """``name=value__name=value-<8 hex>``: a readable prefix (sanitized, at most 60 characters) and a hash of
    the exact overrides, so different values never map to one folder; ``default`` without overrides."""
    if not overrides:
        return "default"
    parts = []
    for k in sorted(overrides):
        v = overrides[k]
        parts.append(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}")
    prefix = re.sub(r"[^A-Za-z0-9=.,_+-]", "-", "__".join(parts))[:_PREFIX_CHARS].strip(".")
    return f"{prefix}-{_sha(canonical(overrides))[:8]}"


def source_hash(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    return _sha(Path(path).read_bytes())


def package_hash(root: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the package's Python sources (relative paths and bytes, in sorted order)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def run_key(parameters: dict[str, Any], notebook: Path, package: str | None = None) -> dict[str, str]:
    """The hashes that decide whether a finished run can be reused: ``run`` combines the other three."""
    key = {"parameters": _sha(canonical(parameters)), "notebook": source_hash(notebook),
           "package": package or package_hash()}
    key["run"] = _sha(canonical(key))
    return key


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
    """``meta.json`` says ``ok`` and, given the run ``key``, was made with that key."""
    meta = read_meta(folder)
    if meta is None or meta.get("status") != "ok":
        return False
    return key is None or (meta.get("key") or {}).get("run") == key


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


def _headline(folder: Path) -> str:
    try:
        res = json.loads((folder / RESULTS_FILE).read_text(encoding="utf-8"))
        results, keys = res.get("results", {}), res.get("headline", [])
        return "<br>".join(f"{k} = {_fmt(results[k])}" for k in keys if k in results)
    except (OSError, ValueError, AttributeError, TypeError):
        return ""


def summary_rows(sweep: Path) -> list[dict[str, Any]]:
    """One row per run folder directly inside ``sweep``: its meta (or the state of a folder without one)."""
    rows = []
    for folder in sorted(p for p in Path(sweep).iterdir() if p.is_dir() and not p.name.startswith(".")):
        has_meta = (folder / META_FILE).exists()
        if not has_meta and not (folder / LOCK_FILE).exists():
            continue
        meta = read_meta(folder)
        if meta is None:
            state = "corrupt meta.json" if has_meta else ("running" if _is_locked(folder) else "incomplete")
            meta = {"status": state}
        rows.append({**meta, "folder": folder.name, "headline": _headline(folder)})
    return rows


def write_summary(sweep: Path, title: str = "Summary") -> str:
    """Rebuild ``sweep/SUMMARY.md`` from every run folder in ``sweep`` and return its text."""
    sweep = Path(sweep)
    with run_lock(sweep, wait=True, name=".summary.lock"):
        rows = summary_rows(sweep)
        ok = sum(r.get("status") == "ok" for r in rows)
        lines = [f"# {title}", "", f"{ok} of {len(rows)} runs succeeded.", "",
                 "| notebook | run | status | seconds | headline results |", "|---|---|---|---:|---|"]
        for r in rows:
            status = r.get("status", "?")
            if status != "ok":
                reason = str(r.get("error", "")).replace("|", "\\|").replace("\n", " ")[:200]
                status = f"**{status}**" + (f": {reason}" if reason else "")
            lines.append(f"| {r.get('notebook', '')} | {r['folder']} | {status} | {r.get('seconds', '')} "
                         f"| {r['headline']} |")
        text = "\n".join(lines) + "\n"
        atomic_write_text(sweep / SUMMARY_FILE, text)
    return text
