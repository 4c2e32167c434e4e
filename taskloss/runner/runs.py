"""Run, rerun and sweep the notebooks: planning runs and executing them (here or through submitit on SLURM).
The command line lives in :mod:`taskloss.runner.cli`; refreshing the committed notebooks in
:mod:`taskloss.runner.refresh`.

Every run folder holds the executed notebook, its figures, ``results.json`` (written by the notebook through
:mod:`taskloss.results.run`), ``kernel.log`` and ``meta.json`` (parameters, the run key, package versions,
git commit, timing, status, the failing cell and exception when it failed), written last and atomically. A
folder whose ``meta.json`` says ``ok`` with the same key — parameters, notebook source and package source (see
:mod:`taskloss.runner.store`) — is a finished run: running the same sweep again skips it (``--force`` redoes
it); an interrupted, failed, cancelled or outdated run is redone. Parameter names, types and declared bounds
are checked against the notebook's ``parameters`` cell before any kernel starts.
"""
from __future__ import annotations

import contextlib
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from taskloss.runner.kernel import KERNEL_LOG, Cancellation, execute_notebook, kernel_env
from taskloss.runner.params import (
    ParameterError,
    check_constraints,
    expand_grid,
    load_yaml_params,
    notebook_parameters,
    parse_cli_value,
    read_notebook,
    validate_overrides,
)
from taskloss.runner.store import (
    RunBusy,
    canonical,
    clear_run_folder,
    data_hash,
    folder_name,
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

__all__ = ["RunSpec", "SweepResult", "threads_per_run", "find_notebook", "list_notebooks", "plan_runs", "check_no_clobber",
           "execute", "run_many", "environment_info"]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
EXECUTORS = ("inline", "local", "slurm")


def list_notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The jupytext sources ``NN_topic.py`` in numeric order."""
    return sorted(p for p in Path(directory).glob("[0-9][0-9]_*.py"))


def find_notebook(name: str, directory: Path = NOTEBOOK_DIR) -> Path:
    """Resolve ``"01"``, ``"01_optimization_as_sampling"`` or a path to a notebook source."""
    p = Path(name)
    if p.suffix in (".py", ".ipynb") and p.exists():
        return p.with_suffix(".py") if p.with_suffix(".py").exists() else p
    matches = [q for q in list_notebooks(directory) if q.stem == name or q.stem.split("_")[0] == name]
    if len(matches) != 1:
        known = ", ".join(q.stem for q in list_notebooks(directory)) or "none"
        raise ParameterError(f"no unique notebook matches {name!r}; notebooks: {known}")
    return matches[0]


@dataclass
class RunSpec:
    """One planned run: the notebook, its folder, the overrides, the resolved parameters and the run key."""

    notebook: Path
    out_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)  # defaults + overrides, all resolved
    key: dict[str, str] = field(default_factory=dict)
    source: str | None = None       # the notebook text read when the run was planned: what the key hashes and
                                    # what is executed (an edit after planning makes a later sweep's run stale)

    @property
    def name(self) -> str:
        """The notebook's name, e.g. ``02_importance_sampling_and_mgs``."""
        return self.notebook.stem

    @property
    def label(self) -> str:
        """``notebook/folder`` for progress lines (the notebook alone for an un-nested run)."""
        return f"{self.name}/{self.out_dir.name}" if self.out_dir.name != self.name else self.name


def plan_runs(notebook: Path, out: Path, *, param_files: list[str] = (), cli: list[tuple[str, str]] = (),
              grid: list[str] = (), nested: bool = True, package: str | None = None) -> list[RunSpec]:
    """Validate every override against the notebook's parameters and return the runs to execute.

    Precedence: YAML files in the order given, then ``-p`` values (later wins); ``--grid`` values vary on top.
    With ``nested`` each run goes to ``out/<notebook>/<folder_name(overrides)>`` (the grid's axes first in the
    name); otherwise to
    ``out/<notebook>``. Duplicate grid points give one run. Bounds declared in the parameters cell are checked.
    """
    try:
        source = Path(notebook).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"notebook not found: {notebook}") from None
    params = notebook_parameters(read_notebook(notebook, source))
    fixed: dict[str, Any] = {}
    for f in param_files:
        fixed.update(validate_overrides(params, load_yaml_params(f, params), source=str(f)))
    for name, text in cli:
        fixed.update(validate_overrides(params, {name: parse_cli_value(text, params.get(name))}, source="-p"))
    axes: dict[str, list] = {}
    for g in grid:
        if "=" not in g:
            raise ParameterError(f"--grid expects name=v1,v2,..., got {g!r}")
        name, values = g.split("=", 1)
        if name in axes:
            raise ParameterError(f"--grid {name} is given twice: list all its values in one --grid {name}=v1,v2")
        vals = [parse_cli_value(v, params.get(name)) for v in values.split(",") if v != ""]
        if not vals:
            raise ParameterError(f"--grid {name} has no values")
        axes[name] = [validate_overrides(params, {name: v}, source="--grid")[name] for v in vals]
    if "output_dir" in fixed or "output_dir" in axes:
        raise ParameterError("output_dir is set by the runner (use --out)")
    package = package or package_hash()
    specs, seen = [], set()
    for point in expand_grid(axes):
        overrides = {**fixed, **point}
        folder = out / notebook.stem / folder_name(overrides, first=axes) if nested else out / notebook.stem
        if folder in seen:  # a value repeated in a grid
            continue
        seen.add(folder)
        resolved = {k: p.default for k, p in params.items()}
        resolved.update(overrides)
        check_constraints(params, resolved)
        specs.append(RunSpec(notebook, folder, overrides, resolved,
                             run_key(resolved, notebook, package,
                                     data_hash(resolved, [n for n, p in params.items() if p.data]),
                                     source=source), source))
    return specs


def check_no_clobber(specs: list[RunSpec]) -> None:
    """Refuse to replace a finished run made with other overrides (an ``all`` sweep into a used ``--out``)."""
    for s in specs:
        meta = read_meta(s.out_dir)
        if meta and meta.get("status") == "ok" and canonical(meta.get("overrides", {})) != canonical(s.overrides):
            raise ParameterError(f"{s.out_dir} holds a finished run with other parameters "
                                 f"({meta.get('overrides')}); use another --out, or --force to replace it")


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


def execute(spec: RunSpec, *, timeout: float | None = None, threads: int | None = None, force: bool = False,
            cancel: Cancellation | None = None, on_cell: Callable[[int, int], None] | None = None) -> dict:
    """Execute one run into ``spec.out_dir`` under the folder's lock and return its meta (never raises on
    notebook errors). A run that another process finished while this one waited for the lock is not redone.

    The folder is emptied first (its lock kept); the executed notebook is written under a temporary name and
    renamed; ``meta.json`` is written last and atomically, so only a run that ended has one.
    """
    import nbformat
    from papermill.parameterize import parameterize_notebook

    folder = spec.out_dir
    try:
        with run_lock(folder, wait=True, cancelled=cancel.is_set if cancel else None):
            if not force and is_finished(folder, spec.key.get("run")):
                return {**read_meta(folder), "skipped": True}
            clear_run_folder(folder)
            nb = read_notebook(spec.notebook, spec.source)
            nb.metadata["papermill"] = {}
            nb = parameterize_notebook(nb,
                                       {**spec.overrides, "output_dir": str(folder.resolve())},
                                       kernel_name="python3", language="python")
            meta = {"notebook": spec.name, "source": str(spec.notebook), "overrides": spec.overrides,
                    "parameters": spec.parameters, "key": spec.key,
                    "started": datetime.now(timezone.utc).isoformat(), **environment_info()}
            start = time.perf_counter()
            meta.update(execute_notebook(nb, cwd=spec.notebook.parent, env=kernel_env(threads), timeout=timeout,
                                         log_path=folder / KERNEL_LOG, on_cell=on_cell, cancel=cancel))
            meta["seconds"] = round(time.perf_counter() - start, 2)
            meta["fingerprint"] = recorded_fingerprint(folder)
            partial, executed = folder / f".{spec.name}.partial.ipynb", folder / f"{spec.name}.ipynb"
            nbformat.write(nb, str(partial))
            os.chmod(partial, 0o644)
            os.replace(partial, executed)
            if meta.get("status") == "ok":
                meta["outputs"] = output_hashes(folder, spec.name)
            write_meta(folder, meta)
            return meta
    except RunBusy:
        return {"notebook": spec.name, "status": "cancelled", "error": "cancelled while waiting for the lock"}


def execute_job(spec: RunSpec, timeout: float | None = None, threads: int | None = None,
                force: bool = False) -> dict:
    """:func:`execute` as a submitit job (one process per run, on this machine or a SLURM node)."""
    return execute(spec, timeout=timeout, threads=threads, force=force)


@dataclass
class SweepResult:
    """The metas of a sweep's runs in plan order; ``interrupted`` after Ctrl-C."""

    metas: list[dict[str, Any]]
    interrupted: bool = False


def _finish(spec: RunSpec, meta: dict, done: int, total: int, write) -> dict:
    meta = {**meta, "out_dir": str(spec.out_dir)}
    status = "skipped (finished elsewhere)" if meta.pop("skipped", False) else meta.get("status", "?")
    line = f"[{done}/{total}] {status}: {spec.label}"
    if meta.get("seconds") is not None:
        line += f" in {meta['seconds']:.1f} s"
    if meta.get("status") not in ("ok", "cancelled"):
        line += f" — {meta.get('error', '')}"
    write(line)
    return meta


def run_many(specs: list[RunSpec], *, jobs: int = 1, force: bool = False, timeout: float | None = None,
             progress: bool = True, executor: str = "inline", cluster_params: dict | None = None,
             log_folder: Path | None = None) -> SweepResult:
    """Execute the runs (``jobs`` at a time), skipping finished ones unless ``force``; never stop at a failure.

    ``executor``: ``inline`` starts the kernels from this process (a bar per running notebook counts its cells);
    ``local`` and ``slurm`` submit one submitit job per run (``cluster_params`` go to
    ``submitit.AutoExecutor.update_parameters``, e.g. ``slurm_partition``, ``timeout_min``, ``gpus_per_node``).
    Ctrl-C cancels queued runs, kills running kernels (or cancels the jobs) and returns with ``interrupted``.
    """
    from tqdm.auto import tqdm

    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    todo = [s for s in specs if force or not is_finished(s.out_dir, s.key.get("run"))]
    for s in specs:
        if s not in todo:
            print(f"skip (finished): {s.out_dir}")
    threads = threads_per_run(jobs)
    disable = None if progress else True  # None: tqdm shows bars on a terminal only
    overall = tqdm(total=len(todo), desc="runs", unit="run", position=0,
                   disable=True if not todo else disable)
    metas: dict[Path, dict] = {}
    interrupted = False
    try:
        if executor == "inline":
            interrupted = _run_inline(todo, jobs, threads, force, timeout, disable, overall, metas)
        elif todo:
            interrupted = _run_submitit(todo, jobs, threads, force, timeout, executor, cluster_params or {},
                                        log_folder or todo[0].out_dir.parent / ".submitit", overall, metas)
    finally:
        overall.close()
    out = []
    for s in specs:
        meta = metas.get(s.out_dir) or read_meta(s.out_dir) or {"status": "cancelled", "error": "not started"}
        out.append({"notebook": s.name, **meta, "out_dir": str(s.out_dir)})
    return SweepResult(out, interrupted)


def threads_per_run(jobs: int, environ: dict | None = None) -> int:
    """BLAS/OpenMP threads each kernel gets: the CPU cores split between ``jobs`` runs, capped by an
    ``OMP_NUM_THREADS`` the caller set (``OMP_NUM_THREADS=1 … run NN`` means one thread per run, as it does for a
    plain Python process); a value that is not a positive integer is ignored."""
    environ = os.environ if environ is None else environ
    threads = max(1, (os.cpu_count() or 1) // jobs)
    given = str(environ.get("OMP_NUM_THREADS", "")).strip()
    if given.isdigit() and int(given) > 0:
        threads = min(threads, int(given))
    return threads


def _run_inline(todo, jobs, threads, force, timeout, disable, overall, metas) -> bool:
    from tqdm.auto import tqdm

    cancel = Cancellation()
    slots: queue.Queue[int] = queue.Queue()
    for i in range(1, jobs + 1):
        slots.put(i)

    def work(spec: RunSpec) -> dict:
        if cancel.is_set():
            return {"notebook": spec.name, "status": "cancelled", "error": "not started"}
        pos = slots.get()
        bar = tqdm(desc=spec.label[-40:], unit="cell", position=pos, leave=False, disable=disable)

        def on_cell(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        try:
            return execute(spec, timeout=timeout, threads=threads, force=force, cancel=cancel, on_cell=on_cell)
        finally:
            bar.close()
            slots.put(pos)

    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(work, s): s for s in todo}
    pending, deadline = set(futures), None
    with _interrupt_flag(cancel.cancel) as interrupted:
        while pending and (deadline is None or time.monotonic() < deadline):
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                if fut.cancelled():
                    continue
                s = futures[fut]
                try:
                    meta = fut.result()
                except Exception as exc:  # a runner fault (not a notebook error): reported, the sweep goes on
                    meta = {"notebook": s.name, "status": "failed", "error": f"runner: {type(exc).__name__}: {exc}"}
                metas[s.out_dir] = _finish(s, meta, len(metas) + 1, len(todo), overall.write)
                overall.update()
            if interrupted.is_set() and deadline is None:
                overall.write("interrupted: cancelling queued runs and stopping kernels …")
                for fut in pending:
                    fut.cancel()  # queued runs never start; running ones end as their kernels die
                deadline = time.monotonic() + 60
    pool.shutdown(wait=deadline is None, cancel_futures=True)
    return interrupted.is_set()


@contextlib.contextmanager
def _interrupt_flag(on_interrupt: Callable[[], None]):
    """While the block runs, Ctrl-C (SIGINT) sets the yielded event and calls ``on_interrupt`` instead of raising
    ``KeyboardInterrupt`` wherever the main thread happens to be: raised inside a lock's acquire/release, it can
    leave the lock held and hang the worker threads. A second Ctrl-C raises as usual."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()
        on_interrupt()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_submitit(todo, jobs, threads, force, timeout, executor, cluster_params, log_folder, overall,
                  metas) -> bool:
    try:
        import submitit
    except ImportError as exc:  # pragma: no cover - submitit is a test dependency
        raise ParameterError("--executor local/slurm needs submitit: pip install 'taskloss[cluster]'") from exc
    try:
        ex = submitit.AutoExecutor(folder=str(log_folder), cluster="local" if executor == "local" else "slurm")
        ex.update_parameters(**{"timeout_min": 24 * 60, "slurm_array_parallelism": jobs, **cluster_params})
    except (RuntimeError, ValueError, TypeError, NameError) as exc:  # no sbatch here, an unknown --cluster-param
        raise ParameterError(f"--executor {executor}: {exc}") from exc
    n = len(todo)
    submitted = ex.map_array(execute_job, todo, [timeout] * n, [None if executor == "slurm" else threads] * n,
                             [force] * n)
    pending = dict(zip(submitted, todo))
    with _interrupt_flag(lambda: None) as interrupted:
        while pending and not interrupted.is_set():
            for job in [j for j in pending if j.done()]:
                s = pending.pop(job)
                try:
                    meta = job.result()
                except Exception as exc:  # the job process itself failed (not the notebook)
                    meta = {"notebook": s.name, "status": "failed",
                            "error": f"job {job.job_id}: {str(exc).strip().splitlines()[-1][:300]}"}
                metas[s.out_dir] = _finish(s, meta, len(metas) + 1, n, overall.write)
                overall.update()
            time.sleep(0.5)
    if interrupted.is_set():
        overall.write("interrupted: cancelling submitted jobs …")
        for job in pending:
            job.cancel(check=False)
    return interrupted.is_set()
