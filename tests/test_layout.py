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


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


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


def test_top_level_holds_only_subpackages_and_utils():
    top = {p.name for p in PKG.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert top == {"__init__.py", "utils.py", *(s.split(".")[1] for s in SUBPACKAGES)}


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "taskloss"))
def test_docstring_notebook_references_exist(module):
    """'notebook NN' / 'NN_topic' in a module's docstrings names a notebook that exists (d2l's checked 'Defined in')."""
    text = MODULES[module].read_text(encoding="utf-8")
    named = set(re.findall(r"\b(\d\d)_[a-z][a-z_]*[a-z]\b", text))
    named |= set(re.findall(r"notebooks? (\d\d)\b", text))
    missing = sorted(n for n in named if n not in NOTEBOOK_IDS)
    assert not missing, f"{module} names notebooks that do not exist: {missing}"
    for full in set(re.findall(r"\b\d\d_[a-z][a-z_]*[a-z]\b", text)):
        if full[:2] in NOTEBOOK_IDS:
            assert full == NOTEBOOK_IDS[full[:2]] or NOTEBOOK_IDS[full[:2]].startswith(full), \
                f"{module} names {full}, but notebook {full[:2]} is {NOTEBOOK_IDS[full[:2]]}"


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
