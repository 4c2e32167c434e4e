"""Benchmark: MGS step (taskloss.search.mgs) — candidates scored in one vmap vs one after another, and vs an MLE step.

Task: digits classification (``taskloss.datasets.digits.load_digits_splits``), ``taskloss.models.MLP``; surrogate
cross-entropy, task loss the 0-1 error of the argmax (vmappable). Each figure is the median over repeats of
one full step (surrogate gradient, K candidates, weights, ``optimizer.step()`` with AdamW):

* ``MLE``        — cross-entropy forward + backward + AdamW step (the reference point of the targets);
* ``parallel``   — ``MGS(parallel=True)``: the K perturbed parameter sets stacked, one ``torch.func.vmap`` call;
* ``sequential`` — ``MGS(parallel=False)``: ``functional_call`` per candidate, same noise and arithmetic
  otherwise (the reference code goes further and deep-copies the model K times);
* ``low_memory`` — ``low_memory=True, chunk_size=1``: one candidate at a time, its noise regenerated from the
  seed for the weighted sum instead of stored (the memory-lean configuration).

Time: ``time.perf_counter`` (CUDA-synchronized on GPU). Peak memory above what is live before the step: on
CUDA ``torch.cuda.max_memory_allocated``; on CPU the allocator trace of ``torch.profiler``
(``profile_memory=True``) — the maximum of its running "Total Allocated" counter minus its first value, i.e.
bytes handed out by torch's CPU allocator, not RSS. Both helpers are shared: ``benchmarks/_timing.py``.

Targets (from the issue): parallel ≥ 2× faster than sequential at K = 8; MGS step ≤ 3× an MLE step.

    python benchmarks/bench_mgs.py [--device auto|cpu|cuda] [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_time, peak_bytes  # noqa: E402

from taskloss.datasets import load_digits_splits  # noqa: E402
from taskloss.models import MLP  # noqa: E402
from taskloss.search import MGS  # noqa: E402
from taskloss.utils import resolve_device  # noqa: E402

SPEEDUP_TARGET, MLE_RATIO_TARGET = 2.0, 3.0


def surrogate(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def zero_one(logits, batch):
    return (logits.argmax(-1) != batch[1]).to(logits.dtype).mean()


def _setup(hidden, batch_size, device, seed=0):
    (X, y), _, _ = load_digits_splits(0)
    X, y = X[:batch_size].to(device), y[:batch_size].to(device)
    torch.manual_seed(seed)
    model = MLP(64, hidden, 10).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), (X, y)


def bench_config(hidden, batch_size, Ks, device, repeats):
    row = {"hidden": hidden, "batch": batch_size}
    model, opt, batch = _setup(hidden, batch_size, device)
    row["params"] = sum(p.numel() for p in model.parameters())

    def mle():
        opt.zero_grad(set_to_none=True)
        surrogate(model, batch).backward()
        opt.step()
    row["mle_s"] = median_time(mle, device, repeats)
    row["mle_bytes"] = peak_bytes(mle, device)
    for K in Ks:
        for name, kw in (("parallel", dict(parallel=True)), ("sequential", dict(parallel=False)),
                         ("low_memory", dict(parallel=True, low_memory=True, chunk_size=1))):
            model, opt, batch = _setup(hidden, batch_size, device)
            mgs = MGS(model, opt, surrogate, zero_one, K=K, seed=0, vmap_task_loss=True, **kw)
            row[f"{name}{K}_s"] = median_time(lambda: mgs.step(batch), device, repeats)
            row[f"{name}{K}_bytes"] = peak_bytes(lambda: mgs.step(batch), device)
    return row


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def format_markdown(rows, Ks, device, repeats):
    mem_how = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
               "torch.profiler CPU allocator trace (peak of 'Total Allocated' above its first value)")
    threads = torch.get_num_threads()
    lines = ["## mgs", "",
             f"One MGS step (AdamW, 0-1 task loss, digits MLP) vs an MLE step, device {device}"
             f"{f', {threads} CPU thread(s)' if device.type == 'cpu' else ''}, median of {repeats}. "
             f"Peak memory above what is live before the step: {mem_how}.", "",
             "| MLP hidden | batch | params | K | MLE step | MGS parallel | MGS sequential | "
             f"sequential/parallel (target ≥ {SPEEDUP_TARGET:g} at K=8) | "
             f"parallel/MLE (target ≤ {MLE_RATIO_TARGET:g}) | sequential/MLE | low_memory/sequential time | "
             "peak MLE | peak parallel | peak sequential | peak low_memory |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for K in Ks:
            sp = r[f"sequential{K}_s"] / r[f"parallel{K}_s"]
            pm = r[f"parallel{K}_s"] / r["mle_s"]
            sm = r[f"sequential{K}_s"] / r["mle_s"]
            lm = r[f"low_memory{K}_s"] / r[f"sequential{K}_s"]
            mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
            lines.append(
                f"| {r['hidden']} | {r['batch']} | {r['params']} | {K} | {r['mle_s'] * 1e3:.2f} ms | "
                f"{r[f'parallel{K}_s'] * 1e3:.2f} ms | {r[f'sequential{K}_s'] * 1e3:.2f} ms | "
                f"{sp:.2f}{' ' + _mark(sp >= SPEEDUP_TARGET) if K == 8 else ''} | {pm:.2f} "
                f"{_mark(pm <= MLE_RATIO_TARGET)} | {sm:.2f} | {lm:.2f} | {mib(r['mle_bytes'])} | "
                f"{mib(r[f'parallel{K}_bytes'])} | {mib(r[f'sequential{K}_bytes'])} | "
                f"{mib(r[f'low_memory{K}_bytes'])} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one small configuration, few repeats")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    Ks = (4, 8)
    if args.quick:
        configs, repeats = [((64,), 128)], args.repeats or 5
    else:
        configs, repeats = [((64,), 128), ((256, 256), 1078), ((1024, 1024), 1078)], args.repeats or 21
    rows = [bench_config(h, b, Ks, device, repeats) for h, b in configs]
    print(format_markdown(rows, Ks, device, repeats))
    return rows


if __name__ == "__main__":
    main()
