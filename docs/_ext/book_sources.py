"""Generated pages of the book, written at the start of every build (``config-inited``) so that the notebooks,
docs/chapters.yaml and the package's ``__all__`` lists stay the one source of truth:

- ``docs/notebooks/NN_topic.ipynb``: each committed notebook (outputs as committed), with a box under its title
  holding its entry of docs/chapters.yaml joined with its recorded results (question, sources, the headline in one
  line, runtime, what the runs found; docs/_ext/book_chapters.py), links to download the notebook and its source
  (and to open it on Colab or Binder when pyproject.toml names the repository's address), and a "Uses" box linking
  every public ``taskloss`` name the notebook imports or names in its prose; progress-bar widgets keep their
  text, and each figure gets its caption as alt text (docs/_ext/book_figures.py). ``docs/notebooks/index.md``
  lists them in the order of docs/chapters.yaml.
- ``docs/api/taskloss.<subpackage>.rst``: one page per subpackage (and ``taskloss.utils``): the subpackage
  docstring, a summary table of its ``__all__``, then module by module its docstring and the public names it
  defines, documented at their public path (``taskloss.search.MGS``).

Files are rewritten only when their content changes (incremental builds stay incremental) and atomically (a
``make book`` beside the book test of ``make test`` cannot read half a file). Everything under the two folders is
generated; ``docs/.gitignore`` keeps them out of git.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import importlib
import inspect
import os
import pkgutil
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import nbformat
from book_chapters import (
    Chapter,
    fingerprint_text,
    hosted_links,
    load_chapters,
    notebook_metadata,
    render_headline,
    render_findings,
    repository_url,
    results_page,
    runtime_text,
)
from book_figures import add_alt_metadata
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

from taskloss.utils import resolve_name

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
NOTEBOOK_DIR = REPO / "notebooks"
NB_OUT, API_OUT = DOCS / "notebooks", DOCS / "api"
WIDGET_MIMES = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")
NOTEBOOK_STEM = re.compile(r"\b(\d\d_[a-z0-9_]*[a-z0-9])\b")


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` atomically, leaving the file (and its mtime) alone when it already holds exactly that."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def remove_stale(folder: Path, keep: set[str]) -> None:
    for p in folder.glob("*"):
        if p.is_file() and p.name not in keep and not p.name.startswith("."):
            p.unlink()


# -- Markdown from the repository ------------------------------------------------------------------------------

_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _site_markdown(cell: str) -> str:
    """Markdown written for the repository (docs/chapters.yaml) as Markdown for a page in docs/notebooks/: links
    to notebooks point at their pages, other links into the repository (which the site does not hold) keep only
    their text."""
    def fix(m: re.Match) -> str:
        text, target = m.groups()
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        stem = NOTEBOOK_STEM.search(target)
        if target.startswith("notebooks/") and stem and (NOTEBOOK_DIR / f"{stem.group(1)}.ipynb").exists():
            return f"[{text}]({stem.group(1)}.ipynb)"
        return text
    return _LINK.sub(fix, cell)


# -- the public API ------------------------------------------------------------------------------------------------

@dataclass
class ApiModule:
    name: str                                   # taskloss.search.mgs
    public: list[str] = field(default_factory=list)    # names documented at the subpackage path, in __all__ order
    own: list[str] = field(default_factory=list)       # in the module's __all__ only: documented at the module path


@dataclass
class ApiPage:
    name: str                                   # taskloss.search (or taskloss.utils)
    modules: list[ApiModule]
    is_package: bool


def _submodules(pkg) -> list[str]:
    return sorted(f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)
                  if not m.name.startswith("_"))


@lru_cache(maxsize=1)
def api_pages() -> tuple[ApiPage, ...]:
    import taskloss
    pages = []
    for info in sorted(pkgutil.iter_modules(taskloss.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        name = f"taskloss.{info.name}"
        mod = importlib.import_module(name)
        if not info.ispkg:
            own = list(getattr(mod, "__all__", []))
            pages.append(ApiPage(name, [ApiModule(name, public=own)], is_package=False))
            continue
        modules = [ApiModule(m) for m in _submodules(mod)]
        by_name = {m.name: m for m in modules}
        module_all = {m.name: list(getattr(importlib.import_module(m.name), "__all__", [])) for m in modules}
        for public in mod.__all__:
            home = next((m for m, names in module_all.items() if public in names), None)
            if home is None:
                home = getattr(getattr(mod, public), "__module__", None)
            if home not in by_name:
                raise RuntimeError(f"{name}.__all__ names {public}, defined outside the subpackage ({home})")
            by_name[home].public.append(public)
        for m in modules:
            m.own = [n for n in module_all[m.name] if n not in mod.__all__]
        pages.append(ApiPage(name, modules, is_package=True))
    return tuple(pages)


@lru_cache(maxsize=1)
def documented() -> dict[int, tuple[str, str]]:
    """id(object) → (documented dotted name, Python-domain role) for every object with an entry in the reference."""
    out: dict[int, tuple[str, str]] = {}
    for page in api_pages():
        for m in page.modules:
            mod = importlib.import_module(m.name)
            for where, names in ((page.name, m.public), (m.name, m.own)):
                for n in names:
                    obj = getattr(mod, n)
                    if _role(obj) != "data":          # data values (tuples, ints) are not unique by id
                        out.setdefault(id(obj), (f"{where}.{n}", _role(obj)))
    return out


@lru_cache(maxsize=1)
def documented_names() -> dict[str, str]:
    """documented dotted name → role, data included; plus every documented module → 'mod' (a module whose name is
    also a public name of its package keeps the public name's role: see collided_modules)."""
    out: dict[str, str] = {}
    for page in api_pages():
        out[page.name] = "mod"
        for m in page.modules:
            out[m.name] = "mod"
            mod = importlib.import_module(m.name)
            for where, names in ((page.name, m.public), (m.name, m.own)):
                for n in names:
                    out[f"{where}.{n}"] = _role(getattr(mod, n))
    return out


@lru_cache(maxsize=1)
def defining_paths() -> dict[str, str]:
    """``module.name`` of each public name → its documented path (``taskloss.search.mgs.SIGMA_MODES`` →
    ``taskloss.search.SIGMA_MODES``): how data, which cannot be told apart by identity, are followed."""
    return {f"{m.name}.{n}": f"{page.name}.{n}" for page in api_pages() for m in page.modules for n in m.public}


def _role(obj) -> str:
    if inspect.isclass(obj):
        return "exc" if issubclass(obj, BaseException) else "class"
    if inspect.isroutine(obj):
        return "func"
    return "data"


def resolve(dotted: str):
    """The object a dotted ``taskloss`` name denotes (import the longest module prefix, then getattr), or None."""
    try:
        return resolve_name(dotted)
    except LookupError:
        return None


def documented_target(dotted: str) -> tuple[str, str] | None:
    """(documented name, role) of the entry a dotted ``taskloss`` name points to, following re-exports and defining
    modules; None for objects without an entry (private helpers) and names that do not exist."""
    names = documented_names()
    if dotted in names:
        return dotted, names[dotted]
    if dotted in defining_paths():
        public = defining_paths()[dotted]
        return public, names[public]
    obj = resolve(dotted)
    if obj is None:
        return None
    if id(obj) in documented():
        return documented()[id(obj)]
    # a method or attribute of a documented class: Class.member
    head, _, tail = dotted.rpartition(".")
    owner = documented_target(head) if head.count(".") >= 1 else None
    if owner and owner[1] in ("class", "exc") and not tail.startswith("_"):
        return f"{owner[0]}.{tail}", "meth" if callable(obj) else "attr"
    return None


# -- API pages -----------------------------------------------------------------------------------------------------

def _data_entry(module: str, name: str) -> list[str]:
    """A ``py:data`` entry (under the current module): a short literal value shown, else its type; the ``#:``
    comment (or string below the assignment) as its text."""
    obj = getattr(importlib.import_module(module), name)
    lines = [f".. py:data:: {name}"]
    text = repr(obj)
    if isinstance(obj, (int, float, str, tuple, frozenset, dict, list, type(None))) and len(text) <= 90 and \
            "\n" not in text and str(REPO) not in text:
        lines.append(f"   :value: {text}")
    else:
        kind = type(obj)
        qualified = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        lines.append(f"   :type: {qualified}")
    doc = ModuleAnalyzer.for_module(module).find_attr_docs().get(("", name))
    if doc:
        # written into the page, not through autodoc: its notebook names become links here (process_docstring's job)
        from book_links import link_notebooks_in_line, notebook_stems  # (book_links imports this module)
        stems = notebook_stems()
        lines += [""] + [f"   {link_notebooks_in_line(d, stems)}" if d else "" for d in doc]
    return lines + [""]


def _entry(qualified: str, module: str, name: str) -> list[str]:
    obj = getattr(importlib.import_module(module), name)
    role = _role(obj)
    if role == "data":
        return _data_entry(module, name)
    if role in ("class", "exc"):
        return [f".. autoclass:: {qualified}", "   :members:", "   :show-inheritance:", ""]
    return [f".. autofunction:: {qualified}", ""]


def summary(obj) -> str:
    """The first sentence of an object's docstring (reST), cut at a period outside inline literals and roles —
    autosummary's own cut can fall inside a literal such as ``min gᵀδ s.t. ...``."""
    doc = inspect.getdoc(obj) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    for m in re.finditer(r"``.*?``|:[\w:]+:`[^`]*`|`[^`]*`|\.(?=\s|$)", para):
        if m.group(0) == ".":
            return para[:m.end()]
    return para


def collided_modules(page: ApiPage) -> set[str]:
    """Modules whose dotted name is also a public name of their subpackage (``taskloss.curvature.natural_gradient``
    the module and the function): the module keeps its section and a label, the entry goes to the function."""
    if not page.is_package:
        return set()
    public = set(importlib.import_module(page.name).__all__)
    return {m.name for m in page.modules if m.name.rsplit(".", 1)[1] in public}


@lru_cache(maxsize=1)
def all_collided_modules() -> frozenset[str]:
    return frozenset(m for page in api_pages() for m in collided_modules(page))


def module_label(name: str) -> str:
    return f"module-section-{name}"


def api_page_text(page: ApiPage) -> str:
    title = page.name
    out = [title, "=" * len(title), "", f".. automodule:: {page.name}", "   :no-members:", ""]
    if page.is_package:
        from book_links import link_notebooks_in_line, notebook_stems  # (book_links imports this module)
        stems = notebook_stems()
        mod = importlib.import_module(page.name)
        out += [".. currentmodule:: " + page.name, "", ".. rubric:: Public names", "",
                ".. list-table::", "   :class: taskloss-summary", "   :widths: 30 70", ""]
        for n in mod.__all__:
            obj = getattr(mod, n)
            role = _role(obj)
            text = link_notebooks_in_line(summary(obj), stems) if role != "data" else ""
            out += [f"   * - :py:{role}:`~{page.name}.{n}`", f"     - {text}"]
        out.append("")
    collided = collided_modules(page)
    for m in page.modules:
        if page.is_package:
            heading = f"``{m.name}``"
            out += [f".. _{module_label(m.name)}:", "", heading, "-" * len(heading), "",
                    f".. automodule:: {m.name}", "   :no-members:"]
            out += ["   :no-index:", ""] if m.name in collided else [""]
        if m.public:
            out += [f".. currentmodule:: {page.name}", ""]
            for n in m.public:
                out += _entry(f"{page.name}.{n}", m.name, n)
        for n in m.own:
            out += [f".. currentmodule:: {m.name}", ""] + _entry(f"{m.name}.{n}", m.name, n)
    return "\n".join(out) + "\n"


def write_api() -> None:
    pages = api_pages()
    keep = set()
    for page in pages:
        keep.add(f"{page.name}.rst")
        write_if_changed(API_OUT / f"{page.name}.rst", api_page_text(page))
    import taskloss
    index = ["Package reference", "=================", "",
             "Generated from the docstrings of the ``taskloss`` package: one page per subpackage, its public names "
             "(``__all__``) documented where a notebook or a test imports them from, grouped by the module that "
             "defines them. Each entry links the notebook that derives it.", "",
             ".. automodule:: taskloss", "   :no-members:", "",
             ".. toctree::", "   :maxdepth: 1", ""]
    index += [f"   {page.name}" for page in pages]
    assert taskloss.__doc__
    keep.add("index.rst")
    write_if_changed(API_OUT / "index.rst", "\n".join(index) + "\n")
    remove_stale(API_OUT, keep)


# -- notebook pages ------------------------------------------------------------------------------------------------

def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to taskloss modules/objects by the imports of a code cell."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "taskloss" or a.name.startswith("taskloss."):
                    out[a.asname] = a.name if a.asname else None
                    if not a.asname:
                        out["taskloss"] = "taskloss"
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and \
                (node.module == "taskloss" or node.module.startswith("taskloss.")):
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return {k: v for k, v in out.items() if k and v}


def _dotted_uses(source: str) -> set[str]:
    """Dotted taskloss names a code cell uses: its imports and attribute chains on imported names."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(re.findall(r"\btaskloss(?:\.\w+)+", source))
    aliases = _aliases(tree)
    found = set(aliases.values())
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in aliases and chain:
            found.add(".".join([aliases[node.id], *reversed(chain)]))
    return found


def notebook_uses(nb) -> list[tuple[str, str]]:
    """(documented name, role) of every public taskloss object the notebook imports, calls or names in prose;
    modules are left out (a module named in prose is linked where it stands)."""
    candidates: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            candidates |= _dotted_uses(cell.source)
        elif cell.cell_type == "markdown":       # (a module path written out in prose is the module)
            candidates |= {r.rstrip(".") for r in re.findall(r"\btaskloss(?:\.\w+)+", cell.source)
                           if r.rstrip(".") not in all_collided_modules()}
    uses = set()
    for dotted in candidates:
        parts = dotted.split(".")
        for i in range(len(parts), 1, -1):        # the longest prefix with an entry: MGS.step → MGS's entry
            target = documented_target(".".join(parts[:i]))
            if target:
                if target[1] != "mod" and target[1] not in ("meth", "attr"):
                    uses.add(target)
                break
    return sorted(uses)


def _uses_box(uses: list[tuple[str, str]]) -> str:
    if not uses:
        return ""
    groups: dict[str, list[tuple[str, str]]] = {}
    for name, role in uses:
        page = next(p.name for p in api_pages() if name.startswith(p.name + "."))
        groups.setdefault(page, []).append((name, role))
    lines = [":::{admonition} Uses from the `taskloss` package", ":class: seealso taskloss-uses", ""]
    for page, names in groups.items():
        links = ", ".join(f"{{py:{role}}}`~{name}`" for name, role in names)
        lines.append(f"- {{py:mod}}`{page}`: {links}")
    return "\n".join(lines + [":::"])


def _chapter_box(chapter: Chapter, repo_url: str | None) -> str:
    """The box under a chapter's title: its entry of docs/chapters.yaml with the committed run's numbers, and
    where to get the notebook."""
    meta = notebook_metadata(chapter.notebook)
    machine = fingerprint_text(meta)
    get = [f"{{download}}`{chapter.stem}.ipynb <../../notebooks/{chapter.stem}.ipynb>` (with its outputs)",
           f"{{download}}`{chapter.stem}.py <../../notebooks/{chapter.stem}.py>` (the source)"]
    get += [f"[{label}]({url})" for label, url in hosted_links(chapter.stem, repo_url)]
    fields = [("Question", chapter.scope), ("Sources", chapter.sources),
              ("In one line", render_headline(chapter) + "."),
              ("Runtime of the committed run", runtime_text(meta) + (f" ({machine})" if machine else "")),
              ("What the runs found", render_findings(chapter)), ("The notebook", " · ".join(get))]
    lines = [":::{admonition} At a glance", ":class: tip taskloss-glance", ""]
    for label, value in fields:
        lines += [f"**{label}.** {_site_markdown(value)}", ""]
    return "\n".join(lines).rstrip() + "\n:::"


def book_notebook(path: Path, chapter: Chapter | None, repo_url: str | None = None):
    """The page version of a committed notebook: chapter box and Uses box under the title, widget outputs as
    their text, no widget state, the figures' alt texts from their captions."""
    nb = nbformat.read(path, as_version=4)
    page = copy.deepcopy(nb)
    page.metadata.pop("widgets", None)
    for cell in page.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for mime in WIDGET_MIMES:
                    data.pop(mime, None)
                if not data:
                    continue
            outputs.append(out)
        cell.outputs = outputs
    add_alt_metadata(page)
    boxes = "\n\n".join(b for b in (_chapter_box(chapter, repo_url) if chapter else "", _uses_box(notebook_uses(nb)))
                        if b)
    first = next((c for c in page.cells if c.cell_type == "markdown"), None)
    match = re.search(r"^# .*$", first.source, re.M) if first is not None else None
    if match:
        first.source = first.source[:match.end()] + "\n\n" + boxes + "\n\n" + first.source[match.end():].lstrip("\n")
    else:
        page.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {path.stem}\n\n{boxes}"))
    return page


def write_notebooks() -> list[str]:
    chapters = {ch.stem: ch for ch in load_chapters()}
    present = {p.stem: p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")}
    order = [s for s in chapters if s in present] + sorted(s for s in present if s not in chapters)
    for stem in chapters:
        if stem not in present:
            logger.warning(f"docs/chapters.yaml lists {stem}, but notebooks/{stem}.ipynb does not exist",
                           type="taskloss", subtype="chapters")
    repo_url = repository_url()
    for stem in order:
        if stem not in chapters:
            logger.warning(f"notebooks/{stem}.ipynb has no entry in docs/chapters.yaml", type="taskloss",
                           subtype="chapters")
        page = book_notebook(present[stem], chapters.get(stem), repo_url)
        write_if_changed(NB_OUT / f"{stem}.ipynb", nbformat.writes(page) + "\n")
    index = ["# Notebooks", "",
             "Each notebook asks one question, derives the answer step by step with a numerical check after each "
             "step, and measures it. The pages show the committed outputs of the default run (CI-sized parameters "
             "on a CPU); rerun one with other parameters through the runner (see the introduction).", "",
             "| notebook | question | one result of the committed run |", "|---|---|---|"]
    for stem in order:
        ch = chapters.get(stem)
        question = _site_markdown(ch.question).replace("|", "\\|") if ch else ""
        headline = _site_markdown(render_headline(ch)).replace("|", "\\|") if ch else ""
        index.append(f"| [{stem}]({stem}.ipynb) | {question} | {headline} |")
    index += ["", "```{toctree}", ":hidden:", ":maxdepth: 1", "", *order, "```", ""]
    write_if_changed(NB_OUT / "index.md", "\n".join(index))
    # the page of expected results, as docs/results.md has it but linking the chapters (index.md's toctree has it)
    write_if_changed(NB_OUT / "results.md", results_page(list(chapters.values()), book=True))
    remove_stale(NB_OUT, {f"{s}.ipynb" for s in order} | {"index.md", "results.md"})
    return order


def generate(app: Sphinx, config: Config) -> None:
    # the book's own extensions shape every page: when their code changes, Sphinx rebuilds everything
    sources = sorted(Path(__file__).parent.glob("*.py")) + [DOCS / "chapters.yaml"]
    config.book_extensions_hash = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    write_api()
    write_notebooks()


def setup(app: Sphinx) -> dict:
    app.add_config_value("book_extensions_hash", "", "env")
    app.connect("config-inited", generate, priority=600)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
