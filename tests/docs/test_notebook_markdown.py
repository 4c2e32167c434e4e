"""The notebooks' Markdown read by the book's own parser (MyST, configured from docs/conf.py), in a second: every
``$`` must open or close math. A ``$`` left in the text is TeX the reader sees raw — for instance an equation
continued inside a list item on a line that starts with ``+ ``, which Markdown reads as a nested bullet, cutting
the ``$...$`` in two. ``make book-check`` finds the same in the browser after a full build; this runs in
``make test``. Markdown outputs (``run.say``) are read too: the book renders them with MyST.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache

import nbformat
import pytest

from taskloss.utils import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@lru_cache(maxsize=1)
def _parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    spec = importlib.util.spec_from_file_location("_taskloss_book_conf_md", REPO_ROOT / "docs" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    config = MdParserConfig(enable_extensions=set(conf.myst_enable_extensions),
                            dmath_double_inline=conf.myst_dmath_double_inline)
    return create_md_parser(config, RendererHTML)


def stray_dollars(markdown: str) -> list[str]:
    """The lines of text (outside code and math) that still hold a ``$`` once MyST has parsed ``markdown``."""
    found = []

    def walk(tokens):
        for tok in tokens:
            if tok.type == "text" and "$" in tok.content:
                found.append(tok.content)
            if tok.children:
                walk(tok.children)
    walk(_parser().parse(markdown))
    return found


def test_stray_dollars_finds_an_equation_cut_by_a_nested_bullet():
    cut = ("- *RealFormer*: one more path, so\n"
           "  $a = b\n"
           "  + c$: whatever reaches a layer is handed down.\n")
    assert stray_dollars(cut), "a '+ ' continuation line cuts the math"
    joined = ("- *RealFormer*: one more path, so\n"
              "  $a = b +\n"
              "  c$: whatever reaches a layer is handed down.\n")
    assert stray_dollars(joined) == []
    assert stray_dollars("Costs `$5` in code, $x$ and $$y$$ in math.") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_markdown_leaves_no_raw_tex(path):
    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        texts = [cell.source] if cell.cell_type == "markdown" else [
            out.get("data", {}).get("text/markdown", "") for out in cell.get("outputs", [])]
        for text in texts:
            text = "".join(text) if isinstance(text, list) else text
            problems += [f"cell {i}: {line!r}" for line in stray_dollars(text)]
    assert not problems, "\n".join(problems)
