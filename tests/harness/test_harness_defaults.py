"""The harness's defaults against those of the classes and functions its rules wrap: every difference is listed in
``rules.DEFAULT_OVERRIDES`` (derived here from the signatures, so the table cannot drift), and
``docs/vocabulary.md`` prints that table."""
from __future__ import annotations

import inspect
import math
import re

import pytest

from taskloss.harness.rules import DEFAULT_OVERRIDES, OWN_MEANING, RULES
from taskloss.utils import REPO_ROOT


def _derived(name: str) -> dict[str, tuple]:
    spec = RULES[name]
    sig = inspect.signature(spec.cls.__init__)
    hp = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    hp.update(spec.defaults)
    out: dict[str, tuple] = {}
    for wrapped in spec.wraps:
        params = inspect.signature(wrapped).parameters
        for k, v in hp.items():
            if k in params and k not in out and (name, k) not in OWN_MEANING:
                d = params[k].default
                if d is inspect.Parameter.empty:
                    out[k] = (v, "required")
                elif d != v:
                    out[k] = (v, d)
    return out


@pytest.mark.parametrize("name", list(RULES))
def test_every_default_that_differs_from_the_wrapped_class_is_listed(name):
    assert RULES[name].wraps or name == "newton", f"rule {name!r} names nothing it wraps"
    assert _derived(name) == DEFAULT_OVERRIDES[name]


def test_the_table_covers_exactly_the_registered_rules():
    assert set(DEFAULT_OVERRIDES) == set(RULES)


def test_the_vocabulary_page_prints_the_table():
    text = (REPO_ROOT / "docs" / "vocabulary.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(\w+)` \| `(\w+)` \| (.+?) \| (.+?) \|$", line)
        if m:
            rows.setdefault(m[1], {})[m[2]] = (m[3], m[4])

    def show(v):
        return "required" if v == "required" else ("∞" if v == math.inf else f"`{v!r}`")

    want = {r: {k: (show(a), show(b)) for k, (a, b) in d.items()} for r, d in DEFAULT_OVERRIDES.items() if d}
    assert rows == want
