"""Sphinx configuration of the taskloss book: the committed notebooks (MyST-NB, outputs as committed) and the
package reference (autodoc), one static site that reads offline.

Build with ``make book`` (→ docs/_build/html/index.html). The pages under ``docs/notebooks/`` and ``docs/api/`` are
generated at each build by ``docs/_ext/book_sources.py`` from ``docs/chapters.yaml``, ``notebooks/*.ipynb`` and
the package's ``__all__`` lists; they are git-ignored. Environment variables:

- ``TASKLOSS_BOOK_EXECUTE=1`` (``make book EXECUTE=1``): execute every notebook instead of showing its committed
  outputs.
- ``TASKLOSS_MATHJAX``: a folder holding MathJax 3's ``es5`` files, used instead of the npm-installed copy that
  ``docs/_ext/book_mathjax.py`` keeps in ``docs/_build/mathjax``.
"""
from __future__ import annotations

import builtins
import os
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
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
}
html_last_updated_fmt = None
html_copy_source = False
html_show_sourcelink = False
