"""``make notebooks``: re-execute the notebooks from their ``.py`` sources and rewrite the committed ``.ipynb``
with fresh outputs, the headline results in its metadata and progress bars readable without widgets."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from taskloss.results.run import RESULTS_FILE
from taskloss.runner.execution import environment_info
from taskloss.runner.kernel import KERNEL_LOG, execute_notebook, kernel_env, progress_text_fallbacks
from taskloss.runner.params import notebook_parameters, read_notebook
from taskloss.runner.runs import find_notebook
from taskloss.runner.store import (
    clear_run_folder,
    package_hash,
    recorded_fingerprint,
    run_key,
    run_lock,
    write_meta,
    write_summary,
)
from taskloss.utils import RUNS_DIR

__all__ = ["refresh"]

def refresh(paths: list[Path], *, timeout: float = 1800, out: Path = RUNS_DIR / "notebooks",
            progress: bool = True) -> int:
    """Re-execute notebooks from their ``.py`` source and rewrite the paired ``.ipynb`` with fresh outputs.

    Each notebook runs with its default parameters (nothing injected), its results going to ``out/<notebook>/``
    (a default run with ``meta.json``, summarized in ``out/SUMMARY.md``). The headline results are stored in the
    ``.ipynb`` metadata (``metadata["taskloss"]["headline"]``), which ``make test`` compares with a fresh run. A failing
    notebook is reported and its ``.ipynb`` left as it was. Returns the number of failures.
    """
    import jupytext
    from tqdm.auto import tqdm

    failures, package = 0, package_hash()
    for py in paths:
        py = find_notebook(str(py))
        folder = out / py.stem
        source = py.read_text(encoding="utf-8")      # read once: hashed into the key and executed
        nb = read_notebook(py, source)
        params = notebook_parameters(nb)
        print(f"executing {py.name} …", flush=True)
        bar = tqdm(desc=py.stem[:40], unit="cell", leave=False, disable=None if progress else True)

        def on_cell(done: int, total: int, bar=bar) -> None:
            bar.total = total
            bar.update(done - bar.n)
        with run_lock(folder):
            clear_run_folder(folder)
            t0 = time.perf_counter()
            res = execute_notebook(nb, cwd=py.parent, env=kernel_env(extra={"TASKLOSS_OUTPUT_DIR": str(folder)}),
                                   timeout=timeout, log_path=folder / KERNEL_LOG, on_cell=on_cell)
            bar.close()
            seconds = round(time.perf_counter() - t0, 2)
            resolved = {k: p.default for k, p in params.items()}
            write_meta(folder, {"notebook": py.stem, "source": str(py), "overrides": {}, "parameters": resolved,
                                "key": run_key(resolved, py, package, source=source), **res, "seconds": seconds,
                                "fingerprint": recorded_fingerprint(folder), **environment_info()})
        if res["status"] != "ok":
            failures += 1
            print(f"  FAILED {py.name}: {res.get('error')}", file=sys.stderr, flush=True)
            continue
        recorded = json.loads((folder / RESULTS_FILE).read_text())
        fingerprint = recorded.get("fingerprint")
        nb.metadata["taskloss"] = {
            "headline": {k: recorded["results"][k] for k in recorded.get("headline", [])},
            "fingerprint": fingerprint,
            "claims": recorded.get("claims") or {},
            "adjusted": recorded.get("adjusted") or {},
            "runtime": {"wall_s": seconds, "cpu_s": res.get("cpu_seconds"),
                        "threads": (fingerprint or {}).get("threads")},
        }
        progress_text_fallbacks(nb)
        for cell in nb.cells:  # volatile timing metadata would make every refresh a diff
            cell.metadata.pop("execution", None)
            if not cell.metadata.get("tags", True):
                cell.metadata.pop("tags")
        jupytext.write(nb, py.with_suffix(".ipynb"))
        # The .py stays the newer file of the pair: Jupytext (JupyterLab, `make lab`) refuses to open a .py whose
        # paired .ipynb is more recent, even when only their header metadata differ.
        os.utime(py)
        print(f"  wrote {py.with_suffix('.ipynb').name} in {seconds:.1f} s", flush=True)
    if out.exists():
        write_summary(out, title="Default runs (make notebooks)")
    return failures
