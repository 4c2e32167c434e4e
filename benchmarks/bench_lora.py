"""Benchmark: the memory of a MeZO step on a LoRA model (PEFT adapters, the base frozen) against MeZO on the full
model, an inference forward and an Adam step of the adapters — MeZO with LoRA is a long-standing request of the MeZO
repository (Malladi et al., *Fine-Tuning Language Models with Just Forward Passes*, NeurIPS 2023).

Model: ``transformers.GPT2LMHeadModel(GPT2Config())`` — GPT-2 small's shape (124M parameters, tied embedding), random
weights, float32, eval mode, built offline; LoRA: ``peft.LoraConfig(r=8, target_modules=["c_attn", "c_fc"],
fan_in_fan_out=True)`` (≈ 0.4M adapter parameters). Batch: B sequences of T random tokens, the causal-LM loss. Four
calls, each the first on a freshly built model in a fresh process (``--worker``) after an untimed warm-up inference:

* ``inference``  — the LoRA model's loss under ``torch.no_grad()``;
* ``MeZO full``  — ``MeZO(model.parameters())`` on the plain model (every weight perturbed, its noise regenerated
  tensor by tensor: the peak holds one noise tensor of the largest parameter, the token embedding);
* ``MeZO LoRA``  — ``MeZO(lora_model.parameters())`` (only the adapters train, so only they are perturbed);
* ``Adam LoRA``  — backward through the frozen base and an Adam step of the adapters.

Memory: the weights + the peak above what was live before the call (``benchmarks/_timing.peak_bytes``: torch's
allocator through the profiler's trace on the CPU, ``torch.cuda.max_memory_allocated`` on CUDA). Time: a second call
in the same process (thread CPU time with one torch thread on the CPU).

    python benchmarks/bench_lora.py [--device auto|cpu|cuda] [--quick] [--shapes 1x128,8x256]
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

METHODS = ("inference", "MeZO full", "MeZO LoRA", "Adam LoRA")


def _worker(spec: dict) -> dict:
    import peft
    import torch
    import transformers
    from _timing import peak_bytes, quiet_stderr, sync

    from taskloss.search import MeZO

    device = torch.device(spec["device"])
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).to(device).eval()
    if spec["method"] != "MeZO full":
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_fc"],
                                                           fan_in_fan_out=True, lora_dropout=0.0)).eval()
    ids = torch.randint(0, 50257, (spec["B"], spec["T"]), generator=torch.Generator().manual_seed(1)).to(device)
    loss = lambda: model(input_ids=ids, labels=ids).loss                    # noqa: E731
    with torch.no_grad():
        model(input_ids=ids[:, :8], labels=ids[:, :8])                      # warm-up
    method = spec["method"]
    if method == "inference":
        def call():
            with torch.no_grad():
                loss()
    elif method.startswith("MeZO"):
        opt = MeZO(model.parameters(), lr=1e-6)
        call = lambda: opt.step(loss)                                       # noqa: E731
    else:
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-5)

        def call():
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    out = dict(spec, weights=weights, trained=trained, threads=torch.get_num_threads())
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
    """The Markdown table of ``results`` (one row per shape and method, ranges over the repeats)."""
    mib = lambda b: f"{b / 2**20:.1f}"                                   # noqa: E731
    two = "{:.2f}".format
    ok = [r for r in results if "error" not in r]
    lines = ["## lora memory", "",
             "A MeZO step on GPT-2 small's shape with LoRA adapters (r = 8 on c_attn and c_fc; the base frozen) "
             "against MeZO on the full model, an inference forward of the LoRA model and an Adam step of the "
             f"adapters; each call the first on a fresh model in a fresh process; {repeats} repeat(s). Total = "
             "weights + peak above the live weights (torch's allocator).", "",
             "| B × T | method | trained params | weights MiB | peak above weights MiB | total MiB | "
             "total / inference | time s |",
             "|---|---|---|---|---|---|---|---|"]
    for B, T in sorted({(r["B"], r["T"]) for r in results}):
        get = lambda meth: [r for r in ok if (r["B"], r["T"], r["method"]) == (B, T, meth)]  # noqa: E731
        inf = get("inference")
        for meth in METHODS:
            rows = get(meth)
            if not rows:
                lines.append(f"| {B} × {T} | {meth} | failed | | | | | |")
                continue
            tot = [r["weights"] + r["peak"] for r in rows]
            ratio = [t / (i["weights"] + i["peak"]) for t, i in zip(tot, inf)] if inf else []
            lines.append(f"| {B} × {T} | {meth} | {rows[0]['trained']:,} | {mib(rows[0]['weights'])} | "
                         f"{value_range([r['peak'] for r in rows], mib)} | {value_range(tot, mib)} | "
                         f"{value_range(ratio, two) if ratio else '—'} | "
                         f"{value_range([r['seconds'] for r in rows], two)} |")
    for r in results:
        if "error" in r:
            lines += ["", f"Failed: {r['method']} {r['B']}×{r['T']}: {r['error']}"]
    return "\n".join(lines)


def main(argv=None):
    """Run every method in its own process and print the Markdown table."""
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
    results = []
    for rep in range(repeats):
        for B, T in shapes:
            for meth in METHODS:
                spec = dict(method=meth, B=B, T=T, device=device, threads=threads, rep=rep)
                r = run_worker(__file__, spec)
                print(f"  {meth} {B}×{T}: {r.get('error') or r.get('peak')}", file=sys.stderr, flush=True)
                results.append(r)
    print(format_markdown(results, repeats))
    return results


if __name__ == "__main__":
    main()
