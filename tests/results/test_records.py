"""Committed records of larger runs (taskloss.results.records, ``taskloss-runs record``): a record is re-decided by
today's procedure, refused when it is not reproduced, and every committed one ran its set as the set stands and is
quoted by its notebook."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from taskloss.results import paired_comparison
from taskloss.results.records import (RECORDS_DIR, RecordMismatch, load_record, record_path, save_record)
from taskloss.runner.cli import main, set_parameters
from taskloss.runner.store import canonical
from taskloss.utils import REPO_ROOT

NB = "04_sequence_task_losses"


def _fake_run(folder: Path, *, n: int = 12, status: str = "ok", notebook: str = NB, shift: float = -1.0) -> Path:
    """A run folder with one decided median comparison, one undecided and one declared-symmetric mean."""
    rng = np.random.default_rng(0)
    b = rng.normal(10, 1, n)
    a = b + shift + rng.normal(0, 0.1, n)
    res = {}
    for key, (x, y, kw) in {"x/decided": (a, b, {}), "x/null": (b + rng.normal(0, 1, n), b, {}),
                            "x/mean": (a, b, {"estimand": "mean", "symmetric": True})}.items():
        c = paired_comparison(x, y, name="A", baseline="B", metric="loss", lower_is_better=True, **kw)
        res[key] = {**c.as_dict(), "a": list(map(float, x)), "b": list(map(float, y))}
    res["x/scalar"] = 1.5
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"notebook": notebook, "results": res}, default=str))
    (folder / "meta.json").write_text(json.dumps({"notebook": notebook, "status": status, "parameters": {},
                                                  "seconds": 90.0, "git": {"commit": "abc", "dirty": False},
                                                  "fingerprint": {"cpu": "test CPU", "threads": 1}}))
    return folder


def test_a_saved_record_is_re_decided_and_read_back(tmp_path):
    dest = save_record(_fake_run(tmp_path / "run"), "full", root=tmp_path / "records")
    assert dest == record_path(NB, "full", tmp_path / "records")
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["recorded_at"].endswith("Z")
    rec = load_record(NB, "full", root=tmp_path / "records")
    assert set(rec.comparisons) == {"x/decided", "x/null", "x/mean"} and rec.results["x/scalar"] == 1.5
    assert rec.comparisons["x/decided"].verdict == "better" and rec.comparisons["x/null"].verdict == "inconclusive"
    assert rec.comparisons["x/mean"].verdict == "better"          # the symmetry declaration is read back
    fam = rec.family(["x/decided", "x/null"])
    assert fam["x/decided"].family_size == 2 and fam["x/decided"].verdict_adjusted == "better"
    assert "abc" in rec.describe() and "test CPU" in rec.describe() and "2 min wall" in rec.describe()
    with pytest.raises(KeyError, match="holds no comparison"):
        rec.family(["x/decided", "x/absent"])


def test_a_record_the_procedure_does_not_reproduce_is_refused(tmp_path):
    folder = _fake_run(tmp_path / "run")
    data = json.loads((folder / "results.json").read_text())
    data["results"]["x/null"]["verdict"] = "better"                 # a verdict today's test does not give
    (folder / "results.json").write_text(json.dumps(data))
    with pytest.raises(RecordMismatch, match="x/null.*verdict"):
        save_record(folder, "full", root=tmp_path / "records")
    assert not (record_path(NB, "full", tmp_path / "records") / "results.json").exists()   # nothing left behind
    data["results"]["x/null"]["verdict"] = "inconclusive"
    data["results"]["x/decided"]["p_value"] *= 3                     # a p-value that is not today's
    (folder / "results.json").write_text(json.dumps(data))
    with pytest.raises(RecordMismatch, match="p_value"):
        save_record(folder, "full", root=tmp_path / "records")
    del data["results"]["x/decided"]["estimand"]                     # a record from before estimands: rerun it
    data["results"]["x/decided"]["p_value"] /= 3
    (folder / "results.json").write_text(json.dumps(data))
    with pytest.raises(RecordMismatch, match="lacks"):
        save_record(folder, "full", root=tmp_path / "records")


def test_only_a_finished_run_of_the_named_notebook_is_a_record(tmp_path):
    with pytest.raises(RecordMismatch, match="status 'failed'"):
        save_record(_fake_run(tmp_path / "failed", status="failed"), root=tmp_path / "records")
    with pytest.raises(FileNotFoundError, match="finished run"):
        save_record(tmp_path / "nothing", root=tmp_path / "records")
    assert load_record(NB, "full", root=tmp_path / "records") is None        # none committed: None, not an error
    dest = record_path("09_emo_loss", "full", tmp_path / "records")
    dest.mkdir(parents=True)
    _fake_run(dest)                                                          # a record of 04 filed under 09
    with pytest.raises(RecordMismatch, match="not '09_emo_loss'"):
        load_record("09_emo_loss", "full", root=tmp_path / "records")
    for bad in ("", "../x", ".hidden", 4):
        with pytest.raises(ValueError, match="plain folder name"):
            record_path(bad)


def test_the_record_command_refuses_a_run_of_other_parameters(tmp_path, capsys):
    folder = _fake_run(tmp_path / "run")
    meta = json.loads((folder / "meta.json").read_text())
    meta["parameters"] = {**set_parameters(REPO_ROOT / "notebooks" / f"{NB}.py", "full"), "n_seeds": 3}
    (folder / "meta.json").write_text(json.dumps(meta))
    assert main(["record", str(folder), "--set", "full"]) == 2
    assert "n_seeds ran 3, the set has" in capsys.readouterr().err
    assert main(["record", str(folder), "--set", "no_such_set"]) == 2
    assert "no parameter set 'no_such_set'" in capsys.readouterr().err


COMMITTED = sorted(p.parent for p in RECORDS_DIR.glob("*/*/results.json"))


@pytest.mark.parametrize("folder", COMMITTED, ids=[f"{p.parent.name}/{p.name}" for p in COMMITTED])
def test_every_committed_record_ran_its_set_and_is_quoted_by_its_notebook(folder):
    notebook, set_name = folder.parent.name, folder.name
    rec = load_record(notebook, set_name)                     # re-decides every comparison (RecordMismatch if not)
    assert rec is not None and rec.comparisons
    expected = set_parameters(REPO_ROOT / "notebooks" / f"{notebook}.py", set_name)
    ran = {k: v for k, v in rec.parameters.items() if k != "output_dir"}
    differ = sorted(k for k in set(expected) | set(ran) if canonical(expected.get(k)) != canonical(ran.get(k)))
    assert not differ, (f"{folder}: the set params/{notebook}/{set_name}.yaml (or the notebook's defaults) changed "
                        f"since the record ({differ}); rerun it and 'taskloss-runs record' it again")
    assert rec.meta["git"]["commit"] and rec.meta["status"] == "ok"
    outputs = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                      for c in json.loads((REPO_ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
                      for o in c.get("outputs", []))
    assert rec.describe() in outputs, f"notebooks/{notebook}.ipynb does not quote its record ({rec.describe()})"


def test_corrected_phrase_states_the_family_verdict_and_what_it_could_detect(tmp_path):
    from taskloss.results.records import corrected_phrase

    rec = load_record(NB, "full", root=save_record(_fake_run(tmp_path / "run"), root=tmp_path / "r").parents[1])
    fam = rec.family(["x/decided", "x/null"])
    text = corrected_phrase(fam["x/decided"])
    c = fam["x/decided"]
    assert text == f"{c.effect:+.3f} (uncorrected 95 % CI [{c.ci_low:.3f}, {c.ci_high:.3f}]) → **better**"
    null = fam["x/null"]                                                     # undecided: what it could detect
    assert null.verdict_adjusted == "inconclusive" and corrected_phrase(null, ".2f").endswith(
        f"→ **inconclusive**, smallest effect detectable after the correction {null.mde_family:.2f}")
    small = load_record(NB, "full", root=save_record(_fake_run(tmp_path / "run5", n=5), root=tmp_path / "s").parents[1])
    assert corrected_phrase(small.family(["x/decided", "x/null"])["x/decided"]).endswith(
        "no difference of any size is decidable at 5 untied seeds")
    with pytest.raises(ValueError, match="corrected in its family"):
        corrected_phrase(rec.comparisons["x/decided"])                       # not corrected: refused
    with pytest.raises(TypeError, match="Comparison"):
        corrected_phrase({"effect": 1.0})
