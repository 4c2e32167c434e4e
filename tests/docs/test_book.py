"""The book (``make book``): its generators and link rules against small known inputs, then one real build of the
site with warnings as errors, checked page by page (every internal link resolves, nothing loads from outside the
site, each notebook page links the API entries it uses and each API entry its notebook), and finally two pages
opened in headless Chromium (skipped where Debian's ``chromium`` is not installed; ``make book-check`` installs it).

The first part takes seconds and runs in ``make test``, beside the quick checks of every docstring the reference
shows (tests/docs/test_docstrings.py) and of the notebooks' Markdown (tests/docs/test_notebook_markdown.py). The
build takes about a minute on 2 cores, so the tests of the built site are skipped there: ``.ci/run`` builds the book
after ``make test``, ``make book-check`` builds it and runs them on it (TASKLOSS_BOOK_SITE), and
``TASKLOSS_BOOK_BUILD=1`` makes them build one of their own.
"""
from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from taskloss.utils import REPO_ROOT

DOCS = REPO_ROOT / "docs"
sys.path[:0] = [str(DOCS / "_ext"), str(DOCS)]

import book_chapters  # noqa: E402
import book_figures  # noqa: E402
import book_links  # noqa: E402
import book_sources  # noqa: E402
import check_book  # noqa: E402

STEMS = {"02": "02_importance_sampling_and_mgs", "05": "05_policy_gradient_vs_zeroth_order", "09": "09_emo_loss"}


# -- generators and link rules -------------------------------------------------------------------------------------

def test_every_committed_notebook_is_a_chapter_and_every_chapter_a_notebook():
    stems = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    chapters = [ch.stem for ch in book_chapters.load_chapters()]
    assert stems and set(chapters) == stems, (sorted(stems - set(chapters)), sorted(set(chapters) - stems))
    assert chapters == sorted(chapters)                               # reading order = notebook numbers


def test_repository_markdown_keeps_external_links_and_points_notebook_links_at_pages():
    cell = "[Ren](https://arxiv.org/abs/1) see [`09`](notebooks/09_emo_loss.ipynb) and [data](data/README.md)"
    assert book_sources._site_markdown(cell) == "[Ren](https://arxiv.org/abs/1) see [`09`](09_emo_loss.ipynb) and data"


def test_chapter_box_links_the_notebook_files_and_hosted_services_only_for_a_known_address(tmp_path):
    ch = book_chapters.load_chapters()[0]
    box = book_sources._chapter_box(ch, None)
    assert f"{{download}}`{ch.stem}.ipynb <../../notebooks/{ch.stem}.ipynb>`" in box
    assert f"{{download}}`{ch.stem}.py <../../notebooks/{ch.stem}.py>`" in box
    assert "colab" not in box.lower() and "binder" not in box.lower()
    assert "**Question.**" in box and "**In one line.**" in box and "**Runtime of the committed run.**" in box
    box = book_sources._chapter_box(ch, "https://github.com/someone/taskloss")
    assert f"https://colab.research.google.com/github/someone/taskloss/blob/HEAD/notebooks/{ch.stem}.ipynb" in box
    assert f"https://mybinder.org/v2/gh/someone/taskloss/HEAD?labpath=notebooks/{ch.stem}.ipynb" in box
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n')
    assert book_chapters.repository_url(pyproject) is None                   # no address is guessed
    pyproject.write_text('[project]\nname = "x"\n[project.urls]\nRepository = "https://github.com/a/b.git"\n')
    assert book_chapters.repository_url(pyproject) == "https://github.com/a/b"


@pytest.mark.parametrize("line, expected", [
    ("Notebooks: 02_importance_sampling_and_mgs, 09_emo_loss.",
     "Notebooks: :doc:`02_importance_sampling_and_mgs </notebooks/02_importance_sampling_and_mgs>`, "
     ":doc:`09_emo_loss </notebooks/09_emo_loss>`."),
    ("Derived in notebook 05.", "Derived in notebook :doc:`05 </notebooks/05_policy_gradient_vs_zeroth_order>`."),
    ("notebooks 02–09 and 5 more", "notebooks :doc:`02 </notebooks/02_importance_sampling_and_mgs>`–"
                                   ":doc:`09 </notebooks/09_emo_loss>` and 5 more"),
    ("notebooks 02, 05 and 09)", "notebooks :doc:`02 </notebooks/02_importance_sampling_and_mgs>`, "
                                 ":doc:`05 </notebooks/05_policy_gradient_vs_zeroth_order>` and "
                                 ":doc:`09 </notebooks/09_emo_loss>`)"),
    # paths, literals, roles and names of notebooks that do not exist stay as written
    ("``notebooks/09_emo_loss.py`` and notebooks/09_emo_loss.ipynb", None),
    (":func:`taskloss.x` in 09_emo_loss.py, notebook 07, 31_nothing", None),
])
def test_docstring_notebook_names_become_links(line, expected):
    assert book_links.link_notebooks_in_line(line, STEMS) == (expected or line)


def test_docstring_links_skip_literal_blocks():
    lines = ["Derived in notebook 09.", "", "Usage::", "", "    notebook 09 here", "", "After notebook 09."]
    book_links.process_docstring(None, "function", "f", None, {}, lines)
    assert lines[0].count(":doc:") == 1 and lines[4] == "    notebook 09 here" and lines[6].count(":doc:") == 1


def test_summary_cuts_at_a_period_outside_literals():
    def f():
        """The solution ``δ`` of ``min gᵀδ  s.t.  ½ δᵀFδ ≤ ε``: a step. More text.

        Body."""
    assert book_sources.summary(f) == "The solution ``δ`` of ``min gᵀδ s.t. ½ δᵀFδ ≤ ε``: a step."


def test_references_follow_reexports_to_the_public_entry():
    assert book_sources.documented_target("taskloss.search.mgs.MGS") == ("taskloss.search.MGS", "class")
    assert book_sources.documented_target("taskloss.search.MGS.step") == ("taskloss.search.MGS.step", "meth")
    assert book_sources.documented_target("taskloss.losses.emo_kernel._FusedEMOLoss") is None   # private: no entry
    assert book_sources.documented_target("taskloss.search.NoSuchThing") is None
    assert book_sources.documented_target("taskloss.search.mgs.SIGMA_MODES") == ("taskloss.search.SIGMA_MODES", "data")
    assert "taskloss.curvature.natural_gradient" in book_sources.all_collided_modules()   # module and function


def test_notebook_uses_reads_imports_calls_and_prose():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# T\n\nThe step is `taskloss.losses.emo_loss`; modules such as "
                                      "`taskloss.curvature.fisher` and `taskloss.curvature.natural_gradient` "
                                      "(also a function's name) are linked in place."),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport taskloss.results\nfrom taskloss import curvature\n"
                                  "from taskloss.search import MGS as Search\n"
                                  "run = taskloss.results.start('x')\nF = curvature.ggn_matrix(m, x, y)"),
    ])
    assert book_sources.notebook_uses(nb) == sorted([
        ("taskloss.losses.emo_loss", "func"), ("taskloss.results.start", "func"),
        ("taskloss.curvature.ggn_matrix", "func"), ("taskloss.search.MGS", "class")])


def _report(**changes) -> dict:
    clean = {"mathjax": True, "math_elements": 2, "math_unrendered": 0, "mjx_containers": 2, "mjx_errors": [],
             "raw_tex": [], "images": [{"src": "file:///a.png", "width": 640}], "links": [], "uses_links": [],
             "requests": ["file:///x/_static/mathjax/tex-chtml.js"], "failed_requests": [], "script_errors": [],
             "console_errors": []}
    return {**clean, **changes}


def test_browser_check_rules_flag_each_failure(tmp_path):
    assert check_book.problems(tmp_path, "search.html", _report()) == []
    found = check_book.problems(tmp_path, "api/x.html", _report(
        math_unrendered=1, mjx_containers=1, raw_tex=["$$"], mjx_errors=["Undefined control sequence \\foo"],
        images=[{"src": "file:///gone.png", "width": 0}], requests=["https://cdn.example/mathjax.js"],
        links=[{"href": (tmp_path / "missing.html").as_uri(), "text": "", "cls": ""}]))
    text = "\n".join(found)
    for expected in ("1 of 2 math elements were not rendered", "raw TeX", "TeX errors", "image did not load",
                     "request outside the site", "no such file", "links no notebook page"):
        assert expected in text, (expected, found)
    hashed = _report(images=[{"src": "file:///x/_images/ab12.png", "width": 640, "alt": "../_images/ab12.png"}],
                     uses_links=["file:///x/api/taskloss.search.html#taskloss.search.MGS"])
    assert any("without a caption" in p for p in check_book.problems(tmp_path, "notebooks/01_x.html", hashed))
    captioned = {**hashed, "images": [{**hashed["images"][0], "alt": "What to see: the error falls."}]}
    assert check_book.problems(tmp_path, "notebooks/01_x.html", captioned) == []


# -- one real build ------------------------------------------------------------------------------------------------

def _has_mathjax_source() -> bool:
    return bool(os.environ.get("TASKLOSS_MATHJAX") or shutil.which("npm")
                or (DOCS / "_build" / "mathjax" / "node_modules" / "mathjax" / "es5" / "tex-chtml.js").is_file())


BUILT_SITE = os.environ.get("TASKLOSS_BOOK_SITE", "")
BUILD = os.environ.get("TASKLOSS_BOOK_BUILD") == "1"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site: the one ``make book-check`` has just built (TASKLOSS_BOOK_SITE), or a fresh build into a
    temporary folder with TASKLOSS_BOOK_BUILD=1; otherwise the tests below are skipped."""
    if BUILT_SITE:
        path = Path(BUILT_SITE)
        assert (path / "index.html").is_file(), f"TASKLOSS_BOOK_SITE={BUILT_SITE} holds no built book"
        return path
    if not BUILD:
        pytest.skip("a full build of the book takes about 1.5 min on 2 cores, too long for make test: "
                    "`make book-check` runs these tests on the site it builds (or set TASKLOSS_BOOK_BUILD=1)")
    if not _has_mathjax_source():
        pytest.skip("the book serves MathJax from npm: needs npm (or TASKLOSS_MATHJAX)")
    out = tmp_path_factory.mktemp("book") / "html"
    env = {**os.environ, "TASKLOSS_BOOK_EXECUTE": "0", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-j", "2", "-q",
                           str(DOCS), str(out)], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"the book does not build cleanly:\n{proc.stderr[-6000:]}"
    return out


def test_every_notebook_and_subpackage_has_a_page(site):
    import pkgutil

    import taskloss
    stems = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    pages = {p.stem for p in (site / "notebooks").glob("[0-9][0-9]_*.html")}
    assert stems and pages == stems, (sorted(stems - pages), sorted(pages - stems))
    packages = {f"taskloss.{m.name}" for m in pkgutil.iter_modules(taskloss.__path__) if not m.name.startswith("_")}
    api = {p.stem for p in (site / "api").glob("taskloss.*.html")}
    assert api == packages, (sorted(packages - api), sorted(api - packages))
    index = (site / "api" / "index.html").read_text(encoding="utf-8") + \
        (site / "notebooks" / "index.html").read_text(encoding="utf-8")
    assert all(f'href="{name}.html"' in index for name in api | stems)        # and each is in its table of contents


def _hrefs(page: Path) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'<a [^>]*href="([^"]+)"', page.read_text(encoding="utf-8"))]


def test_every_internal_link_of_the_site_resolves(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    broken = []
    for page in pages:
        links = [(page.parent / unquote(urlparse(h).path)).resolve().as_uri() + (f"#{urlparse(h).fragment}"
                 if urlparse(h).fragment else "") for h in _hrefs(page)
                 if not urlparse(h).scheme and not h.startswith("#") and urlparse(h).path]
        links += [page.as_uri() + h for h in _hrefs(page) if h.startswith("#") and len(h) > 1]
        broken += [f"{page.relative_to(site)}: {b}" for b in check_book.broken_internal_links(site, links)]
    assert not broken, "\n".join(broken[:20])


def test_nothing_loads_from_outside_the_site(site):
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote = re.findall(r'<(?:script|img|link|iframe)\b[^>]*(?:src|href)="((?:https?:)?//[^"]+)"', text)
        assert not remote, f"{page.relative_to(site)} loads {remote}"
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert "_static/mathjax/tex-chtml.js" in (site / "notebooks" / "06_natural_gradient.html").read_text()


def test_notebook_pages_follow_the_chapters_with_their_box_and_their_uses(site):
    chapters = book_chapters.load_chapters()
    index = (site / "notebooks" / "index.html").read_text(encoding="utf-8")
    positions = [index.find(f'href="{ch.stem}.html"') for ch in chapters]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
    for ch in chapters:
        page = (site / "notebooks" / f"{ch.stem}.html").read_text(encoding="utf-8")
        glance = re.search(r'taskloss-glance.*?</div>', page, re.S)
        assert glance and "Question." in glance.group(0) and "In one line." in glance.group(0), ch.stem
        words = re.sub(r"[`*$\\]|\[|\]\([^)]*\)", "", ch.scope).split()[:4]
        shown = html.unescape(re.sub(r"<[^>]+>", "", glance.group(0)))
        shown = shown.translate(str.maketrans("’‘“”", "''\"\""))                  # Sphinx's smart quotes undone
        assert " ".join(words) in shown, (ch.stem, words)
        downloads = re.findall(r'class="reference download internal"[^>]*href="([^"]+)"', glance.group(0))
        assert [Path(d).name for d in downloads] == [f"{ch.stem}.ipynb", f"{ch.stem}.py"], (ch.stem, downloads)
        assert all((site / "notebooks" / unquote(d)).is_file() for d in downloads)
        uses = re.search(r'taskloss-uses.*?</ul>', page, re.S)
        assert uses and re.search(r'href="\.\./api/taskloss\.\w+\.html#taskloss\.', uses.group(0)), ch.stem


def test_every_figure_has_its_caption_as_alt_text_and_plotting_code_is_collapsed(site):
    for ch in book_chapters.load_chapters():
        page = (site / "notebooks" / f"{ch.stem}.html").read_text(encoding="utf-8")
        nb = nbformat.read(ch.notebook, as_version=4)
        expected = [book_figures.alt_text(c) for _, _, c in book_figures.figure_captions(nb)]
        alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)" src="\.\./_images/', page)]
        assert alts == expected, ch.stem
        tagged = sum("hide-input" in c.metadata.get("tags", []) for c in nb.cells)
        assert page.count("tag_hide-input") == tagged, ch.stem
    page = (site / "notebooks" / "14_realformer.html").read_text(encoding="utf-8")
    assert page.count('class="taskloss-caption"') == 3


def test_api_entries_link_the_notebook_that_derives_them(site):
    page = (site / "api" / "taskloss.search.html").read_text(encoding="utf-8")
    start = page.index('id="taskloss.search.MGS"')
    entry = page[start:page.index('id="taskloss.search.', start + 1)]        # the class docstring, up to its members
    assert 'href="../notebooks/02_importance_sampling_and_mgs.html"' in entry
    stems = [p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")]
    for api_page in (site / "api").glob("taskloss.*.html"):
        text = api_page.read_text(encoding="utf-8")
        text = text[text.index('<article'):text.index('</article>')]
        # what is left once links, code and attributes are gone: a notebook named there was not turned into a link
        plain = re.sub(r"<a\b.*?</a>|<code\b.*?</code>|<pre\b.*?</pre>|<[^>]+>", " ", text, flags=re.S)
        unlinked = sorted({s for s in stems if re.search(rf"\b{s}\b", plain)})
        assert not unlinked, f"{api_page.name} names notebooks without a link: {unlinked}"
    assert 'href="../notebooks/' in (site / "api" / "taskloss.curvature.html").read_text(encoding="utf-8")


# -- in a browser --------------------------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(check_book.find_browser() is None,
                                    reason="Debian's chromium is not installed (make book-check installs it)")


@needs_chromium
def test_pages_render_in_chromium(site, tmp_path):
    results = check_book.check(site, list(check_book.DEFAULT_PAGES), tmp_path)
    assert results == {page: [] for page in check_book.DEFAULT_PAGES}, results
    assert all((tmp_path / f"{p.replace('/', '__').removesuffix('.html')}.png").stat().st_size > 10_000
               for p in check_book.DEFAULT_PAGES)


@needs_chromium
@pytest.mark.skipif(not (BUILT_SITE or BUILD), reason="~12 s in Chromium (it waits out the MathJax timeout): run by "
                    "`make book-check` with the other browser tests")
def test_chromium_check_fails_on_a_broken_page(tmp_path):
    site = tmp_path / "site"
    (site / "notebooks").mkdir(parents=True)
    (site / "notebooks" / "00_broken.html").write_text(
        '<html><body><p>Raw math $$x^2$$ and <span class="math">\\(y\\)</span></p>'
        '<img src="../_images/missing.png" alt="../_images/missing.png"><a href="gone.html">gone</a></body></html>')
    results = check_book.check(site, ["notebooks/00_broken.html"], tmp_path / "check")
    text = "\n".join(results["notebooks/00_broken.html"])
    for expected in ("MathJax did not load", "not rendered", "raw TeX", "image did not load", "no such file",
                     "Uses", "without a caption as alt text"):
        assert expected in text, (expected, text)


# -- titles, download and launch buttons (issue 40) ----------------------------------------------------------------

def _conf():
    import importlib.util

    spec = importlib.util.spec_from_file_location("taskloss_book_conf", DOCS / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_title_math_is_written_in_unicode():
    conf = _conf()
    assert conf.tex_to_unicode(r"\prod f_t") == "∏ fₜ"
    assert conf.tex_to_unicode(r"\theta_{t+1} = \theta_t - \eta\, g") == "θₜ₊₁ = θₜ - η g"
    assert conf.tex_to_unicode(r"x^{2}") == "x²" and conf.tex_to_unicode(r"f_{ab}") == "f_ab"   # no subscript b
    titles = [line for p in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
              for line in p.read_text(encoding="utf-8").splitlines() if line.startswith("# # ")]
    assert len(titles) >= 17
    for title in titles:
        for tex in re.findall(r"\$([^$]+)\$", title):
            text = conf.tex_to_unicode(tex)
            assert not re.search(r"[\\{}$]", text), (title, text)


def test_download_button_on_and_launch_buttons_only_for_a_known_address():
    conf = _conf()
    assert conf.html_theme_options["use_download_button"] is True and conf.html_copy_source is True
    assert conf.html_sourcelink_suffix == ""      # a chapter downloads as NN_topic.ipynb, not .ipynb.txt
    if conf.REPOSITORY_URL:
        assert conf.html_theme_options["launch_buttons"] and conf.html_theme_options["repository_url"]
    else:       # no public address yet: no launch button, no repository button
        assert conf.html_theme_options["launch_buttons"] == {}
        assert "repository_url" not in conf.html_theme_options


def test_static_check_flags_raw_tex_in_the_navigation(tmp_path):
    (tmp_path / "a.html").write_text('<title>13 · The ∏ fₜ argument</title><nav class="bd-docs-nav">'
                                     '<a href="b.html">13 · The ∏ fₜ argument</a></nav><p>\\(x\\)</p>')
    assert check_book.raw_tex_in_navigation(tmp_path) == {}       # math in the body is MathJax's business
    (tmp_path / "b.html").write_text('<nav><a href="a.html">13 · The \\(\\prod f_t\\) argument</a></nav>')
    assert list(check_book.raw_tex_in_navigation(tmp_path)) == ["b.html"]
    # a page's own "On this page" table of contents shows its section headings' math, which MathJax renders there when
    # the page loads it; without MathJax, or in the sidebar of other pages' titles, it is raw TeX
    own = ('<nav aria-label="Page"><a href="#s">4 · Newton\'s step <span class="math">\\(\\alpha H^{-1}\\)</span></a>'
           '</nav>')
    (tmp_path / "b.html").write_text('<script src="_static/mathjax/tex-chtml.js"></script>' + own)
    assert check_book.raw_tex_in_navigation(tmp_path) == {}
    (tmp_path / "b.html").write_text(own)
    assert list(check_book.raw_tex_in_navigation(tmp_path)) == ["b.html"]


def test_no_raw_tex_in_any_pages_navigation(site):
    assert check_book.raw_tex_in_navigation(site) == {}
