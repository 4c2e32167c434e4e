"""Timing and peak-memory helpers shared by the ``benchmarks/bench_*.py`` scripts (not a benchmark itself:
``run_all.py`` only runs ``bench_*.py``).

* :func:`sync` — ``torch.cuda.synchronize(device)`` on CUDA, nothing elsewhere;
* :func:`median_time` — median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed
  ones, ``time.perf_counter``, CUDA-synchronized before and after each call;
* :func:`interleaved_median_times` — the same for several functions measured round-robin (one call of each per
  round), so that a change in the machine's load during the run hits every method alike: ratios between them
  stay meaningful on a busy machine;
* :func:`peak_bytes` — peak memory of one call above what is live before it: on CUDA
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on CPU the allocator trace of
  ``torch.profiler`` (``profile_memory=True``) — the maximum of its running "Total Allocated" counter minus its
  first value, i.e. bytes handed out by torch's CPU allocator, not RSS;
* :func:`rss_peak_delta` — the peak resident set size of the process during one call above its RSS before it
  (Linux: the kernel's high-water mark ``VmHWM``, reset before the call): what the operating system sees, allocator
  caching and fragmentation included; run it in a fresh process per measurement;
* :func:`run_worker` — one measurement in a fresh Python process (``script --worker JSON``), its JSON result;
* :func:`value_range` — ``"lo–hi"`` (or one value) of repeated measurements, for the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

import torch

__all__ = ["sync", "median_time", "interleaved_median_times", "peak_bytes", "allocator_peak", "rss_peak_delta",
           "run_worker", "value_range"]


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA only), so that a timer brackets the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` synchronized calls, after ``warmup`` untimed calls (vmap
    tracing, allocator caches)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_median_times(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                             warmup: int = 1, statistic: str = "median", clock: str = "wall") -> dict[str, float]:
    """Median seconds of each ``fns[name]()`` over ``repeats`` rounds; every round calls each function once, in
    the given order (after ``warmup`` untimed rounds). ``statistic="min"`` returns the fastest round instead.
    ``clock="cpu"`` times the calling thread's CPU time (``time.thread_time``) instead of the wall clock: with
    one torch thread on a CPU shared with other jobs, time spent descheduled is not counted, so ratios stay
    meaningful on a busy machine (cache contention still counts). Report which statistic and clock you used."""
    if statistic not in ("median", "min"):
        raise ValueError(f"statistic must be 'median' or 'min', got {statistic!r}")
    if clock not in ("wall", "cpu") or (clock == "cpu" and device.type != "cpu"):
        raise ValueError(f"clock must be 'wall', or 'cpu' for a CPU device, got {clock!r} on {device}")
    now = time.perf_counter if clock == "wall" else time.thread_time
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = now()
            fn()
            sync(device)
            times[name].append(now() - t0)
    pick = statistics.median if statistic == "median" else min
    return {name: pick(ts) for name, ts in times.items()}


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated by one call of ``fn()`` above what was live before it (see the module docstring)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return allocator_peak(prof)


def allocator_peak(prof) -> int:
    """The CPU allocator's peak in bytes above its first value over a finished ``torch.profiler.profile(...,
    profile_memory=True)`` (what :func:`peak_bytes` reads; separate so a caller can measure other things inside
    the profiled block and read the trace after it)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
    return (max(totals) - totals[0]) if totals else 0


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def rss_peak_delta(fn: Callable[[], object]) -> tuple[object, int]:
    """``(fn(), bytes)``: the process's peak RSS during the call minus its RSS just before it. Linux only: the
    high-water mark is reset by writing ``5`` to ``/proc/self/clear_refs`` (kernel ≥ 4.0) and read from
    ``/proc/self/status`` (``VmHWM``); freed memory the allocator keeps from earlier calls is reused without
    raising RSS, so measure in a fresh process (one call per process) for a faithful peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        raise RuntimeError(f"cannot reset the peak RSS (needs Linux /proc/self/clear_refs): {e}") from None
    before = _status_kib("VmRSS")
    if _status_kib("VmHWM") > before + 1024:
        raise RuntimeError("the peak RSS was not reset (VmHWM stays above VmRSS)")
    out = fn()
    return out, (_status_kib("VmHWM") - before) * 1024


def run_worker(script: str, spec: dict, env: dict | None = None, timeout: float | None = None) -> dict:
    """Run ``python script --worker JSON(spec)`` in a fresh process (offline, ``env`` added to the environment) and
    return the JSON object it prints last; on failure ``spec`` with ``error`` set to the exit status and the last
    line of its stderr."""
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    proc = subprocess.run([sys.executable, script, "--worker", json.dumps(spec)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    if proc.returncode != 0:
        return dict(spec, error=f"exit {proc.returncode}: {' '.join(proc.stderr.strip().splitlines()[-1:])}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def value_range(values, fmt: Callable[[float], str]) -> str:
    """``fmt(min)–fmt(max)`` of repeated measurements, or one ``fmt(value)`` when they print alike."""
    values = sorted(values)
    lo, hi = fmt(values[0]), fmt(values[-1])
    return lo if lo == hi else f"{lo}–{hi}"


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 for the block: the CPU profiler behind :func:`peak_bytes` logs start/stop lines
    from its C++ side there, which would bury a benchmark's report."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def add_timing_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every interleaved-timing benchmark shares: device, --quick, --repeats, --statistic, --clock."""
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one small configuration, few repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--statistic", default="median", choices=["median", "min"],
                    help="median of the interleaved rounds (default) or the fastest one (a busy machine)")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall clock (default) or the thread's CPU time (a busy machine; CPU device, 1 thread)")
