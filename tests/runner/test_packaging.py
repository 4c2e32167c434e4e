"""Installation files agree: environment.yml lists the packages pyproject.toml requires (names normalized);
the license is stated once in LICENSE and matches pyproject and CITATION.cff."""
from __future__ import annotations

import re

import tomllib
import yaml

from taskloss.utils import REPO_ROOT

# conda-forge names that differ from the PyPI names in pyproject.toml
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _norm(requirement: str) -> str:
    """PEP 503 name of a requirement string ('Foo_bar[x]>=1; marker' → 'foo-bar')."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_packages() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(r) for r in reqs} - {"taskloss"}


def environment_packages() -> set[str]:
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    names = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            names |= {_norm(r) for r in dep.get("pip", []) if not r.startswith("-")}
        else:
            conda = re.split(r"[=<>! ]", dep, maxsplit=1)[0]
            names.add(_norm(CONDA_TO_PYPI.get(conda, conda)))
    return names - NOT_PACKAGES


def test_normalization():
    assert _norm("Opt_Einsum>=3") == "opt-einsum" and _norm("taskloss[test]") == "taskloss"
    assert _norm("linear_operator") == _norm("linear-operator")


def test_environment_yml_and_pyproject_list_the_same_packages():
    env, pyproject = environment_packages(), pyproject_packages()
    assert env == pyproject, (f"only in environment.yml: {sorted(env - pyproject)}; "
                              f"only in pyproject.toml: {sorted(pyproject - env)}")


def test_environment_yml_uses_conda_forge_only():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]  # the pytorch channel no longer publishes current PyTorch
    assert "-e ." in next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]


def test_license_and_citation_agree_with_pyproject():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    text = (REPO_ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "taskloss contributors" in text
    cff = yaml.safe_load((REPO_ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT" and cff["version"] == project["version"]
    assert cff["authors"] and cff["title"]
