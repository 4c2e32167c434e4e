"""Notebook conventions: pairs in sync (sources and tags), executed outputs committed and clean (no absolute
paths, no warnings on stderr), headline results recorded in the committed metadata, a valid parameters cell,
valid params/ files.

The notebooks themselves are executed by nbval (``make test`` collects ``notebooks/*.ipynb``), with
``TASKLOSS_CHECK_HEADLINES=1`` so each fresh headline result is compared with the committed one
(:mod:`taskloss.results.headlines`).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from taskloss.runner import runs
from taskloss.runner.params import check_constraints, notebook_parameters
from taskloss.utils import REPO_ROOT

SOURCES = runs.list_notebooks()
PARAM_FILES = sorted((REPO_ROOT / "params").glob("*/*.yaml"))


def _cells(nb):
    """Type, source and tags of every cell: a tag dropped from one side (``parameters``!) is a difference,
    because papermill silently ignores ``-p`` for a notebook without a ``parameters`` cell."""
    return [(c.cell_type, c.source.strip(), sorted(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


# Absolute paths of the machine that executed a notebook, e.g. a warning naming a virtualenv file.
ABSOLUTE_PATH = re.compile(r"/\.venv/|site-packages/|/work/|/home/|/root/|/Users/|[A-Z]:\\\\Users")
WARNING = re.compile(r"\b\w*Warning\b|^\s*warn", re.MULTILINE)


def output_problems(nb) -> list[str]:
    """Where a committed notebook's outputs leak an absolute path or show a warning on stderr."""
    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] if out.get("output_type") == "stream" else []
            texts += [v for k, v in out.get("data", {}).items() if k.startswith("text/")]
            texts += ["\n".join(out.get("traceback", []))]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else str(text)
                m = ABSOLUTE_PATH.search(text)
                if m:
                    problems.append(f"cell {i}: absolute path {text[max(0, m.start() - 40):m.end() + 40]!r}")
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                text = "".join(out.get("text", ""))
                if WARNING.search(text):
                    problems.append(f"cell {i}: warning on stderr {text.strip()[:120]!r}")
    return problems


def test_output_checks_catch_leaks():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output(
        "stream", name="stderr",
        text="/work/x/.venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found")]
    problems = output_problems(nb)
    assert len(problems) == 2 and "absolute path" in problems[0] and "warning on stderr" in problems[1]
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "see /home/me/data.csv"})]
    assert len(output_problems(nb)) == 1
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok 0.5 in runs/x.png\n")]
    assert output_problems(nb) == []


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
def test_committed_outputs_are_clean(py: Path):
    problems = output_problems(nbformat.read(py.with_suffix(".ipynb"), as_version=4))
    assert not problems, "refresh with `make notebooks` after fixing:\n" + "\n".join(problems)


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_records_its_headline_results(py: Path):
    """``make notebooks`` stores the headline results; ``make test`` compares a fresh run with them."""
    nb = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    headline = nb.metadata.get("taskloss", {}).get("headline")
    assert headline, f"{py.stem}.ipynb has no recorded headline results: refresh it with `make notebooks`"
    assert "headline=True" in py.read_text()


@pytest.mark.parametrize("py", SOURCES, ids=lambda p: p.stem)
def test_parameters_cell(py: Path):
    params = notebook_parameters(py)
    assert params["device"].default == "auto" and params["device"].type_name == "str"
    assert params["output_dir"].default == "" and params["seed"].type_name == "int"
    check_constraints(params, {p.name: p.default for p in params.values()})  # defaults meet declared bounds
    untyped = [p.name for p in params.values() if p.type_name == "any"]
    assert not untyped, f"parameters without a type: {untyped}"
    assert f'start("{py.stem}"' in py.read_text(), "the notebook must record through taskloss.results.run.start"


@pytest.mark.parametrize("yaml_file", PARAM_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_param_files_name_real_parameters(yaml_file: Path, tmp_path):
    notebook = runs.find_notebook(yaml_file.parent.name)
    specs = runs.plan_runs(notebook, tmp_path, param_files=[str(yaml_file)])
    assert specs and specs[0].overrides, f"{yaml_file} sets nothing"
