"""The numerics fingerprint of a run: what decides the bits a notebook computes on this machine.

Two runs of the same code with the same seeds compute the same bits only when they use the same kernels: the same
processor, the same vectorized code path of PyTorch (``torch.backends.cpu.get_cpu_capability()``, which
``ATEN_CPU_CAPABILITY=default|avx2|avx512`` lowers), the same BLAS build and its code path (MKL's
``MKL_ENABLE_INSTRUCTIONS`` and ``MKL_CBWR``, oneDNN's ``ONEDNN_MAX_CPU_ISA``), the same library versions and the
same number of threads (a reduction split over threads sums in another order), and the same accelerator when the
run used one. A training loop amplifies a last-bit difference into a different trajectory, so a trained model's
metric reproduces to round-off only where every one of these agrees.

:func:`numerics_fingerprint` reads them; :func:`same_numerics` says whether two fingerprints can compute the same
bits; :func:`describe` writes one as a short line for messages; :func:`emulation_env` gives the variables that make
this machine compute like a lesser one (``make test-portable``; ``python -m taskloss.results.fingerprint
--emulate`` prints them). Every run records its fingerprint in
``results.json`` (and the runner in ``meta.json``); ``make notebooks`` stores it in the committed notebook's
metadata, where the headline check of ``make test`` reads it (:mod:`taskloss.results.headlines`).
"""
from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from typing import Any

__all__ = ["NUMERICS_KEYS", "NUMERICS_ENV", "numerics_fingerprint", "same_numerics", "fingerprint_differences",
           "describe", "emulation_env"]

# Environment variables that change which kernels run (recorded as set, None when unset).
NUMERICS_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                "OPENBLAS_CORETYPE")
# The entries that must agree for two runs to compute the same bits. ``ATEN_CPU_CAPABILITY`` itself is not one:
# its effect is the ``cpu_capability`` entry (asking for the native capability changes nothing).
NUMERICS_KEYS = ("machine", "cpu", "cpu_capability", "torch", "blas", "numpy", "threads", "device",
                 "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE")


@lru_cache(maxsize=1)
def _cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else what :mod:`platform` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def _blas() -> str:
    """PyTorch's BLAS as its build reports it, e.g. ``"MKL 2024.2"`` or ``"OpenBLAS 0.3.27"``."""
    import torch

    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", config)
    if mkl:
        return f"MKL {mkl.group(1)}"
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    return blas.group(1) if blas else "unknown"


def numerics_fingerprint(device: Any = None) -> dict[str, Any]:
    """What decides this process's bits: processor, PyTorch's CPU capability, BLAS, library versions, threads,
    the environment variables of :data:`NUMERICS_ENV`, and the accelerator when ``device`` is one (its name;
    ``"cpu"`` otherwise). Plain JSON values."""
    import numpy as np
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    accel = "cpu"
    if dev.type == "cuda" and torch.cuda.is_available():
        accel = f"cuda:{torch.cuda.get_device_name(dev)}"
    elif dev.type != "cpu":
        accel = dev.type
    fp = {"machine": platform.machine(), "cpu": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
          "torch": torch.__version__, "blas": _blas(), "numpy": np.__version__, "threads": torch.get_num_threads(),
          "device": accel}
    fp.update({name: os.environ.get(name) for name in NUMERICS_ENV})
    return fp


def fingerprint_differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """The entries of :data:`NUMERICS_KEYS` in which ``a`` and ``b`` differ (every key when one is missing)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return list(NUMERICS_KEYS)
    return [k for k in NUMERICS_KEYS if a.get(k) != b.get(k)]


def same_numerics(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two fingerprints can compute the same bits (every entry of :data:`NUMERICS_KEYS` equal). A missing
    fingerprint is never the same: a result without one cannot be assumed to come from this machine."""
    return not fingerprint_differences(a, b)


def describe(fp: dict[str, Any] | None) -> str:
    """One line for a message: ``"x86_64 Intel(R) Xeon(R) Processor, AVX512, torch 2.13.0+cpu, MKL 2024.2,
    1 thread, cpu"`` plus any numerics variable that is set."""
    if not isinstance(fp, dict):
        return "no fingerprint recorded"
    threads = fp.get("threads")
    parts = [f"{fp.get('machine', '?')} {fp.get('cpu', '?')}", str(fp.get("cpu_capability", "?")),
             f"torch {fp.get('torch', '?')}", str(fp.get("blas", "?")), f"numpy {fp.get('numpy', '?')}",
             f"{threads} thread{'' if threads == 1 else 's'}", str(fp.get("device", "?"))]
    parts += [f"{k}={fp[k]}" for k in NUMERICS_ENV if fp.get(k) is not None]
    return ", ".join(parts)


# What a machine of each capability can be made to emulate: the next lower x86 code path of PyTorch, MKL and oneDNN.
_EMULATE = {
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "AVX2": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def emulation_env(capability: str | None = None) -> dict[str, str]:
    """Environment variables under which this machine computes as a machine one capability lower would: AVX-512 →
    AVX2 (an AVX2-only processor's code paths in PyTorch, MKL and oneDNN), AVX2 → the scalar default. ``capability``:
    the native one (``torch.backends.cpu.get_cpu_capability()`` when ``None``). Elsewhere (no vectorized x86 code
    path to lower) PyTorch's scalar default alone."""
    if capability is None:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    if not isinstance(capability, str):
        raise TypeError(f"capability must be a str, got {type(capability).__name__}")
    return dict(_EMULATE.get(capability.upper(), {"ATEN_CPU_CAPABILITY": "default"}))


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m taskloss.results.fingerprint",
                                 description="Print this machine's numerics fingerprint (JSON).")
    ap.add_argument("--emulate", action="store_true",
                    help="print instead the NAME=VALUE variables that emulate a machine one capability lower")
    args = ap.parse_args(argv)
    if args.emulate:
        print(" ".join(f"{k}={v}" for k, v in emulation_env().items()))
    else:
        print(json.dumps(numerics_fingerprint(), indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through the command line in the tests
    raise SystemExit(_main())
