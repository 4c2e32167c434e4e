"""``make lint`` in the test suite: ruff on the package, with the configuration of ``pyproject.toml`` (pyflakes,
import order, and one docstring convention — Google style, Args / Returns / Raises, every argument named)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from taskloss.utils import REPO_ROOT


def test_ruff_passes_on_the_package():
    pytest.importorskip("ruff", reason="ruff is a dev dependency (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "taskloss", "--output-format", "concise"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_docstring_rules_are_selected():
    """The convention is enforced, not just configured: a missing Args entry is an error."""
    pytest.importorskip("ruff", reason="ruff is a dev dependency (pip install -e '.[dev]')")
    bad = 'def f(a, b):\n    """Sum.\n\n    Args:\n        a: one number.\n    """\n    return a + b\n'
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--stdin-filename", "taskloss/probe.py", "-"],
                          cwd=REPO_ROOT, input=bad, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "D417" in proc.stdout, proc.stdout + proc.stderr
