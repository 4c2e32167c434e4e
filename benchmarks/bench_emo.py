"""Benchmark: chunked EMO (taskloss.losses.emo) vs a direct dense formulation vs cross-entropy, forward + backward.

Same logits ``[N, V]`` for every method; each measurement is the median of several repeats of
``loss(logits, targets).backward()``.

* time: ``time.perf_counter`` (CUDA-synchronized on GPU).
* peak memory above what exists before the call (logits, targets, cost embeddings):
  on CUDA ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``;
  on CPU the allocator trace of ``torch.profiler`` (``profile_memory=True``): the maximum of its running
  "Total Allocated" counter during the call minus its value when the window opened — an exact count of the
  bytes torch's CPU allocator handed out (not RSS).

Methods:
* ``emo``        — :func:`taskloss.losses.emo.emo_loss` (chunked custom autograd function, O(V·d) per token).
* ``direct``     — the reference-code formulation: dense one-hot ``[N, V]`` @ ``ê`` for the target embedding,
  ``softmax(logits) @ ê``, plain autograd (O(V·d) per token, but dense one-hot and softmax kept for backward).
* ``dense_cost`` — ``Σ_i p_i c_it`` through the dense ``[V, V]`` cost matrix (O(V²) per token); only run where
  ``N·V²`` is affordable on the device.
* ``cross_entropy`` — ``torch.nn.functional.cross_entropy``, the baseline the targets refer to.

Targets (from the issue): EMO peak memory ≤ 1.1× cross-entropy, time ≤ 1.3× cross-entropy.

    python benchmarks/bench_emo.py [--device auto|cpu|cuda] [--quick] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from taskloss.losses import emo_loss, normalize_cost_embeddings  # noqa: E402
from taskloss.utils import resolve_device  # noqa: E402

TIME_TARGET, MEM_TARGET = 1.3, 1.1


def direct_emo(logits, targets, emb_hat):
    """Reference-code style: dense one-hot target matrix times the normalized embeddings."""
    one_hot = F.one_hot(targets, logits.shape[-1]).to(emb_hat.dtype)
    p = torch.softmax(logits.float(), dim=-1)
    return (1.0 - ((p @ emb_hat) * (one_hot @ emb_hat)).sum(-1)).mean()


def dense_cost_emo(logits, targets, cost):
    """O(V²): expected cost Σ_i p_i c_it with the dense cost matrix (one-hot transport)."""
    one_hot = F.one_hot(targets, logits.shape[-1]).to(cost.dtype)
    p = torch.softmax(logits.float(), dim=-1)
    return ((p @ cost) * one_hot).sum(-1).mean()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, x, device, repeats):
    times = []
    for _ in range(repeats):
        x.grad = None
        _sync(device)
        t0 = time.perf_counter()
        fn().backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
    x.grad = None
    return statistics.median(times)


@contextlib.contextmanager
def _quiet_stderr():
    """The CPU profiler's C++ side logs start/stop lines on fd 2; keep the report readable."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _peak_bytes(fn, x, device):
    x.grad = None
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn().backward()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        from torch.profiler import ProfilerActivity, profile
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn().backward()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        mem = [e["args"] for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0]
        # the counter is process-wide: subtract what was allocated when the window opened
        base = mem[0]["Total Allocated"] - mem[0]["Bytes"] if mem else 0
        peak = max((m["Total Allocated"] for m in mem), default=base) - base
    x.grad = None
    return peak


def bench(n, vocab_sizes, d, device, dtype, repeats, dense_budget):
    rows = []
    gen = torch.Generator().manual_seed(0)
    for v in vocab_sizes:
        x = (torch.randn(n, v, generator=gen) * 2).to(device=device, dtype=dtype).requires_grad_()
        t = torch.randint(0, v, (n,), generator=gen).to(device)
        emb = torch.randn(v, d, generator=gen).to(device)
        emb_hat = normalize_cost_embeddings(emb)
        methods = {
            "emo": lambda: emo_loss(x, t, emb_hat),
            "direct": lambda: direct_emo(x, t, emb_hat),
            "cross_entropy": lambda: F.cross_entropy(x, t),
        }
        cost = None
        if n * v * v <= dense_budget:
            cost = 1.0 - emb_hat @ emb_hat.T
            methods["dense_cost"] = lambda: dense_cost_emo(x, t, cost)
        row = {"V": v}
        for name, fn in methods.items():
            _time(fn, x, device, 1)  # warm-up
            row[f"{name}_s"] = _time(fn, x, device, repeats)
            row[f"{name}_bytes"] = _peak_bytes(fn, x, device)
        rows.append(row)
        del x, t, emb, emb_hat, cost
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _ratio(a, b):
    return a / b if b else float("nan")


def format_markdown(rows, n, d, device, dtype, repeats):
    mem_how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else \
        "torch.profiler allocator trace (peak of 'Total Allocated')"
    lines = [
        "## emo", "",
        f"EMO loss forward+backward, N={n} tokens, d={d}, {dtype} logits, device {device}, median of {repeats}. "
        f"Peak memory above the inputs, measured with {mem_how}. Ratios are relative to "
        "`torch.nn.functional.cross_entropy` on the same logits.", "",
        "| V | CE time | EMO time | EMO/CE time (target ≤ 1.3) | direct/CE time | dense-cost/CE time | "
        "CE peak | EMO peak | EMO/CE peak (target ≤ 1.1) | direct/CE peak | dense-cost/CE peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tr = _ratio(r["emo_s"], r["cross_entropy_s"])
        mr = _ratio(r["emo_bytes"], r["cross_entropy_bytes"])
        dc_t = f"{_ratio(r['dense_cost_s'], r['cross_entropy_s']):.2f}" if "dense_cost_s" in r else "—"
        dc_m = f"{_ratio(r['dense_cost_bytes'], r['cross_entropy_bytes']):.2f}" if "dense_cost_s" in r else "—"
        lines.append(
            f"| {r['V']} | {r['cross_entropy_s'] * 1e3:.1f} ms | {r['emo_s'] * 1e3:.1f} ms | "
            f"{tr:.2f} {'✓' if tr <= TIME_TARGET else '✗'} | {_ratio(r['direct_s'], r['cross_entropy_s']):.2f} | "
            f"{dc_t} | {r['cross_entropy_bytes'] / 2**20:.1f} MiB | {r['emo_bytes'] / 2**20:.1f} MiB | "
            f"{mr:.2f} {'✓' if mr <= MEM_TARGET else '✗'} | "
            f"{_ratio(r['direct_bytes'], r['cross_entropy_bytes']):.2f} | {dc_m} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 repeats (a smoke run)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.quick:
        n, vocab_sizes, repeats = args.tokens or 256, [1000, 8000], args.repeats or 2
    else:
        n, vocab_sizes, repeats = args.tokens or 2048, [1000, 8000, 30522], args.repeats or 5
    dense_budget = 2e12 if device.type == "cuda" else 2.1e9
    rows = bench(n, vocab_sizes, args.dim, device, dtype, repeats, dense_budget)
    text = format_markdown(rows, n, args.dim, device, args.dtype, repeats)
    print(text)
    return rows


if __name__ == "__main__":
    main()
