"""Running the notebooks: reading and validating a notebook's ``parameters`` cell, executing it in a kernel, run
folders and their keys, and the rerun / sweep runner behind ``make run`` and ``python -m taskloss.runner`` (also
installed as ``taskloss-runs``). What a notebook itself imports to record its results is :mod:`taskloss.results`.

Modules:

- :mod:`~taskloss.runner.params`         — reading and validating a notebook's parameters cell
- :mod:`~taskloss.runner.store`          — run folders: names, keys, locks, meta.json, SUMMARY.md
- :mod:`~taskloss.runner.kernel`         — executing a notebook in a kernel (environment, progress, cancel)
- :mod:`~taskloss.runner.runs`           — planning and sweeping (here or on SLURM via submitit)
- :mod:`~taskloss.runner.execution`      — one run: its key taken when it starts, the kernel, meta.json
- :mod:`~taskloss.runner.report`         — did a default run reproduce the committed headlines; the end table
- :mod:`~taskloss.runner.tabulate`       — a sweep as a table and a figure (``table``)
- :mod:`~taskloss.runner.refresh`        — ``make notebooks``: re-executing the committed notebooks
- :mod:`~taskloss.runner.cli`            — the command line ``python -m taskloss.runner``
"""
__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":      # imported on use: ``import taskloss.runner.params`` stays light
        from taskloss.runner.cli import main

        return main
    raise AttributeError(f"module 'taskloss.runner' has no attribute {name!r}")
