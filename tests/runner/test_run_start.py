"""Issue 42 item 3 and issue 40 items 3–4: the key is taken when a run starts, relative data paths, a positive
timeout, the default run reused, lists swept, failed runs in ``table``, set folders, threads, reproduction."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from taskloss.runner import execution, runs, store
from taskloss.runner.cli import main
from taskloss.runner.params import ParameterError
from taskloss.runner.report import TERMINAL_WIDTH, reproduction, terminal_table
from taskloss.runner.tabulate import tabulate_sweep

EDITS = '''# %% tags=["parameters"]
seed: int = 0
edit_path: str = ""
output_dir: str = ""

# %%
import json, pathlib
if edit_path:   # this run changes a "package" file: the next run of the sweep executes other package bytes
    with open(edit_path, "a") as f:
        f.write(f"# edited by seed {seed}\\n")
results = {"notebook": "edits", "headline": ["score"], "results": {"score": seed + 0.5}}
pathlib.Path(output_dir).joinpath("results.json").write_text(json.dumps(results))
assert seed != 7, "asked to fail"
'''


def _notebook(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "nb" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.slow
def test_a_package_edit_between_two_runs_of_a_sweep_is_keyed_by_what_ran(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    module = pkg / "m.py"
    module.write_text("x = 1\n")
    monkeypatch.setattr(execution, "package_hash", lambda: store.package_hash(pkg))
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    planned_hash = store.package_hash(pkg)
    specs = runs.plan_runs(nb, tmp_path / "out", cli=[("edit_path", str(module))], grid=["seed=0,1"],
                           package=planned_hash)
    assert {s.key["package"] for s in specs} == {planned_hash}           # planned: one package for both
    result = runs.run_many(specs, jobs=1, progress=False, threads=1)
    first, second = result.metas
    assert first["status"] == second["status"] == "ok"
    assert first["key"]["package"] == planned_hash and "changed_since_planned" not in first
    assert module.read_text().count("edited") == 2
    replay = tmp_path / "replay"        # the package as the first run left it: what the second run started with
    replay.mkdir()
    (replay / "m.py").write_text("x = 1\n# edited by seed 0\n")
    after_first = store.package_hash(replay)
    # the second run started after the first had edited m.py: its key holds the bytes it really executed
    assert second["key"]["package"] != planned_hash
    assert second["changed_since_planned"] == ["package"]
    assert second["key"]["package"] == after_first      # what the package was when it started (before its own edit)
    assert second["threads"] == first["threads"] == 1
    # re-planned now, the first run is stale (the package changed since it ran) and the second is too
    again = runs.plan_runs(nb, tmp_path / "out", cli=[("edit_path", str(module))], grid=["seed=0,1"],
                           package=store.package_hash(pkg))
    assert not any(store.is_finished(s.out_dir, s.key["run"]) for s in again)


def test_relative_data_paths_resolve_from_the_folder_the_command_runs_in(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    data = tmp_path / "work" / "corpus.txt"
    data.write_text("one")
    tagged = tmp_path / "nb" / "00_data.py"
    tagged.parent.mkdir()
    tagged.write_text('# %% tags=["parameters"]\ncorpus_path: str = ""   # [data] a text file to read\n'
                      'output_dir: str = ""\n')
    monkeypatch.chdir(tmp_path / "work")
    spec, = runs.plan_runs(tagged, tmp_path / "out", cli=[("corpus_path", "corpus.txt")])
    assert spec.parameters["corpus_path"] == spec.overrides["corpus_path"] == str(data.resolve())
    k1 = spec.key["data"]
    data.write_text("two")      # the bytes of the file the kernel will read are the ones hashed
    assert runs.plan_runs(tagged, tmp_path / "out", cli=[("corpus_path", "corpus.txt")])[0].key["data"] != k1
    spec2, = runs.plan_runs(tagged, tmp_path / "out", cli=[("corpus_path", "corpus.txt")], data_base=tmp_path)
    assert spec2.parameters["corpus_path"] == str(tmp_path / "corpus.txt")


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_timeout_must_be_positive(tmp_path, value, capsys):
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    assert main(["run", str(nb), "--timeout", value, "--out", str(tmp_path / "o")]) == 2
    assert "--timeout must be a positive number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="timeout"):
        runs.run_many([], timeout=-1.0)


def test_values_equal_to_the_defaults_are_the_default_run(tmp_path):
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    plain, = runs.plan_runs(nb, tmp_path)
    same, = runs.plan_runs(nb, tmp_path, cli=[("seed", "0")])
    assert same.out_dir == plain.out_dir and same.out_dir.name == "default"
    assert same.key == plain.key and same.overrides == {}
    other, = runs.plan_runs(nb, tmp_path, cli=[("seed", "2")])
    assert other.out_dir.name == "seed=2"


def test_grid_over_a_list_parameter(tmp_path):
    nb = _notebook(tmp_path, "00_list.py", '# %% tags=["parameters"]\nwidths: list[int] = [4]  # [≥ 1] widths\n'
                                          'output_dir: str = ""\n')
    specs = runs.plan_runs(nb, tmp_path, grid=["widths=[1,2],[3]"])
    assert [s.overrides["widths"] for s in specs] == [[1, 2], [3]]
    with pytest.raises(ParameterError, match=r"bracketed list, e.g. --grid 'widths=\[1,2\],\[3,4\]'"):
        runs.plan_runs(nb, tmp_path, grid=["widths=1,2"])
    with pytest.raises(ParameterError, match="widths"):
        runs.plan_runs(nb, tmp_path, grid=["widths=[0]"])       # bounds still apply to each element


def test_a_set_names_its_folder_with_the_overrides_the_user_added(tmp_path):
    from taskloss.runner.cli import _param_set

    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    (tmp_path / "params" / "00_edits").mkdir(parents=True)
    (tmp_path / "params" / "00_edits" / "smoke.yaml").write_text("seed: 5\n")
    pset = _param_set(nb, "smoke")
    assert runs.plan_runs(nb, tmp_path, param_set=pset)[0].out_dir.name == "smoke"
    assert runs.plan_runs(nb, tmp_path, param_set=pset, cli=[("seed", "5")])[0].out_dir.name == "smoke"
    spec, = runs.plan_runs(nb, tmp_path, param_set=pset, cli=[("edit_path", "x")])
    assert spec.out_dir.name.startswith("smoke__edit_path=") and spec.parameters["seed"] == 5
    with pytest.raises(ParameterError, match="no parameter set 'full'"):
        _param_set(nb, "full")


def test_table_lists_failed_runs(tmp_path):
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    out = tmp_path / "out"
    assert main(["run", str(nb), "--grid", "seed=0,1,7", "--out", str(out), "--threads", "1"]) == 1
    text = tabulate_sweep(out / "00_edits", "score", "seed", over="edit_path", figure=False)
    assert "Not in the table: 1 run(s) that did not finish" in text
    assert "- seed=7: failed:" in text and "asked to fail" in text


def _committed(value=1.0, fp=None):
    return {"headline": {"a": value, "b": "text"}, "fingerprint": fp or {"cpu": "x", "threads": 1}}


def test_reproduction_uses_the_test_suites_tolerances():
    from taskloss.results.fingerprint import NUMERICS_KEYS

    fp = {k: "same" for k in NUMERICS_KEYS}
    fresh = {"results": {"a": 1.0 + 5e-4, "b": "text"}, "fingerprint": fp}
    assert reproduction(_committed(fp=fp), fresh)["reproduced"] == 2             # within rtol 1e-3
    fresh["results"]["a"] = 1.01
    rep = reproduction(_committed(fp=fp), fresh)
    assert rep["reproduced"] == 1 and rep["of"] == 2 and "a" in rep["differences"] and rep["same_numerics"]
    other = {**fp, NUMERICS_KEYS[0]: "other"}
    moved = {"results": {"a": 1.01, "b": "text"}, "fingerprint": other,
             "across_machines": {"a": {"rtol": 0.0, "atol": 0.05, "reason": "seed spread"}}}
    assert reproduction(_committed(fp=fp), moved)["reproduced"] == 2             # its declared tolerance
    moved["across_machines"] = {}
    assert reproduction(_committed(fp=fp), moved)["reproduced"] == 1             # round-off only otherwise
    assert reproduction(_committed(fp=fp), {"results": {}})["differences"] == {"a": "not recorded",
                                                                              "b": "not recorded"}
    assert reproduction(None, fresh) is None


def test_terminal_table_fits_120_characters():
    rows = [{"notebook": "12_implicit_gradient_regularization_with_a_long_name", "folder": "x" * 90,
             "status": "failed", "seconds": 12.3, "claims_count": "3/4", "error": "In [5] " + "y" * 300,
             "reproduced": None},
            {"notebook": "01_optimization_as_sampling", "folder": "default", "status": "ok", "seconds": 40.0,
             "claims_count": "5/5", "reproduced": {"reproduced": 4, "of": 5, "differences": {"k": "moved"}}}]
    text = terminal_table(rows)
    assert all(len(line) <= TERMINAL_WIDTH for line in text.splitlines())
    assert "4/5" in text and "4 of 5 committed headlines reproduced" in text


def test_a_default_run_reports_its_reproduced_headlines(tmp_path):
    """A notebook with a committed .ipynb beside it: the default run says k/n, in meta.json and SUMMARY.md."""
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    committed = {"cells": [], "nbformat": 4, "nbformat_minor": 5,
                 "metadata": {"taskloss": {"headline": {"score": 0.5}, "fingerprint": None}}}
    nb.with_suffix(".ipynb").write_text(json.dumps(committed))
    out = tmp_path / "out"
    assert main(["run", str(nb), "--out", str(out), "--threads", "1"]) == 0
    meta = store.read_meta(out / "00_edits" / "default")
    assert meta["reproduced"]["reproduced"] == 1 and meta["reproduced"]["of"] == 1
    assert "| 1/1 |" in (out / "00_edits" / store.SUMMARY_FILE).read_text()
    assert main(["run", str(nb), "-p", "seed", "2", "--out", str(out), "--threads", "1"]) == 0
    assert "reproduced" not in store.read_meta(out / "00_edits" / "seed=2")      # not the default parameters


def test_notebooks_folder_given_on_the_command_line(tmp_path, capsys):
    nb = _notebook(tmp_path, "00_edits.py", EDITS)
    out = tmp_path / "o"
    assert main(["--notebooks", str(nb.parent), "all", "--out", str(out), "--threads", "1"]) == 0
    assert (out / "00_edits" / store.META_FILE).exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--notebooks", str(empty), "params", "00"]) == 2
    assert "no NN_topic.py notebooks in" in capsys.readouterr().err
