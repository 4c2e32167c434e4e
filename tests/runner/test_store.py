"""Run folders without kernels: collision-free names, keys over sources, corrupt metas, locks, summaries, modes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from taskloss.runner import runs, store
from taskloss.runner.cli import main
from taskloss.runner.params import ParameterError
from taskloss.utils import atomic_write_text

NB = '''# %% tags=["parameters"]
seed: int = 0
label: str = "x"
values: list[float] = [1.0]
output_dir: str = ""

# %%
print(label)
'''


@pytest.fixture
def nb(tmp_path) -> Path:
    path = tmp_path / "nb" / "00_store.py"
    path.parent.mkdir()
    path.write_text(NB)
    return path


def test_values_that_sanitize_alike_get_different_folders(nb, tmp_path):
    long_a, long_b = "a" * 300 + "1", "a" * 300 + "2"  # equal after shortening
    grid = ["label=a/b,a?b,a b,a-b," + long_a + "," + long_b]
    specs = runs.plan_runs(nb, tmp_path, grid=grid)
    assert len(specs) == 6 and len({s.out_dir for s in specs}) == 6
    assert all(len(s.out_dir.name) <= store.NAME_CHARS + 9 for s in specs)
    names = sorted(s.out_dir.name for s in specs)
    assert "label=a-b" in names                        # a safe string names its folder exactly
    assert sum(n.startswith("label=a-b~") for n in names) == 3    # the sanitized ones carry a hash
    assert runs.plan_runs(nb, tmp_path)[0].out_dir.name == "default"
    # the folder is a function of the overrides: the same values always map to the same folder
    assert runs.plan_runs(nb, tmp_path, cli=[("seed", "3")])[0].out_dir == \
        runs.plan_runs(nb, tmp_path, grid=["seed=3"])[0].out_dir


def test_a_sweep_keeps_every_swept_value_readable(nb, tmp_path):
    """A long fixed value no longer pushes the swept axis out of the folder name."""
    specs = runs.plan_runs(nb, tmp_path, cli=[("label", "a-rather-long-label-for-this-run-" + "x" * 40)],
                           grid=["seed=0,1", "values=[1.0],[2.0]"])
    names = [s.out_dir.name for s in specs]
    assert len(set(names)) == 4
    for s in specs:
        assert f"seed={s.overrides['seed']}" in s.out_dir.name
        assert f"values={s.overrides['values'][0]!r}" in s.out_dir.name
    assert store.folder_name({"seed": 2, "lr": 0.001}) == "lr=0.001__seed=2"
    assert store.folder_name({"values": [1, 2.5]}) == "values=1,2.5"
    assert "~" in store.folder_name({"label": "a,b"}) and "~" in store.folder_name({"values": ["x", "y"]})


def test_a_sweeps_axes_lead_the_folder_name_so_a_shortened_name_still_shows_them(nb, tmp_path):
    # many fixed overrides (a --set file) fill the name; the swept values must survive the shortening
    long = [("label", "z" * 60)]
    specs = runs.plan_runs(nb, tmp_path, cli=long, grid=["seed=0,1"])
    for s in specs:
        assert s.out_dir.name.startswith(f"seed={s.overrides['seed']}__label="), s.out_dir.name
        assert "~" in s.out_dir.name                              # shortened: the hash keeps it unique
    assert store.folder_name({"b": 1, "a": 2}, first=["b"]) == "b=1__a=2"
    assert store.folder_name({"b": 1, "a": 2}, first=["c"]) == "a=2__b=1"   # an absent name changes nothing


def test_grid_and_yaml_mistakes_are_refused(nb, tmp_path):
    with pytest.raises(ParameterError, match="--grid seed is given twice"):
        runs.plan_runs(nb, tmp_path, grid=["seed=2,3", "seed=4"])
    dup = tmp_path / "dup.yaml"
    dup.write_text("seed: 1\nlabel: y\nseed: 2\n")
    with pytest.raises(ParameterError, match=r"line 3: 'seed' is set twice \(first on line 1\)"):
        runs.plan_runs(nb, tmp_path, param_files=[str(dup)])


def test_bounds_require_finite_values_unless_they_say_inf(tmp_path):
    path = tmp_path / "00_bounds.py"
    path.write_text('# %% tags=["parameters"]\nlr: float = 0.1   # [> 0] step size\n'
                    'clip: float = 1.0   # [> 0, inf] clipping threshold (inf: off)\noutput_dir: str = ""\n')
    for value in (".inf", ".nan", "-1"):
        with pytest.raises(ParameterError, match="lr"):
            runs.plan_runs(path, tmp_path, cli=[("lr", value)])
    assert runs.plan_runs(path, tmp_path, cli=[("clip", ".inf")])[0].parameters["clip"] == float("inf")
    with pytest.raises(ParameterError, match="clip"):
        runs.plan_runs(path, tmp_path, cli=[("clip", ".nan")])
    path.write_text('# %% tags=["parameters"]\nlr: float = 0.1\nlr: float = 0.2\n')
    with pytest.raises(ParameterError, match="assigned twice"):
        runs.plan_runs(path, tmp_path)


def test_the_key_covers_the_planned_source_and_the_data_a_run_reads(nb, tmp_path):
    spec, = runs.plan_runs(nb, tmp_path)
    assert spec.source == nb.read_text() and set(spec.key) == {"run", "parameters", "notebook", "package", "data"}
    nb.write_text(NB + "\n# edited after planning\n")
    assert spec.key == store.run_key(spec.parameters, nb, spec.key["package"], spec.key["data"],
                                     source=spec.source)           # the key is the planned bytes'
    assert runs.plan_runs(nb, tmp_path)[0].key["run"] != spec.key["run"]
    data = tmp_path / "corpus.txt"
    data.write_text("one")
    h1 = store.data_hash({"corpus_path": str(data)}, ["corpus_path"])
    data.write_text("two")
    assert store.data_hash({"corpus_path": str(data)}, ["corpus_path"]) != h1   # declared data: its bytes count
    assert store.data_hash({"corpus_path": str(data)}) == store.data_hash({})  # undeclared: not read
    assert store.data_hash({"corpus_path": ""}, ["corpus_path"]) == store.data_hash({})
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.bin").write_bytes(b"1")
    h2 = store.data_hash({"model_folder": str(folder)}, ["model_folder"])
    (folder / "sub" / "a.bin").write_bytes(b"2")
    assert store.data_hash({"model_folder": str(folder)}, ["model_folder"]) != h2
    # through the notebook: a parameter tagged [data]
    tagged = tmp_path / "00_data.py"
    tagged.write_text('# %% tags=["parameters"]\ncorpus_path: str = ""   # [data] a text file to read\n'
                      'output_dir: str = ""\n')
    k1 = runs.plan_runs(tagged, tmp_path, cli=[("corpus_path", str(data))])[0].key["data"]
    data.write_text("three")
    assert runs.plan_runs(tagged, tmp_path, cli=[("corpus_path", str(data))])[0].key["data"] != k1
    tagged.write_text('# %% tags=["parameters"]\nsteps: int = 1   # [data] not a path\n')
    with pytest.raises(ParameterError, match=r"\[data\] marks a str parameter"):
        runs.plan_runs(tagged, tmp_path)


def test_a_finished_run_whose_outputs_went_missing_or_changed_is_not_reused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "00_x.ipynb").write_text("{}")
    (folder / "results.json").write_text('{"results": {}}')
    store.write_meta(folder, {"notebook": "00_x", "status": "ok", "key": {"run": "k"},
                              "outputs": store.output_hashes(folder, "00_x")})
    assert store.is_finished(folder, "k") and not store.is_finished(folder, "other")
    (folder / "results.json").write_text('{"results": {"edited": 1}}')
    assert not store.is_finished(folder, "k")
    (folder / "results.json").unlink()
    assert not store.is_finished(folder, "k")
    store.write_meta(folder, {"notebook": "00_x", "status": "ok", "key": {"run": "k"}})   # no recorded outputs
    assert not store.is_finished(folder, "k")


def test_summary_has_a_column_per_swept_parameter_and_the_claims(tmp_path):
    sweep = tmp_path / "00_store"
    for seed in (0, 1):
        folder = sweep / store.folder_name({"seed": seed, "label": "x"})
        store.write_meta(folder, {"notebook": "00_store", "status": "ok", "overrides": {"seed": seed, "label": "x"}})
        atomic_write_text(folder / "results.json", json.dumps(
            {"headline": ["acc"], "results": {"acc": seed / 2},
             "claims": {"up": {"held": True}, "down": {"held": seed == 0}}}))
    text = store.write_summary(sweep)
    assert ("| notebook | run | seed | label | status | seconds | claims | headlines reproduced | headline results |"
            in text)
    assert "| 00_store | label=x__seed=1 | 1 | x | ok |  | 1/2 held; not held: down |  | acc = 0.5 |" in text
    assert "2/2 held |" in text


def test_a_summary_that_cannot_be_written_is_reported(nb, tmp_path, capsys, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    import taskloss.runner.cli as cli

    monkeypatch.setattr(cli, "run_many", lambda specs, **kw: runs.SweepResult(
        [{"notebook": s.name, "status": "ok"} for s in specs]))
    monkeypatch.setattr(store, "atomic_write_text", full)
    assert main(["run", str(nb), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "could not write" in err and "No space left on device" in err and "Traceback" not in err


def test_duplicate_grid_values_plan_one_run(nb, tmp_path):
    specs = runs.plan_runs(nb, tmp_path, grid=["seed=0,1,1,0.0", "values=[1],[1.0]"])
    # seed 0 and values [1.0] are the defaults: that point is the default run, in the folder "default"
    assert [s.overrides for s in specs] == [{}, {"seed": 1, "values": [1.0]}]
    assert specs[0].out_dir.name == "default"


def test_run_key_covers_parameters_notebook_and_package_sources(nb, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "m.py").write_text("x = 1\n")
    h0 = store.package_hash(pkg)
    (pkg / "sub" / "m.py").write_text("x = 2\n")  # an uncommitted edit changes the key
    h1 = store.package_hash(pkg)
    assert h0 != h1
    k = store.run_key({"seed": 0}, nb, h1)
    assert k == store.run_key({"seed": 0}, nb, h1)
    assert k["run"] != store.run_key({"seed": 1}, nb, h1)["run"]
    assert k["run"] != store.run_key({"seed": 0}, nb, h0)["run"]
    nb.write_text(NB + "\n# an edit\n")
    assert k["run"] != store.run_key({"seed": 0}, nb, h1)["run"]
    assert len(store.package_hash()) == 64  # the real package hashes too


@pytest.mark.parametrize("content", ["[]", "null", "{", "", "\xff\xfe", '"ok"', '{"status": "ok", "key": []}'])
def test_corrupt_meta_is_unfinished_and_does_not_abort(nb, tmp_path, content):
    spec, = runs.plan_runs(nb, tmp_path)
    spec.out_dir.mkdir(parents=True)
    (spec.out_dir / store.META_FILE).write_bytes(content.encode("latin-1"))
    assert not store.is_finished(spec.out_dir, spec.key["run"])
    runs.check_no_clobber([spec])
    rows = store.summary_rows(spec.out_dir.parent)
    assert [r["folder"] for r in rows] == ["default"]
    assert "runs succeeded" in store.write_summary(spec.out_dir.parent)


def test_finished_run_with_other_parameters_is_not_clobbered(nb, tmp_path):
    spec, = runs.plan_runs(nb, tmp_path, nested=False)
    store.write_meta(spec.out_dir, {"status": "ok", "overrides": {"seed": 4}, "key": {"run": "x"}})
    with pytest.raises(ParameterError, match="holds a finished run with other parameters"):
        runs.check_no_clobber([spec])


def test_lock_excludes_a_second_holder_even_in_another_process(tmp_path):
    folder = tmp_path / "run"
    with store.run_lock(folder):
        with pytest.raises(store.RunBusy):
            with store.run_lock(folder, wait=False):
                pass
        probe = ("import sys; from taskloss.runner import store\n"
                 "try:\n with store.run_lock(sys.argv[1], wait=False): print('got')\n"
                 "except store.RunBusy: print('busy')")
        r = subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True, text=True)
        assert r.stdout.strip() == "busy", r.stderr
        assert store.summary_rows(tmp_path)[0]["status"] == "running"
    with store.run_lock(folder, wait=False):
        pass
    assert store.summary_rows(tmp_path)[0]["status"] == "incomplete"


def test_summary_lists_every_run_folder_in_the_sweep(nb, tmp_path):
    sweep = tmp_path / "00_store"
    for i, status in enumerate(["ok", "failed", "ok"]):
        folder = sweep / f"seed={i}-abc{i}"
        store.write_meta(folder, {"notebook": "00_store", "status": status, "seconds": 1.5,
                                  "error": "In [3] (cell 2: 'x'): ValueError: bad | pipe" if status != "ok" else ""})
        atomic_write_text(folder / "results.json", json.dumps({"headline": ["acc"], "results": {"acc": i / 3}}))
    (sweep / "seed=9-zzz").mkdir()
    (sweep / "seed=9-zzz" / store.LOCK_FILE).touch()  # a folder whose run never ended
    (sweep / ".submitit").mkdir()
    text = store.write_summary(sweep)
    assert "2 of 4 runs succeeded" in text
    assert "acc = 0.6667" in text and "**failed**: In [3] (cell 2: 'x'): ValueError: bad \\| pipe" in text
    assert "**incomplete**" in text and ".submitit" not in text


def test_results_meta_and_summary_are_world_readable(nb, tmp_path):
    old = os.umask(0o022)
    try:
        folder = tmp_path / "run"
        store.write_meta(folder, {"status": "ok"})
        atomic_write_text(folder / "results.json", "{}")
        store.write_summary(tmp_path)
        for name in ("meta.json", "results.json"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644, name
        assert stat.S_IMODE((tmp_path / store.SUMMARY_FILE).stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_unwritable_out_fails_with_a_clear_message(nb, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["run", str(nb), "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "cannot write into" in err and "Traceback" not in err

    def refuse(*args, **kwargs):  # what a read-only --out does (root ignores chmod, so simulate it)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["run", str(nb), "--out", str(tmp_path / "ro")]) == 2
    err = capsys.readouterr().err
    assert "cannot write into" in err and "Permission denied" in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_out_fails_with_a_clear_message(nb, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    assert main(["run", str(nb), "--out", str(ro)]) == 2
    assert "Permission denied" in capsys.readouterr().err


def test_threads_per_run_splits_the_cores_and_respects_a_caller_omp_setting(monkeypatch):
    from taskloss.runner.kernel import threads_per_run

    monkeypatch.setattr("taskloss.runner.kernel.available_cores", lambda: 8)
    monkeypatch.setattr("taskloss.runner.kernel._load", lambda: 0.0)      # a quiet machine
    assert threads_per_run(1, {}) == 8 and threads_per_run(3, {}) == 2 and threads_per_run(16, {}) == 1
    assert threads_per_run(1, {"OMP_NUM_THREADS": "1"}) == 1      # one thread asked for: one thread per kernel
    assert threads_per_run(4, {"OMP_NUM_THREADS": "6"}) == 2      # never more than the cores split between runs
    for junk in ("", "0", "-2", "two", "1.5"):
        assert threads_per_run(2, {"OMP_NUM_THREADS": junk}) == 4  # not a positive integer: ignored
    assert threads_per_run(4, {"OMP_NUM_THREADS": "1"}, threads=3) == 3   # --threads decides
    assert threads_per_run(1, {}, load=5.5) == 2 and threads_per_run(1, {}, load=14.0) == 1   # a busy machine
    assert threads_per_run(1, {}, threads=4, load=14.0) == 4
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            threads_per_run(1, {}, threads=bad)


def test_summary_shows_the_corrected_verdict_of_a_headline_comparison():
    """SUMMARY.md reads a headline comparison's family-corrected verdict (issue 39: it showed the uncorrected one,
    'worse' where the notebook said 'inconclusive' after Holm), and marks an uncorrected one as such."""
    from taskloss.runner.store import _headline

    comp = {"effect": 3.475, "verdict": "worse", "a": [1.0], "b": [0.0]}
    res = {"results": {"x/cmp": comp, "x/plain": 0.5}, "headline": ["x/cmp", "x/plain"],
           "adjusted": {"x/cmp": {"verdict_adjusted": "inconclusive", "correction": "holm"}}}
    text = _headline(res)
    assert "x/cmp = inconclusive after holm (3.475)" in text and "worse" not in text and "x/plain = 0.5" in text
    del res["adjusted"]
    assert "x/cmp = worse (uncorrected) (3.475)" in _headline(res)
