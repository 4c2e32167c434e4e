"""How inputs are checked: the validators every public entry point of :mod:`taskloss` calls, so that errors are
uniform and clear (``ValueError`` for bad values, ``TypeError`` for bad types, each naming the argument) and nothing
returns NaN silently — numbers and flags (:func:`check_positive`, :func:`check_int`, :func:`check_bool`, …), tensors
(finite, floating, shapes, dtypes, devices, meta), generators, token ids, a model in evaluation mode
(:func:`eval_mode`), and sizes checked before anything is allocated (:func:`check_allocation`, :func:`check_steps`).
Every validator checks its own flags too.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Iterable, Mapping

import numpy as np

from taskloss._lazy import _Lazy

torch = _Lazy("torch", bind="torch", namespace=globals())
nn = _Lazy("torch.nn", bind="nn", namespace=globals())
Tensor = _Lazy("torch", "Tensor", bind="Tensor", namespace=globals())

__all__ = [
    "check_device",
    "check_generator",
    "check_dtype",
    "check_same_dtype",
    "check_allocation",
    "check_steps",
    "FLOAT_DTYPES",
    "LINALG_DTYPES",
    "INDEX_DTYPES",
    "format_bytes",
    "check_positive",
    "check_nonnegative",
    "check_probability",
    "check_int",
    "check_bool",
    "check_choice",
    "check_finite",
    "check_no_nan",
    "all_finite",
    "eval_mode",
    "is_transformed",
    "check_ndim",
    "check_nonempty",
    "check_same_length",
    "check_floating",
    "check_token_ids",
    "check_not_meta",
    "random_modules",
    "train_mode_error",
    "check_eval_mode",
    "check_iterable",
    "check_tensors",
    "check_module",
    "check_param_list",
]


def check_device(name: str, device, *, allow_none: bool = False) -> torch.device | None:
    """``device`` as a usable :class:`torch.device`.

    Args:
        name: the argument's name, for the message.
        device: ``"auto"`` (``cuda`` when available, else ``cpu``), a device string (``"cpu"``, ``"cuda:0"``) or a
            :class:`torch.device`; ``None`` when ``allow_none``.
        allow_none: pass ``None`` through (the argument's "follow the inputs" default).

    Returns:
        The device (``None`` for ``None``).

    Raises:
        TypeError: not a str or torch.device.
        ValueError: an unknown device string, or a device this machine does not have (``cuda`` without CUDA, a
            CUDA index beyond ``torch.cuda.device_count()``, ``mps`` without MPS).
    """
    if check_bool("allow_none", allow_none) and device is None:
        return None
    if isinstance(device, torch.device):
        dev = device
    elif not isinstance(device, str):
        raise TypeError(f"{name} must be a str or torch.device{' or None' if allow_none else ''}, "
                        f"got {type(device).__name__}")
    elif device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError as err:
            raise ValueError(f"{name}={device!r} is not a device: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={str(dev)!r} requested but torch.cuda.is_available() is False (use 'cpu' or "
                             "'auto')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={str(dev)!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}={str(dev)!r} requested but torch.backends.mps.is_available() is False")
    return dev


def check_generator(name: str, generator, device=None) -> torch.Generator | None:
    """``generator`` when it is ``None`` or a :class:`torch.Generator` on the device the draws happen on.

    Args:
        name: the argument's name, for the message.
        generator: ``None`` (torch's default generator) or a ``torch.Generator``.
        device: the device the random numbers are drawn on (a tensor's ``.device``); ``None`` skips that check.

    Returns:
        ``generator``.

    Raises:
        TypeError: anything else — a seed such as ``0`` is not a generator (``torch.Generator().manual_seed(0)``).
        ValueError: the generator lives on another device type than the draws (torch would refuse mid-call).
    """
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        hint = (f" (a seed? pass torch.Generator().manual_seed({generator}))"
                if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool) else "")
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(generator).__name__}{hint}")
    if device is not None and torch.device(device).type != generator.device.type:
        raise ValueError(f"{name} is a {generator.device.type} generator but the draws are on {torch.device(device)}: "
                         f"build it with torch.Generator(device={str(torch.device(device).type)!r})")
    return generator


# Accepted dtypes by role: floating inputs of most functions, inputs of linear algebra (solves, eigenvalues,
# Cholesky: float16/bfloat16 have no such kernels on a CPU and too few digits for them), integer ids and labels.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
LINALG_DTYPES = ("float32", "float64")
INDEX_DTYPES = ("int64", "int32")


def _dtype_names(allowed) -> tuple[str, ...]:
    return tuple(str(d).removeprefix("torch.") for d in allowed)


def check_dtype(name: str, tensor, allowed=LINALG_DTYPES, what: str | None = None) -> torch.Tensor:
    """``tensor`` when its dtype is one of ``allowed``.

    Args:
        name: the argument's name, for the message.
        tensor: a tensor.
        allowed: dtype names (``"float32"``) or ``torch.dtype`` objects; see :data:`LINALG_DTYPES`,
            :data:`FLOAT_DTYPES`, :data:`INDEX_DTYPES`.
        what: what the tensor holds, for the message (``"integer token ids"``).

    Returns:
        ``tensor``.

    Raises:
        TypeError: not a tensor, or a dtype outside ``allowed`` (the message lists them).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    _refuse_meta(name, tensor)
    names = _dtype_names(allowed)
    if str(tensor.dtype).removeprefix("torch.") not in names:
        if what:
            raise TypeError(f"{name} must hold {what} ({' or '.join(names)}), got dtype {tensor.dtype}")
        raise TypeError(f"{name} has dtype {tensor.dtype}; accepted: {', '.join(names)}")
    return tensor


def check_same_dtype(allowed=LINALG_DTYPES, **tensors) -> torch.dtype:
    """The one dtype shared by the named tensors, each of which must be one of ``allowed``.

    Mixed float32 / float64 inputs are refused, not promoted: promotion would silently compute in float64 what
    the caller meant in float32 (or the reverse, if an input were cast down), and the caller knows which they meant.

    Args:
        allowed: as in :func:`check_dtype`.
        **tensors: name → tensor (``None`` values are skipped).

    Returns:
        The common dtype.

    Raises:
        TypeError: a dtype outside ``allowed``, or two different dtypes (the message names each tensor's).
    """
    given = {k: check_dtype(k, t, allowed).dtype for k, t in tensors.items() if t is not None}
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k}: {str(d).removeprefix('torch.')}" for k, d in given.items())
        raise TypeError(f"mixed dtypes ({listed}): cast them to one dtype first (accepted: "
                        f"{', '.join(_dtype_names(allowed))})")
    if not given:
        raise ValueError("check_same_dtype needs at least one tensor")
    return next(iter(given.values()))


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``'7.28 TiB'``."""
    if not _is_number(n) or not math.isfinite(n):
        raise TypeError(f"n must be a finite number of bytes, got {type(n).__name__} {n!r}")
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _memory_of(device) -> int:
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(dev.index or 0).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):      # not POSIX: assume a generous 1 TiB rather than refuse
        return 2**40


def check_allocation(what: str, n_bytes: float, device=None, limit: int | None = None) -> None:
    """Refuse a computation whose estimated peak memory exceeds the device's memory, before allocating anything.

    Args:
        what: the call and the argument that sets the size, for the message (``"IntegratedGradients(n_steps=10**6)"``).
        n_bytes: the estimate, in bytes.
        device: where it would be allocated (``None``: the CPU's physical memory).
        limit: a bound in bytes in place of the device's memory.

    Raises:
        ValueError: ``n_bytes`` > the limit; the message gives both.
    """
    if not _is_number(n_bytes) or math.isnan(n_bytes):
        raise TypeError(f"n_bytes must be a number, got {type(n_bytes).__name__} {n_bytes!r}")
    if limit is not None:
        check_int("limit", limit, minimum=0)
    bound = _memory_of(check_device("device", device, allow_none=True)) if limit is None else int(limit)
    if n_bytes > bound:
        where = "this machine's memory" if limit is None else "the limit"
        raise ValueError(f"{what} would allocate about {format_bytes(n_bytes)}, more than {where} "
                         f"({format_bytes(bound)}): lower it, or process in smaller batches")


def check_steps(name: str, value, *, bytes_per_step: float, what: str | None = None, device=None,
                minimum: int = 1, limit: int | None = None) -> int:
    """A count or size (an int ≥ ``minimum``: steps, samples, classes, a padded width) whose memory,
    ``value × bytes_per_step``, fits the device — estimated and refused before anything is allocated.

    The one estimate-then-allocate check of the package: a function whose buffers grow with an argument passes
    that argument through it with the bytes one unit costs (``macro_f1``'s ``num_classes``, ``pad_sequences``'
    ``width``, the divergence frontier's ``n_lambda``, the attribution rules' ``n_steps``), so ``10**12`` ends in
    a ``ValueError`` naming the argument, not in the allocator's error or a ``MemoryError``.

    Args:
        name: the argument's name.
        value: the count.
        bytes_per_step: memory each step holds at once (e.g. one interpolated copy of the inputs and its gradient).
        what: the call, for the message (default: ``name=value``).
        device: where the memory is allocated.
        minimum: the smallest count.
        limit: a bound in bytes in place of the device's memory.

    Returns:
        ``int(value)``.

    Raises:
        TypeError, ValueError: as :func:`check_int`; ValueError from :func:`check_allocation` with the estimate.
    """
    n = check_int(name, value, minimum=check_int("minimum", minimum))
    if isinstance(bytes_per_step, bool) or not isinstance(bytes_per_step, (int, float, np.integer, np.floating)) \
            or not bytes_per_step >= 0:
        raise ValueError(f"bytes_per_step must be a number >= 0, got {bytes_per_step!r}")
    check_allocation(what or f"{name}={n}", float(n) * float(bytes_per_step), device, limit)
    return n


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def check_positive(name: str, value, *, allow_inf: bool = False) -> float:
    """``float(value)`` when it is a finite number > 0 (``+inf`` too when ``allow_inf``, a bool flag).

    Raises:
        TypeError: not a number (or a one-element tensor of one); ``allow_inf`` not a bool.
        ValueError: NaN, ≤ 0, or infinite without ``allow_inf``.
    """
    allow_inf = check_bool("allow_inf", allow_inf)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        _refuse_meta(name, value)
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
    """Raise unless ``value`` is an integer within ``[minimum, maximum]`` (bounds: ints or ``None``)."""
    for bound, b in (("minimum", minimum), ("maximum", maximum)):
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer))):
            raise TypeError(f"check_int's {bound} must be an int or None, got {type(b).__name__} {b!r}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_bool(name: str, value) -> bool:
    """``value`` as a Python ``bool``.

    Args:
        name: the argument's name, for the message.
        value: ``True``/``False`` or a ``numpy.bool_``.

    Returns:
        ``bool(value)``.

    Raises:
        TypeError: anything else — a string such as ``'no'`` (truthy), an int, ``None``: a flag is never coerced.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")


def _equal(a, b) -> bool:
    """``a == b`` as a plain bool; False where the comparison is elementwise (a tensor, an array) or fails."""
    try:
        eq = a is b or a == b
    except Exception:  # noqa: BLE001 — an object whose comparison raises is not one of the choices
        return False
    return isinstance(eq, (bool, np.bool_)) and bool(eq)


def check_choice(name: str, value, choices):
    """``value`` when it is one of ``choices``.

    Args:
        name: the argument's name, for the message.
        value: the option given.
        choices: the allowed options.

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not one of ``choices``.
    """
    choices = tuple(check_iterable("choices", choices))
    found = not isinstance(value, bool) and any(_equal(value, c) for c in choices)
    if not found:   # True == 1 would otherwise match a choice 1; an unhashable value is simply not an option
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every entry of a tensor is finite (no NaN, no ±inf); integer and bool tensors always are.

    Decided from the sum first: NaN and ±inf propagate through a sum, so a finite sum proves every entry finite,
    at the cost of one reduction (on a CPU ``torch.isfinite(t).all()`` is 10-40× slower: several passes and a
    temporary). A non-finite sum — a bad entry, or finite entries whose sum overflows — is settled by the
    entrywise test. One host synchronization on a GPU, as before."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_finite expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_meta:
        raise ValueError("all_finite: the tensor is on the meta device (shapes without data)")
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
    _refuse_meta(name, tensor)
    if not all_finite(tensor):
        raise ValueError(f"{name} contains NaN or inf")
    return tensor


def check_no_nan(name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` if ``tensor`` holds NaN (±inf allowed: a log density may be −inf)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    _refuse_meta(name, tensor)
    if bool(torch.isnan(tensor).any()):
        raise ValueError(f"{name} contains NaN")


def eval_mode(model: nn.Module, enabled: bool = True):
    """``model.eval()`` inside the block (when ``enabled``), and every submodule's own ``training`` flag restored
    after it, also on error: a frozen, eval-mode submodule of a training model stays frozen (a plain
    ``model.train(was_training)`` switches it back on). Modules that do not override ``train``/``eval`` get their
    flags written directly (``Module.train`` walks the tree through ``Module.__setattr__``: ≈ 14 µs for a 4-module
    MLP, a third of its forward); a model already in eval mode throughout is left alone."""
    enabled = check_bool("enabled", enabled)        # checked at the call, not when the block is entered
    if enabled and not isinstance(model, nn.Module):     # disabled: a no-op for any model (a function too)
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return _eval_mode(model, enabled)


@contextlib.contextmanager
def _eval_mode(model: nn.Module, enabled: bool):
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
    """``tensor`` after checking it is a floating-point tensor (``TypeError`` otherwise)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    _refuse_meta(name, tensor)
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    return tensor


def check_ndim(name: str, tensor: torch.Tensor, ndim: int | Iterable[int]) -> torch.Tensor:
    """Raise ``ValueError`` unless ``tensor.ndim`` is (one of) ``ndim``."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    _refuse_meta(name, tensor)
    allowed = (ndim,) if isinstance(ndim, (int, np.integer)) else tuple(check_iterable("ndim", ndim))
    if not allowed or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in allowed):
        raise TypeError(f"ndim must be an int or a collection of ints, got {ndim!r}")
    if tensor.ndim not in allowed:
        raise ValueError(f"{name} must have ndim in {allowed}, got shape {tuple(tensor.shape)}")
    return tensor


def check_nonempty(name: str, obj) -> None:
    """Raise ``ValueError`` on an empty batch (tensor with a zero dimension, or empty sequence); ``TypeError`` for
    something without a length (a number, a 0-d tensor)."""
    if isinstance(obj, torch.Tensor) and obj.ndim == 0 or not hasattr(obj, "__len__"):
        raise TypeError(f"{name} must be a batch (a tensor with a batch dimension or a sequence), got "
                        f"{type(obj).__name__}{' of shape ()' if isinstance(obj, torch.Tensor) else ''}")
    n = obj.shape[0] if isinstance(obj, torch.Tensor) and obj.ndim > 0 else len(obj)
    if n == 0 or (isinstance(obj, torch.Tensor) and obj.numel() == 0):
        raise ValueError(f"{name} is empty (batch size 0)")


def check_same_length(**named) -> int:
    """Raise ``ValueError`` unless all arguments have the same leading length; return it."""
    if not named:
        raise ValueError("check_same_length needs at least one named batch")
    for k, v in named.items():
        if isinstance(v, torch.Tensor) and v.ndim == 0 or not isinstance(v, torch.Tensor) and not hasattr(v, "__len__"):
            raise TypeError(f"{k} must be a batch (a tensor with a batch dimension or a sequence), got "
                            f"{type(v).__name__}")
    lengths = {k: (v.shape[0] if isinstance(v, torch.Tensor) else len(v)) for k, v in named.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"batch sizes differ: {lengths}")
    return next(iter(lengths.values()))


def is_transformed(t: torch.Tensor) -> bool:
    """Whether ``t`` is wrapped by a ``torch.func`` transform (vmap/grad), where data-dependent checks (``.item()``)
    are impossible."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"is_transformed expects a torch.Tensor, got {type(t).__name__}")
    fn = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return bool(fn(t)) if fn is not None else False


def check_token_ids(name: str, idx, vocab_size: int, max_len: int | None = None) -> torch.Tensor:
    """Validate a token batch: integer tensor of shape ``[B, T]``, ``B, T ≥ 1``, ids in ``[0, vocab_size)``.

    Also ``T ≤ max_len``; returns ``idx`` unchanged (the range check is skipped inside torch.func transforms).
    """
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a torch.LongTensor, got {type(idx).__name__}")
    _refuse_meta(name, idx)
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (int64 or int32), got dtype {idx.dtype}")
    if idx.ndim != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {tuple(idx.shape)}")
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(idx.shape)} (need B ≥ 1 and T ≥ 1)")
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length T={idx.shape[1]} > max_len={max_len}; crop the context")
    if not is_transformed(idx):
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} holds token ids in [{lo}, {hi}], outside [0, vocab_size={vocab_size})")
    return idx


def check_not_meta(name: str, obj) -> None:
    """Raise ``ValueError`` when a tensor, a module's parameters or buffers, or an iterable of tensors lies on the
    ``meta`` device (shapes without data: nothing can be computed from it).

    Args:
        name: what ``obj`` is, for the message.
        obj: a tensor, an ``nn.Module``, or an iterable of tensors (other items are ignored).

    Raises:
        ValueError: some tensor is on the meta device.
    """
    if isinstance(obj, nn.Module):
        tensors = list(obj.parameters()) + list(obj.buffers())
    elif isinstance(obj, torch.Tensor):
        tensors = [obj]
    elif isinstance(obj, Mapping):
        tensors = list(obj.values())
    else:
        tensors = list(check_iterable(name, obj))
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors):
        raise ValueError(f"{name} is on the meta device (shapes without data): materialize it first, e.g. "
                         "model.to_empty(device='cpu') and load its weights (load_state_dict(..., assign=True)), or "
                         "build it outside `with torch.device('meta')`")


def _refuse_meta(name: str, tensor) -> None:
    """The tensor validators' entry check: a meta tensor has no data to check or compute with."""
    if isinstance(tensor, torch.Tensor) and tensor.is_meta:
        check_not_meta(name, tensor)


# ------------------------------------------------------------------------- a deterministic forward
def random_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The ``Dropout`` (``p > 0``) and ``BatchNorm`` submodules of ``model``: random or batch-coupled in train mode."""
    check_module("model", model)
    kinds = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds) and not (
        isinstance(m, kinds[0]) and m.p == 0)]


def train_mode_error(modules: list[tuple[str, nn.Module]], model_name: str = "model",
                     purpose: str = "the per-example curvature is undefined",
                     fix: str = "computing curvature") -> str | None:
    """The refusal message for the first of ``modules`` (from :func:`random_modules`) in train mode, else None."""
    modules = list(check_iterable("modules", modules))
    if not all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], nn.Module) for e in modules):
        raise TypeError("modules must be (name, module) pairs, as random_modules returns")
    for name, m in modules:
        if m.training:
            return (f"module {name or model_name!r} ({type(m).__name__}) is in training mode: its outputs are random "
                    f"or couple the examples, so {purpose}; call model.eval() before {fix} (train mode again "
                    "afterwards)")
    return None


def check_eval_mode(module: nn.Module, *, purpose: str = "the per-example curvature is undefined",
                    fix: str = "computing curvature") -> None:
    """Raise ``ValueError`` if ``module`` holds a train-mode Dropout or BatchNorm (random / batch-coupled outputs).

    One policy for every method that needs a deterministic, row-wise forward: the Fisher / GGN functions, the
    diagonal preconditioner, Hessian-free and K-FAC (:mod:`taskloss.curvature.model_io`), integrated gradients
    (:class:`taskloss.attribution.IntegratedGradients`) and the harness's dense Hessian
    (:meth:`taskloss.harness.Problem.grad_hessian`) refuse them with this message.

    Args:
        module: the model (any other object is left alone: a plain function has no modes).
        purpose: what the random forward would spoil, for the message.
        fix: what to call ``model.eval()`` before, for the message.

    Raises:
        ValueError: a train-mode Dropout (``p > 0``) or BatchNorm; the message names the submodule.
    """
    if not isinstance(module, nn.Module):
        return
    msg = train_mode_error(random_modules(module), type(module).__name__, purpose, fix)
    if msg is not None:
        raise ValueError(msg)


# ------------------------------------------------------------------------- containers of inputs
def check_iterable(name: str, obj) -> Iterable:
    """``obj`` when it is a collection to iterate over (a list, tuple, generator, dict…), not a string, a number,
    a 0-d tensor or an array of objects whose truth value is ambiguous.

    Args:
        name: the argument's name, for the message.
        obj: the collection.

    Returns:
        ``obj``.

    Raises:
        TypeError: anything else.
    """
    if isinstance(obj, (str, bytes)) or (isinstance(obj, torch.Tensor) and obj.ndim == 0) or \
            (isinstance(obj, np.ndarray) and (obj.ndim == 0 or obj.dtype == object)) or not isinstance(obj, Iterable):
        raise TypeError(f"{name} must be a collection (list, tuple, …), got {type(obj).__name__}")
    return obj


def check_tensors(name: str, obj) -> list:
    """The tensors of a dict (its values) or of an iterable, as a list; ``TypeError`` for anything else or an
    element that is not a tensor.

    Args:
        name: the argument's name, for the message.
        obj: a mapping name → tensor or an iterable of tensors.

    Returns:
        The tensors as a list.

    Raises:
        TypeError: not a collection, or an element that is not a tensor.
    """
    values = list(obj.values()) if isinstance(obj, Mapping) else list(check_iterable(name, obj))
    for i, t in enumerate(values):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return values


def check_param_list(params) -> None:
    """An optimizer's ``params``: an iterable of tensors or parameter groups, not a single tensor, a number or a
    string (``TypeError``, before ``torch.optim.Optimizer`` says the same from inside torch).

    Args:
        params: what the optimizer was given.

    Raises:
        TypeError: a tensor, a non-iterable, a string or a dict (a dict is one parameter group: pass a list).
    """
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or parameter groups, got a single Tensor (wrap it in "
                        "a list)")
    if isinstance(params, Mapping):
        raise TypeError("params must be an iterable of tensors or parameter groups, got a dict (a parameter group: "
                        "pass [group])")
    check_iterable("params", params)


def check_module(name: str, obj) -> nn.Module:
    """``obj`` when it is an ``nn.Module`` (``TypeError`` otherwise), with no parameter or buffer on the meta
    device (``ValueError``).

    Args:
        name: the argument's name, for the message.
        obj: the module.

    Returns:
        ``obj``.

    Raises:
        TypeError: not a module.
        ValueError: meta parameters or buffers.
    """
    if not isinstance(obj, nn.Module):
        raise TypeError(f"{name} must be an nn.Module, got {type(obj).__name__}")
    check_not_meta(name, obj)
    return obj
