"""A sweep read back as a table and a figure (taskloss.runner.tabulate), and named parameter sets (--set)."""
from __future__ import annotations

import json
import math

import pytest

from taskloss.runner import store
from taskloss.runner.cli import main
from taskloss.runner.tabulate import sweep_points, tabulate_sweep
from taskloss.utils import atomic_write_text


def _fake_sweep(tmp_path, seeds=(0, 1, 2), lrs=(0.01, 0.1, 1.0)):
    sweep = tmp_path / "00_nb"
    for lr in lrs:
        for seed in seeds:
            params = {"lr": lr, "seed": seed, "steps": 10, "output_dir": ""}
            folder = sweep / store.folder_name({"lr": lr, "seed": seed})
            store.write_meta(folder, {"notebook": "00_nb", "status": "ok", "parameters": params,
                                      "overrides": {"lr": lr, "seed": seed}})
            loss = 1.0 / lr + seed
            atomic_write_text(folder / "results.json", json.dumps({"results": {
                "loss": loss, "cmp": {"effect": -seed * lr, "verdict": "better"}, "label": "x"}}))
    return sweep


def test_points_group_by_the_swept_value_over_seeds(tmp_path):
    pts = sweep_points(_fake_sweep(tmp_path), "loss", "lr")
    assert [p.x for p in pts] == [0.01, 0.1, 1.0] and all(p.group == {} for p in pts)
    assert pts[0].values == [100.0, 101.0, 102.0] and pts[0].replicates == [0, 1, 2]
    lo, hi = pts[0].interval()
    assert lo < 101.0 < hi and math.isclose((hi - lo) / 2, 4.302652729911275 * 1.0 / math.sqrt(3), rel_tol=1e-9)
    assert [p.mean for p in sweep_points(tmp_path / "00_nb", "cmp", "lr")] == pytest.approx([-0.01, -0.1, -1.0])


def test_fewer_than_three_runs_show_values_not_an_interval(tmp_path):
    sweep = _fake_sweep(tmp_path, seeds=(0, 1))
    assert sweep_points(sweep, "loss", "lr")[0].interval() is None
    text = tabulate_sweep(sweep, "loss", "lr")
    assert "| 0.01 | 2 | 100.5 | 100, 101 |" in text
    assert (sweep / "TABLE_loss_by_lr.md").read_text().strip() == text
    assert (sweep / "TABLE_loss_by_lr.png").stat().st_size > 1000


def test_other_varying_parameters_get_their_own_rows(tmp_path):
    sweep = _fake_sweep(tmp_path)
    folder = sweep / "extra"
    store.write_meta(folder, {"status": "ok", "parameters": {"lr": 0.01, "seed": 0, "steps": 20}})
    atomic_write_text(folder / "results.json", json.dumps({"results": {"loss": 5.0}}))
    pts = sweep_points(sweep, "loss", "lr")
    assert {tuple(p.group.items()) for p in pts} == {(("steps", 10),), (("steps", 20),)}
    assert "| lr | steps | runs | mean |" in tabulate_sweep(sweep, "loss", "lr", figure=False)


def test_tabulate_refuses_what_it_cannot_read(tmp_path, capsys):
    sweep = _fake_sweep(tmp_path)
    with pytest.raises(ValueError, match="no finished run"):
        sweep_points(sweep, "label", "lr")              # not a number
    with pytest.raises(ValueError, match="no finished run"):
        sweep_points(sweep, "loss", "momentum")
    with pytest.raises(FileNotFoundError):
        sweep_points(tmp_path / "missing", "loss", "lr")
    assert main(["table", str(sweep), "--metric", "nothing", "--by", "lr"]) == 2
    assert "no finished run" in capsys.readouterr().err
    assert main(["table", str(sweep), "--metric", "loss", "--by", "lr", "--no-figure"]) == 0
    assert "loss against lr (3 points" in capsys.readouterr().out


def test_a_named_parameter_set_that_does_not_exist_is_refused(capsys):
    assert main(["run", "01", "--set", "no_such_set"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter set 'no_such_set'" in err and "full" in err
