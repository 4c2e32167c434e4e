"""Parameters: YAML 1.2 values, str parameters taken as written, YAML errors with the file name, declared bounds,
help comments."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from taskloss.runner import runs
from taskloss.runner.cli import describe_parameters, main
from taskloss.utils import REPO_ROOT
from taskloss.runner.params import (
    ParameterError,
    check_constraints,
    load_yaml_params,
    notebook_parameters,
    parse_cli_value,
)

CELL = '''# %% tags=["parameters"]
seed: int = 0                 # random seed
steps: int = 10               # [> 0] optimizer steps
lr: float = 0.1               # [> 0, <= 1] learning rate
widths: list[int] = [4, 8]    # [>= 1] hidden widths
label: str = "x"
output_dir: str = ""

# %%
print(steps)
'''


@pytest.fixture
def nb(tmp_path) -> Path:
    path = tmp_path / "00_params.py"
    path.write_text(CELL)
    return path


@pytest.mark.parametrize("text, value", [
    ("1e-4", 1e-4), ("-2.5E+3", -2500.0), (".5", 0.5), ("12", 12), ("012", 12), ("0x1f", 31), ("0o17", 15),
    ("true", True), ("False", False), ("no", "no"), ("yes", "yes"), ("on", "on"), ("null", None), ("~", None),
    ("[1, 2e-3]", [1, 0.002]), ("1_000", "1_000"), (".inf", float("inf")),
])
def test_cli_values_follow_yaml_1_2(text, value):
    assert parse_cli_value(text) == value and type(parse_cli_value(text)) is type(value)


def test_lr_1e_4_on_the_command_line_is_a_float(nb, tmp_path):
    spec, = runs.plan_runs(nb, tmp_path, cli=[("lr", "1e-4")])
    assert spec.parameters["lr"] == 1e-4


def test_str_parameters_take_null_and_no_as_written(nb, tmp_path):
    params = notebook_parameters(nb)
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text("label: null\n")
    assert load_yaml_params(yaml_file, params) == {"label": "null"}
    yaml_file.write_text("label: no\nlr: 1e-3\n")
    assert load_yaml_params(yaml_file, params) == {"label": "no", "lr": 1e-3}
    yaml_file.write_text("label: 1e-4\n")
    assert load_yaml_params(yaml_file, params) == {"label": "1e-4"}
    for value in ("null", "no", "None", "False", "~"):
        spec, = runs.plan_runs(nb, tmp_path, cli=[("label", value)])
        assert spec.parameters["label"] == value
    spec, = runs.plan_runs(nb, tmp_path, grid=["label=null,no"])[:1]
    assert spec.parameters["label"] == "null"
    with pytest.raises(ParameterError, match="label.*quote"):  # without the notebook's types: refused, not "None"
        runs.validate_overrides(params, {"label": None})


def test_yaml_syntax_errors_name_the_file_and_line(nb, tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("seed: 1\nlr: [0.1\nsteps: 3\n")
    with pytest.raises(ParameterError, match=r"broken\.yaml:.*line \d+.*not valid YAML"):
        load_yaml_params(bad)
    assert main(["run", str(nb), "-f", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and "Traceback" not in err
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ParameterError, match="flat mapping"):
        load_yaml_params(tmp_path / "list.yaml")
    (tmp_path / "latin.yaml").write_bytes("label: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ParameterError, match="latin.yaml: not UTF-8"):
        load_yaml_params(tmp_path / "latin.yaml")


def test_declared_bounds_are_checked_before_any_kernel(nb, tmp_path, capsys):
    params = notebook_parameters(nb)
    assert params["steps"].bounds == ((">", 0.0),) and params["lr"].bounds == ((">", 0.0), ("<=", 1.0))
    for name, value in [("steps", 0), ("steps", -3), ("lr", 0.0), ("lr", 2.0), ("lr", float("nan")),
                        ("widths", [4, 0])]:
        with pytest.raises(ParameterError, match=name):
            check_constraints(params, {name: value})
    check_constraints(params, {"steps": 1, "lr": 1.0, "widths": [1], "seed": -1})
    out = tmp_path / "o"
    assert main(["run", str(nb), "-p", "steps", "0", "--out", str(out)]) == 2
    assert "parameter 'steps' must be > 0, got 0 ([> 0] optimizer steps)" in capsys.readouterr().err
    assert main(["run", str(nb), "--grid", "lr=0.5,-1", "--out", str(out)]) == 2
    assert not out.exists()


def test_an_unreadable_bound_is_reported(tmp_path):
    path = tmp_path / "00_bad.py"
    path.write_text('# %% tags=["parameters"]\nsteps: int = 3  # [> zero] steps\n')
    with pytest.raises(ParameterError, match="steps.*cannot read the bound"):
        notebook_parameters(path)


def test_params_command_shows_each_parameters_comment(nb, capsys):
    text = describe_parameters(nb)
    assert "steps: int = 10" in text and "# [> 0] optimizer steps" in text
    assert "seed: int = 0" in text and "# random seed" in text
    assert main(["params", str(nb)]) == 0
    assert "# [> 0, <= 1] learning rate" in capsys.readouterr().out


def test_cli_options_have_help_texts(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option, words in [("-p NAME VALUE", "set a parameter"), ("-f YAML", "flat YAML file"),
                          ("--grid NAME=V1,V2", "sweep a parameter"), ("--jobs N", "runs at once"),
                          ("--executor", "submitit")]:
        assert option in text and words in text, option


@pytest.mark.parametrize("py", sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_the_fast_parameters_reader_equals_jupytext(py):
    import jupytext

    from taskloss.runner.params import percent_cells_tagged

    text = py.read_text(encoding="utf-8")
    expected = [c.source for c in jupytext.reads(text, fmt="py:percent").cells
                if "parameters" in c.metadata.get("tags", [])]
    assert percent_cells_tagged(text, "parameters") == expected


def test_the_parameters_command_answers_without_the_notebook_stack():
    """`params` and `--help` import neither torch nor jupytext (seconds on a busy machine)."""
    code = ("import sys; from taskloss.runner.cli import main; main(['params', '01']); "
            "print('HEAVY', sorted(m for m in ('torch', 'jupytext', 'nbformat') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Parameters of 01_" in out and "HEAVY []" in out
