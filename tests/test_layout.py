"""The package layout: the import graph has no cycle (between modules, and between subpackages), every
subpackage declares its public names, and the names the prose points to exist.

The graph is built with ``ast`` from every ``import`` in ``taskloss/`` — module level and inside functions, since
a lazy import is still a dependency. Importing ``taskloss.a.b`` from outside ``taskloss.a`` also runs
``taskloss/a/__init__.py``, so such an import depends on the package too.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from taskloss.utils import REPO_ROOT, resolve_name

PKG = REPO_ROOT / "taskloss"
NOTEBOOK_IDS = {p.stem[:2]: p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}
SUBPACKAGES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py" and m != "taskloss")


def _imports(module: str, path: Path) -> set[str]:
    """taskloss modules that ``module`` imports (the module itself for ``from pkg import submodule``)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            subs = [f"{base_name}.{a.name}" for a in node.names if f"{base_name}.{a.name}" in MODULES]
            # `from pkg import submodule` needs the submodule; other names come from pkg's __init__ itself
            targets = subs if len(subs) == len(node.names) else [base_name, *subs]
        else:
            continue
        for t in targets:
            if not (t == "taskloss" or t.startswith("taskloss.")):
                continue
            while t not in MODULES:          # `import taskloss.a.b.name` → the module that holds it
                t = t.rsplit(".", 1)[0]
            out.add(t)
            parts = t.split(".")          # importing taskloss.a.b runs taskloss.a's __init__ unless we are inside it
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if not module.startswith(parent + ".") and module != parent:
                    out.add(parent)
    out.discard(module)
    out.discard("taskloss")               # the root __init__ imports only utils
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


HELPERS = {"taskloss.validation", "taskloss.parameter_vectors", "taskloss._lazy"}   # utils' rooms, one node


def _subpackage(module: str) -> str:
    parts = module.split(".")
    top = ".".join(parts[:2]) if len(parts) > 1 else module
    return "taskloss.utils" if top in HELPERS else top


def test_find_cycle_reports_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_modules():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_no_import_cycle_between_subpackages():
    graph: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        graph.setdefault(_subpackage(m), set()).update(_subpackage(d) for d in deps if _subpackage(d) != _subpackage(m))
    cycle = _find_cycle(graph)
    assert cycle is None, "subpackages import each other: " + " → ".join(cycle)


def test_top_level_holds_only_subpackages_and_the_shared_helpers():
    """Besides the subpackages, three rooms of shared helpers: utils (paths, devices, seeding), validation (how
    inputs are checked) and parameter_vectors (parameters as flat vectors), and the lazy-import helper."""
    top = {p.name for p in PKG.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__.py", "utils.py", "validation.py", "parameter_vectors.py", "_lazy.py",
                   *(s.split(".")[1] for s in SUBPACKAGES)}


@pytest.mark.parametrize("pkg", SUBPACKAGES)
def test_subpackage_declares_notebooks_and_public_names(pkg):
    mod = importlib.import_module(pkg)
    assert mod.__doc__ and len(mod.__doc__) > 100, f"{pkg}/__init__.py needs a docstring naming its notebooks"
    assert hasattr(mod, "__all__") and mod.__all__, f"{pkg} must declare __all__"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{pkg}.__all__ names missing attributes: {missing}"
    assert len(set(mod.__all__)) == len(mod.__all__), f"{pkg}.__all__ repeats names"


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if p.name != "__init__.py"))
def test_module_all_names_only_its_own_definitions(module):
    """No re-exports between modules: a public name lives in exactly one module (the subpackage __init__ collects)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                defined.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
    mod = importlib.import_module(module)
    foreign = [n for n in getattr(mod, "__all__", []) if n not in defined]
    assert not foreign, f"{module}.__all__ re-exports {foreign}: import them from where they are defined"


_REF = re.compile(r"\btaskloss(?:\.[A-Za-z_]\w*)+")


def _resolves(ref: str) -> bool:
    try:
        resolve_name(ref)
    except LookupError:
        return False
    return True


def _prose_files():
    yield from sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    yield from sorted(PKG.rglob("*.py"))
    yield REPO_ROOT / "README.md"
    yield REPO_ROOT / "data" / "README.md"


@pytest.mark.parametrize("path", list(_prose_files()), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_named_taskloss_objects_exist(path):
    """Every ``taskloss.x.y`` a notebook, docstring or README names resolves to a real module or object."""
    text = path.read_text(encoding="utf-8")
    text = text.replace("taskloss.text.Tokenizer/1", "")     # a file-format tag stored in tokenizer.json
    refs = {r.rstrip(".") for r in _REF.findall(text)}
    refs = {r for r in refs if not r.startswith(("taskloss.egg", "taskloss.results.start(")) and r != "taskloss"}
    bad = sorted(r for r in refs if not _resolves(r))
    assert not bad, f"{path.name} names objects that do not exist: {bad}"


def _named_notebooks(text: str) -> set[str]:
    """The notebook numbers a text names: ``NN_topic`` names, ``notebook NN``, and every number of a range
    ``notebooks NN–MM`` (a range is a list too: each of its numbers must exist)."""
    named = set(re.findall(r"\b(\d\d)_[a-z][a-z_]*[a-z]\b", text))
    named |= set(re.findall(r"notebooks? (\d\d)\b", text))
    for a, b in re.findall(r"notebooks? (\d\d)\s*[–-]\s*(\d\d)\b", text):
        named |= {f"{i:02d}" for i in range(int(a), int(b) + 1)}
    return named


def _bad_notebook_names(text: str) -> list[str]:
    """What a text names that is not a notebook: missing numbers, and ``NN_topic`` names that are not the
    notebook's (or a prefix of it)."""
    bad = sorted(n for n in _named_notebooks(text) if n not in NOTEBOOK_IDS)
    for full in sorted(set(re.findall(r"\b\d\d_[a-z][a-z_]*[a-z]\b", text))):
        if full[:2] in NOTEBOOK_IDS and not (full == NOTEBOOK_IDS[full[:2]] or NOTEBOOK_IDS[full[:2]].startswith(full)):
            bad.append(full)
    return bad


def test_notebook_references_check_can_fail():
    assert _bad_notebook_names("Used by notebooks 02–99.") == [str(n) for n in range(2, 100)
                                                                if f"{n:02d}" not in NOTEBOOK_IDS]
    assert _bad_notebook_names("Derived in 01_optimization_as_sampling.") == []
    assert _bad_notebook_names("Derived in 01_optimisation.") == ["01_optimisation"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "taskloss"))
def test_docstring_notebook_references_exist(module):
    """'notebook NN', 'notebooks NN–MM' and 'NN_topic' in a module name notebooks that exist (d2l's checked
    'Defined in')."""
    bad = _bad_notebook_names(MODULES[module].read_text(encoding="utf-8"))
    assert not bad, f"{module} names notebooks that do not exist: {bad}"


# ------------------------------------------------------------------ "used by notebooks", derived from imports
def _notebook_imports() -> dict[str, set[str]]:
    """Subpackage name (``"search"``, ``"utils"``…) → the numbers of the notebooks that import it."""
    used: dict[str, set[str]] = {}
    for nb in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        for node in ast.walk(ast.parse(nb.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [f"taskloss.{a.name}" for a in node.names] if node.module == "taskloss" else [node.module]
            else:
                continue
            for m in mods:
                parts = m.split(".")
                if parts[0] == "taskloss" and len(parts) > 1:
                    used.setdefault(_subpackage(m).split(".")[1], set()).add(nb.stem[:2])
    return used


USED = _notebook_imports()


def _numbers(text: str) -> set[str]:
    """``"02, 03–05, 16"`` → {"02", "03", "04", "05", "16"}."""
    out: set[str] = set()
    for a, b in re.findall(r"\b(\d\d)(?:\s*[–-]\s*(\d\d))?\b", text):
        out |= {f"{i:02d}" for i in range(int(a), int(b or a) + 1)}
    return out


def _declared_notebooks(doc: str) -> set[str] | None:
    """The notebooks of a subpackage docstring's ``Notebooks:`` paragraph (parenthesized asides left out);
    every notebook if it says "Every notebook uses it"; ``None`` when it declares none."""
    if "Every notebook uses it" in doc:
        return set(NOTEBOOK_IDS)
    m = re.search(r"^Notebooks?: (.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if m is None:
        return None
    text, depth, plain = m.group(1), 0, ""
    for ch in text:                              # drop "(…)" asides, nested ones too
        depth += ch == "("
        plain += ch if depth == 0 else ""
        depth -= ch == ")" and depth > 0
    return set(re.findall(r"\b(\d\d)_[a-z]", plain))


def test_declared_notebooks_parser_can_fail():
    assert _declared_notebooks("Notebooks: 01_a, 02_b (after 05_c).\n\nModules:") == {"01", "02"}
    assert _declared_notebooks("Nothing here.") is None
    assert _numbers("(02, 05–07, 16)") == {"02", "05", "06", "07", "16"}


@pytest.mark.parametrize("pkg", SUBPACKAGES)
def test_subpackage_notebook_list_is_the_notebooks_that_import_it(pkg):
    """The ``Notebooks:`` paragraph of each subpackage lists exactly the notebooks that import it."""
    doc = importlib.import_module(pkg).__doc__ or ""
    declared = _declared_notebooks(doc)
    used = USED.get(pkg.split(".")[1], set())
    if declared is None:
        assert not used, f"{pkg} declares no notebooks but {sorted(used)} import it"
    else:
        assert declared == used, f"{pkg} declares notebooks {sorted(declared)}, the imports say {sorted(used)}"


def _root_bullets() -> dict[str, str]:
    """Subpackage → the text of its bullet in ``taskloss/__init__.py``'s docstring (continuation lines joined)."""
    import taskloss
    bullets: dict[str, str] = {}
    current = None
    for line in (taskloss.__doc__ or "").splitlines():
        m = re.match(r"- :mod:`taskloss\.(\w+)`", line)
        if m:
            current = m.group(1)
            bullets[current] = line
        elif current and line.startswith("  "):
            bullets[current] += " " + line.strip()
        else:
            current = None
    return bullets


def test_root_docstring_lists_every_subpackage_with_the_notebooks_that_import_it():
    bullets = _root_bullets()
    assert set(bullets) == {s.split(".")[1] for s in SUBPACKAGES} | {"utils"}
    for pkg, text in bullets.items():
        tail = re.search(r"\(([^()]*)\)$", text)
        numbers = _numbers(tail.group(1)) if tail and re.search(r"\d\d", tail.group(1)) else set()
        assert numbers == USED.get(pkg, set()), (f"taskloss/__init__.py lists notebooks {sorted(numbers)} for {pkg}, "
                                                 f"the imports say {sorted(USED.get(pkg, set()))}")


def _subpackage_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        if m == "taskloss":
            continue
        graph.setdefault(_subpackage(m), set()).update(_subpackage(d) for d in deps if _subpackage(d) != _subpackage(m))
    return {k.split(".")[1]: {d.split(".")[1] for d in v} for k, v in graph.items()}


def _declared_dependencies() -> dict[str, set[str]]:
    import taskloss
    doc = taskloss.__doc__ or ""
    block = doc[doc.index("Dependencies point one way"):]
    out: dict[str, set[str]] = {}
    for left, right in re.findall(r"^- (.+?): (.+)$", block, re.M):
        deps = set() if right.strip() == "nothing" else set(re.findall(r"``(\w+)``", right))
        for pkg in re.findall(r"``(\w+)``", left):
            out[pkg] = deps
    return out


def test_the_dependency_list_of_the_root_docstring_is_the_import_graph():
    """Each line ``- a, b: c, d`` of ``taskloss/__init__.py`` says that ``a`` and ``b`` import exactly ``c`` and
    ``d`` (other subpackages, ``utils`` included); every subpackage has its line."""
    declared, actual = _declared_dependencies(), _subpackage_graph()
    assert declared == actual, {k: (sorted(declared.get(k, ())), sorted(actual.get(k, ())))
                                for k in set(declared) | set(actual) if declared.get(k) != actual.get(k)}


def test_resolve_name_finds_modules_and_attributes_and_refuses_the_rest():
    import taskloss.search.mgs as mgs_module

    assert resolve_name("taskloss.search.mgs") is mgs_module
    assert resolve_name("taskloss.search.mgs.MGS") is mgs_module.MGS
    for missing in ("taskloss.search.no_such_name", "no_such_package.x"):
        with pytest.raises(LookupError, match="no"):
            resolve_name(missing)
    with pytest.raises(ValueError, match="dotted name"):
        resolve_name("taskloss..search")
    with pytest.raises(TypeError, match="str"):
        resolve_name(3)
