"""Committed headline results compared with a fresh run (what makes ``--nbval-lax`` check numbers)."""
from __future__ import annotations

import json

import pytest
import torch

from taskloss.results import headlines
from taskloss.results.headlines import HeadlineMismatch, committed_headlines, headline_difference
from taskloss.results.run import Run


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
    run = Run(name="00_x", dir=tmp_path, device=torch.device("cpu"), seed=0,
              committed={"acc": 0.75, "cmp": {"effect": -0.1, "verdict": "better"}})
    run.record("acc", 0.75, headline=True)
    run.record("other", 123.0)  # not a headline: not compared
    with pytest.raises(HeadlineMismatch, match=r"'acc' of 00_x: 0.8 differs from committed 0.75.*make notebooks"):
        run.record("acc", 0.8, headline=True)
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
