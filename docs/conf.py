"""Sphinx configuration of the taskloss book: the committed notebooks (MyST-NB, outputs as committed) and the
package reference (autodoc), one static site that reads offline.

Build with ``make book`` (→ docs/_build/html/index.html). The pages under ``docs/notebooks/`` and ``docs/api/`` are
generated at each build by ``docs/_ext/book_sources.py`` from ``docs/chapters.yaml``, ``notebooks/*.ipynb`` and
the package's ``__all__`` lists; they are git-ignored. Environment variables:

- ``TASKLOSS_BOOK_EXECUTE=1`` (``make book EXECUTE=1``): execute every notebook instead of showing its committed
  outputs.
- ``TASKLOSS_MATHJAX``: a folder holding MathJax 3's ``es5`` files, used instead of the npm-installed copy that
  ``docs/_ext/book_mathjax.py`` keeps in ``docs/_build/mathjax``.

Launch buttons (Binder, Colab) and the repository button follow one setting, ``Repository`` in ``pyproject.toml``'s
``[project.urls]`` (read by ``book_chapters.repository_url``, as the chapters' hosted links are): absent (no public
address yet) leaves them off. A page title's math is written in Unicode
(:func:`tex_to_unicode`): the title also appears in the sidebar of every other page, most of which load no MathJax.
"""
from __future__ import annotations

import builtins
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "taskloss"
author = "taskloss contributors"
copyright = "taskloss contributors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "book_mathjax",
    "book_sources",
    "book_links",
    "book_figures",
]

root_doc = "index"
# results.md is written for repository browsers (its links point at notebooks/); the book has its own copy,
# notebooks/results.md, whose links point at the chapters.
exclude_patterns = ["_build", "_ext", ".gitignore", "**.ipynb_checkpoints", "results.md"]
# The site must read offline: no intersphinx (it downloads inventories); references to other libraries render as
# code (see nitpick_ignore_regex), references to taskloss must resolve.
nitpicky = True
_BUILTIN_EXCEPTIONS = "|".join(name for name, value in vars(builtins).items()
                               if isinstance(value, type) and issubclass(value, BaseException))
_EXTERNAL = ("(" + "|".join(sorted(sys.stdlib_module_names - {"this"})) + "|"
             r"torch|numpy|np|scipy|sklearn|transformers|matplotlib|plt|tqdm|yaml|papermill|nbformat|jupytext|"
             r"rapidfuzz|sacrebleu|"
             r"nn|F)")
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL + r"(\..+)?"),
    # unqualified names of the standard library, PyTorch and NumPy as they appear in signatures and napoleon types
    (r"py:.*", r"(Tensor|Module|Parameter|Optimizer|Generator|device|dtype|Size|ndarray|DataFrame|Figure|Axes|"
               r"Path|Any|Callable|Iterable|Iterator|Sequence|Mapping|MutableMapping|Literal|Optional|Union|"
               r"NamedTuple|TypeVar|Self|PathLike|ArrayLike|PreTrainedModel|PreTrainedTokenizerBase)"),
    (r"py:.*", r"(None|True|False|int|float|complex|str|bytes|bool|dict|list|tuple|set|frozenset|object|type|"
               r"callable|iterable|optional|sequence|array|array_like|array-like|scalar|slice|range|property|"
               r"classmethod|staticmethod|ellipsis|NoneType)"),
    # Python's exceptions, alone or as "TypeError / ValueError" in a napoleon Raises entry
    (r"py:.*", rf"({_BUILTIN_EXCEPTIONS})(\s*(/|,|or|and)\s*({_BUILTIN_EXCEPTIONS}))*"),
]

# -- MyST / MyST-NB ------------------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# "$$...$$" inside a paragraph is display math, as Jupyter shows it
myst_dmath_double_inline = True
nb_execution_mode = "force" if os.environ.get("TASKLOSS_BOOK_EXECUTE") == "1" else "off"
nb_execution_timeout = 1800
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# Progress bars are stored as widgets with a text fallback: show the text, load no widget JavaScript (it comes from
# a CDN and the site must work offline).
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]
nb_merge_streams = True
# Markdown outputs (run.say) carry $math$: parse them with MyST, not plain CommonMark
nb_render_markdown_format = "myst"

# -- autodoc ------------------------------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
add_module_names = False
python_maximum_signature_line_length = 100

# -- HTML ---------------------------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "taskloss"
html_static_path = ["_static"]
html_css_files = ["book.css"]
# The one setting for the project's public address (see the module docstring): "" until pyproject.toml names one.
from book_chapters import repository_url  # noqa: E402

REPOSITORY_URL = repository_url() or ""
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    # the download button offers each page's source: a chapter's .ipynb (outputs as committed), a guide's .md
    "use_download_button": True,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "launch_buttons": ({"binderhub_url": "https://mybinder.org", "colab_url": "https://colab.research.google.com",
                        "notebook_interface": "jupyterlab"} if REPOSITORY_URL else {}),
}
if REPOSITORY_URL:
    html_theme_options.update(repository_url=REPOSITORY_URL, repository_branch="main", path_to_docs="docs",
                              use_repository_button=True)
html_last_updated_fmt = None
html_copy_source = True     # the download button's files (_sources/), under their own names (no .txt added)
html_sourcelink_suffix = ""
html_show_sourcelink = False

# -- math in titles -----------------------------------------------------------------------------------------------
_TEX_SYMBOLS = {"prod": "∏", "sum": "∑", "int": "∫", "partial": "∂", "nabla": "∇", "infty": "∞", "cdot": "·",
                "times": "×", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "approx": "≈", "neq": "≠", "to": "→",
                "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε", "varepsilon": "ε",
                "eta": "η", "theta": "θ", "lambda": "λ", "mu": "μ", "sigma": "σ", "tau": "τ", "phi": "φ", "pi": "π",
                "rho": "ρ", "omega": "ω", "ell": "ℓ", "mathcal": "", "operatorname": "", "mathrm": "", "mathbf": ""}
_SUBSCRIPTS = dict(zip("0123456789+-=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))
_SUPERSCRIPTS = dict(zip("0123456789+-=()in", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁱⁿ"))


def tex_to_unicode(tex: str) -> str:
    """The inline TeX of a title as plain Unicode text (``\\prod f_t`` → ``∏ fₜ``): symbols and Greek letters
    mapped, sub- and superscripts as Unicode where every character has one (else ``_x``/``^x`` kept), braces and
    spacing commands dropped."""
    text = re.sub(r"\\([A-Za-z]+)", lambda m: _TEX_SYMBOLS.get(m.group(1), m.group(1)), tex)
    text = re.sub(r"\\[,;:!]", " ", text)

    def script(table, mark):
        def sub(m):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            return "".join(table[c] for c in body) if all(c in table for c in body) else f"{mark}{body}"
        return sub
    text = re.sub(r"_(?:\{([^{}]*)\}|(\w))", script(_SUBSCRIPTS, "_"), text)
    text = re.sub(r"\^(?:\{([^{}]*)\}|(\w))", script(_SUPERSCRIPTS, "^"), text)
    text = text.replace("{", "").replace("}", "")
    return re.sub(r"\s+", " ", text).strip()


def _unicode_math_in_title(app, doctree) -> None:
    """Replace the math of a page's title (its first section title) by :func:`tex_to_unicode` text, before Sphinx
    collects the title for the navigation of every page."""
    from docutils import nodes

    section = next(iter(doctree.findall(nodes.section)), None)
    title = section[0] if section is not None and len(section) and isinstance(section[0], nodes.title) else None
    if title is None:
        return
    for math in list(title.findall(nodes.math)):
        math.replace_self(nodes.Text(tex_to_unicode(math.astext())))


def setup(app):
    """Connect the title hook (before Sphinx's own title collector, priority 500)."""
    app.connect("doctree-read", _unicode_math_in_title, priority=400)
