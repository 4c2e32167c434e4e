"""The notebook runner: parameter validation, execution, sweeps, resume after interruption, summaries."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskloss.runner import runs
from taskloss.runner.params import (
    Parameter,
    ParameterError,
    coerce,
    expand_grid,
    notebook_parameters,
    validate_overrides,
)

TINY = '''# %% [markdown]
# # tiny

# %% tags=["parameters"]
seed: int = 0
sleep: float = 0.0
fail: bool = False
scale: float = 1.0
label: str = "x"
values: list[float] = [1.0, 2.0]
log_path: str = ""
output_dir: str = ""

# %%
import time
import taskloss.runner.notebook as tn
run = tn.start("tiny", output_dir, device="cpu", seed=seed)
if log_path:
    with open(log_path, "a") as f:
        f.write(f"{seed},{sleep}\\n")
time.sleep(sleep)
assert not fail, "asked to fail"
run.record("score", seed * scale + sum(values), headline=True)
run.record("label", label)
'''


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "nb" / "00_tiny.py"
    path.parent.mkdir()
    path.write_text(TINY)
    return path


def test_parameters_are_read_with_types_and_defaults(tiny):
    params = notebook_parameters(tiny)
    assert list(params) == ["seed", "sleep", "fail", "scale", "label", "values", "log_path", "output_dir"]
    assert params["seed"] == Parameter("seed", "int", 0)
    assert params["values"].type_name == "list[float]" and params["values"].default == [1.0, 2.0]


def test_coercion_accepts_compatible_and_rejects_wrong_types(tiny):
    p = notebook_parameters(tiny)
    assert coerce(p["scale"], 2) == 2.0 and isinstance(coerce(p["scale"], 2), float)
    assert coerce(p["seed"], 3.0) == 3
    assert coerce(p["values"], [1, 2]) == [1.0, 2.0]
    assert coerce(p["label"], 12) == "12"
    for name, bad in [("seed", "abc"), ("seed", 1.5), ("fail", 1), ("scale", "fast"), ("values", 3), ("seed", True)]:
        with pytest.raises(ParameterError, match=name):
            coerce(p[name], bad)


def test_unknown_parameter_fails_with_the_valid_names(tiny):
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['stesp'\].*'seed'"):
        validate_overrides(notebook_parameters(tiny), {"stesp": 3})


def test_bad_parameters_fail_before_anything_executes(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert runs.main(["run", str(tiny), "-p", "seed", "abc", "--out", str(out)]) == 2
    assert "parameter 'seed' expects int" in capsys.readouterr().err
    assert runs.main(["run", str(tiny), "-p", "nope", "1", "--out", str(out)]) == 2
    assert runs.main(["run", str(tiny), "--grid", "seed=0,x", "--out", str(out)]) == 2
    assert runs.main(["run", str(tiny), "-p", "output_dir", "/tmp", "--out", str(out)]) == 2
    assert not out.exists()


def test_yaml_then_cli_precedence_and_grid_expansion(tiny, tmp_path):
    yaml_file = tmp_path / "full.yaml"
    yaml_file.write_text("seed: 5\nscale: 0.5\n")
    specs = runs.plan_runs(tiny, tmp_path / "o", param_files=[str(yaml_file)], cli=[("scale", "2")],
                           grid=["seed=0,1", "label=a,b"])
    assert [s.overrides for s in specs] == [
        {"seed": 0, "scale": 2.0, "label": "a"}, {"seed": 0, "scale": 2.0, "label": "b"},
        {"seed": 1, "scale": 2.0, "label": "a"}, {"seed": 1, "scale": 2.0, "label": "b"}]
    assert len({s.out_dir for s in specs}) == 4
    assert specs[0].parameters["values"] == [1.0, 2.0] and specs[0].parameters["seed"] == 0
    assert expand_grid({}) == [{}]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("nested:\n  a: 1\n")
    with pytest.raises(ParameterError, match="flat mapping"):
        runs.plan_runs(tiny, tmp_path / "o", param_files=[str(bad_yaml)])


@pytest.mark.slow
def test_single_run_writes_results_meta_and_executed_notebook(tiny, tmp_path):
    out = tmp_path / "out"
    assert runs.main(["run", str(tiny), "-p", "seed", "2", "-p", "values", "[3, 4]", "--out", str(out)]) == 0
    folder = out / "00_tiny" / "seed=2__values=3.0,4.0"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["parameters"]["seed"] == 2 and meta["overrides"]["values"] == [3.0, 4.0]
    assert meta["packages"]["torch"] and "commit" in meta["git"] and meta["seconds"] > 0
    results = json.loads((folder / "results.json").read_text())
    assert results["results"]["score"] == 2 * 1.0 + 7.0 and results["headline"] == ["score"]
    executed = json.loads((folder / "00_tiny.ipynb").read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in executed["cells"])
    assert not list(folder.glob(".*partial*"))
    assert "seed=2" in (out / "00_tiny" / "SUMMARY.md").read_text()


@pytest.mark.slow
def test_failures_are_reported_without_losing_other_results(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    rc = runs.main(["run", str(tiny), "--grid", "fail=false,true", "--jobs", "2", "--out", str(out)])
    assert rc == 1
    ok = json.loads((out / "00_tiny" / "fail=False" / "meta.json").read_text())
    bad = json.loads((out / "00_tiny" / "fail=True" / "meta.json").read_text())
    assert ok["status"] == "ok" and bad["status"] == "failed" and "asked to fail" in bad["error"]
    summary = (out / "00_tiny" / "SUMMARY.md").read_text()
    assert "1 of 2 runs succeeded" in summary and "**failed**" in summary
    assert "FAILED" in capsys.readouterr().err


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_redoing_finished_runs(tiny, tmp_path):
    out, log = tmp_path / "out", tmp_path / "executions.log"
    cmd = [sys.executable, "-m", "taskloss.runner", "run", str(tiny), "--grid", "sleep=0,6", "-p", "log_path",
           str(log), "--out", str(out)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not log.exists() or len(log.read_text().splitlines()) < 2:
        assert time.time() < deadline, "sweep did not start its second run in time"
        assert proc.poll() is None, "sweep ended before it could be interrupted"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # interrupt midway through the second (sleeping) run
    proc.wait()
    first, second = (next((out / "00_tiny").glob(f"*sleep={v}")) for v in ("0.0", "6.0"))
    assert runs.is_finished(first)
    assert not runs.is_finished(second)
    started = json.loads((first / "meta.json").read_text())["started"]

    assert runs.main(cmd[3:]) == 0
    executions = log.read_text().splitlines()
    assert executions.count("0,0.0") == 1  # the finished run was skipped
    assert executions.count("0,6.0") == 2  # the interrupted one was redone
    assert json.loads((first / "meta.json").read_text())["started"] == started
    assert runs.is_finished(second)


@pytest.mark.slow
def test_finished_run_is_redone_when_parameters_or_commit_differ(tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    spec, = runs.plan_runs(tiny, out)
    runs.run_many([spec], progress=False)
    assert runs.is_finished(spec.out_dir, spec)
    other, = runs.plan_runs(tiny, out, cli=[("scale", "3")], nested=False)
    other.out_dir = spec.out_dir
    assert not runs.is_finished(spec.out_dir, other)  # same folder, other parameters
    monkeypatch.setattr(runs, "_git_commit", lambda: {"commit": "0" * 40, "dirty": False})
    assert not runs.is_finished(spec.out_dir, spec)  # made by another commit


def test_find_notebook_and_list(tmp_path):
    (tmp_path / "01_alpha.py").write_text("")
    (tmp_path / "02_beta.py").write_text("")
    assert [p.name for p in runs.list_notebooks(tmp_path)] == ["01_alpha.py", "02_beta.py"]
    assert runs.find_notebook("02", tmp_path).name == "02_beta.py"
    assert runs.find_notebook("01_alpha", tmp_path).name == "01_alpha.py"
    with pytest.raises(ParameterError, match="no unique notebook"):
        runs.find_notebook("03", tmp_path)
