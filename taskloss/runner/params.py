"""Notebook parameters: read the ``parameters`` cell, validate and coerce overrides before anything executes.

A notebook's ``parameters`` cell holds flat, typed constants, one per line, each explained by its trailing
comment::

    steps: int = 200          # [> 0] optimizer steps per run
    lr: float = 1e-3          # [> 0, ≤ 1] Adam learning rate
    label: str = ""           # empty: the default corpus

The comment is the parameter's help text (``python -m taskloss.runner params NN`` and ``papermill
--help-notebook`` show it). A bracket of bounds in it, ``[> 0]``, ``[≥ 1]`` or several joined by commas
(``[> 0, < 1]``), is a constraint that every
run's value must meet (each element of a list); the runner checks it before a kernel starts. A bounded value
must also be finite (``.inf`` and ``.nan`` are refused) unless the bracket says ``inf`` (``[> 0, inf]``: a
limit that may be switched off). A ``[data]`` tag marks a ``str`` parameter that names a file or folder the
notebook reads (``corpus_path: str = ""  # [data] a WikiText folder``): its bytes join the run's key, so a
finished run is redone when the data changes.

**One ``=`` a line.** Papermill reads a parameter only from a line with exactly one ``=`` (it skips the others
with "Unable to parse line" and then calls the parameter unknown), so a comment never holds one: bounds are
written ``≥``/``≤`` (the ASCII ``>=``/``<=`` are still read here, for old notebooks), and prose says "is" rather
than "=". ``tests/runner/test_papermill.py`` holds every notebook to this through papermill's own parser.

Values from the command line (``-p lr 1e-4``) and from YAML files are read with the YAML 1.2 core schema:
``1e-4`` is a float and ``no``/``on``/``yes`` are strings (PyYAML follows YAML 1.1, where ``1e-4`` is a string
and ``no`` is ``False``). A ``str`` parameter takes the text exactly as written, so ``label: null`` or
``-p label no`` gives the string ``"null"`` or ``"no"``, never ``"None"`` or ``"False"``.
"""
from __future__ import annotations

import ast
import io
import itertools
import math
import operator
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

__all__ = [
    "Parameter", "ParameterError", "read_notebook", "notebook_parameters", "coerce", "validate_overrides",
    "load_yaml_params", "parse_cli_value", "expand_grid", "check_constraints", "YAML12Loader",
    "percent_cells_tagged",
]


class ParameterError(ValueError):
    """An override names no parameter of the notebook, or has a value of the wrong type or out of bounds."""


@dataclass(frozen=True)
class Parameter:
    """One constant of a ``parameters`` cell: name, declared type, default, help comment and bounds."""

    name: str
    type_name: str  # "int", "float", "str", "bool", "list", "list[float]", ... or "any"
    default: Any
    help: str = ""
    bounds: tuple[tuple[str, float], ...] = ()  # e.g. ((">", 0.0),) from a comment holding "[> 0]"
    allow_inf: bool = False                     # the bracket says "inf": ±inf passes its bounds' check
    data: bool = False                          # "[data]": the value names a file or folder the notebook reads


class YAML12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the implicit scalars of the YAML 1.2 core schema (null, bool, int, float)."""


YAML12Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                           "tag:yaml.org,2002:null"}]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _pattern, _first in [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     list("-+.0123456789")),
]:
    YAML12Loader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def _construct_int12(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 16) if text.startswith("0x") else int(text, 10)  # YAML 1.2: a leading 0 is not octal


YAML12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int12)


def read_notebook(path: str | Path, source: str | None = None):
    """Read a notebook from its jupytext ``.py`` source or an ``.ipynb`` (nbformat node, kernel python3);
    ``source``: the file's text already read (parsed as the format ``path``'s suffix names)."""
    import jupytext

    path = Path(path)
    if source is not None:
        nb = jupytext.reads(source, fmt=path.suffix.lstrip(".") or "py")
    elif not path.exists():
        raise FileNotFoundError(f"notebook not found: {path}")
    else:
        nb = jupytext.read(path)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    for cell in nb.cells:  # papermill looks up ``metadata.tags`` on every cell
        cell.metadata.setdefault("tags", [])
    return nb


_TYPE_OF_VALUE = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}
_BOUND = re.compile(r"([<>]=?|[≤≥])\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_BOUNDS_BRACKET = re.compile(r"\[\s*((?:[<>]=?|[≤≥])\s*[^\]]*)\]")
_DATA_TAG = re.compile(r"\[data\]")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_UNICODE_OPS = {"≥": ">=", "≤": "<="}   # the form papermill can read (one "=" a line); stored as the ASCII op


def _comments_by_line(source: str) -> dict[int, str]:
    comments = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):  # the ast parse below reports broken cells
        pass
    return comments


def _parse_bounds(name: str, comment: str) -> tuple[tuple[tuple[str, float], ...], bool]:
    m = _BOUNDS_BRACKET.search(comment)
    if not m:
        return (), False
    bounds, allow_inf = [], False
    for part in m.group(1).split(","):
        if part.strip() == "inf":
            allow_inf = True
            continue
        b = _BOUND.fullmatch(part.strip())
        if not b:
            raise ParameterError(f"parameter {name!r}: cannot read the bound {part.strip()!r} in '[{m.group(1)}]' "
                                 "(write e.g. [> 0], [≥ 1] or [> 0, ≤ 1])")
        bounds.append((_UNICODE_OPS.get(b.group(1), b.group(1)), float(b.group(2))))
    return tuple(bounds), allow_inf


_PERCENT_CELL = re.compile(r"^# %%(?P<rest>.*)$")
_TAGS = re.compile(r"""tags\s*=\s*\[(?P<tags>[^\]]*)\]""")


def percent_cells_tagged(text: str, tag: str) -> list[str]:
    """The sources of the cells of a jupytext percent-format text (``# %%`` cell markers) that carry ``tag`` — what
    ``jupytext.reads(text).cells`` gives for them, without importing the notebook stack (seconds): the runner reads
    a notebook's parameters through this. ``tests/runner/test_params.py`` checks it against jupytext on every
    notebook."""
    cells: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        m = _PERCENT_CELL.match(line)
        if m:
            tags = _TAGS.search(m.group("rest"))
            names = [t.strip().strip("'\"") for t in tags.group("tags").split(",")] if tags else []
            cells.append((names, []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for names, lines in cells:
        if tag in names:
            while lines and not lines[-1].strip():
                lines.pop()
            out.append("\n".join(lines).strip("\n"))
    return out


def notebook_parameters(nb_or_path) -> dict[str, Parameter]:
    """The parameters of a notebook's ``parameters``-tagged cell, with declared type, default, help and bounds.

    The cell is parsed with :mod:`ast` (every top-level ``name: type = value`` or ``name = value``), so comments
    and layout cannot hide a parameter; the type is the annotation, else the type of the literal default. The
    help text is the comment on the parameter's line (as ``papermill --help-notebook`` shows it).
    """
    if isinstance(nb_or_path, (str, Path)) and Path(nb_or_path).suffix == ".py" and Path(nb_or_path).exists():
        cells = percent_cells_tagged(Path(nb_or_path).read_text(encoding="utf-8"), "parameters")
    else:
        nb = read_notebook(nb_or_path) if isinstance(nb_or_path, (str, Path)) else nb_or_path
        cells = [c.source for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ParameterError(f"notebook must have exactly one cell tagged 'parameters', found {len(cells)}")
    source = cells[0]
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ParameterError(f"parameters cell does not parse: {exc}") from exc
    comments = _comments_by_line(source)
    params = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            name, annotation, value = node.target.id, ast.unparse(node.annotation), node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, annotation, value = node.targets[0].id, None, node.value
        else:
            raise ParameterError(f"parameters cell line {node.lineno}: only 'name: type = literal' is allowed")
        try:
            default = ast.literal_eval(value)
        except ValueError as exc:
            raise ParameterError(f"parameter {name!r}: default must be a literal") from exc
        type_name = (annotation or _TYPE_OF_VALUE.get(type(default), "any")).replace(" ", "")
        comment = comments.get(node.end_lineno, comments.get(node.lineno, ""))
        if name in params:
            raise ParameterError(f"parameter {name!r} is assigned twice in the parameters cell")
        data = bool(_DATA_TAG.search(comment))
        if data and type_name != "str":
            raise ParameterError(f"parameter {name!r}: [data] marks a str parameter (a path), not a {type_name}")
        bounds, allow_inf = _parse_bounds(name, _DATA_TAG.sub("", comment))
        params[name] = Parameter(name, type_name, default, comment, bounds, allow_inf, data)
    return params


def _base_type(type_name: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"(list|tuple)\[(\w+)\]", type_name)
    if m:
        return "list", m.group(2)
    if type_name in ("list", "tuple"):
        return "list", None
    return type_name, None


def coerce(param: Parameter, value: Any) -> Any:
    """Return ``value`` as the parameter's declared type, or raise :class:`ParameterError`.

    A ``str`` parameter accepts strings and numbers (``2024`` → ``"2024"``) but not ``None`` or booleans, which
    only a YAML reader without the parameter's type produces (quote them: ``label: "null"``).
    """
    base, item = _base_type(param.type_name)

    def fail(hint: str = ""):
        raise ParameterError(f"parameter {param.name!r} expects {param.type_name}, got {value!r} "
                             f"({type(value).__name__}){hint}")

    def scalar(t: str, v: Any) -> Any:
        if t == "bool":
            if isinstance(v, bool):
                return v
            fail()
        if t == "int":
            if isinstance(v, bool):
                fail()
            if isinstance(v, int):
                return v
            if isinstance(v, float) and v.is_integer():
                return int(v)
            fail()
        if t == "float":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                fail()
            return float(v)
        if t == "str":
            if v is None or isinstance(v, (bool, dict, list)):
                fail("; quote the text to pass it as a string")
            return v if isinstance(v, str) else str(v)
        return v

    if base == "list":
        if not isinstance(value, (list, tuple)):
            fail()
        return [scalar(item, v) if item else v for v in value]
    if base == "dict":
        if not isinstance(value, dict):
            fail()
        return value
    return scalar(base, value)


def check_constraints(params: dict[str, Parameter], values: dict[str, Any]) -> None:
    """Raise :class:`ParameterError` when a value breaks the bounds its parameter's comment declares
    (``[> 0]``), or is a NaN where bounds are declared."""
    for name, value in values.items():
        p = params.get(name)
        if p is None or not p.bounds:
            continue
        items = value if isinstance(value, list) else [value]
        for v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if math.isinf(v) and not p.allow_inf:
                raise ParameterError(f"parameter {name!r} must be finite, got {value!r}"
                                     f"{f' ({p.help})' if p.help else ''}")
            for op, bound in p.bounds:
                if math.isnan(v) or not _OPS[op](v, bound):
                    raise ParameterError(f"parameter {name!r} must be {op} {bound:g}, got {value!r}"
                                         f"{f' ({p.help})' if p.help else ''}")


def parse_cli_value(text: str, param: Parameter | None = None) -> Any:
    """Parse a command-line value with YAML 1.2 rules (``1e-4`` → float, ``[1,2]`` → list, ``true`` → bool).

    A ``str`` parameter takes the text as it is (so ``-p corpus_path 2024`` stays the string ``"2024"``); text
    that does not parse as YAML stays text (the type check then names the parameter).
    """
    if param is not None and param.type_name == "str":
        return text
    try:
        return yaml.load(text, Loader=YAML12Loader)
    except yaml.YAMLError:
        return text


def _yaml_error(path: Path, exc: yaml.YAMLError) -> ParameterError:
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ParameterError(f"{path}:{where}: not valid YAML: {problem}")


def load_yaml_params(path: str | Path, params: dict[str, Parameter] | None = None) -> dict[str, Any]:
    """A flat YAML mapping ``name: value`` (papermill parameter file), read with YAML 1.2 rules.

    Given the notebook's ``params``, a ``str`` parameter gets its value's text as written (``label: null`` →
    ``"null"``). Syntax errors raise :class:`ParameterError` naming the file, line and column.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"parameter file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ParameterError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    try:
        data = yaml.load(text, Loader=YAML12Loader) or {}
        root = yaml.compose(text, Loader=YAML12Loader)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from exc
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise ParameterError(f"{path}: expected a flat mapping 'name: value'")
    if isinstance(root, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, _ in root.value:
            if key_node.value in seen:
                raise ParameterError(f"{path}: line {key_node.start_mark.line + 1}: {key_node.value!r} is set twice "
                                     f"(first on line {seen[key_node.value]}); keep one")
            seen[key_node.value] = key_node.start_mark.line + 1
    if params and isinstance(root, yaml.MappingNode):
        for key_node, value_node in root.value:
            p = params.get(key_node.value)
            if p is not None and p.type_name == "str" and isinstance(value_node, yaml.ScalarNode):
                data[key_node.value] = value_node.value
    return data


def validate_overrides(params: dict[str, Parameter], overrides: dict[str, Any], *, source: str = "") -> dict:
    """Coerce every override to its parameter's type; unknown names raise with the list of valid names."""
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        where = f" in {source}" if source else ""
        raise ParameterError(
            f"unknown parameter(s) {unknown}{where}; this notebook's parameters are: {sorted(params)}")
    return {k: coerce(params[k], v) for k, v in overrides.items()}


def expand_grid(grid: dict[str, Iterable[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of a grid ``{name: [values]}`` in a deterministic order (first name varies slowest)."""
    if not grid:
        return [{}]
    names = list(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*(list(grid[n]) for n in names))]
