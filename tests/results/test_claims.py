"""Claims (findings of a run, enforced only in strict mode), family-wise comparison tables, and the results API's
refusal of values it cannot store."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import taskloss.results.run as tn
from taskloss.results.headlines import CHECK_ENV
from taskloss.results.run import ClaimNotHeld, Run


def _run(tmp_path, strict=False):
    return Run(name="00_x", dir=tmp_path, device=torch.device("cpu"), seed=0, strict=strict)


def test_a_claim_is_recorded_printed_and_not_enforced_outside_strict_mode(tmp_path, capsys):
    run = _run(tmp_path)
    assert run.claim("pg/gain", "REINFORCE lowers the task loss by more than 0.03", False, value=-0.1, bound="> 0.03") \
        is False
    assert run.claim("mgs/ess", "MGS keeps more than one effective sample", np.bool_(True), value=3.5) is True
    out = capsys.readouterr().out
    assert "✗ claim does not hold: REINFORCE lowers" in out and "-0.1 (bound > 0.03)" in out
    assert "✓ claim holds: MGS keeps" in out
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["claims"]["pg/gain"] == {"statement": "REINFORCE lowers the task loss by more than 0.03",
                                          "held": False, "value": -0.1, "bound": "> 0.03"}
    assert saved["strict"] is False
    table = run.claims_table()
    assert table.startswith("1 of 2 claims hold.") and "✗ **not held**" in table
    assert run.render("{pg/gain.held} / {mgs/ess.value}") == "False / 3.5"


def test_strict_mode_enforces_claims_after_saving_them(tmp_path):
    run = _run(tmp_path, strict=True)
    run.claim("ok", "holds", True)
    with pytest.raises(ClaimNotHeld, match="'broken' of 00_x does not hold at the default parameters"):
        run.claim("broken", "a finding of the committed run", False, value=0.2, bound="> 0.5")
    assert json.loads((tmp_path / "results.json").read_text())["claims"]["broken"]["held"] is False


def test_start_is_strict_exactly_under_the_test_suites_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    assert tn.start("00_x", str(tmp_path / "a"), device="cpu").strict is False
    monkeypatch.setenv(CHECK_ENV, "1")
    assert tn.start("00_x", str(tmp_path / "b"), device="cpu").strict is True


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"key": "", "statement": "s", "held": True}, ValueError, "non-empty"),
    ({"key": "k", "statement": " ", "held": True}, ValueError, "statement"),
    ({"key": "k", "statement": "s", "held": 1}, TypeError, "bool"),
    ({"key": "k", "statement": "s", "held": "yes"}, TypeError, "bool"),
    ({"key": "k", "statement": "s", "held": True, "bound": 3}, TypeError, "bound"),
    ({"key": "k", "statement": "s", "held": True, "value": object()}, TypeError, "cannot record"),
])
def test_claim_rejects_bad_input(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _run(tmp_path).claim(**kwargs)


def test_a_claim_is_made_once(tmp_path):
    run = _run(tmp_path)
    run.claim("k", "s", True)
    with pytest.raises(ValueError, match="already"):
        run.claim("k", "s", False)


def test_a_value_that_cannot_be_stored_leaves_the_run_usable(tmp_path):
    run = _run(tmp_path)
    run.record("good", 1.0)
    for bad in (object(), {"x": {1, 2}}, [1.0, object()], lambda: 1):
        with pytest.raises(TypeError, match="cannot record 'bad'"):
            run.record("bad", bad)
    assert "bad" not in run.results
    run.record("later", np.float32(2.5))          # later records still work
    run.record("nan", float("nan"))                # non-finite numbers are stored as text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"] == {"good": 1.0, "later": 2.5, "nan": "nan"}
    with pytest.raises(ValueError, match="non-empty"):
        run.record(3, 1.0)


def test_comparison_table_is_one_family_with_holm_by_default(tmp_path, capsys):
    run = _run(tmp_path)
    rng = np.random.default_rng(0)
    base = rng.normal(size=10)
    run.compare("strong", base + 1.0 + 0.01 * rng.normal(size=10), base, name="A", baseline="B")
    run.compare("weak", base + 0.05 + 0.04 * rng.normal(size=10), base, name="C", baseline="B")
    run.compare("none", base + 0.1 * rng.normal(size=10), base, name="D", baseline="B")
    text = run.comparison_table()
    assert text.startswith("3 comparisons; Holm correction across them")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["adjusted"]) == {"strong", "weak", "none"}
    assert saved["adjusted"]["strong"]["verdict_adjusted"] == "better"
    assert "p_adjusted" not in saved["results"]["strong"]           # the recorded comparison stays as recorded
    assert run.render("{strong.verdict_adjusted} {strong.family_size}") == "better 3"
    with pytest.raises(KeyError, match="no comparison"):
        run.comparison_table(["missing"])
    assert "adjusted p" not in run.comparison_table(correction=None)


def test_render_formats_an_unbounded_interval(tmp_path):
    """A comparison at 3 seeds has the interval (−inf, inf), recorded as JSON strings: a numeric format spec renders
    them as inf instead of failing (notebook 09's summary did)."""
    run = _run(tmp_path)
    run.compare("c", [1.0, 2.0, 3.0], [0.0, 0.5, 1.0])
    assert run.render("[{c.ci_low:.3f}, {c.ci_high:.3f}]") == "[-inf, inf]"
