"""Small shared helpers: device resolution, seeding, input validation.

Every public entry point of :mod:`taskloss` validates its inputs through these functions so that errors are
uniform and clear (``ValueError`` for bad values, ``TypeError`` for bad types) and nothing returns NaN silently.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

__all__ = [
    "REPO_ROOT", "DATA_DIR", "RUNS_DIR", "atomic_write_text",
    "resolve_device", "seed_everything",
    "check_positive", "check_nonnegative", "check_probability", "check_int", "check_finite", "all_finite",
    "eval_mode",
    "check_ndim", "check_nonempty", "check_same_length", "check_floating", "check_token_ids", "count_parameters",
    "resolve_name",
]

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

    Asking for ``cuda`` on a machine without one raises instead of silently falling back.
    """
    if isinstance(device, torch.device):
        dev = device
    elif not isinstance(device, str):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    elif device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch.cuda.is_available() is False")
    return dev


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a CPU ``torch.Generator`` seeded the same way."""
    check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    return torch.Generator().manual_seed(seed)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def check_positive(name: str, value, *, allow_inf: bool = False) -> float:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be > 0{'' if allow_inf else ' and finite'}, got {value}")
    return v


def check_nonnegative(name: str, value) -> float:
    """Raise ``ValueError`` unless ``value`` is a finite number >= 0."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be >= 0 and finite, got {value}")
    return v


def check_probability(name: str, value) -> float:
    """Raise ``ValueError`` unless ``0 <= value <= 1``."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if not (0.0 <= v <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return v


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Raise unless ``value`` is an integer within ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every entry of a tensor is finite (no NaN, no ±inf); integer and bool tensors always are.

    Decided from the sum first: NaN and ±inf propagate through a sum, so a finite sum proves every entry finite,
    at the cost of one reduction (on a CPU ``torch.isfinite(t).all()`` is 10-40× slower: several passes and a
    temporary). A non-finite sum — a bad entry, or finite entries whose sum overflows — is settled by the
    entrywise test. One host synchronization on a GPU, as before."""
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return True
    s = tensor.detach().sum()
    if bool(torch.isfinite(s)):
        return True
    return bool(torch.isfinite(tensor).all())


def check_finite(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Raise ``ValueError`` if a floating tensor holds NaN or ±inf (:func:`all_finite`)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not all_finite(tensor):
        raise ValueError(f"{name} contains NaN or inf")
    return tensor


@contextlib.contextmanager
def eval_mode(model: nn.Module, enabled: bool = True):
    """``model.eval()`` inside the block (when ``enabled``), and every submodule's own ``training`` flag restored
    after it, also on error: a frozen, eval-mode submodule of a training model stays frozen (a plain
    ``model.train(was_training)`` switches it back on). Modules that do not override ``train``/``eval`` get their
    flags written directly (``Module.train`` walks the tree through ``Module.__setattr__``: ≈ 14 µs for a 4-module
    MLP, a third of its forward); a model already in eval mode throughout is left alone."""
    mods = list(model.modules()) if enabled else []
    flags = [m.training for m in mods]
    if not any(flags):              # disabled, or already in eval mode throughout: nothing to switch or restore
        yield model
        return
    # ``training`` is a plain instance attribute (``Module.__init__`` puts it in ``__dict__``): writing it there is
    # what ``Module.train`` does per module, without ``Module.__setattr__``'s parameter/buffer/module checks
    plain = all(type(m).train is nn.Module.train and type(m).eval is nn.Module.eval for m in mods)
    if plain:
        for m in mods:
            m.__dict__["training"] = False
    else:
        model.eval()
    try:
        yield model
    finally:
        for m, f in zip(mods, flags):
            if m.training != f:      # pre-order: a parent's train(f) is corrected below for its children
                if plain:
                    m.__dict__["training"] = f
                else:
                    m.train(f)


def check_floating(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    return tensor


def check_ndim(name: str, tensor: torch.Tensor, ndim: int | Iterable[int]) -> torch.Tensor:
    """Raise ``ValueError`` unless ``tensor.ndim`` is (one of) ``ndim``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if tensor.ndim not in allowed:
        raise ValueError(f"{name} must have ndim in {allowed}, got shape {tuple(tensor.shape)}")
    return tensor


def check_nonempty(name: str, obj) -> None:
    """Raise ``ValueError`` on an empty batch (tensor with a zero dimension, or empty sequence)."""
    n = obj.shape[0] if isinstance(obj, torch.Tensor) and obj.ndim > 0 else len(obj)
    if n == 0 or (isinstance(obj, torch.Tensor) and obj.numel() == 0):
        raise ValueError(f"{name} is empty (batch size 0)")


def check_same_length(**named) -> int:
    """Raise ``ValueError`` unless all arguments have the same leading length; return it."""
    lengths = {k: (v.shape[0] if isinstance(v, torch.Tensor) else len(v)) for k, v in named.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"batch sizes differ: {lengths}")
    return next(iter(lengths.values()))


def _is_transformed(t: torch.Tensor) -> bool:
    """True inside torch.func transforms (vmap/grad), where data-dependent checks (``.item()``) are impossible."""
    fn = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return bool(fn(t)) if fn is not None else False


def check_token_ids(name: str, idx, vocab_size: int, max_len: int | None = None) -> torch.Tensor:
    """Validate a token batch: integer tensor of shape ``[B, T]``, ``B, T ≥ 1``, ids in ``[0, vocab_size)``,
    ``T ≤ max_len``. Returns ``idx`` unchanged. (The range check is skipped inside torch.func transforms.)"""
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.LongTensor, got {type(idx).__name__}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (int64 or int32), got dtype {idx.dtype}")
    if idx.ndim != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {tuple(idx.shape)}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(idx.shape)} (need B ≥ 1 and T ≥ 1)")
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length T={idx.shape[1]} > max_len={max_len}; crop the context")
    if not _is_transformed(idx):
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} holds token ids in [{lo}, {hi}], outside [0, vocab_size={vocab_size})")
    return idx


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters of ``model`` (tied weights counted once)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


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
