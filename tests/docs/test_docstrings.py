"""Every docstring the package reference shows, checked in seconds the way ``make book`` reads it (runs in
``make test``; the full build takes minutes and is the CI step after it):

- its markup: napoleon's output (Google style, configured as docs/conf.py does) parsed as reStructuredText, so that
  a malformed table or a stray indent fails here as it fails ``sphinx -W``;
- its types: every type napoleon turns into a cross-reference — ``Args: x (T)``, ``Attributes: x (T)``,
  ``Raises: E`` and, for a property or an attribute, a first line ``T: description`` (napoleon reads the part
  before the colon as the value's type) — must name an object the book documents or one of the names
  docs/conf.py lets render as code. Otherwise the build, which is nitpicky, stops on it: a property whose docstring
  opens with ``‖se‖ / ‖Δθ*‖: the noise floor …`` is a reference to a class named ``‖se‖ / ‖Δθ*‖``.

Properties and attributes (``#:`` comments and strings under an assignment, which autodoc documents as members of
their class) are read with ``what="property"`` / ``"attribute"`` as autodoc hands them to napoleon. The rules are
tested on a synthetic module, against a real Sphinx build of that module.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import lru_cache

import pytest
from sphinx.domains.python._object import PyXrefMixin
from sphinx.pycode import ModuleAnalyzer

from taskloss.utils import REPO_ROOT

DOCS = REPO_ROOT / "docs"
sys.path[:0] = [str(DOCS / "_ext")]

import book_links  # noqa: E402
import book_sources  # noqa: E402


@dataclass(frozen=True)
class Docstring:
    dotted: str          # the documented name: taskloss.harness.IdealUpdate.rel_stderr
    what: str            # autodoc's object type, as napoleon receives it
    obj: object
    doc: str | None
    module: str          # the module the entry is documented under (its currentmodule)
    cls: str | None = None


def _class_members(cls, dotted: str, module: str) -> list[Docstring]:
    """The members autodoc's ``:members:`` shows for a class: public methods and properties defined on it, and the
    attributes with a doc comment or string in its source."""
    out = []
    for attr, value in vars(cls).items():
        value = getattr(value, "__func__", value)
        if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
            continue
        kind = "property" if isinstance(value, property) else "method"
        out.append(Docstring(f"{dotted}.{attr}", kind, value, inspect.getdoc(value), module, cls.__name__))
    try:
        attr_docs = ModuleAnalyzer.for_module(cls.__module__).find_attr_docs()
    except Exception:            # a class without Python source (a C extension): autodoc finds no comments either
        attr_docs = {}
    for (owner, attr), lines in attr_docs.items():
        if owner == cls.__qualname__ and not attr.startswith("_"):
            out.append(Docstring(f"{dotted}.{attr}", "attribute", None, inspect.cleandoc("\n".join(lines)),
                                 module, cls.__name__))
    return out


def module_docstrings(module, names: list[str], where: str | None = None) -> list[Docstring]:
    """The module's docstring, then each of ``names`` (documented under ``where``, default the module) and, for a
    class, its members."""
    where = where or module.__name__
    out = [Docstring(module.__name__, "module", module, inspect.getdoc(module), module.__name__)]
    for n in names:
        obj = getattr(module, n)
        if book_sources._role(obj) == "data":
            continue
        what = "class" if inspect.isclass(obj) else "function"
        out.append(Docstring(f"{where}.{n}", what, obj, inspect.getdoc(obj), where))
        if inspect.isclass(obj):
            out += _class_members(obj, f"{where}.{n}", where)
    return out


def documented_docstrings() -> list[Docstring]:
    """Every docstring the reference shows: subpackages, modules, public names and their members."""
    seen: set[str] = set()
    out = []
    for page in book_sources.api_pages():
        pkg = importlib.import_module(page.name)
        found = [Docstring(page.name, "module", pkg, inspect.getdoc(pkg), page.name)]
        for m in page.modules:
            mod = importlib.import_module(m.name)
            found += module_docstrings(mod, m.public, page.name) + module_docstrings(mod, m.own)
        for d in found:
            if d.dotted not in seen:
                seen.add(d.dotted)
                out.append(d)
    return out


@lru_cache(maxsize=1)
def _book_conf() -> dict:
    spec = importlib.util.spec_from_file_location("_taskloss_book_conf", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return vars(conf)


@lru_cache(maxsize=1)
def _napoleon_config():
    from sphinx.ext.napoleon import Config
    conf = _book_conf()
    return Config(**{k: v for k, v in conf.items() if k.startswith("napoleon_")})


@lru_cache(maxsize=1)
def _rst_parser():
    """docutils' reST parser and settings, with Sphinx's roles and directives stubbed (whether a reference resolves
    is checked separately, below)."""
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Directive, Parser, directives, roles

    def any_role(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, text)], []

    class AnyDirective(Directive):
        optional_arguments, final_argument_whitespace, has_content = 10, True, True
        option_spec = None

        def run(self):
            return []

    for role in ("func", "class", "meth", "attr", "mod", "data", "exc", "obj", "doc", "ref", "term", "any",
                 "py:func", "py:class", "py:meth", "py:attr", "py:mod", "py:data", "py:exc", "py:obj"):
        roles.register_local_role(role, any_role)
    for name in ("seealso", "versionadded", "versionchanged", "deprecated", "code-block", "autosummary", "todo"):
        directives.register_directive(name, AnyDirective)
    settings = get_default_settings(Parser)
    settings.report_level, settings.halt_level, settings.warning_stream = 5, 5, False
    return Parser(), settings


def napoleon_lines(d: Docstring) -> list[str]:
    """The reST autodoc hands to the build: napoleon's translation, then the book's notebook links."""
    from sphinx.ext.napoleon import GoogleDocstring

    lines = str(GoogleDocstring(d.doc or "", _napoleon_config(), what=d.what, name=d.dotted, obj=d.obj)).splitlines()
    book_links.process_docstring(None, d.what, d.dotted, d.obj, {}, lines)
    return lines


def markup_problems(d: Docstring) -> list[str]:
    """docutils' warnings and errors on the docstring's reST, as ``sphinx -W`` raises them."""
    from docutils.utils import new_document

    if not d.doc:
        return []
    parser, settings = _rst_parser()
    document = new_document(d.dotted, settings)
    found: list[str] = []
    document.reporter.attach_observer(
        lambda msg: found.append(f"{d.dotted} (docstring line {msg.get('line')}): {msg.astext()}")
        if msg["level"] >= 2 else None)
    parser.parse("\n".join(napoleon_lines(d)), document)
    return found


# the fields of napoleon's output whose types become cross-references, and the reference type each makes
_ROLE_OF = {"type": "class", "vartype": "class", "rtype": "class", "raises": "exc"}


def _typed_field(line: str) -> tuple[str, str] | None:
    """(field, the text that names types) of a type field — ``:type x: T`` / ``:type: T`` / ``:vartype x: T`` →
    T, ``:raises E: why`` → E — its marker found by docutils' own pattern; None for any other line."""
    from docutils.parsers.rst.states import Body

    m = re.match(Body.patterns["field_marker"], line.strip())
    if m is None:
        return None
    field, _, arg = m.group(0).strip()[1:-1].partition(" ")
    if field not in _ROLE_OF:
        return None
    return field, arg.strip() if field == "raises" else line.strip()[m.end():].strip()


def _plain_text(text: str) -> bool:
    """Whether reST reads ``text`` as plain text, without inline markup: only then does Sphinx turn a field's type
    into cross-references (a type written with ````[n]```` or a role is shown as written)."""
    from docutils import nodes
    from docutils.utils import new_document

    parser, settings = _rst_parser()
    document = new_document("type", settings)
    parser.parse(text, document)
    return (len(document.children) == 1 and isinstance(document[0], nodes.paragraph)
            and all(isinstance(child, nodes.Text) for child in document[0].children))


def type_targets(lines: list[str]) -> list[tuple[str, str]]:
    """(reference type, target) of every cross-reference Sphinx makes from napoleon's type fields: a type in plain
    text split at Sphinx's own delimiters (``[]``, ``()``, ``,``, ``or``, ``of``, ``|``), nothing inside
    ``Literal[...]``."""
    out = []
    for line in lines:
        found = _typed_field(line)
        if found is None or not found[1] or not _plain_text(found[1]):
            continue
        field, text = found
        literal = False
        for part in filter(None, PyXrefMixin._delimiters_re.split(text or "")):
            if literal or PyXrefMixin._delimiters_re.match(part):
                continue
            target = part.strip().lstrip("~.!")
            if target:
                out.append((_ROLE_OF[field], target))
            literal = part.strip() in {"Literal", "typing.Literal", "~typing.Literal"}
    return out


def target_resolves(role: str, target: str, module: str, cls: str | None) -> bool:
    """Whether the build resolves (or, by docs/conf.py's rules, renders as code) a reference to ``target`` made in
    ``module`` (inside ``cls``): ``nitpick_ignore_regex``; a documented ``taskloss`` name, exactly, by its suffix
    (type fields search like that) or relative to the module; a real object without an entry (book_links'
    ``missing_reference`` renders it as code); the one documented class of that name."""
    if any(re.fullmatch(kind, f"py:{role}") and re.fullmatch(pattern, target)
           for kind, pattern in _book_conf()["nitpick_ignore_regex"]):
        return True
    names = book_sources.documented_names()
    if target in names or any(n.endswith(f".{target}") for n in names):
        return True
    for dotted in book_links._candidates(target, module, cls):
        if dotted.startswith("taskloss") and (book_sources.documented_target(dotted) or book_sources.resolve(dotted)):
            return True
    return book_links._unique_class(target) is not None


def type_problems(d: Docstring) -> list[str]:
    if not d.doc:
        return []
    return [f"{d.dotted}: napoleon reads {target!r} as a type ({role} reference) and the build cannot resolve it"
            + (" — a property or attribute docstring must not open with 'X: …' unless X is its type"
               if d.what in ("property", "attribute") else "")
            for role, target in type_targets(napoleon_lines(d))
            if not target_resolves(role, target, d.module, d.cls)]


_ROLE_RE = re.compile(r":(?:py:)?(func|class|meth|attr|data|exc|obj|mod):`([^`]+)`")


def role_targets(doc: str) -> list[tuple[str, str]]:
    """(role, target) of every explicit cross-reference role in ``doc`` (``:func:`~a.b```, ``:class:`text <a.B>```)."""
    out = []
    for m in _ROLE_RE.finditer(doc or ""):
        text = m.group(2).strip()
        if text.endswith(">") and "<" in text:
            text = text[text.rindex("<") + 1:-1].strip()
        out.append((m.group(1), text))
    return out


def role_resolves(role: str, target: str, module: str, cls: str | None) -> bool:
    """Whether the build resolves an explicit role written in an entry documented under ``module`` (inside
    ``cls``): Sphinx's exact search (no suffix search unless the target starts with ``.``), then book_links'
    ``missing_reference`` fallback (enclosing packages, re-exports, real objects without an entry)."""
    fuzzy = target.lstrip("~!").startswith(".")
    target = target.lstrip("~!.")
    if any(re.fullmatch(kind, f"py:{role}") and re.fullmatch(pattern, target)
           for kind, pattern in _book_conf()["nitpick_ignore_regex"]):
        return True
    names = book_sources.documented_names()
    if fuzzy and any(n == target or n.endswith(f".{target}") for n in names):
        return True
    for dotted in book_links._candidates(target, module, cls):
        if dotted in names:
            return True
        if dotted.startswith("taskloss") and (book_sources.documented_target(dotted) or book_sources.resolve(dotted)):
            return True
    return role in ("class", "obj") and book_links._unique_class(target) is not None


def role_problems(d: Docstring) -> list[str]:
    # a class's own docstring is rendered inside it: its roles see its members
    cls = d.cls or (d.dotted[len(d.module) + 1:] if d.what in ("class", "exception") else None)
    return [f"{d.dotted}: :{role}:`{target}` does not resolve where the entry is documented ({d.module}): "
            "write the documented path, e.g. :func:`~taskloss.pkg.module.name`"
            for role, target in role_targets(d.doc) if not role_resolves(role, target, d.module, cls)]


def docstring_problems(d: Docstring) -> list[str]:
    return markup_problems(d) + type_problems(d) + role_problems(d)


# -- the rules, on known inputs ------------------------------------------------------------------------------------

SYNTHETIC = textwrap.dedent('''\
    """A synthetic module: each docstring below either is what the book's build accepts or an error it rejects."""
    from dataclasses import dataclass


    @dataclass
    class Estimate:
        """An estimate and its error.

        Attributes:
            value (float): the estimate.
            spread (a tensor of shape [n]): per-seed values.
        """

        value: float
        spread: object = None
        #: The estimator's name: shown in tables.
        label: str = ""
        #: int: how many draws it took.
        draws: int = 0

        @property
        def rel_stderr(self) -> float:
            """‖se‖ / ‖Δθ*‖: the noise floor of any relative error measured against this estimate."""
            return 0.0

        @property
        def rounded(self) -> float:
            """float: the estimate to two digits."""
            return round(self.value, 2)

        @property
        def plain(self) -> float:
            """The estimate, as a plain float (no colon in the first sentence)."""
            return self.value

        def scaled(self, factor, mode):
            """The estimate times a factor.

            Args:
                factor (float): the factor.
                mode (str or None): unused.

            Raises:
                ValueError: a negative factor.
            """
            return self.value * factor
    ''')
BAD = {  # the entries the build rejects, and the target it cannot resolve
    "synthetic_estimate.Estimate": ["a tensor", "shape", "n"],     # Sphinx splits types at "of"
    "synthetic_estimate.Estimate.label": ["The estimator's name"],
    "synthetic_estimate.Estimate.rel_stderr": ["‖se‖ / ‖Δθ*‖"],
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("synthetic")
    (folder / "synthetic_estimate.py").write_text(SYNTHETIC, encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        yield folder, importlib.import_module("synthetic_estimate")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("synthetic_estimate", None)


def test_type_check_flags_property_and_attribute_docstrings_that_open_with_a_false_type(synthetic):
    _, mod = synthetic
    docs = module_docstrings(mod, ["Estimate"])
    assert {d.dotted: d.what for d in docs}["synthetic_estimate.Estimate.label"] == "attribute"
    assert {d.dotted: d.what for d in docs}["synthetic_estimate.Estimate.rel_stderr"] == "property"
    flagged = {d.dotted: [t for _, t in type_targets(napoleon_lines(d))
                          if not target_resolves("class", t, d.module, d.cls)] for d in docs}
    assert {k: v for k, v in flagged.items() if v} == BAD
    assert all(not markup_problems(d) for d in docs)            # well-formed reST: only the types are wrong
    problems = type_problems(next(d for d in docs if d.dotted.endswith("rel_stderr")))
    assert len(problems) == 1 and "must not open with 'X: …'" in problems[0]


def test_type_check_agrees_with_a_real_build_of_the_synthetic_module(synthetic):
    """The same module through Sphinx with the book's napoleon settings and nitpick rules: the warnings name
    exactly the entries and targets the quick check flags."""
    folder, _ = synthetic
    conf = {k: v for k, v in _book_conf().items() if k.startswith("napoleon_")}
    (folder / "conf.py").write_text(
        "import sys\nsys.path.insert(0, %r)\n" % str(folder)
        + "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon']\nnitpicky = True\n"
        + f"nitpick_ignore_regex = {_book_conf()['nitpick_ignore_regex']!r}\n"
        + "".join(f"{k} = {v!r}\n" for k, v in conf.items()), encoding="utf-8")
    (folder / "index.rst").write_text("Synthetic\n=========\n\n.. automodule:: synthetic_estimate\n   :members:\n",
                                      encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "dummy", "-q", "-E", str(folder),
                           str(folder / "_build")], capture_output=True, text=True, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    warned = re.findall(r"WARNING: py:\w+ reference target not found: (.+?) \[ref", proc.stderr)
    assert sorted(warned) == sorted(t for targets in BAD.values() for t in targets), proc.stderr
    for entry in ("synthetic_estimate.Estimate.rel_stderr", "synthetic_estimate.Estimate.label"):
        assert f"docstring of {entry}:" in proc.stderr, proc.stderr


def test_markup_check_flags_what_the_build_rejects():
    def bad():
        """A table whose first column is narrower than a cell.

        =====  ====
        name   x
        =====  ====
        much longer  1
        =====  ====

        Args:
            x: *unclosed emphasis.
        """
    found = "\n".join(markup_problems(Docstring("bad", "function", bad, inspect.getdoc(bad), "bad")))
    assert "Malformed table" in found and "emphasis" in found, found

    def good():
        """Fine: :func:`taskloss.search.mgs_weights`, ``code``, :math:`x^2`. Derived in notebook 09_emo_loss.

        Args:
            x (taskloss.search.MGS): a value.
            y (Tensor): its shape ``[n]``.

        Returns:
            its square.

        Raises:
            TypeError / ValueError: bad input.
        """
    d = Docstring("good", "function", good, inspect.getdoc(good), "taskloss.search")
    assert docstring_problems(d) == []


def test_the_walk_reads_the_property_docstrings_of_the_package():
    docs = {d.dotted: d for d in documented_docstrings()}
    assert docs["taskloss.harness.IdealUpdate.rel_stderr"].what == "property"
    assert docs["taskloss.search.MGS.step"].what == "method" and docs["taskloss.search"].what == "module"


# -- the package ---------------------------------------------------------------------------------------------------

def test_role_check_flags_a_name_that_only_its_defining_module_knows():
    # compare.adjust is documented at taskloss.results.compare, not at taskloss.results where Comparison's entry is
    assert not role_resolves("func", "adjust", "taskloss.results", None)
    assert role_resolves("func", "~taskloss.results.compare.adjust", "taskloss.results", None)
    assert role_resolves("func", "paired_comparison", "taskloss.results", None)
    assert role_targets("see :class:`the run <taskloss.results.Run>` and :func:`~a.b`") == [
        ("class", "taskloss.results.Run"), ("func", "~a.b")]


def test_every_documented_docstring_reads_cleanly():
    found = [p for d in documented_docstrings() for p in docstring_problems(d)]
    assert not found, "\n".join(found[:20])
