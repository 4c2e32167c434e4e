"""The code a reader copies from the guide runs as written: every ``python`` block of docs/guide/*.md and of
README.md, each in a fresh namespace (on a CPU, in about a second each), without a warning; every example of the
guide prints what the page shows under it (``Prints:``; refreshed with ``make guide-outputs``,
docs/guide_outputs.py)."""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings

import pytest

from taskloss.utils import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "docs"))
import guide_outputs  # noqa: E402

PAGES = sorted((REPO_ROOT / "docs" / "guide").glob("*.md")) + [REPO_ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, block in enumerate(BLOCK.findall(page.read_text(encoding="utf-8"))):
            out.append((f"{page.relative_to(REPO_ROOT)}[{i}]", block))
    return out


def test_the_guide_has_examples():
    names = [name for name, _ in python_blocks()]
    assert sum(n.startswith("docs/guide/training_loop.md") for n in names) >= 4, names


@contextlib.contextmanager
def _warnings_and_log_records():
    """Python warnings and WARNING log records (the root logger's and transformers', which does not propagate)
    raised inside the block."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Collect(level=logging.WARNING)
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield records
        records += [f"{w.category.__name__}: {w.message}" for w in caught]
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


@pytest.mark.parametrize("name, code", python_blocks(), ids=[n for n, _ in python_blocks()])
def test_example_runs(name, code, capsys):
    with _warnings_and_log_records() as noise:
        exec(compile(code, name, "exec"), {"__name__": "__guide__"})
    out = capsys.readouterr()
    assert out.out.strip(), f"{name} prints nothing: an example should show its result"
    assert not noise, f"{name} warns: {noise}"


GUIDE_EXAMPLES = [e for page in guide_outputs.GUIDE_PAGES for e in guide_outputs.examples(page)]


def test_every_guide_example_shows_its_output():
    missing = [name for name, _, expected in GUIDE_EXAMPLES if expected is None]
    assert not missing, f"no Prints: block under {missing}: run `make guide-outputs`"


@pytest.mark.parametrize("name, code, expected", [e for e in GUIDE_EXAMPLES if e[2] is not None],
                         ids=[e[0] for e in GUIDE_EXAMPLES if e[2] is not None])
def test_guide_example_prints_what_the_page_shows(name, code, expected):
    diff = guide_outputs.output_difference(expected, guide_outputs.run_example(name, code))
    assert diff is None, f"{name} {diff}: if the change is intended, refresh the page with `make guide-outputs`"


def test_output_comparison_allows_one_unit_of_the_last_digit_and_nothing_else():
    diff = guide_outputs.output_difference
    assert diff("loss 0.705", "loss 0.706\n") is None and diff("loss 0.705", "loss 0.704") is None
    assert diff("loss 0.705", "loss 0.707") and diff("loss 0.705", "cost 0.705") and diff("a 1.0 of 8", "a 1.0 of 9")
    assert diff("x 1e-3", "x 1.5e-3") is None and diff("x 1e-3", "x 3e-3")


@pytest.mark.parametrize("page", PAGES[:-1] + [REPO_ROOT / "docs" / "chapters.yaml", REPO_ROOT / "docs" / "index.md",
                                               REPO_ROOT / "CHANGELOG.md"], ids=lambda p: p.name)
def test_named_taskloss_objects_exist(page):
    """Every ``taskloss.x.y`` the guide names resolves (the README is checked by tests/test_layout.py)."""
    from taskloss.utils import resolve_name

    bad = []
    for ref in {r.rstrip(".") for r in re.findall(r"\btaskloss(?:\.[A-Za-z_]\w*)+", page.read_text(encoding="utf-8"))}:
        try:
            resolve_name(ref)
        except LookupError:
            bad.append(ref)
    assert not bad, f"{page.name} names objects that do not exist: {sorted(bad)}"
