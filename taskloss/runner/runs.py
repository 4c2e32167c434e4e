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
import queue
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from taskloss.runner.execution import RunSpec, execute, execute_job
from taskloss.runner.kernel import Cancellation, threads_per_run
from taskloss.runner.params import (
    ParameterError,
    YAML12Loader,
    check_constraints,
    expand_grid,
    load_yaml_params,
    notebook_parameters,
    parse_cli_value,
    read_notebook,
    validate_overrides,
)
from taskloss.runner.store import (
    canonical,
    data_hash,
    folder_name,
    is_finished,
    package_hash,
    read_meta,
    run_key,
)
from taskloss.utils import REPO_ROOT

__all__ = ["SweepResult", "notebook_dirs", "default_notebook_dir", "find_notebook",
           "list_notebooks", "plan_runs",
           "check_no_clobber", "run_many"]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS_ENV = "TASKLOSS_NOTEBOOKS"
EXECUTORS = ("inline", "local", "slurm")


def notebook_dirs() -> list[Path]:
    """Where the notebooks are looked for, in order: ``$TASKLOSS_NOTEBOOKS``, the clone this package was imported
    from (``<clone>/notebooks``; a pip-installed package has none) and ``./notebooks`` (a clone in the current
    folder)."""
    out = []
    for d in (os.environ.get(NOTEBOOKS_ENV), NOTEBOOK_DIR, Path.cwd() / "notebooks"):
        if d and Path(d).expanduser().resolve() not in out:
            out.append(Path(d).expanduser().resolve())
    return out


def default_notebook_dir() -> Path | None:
    """The first of :func:`notebook_dirs` that holds ``NN_topic.py`` notebooks, or ``None``."""
    return next((d for d in notebook_dirs() if any(d.glob("[0-9][0-9]_*.py"))), None)


def _no_notebooks(name: str | None = None) -> ParameterError:
    looked = ", ".join(str(d) for d in notebook_dirs())
    what = f"no notebook {name!r}: " if name else ""
    return ParameterError(f"{what}no notebooks found (looked in {looked}). The notebooks come with a clone of the "
                          "repository, not with a pip install: run from the clone, pass a notebook's path "
                          "(taskloss-runs run path/to/NN_topic.py), or give their folder with --notebooks DIR "
                          f"or {NOTEBOOKS_ENV}=DIR")


def list_notebooks(directory: Path | None = None) -> list[Path]:
    """The jupytext sources ``NN_topic.py`` in numeric order, from ``directory`` (default:
    :func:`default_notebook_dir`; none found: an empty list)."""
    directory = default_notebook_dir() if directory is None else directory
    return sorted(p for p in Path(directory).glob("[0-9][0-9]_*.py")) if directory is not None else []


def find_notebook(name: str, directory: Path | None = None) -> Path:
    """Resolve ``"01"``, ``"01_optimization_as_sampling"`` or a path to a notebook source (a number or name is
    looked up in ``directory``, default :func:`default_notebook_dir`)."""
    p = Path(name)
    if p.suffix in (".py", ".ipynb") and p.exists():
        return p.with_suffix(".py") if p.with_suffix(".py").exists() else p
    known = list_notebooks(directory)
    if not known:
        raise _no_notebooks(name)
    matches = [q for q in known if q.stem == name or q.stem.split("_")[0] == name]
    if len(matches) != 1:
        raise ParameterError(f"no unique notebook matches {name!r} in {known[0].parent}; notebooks: "
                             f"{', '.join(q.stem for q in known)}")
    return matches[0]


def _grid_values(name: str, values: str, param) -> list:
    """The values of ``--grid name=values``: comma-separated scalars, or bracketed lists for a list parameter
    (``--grid widths=[4,8],[16]``), read with YAML 1.2 rules."""
    if param is not None and param.type_name.startswith(("list", "tuple")):
        try:
            vals = yaml.load(f"[{values}]", Loader=YAML12Loader)
        except yaml.YAMLError:
            vals = None
        if not isinstance(vals, list) or not all(isinstance(v, list) for v in vals):
            raise ParameterError(f"--grid {name}: {name} is a list parameter ({param.type_name}); give each value as a "
                                 f"bracketed list, e.g. --grid '{name}=[1,2],[3,4]' (quoted for the shell)")
        return vals
    return [parse_cli_value(v, param) for v in values.split(",") if v != ""]


def _resolve_data_paths(params, values: dict[str, Any], base: Path) -> dict[str, Any]:
    """``[data]`` values that are relative paths, made absolute from ``base`` (see :func:`plan_runs`)."""
    out = dict(values)
    for name, v in values.items():
        p = params.get(name)
        if p is not None and p.data and isinstance(v, str) and v and not Path(v).expanduser().is_absolute():
            out[name] = str((base / Path(v)).resolve())
    return out


def plan_runs(notebook: Path, out: Path, *, param_files: list[str] = (), cli: list[tuple[str, str]] = (),
              grid: list[str] = (), nested: bool = True, package: str | None = None,
              param_set: tuple[str, str | Path] | None = None, data_base: Path | None = None) -> list[RunSpec]:
    """Validate every override against the notebook's parameters and return the runs to execute.

    Precedence: the named parameter set (``param_set``: its name and YAML file, e.g. ``("smoke",
    "params/12_…/smoke.yaml")``), then YAML files in the order given, then ``-p`` values (later wins); ``--grid``
    values vary on top. With ``nested`` each run goes to ``out/<notebook>/<folder>``: the set's name, then
    :func:`~taskloss.runner.store.folder_name` of the overrides the user added on top of it (``smoke``,
    ``smoke__seed=3``; without a set ``seed=3``, the grid's axes first in the name); a run whose values all equal
    the notebook's defaults is the ``default`` run, wherever they came from (``-p seed 0`` reuses ``default``).
    Otherwise each run goes to ``out/<notebook>``. Duplicate grid points give one run. Bounds declared in the
    parameters cell are checked.

    A ``[data]`` parameter's relative path is read from ``data_base`` (default: the current folder, where the
    command was typed) and passed to the kernel, hashed and recorded as an absolute path: the kernel runs in the
    notebook's folder, so a relative path would name another file there.
    """
    try:
        source = Path(notebook).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"notebook not found: {notebook}") from None
    params = notebook_parameters(read_notebook(notebook, source))
    base = Path.cwd() if data_base is None else Path(data_base)
    set_values: dict[str, Any] = {}
    if param_set is not None:
        set_values = validate_overrides(params, load_yaml_params(param_set[1], params), source=str(param_set[1]))
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
        vals = _grid_values(name, values, params.get(name))
        if not vals:
            raise ParameterError(f"--grid {name} has no values")
        axes[name] = [validate_overrides(params, {name: v}, source="--grid")[name] for v in vals]
    if "output_dir" in fixed or "output_dir" in axes or "output_dir" in set_values:
        raise ParameterError("output_dir is set by the runner (use --out)")
    set_values = _resolve_data_paths(params, set_values, base)
    fixed = _resolve_data_paths(params, fixed, base)
    axes = {k: [_resolve_data_paths(params, {k: v}, base)[k] for v in vs] for k, vs in axes.items()}
    package = package or package_hash()
    defaults = {k: p.default for k, p in params.items()}
    specs, seen = [], set()
    for point in expand_grid(axes):
        overrides = {**set_values, **fixed, **point}
        if all(canonical(v) == canonical(defaults[k]) for k, v in overrides.items()):
            overrides, label = {}, "default"     # the default run, however its values were given
        elif param_set is not None:
            added = {k: v for k, v in {**fixed, **point}.items()
                     if canonical(v) != canonical(set_values.get(k, defaults[k]))}
            label = param_set[0] + (f"__{folder_name(added, first=axes)}" if added else "")
        else:
            label = folder_name(overrides, first=axes)
        folder = out / notebook.stem / label if nested else out / notebook.stem
        if folder in seen:  # a value repeated in a grid
            continue
        seen.add(folder)
        resolved = {**defaults, **overrides}
        check_constraints(params, resolved)
        data_names = tuple(n for n, p in params.items() if p.data)
        specs.append(RunSpec(notebook, folder, overrides, resolved,
                             run_key(resolved, notebook, package, data_hash(resolved, data_names), source=source),
                             source, data_names))
    return specs


def check_no_clobber(specs: list[RunSpec]) -> None:
    """Refuse to replace a finished run made with other overrides (an ``all`` sweep into a used ``--out``)."""
    for s in specs:
        meta = read_meta(s.out_dir)
        if meta and meta.get("status") == "ok" and canonical(meta.get("overrides", {})) != canonical(s.overrides):
            raise ParameterError(f"{s.out_dir} holds a finished run with other parameters "
                                 f"({meta.get('overrides')}); use another --out, or --force to replace it")


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
             log_folder: Path | None = None, threads: int | None = None) -> SweepResult:
    """Execute the runs (``jobs`` at a time), skipping finished ones unless ``force``; never stop at a failure.

    ``executor``: ``inline`` starts the kernels from this process (a bar per running notebook counts its cells);
    ``local`` and ``slurm`` submit one submitit job per run (``cluster_params`` go to
    ``submitit.AutoExecutor.update_parameters``, e.g. ``slurm_partition``, ``timeout_min``, ``gpus_per_node``).
    Ctrl-C cancels queued runs, kills running kernels (or cancels the jobs) and returns with ``interrupted``.
    ``threads``: BLAS threads per kernel (:func:`~taskloss.runner.kernel.threads_per_run` decides when ``None``).
    ``timeout``: seconds per cell, positive (``None``: no limit).
    """
    from tqdm.auto import tqdm

    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0 or timeout != timeout):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    todo = [s for s in specs if force or not is_finished(s.out_dir, s.key.get("run"))]
    for s in specs:
        if s not in todo:
            print(f"skip (finished): {s.out_dir}")
    threads = threads_per_run(jobs, threads=threads)
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
