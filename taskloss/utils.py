"""Small shared helpers: the repository's paths, atomic writes, device resolution, seeding and dotted names.
Input validation lives in :mod:`taskloss.validation`, parameters as flat vectors in
:mod:`taskloss.parameter_vectors`.
"""
from __future__ import annotations

import importlib
import os
import random
import tempfile
from pathlib import Path

import numpy as np

from taskloss._lazy import _Lazy
from taskloss.validation import (
    check_device,
    check_int,
)

torch = _Lazy("torch", bind="torch", namespace=globals())
nn = _Lazy("torch.nn", bind="nn", namespace=globals())
Tensor = _Lazy("torch", "Tensor", bind="Tensor", namespace=globals())

__all__ = ["REPO_ROOT", "DATA_DIR", "RUNS_DIR", "atomic_write_text", "resolve_device", "seed_everything", "resolve_name"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
RUNS_DIR = REPO_ROOT / "runs"


def _process_umask() -> int:
    """The umask, read once at import (there is no getter: set and put back, before any thread exists)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file + rename, so readers never see half a file.

    The file gets the mode an ordinary ``open(path, "w")`` would give (0644 under the usual umask 022), not the
    0600 of the temporary file.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path, got {type(path).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` when available, else ``cpu``; anything else is passed to :class:`torch.device`.

    Asking for ``cuda`` (or ``mps``) on a machine without one, or a CUDA index beyond the devices present, raises
    instead of silently falling back or reaching torch's ``AssertionError: Torch not compiled with CUDA enabled``.
    """
    return check_device("device", device)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a CPU ``torch.Generator`` seeded the same way."""
    check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    return torch.Generator().manual_seed(seed)


def resolve_name(dotted: str):
    """The object a dotted name such as ``taskloss.search.mgs.MGS`` denotes: the longest importable module prefix,
    then attribute access for the rest. Raises ``LookupError`` when no prefix imports or an attribute is missing
    (the docstring-link checks of the layout tests and the book use it)."""
    if not isinstance(dotted, str):
        raise TypeError(f"dotted must be a str, got {type(dotted).__name__}")
    parts = dotted.split(".")
    if not dotted or not all(parts):
        raise ValueError(f"dotted must be a non-empty dotted name, got {dotted!r}")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                raise LookupError(f"{dotted}: {'.'.join(parts[:i])} has no attribute path {'.'.join(parts[i:])}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"{dotted}: no prefix of it is an importable module")


# ------------------------------------------------------------------------- parameters as flat vectors
