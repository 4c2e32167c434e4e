"""Papermill reads every notebook's parameters cell as the runner does (issue 40).

Papermill skips any parameter line holding more than one ``=`` ("Unable to parse line …") and then calls the
parameter unknown, so bounds are written ``[≥ 0]``/``[≤ 1]`` and help text says "is" rather than "=". These tests
read the jupytext ``.py`` sources (the source of truth; the paired ``.ipynb`` hold the same cell after ``make
sync``), write each as a temporary ``.ipynb`` and hand it to papermill's own ``inspect_notebook`` and
``--help-notebook``.
"""
from __future__ import annotations

import ast
import logging
import subprocess
import sys

import nbformat
import pytest

from taskloss.runner.params import notebook_parameters, read_notebook
from taskloss.runner.runs import list_notebooks
from taskloss.utils import REPO_ROOT

NOTEBOOKS = list_notebooks()


def _as_ipynb(source, tmp_path):
    path = tmp_path / f"{source.stem}.ipynb"
    nbformat.write(read_notebook(source), str(path))
    return path


def test_every_notebook_is_inspected():
    assert len(NOTEBOOKS) >= 17


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_papermill_reads_every_parameter_as_the_runner_does(source, tmp_path, caplog):
    from papermill import inspect_notebook

    with caplog.at_level(logging.WARNING, logger="papermill"):
        theirs = inspect_notebook(_as_ipynb(source, tmp_path))
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()], caplog.text
    ours = notebook_parameters(source)
    assert list(theirs) == list(ours), f"papermill misses {sorted(set(ours) - set(theirs))}"
    for name, p in ours.items():
        t = theirs[name]
        assert t["inferred_type_name"].replace(" ", "") == p.type_name, name
        assert ast.literal_eval(t["default"]) == p.default, name
        assert t["help"] == p.help, name


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_no_parameter_line_holds_a_second_equals_sign(source):
    from taskloss.runner.params import percent_cells_tagged

    (cell,) = percent_cells_tagged(source.read_text(encoding="utf-8"), "parameters")
    bad = [line for line in cell.splitlines() if line.count("=") > 1]
    assert not bad, f"{source.name}: papermill skips these lines (write bounds as ≥/≤): {bad}"


def test_help_notebook_lists_every_parameter(tmp_path):
    """``papermill --help-notebook`` on one notebook (a subprocess: papermill's command line as a user runs it)."""
    source = REPO_ROOT / "notebooks" / "06_natural_gradient.py"
    path = _as_ipynb(source, tmp_path)
    out = subprocess.run([sys.executable, "-m", "papermill", "--help-notebook", str(path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Unable to parse" not in out.stderr + out.stdout
    listed = {line.split(":")[0].strip(): line for line in out.stdout.splitlines() if " (default " in line}
    for name, p in notebook_parameters(source).items():
        assert name in listed, f"papermill --help-notebook does not list {name}"
        assert listed[name].startswith(f"  {name}: {p.type_name} (default "), listed[name]


def test_parameters_injected_by_papermill_are_known(tmp_path, caplog):
    """What ``papermill … -p seed 1 -p n_seeds 3`` does before executing: no "Passed unknown parameter"."""
    from papermill.inspection import _infer_parameters      # papermill.execute's own check, before it warns
    from papermill.parameterize import parameterize_notebook

    source = REPO_ROOT / "notebooks" / "12_implicit_gradient_regularization.py"
    nb = read_notebook(source)
    nb.metadata["papermill"] = {}
    with caplog.at_level(logging.WARNING, logger="papermill"):
        known = {p.name for p in _infer_parameters(nb, name="python3", language="python")}
        injected = parameterize_notebook(nb, {"seed": 1, "n_seeds": 3}, kernel_name="python3", language="python")
    assert {"seed", "n_seeds"} <= known
    assert "Unable to parse" not in caplog.text
    assert any("n_seeds = 3" in c.source for c in injected.cells if "injected-parameters" in c.metadata.get("tags", []))


def test_a_run_without_output_dir_gets_a_fresh_folder(tmp_path, monkeypatch):
    """papermill without ``-p output_dir`` (or Jupyter by hand): two runs, two folders, nothing overwritten."""
    import taskloss.results.run as tn

    monkeypatch.setattr(tn, "RUNS_DIR", tmp_path / "runs")
    monkeypatch.delenv("TASKLOSS_OUTPUT_DIR", raising=False)
    first = tn.start("00_x", "", device="cpu")
    second = tn.start("00_x", "", device="cpu")
    assert first.dir != second.dir
    assert first.dir.parent == second.dir.parent == tmp_path / "runs" / "interactive" / "00_x"
    assert (first.dir / "results.json").exists() and (second.dir / "results.json").exists()
    assert tn.start("00_x", str(tmp_path / "given"), device="cpu").dir == tmp_path / "given"


def test_the_bound_parser_reads_the_papermill_form_and_the_old_one():
    from taskloss.runner.params import _parse_bounds

    assert _parse_bounds("x", "[≥ 0, ≤ 1] a fraction") == (((">=", 0.0), ("<=", 1.0)), False)
    assert _parse_bounds("x", "[>= 0, <= 1] a fraction") == (((">=", 0.0), ("<=", 1.0)), False)
    assert _parse_bounds("x", "[> 0, inf] a limit") == (((">", 0.0),), True)
