"""Installation files agree: environment.yml lists the packages pyproject.toml requires (names normalized);
the license is stated once in LICENSE and matches pyproject and CITATION.cff."""
from __future__ import annotations

import os
import re

import pytest
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


def test_project_address_is_one_setting_that_agrees_everywhere():
    """No public address yet: [project.urls] names none and CITATION.cff has no repository-code (nothing
    invented); once Repository is set, CITATION.cff's repository-code must say the same (the book's launch buttons
    read Repository, docs/conf.py)."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    url = pyproject["project"].get("urls", {}).get("Repository")
    cff = yaml.safe_load((REPO_ROOT / "CITATION.cff").read_text())
    assert cff.get("repository-code") == url


def test_run_extra_holds_what_the_notebooks_import_beyond_the_package():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    run = {_norm(r) for r in project["optional-dependencies"]["run"]}
    assert {"captum", "emoloss", "accelerate"} <= run
    assert "taskloss[run]" in project["optional-dependencies"]["test"]
    assert "pytest" not in run and "jupyterlab" not in run


@pytest.mark.slow
def test_a_wheel_installed_outside_the_clone_loads_the_small_lm_and_finds_notebooks(tmp_path):
    """pip install <clone> (not editable): the wheel carries the small LM; taskloss-runs finds notebooks only when
    told where, and says so. Built without isolation and installed with --no-deps --target to stay cheap."""
    import subprocess
    import sys

    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(REPO_ROOT)], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path)
    if build.returncode != 0 and "No module named" in build.stderr:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    wheel, = wheels.glob("taskloss-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TASKLOSS_NOTEBOOKS")}
    env.update(PYTHONPATH=str(target), OMP_NUM_THREADS="1")
    probe = ("import taskloss, taskloss.lm as lm; m, t = lm.load_pretrained_lm(); "
             "print(taskloss.__file__); print(lm.PRETRAINED_DIR); print(t.vocab_size)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=elsewhere,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    file, folder, vocab = out.stdout.split()
    assert file.startswith(str(target)) and folder == str(target / "taskloss" / "lm" / "small_lm") and int(vocab) > 0
    cli = [sys.executable, "-m", "taskloss.runner"]
    lost = subprocess.run(cli + ["params", "12"], capture_output=True, text=True, env=env, cwd=elsewhere, timeout=300)
    assert lost.returncode == 2 and "no notebooks found (looked in" in lost.stderr and "--notebooks DIR" in lost.stderr
    found = subprocess.run(cli + ["--notebooks", str(REPO_ROOT / "notebooks"), "params", "12"], capture_output=True,
                           text=True, env=env, cwd=elsewhere, timeout=300)
    assert found.returncode == 0 and "Parameters of 12_implicit_gradient_regularization" in found.stdout
