"""Benchmark: the memory of a MeZO step (taskloss.search.MeZO) against an inference forward and an Adam step of
the same model — the method's promise is inference-level memory (Malladi et al., *Fine-Tuning Language Models
with Just Forward Passes*, NeurIPS 2023: a 30B model fine-tuned where Adam fits 2.7B on the same GPU).

Model: ``transformers.GPT2LMHeadModel(GPT2Config())`` — GPT-2 small's shape (124M parameters, tied input/output
embedding), random weights, float32, eval mode (no dropout), built offline. Batch: B sequences of T random tokens,
the causal-LM loss (``labels = input_ids``). Three calls on a freshly built model:

* ``inference`` — the loss under ``torch.no_grad()`` (what MeZO's closure computes, once);
* ``MeZO``      — ``MeZO(model.parameters(), lr=1e-6).step(closure)`` with the closure above (one perturbation:
  two forwards, the noise regenerated from its seed parameter by parameter), through the public API only;
* ``Adam``      — ``loss.backward()`` then ``torch.optim.Adam.step()``: the gradients and both moments are
  allocated in this first step.

Each call runs in a fresh process (``--worker``) after an untimed warm-up inference on a short sequence. Memory:
*total* = the weights + the peak above what was live before the call (``benchmarks/_timing.peak_bytes``: torch's
allocator through the profiler's trace on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA); on the CPU also the
process's peak RSS, measured in its own fresh process without the profiler (``benchmarks/_timing.rss_peak_delta``:
the kernel's high-water mark; everything the process holds, the Python runtime and libraries included; glibc's
mmap threshold fixed at 128 KiB so that freed blocks return to the system). Time:
seconds of a second call in the same process (thread CPU time with one torch thread on the CPU).

Target: MeZO's total ≤ 1.1× inference's.

    python benchmarks/bench_mezo_memory.py [--device auto|cpu|cuda] [--quick] [--shapes 1x128,8x256]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _timing import run_worker, value_range  # noqa: E402

TARGET = 1.1
MMAP_THRESHOLD = 128 * 1024     # glibc's mmap threshold in the RSS runs: freed blocks return to the system
METHODS = ("inference", "MeZO", "Adam")


def _worker(spec: dict) -> dict:
    import torch
    import transformers
    from _timing import peak_bytes, quiet_stderr, rss_peak_delta, sync

    from taskloss.search import MeZO

    device = torch.device(spec["device"])
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).to(device).eval()
    ids = torch.randint(0, 50257, (spec["B"], spec["T"]), generator=torch.Generator().manual_seed(1)).to(device)
    loss = lambda: model(ids, labels=ids).loss                     # noqa: E731
    with torch.no_grad():
        model(ids[:, :8], labels=ids[:, :8])                       # warm-up
    method = spec["method"]
    if method == "inference":
        def call():
            with torch.no_grad():
                loss()
    elif method == "MeZO":
        opt = MeZO(model.parameters(), lr=1e-6)                    # the other arguments at their defaults
        call = lambda: opt.step(loss)                              # noqa: E731
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)

        def call():
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    out = dict(spec, weights=weights, largest=largest, threads=torch.get_num_threads())
    if spec["measure"] == "rss":
        _, out["rss_delta"] = rss_peak_delta(call)
        with open("/proc/self/status") as f:
            out["rss_peak"] = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        return out
    with quiet_stderr():
        out["peak"] = peak_bytes(call, device)
    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
    now = time.thread_time if cpu_clock else time.perf_counter
    sync(device)
    t0 = now()
    call()
    sync(device)
    out.update(seconds=now() - t0, clock="thread CPU time" if cpu_clock else "wall clock")
    return out




def format_markdown(results, repeats) -> str:
    mib = lambda b: f"{b / 2**20:.0f}"                                   # noqa: E731
    ok = [r for r in results if "error" not in r]
    lines = ["## mezo memory", "",
             "A MeZO step (one perturbation, `taskloss.search.MeZO` through its public API) against an inference "
             "forward and an Adam step of GPT-2 small's shape (124M parameters, random weights, float32), causal-LM "
             f"loss on B × T random tokens; each call the first on a fresh model in a fresh process; {repeats} "
             "repeats, range shown where they differ. Total = weights + peak above the live weights (torch's "
             "allocator); RSS: the process's peak resident set (its own run, no profiler). "
             f"Target: MeZO total ≤ {TARGET}× inference.", "",
             "| B × T | method | weights MiB | peak above weights MiB | total MiB | total / inference | RSS peak MiB | "
             "RSS / inference | time s | time / inference |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    shapes = sorted({(r["B"], r["T"]) for r in results})
    for B, T in shapes:
        get = lambda meth, kind: [r for r in ok if (r["B"], r["T"], r["method"], r["measure"]) == (B, T, meth, kind)]  # noqa: E731
        inf, inf_rss = get("inference", "alloc"), get("inference", "rss")
        for meth in METHODS:
            al, rs = get(meth, "alloc"), get(meth, "rss")
            if not al:
                lines.append(f"| {B} × {T} | {meth} | failed | | | | | | | |")
                continue
            tot = [r["weights"] + r["peak"] for r in al]
            ratio = [t / (i["weights"] + i["peak"]) for t, i in zip(tot, inf)]
            mark = (" ✓" if max(ratio) <= TARGET else " ✗") if meth == "MeZO" else ""
            rss = [r["rss_peak"] for r in rs]
            rss_ratio = [a / b["rss_peak"] for a, b in zip(rss, inf_rss)]
            t_ratio = [r["seconds"] / i["seconds"] for r, i in zip(al, inf)]
            two = "{:.2f}".format
            lines.append(
                f"| {B} × {T} | {meth} | {mib(al[0]['weights'])} | {value_range([r['peak'] for r in al], mib)} | "
                f"{value_range(tot, mib)} | {value_range(ratio, two)}{mark} | "
                f"{value_range(rss, mib) if rss else '—'} | {value_range(rss_ratio, two) if rss_ratio else '—'} | "
                f"{value_range([r['seconds'] for r in al], two)} | {value_range(t_ratio, two)} |")
    if ok:
        r = ok[0]
        lines += ["", f"Largest parameter tensor: {mib(r['largest'])} MiB (the tied token embedding, "
                  f"{r['largest'] / r['weights']:.0%} of the weights). Threads: {r['threads']}; time: "
                  f"{next((x['clock'] for x in ok if 'clock' in x), '?')} of a second call."]
    for r in results:
        if "error" in r:
            lines += ["", f"Failed: {r['method']} {r['B']}×{r['T']} ({r['measure']}): {r['error']}"]
    return "\n".join(lines)




def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="one shape (1 × 64), one repeat")
    ap.add_argument("--shapes", default=None, help="B×T shapes, e.g. 1x128,8x256")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on the CPU)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return None
    from taskloss.utils import resolve_device
    device = str(resolve_device(args.device))
    shapes = args.shapes or ("1x64" if args.quick else "1x128,8x256")
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in shapes.split(",")]
    repeats = args.repeats or (1 if args.quick else 2)
    threads = args.threads or (1 if device == "cpu" else None)
    kinds = ("alloc", "rss") if device == "cpu" else ("alloc",)
    results = []
    for rep in range(repeats):
        for B, T in shapes:
            for meth in METHODS:
                for kind in kinds:
                    spec = dict(method=meth, B=B, T=T, device=device, threads=threads, measure=kind, rep=rep)
                    r = run_worker(__file__, spec, env={"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
                    print(f"  {meth} {B}×{T} {kind}: {r.get('error') or r.get('peak') or r.get('rss_peak')}",
                          file=sys.stderr, flush=True)
                    results.append(r)
    print(format_markdown(results, repeats))
    return results


if __name__ == "__main__":
    main()
