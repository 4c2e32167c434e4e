"""Shared test configuration.

Property tests (hypothesis) run *derandomized* by default: the same examples on every run, so a fresh-clone CI
run is deterministic and a failure reproduces. ``HYPOTHESIS_PROFILE=explore make test`` draws fresh random
examples (more of them) to hunt for new counterexamples; add any it finds as an explicit ``@example``.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tok():
    """The compact tokenizer of the default corpus (built once per test process, cached on disk)."""
    from taskloss.datasets import get_tokenizer

    return get_tokenizer()
