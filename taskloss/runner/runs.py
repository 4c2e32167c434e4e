"""Run, rerun and sweep the notebooks with papermill: ``python -m taskloss.runner``.

Examples::

    python -m taskloss.runner all                                   # make run: every notebook → runs/default/
    python -m taskloss.runner run 01 -p n_samples 20000 -p device cuda
    python -m taskloss.runner run 02 -f params/02_importance_sampling_and_mgs/full.yaml -p seed 3
    python -m taskloss.runner run 02 --grid alpha=0.1,1,10 --grid seed=0,1,2 --jobs 2
    python -m taskloss.runner refresh notebooks/01_optimization_as_sampling.py   # make notebooks
    python -m taskloss.runner params 01                             # list a notebook's parameters

Every run folder holds the executed notebook, its figures and ``results.json`` (written by the notebook through
:mod:`taskloss.runner.notebook`) and ``meta.json`` (parameters, package versions, git commit, timing, status), written last and atomically: a
folder whose ``meta.json`` says ``ok`` for the same parameters at the same git commit is a finished run, and
re-running the same sweep skips it (``--force`` redoes it); an interrupted or failed run, or one made by an older
commit, is redone. Parameter names and types are checked
against the notebook's ``parameters`` cell before anything executes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from taskloss.runner.notebook import RESULTS_FILE
from taskloss.runner.params import (
    ParameterError,
    expand_grid,
    load_yaml_params,
    notebook_parameters,
    parse_cli_value,
    read_notebook,
    validate_overrides,
)
from taskloss.utils import REPO_ROOT, atomic_write_text

__all__ = ["RunSpec", "find_notebook", "list_notebooks", "plan_runs", "execute", "run_many", "write_summary",
           "refresh", "main"]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
META_FILE = "meta.json"
# Kernels inherit the environment: an MPLBACKEND=Agg left over from a test shell would drop every inline figure.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"


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
    notebook: Path
    out_dir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)  # defaults + overrides, all resolved

    @property
    def name(self) -> str:
        return self.notebook.stem


def _slug(overrides: dict[str, Any]) -> str:
    if not overrides:
        return "default"
    parts = []
    for k in sorted(overrides):
        v = overrides[k]
        v = ",".join(map(str, v)) if isinstance(v, list) else str(v)
        parts.append(f"{k}={v}")
    slug = "__".join(parts)
    return "".join(c if c.isalnum() or c in "=.,_-+" else "-" for c in slug)[:200]


def plan_runs(notebook: Path, out: Path, *, param_files: list[str] = (), cli: list[tuple[str, str]] = (),
              grid: list[str] = (), nested: bool = True) -> list[RunSpec]:
    """Validate every override against the notebook's parameters and return the runs to execute.

    Precedence: YAML files in the order given, then ``-p`` values (later wins); ``--grid`` values vary on top.
    With ``nested`` each run goes to ``out/<notebook>/<slug>``; otherwise straight into ``out/<notebook>``.
    """
    params = notebook_parameters(notebook)
    fixed: dict[str, Any] = {}
    for f in param_files:
        fixed.update(validate_overrides(params, load_yaml_params(f), source=str(f)))
    for name, text in cli:
        fixed.update(validate_overrides(params, {name: parse_cli_value(text, params.get(name))}, source="-p"))
    axes: dict[str, list] = {}
    for g in grid:
        if "=" not in g:
            raise ParameterError(f"--grid expects name=v1,v2,..., got {g!r}")
        name, values = g.split("=", 1)
        vals = [parse_cli_value(v, params.get(name)) for v in values.split(",") if v != ""]
        if not vals:
            raise ParameterError(f"--grid {name} has no values")
        axes[name] = [validate_overrides(params, {name: v}, source="--grid")[name] for v in vals]
    if "output_dir" in fixed or "output_dir" in axes:
        raise ParameterError("output_dir is set by the runner (use --out)")
    specs = []
    for point in expand_grid(axes):
        overrides = {**fixed, **point}
        folder = out / notebook.stem / _slug(overrides) if nested else out / notebook.stem
        resolved = {k: p.default for k, p in params.items()}
        resolved.update(overrides)
        specs.append(RunSpec(notebook, folder, overrides, resolved))
    return specs


def _git_commit() -> dict[str, Any]:
    def git(*args):
        r = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def environment_info() -> dict[str, Any]:
    """Python, package versions, device and git commit, saved beside each output."""
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


def is_finished(folder: Path, spec: RunSpec | None = None) -> bool:
    """A run is finished when its ``meta.json`` says ``ok`` — and, given ``spec``, when it ran with the same
    resolved parameters at the same git commit (a run made by other code or other parameters is redone)."""
    meta = folder / META_FILE
    if not meta.exists():
        return False
    try:
        m = json.loads(meta.read_text())
    except json.JSONDecodeError:
        return False
    if m.get("status") != "ok":
        return False
    if spec is not None:
        if json.loads(json.dumps(spec.parameters, default=str)) != m.get("parameters"):
            return False
        ran_at, now = (m.get("git") or {}).get("commit"), _git_commit()["commit"]
        if ran_at and now and ran_at != now:
            return False
    return True


def execute(spec: RunSpec, *, timeout: float | None = None, threads: int | None = None) -> dict[str, Any]:
    """Execute one run with papermill into ``spec.out_dir`` and return its meta (never raises on notebook errors).

    The folder is emptied first; the executed notebook is written under a temporary name and renamed at the
    end; ``meta.json`` is written last and atomically, so only a run that ended has one.
    """
    import papermill as pm

    folder = spec.out_dir
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    nb = read_notebook(spec.notebook)
    meta = {"notebook": spec.name, "source": str(spec.notebook), "overrides": spec.overrides,
            "parameters": spec.parameters, "started": datetime.now(timezone.utc).isoformat(),
            **environment_info()}
    start = time.perf_counter()
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    if threads:  # the kernel inherits the environment: keep parallel jobs from oversubscribing the cores
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    partial, executed = folder / f".{spec.name}.partial.ipynb", folder / f"{spec.name}.ipynb"
    try:
        pm.execute_notebook(nb, str(partial), parameters={**spec.overrides, "output_dir": str(folder.resolve())},
                            kernel_name="python3", cwd=str(spec.notebook.parent), progress_bar=False,
                            execution_timeout=timeout, log_output=False)
        meta["status"] = "ok"
    except Exception as exc:  # a failing notebook is reported, not lost
        meta["status"] = "failed"
        meta["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
    meta["seconds"] = round(time.perf_counter() - start, 2)
    if partial.exists():
        os.replace(partial, executed)
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1, default=str))
    return meta


def run_many(specs: list[RunSpec], *, jobs: int = 1, force: bool = False, timeout: float | None = None,
             progress: bool = True) -> list[dict[str, Any]]:
    """Execute runs (``jobs`` at a time), skipping finished ones unless ``force``; never stop at a failure."""
    from tqdm.auto import tqdm

    todo = [s for s in specs if force or not is_finished(s.out_dir, s)]
    skipped = [s for s in specs if s not in todo]
    for s in skipped:
        print(f"skip (finished): {s.out_dir}")
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    metas = {}
    bar = tqdm(total=len(todo), desc="notebooks", unit="run", disable=not progress or not todo)
    if jobs <= 1:
        for s in todo:
            bar.set_postfix_str(f"{s.name} {_slug(s.overrides)}")
            metas[s.out_dir] = execute(s, timeout=timeout)
            bar.update()
    else:  # papermill starts one kernel process per run; threads only wait on them
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(execute, s, timeout=timeout, threads=threads): s for s in todo}
            for fut in as_completed(futures):
                s = futures[fut]
                try:
                    metas[s.out_dir] = fut.result()
                except Exception as exc:  # pragma: no cover - execute() catches notebook errors itself
                    metas[s.out_dir] = {"notebook": s.name, "status": "failed", "error": repr(exc)}
                bar.set_postfix_str(f"{s.name} done")
                bar.update()
    bar.close()
    out = []
    for s in specs:
        meta = metas.get(s.out_dir) or json.loads((s.out_dir / META_FILE).read_text())
        meta["out_dir"] = str(s.out_dir)
        if meta.get("status") != "ok":
            print(f"FAILED: {s.name} ({s.out_dir}): {meta.get('error', '')[-500:]}", file=sys.stderr)
        out.append(meta)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return f"[{', '.join(_fmt(x) for x in v[:4])}{', …' if len(v) > 4 else ''}]"
    return str(v)


def write_summary(metas: list[dict[str, Any]], path: Path) -> str:
    """``SUMMARY.md``: one row per run with status, time, overrides and the notebook's headline numbers."""
    lines = ["# Summary", "", f"{sum(m.get('status') == 'ok' for m in metas)} of {len(metas)} runs succeeded.", "",
             "| notebook | run | status | seconds | headline results |", "|---|---|---|---:|---|"]
    for m in metas:
        folder = Path(m["out_dir"])
        res_path = folder / RESULTS_FILE
        headline = ""
        if res_path.exists():
            res = json.loads(res_path.read_text())
            headline = "<br>".join(f"{k} = {_fmt(res['results'][k])}" for k in res.get("headline", [])
                                   if k in res.get("results", {}))
        status = m.get("status", "?")
        if status != "ok":
            status = f"**{status}**: {str(m.get('error', '')).splitlines()[0][:120] if m.get('error') else ''}"
        lines.append(f"| {m['notebook']} | {_slug(m.get('overrides', {}))} | {status} | {m.get('seconds', '')} "
                     f"| {headline} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(path, text)
    return text


def refresh(paths: list[Path], *, timeout: float = 1800) -> None:
    """Re-execute notebooks from their ``.py`` source and rewrite the paired ``.ipynb`` with fresh outputs."""
    import jupytext
    from nbclient import NotebookClient

    os.environ["MPLBACKEND"] = INLINE_BACKEND
    for py in paths:
        py = find_notebook(str(py))
        nb = read_notebook(py)
        print(f"executing {py.name} …", flush=True)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(py.parent)}}).execute()
        for cell in nb.cells:  # volatile timing metadata would make every refresh a diff
            cell.metadata.pop("execution", None)
            if not cell.metadata.get("tags", True):
                cell.metadata.pop("tags")
        jupytext.write(nb, py.with_suffix(".ipynb"))
        print(f"  wrote {py.with_suffix('.ipynb').name} in {time.perf_counter() - t0:.1f} s", flush=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m taskloss.runner", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
        p.add_argument("-f", "--params-file", action="append", default=[], metavar="YAML")
        p.add_argument("--jobs", type=int, default=1)
        p.add_argument("--force", action="store_true", help="redo finished runs")
        p.add_argument("--timeout", type=float, default=None, help="seconds per cell")

    r = sub.add_parser("run", help="run one notebook (optionally a grid sweep)")
    r.add_argument("notebook")
    r.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2")
    r.add_argument("--out", default=str(REPO_ROOT / "runs"))
    common(r)
    a = sub.add_parser("all", help="run every notebook into one folder and write SUMMARY.md")
    a.add_argument("--out", default=str(REPO_ROOT / "runs" / "default"))
    a.add_argument("--only", nargs="*", default=None, help="notebook numbers or names")
    common(a)
    f = sub.add_parser("refresh", help="re-execute notebooks and refresh the committed .ipynb outputs")
    f.add_argument("notebooks", nargs="*")
    i = sub.add_parser("params", help="list a notebook's parameters")
    i.add_argument("notebook")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "params":
            for p in notebook_parameters(find_notebook(args.notebook)).values():
                print(f"{p.name}: {p.type_name} = {p.default!r}")
            return 0
        if args.cmd == "refresh":
            refresh([Path(p) for p in args.notebooks] or list_notebooks())
            return 0
        out = Path(args.out)
        if args.cmd == "run":
            specs = plan_runs(find_notebook(args.notebook), out, param_files=args.params_file, cli=args.param,
                              grid=args.grid)
        else:
            names = args.only or [p.stem for p in list_notebooks()]
            specs = []
            for n in names:  # validate everything before executing anything
                specs += plan_runs(find_notebook(n), out, param_files=args.params_file, cli=args.param,
                                   nested=False)
    except (ParameterError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metas = run_many(specs, jobs=args.jobs, force=args.force, timeout=args.timeout)
    summary = out / "SUMMARY.md" if args.cmd == "all" else out / specs[0].name / "SUMMARY.md"
    print(write_summary(metas, summary))
    print(f"summary: {summary}")
    failed = [m for m in metas if m.get("status") != "ok"]
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(m['notebook'] for m in failed)}", file=sys.stderr)
        return 1
    return 0
