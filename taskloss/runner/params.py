"""Notebook parameters: read the ``parameters`` cell, validate and coerce overrides before anything executes.

A notebook's ``parameters`` cell holds flat, typed constants (``steps: int = 200``). Papermill infers their
names and annotations; this module turns a user's overrides (strings from ``-p name value``, values from YAML
files) into values of the declared types, and rejects unknown names or wrong types with a clear message.
"""
from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

__all__ = [
    "Parameter", "ParameterError", "read_notebook", "notebook_parameters", "coerce", "validate_overrides",
    "load_yaml_params", "parse_cli_value", "expand_grid",
]


class ParameterError(ValueError):
    """An override names no parameter of the notebook, or has a value of the wrong type."""


@dataclass(frozen=True)
class Parameter:
    name: str
    type_name: str  # "int", "float", "str", "bool", "list", "list[float]", ... or "any"
    default: Any


def read_notebook(path: str | Path):
    """Read a notebook from its jupytext ``.py`` source or an ``.ipynb`` (nbformat node, kernel python3)."""
    import jupytext

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"notebook not found: {path}")
    nb = jupytext.read(path)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    for cell in nb.cells:  # papermill looks up ``metadata.tags`` on every cell
        cell.metadata.setdefault("tags", [])
    return nb


_TYPE_OF_VALUE = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}


def notebook_parameters(nb_or_path) -> dict[str, Parameter]:
    """The parameters of a notebook's ``parameters``-tagged cell, with declared type and default value.

    The cell is parsed with :mod:`ast` (every top-level ``name: type = value`` or ``name = value``), so comments
    and layout cannot hide a parameter; the type is the annotation, else the type of the literal default.
    """
    nb = read_notebook(nb_or_path) if isinstance(nb_or_path, (str, Path)) else nb_or_path
    tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ParameterError(f"notebook must have exactly one cell tagged 'parameters', found {len(tagged)}")
    try:
        tree = ast.parse(tagged[0].source)
    except SyntaxError as exc:
        raise ParameterError(f"parameters cell does not parse: {exc}") from exc
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
        type_name = annotation or _TYPE_OF_VALUE.get(type(default), "any")
        params[name] = Parameter(name, type_name.replace(" ", ""), default)
    return params


def _base_type(type_name: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"(list|tuple)\[(\w+)\]", type_name)
    if m:
        return "list", m.group(2)
    if type_name in ("list", "tuple"):
        return "list", None
    return type_name, None


def coerce(param: Parameter, value: Any) -> Any:
    """Return ``value`` as the parameter's declared type, or raise :class:`ParameterError`."""
    base, item = _base_type(param.type_name)

    def fail():
        raise ParameterError(
            f"parameter {param.name!r} expects {param.type_name}, got {value!r} ({type(value).__name__})")

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
            if isinstance(v, (dict, list)):
                fail()
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


def parse_cli_value(text: str, param: Parameter | None = None) -> Any:
    """Parse a command-line value with YAML rules (``0.1`` → float, ``[1,2]`` → list, ``true`` → bool).

    A ``str`` parameter takes the text as it is (so ``-p corpus_path 2024`` stays the string ``"2024"``).
    """
    if param is not None and param.type_name == "str":
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def load_yaml_params(path: str | Path) -> dict[str, Any]:
    """A flat YAML mapping ``name: value`` (papermill parameter file)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"parameter file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise ParameterError(f"{path}: expected a flat mapping 'name: value'")
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
