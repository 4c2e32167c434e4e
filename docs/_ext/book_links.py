"""Cross-links of the book, both ways, checked by the build:

- API → notebooks: in every docstring autodoc renders, a notebook's name (``06_natural_gradient``) and "notebook
  NN" / "notebooks NN, MM and KK" / "notebooks NN–MM" become links to the notebook's page
  (``autodoc-process-docstring``). A name that has no page is a broken link and fails the build.
- notebooks (and docstrings) → API: an inline-code ``taskloss.x.y`` becomes a link to the entry of the object it
  names — modules to their section, re-exported objects to their public entry. A ``taskloss.x.y`` that names
  nothing fails the build; one that names an object without an entry (a private helper) stays code.
- references written in docstrings against a defining module (``:class:`taskloss.search.mgs.MGS```) or relative to
  it resolve to the public entry (``missing-reference``); references to objects of other libraries render as code
  (``nitpick_ignore_regex`` in conf.py); anything else is a broken reference and, with ``nitpicky``, an error.
"""
from __future__ import annotations

import re

from book_sources import NOTEBOOK_DIR, all_collided_modules, documented_names, documented_target, module_label, resolve
from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)


def notebook_stems() -> dict[str, str]:
    return {p.stem[:2]: p.stem for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")}


# -- docstrings → notebook pages -----------------------------------------------------------------------------------

# pieces of a docstring line that must not be rewritten: inline literals, roles, interpreted text, URLs, paths
_PROTECTED = re.compile(r"``.*?``|:[\w:]+:`[^`]*`|`[^`]*`_?|https?://\S+|\S*/\S*")
_STEM = re.compile(r"(?<![\w/.-])(\d\d)_[a-z0-9_]*[a-z0-9](?![\w/-]|\.\w)")
_NUMBERED = re.compile(r"(?<![\w-])(notebooks?\s+)(\d\d(?:(?:\s*,\s*|\s+and\s+|\s*[–-]\s*|\s+to\s+|\s+or\s+)\d\d)*)"
                       r"(?![\w/-]|\.\w)")


def _doc_link(text: str, stem: str) -> str:
    return f":doc:`{text} </notebooks/{stem}>`"


def link_notebooks_in_text(text: str, stems: dict[str, str]) -> str:
    """Rewrite notebook names in one stretch of plain reST text into :doc: links (reST ends a role before
    whitespace or punctuation, the en dash of "02–09" included, so no escaping is needed)."""
    def full(m: re.Match) -> str:
        stem = stems.get(m.group(1))
        if stem is None or not (stem == m.group(0) or stem.startswith(m.group(0))):
            return m.group(0)          # a name without a page is left as written (the layout test reports it)
        return _doc_link(m.group(0), stem)

    def numbered(m: re.Match) -> str:
        def one(n: re.Match) -> str:
            stem = stems.get(n.group(0))
            return _doc_link(n.group(0), stem) if stem else n.group(0)
        return m.group(1) + re.sub(r"\d\d", one, m.group(2))

    text = _NUMBERED.sub(numbered, text)
    parts = re.split(r"(:doc:`[^`]*`)", text)    # do not rewrite inside the links just made
    return "".join(p if p.startswith(":doc:") else _STEM.sub(full, p) for p in parts)


def link_notebooks_in_line(line: str, stems: dict[str, str]) -> str:
    out, pos = [], 0
    for m in _PROTECTED.finditer(line):
        out.append(link_notebooks_in_text(line[pos:m.start()], stems))
        out.append(m.group(0))
        pos = m.end()
    out.append(link_notebooks_in_text(line[pos:], stems))
    return "".join(out)


def process_docstring(app: Sphinx, what: str, name: str, obj, options, lines: list[str]) -> None:
    stems = notebook_stems()
    literal_indent = None            # inside a literal block (after '::') or a math/code directive: leave as is
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not line.strip() or indent > literal_indent:
                continue
            literal_indent = None
        if line.rstrip().endswith("::"):
            literal_indent = indent
        lines[i] = link_notebooks_in_line(line, stems)


# -- inline code taskloss.x.y → links ------------------------------------------------------------------------------

_DOTTED = re.compile(r"taskloss(?:\.[A-Za-z_]\w*)+")


class TasklossLiterals(SphinxTransform):
    """Inline code that is exactly a dotted ``taskloss`` name (``taskloss.search.MGS``, optionally with ``()``)
    becomes a cross-reference to that object's entry."""
    default_priority = 400

    def apply(self, **kwargs) -> None:
        skip = (nodes.reference, addnodes.pending_xref, addnodes.desc_signature, nodes.title)   # no links in titles
        for node in list(self.document.findall(nodes.literal)):
            if isinstance(node.parent, skip) or "xref" in node.get("classes", []):
                continue
            text = node.astext()
            dotted = text[:-2] if text.endswith("()") else text
            if not _DOTTED.fullmatch(dotted):
                continue
            if dotted in all_collided_modules():
                # a module path written out names the module, even where its package rebinds the name to a function
                ref = addnodes.pending_xref("", refdomain="taskloss", reftype="module-section", reftarget=dotted,
                                            refexplicit=True, refdoc=self.env.docname)
                ref += nodes.literal(text, text, classes=["xref", "py", "py-mod"])
                node.replace_self(ref)
                continue
            target = documented_target(dotted)
            if target is None:
                if resolve(dotted) is None:
                    logger.warning(f"{text!r} names no object of the taskloss package", location=node,
                                   type="taskloss", subtype="name")
                continue
            ref = addnodes.pending_xref("", refdomain="py", reftype=target[1], reftarget=target[0],
                                        refexplicit=True, refwarn=True, refdoc=self.env.docname)
            ref += nodes.literal(text, text, classes=["xref", "py", f"py-{target[1]}"])
            node.replace_self(ref)
        # a module that shares its dotted name with a public function links to its section, not to the function
        for ref in list(self.document.findall(addnodes.pending_xref)):
            if ref.get("refdomain") == "py" and ref.get("reftype") == "mod" and \
                    ref.get("reftarget") in all_collided_modules():
                ref["refdomain"], ref["reftype"] = "taskloss", "module-section"


class ModuleSections(SphinxPostTransform):
    """Resolves the references made above to the section label of the module (keeping their code look)."""
    default_priority = 5            # before Sphinx's ReferencesResolver

    def run(self, **kwargs) -> None:
        labels = self.env.domains["std"].labels
        for ref in list(self.document.findall(addnodes.pending_xref)):
            if ref.get("refdomain") != "taskloss":
                continue
            label = module_label(ref["reftarget"]).lower()
            if label not in labels:
                logger.warning(f"no section for module {ref['reftarget']}", location=ref)
                ref.replace_self(ref.children)
                continue
            docname, labelid, _ = labels[label]
            ref.replace_self(make_refnode(self.app.builder, self.env.docname, docname, labelid, ref.children,
                                          ref["reftarget"]))


# -- references against defining modules → public entries ----------------------------------------------------------

def _candidates(target: str, module: str | None, cls: str | None) -> list[str]:
    """Where a reference written in ``module`` (inside ``cls``) may point, nearest first: the class, the module,
    then each enclosing package (a module docstring naming a function of a sibling module)."""
    out = []
    if module:
        if cls:
            out.append(f"{module}.{cls}.{target}")
        parts = module.split(".")
        out += [".".join(parts[:i] + [target]) for i in range(len(parts), 0, -1)]
    return [target, *out]


def _unique_class(target: str) -> tuple[str, str] | None:
    """An unqualified class name in a signature (a string annotation autodoc cannot evaluate) names the one
    documented class of that name, if there is exactly one."""
    if "." in target:
        return None
    hits = [(n, r) for n, r in documented_names().items() if n.rsplit(".", 1)[-1] == target and r in ("class", "exc")]
    return hits[0] if len(hits) == 1 else None


def missing_reference(app: Sphinx, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    for dotted in _candidates(target, node.get("py:module"), node.get("py:class")):
        if not dotted.startswith("taskloss"):
            continue
        names = documented_names()
        if node["reftype"] == "mod" or names.get(dotted) == "mod" and node["reftype"] in ("mod", "obj"):
            if names.get(dotted) == "mod":
                return env.domains["py"].resolve_xref(env, node["refdoc"], app.builder, "mod", dotted, node,
                                                      contnode)
            continue
        found = documented_target(dotted)
        if found is not None:
            ref = env.domains["py"].resolve_xref(env, node["refdoc"], app.builder, found[1], found[0], node,
                                                 contnode)
            if ref is not None:
                return ref
        if resolve(dotted) is not None:
            return contnode          # a real object without an entry (a private helper, an undocumented method)
    found = _unique_class(target) if node["reftype"] in ("class", "obj") else None
    if found is not None:
        return env.domains["py"].resolve_xref(env, node["refdoc"], app.builder, found[1], found[0], node, contnode)
    return None


def process_signature(app: Sphinx, what: str, name: str, obj, options, signature, return_annotation):
    """Dataclass fields with a ``default_factory`` show as ``=<factory>``, which is not Python and makes Sphinx
    split the signature at every comma; show them as ``=...``."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


def setup(app: Sphinx) -> dict:
    app.connect("autodoc-process-docstring", process_docstring)
    app.add_transform(TasklossLiterals)
    app.add_post_transform(ModuleSections)
    app.connect("missing-reference", missing_reference)
    app.connect("autodoc-process-signature", process_signature)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
