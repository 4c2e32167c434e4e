"""Notebook conventions: pairs in sync, executed outputs committed, a valid parameters cell, valid params/ files.

The notebooks themselves are executed by nbval (``make test`` collects ``notebooks/*.ipynb``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import nbformat
import pytest

from taskloss.runner import runs
from taskloss.runner.params import notebook_parameters
from taskloss.utils import REPO_ROOT

SOURCES = runs.list_notebooks()
PARAM_FILES = sorted((REPO_ROOT / "params").glob("*/*.yaml"))


def _cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_there_are_notebooks():
    assert SOURCES, "notebooks/NN_topic.py sources are missing"


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_source_is_valid_python(py: Path):
    """The percent-format source must stay a runnable script (every markdown line commented)."""
    ast.parse(py.read_text(), filename=str(py))


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_pair_in_sync(py: Path):
    ipynb = py.with_suffix(".ipynb")
    assert ipynb.exists(), f"{py.name} has no paired {ipynb.name}: run `make notebooks`"
    text_nb, json_nb = jupytext.read(py), jupytext.read(ipynb)
    assert _cells(text_nb) == _cells(json_nb), (
        f"{py.name} and {ipynb.name} differ: run `make notebooks` (or `make sync`) after editing the .py")


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_executed_with_a_portable_kernel(py: Path):
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code), "commit the executed notebook (make notebooks)"
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs)
    assert any(o.get("data", {}).get("image/png") for c in code for o in c.outputs), "no figure in the outputs"


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_parameters_cell(py: Path):
    params = notebook_parameters(py)
    assert params["device"].default == "auto" and params["device"].type_name == "str"
    assert params["output_dir"].default == "" and params["seed"].type_name == "int"
    untyped = [p.name for p in params.values() if p.type_name == "any"]
    assert not untyped, f"parameters without a type: {untyped}"
    assert f'start("{py.stem}"' in py.read_text(), "the notebook must record through taskloss.runner.notebook.start"


@pytest.mark.parametrize("yaml_file", PARAM_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_param_files_name_real_parameters(yaml_file: Path, tmp_path):
    notebook = runs.find_notebook(yaml_file.parent.name)
    specs = runs.plan_runs(notebook, tmp_path, param_files=[str(yaml_file)])
    assert specs and specs[0].overrides, f"{yaml_file} sets nothing"
