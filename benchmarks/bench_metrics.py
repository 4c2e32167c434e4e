"""Benchmark: batched token edit distance (taskloss.losses.metrics.edit_distance) vs a loop over rapidfuzz.

Input: ``B`` pairs of random token rows of length ``T`` (ids below 8 000, a small LM's vocabulary) as padded
LongTensors, the hypothesis cut at its first EOS (about one row in four holds one). Output: the raw distances
``[B]`` (``normalize=False``). Methods, each the median (or ``--statistic min``) of interleaved repeats, one call
of each per round (``--clock cpu`` times the thread's CPU time, for a busy machine):

* ``ours (auto)``   — ``edit_distance(hyp, ref, eos_id=…)`` on CPU tensors: cut at EOS, ids → strings of code
  points through one NumPy view, ``rapidfuzz.process.cpdist(…, scorer=Levenshtein.distance)`` (the default);
* ``ours (torch)``  — ``backend="torch"``: the batched dynamic programme, the GPU default, forced on the CPU;
* ``peer loop``     — what a user writes: ``[Levenshtein.distance(h, r) for h, r in zip(hs, rs)]`` over Python
  lists already cut at EOS (conversion not timed: the loop's best case);
* ``peer loop + tolist`` — the same loop including ``tensor.tolist()`` and the EOS cut, i.e. from the same
  tensors ours starts from.

Ratios are time / peer loop. Peak memory: bytes handed out during one call by torch's CPU allocator
(``benchmarks/_timing.peak_bytes``) plus Python/NumPy allocations (``tracemalloc``). There is no FLOP floor:
the work is integer dynamic programming, and rapidfuzz's bit-parallel kernel (O(⌈T/64⌉·T) word operations per
pair) is the reference. Target (from the issue): ours on CPU at least as fast as the rapidfuzz loop.

    python benchmarks/bench_metrics.py [--device auto|cpu|cuda] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path

import torch
from rapidfuzz.distance import Levenshtein

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import add_timing_arguments, interleaved_median_times, peak_bytes  # noqa: E402

from taskloss.losses import edit_distance  # noqa: E402
from taskloss.utils import resolve_device

EOS, VOCAB = 3, 8000


def make_pairs(B: int, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hyp = torch.randint(4, VOCAB, (B, T), generator=g)
    ref = torch.randint(4, VOCAB, (B, T), generator=g)
    ref[:, T // 2:] = hyp[:, T // 2:]              # half of each row in common: distances of all sizes
    rows = torch.randperm(B, generator=g)[: B // 4]
    hyp[rows, torch.randint(0, T, (len(rows),), generator=g)] = EOS
    return hyp, ref


def _cut(row: list[int]) -> list[int]:
    return row[: row.index(EOS)] if EOS in row else row


def peak_total(fn, device) -> int:
    tracemalloc.start()
    try:
        fn()
        py = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak_bytes(fn, device) + py


def bench(B: int, T: int, device, repeats: int, statistic: str = "median", clock: str = "wall") -> dict:
    hyp, ref = make_pairs(B, T)
    hs, rs = [_cut(h) for h in hyp.tolist()], ref.tolist()
    want = torch.tensor([Levenshtein.distance(h, r) for h, r in zip(hs, rs)])
    hyp_d, ref_d = hyp.to(device), ref.to(device)
    fns = {
        "auto": lambda: edit_distance(hyp_d, ref_d, eos_id=EOS, normalize=False),
        "torch": lambda: edit_distance(hyp_d, ref_d, eos_id=EOS, normalize=False, backend="torch"),
        "loop": lambda: [Levenshtein.distance(h, r) for h, r in zip(hs, rs)],
        "loop_tolist": lambda: [Levenshtein.distance(_cut(h), r) for h, r in zip(hyp.tolist(), ref.tolist())],
    }
    for name in ("auto", "torch"):                    # same integers before anything is timed
        assert torch.equal(fns[name]().cpu(), want), name
    times = interleaved_median_times(fns, device, repeats, statistic=statistic, clock=clock)
    row = {"B": B, "T": T, **{f"{k}_s": v for k, v in times.items()}}
    row.update({f"{k}_bytes": peak_total(fn, device) for k, fn in fns.items()})
    return row


def format_markdown(rows, device, repeats, statistic="median", clock="wall") -> str:
    threads = torch.get_num_threads()
    lines = ["## metrics", "",
             f"Token edit distance of B pairs of length T (ids < {VOCAB}, hypothesis cut at EOS), raw distances, "
             f"device {device}{f', {threads} CPU thread(s)' if device.type == 'cpu' else ''}, {statistic} of {repeats} "
             f"interleaved repeats ({'thread CPU time' if clock == 'cpu' else 'wall clock'}). Peer: a Python loop "
             "over `rapidfuzz.distance.Levenshtein.distance` (lists "
             "prepared beforehand; '+ tolist' includes the conversion from the tensors). No FLOP floor "
             "(integer dynamic programming; rapidfuzz's bit-parallel kernel is the reference). Peak memory: "
             "torch CPU allocator + tracemalloc.", "",
             "| B | T | ours (auto) | ours (torch kernel) | peer loop | peer loop + tolist | auto / loop "
             "(target ≤ 1) | auto / (loop + tolist) | torch / loop | peak auto | peak torch | peak loop + tolist |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, t, lp, lt = r["auto_s"], r["torch_s"], r["loop_s"], r["loop_tolist_s"]
        mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
        lines.append(f"| {r['B']} | {r['T']} | {a * 1e3:.2f} ms | {t * 1e3:.2f} ms | {lp * 1e3:.2f} ms | "
                     f"{lt * 1e3:.2f} ms | {a / lp:.2f} {'✓' if a <= lp else '✗'} | {a / lt:.2f} | {t / lp:.1f} | "
                     f"{mib(r['auto_bytes'])} | {mib(r['torch_bytes'])} | {mib(r['loop_tolist_bytes'])} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_arguments(ap)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if args.quick:
        configs, repeats = [(512, 64)], args.repeats or 5
    else:
        configs, repeats = [(4096, 64), (4096, 16), (512, 256)], args.repeats or 21
    rows = [bench(B, T, device, repeats, args.statistic, args.clock) for B, T in configs]
    print(format_markdown(rows, device, repeats, args.statistic, args.clock))
    return rows


if __name__ == "__main__":
    main()
