"""The notebook runner with real kernels: parameters, execution, failures, resume, stale results, progress."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskloss.runner import execution, runs, store
from taskloss.runner.cli import main
from taskloss.runner.params import (
    Parameter,
    ParameterError,
    coerce,
    expand_grid,
    notebook_parameters,
    validate_overrides,
)

NOISE = ("KeyboardInterrupt caught in kernel", "TCP", "Traceback", "WARNING")


def _executions(log: Path) -> list[str]:
    return [",".join(ln.split(",")[:2]) for ln in log.read_text().splitlines()] if log.exists() else []


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
    for name, bad in [("seed", "abc"), ("seed", 1.5), ("fail", 1), ("scale", "fast"), ("values", 3), ("seed", True),
                      ("label", None), ("label", False)]:
        with pytest.raises(ParameterError, match=name):
            coerce(p[name], bad)


def test_unknown_parameter_fails_with_the_valid_names(tiny):
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['stesp'\].*'seed'"):
        validate_overrides(notebook_parameters(tiny), {"stesp": 3})


def test_bad_parameters_fail_before_anything_executes(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(tiny), "-p", "seed", "abc", "--out", str(out)]) == 2
    assert "parameter 'seed' expects int" in capsys.readouterr().err
    assert main(["run", str(tiny), "-p", "nope", "1", "--out", str(out)]) == 2
    assert main(["run", str(tiny), "--grid", "seed=0,x", "--out", str(out)]) == 2
    assert main(["run", str(tiny), "-p", "output_dir", "/tmp", "--out", str(out)]) == 2
    assert main(["run", str(tiny), "--jobs", "0", "--out", str(out)]) == 2
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
def test_sweep_writes_results_reports_failures_and_prints_no_kernel_noise(tiny, tmp_path):
    """One parallel sweep through the real command: a run that records through taskloss.results.start, a run that
    fails; the failing cell and exception land in meta.json and SUMMARY.md; the terminal shows no kernel logs."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "taskloss.runner", "run", str(tiny), "-p", "seed", "2", "-p", "values", "[3, 4]",
           "--grid", "fail=false,true", "--jobs", "2", "--out", str(out)]
    # the bound only catches a hang: kernels start slowly on a loaded CI machine
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, umask=0o022)
    assert r.returncode == 1, r.stderr
    for noise in NOISE:
        assert noise not in r.stdout + r.stderr, noise
    ok_dir = out / "00_tiny" / "fail=False__seed=2__values=3.0,4.0"      # every value readable, no hash needed
    bad_dir, = (out / "00_tiny").glob("fail=True__*")
    meta = json.loads((ok_dir / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["parameters"]["seed"] == 2 and meta["overrides"]["values"] == [3.0, 4.0]
    assert meta["packages"]["torch"] and "commit" in meta["git"] and meta["seconds"] > 0
    assert set(meta["key"]) == {"run", "parameters", "notebook", "package", "data"}
    results = json.loads((ok_dir / "results.json").read_text())
    assert results["results"]["score"] == 2 * 1.0 + 7.0 and results["headline"] == ["score"]
    # the kernel's numerics fingerprint (one thread: two jobs share the two cores) and its CPU time
    assert meta["fingerprint"] == results["fingerprint"] and meta["fingerprint"]["threads"] == 1
    assert meta["fingerprint"]["cpu_capability"] and meta["cpu_seconds"] > 0
    executed = json.loads((ok_dir / "00_tiny.ipynb").read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in executed["cells"])
    assert not list(ok_dir.glob(".*partial*"))
    assert (ok_dir / "kernel.log").exists()  # the kernel's own log lines are kept there, off the terminal
    bad = json.loads((bad_dir / "meta.json").read_text())
    assert bad["status"] == "failed"
    assert bad["error"].startswith("In [") and bad["error"].endswith("AssertionError: asked to fail")
    assert "import time" in bad["error"]  # the failing cell's first line
    for path in (ok_dir / "meta.json", ok_dir / "results.json", ok_dir / "00_tiny.ipynb", out / "00_tiny" / "SUMMARY.md"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path  # readable like the figures
    summary = (out / "00_tiny" / "SUMMARY.md").read_text()
    assert "1 of 2 runs succeeded" in summary and "**failed**: In [" in summary and "asked to fail" in summary
    assert "score = 9" in summary
    assert "failed" in r.stdout + r.stderr and "asked to fail" in r.stdout + r.stderr


@pytest.mark.slow
def test_interrupted_sweep_resumes_and_source_edits_make_results_stale(bare, tmp_path):
    out, log = tmp_path / "out", tmp_path / "executions.log"
    cmd = [sys.executable, "-m", "taskloss.runner", "run", str(bare), "--grid", "sleep=0,600", "-p", "log_path",
           str(log), "--out", str(out)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # kernels start slowly on a loaded machine; the bound only catches a hang
    while len(_executions(log)) < 2:
        assert time.time() < deadline, "sweep did not start its second run in time"
        assert proc.poll() is None, "sweep ended before it could be interrupted"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # a crash midway through the second (sleeping) run
    proc.wait()
    first, second = (out / "00_bare" / store.folder_name({"log_path": str(log), "sleep": v}, first=["sleep"])
                     for v in (0.0, 600.0))
    assert store.is_finished(first) and not store.is_finished(second)
    started = json.loads((first / "meta.json").read_text())["started"]

    cmd[cmd.index("sleep=0,600")] = "sleep=0,0.5"  # finish the sweep quickly: the 600 s run becomes a 0.5 s one
    assert main(cmd[3:]) == 0
    assert _executions(log).count("0,0.0") == 1  # the finished run was skipped
    assert json.loads((first / "meta.json").read_text())["started"] == started

    bare.write_text(bare.read_text() + "\n# %%\nprint('an uncommitted edit')\n")
    assert main(cmd[3:]) == 0
    assert _executions(log).count("0,0.0") == 2  # an edited notebook makes the finished run stale
    summary = (out / "00_bare" / "SUMMARY.md").read_text()
    # sleep=0 and sleep=0.5 finished; the killed sleep=600 run left an incomplete folder, listed as such
    assert "2 of 3 runs succeeded" in summary and "**incomplete**" in summary
    assert "score = 0.5" in summary


@pytest.mark.slow
def test_per_cell_progress_and_kernel_environment(bare, tmp_path, monkeypatch):
    monkeypatch.setenv("TASKLOSS_CHECK_HEADLINES", "1")  # a test-suite variable: never passed on to run kernels
    spec, = runs.plan_runs(bare, tmp_path, cli=[("log_path", str(tmp_path / "log"))])
    calls = []
    environ = dict(os.environ)
    meta = execution.execute(spec, threads=1, on_cell=lambda done, total: calls.append((done, total)))
    assert meta["status"] == "ok", meta
    assert calls == [(i, 5) for i in range(1, 6)]  # four code cells + the injected parameters cell
    assert dict(os.environ) == environ  # the runner wrote nothing into its own environment
    from taskloss.runner.kernel import kernel_env
    env = kernel_env(threads=3)
    assert env["OMP_NUM_THREADS"] == "3" and env["MPLBACKEND"].endswith("backend_inline")
    assert "TASKLOSS_CHECK_HEADLINES" not in env


def test_find_notebook_and_list(tmp_path):
    (tmp_path / "01_alpha.py").write_text("")
    (tmp_path / "02_beta.py").write_text("")
    assert [p.name for p in runs.list_notebooks(tmp_path)] == ["01_alpha.py", "02_beta.py"]
    assert runs.find_notebook("02", tmp_path).name == "02_beta.py"
    assert runs.find_notebook("01_alpha", tmp_path).name == "01_alpha.py"
    with pytest.raises(ParameterError, match="no unique notebook"):
        runs.find_notebook("03", tmp_path)


def test_progress_widgets_get_their_final_text():
    import nbformat

    from taskloss.runner.kernel import progress_text_fallbacks

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("bar")])
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "sweep:   0%|          | 0/4 [00:00<?, ?it/s]",
        "application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2, "version_minor": 0}})]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
        "l": {"model_name": "HTMLModel", "state": {"value": "sweep:\u2007100%"}},
        "p": {"model_name": "FloatProgressModel", "state": {"value": 4.0, "max": 4.0}},
        "r": {"model_name": "HTMLModel", "state": {"value": "\u20074/4\u2007[00:01&lt;00:00]"}}}}}
    assert progress_text_fallbacks(nb) == 1
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "sweep: 100%|██████████| 4/4 [00:01<00:00]"


@pytest.mark.slow
def test_refresh_stores_headlines_fingerprint_and_runtime(tiny, tmp_path):
    """``make notebooks`` (refresh) writes the executed notebook beside its source with the headline results, the
    fingerprint of the kernel that computed them and the measured runtime in its metadata."""
    from taskloss.runner.refresh import refresh

    assert refresh([tiny], out=tmp_path / "runs", progress=False) == 0
    meta = json.loads(tiny.with_suffix(".ipynb").read_text())["metadata"]["taskloss"]
    assert meta["headline"] == {"score": 3.0}
    assert meta["fingerprint"]["cpu_capability"] and meta["fingerprint"]["device"] == "cpu"
    assert meta["runtime"]["wall_s"] > 0 and meta["runtime"]["cpu_s"] > 0
    assert meta["runtime"]["threads"] == meta["fingerprint"]["threads"]
    run_meta = json.loads((tmp_path / "runs" / "00_tiny" / "meta.json").read_text())
    assert run_meta["fingerprint"] == meta["fingerprint"]


@pytest.mark.slow
def test_a_cell_timeout_names_the_cell_and_the_limit(bare, tmp_path):
    from taskloss.runner.cli import main

    out = tmp_path / "out"
    assert main(["run", str(bare), "-p", "sleep", "30", "--timeout", "2", "--out", str(out)]) == 1
    meta = json.loads(next((out / "00_bare").glob("sleep=*/meta.json")).read_text())
    assert meta["status"] == "failed"
    assert meta["error"].startswith("In [") and "longer than 2 s (--timeout)" in meta["error"]
    assert "-------" not in meta["error"]
