"""What a notebook imports to report its results: the run record (:func:`start`, :class:`Run`), paired
comparisons with their verdicts, the plotting helpers, and the check of fresh headline results against the
committed notebook. Every notebook uses it; :mod:`taskloss.runner` (which executes notebooks) reads what it writes.

Modules:

- :mod:`~taskloss.results.run`        — recording results and figures of a notebook run
- :mod:`~taskloss.results.compare`    — paired comparisons: estimand, effect, interval, p-value, MDE, verdict
- :mod:`~taskloss.results.procedures` — the tests behind them (exact sign test, t) and their power
- :mod:`~taskloss.results.plotting`   — seed bands, bars with intervals, labelled axes
- :mod:`~taskloss.results.headlines`  — committed headline results and their check in ``make test``
"""
from __future__ import annotations

import importlib

# Public name -> the module that defines it. Imported on first use (PEP 562), so that the runner can read a
# constant of this package without importing torch.
_WHERE = {"Run": "run", "start": "run", "RESULTS_FILE": "run", "Comparison": "compare",
          "paired_comparison": "compare", "comparison_table": "compare", "VERDICTS": "compare",
          "ESTIMANDS": "compare", "minimum_detectable_effect": "procedures"}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'taskloss.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"taskloss.results.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
