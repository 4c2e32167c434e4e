"""Committed headline results compared with a fresh run (what makes ``--nbval-lax`` check numbers): strict where
the numerics fingerprints agree, at the declared or seed-derived cross-machine tolerance where they do not."""
from __future__ import annotations

import json
import math
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from taskloss.results import headlines
from taskloss.results.fingerprint import (
    NUMERICS_KEYS,
    describe,
    emulation_env,
    fingerprint_differences,
    numerics_fingerprint,
    same_numerics,
)
from taskloss.results.headlines import (
    CommittedRun,
    HeadlineMismatch,
    Tolerance,
    committed_headlines,
    committed_run,
    headline_difference,
    correlation_spread,
    portable_difference,
    seed_spread,
)
from taskloss.results.run import Run

HERE = numerics_fingerprint()
ELSEWHERE = {**HERE, "cpu": "Another CPU", "cpu_capability": "AVX2" if HERE["cpu_capability"] != "AVX2" else "DEFAULT"}


@pytest.mark.parametrize("committed, fresh, same", [
    (0.5, 0.5, True), (0.5, 0.5 * (1 + 5e-4), True), (0.5, 0.5 * (1 + 2e-3), False), (0.0, 1e-9, True),
    (0.0, 1e-6, False), (3, 3, True), (3, 4, False), ("better", "better", True), ("better", "inconclusive", False),
    ([1.0, 2.0], [1.0, 2.0], True), ([1.0, 2.0], [1.0], False), ([1.0, 2.0], [1.0, 2.1], False),
    ({"effect": 0.1, "verdict": "worse"}, {"effect": 0.1, "verdict": "worse"}, True),
    ({"effect": 0.1, "verdict": "worse"}, {"effect": 0.2, "verdict": "worse"}, False),
    ({"a": 1}, {"b": 1}, False), (float("nan"), float("nan"), True), (1.0, float("nan"), False),
    (True, 1, False), ("inf", "inf", True),
])
def test_headline_difference(committed, fresh, same):
    diff = headline_difference(committed, fresh)
    assert (diff is None) == same, diff


def test_record_raises_when_a_fresh_headline_differs_from_the_committed_one(tmp_path):
    run = Run(name="00_x", dir=tmp_path, device=torch.device("cpu"), seed=0, fingerprint=HERE,
              committed=CommittedRun({"acc": 0.75, "cmp": {"effect": -0.1, "verdict": "better"}}, dict(HERE)))
    run.record("acc", 0.75, headline=True)
    run.record("other", 123.0)  # not a headline: not compared
    with pytest.raises(HeadlineMismatch, match=r"'acc' of 00_x: 0.8 differs from committed 0.75.*same bits"
                                               r".*make notebooks"):
        run.record("acc", 0.8, headline=True)
    # the same machine ignores a cross-machine tolerance: the bits can match, so the strict check applies
    with pytest.raises(HeadlineMismatch, match="same bits"):
        run.record("acc", 0.8, headline=True, across_machines=Tolerance(rtol=0.5, reason="trained"))
    assert json.loads((tmp_path / "results.json").read_text())["results"]["acc"] == 0.8  # saved all the same
    run.record("acc", 0.8, headline=True, rtol=0.1)  # a notebook may widen the tolerance of a noisy value
    with pytest.raises(HeadlineMismatch, match="'new' is not in the committed"):
        run.record("new", 1.0, headline=True)
    with pytest.raises(HeadlineMismatch, match="verdict"):
        run.record("cmp", {"effect": -0.1, "verdict": "inconclusive"}, headline=True)


def test_committed_headlines_are_read_only_under_the_test_suite(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00_x.ipynb").write_text(json.dumps(
        {"metadata": {"taskloss": {"headline": {"acc": 0.5}}}, "cells": []}))
    monkeypatch.setattr(headlines, "REPO_ROOT", tmp_path)
    monkeypatch.delenv(headlines.CHECK_ENV, raising=False)
    assert committed_headlines("00_x") is None
    monkeypatch.setenv(headlines.CHECK_ENV, "1")
    assert committed_headlines("00_x") == {"acc": 0.5}
    assert committed_headlines("99_not_a_notebook") is None


# ------------------------------------------------------------------------------------ the numerics fingerprint
def test_fingerprint_reads_this_process():
    import platform

    fp = numerics_fingerprint()
    assert set(NUMERICS_KEYS) <= set(fp)
    assert fp["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["torch"] == torch.__version__ and fp["numpy"] == np.__version__
    assert fp["threads"] == torch.get_num_threads() and fp["machine"] == platform.machine()
    assert fp["device"] == "cpu" and json.loads(json.dumps(fp)) == fp
    assert same_numerics(fp, dict(fp)) and fingerprint_differences(fp, dict(fp)) == []
    assert "thread" in describe(fp) and describe(None) == "no fingerprint recorded"


def test_fingerprint_differences_name_what_differs():
    assert fingerprint_differences(HERE, {**HERE, "threads": HERE["threads"] + 1}) == ["threads"]
    assert not same_numerics(HERE, {**HERE, "MKL_CBWR": "COMPATIBLE"})
    assert not same_numerics(HERE, None) and not same_numerics(None, None)    # no fingerprint: never "the same"
    assert same_numerics(HERE, {**HERE, "ATEN_CPU_CAPABILITY": "avx512"})     # recorded, but its effect is the key


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_fingerprint_follows_aten_cpu_capability(capability):
    """ATEN_CPU_CAPABILITY lowers the kernels torch picks; the fingerprint sees it (an emulated other machine)."""
    code = ("import json, torch; from taskloss.results.fingerprint import numerics_fingerprint; "
            "print(json.dumps([numerics_fingerprint(), torch.backends.cpu.get_cpu_capability()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "ATEN_CPU_CAPABILITY": capability})
    fp, actual = json.loads(out.stdout)
    assert fp["ATEN_CPU_CAPABILITY"] == capability and fp["cpu_capability"] == actual
    if capability == "default":
        assert actual == "DEFAULT"
    elif _cpu_has("avx2") and platform.machine() == "x86_64":
        assert actual == "AVX2"
    assert same_numerics(fp, HERE) == (actual == HERE["cpu_capability"])


# ------------------------------------------------------------------------------ cross-machine tolerances
def test_seed_spread_is_z_standard_errors_of_a_difference():
    v = [0.1, 0.3, 0.2, 0.5]
    tol = seed_spread(v)
    assert tol.rtol == 0
    assert math.isclose(tol.atol, 4.0 * np.std(v, ddof=1) * math.sqrt(2 / 4) + headlines.HEADLINE_ATOL)
    assert "4-seed" in tol.reason
    assert seed_spread(v, z=2).atol < tol.atol
    for bad, err in (([1.0], ValueError), ([1.0, float("nan")], ValueError), ("ab", TypeError)):
        with pytest.raises(err):
            seed_spread(bad)
    with pytest.raises(ValueError, match="z"):
        seed_spread(v, z=float("nan"))


def test_tolerance_needs_finite_bounds_and_a_reason():
    for kw in ({"rtol": -1.0}, {"atol": float("nan")}, {"rtol": float("inf")}, {"rtol": True}, {"reason": " "}):
        with pytest.raises(ValueError):
            Tolerance(**kw)


def _comparison(a, b, verdict):
    d = np.asarray(a) - np.asarray(b)
    return {"a": list(a), "b": list(b), "effect": float(d.mean()), "verdict": verdict, "ci_low": 0.0, "ci_high": 0.0}


def test_portable_comparison_uses_its_own_spread_and_never_reverses():
    committed = _comparison([1.0, 1.2, 0.9], [0.5, 0.6, 0.7], "better")      # effect 0.433, sd(d) 0.208
    near = _comparison([1.05, 1.1, 0.95], [0.5, 0.65, 0.7], "better")
    assert portable_difference(committed, near) is None
    assert headline_difference(committed, near) is not None                 # strict: the seeds' values differ
    moved = _comparison([1.0, 1.2, 0.9], [0.5, 0.6, 0.7 + 3.0], "inconclusive")
    assert "standard errors" in portable_difference(committed, moved)
    weaker = _comparison([1.0, 1.2, 0.6], [0.5, 0.6, 0.7], "inconclusive")
    assert portable_difference(committed, weaker) is None                  # to/from inconclusive: allowed
    reversed_ = {**near, "verdict": "worse"}
    assert "reverses" in portable_difference(committed, reversed_)
    assert "seeds" in portable_difference(committed, _comparison([1.0, 1.2], [0.5, 0.6], "better"))
    assert "not a recorded comparison" in portable_difference(committed, 0.4)


def test_portable_numbers_use_the_declared_tolerance():
    assert portable_difference(0.5, 0.5 * (1 + 5e-4)) is None              # default: the strict tolerance
    assert portable_difference(0.5, 0.52) is not None
    assert portable_difference(0.5, 0.52, Tolerance(rtol=0.05, reason="a trained model")) is None
    assert portable_difference("kfac", "adam", Tolerance(rtol=1.0, reason="x")) is not None   # strings: exact


def test_record_on_another_machine_says_so_with_both_fingerprints(tmp_path):
    committed = CommittedRun({"acc": 0.75, "loss": 2.0, "cmp": _comparison([1.0, 1.2, 0.9], [0.5, 0.6, 0.7],
                                                                           "better")}, ELSEWHERE)
    run = Run(name="00_x", dir=tmp_path, device=torch.device("cpu"), seed=0, fingerprint=HERE, committed=committed)
    with pytest.raises(HeadlineMismatch) as err:
        run.record("acc", 0.8, headline=True)
    text = str(err.value)
    assert "another machine" in text and "Another CPU" in text and HERE["cpu"] in text and "cpu_capability" in text
    assert "stale" not in text
    run.record("acc", 0.8, headline=True, across_machines=seed_spread([0.7, 0.8, 0.75]))
    with pytest.raises(HeadlineMismatch, match="a trained model"):
        run.record("loss", 3.0, headline=True, across_machines=Tolerance(rtol=0.1, reason="a trained model"))
    run.record("cmp", _comparison([1.05, 1.1, 0.95], [0.5, 0.65, 0.7], "better"), headline=True)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["fingerprint"] == HERE and saved["across_machines"]["acc"]["rtol"] == 0
    with pytest.raises(TypeError, match="Tolerance"):
        run.record("acc", 0.8, headline=True, across_machines=0.1)
    with pytest.raises(TypeError, match="bool"):
        run.record("acc", 0.8, headline="yes")


def test_a_committed_notebook_without_a_fingerprint_is_checked_across_machines(tmp_path):
    run = Run(name="00_x", dir=tmp_path, device=torch.device("cpu"), seed=0, fingerprint=HERE,
              committed=CommittedRun({"acc": 0.75}, None))
    run.record("acc", 0.76, headline=True, across_machines=Tolerance(atol=0.05, reason="trained"))
    with pytest.raises(HeadlineMismatch, match="no fingerprint recorded"):
        run.record("acc", 0.9, headline=True, across_machines=Tolerance(atol=0.05, reason="trained"))


def test_committed_run_reads_headlines_and_fingerprint(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00_x.ipynb").write_text(json.dumps(
        {"metadata": {"taskloss": {"headline": {"acc": 0.5}, "fingerprint": HERE}}, "cells": []}))
    monkeypatch.setattr(headlines, "REPO_ROOT", tmp_path)
    monkeypatch.setenv(headlines.CHECK_ENV, "1")
    assert committed_run("00_x") == CommittedRun({"acc": 0.5}, HERE)


def test_correlation_spread_is_fisher_z_standard_errors():
    tol = correlation_spread(0.3, 80)
    w = 4 * math.sqrt(2 / 77)
    assert math.isclose(tol.atol, 0.3 - math.tanh(math.atanh(0.3) - w))
    assert correlation_spread(0.3, 800).atol < tol.atol            # more points, a narrower bound
    assert correlation_spread(0.95, 80).atol < tol.atol            # near ±1 the sampling error of r shrinks
    for r, n in ((1.0, 80), (float("nan"), 80), (0.3, 3), (0.3, 80.0), (True, 80)):
        with pytest.raises(ValueError):
            correlation_spread(r, n)


def test_emulation_env_lowers_the_capability_by_one():
    assert emulation_env("AVX512") == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                       "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert emulation_env("avx2")["ATEN_CPU_CAPABILITY"] == "default"
    assert emulation_env("SVE256") == {"ATEN_CPU_CAPABILITY": "default"}
    with pytest.raises(TypeError):
        emulation_env(3)
    out = subprocess.run([sys.executable, "-m", "taskloss.results.fingerprint", "--emulate"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert dict(item.split("=", 1) for item in out) == emulation_env()
    env = {**__import__("os").environ, **emulation_env()}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    lowered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip()
    native = HERE["cpu_capability"]
    assert lowered != native or native not in ("AVX512", "AVX2")      # the emulated machine is another one
