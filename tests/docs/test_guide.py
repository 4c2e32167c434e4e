"""The code a reader copies from the guide runs as written: every ``python`` block of docs/guide/*.md and of
README.md, each in a fresh namespace (on a CPU, in about a second each)."""
from __future__ import annotations

import re

import pytest

from taskloss.utils import REPO_ROOT

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


@pytest.mark.parametrize("name, code", python_blocks(), ids=[n for n, _ in python_blocks()])
def test_example_runs(name, code, capsys):
    exec(compile(code, name, "exec"), {"__name__": "__guide__"})
    assert capsys.readouterr().out.strip(), f"{name} prints nothing: an example should show its result"


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
