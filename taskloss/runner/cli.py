"""``python -m taskloss.runner`` (also ``taskloss-runs``): run, rerun and sweep notebooks.

Examples::

    python -m taskloss.runner all                                   # make run: every notebook → runs/default/
    python -m taskloss.runner run 01 -p n_samples 20000 -p device cuda
    python -m taskloss.runner run 02 -f params/02_importance_sampling_and_mgs/full.yaml -p seed 3
    python -m taskloss.runner run 02 --grid alpha=0.1,1,10 --grid seed=0,1,2 --jobs 2
    python -m taskloss.runner run 02 --grid seed=0,1,2 --executor slurm --cluster-param slurm_partition=gpu
    python -m taskloss.runner refresh notebooks/01_optimization_as_sampling.py   # make notebooks
    python -m taskloss.runner params 01                             # a notebook's parameters, explained
    python -m taskloss.runner run 12 --set smoke                    # params/12_*/smoke.yaml: seconds, claims reported
    python -m taskloss.runner all --set smoke --jobs 2              # make smoke: every notebook at smoke scale
    python -m taskloss.runner table runs/02_importance_sampling_and_mgs --metric toy/gd_final_task_loss --by alpha
    python -m taskloss.runner run 04 --set full && python -m taskloss.runner record runs/04_sequence_task_losses/full

Exit status: 0 when every run succeeded, 1 when one failed, 2 for bad parameters or an unusable ``--out``
(nothing executed), 130 after Ctrl-C (queued runs cancelled, kernels stopped, a partial SUMMARY.md written).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from taskloss.runner.params import ParameterError, notebook_parameters, parse_cli_value
from taskloss.runner.refresh import refresh
from taskloss.runner.report import terminal_table
from taskloss.runner.runs import (
    EXECUTORS,
    check_no_clobber,
    default_notebook_dir,
    find_notebook,
    list_notebooks,
    notebook_dirs,
    plan_runs,
    run_many,
)
from taskloss.runner.store import SUMMARY_FILE, check_writable, summary_rows, write_summary

__all__ = ["main", "describe_parameters"]


def describe_parameters(notebook: Path) -> str:
    """The parameters of a notebook, one per line: ``name: type = default  # comment`` (the comment is the
    notebook's own explanation, with declared bounds such as ``[> 0]``)."""
    params = notebook_parameters(notebook)
    width = max((len(f"{p.name}: {p.type_name} = {p.default!r}") for p in params.values()), default=0)
    lines = [f"Parameters of {notebook.stem} (set with -p NAME VALUE, -f FILE.yaml or --grid NAME=V1,V2):"]
    for p in params.values():
        head = f"{p.name}: {p.type_name} = {p.default!r}"
        lines.append(f"  {head:<{width}}  # {p.help}" if p.help else f"  {head}")
    return "\n".join(lines)


def _cluster_params(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ParameterError(f"--cluster-param expects NAME=VALUE, got {item!r}")
        name, value = item.split("=", 1)
        out[name] = parse_cli_value(value)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m taskloss.runner",
                                 description="Run, rerun and sweep the notebooks (also installed as taskloss-runs).",
                                 epilog="Run 'python -m taskloss.runner COMMAND --help' for a command's options.")
    ap.add_argument("--notebooks", default=None, metavar="DIR",
                    help="the folder of the NN_topic.py notebooks (default: $TASKLOSS_NOTEBOOKS, the clone this "
                         "package comes from, or ./notebooks); a pip install has none: pass a clone's notebooks/")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                       help="set a parameter (repeatable; the value is read as YAML 1.2: 1e-4, true, [1, 2]; "
                            "str parameters take the text as written). Later -p wins over -f files.")
        p.add_argument("-f", "--params-file", action="append", default=[], metavar="YAML",
                       help="a flat YAML file 'name: value' (repeatable, applied in order, before -p), "
                            "e.g. params/NN_topic/full.yaml")
        p.add_argument("--set", dest="param_set", default=None, metavar="NAME",
                       help="a named parameter set, params/<notebook>/NAME.yaml (e.g. smoke, full), applied "
                            "before -f files and -p values")
        p.add_argument("--jobs", type=int, default=1, metavar="N",
                       help="runs at once (default 1); the CPU cores are split between them (see --threads). With "
                            "--executor slurm: the most array tasks running at once")
        p.add_argument("--threads", type=int, default=None, metavar="N",
                       help="BLAS/OpenMP threads per kernel (default: the cores split between the --jobs runs, "
                            "max(1, cores // jobs), at most the cores the load average leaves free and at most "
                            "OMP_NUM_THREADS when it is set); recorded in meta.json")
        p.add_argument("--force", action="store_true", help="redo finished runs")
        p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="limit per cell, a positive number of seconds (default: none)")
        p.add_argument("--executor", choices=EXECUTORS, default="inline",
                       help="inline: kernels started from this process (default); local / slurm: one submitit "
                            "job per run on this machine / on a SLURM cluster (same folders, same resume rules)")
        p.add_argument("--cluster-param", action="append", default=[], metavar="NAME=VALUE",
                       help="passed to submitit's AutoExecutor.update_parameters, e.g. slurm_partition=gpu, "
                            "timeout_min=120, gpus_per_node=1")

    r = sub.add_parser("run", help="run one notebook (optionally a grid sweep)")
    r.add_argument("notebook", help="number (02), name (02_importance_sampling_and_mgs) or path")
    r.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="sweep a parameter over comma-separated values (repeatable: the grid is the product); "
                        "a list parameter takes bracketed lists, 'widths=[4,8],[16]'; "
                        "each run gets its own folder, a duplicate value runs once")
    r.add_argument("--out", default=None,
                   help="sweep folder; runs go to OUT/<notebook>/<parameters>/ (default: runs/ beside the "
                        "notebooks' folder)")
    common(r)
    a = sub.add_parser("all", help="run every notebook into one folder and write SUMMARY.md")
    a.add_argument("--out", default=None,
                   help="folder; each notebook runs into OUT/<notebook>/ (default: runs/default beside the "
                        "notebooks' folder)")
    a.add_argument("--only", nargs="*", default=None, help="notebook numbers or names")
    common(a)
    f = sub.add_parser("refresh", help="re-execute notebooks and refresh the committed .ipynb outputs")
    f.add_argument("sources", nargs="*", metavar="notebooks", help="sources to refresh (default: all)")
    i = sub.add_parser("params", help="list a notebook's parameters with their explanations")
    i.add_argument("notebook")
    t = sub.add_parser("table", help="a recorded metric against a swept parameter: a table and a figure")
    t.add_argument("sweep", help="a sweep folder, e.g. runs/02_importance_sampling_and_mgs")
    t.add_argument("--metric", required=True, help="a recorded result key (a comparison gives its effect)")
    t.add_argument("--by", required=True, help="the swept parameter on the x axis")
    t.add_argument("--over", default="seed", help="the replicate parameter averaged over (default: seed)")
    t.add_argument("--no-figure", action="store_true", help="the table only")
    c = sub.add_parser("record", help="commit a finished run of a parameter set as the notebook's record "
                                      "(data/records/<notebook>/<set>), after checking its parameters and comparisons")
    c.add_argument("run_dir", help="the run's folder, e.g. runs/04_sequence_task_losses/full")
    c.add_argument("--set", dest="record_set", default="full", help="the parameter set it ran (default: full)")
    return ap


def set_parameters(notebook: Path, set_name: str) -> dict:
    """Every parameter of ``notebook`` as a run of the named set gets them (defaults, then
    ``params/<notebook>/<set_name>.yaml``), without ``output_dir`` — what a record of that set must have run."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (spec,) = plan_runs(notebook, Path(tmp), param_set=_param_set(notebook, set_name), package="-")
    return {k: v for k, v in spec.parameters.items() if k != "output_dir"}


def _record(run_dir: Path, set_name: str, nb_dir: Path | None) -> int:
    import json

    from taskloss.results.records import save_record
    from taskloss.runner.store import canonical

    meta_path = run_dir / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no meta.json: pass the folder of a finished run")
    meta = json.loads(meta_path.read_text())
    expected = set_parameters(find_notebook(meta["notebook"], nb_dir), set_name)
    ran = {k: v for k, v in meta.get("parameters", {}).items() if k != "output_dir"}
    differ = sorted(k for k in set(expected) | set(ran) if canonical(expected.get(k)) != canonical(ran.get(k)))
    if differ:
        raise ParameterError(f"{run_dir} did not run the set {set_name!r} as it stands: "
                             + ", ".join(f"{k} ran {ran.get(k)!r}, the set has {expected.get(k)!r}" for k in differ)
                             + f"; rerun it with --set {set_name}")
    dest = save_record(run_dir, set_name)
    print(f"recorded {meta['notebook']} ({set_name}) in {dest}: commit it with the notebook that reads it")
    return 0


def _param_set(notebook: Path, param_set: str | None) -> tuple[str, Path] | None:
    """``(name, params/<notebook>/<name>.yaml)`` of a named set (``--set``), looked up beside the notebooks'
    folder (a clone's ``params/``), or ``None`` when no set is named."""
    if param_set is None:
        return None
    if not param_set or "/" in param_set or param_set.startswith("."):
        raise ParameterError(f"--set expects a set's name such as smoke or full, got {param_set!r}")
    path = notebook.resolve().parent.parent / "params" / notebook.stem / f"{param_set}.yaml"
    if not path.exists():
        sets = sorted(p.stem for p in path.parent.glob("*.yaml")) if path.parent.exists() else []
        raise ParameterError(f"{notebook.stem} has no parameter set {param_set!r} ({path}); its sets: "
                             f"{', '.join(sets) or 'none'}")
    return param_set, path


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        nb_dir = None
        if args.notebooks is not None:
            nb_dir = Path(args.notebooks).expanduser()
            if not list_notebooks(nb_dir):
                raise ParameterError(f"--notebooks {args.notebooks}: no NN_topic.py notebooks in {nb_dir.resolve()}")
        if args.cmd == "params":
            print(describe_parameters(find_notebook(args.notebook, nb_dir)))
            return 0
        if args.cmd == "table":
            from taskloss.runner.tabulate import tabulate_sweep

            print(tabulate_sweep(Path(args.sweep), args.metric, args.by, args.over, figure=not args.no_figure))
            return 0
        if args.cmd == "record":
            return _record(Path(args.run_dir), args.record_set, nb_dir)
        if args.cmd == "refresh":
            todo = [Path(p) for p in args.sources] or list_notebooks(nb_dir)
            if not todo:
                raise ParameterError("refresh: no notebooks found; pass their paths or --notebooks DIR")
            return 1 if refresh(todo) else 0
        if args.jobs < 1:
            raise ParameterError(f"--jobs must be >= 1, got {args.jobs}")
        if args.threads is not None and args.threads < 1:
            raise ParameterError(f"--threads must be >= 1, got {args.threads}")
        if args.timeout is not None and not (0 < args.timeout):  # also refuses nan
            raise ParameterError(f"--timeout must be a positive number of seconds, got {args.timeout:g} "
                                 "(leave it out for no limit)")
        if args.out is None:
            home = (nb_dir.resolve() if nb_dir else default_notebook_dir() or Path.cwd() / "notebooks").parent
            out = home / "runs" / ("default" if args.cmd == "all" else "")
        else:
            out = Path(args.out)
        if args.cmd == "run":
            notebook = find_notebook(args.notebook, nb_dir)
            specs = plan_runs(notebook, out, param_files=args.params_file, cli=args.param, grid=args.grid,
                              param_set=_param_set(notebook, args.param_set))
            sweep = out / notebook.stem
        else:
            specs, sweep = [], out
            every = list_notebooks(nb_dir)
            if not every:
                raise ParameterError(f"all: no notebooks found in {', '.join(map(str, notebook_dirs()))}; run from "
                                     "a clone or pass --notebooks DIR")
            for n in args.only or [p.stem for p in every]:  # validate everything before executing
                nb = find_notebook(n, nb_dir)
                specs += plan_runs(nb, out, param_files=args.params_file, cli=args.param, nested=False,
                                   param_set=_param_set(nb, args.param_set))
        if not args.force:
            check_no_clobber(specs)
        cluster = _cluster_params(args.cluster_param)
        check_writable(sweep)
    except (ParameterError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        hint = " (choose a writable --out)" if args.cmd in ("run", "all") else ""
        print(f"error: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 2
    result = None
    try:
        result = run_many(specs, jobs=args.jobs, force=args.force, timeout=args.timeout, executor=args.executor,
                          cluster_params=cluster, threads=args.threads)
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        pass
    except ParameterError as exc:  # the executor refused the sweep before running anything
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        write_summary(sweep, title="Summary" if args.cmd == "all" else f"Summary of {sweep.name}")
        print(terminal_table(summary_rows(sweep)))
        print(f"summary (parameters, claims, headline values, each difference): {sweep / SUMMARY_FILE}")
    except OSError as exc:      # a full disk or a folder that became unwritable: say so, keep the exit status
        print(f"error: could not write {sweep / SUMMARY_FILE}: {exc.strerror or exc}; the runs' own folders hold "
              "what finished (meta.json, results.json)", file=sys.stderr)
        if result is not None and not result.interrupted:
            return 1
    if result is None or result.interrupted:
        print("interrupted: queued runs cancelled, running kernels stopped; rerun the command to resume",
              file=sys.stderr)
        if argv is None:  # the command line: end now even if a worker thread is stuck on a dying kernel
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130
    failed = [m for m in result.metas if m.get("status") != "ok"]
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(m['notebook'] for m in failed)}", file=sys.stderr)
        return 1
    return 0
