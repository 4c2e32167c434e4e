"""Running the notebooks: the results API every notebook records through (:func:`start`), reading and
validating a notebook's ``parameters`` cell, and the rerun / sweep runner behind ``make run`` and
``python -m taskloss.runner`` (also installed as ``taskloss-runs``).

Modules:

- :mod:`~taskloss.runner.notebook`       — recording results and figures of a notebook run
- :mod:`~taskloss.runner.compare`        — paired comparisons: effect, interval, p-value, verdict
- :mod:`~taskloss.runner.plotting`       — seed bands, bars with intervals, labelled axes
- :mod:`~taskloss.runner.params`         — reading and validating a notebook's parameters cell
- :mod:`~taskloss.runner.store`          — run folders: names, keys, locks, meta.json, SUMMARY.md
- :mod:`~taskloss.runner.kernel`         — executing a notebook in a kernel (environment, progress, cancel)
- :mod:`~taskloss.runner.runs`           — planning and sweeping (here or on SLURM via submitit)
- :mod:`~taskloss.runner.refresh`        — ``make notebooks``: re-executing the committed notebooks
- :mod:`~taskloss.runner.cli`            — the command line ``python -m taskloss.runner``
"""
from taskloss.runner.compare import VERDICTS, Comparison, comparison_table, paired_comparison
from taskloss.runner.notebook import RESULTS_FILE, Run, start

__all__ = ["Run", "start", "RESULTS_FILE", "Comparison", "paired_comparison", "comparison_table", "VERDICTS"]
