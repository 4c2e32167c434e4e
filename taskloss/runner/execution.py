"""Executing one planned run: the key read when it starts, the kernel, and its ``meta.json``.

:func:`execute` is what every executor calls for a run (:mod:`taskloss.runner.runs` plans and schedules them): it
takes the folder's lock, hashes the notebook, package and ``[data]`` bytes it is about to execute
(:func:`start_key`), skips a run finished under that key, executes the notebook in a fresh kernel and writes the
executed notebook and ``meta.json`` — at the default parameters with ``reproduced``, how many of the committed
headlines the run reproduced (:mod:`taskloss.runner.report`).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from taskloss.results.run import RESULTS_FILE
from taskloss.runner.kernel import KERNEL_LOG, Cancellation, execute_notebook, kernel_env
from taskloss.runner.params import read_notebook
from taskloss.runner.report import committed_metadata, reproduction
from taskloss.runner.store import (
    RunBusy,
    clear_run_folder,
    data_hash,
    is_finished,
    output_hashes,
    package_hash,
    read_meta,
    recorded_fingerprint,
    run_key,
    run_lock,
    write_meta,
)
from taskloss.utils import REPO_ROOT

__all__ = ["RunSpec", "environment_info", "start_key", "execute", "execute_job"]


@dataclass
class RunSpec:
    """One planned run: the notebook, its folder, the overrides, the resolved parameters and the run key."""

    notebook: Path
    out_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)  # defaults + overrides, all resolved
    key: dict[str, str] = field(default_factory=dict)
    source: str | None = None       # the notebook text read when the run was planned (the planned key hashes it;
                                    # execute() re-reads and re-hashes everything when the run starts)
    data_names: tuple[str, ...] = ()    # the notebook's [data] parameters

    @property
    def name(self) -> str:
        """The notebook's name, e.g. ``02_importance_sampling_and_mgs``."""
        return self.notebook.stem

    @property
    def label(self) -> str:
        """``notebook/folder`` for progress lines (the notebook alone for an un-nested run)."""
        return f"{self.name}/{self.out_dir.name}" if self.out_dir.name != self.name else self.name


def _git_commit() -> dict[str, Any]:
    def git(*args):
        r = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def environment_info() -> dict[str, Any]:
    """Python, package versions, device and git commit, saved beside each output (for the record only)."""
    from importlib import metadata

    versions = {}
    for pkg in ("taskloss", "torch", "numpy", "scipy", "scikit-learn", "transformers", "papermill", "jupytext"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "packages": versions,
            "git": _git_commit()}
    try:
        import torch
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover - torch import problems are reported by the notebook itself
        info["cuda"] = None
    return info


def _results(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / RESULTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def start_key(spec: RunSpec) -> tuple[str, dict[str, str]]:
    """``(notebook text, run key)`` read at the moment a run starts: the notebook's bytes that will be executed,
    the package's sources and the ``[data]`` files as they are now. A sweep plans its keys up front; an edit
    between two of its runs (a package file, the notebook, a data file) is thus filed under the key of what the
    later run really executed, never under the planned one."""
    try:
        source = Path(spec.notebook).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"notebook not found: {spec.notebook} (removed since the sweep was planned)") from None
    key = run_key(spec.parameters, spec.notebook, package_hash(), data_hash(spec.parameters, spec.data_names),
                  source=source)
    return source, key


def execute(spec: RunSpec, *, timeout: float | None = None, threads: int | None = None, force: bool = False,
            cancel: Cancellation | None = None, on_cell: Callable[[int, int], None] | None = None) -> dict:
    """Execute one run into ``spec.out_dir`` under the folder's lock and return its meta (never raises on
    notebook errors). A run that another process finished while this one waited for the lock is not redone.

    The key is taken when the run starts (:func:`start_key`), from the bytes it executes. The folder is emptied
    first (its lock kept); the executed notebook is written under a temporary name and renamed; ``meta.json``
    (with ``threads``, the BLAS/OpenMP threads the kernel got) is written last and atomically, so only a run that
    ended has one.
    """
    import nbformat
    from papermill.parameterize import parameterize_notebook

    folder = spec.out_dir
    try:
        with run_lock(folder, wait=True, cancelled=cancel.is_set if cancel else None):
            source, key = start_key(spec)
            if not force and is_finished(folder, key["run"]):
                return {**read_meta(folder), "skipped": True}
            clear_run_folder(folder)
            nb = read_notebook(spec.notebook, source)
            nb.metadata["papermill"] = {}
            nb = parameterize_notebook(nb,
                                       {**spec.overrides, "output_dir": str(folder.resolve())},
                                       kernel_name="python3", language="python")
            env = kernel_env(threads)
            meta = {"notebook": spec.name, "source": str(spec.notebook), "overrides": spec.overrides,
                    "parameters": spec.parameters, "key": key,
                    "threads": int(env["OMP_NUM_THREADS"]) if env.get("OMP_NUM_THREADS", "").isdigit() else None,
                    "started": datetime.now(timezone.utc).isoformat(), **environment_info()}
            if key["run"] != spec.key.get("run"):
                meta["changed_since_planned"] = sorted(k for k in key if k != "run" and key[k] != spec.key.get(k))
            start = time.perf_counter()
            meta.update(execute_notebook(nb, cwd=spec.notebook.parent, env=env, timeout=timeout,
                                         log_path=folder / KERNEL_LOG, on_cell=on_cell, cancel=cancel))
            meta["seconds"] = round(time.perf_counter() - start, 2)
            meta["fingerprint"] = recorded_fingerprint(folder)
            partial, executed = folder / f".{spec.name}.partial.ipynb", folder / f"{spec.name}.ipynb"
            nbformat.write(nb, str(partial))
            os.chmod(partial, 0o644)
            os.replace(partial, executed)
            if meta.get("status") == "ok":
                meta["outputs"] = output_hashes(folder, spec.name)
            if not spec.overrides:      # the default run: did it reproduce the committed headlines?
                meta["reproduced"] = reproduction(committed_metadata(spec.notebook), _results(folder))
            write_meta(folder, meta)
            return meta
    except RunBusy:
        return {"notebook": spec.name, "status": "cancelled", "error": "cancelled while waiting for the lock"}


def execute_job(spec: RunSpec, timeout: float | None = None, threads: int | None = None,
                force: bool = False) -> dict:
    """:func:`execute` as a submitit job (one process per run, on this machine or a SLURM node)."""
    return execute(spec, timeout=timeout, threads=threads, force=force)
