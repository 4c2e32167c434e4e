"""The notebook table of README.md and docs/results.md are generated from docs/chapters.yaml and the committed
notebooks' metadata (docs/expected_results.py): they must be up to date, their numbers must be the notebooks', and
every figure of every notebook has a caption under it."""
from __future__ import annotations

import dataclasses
import json
import sys

import nbformat
import pytest

from taskloss.utils import REPO_ROOT

sys.path[:0] = [str(REPO_ROOT / "docs" / "_ext"), str(REPO_ROOT / "docs")]

import book_chapters  # noqa: E402
import book_figures  # noqa: E402
import expected_results  # noqa: E402

CHAPTERS = book_chapters.load_chapters()


def test_generated_files_are_up_to_date():
    stale = [p.relative_to(REPO_ROOT) for p, text in expected_results.generated(CHAPTERS).items()
             if p.read_text(encoding="utf-8") != text]
    assert not stale, f"{stale} out of date: run python docs/expected_results.py"


def test_every_headline_renders_from_the_committed_notebook():
    for ch in CHAPTERS:
        text = book_chapters.render_headline(ch)
        assert "{" not in text and text.strip(), ch.stem


def test_headline_templates_read_values_and_comparison_fields():
    ch = book_chapters.Chapter("00_x", "q", "s", "ppl {a/ppl:.1f}, {b/cmp.verdict} by {b/cmp.effect:+.2f}", "", "", "")
    values = {"a/ppl": 155.29, "b/cmp": {"verdict": "better", "effect": -0.123}}
    assert book_chapters.render_headline(ch, values) == "ppl 155.3, better by -0.12"
    with pytest.raises(KeyError, match="'a/missing'.*does not record"):
        book_chapters.render_headline(dataclasses.replace(ch, headline="{a/missing}"), values)


def test_runtime_is_read_from_the_metadata_or_not_recorded():
    assert book_chapters.runtime_text({}) == "not recorded"
    assert book_chapters.runtime_text({"runtime": {"wall_s": 84.2}}) == "not recorded"           # incomplete
    assert book_chapters.runtime_text({"runtime": {"wall_s": 84.2, "cpu_s": 71.0, "threads": 1}}) == \
        "84 s wall, 71 s CPU, 1 thread"
    assert book_chapters.runtime_text({"runtime": {"wall_s": 600.0, "cpu_s": 1200.0, "threads": 2}}) == \
        "10.0 min wall, 20.0 min CPU, 2 threads"


def test_the_tables_show_the_notebooks_numbers(tmp_path, monkeypatch):
    """A synthetic notebook with a runtime and a fingerprint: both generated views carry its values."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["taskloss"] = {"headline": {"x/acc": 0.9137, "x/cmp": {"verdict": "worse", "effect": 0.5,
                                                                      "ci_low": 0.1, "ci_high": 0.9, "n": 3,
                                                                      "name": "a", "baseline": "b"}},
                               "runtime": {"wall_s": 42.0, "cpu_s": 40.0, "threads": 1},
                               "fingerprint": {"cpu": "avx2", "blas": "mkl"}}
    path = tmp_path / "notebooks" / "00_synthetic.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(nb), encoding="utf-8")
    ch = book_chapters.Chapter("00_synthetic", "What?", "[S](https://example.org)", "accuracy {x/acc:.3f}",
                               "Everything.", "S.", "It worked.")
    monkeypatch.setattr(book_chapters, "NOTEBOOKS", path.parent)
    table = expected_results.readme_table([ch])
    page = book_chapters.results_page([ch])
    assert "| accuracy 0.914 | 42 s wall, 40 s CPU, 1 thread |" in table
    assert "**worse**: a − b = 0.5 [0.1, 0.9], 3 seeds" in page and "cpu avx2, blas mkl" in page


def test_readme_markers_are_required():
    with pytest.raises(ValueError, match="markers"):
        expected_results.with_table("# no table here\n", "| x |")


@pytest.mark.parametrize("ch", CHAPTERS, ids=lambda c: c.stem)
def test_every_figure_has_a_caption(ch):
    nb = nbformat.read(ch.notebook, as_version=4)
    missing = [f"cell {ci}, output {oi}" for ci, oi, caption in book_figures.figure_captions(nb) if caption is None]
    assert not missing, f"{ch.stem}: figures without a caption under them: {missing}"
