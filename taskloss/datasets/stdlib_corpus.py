"""The default text corpus, built from prose that ships with Python: pure standard library, no taskloss imports.

:mod:`taskloss.datasets.corpus` runs this file in a fresh, isolated interpreter (``python -I -S stdlib_corpus.py``)
because libraries loaded in a notebook process patch the standard library (importing torch replaces
``inspect.getfile``, for instance) and would change which docstrings are found. Sources:

- ``pydoc_data.topics.topics``: the language-reference topics (``help("if")``), one document per section;
- the docstrings of :data:`STDLIB_MODULES` (pure-Python or built-in modules whose public members do not
  depend on the platform): one document per module docstring, per public function, and per public class
  together with its public methods.

Paragraphs become single lines with normalized whitespace; code examples (``>>>``), grammar productions
(``::=``), tables and indented code blocks are dropped (:func:`clean_paragraphs`). Documents are assigned to
train/valid/test by :func:`split_of` (SHA-256 of the title). The result depends only on the Python version's
standard-library text (it differs between 3.11 patch releases), never on the machine or on import order.

    python -I -S taskloss/stdlib_corpus.py OUT.json   # [[title, [line, ...]], ...]
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import re
import sys
import warnings

# Pure-Python standard-library modules whose public docstrings do not depend on the platform (no
# ``if sys.platform`` / optional-ssl definitions), importable without side effects. Sorted; never reorder.
STDLIB_MODULES = tuple(sorted([
    "_pydecimal", "_pyio", "abc", "argparse", "ast", "asyncio.base_events", "asyncio.events",
    "asyncio.futures", "asyncio.locks", "asyncio.queues", "asyncio.streams", "asyncio.tasks", "base64",
    "bisect", "builtins", "calendar", "cmd", "code", "codecs", "codeop", "collections", "collections.abc",
    "colorsys", "compileall", "concurrent.futures._base", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "difflib", "dis", "doctest", "email.contentmanager", "email.feedparser",
    "email.generator", "email.header", "email.headerregistry", "email.message", "email.parser",
    "email.policy", "email.utils", "enum", "filecmp", "fileinput", "fnmatch", "fractions", "functools",
    "getopt", "gettext", "glob", "graphlib", "gzip", "heapq", "html.parser", "http.cookiejar",
    "http.cookies", "http.server", "importlib.abc", "importlib.util", "inspect", "ipaddress", "itertools",
    "json", "json.decoder", "json.encoder", "linecache", "logging", "logging.handlers", "mailbox", "math",
    "mimetypes", "modulefinder", "netrc", "numbers", "operator", "optparse", "pathlib", "pdb", "pickle",
    "plistlib", "pprint", "profile", "pstats", "pyclbr", "pydoc", "queue", "quopri", "random", "re",
    "reprlib", "runpy", "sched", "secrets", "shlex", "statistics", "string", "symtable", "tabnanny",
    "tarfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "types", "typing",
    "unittest.case", "unittest.loader", "unittest.mock", "unittest.result", "unittest.runner",
    "unittest.suite", "urllib.parse", "warnings", "wave", "weakref", "wsgiref.handlers", "wsgiref.util",
    "wsgiref.validate", "xml.dom.minidom", "xml.etree.ElementTree", "xml.sax.handler", "xml.sax.saxutils",
    "xmlrpc.client", "xmlrpc.server", "zipapp", "zipfile",
]))

_VALID_BUCKET, _TEST_BUCKET = 0, 1  # sha256(title) % 10: 0 → valid, 1 → test, else train


def split_of(title: str) -> str:
    """The split of a document: ``sha256(title) mod 10`` = 0 → valid, 1 → test, otherwise train."""
    bucket = int.from_bytes(hashlib.sha256(title.encode("utf-8")).digest()[:8], "big") % 10
    return "valid" if bucket == _VALID_BUCKET else "test" if bucket == _TEST_BUCKET else "train"


# --------------------------------------------------------------------------------------------- cleaning
_HEADING_UNDERLINE = re.compile(r"^([=\-*~^\"#+])\1{2,}\s*$")
_LIST_MARKER = re.compile(r"^(\s*)((?:\d+\.|\*|-|\(\d+\)|[a-z]\))\s+)")
_WORD = re.compile(r"^[\"'(]*[A-Za-z][a-z]*(?:'[a-z]+)?[\"')]*[.,;:!?]?[\"')]*$")
_EMPHASIS = re.compile(r"\*{1,2}([^*\s][^*]*?)\*{1,2}")
_FOOTNOTE = re.compile(r"\s*\[\d+\]")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_prose(text: str) -> bool:
    """A paragraph (whitespace-normalized) that reads as English: long enough, mostly plain words."""
    if any(m in text for m in (">>>", "::=", "+--", "|--", "-->", "==>", "$ ")):
        return False
    words = text.split()
    if len(words) < 6:
        return False
    plain = sum(1 for w in words if _WORD.match(w))
    symbols = sum(text.count(c) for c in "=()[]{}<>_\\#@|")
    return plain / len(words) >= 0.6 and symbols / len(text) < 0.04 and text[-1] in ".:;?!)\"'"


def clean_paragraphs(text: str) -> list[str]:
    """Split reStructuredText-like prose into paragraphs, keep the prose ones as single normalized lines.

    A paragraph indented deeper than the text it follows (code blocks, grammar, interactive examples) is
    dropped; list items (``1.``, ``*``) open their content indentation. Emphasis stars and footnote
    markers are removed; whitespace is collapsed.
    """
    out: list[str] = []
    context = 0  # content indentation of the last prose paragraph
    block: list[str] = []
    for line in text.expandtabs(8).splitlines() + [""]:
        if line.strip():
            block.append(line.rstrip())
            continue
        if not block:
            continue
        lines, block = block, []
        if len(lines) >= 2 and _HEADING_UNDERLINE.match(lines[-1]):
            lines = lines[:-2]  # a heading (title + underline) — drop it, keep any text above
            context = 0
            if not lines:
                continue
        first = _indent(lines[0])
        m = _LIST_MARKER.match(lines[0])
        joined = _FOOTNOTE.sub("", _EMPHASIS.sub(r"\1", " ".join(s.strip() for s in lines)))
        joined = " ".join(joined.split())
        if first > context + 1 or not _is_prose(joined):
            if first <= context:  # a non-prose paragraph at this level resets nesting (e.g. a term line)
                context = first + 3
            continue
        if m:
            joined = joined[len(m.group(2).strip()):].strip()
            context = first + len(m.group(2))
        else:
            context = first
        if joined:
            out.append(joined)
    return out


def _topic_documents() -> list[tuple[str, tuple[str, ...]]]:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - some distributions split pydoc_data out
        raise RuntimeError("the default corpus needs the standard library's pydoc_data package "
                           "(install the full Python standard library, or pass path= to WikiText)") from e
    docs: list[tuple[str, tuple[str, ...]]] = []
    for key in sorted(topics):
        raw = topics[key].expandtabs(8).splitlines()
        sections: list[tuple[str, list[str]]] = [(key, [])]
        for i, line in enumerate(raw):
            nxt = raw[i + 1] if i + 1 < len(raw) else ""
            if line.strip() and _HEADING_UNDERLINE.match(nxt) and _indent(line) == 0:
                sections.append((" ".join(line.split()), []))
            elif not _HEADING_UNDERLINE.match(line):
                sections[-1][1].append(line)
        for heading, body in sections:
            lines = clean_paragraphs("\n".join(body))
            if lines:
                docs.append((f"topics/{key}/{heading}", tuple(lines)))
    return docs


def _public_members(obj, owner: str | None):
    """Public functions/classes of a module (``owner`` = its ``__name__``) or routines of a class (None)."""
    for name in sorted(vars(obj)):
        if name.startswith("_"):
            continue
        member = vars(obj)[name]
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if not isinstance(getattr(member, "__doc__", None), str):
            continue
        if owner is None:
            if inspect.isroutine(member):
                yield name, member
        elif (inspect.isfunction(member) or inspect.isbuiltin(member) or inspect.isclass(member)) and \
                getattr(member, "__module__", None) == owner:
            yield name, member


def _module_documents(modname: str) -> list[tuple[str, tuple[str, ...]]]:
    mod = importlib.import_module(modname)
    docs: list[tuple[str, tuple[str, ...]]] = []
    for name, member in _public_members(mod, mod.__name__):
        lines = clean_paragraphs(inspect.cleandoc(member.__doc__))
        if inspect.isclass(member):
            for _, meth in _public_members(member, None):
                lines += clean_paragraphs(inspect.cleandoc(meth.__doc__))
        if lines:
            docs.append((f"stdlib/{modname}.{name}", tuple(lines)))
    if isinstance(mod.__doc__, str) and (lines := clean_paragraphs(inspect.cleandoc(mod.__doc__))):
        docs.insert(0, (f"stdlib/{modname}", tuple(lines)))
    return docs


def build_documents() -> list[tuple[str, list[str]]]:
    """All documents ``(title, lines)``: topics first, then modules in :data:`STDLIB_MODULES` order; a
    docstring seen under two names (aliases) is kept once, at its first title."""
    docs = _topic_documents()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in STDLIB_MODULES:
            docs.extend(_module_documents(modname))
    seen, unique = set(), []
    for title, lines in docs:
        if lines not in seen:
            seen.add(lines)
            unique.append((title, list(lines)))
    return unique


def main(argv=None) -> None:
    """Command line: write the corpus documents as JSON to the one path given (``OUT.json``)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -I -S stdlib_corpus.py OUT.json")
    payload = {"python": sys.version.split()[0], "documents": build_documents()}
    tmp = f"{argv[0]}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False)
    os.replace(tmp, argv[0])


if __name__ == "__main__":
    main()
