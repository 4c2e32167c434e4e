"""Benchmark: integrated gradients of a GPT-2-small-shaped causal LM over long contexts (512–2048 tokens), ours
(:class:`taskloss.attribution.EmbeddingIntegratedGradients`) against Captum 0.9's ``LayerIntegratedGradients`` on
the token embedding, at the same user-set chunk of path points per pass and at Captum's default.

Model: ``transformers.GPT2LMHeadModel(GPT2Config(n_positions=max(T, 1024)))`` — GPT-2 small's shape (12 layers,
width 768, 12 heads, vocabulary 50257, 124M parameters), random weights (seed 0), built offline in each worker
process, float32, SDPA attention, eval mode. Target: log p(next token) at the last position for the token the
model predicts there (only the last position's logits are computed: ``logits_to_keep=1``, in both methods'
forward function); baseline: the ``<|endoftext|>`` token (50256) at every position; Gauss–Legendre rule, ``m``
steps; completeness error returned by both (Captum: ``return_convergence_delta=True``).

One worker process per context length (``--worker``): it builds the model, warms both methods up on 16 tokens,
then runs its calls in order — ours and Captum alternating, ``rounds`` times, then Captum's default once — so a
change in the machine's load hits both methods alike. Every call is timed (on the CPU with one torch thread: the
thread's CPU time, which leaves out the time the thread waits for a core on a shared machine; else the wall clock)
and its peak memory measured above what is live before it: on the CPU the process's peak resident set above its
RSS before the call (``benchmarks/_timing.rss_peak_delta``, the kernel's high-water mark, no profiler), with
glibc's mmap threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``) so that every freed activation returns to the
system and RSS follows torch's live bytes (at T = 256 it then equals the allocator's peak from the profiler trace,
0.889 GiB at m = 4 and 16 alike; with glibc's adaptive default a later call's RSS grew with the number of chunks);
on CUDA ``torch.cuda.max_memory_allocated`` above the memory allocated before the call. A hook on
``transformer.drop`` (the hidden states after the embedding) counts the rows of every forward pass: the path points
alive in one pass. Equal output: max |a − ours| / max |ours| against our first call at the same m.

* ``ours``           — ``internal_batch_size = chunk`` rows per pass; a step's sequences are split when one step has
  more rows than the chunk;
* ``captum``         — ``internal_batch_size = chunk``; Captum's chunks are whole steps, at least B rows (a smaller
  value is raised to B with a warning), so with B > chunk its passes hold B rows;
* ``captum default`` — ``internal_batch_size=None`` (Captum's default: all m·B path points in one pass); run only
  where the predicted peak (m·B/chunk × our measured peak) fits in 70 % of the memory available, else reported
  as not fitting.

Targets at T = 1024: time ≤ 1× Captum's at the same chunk (the same passes, equal output: max relative difference
≤ 1e-4 in float32) and peak memory ≤ 0.5× Captum's at its default. At the same chunk and B ≤ chunk both hold the
same rows per pass, so their peaks agree (no target: the ratio is information).

Plan on the CPU (default; sized to about 10 minutes on a loaded 2-core machine): m = 4 steps, chunk 1 (four passes
per attribution) at T = 512 and 1024, two rounds, Captum's default once; T = 2048 with m = 2, one round; a batch
of B = 4 sequences × 256 tokens with m = 2, chunk 1 (a chunk below the batch). The peak of a chunked run does not
depend on m (one pass of ``chunk`` rows; checked in ``tests/attribution/test_gpt2_chunks.py``), and both methods'
time grows as m. On CUDA: m = 32, chunk 4, lengths 512–2048 with Captum at all of them, the batch case with m = 8.

    python benchmarks/bench_long_context.py [--quick] [--lengths 512,1024,2048] [--peer-lengths 512,1024]
        [--steps 4] [--long-steps 2] [--chunk 1] [--rounds 2] [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _timing import run_worker, value_range  # noqa: E402

TIME_TARGET, MEM_TARGET, EQUAL_TOL, TARGET_T = 1.0, 0.5, 1e-4, 1024
BASELINE_TOKEN = 50256
MMAP_THRESHOLD = 128 * 1024     # glibc: every block ≥ 128 KiB mmap-ed and returned on free (see the module doc)
FIT_FRACTION = 0.7              # Captum's default runs only where its predicted peak is below this share of memory


# ------------------------------------------------------------------------------------------------ the worker
def available_bytes(device: str = "cpu") -> int:
    """Free memory where the attribution runs: the GPU's free bytes, or the host's MemAvailable."""
    if device.startswith("cuda"):
        import torch
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _worker(spec: dict) -> dict:
    import torch
    import transformers
    from _timing import peak_bytes, rss_peak_delta, sync

    from taskloss.attribution import EmbeddingIntegratedGradients

    T, B = spec["T"], spec["B"]
    device = torch.device(spec.get("device", "cpu"))
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
    now = time.thread_time if cpu_clock else time.perf_counter
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=max(T, 1024))).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    wte = model.transformer.wte
    fwd = lambda ids: model(ids, logits_to_keep=1).logits[:, -1].log_softmax(-1)   # noqa: E731
    ids = torch.randint(0, 50000, (B, T), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        target = fwd(ids).argmax(-1)
    base = torch.full_like(ids, BASELINE_TOKEN)

    def attribute(method, x, b, n_steps, ibs):
        if method == "ours":
            got = EmbeddingIntegratedGradients(fwd, wte).attribute(x, baselines=b, target=target, n_steps=n_steps,
                                                                   internal_batch_size=ibs)
            return got.attributions, got.completeness_error
        import warnings

        from captum.attr import LayerIntegratedGradients
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # "internal batch size cannot be less than the examples"
            attr, delta = LayerIntegratedGradients(fwd, wte).attribute(
                x, baselines=b, target=target, n_steps=n_steps, internal_batch_size=ibs,
                return_convergence_delta=True)
        return attr.sum(-1), delta

    for method in ("ours", "captum"):                 # warm-up: kernels, thread pool, caches
        attribute(method, ids[:, :16], base[:, :16], 2, 1)
    rows: list[int] = []
    model.transformer.drop.register_forward_hook(lambda mod, i, out: rows.append(out.shape[0]))
    records, reference = [], {}
    for call in spec["calls"]:
        method, m, chunk = call["method"], call["m"], call["chunk"]
        ibs = None if method == "captum default" else chunk
        rec = dict(call, T=T, B=B)
        if ibs is None:
            ours = [r for r in records if r["method"] == "ours" and r["m"] == m and "peak" in r]
            predicted = ours[0]["peak"] * m * B / ours[0]["chunk"] if ours else None
            if predicted is not None and predicted > FIT_FRACTION * available_bytes(str(device)):
                records.append(dict(rec, predicted=predicted, error=(
                    f"does not fit: predicted {predicted / 2**30:.1f} GiB (m·B/chunk × ours) > "
                    f"{FIT_FRACTION:.0%} of the {available_bytes(str(device)) / 2**30:.1f} GiB available")))
                continue
        rows.clear()
        run = lambda: attribute(method, ids, base, m, ibs)       # noqa: E731
        sync(device)
        t0 = now()
        if device.type == "cuda":
            out: list = []
            peak = peak_bytes(lambda: out.append(run()), device)
            attr, err = out[0]
        else:
            (attr, err), peak = rss_peak_delta(run)
        sync(device)
        rec.update(seconds=now() - t0, peak=peak, max_rows=max(rows), passes=len(rows),
                   completeness=float(err.abs().max()))
        attr = attr.detach().cpu()
        if method == "ours" and m not in reference:
            reference[m] = attr
        if m in reference:
            rec["rel_diff"] = float((attr - reference[m]).abs().max() / reference[m].abs().max())
        records.append(rec)
    return dict(records=records, param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
                threads=torch.get_num_threads(), clock="thread CPU time" if cpu_clock else "wall clock")


# ------------------------------------------------------------------------------------------------ the driver
def plan(lengths, peer_lengths, m, long_m, chunk, rounds, batch_case) -> list[dict]:
    """One worker spec per context length (and one for the batch case): the calls it makes, in order."""
    specs = []
    for T in lengths:
        if T in peer_lengths:
            calls = [dict(method=meth, m=m, chunk=chunk, role="pair", rep=r)
                     for r in range(rounds) for meth in ("ours", "captum")]
            calls.append(dict(method="captum default", m=m, chunk=None, role="default", rep=0))
        else:
            calls = [dict(method=meth, m=long_m, chunk=chunk, role="long", rep=0) for meth in ("ours", "captum")]
        specs.append(dict(T=T, B=1, calls=calls))
    if batch_case:
        Bb, Tb, mb = batch_case
        specs.append(dict(T=Tb, B=Bb, calls=[dict(method=meth, m=mb, chunk=1, role="batch", rep=0)
                                             for meth in ("ours", "captum")]))
    return specs


def measure(specs, device="cpu", threads=None, jobs=1) -> tuple[list[dict], dict]:
    """Run every worker spec in its own process (``jobs`` at a time); all records and the workers' common facts."""
    def one(spec):
        spec = dict(spec, device=device, threads=threads)
        r = run_worker(__file__, spec, env={"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
        if "error" in r:                       # the process failed: every call it was to make fails with it
            return [dict(c, T=spec["T"], B=spec["B"], error=r["error"]) for c in spec["calls"]], {}
        for rec in r["records"]:
            print(f"  {rec['method']:>14} T={rec['T']} B={rec['B']} m={rec['m']} chunk={rec['chunk']}: "
                  + (rec["error"] if "error" in rec else f"{rec['seconds']:.0f} s, peak {rec['peak'] / 2**30:.2f} "
                     f"GiB, ≤ {rec['max_rows']} rows per pass"), file=sys.stderr, flush=True)
        return r["records"], {k: r[k] for k in ("param_bytes", "threads", "clock")}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outs = list(pool.map(one, specs))
    facts = next((f for _, f in outs if f), {})
    return [rec for recs, _ in outs for rec in recs], facts


def _ratio_cell(num, den, target=None, fmt="{:.2f}"):
    """``lo–hi`` of the pairwise ratios, with ✓/✗ against ``target`` (≤) when one is given."""
    ratios = [a / b for a, b in zip(num, den)]
    if not ratios:
        return "—", ratios
    cell = value_range(ratios, fmt.format)
    if target is not None:
        cell += " ✓" if max(ratios) <= target else " ✗"
    return cell, ratios


def format_markdown(results, facts, m, chunk, rounds, elapsed) -> str:
    gib = lambda b: f"{b / 2**30:.2f}"                           # noqa: E731
    secs = lambda v: f"{v:.0f}"                                  # noqa: E731
    ok = [r for r in results if "error" not in r]
    clock = facts.get("clock", "?")
    lines = ["## long-context attribution", "",
             "Integrated gradients of a GPT-2-small-shaped LM (124M parameters, random weights) in embedding space, "
             f"Gauss–Legendre, float32, one sequence unless stated; one process per context length, ours and Captum "
             f"alternating in it ({rounds} rounds where two values are shown: their range), then Captum's default "
             f"once; time: {clock}. Peak: the process's peak RSS above its RSS before the call (weights excluded; "
             "glibc's mmap threshold fixed at 128 KiB so RSS follows torch's live bytes). Captum at the same chunk "
             f"({chunk} path point(s) per pass) makes the same passes as ours; Captum's default puts all m·B points "
             f"in one pass. Targets at T = {TARGET_T}: time ≤ {TIME_TARGET:g}× Captum's at the same chunk, peak ≤ "
             f"{MEM_TARGET}× Captum's default, equal output (≤ {EQUAL_TOL:g}).", "",
             "| T | m | ours s | Captum s (same chunk) | time ours / Captum | ours peak GiB | Captum peak GiB "
             "(same chunk) | peak ours / Captum (same chunk) | Captum default s, peak GiB | peak ours / Captum default "
             "| rows per pass ours / Captum / default | equal output |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def by(role, meth, T):
        return sorted([r for r in ok if (r["role"], r["method"], r["T"]) == (role, meth, T)], key=lambda r: r["rep"])

    for T in sorted({r["T"] for r in results if r["role"] in ("pair", "long")}):
        role = "pair" if by("pair", "ours", T) else "long"
        ours, cap = by(role, "ours", T), by(role, "captum", T)
        if not ours:
            continue
        tgt = T == TARGET_T
        row = [str(T), str(ours[0]["m"]), value_range([r["seconds"] for r in ours], secs),
               value_range([r["seconds"] for r in cap], secs) if cap else "—",
               _ratio_cell([r["seconds"] for r in ours], [r["seconds"] for r in cap],
                           TIME_TARGET if tgt else None)[0],
               value_range([r["peak"] for r in ours], gib),
               value_range([r["peak"] for r in cap], gib) if cap else "—",
               _ratio_cell([r["peak"] for r in ours], [r["peak"] for r in cap])[0]]
        default = [r for r in results if r["role"] == "default" and r["T"] == T]
        if default and "error" not in default[0]:
            d = default[0]
            row += [f"{secs(d['seconds'])} s, {gib(d['peak'])} GiB",
                    _ratio_cell([max(r["peak"] for r in ours)], [d["peak"]], MEM_TARGET if tgt else None)[0]]
            d_rows = str(d["max_rows"])
        else:
            row += [default[0]["error"] if default else "—", "—"]
            d_rows = "—"
        rel = [r["rel_diff"] for r in cap + default + ours[1:] if "rel_diff" in r]
        row += [f"{max(r['max_rows'] for r in ours)} / {max(r['max_rows'] for r in cap) if cap else '—'} / {d_rows}",
                f"{max(rel):.1e} {'✓' if max(rel) <= EQUAL_TOL else '✗'}" if rel else "—"]
        lines.append("| " + " | ".join(row) + " |")
    o = [r for r in ok if r["role"] == "batch" and r["method"] == "ours"]
    c = [r for r in ok if r["role"] == "batch" and r["method"] == "captum"]
    if o and c:
        b0 = o[0]
        lines += ["", f"A chunk below the batch: B = {b0['B']} sequences × T = {b0['T']}, m = {b0['m']}; ours with one "
                  f"sequence per pass ({secs(b0['seconds'])} s, peak {gib(b0['peak'])} GiB, ≤ {b0['max_rows']} row "
                  f"per pass) against Captum at its smallest chunk, one step of B rows ({secs(c[0]['seconds'])} s, "
                  f"peak {gib(c[0]['peak'])} GiB, ≤ {c[0]['max_rows']} rows per pass): peak ours / Captum "
                  f"{b0['peak'] / c[0]['peak']:.2f}, time {b0['seconds'] / c[0]['seconds']:.2f}; equal output "
                  f"{c[0].get('rel_diff', float('nan')):.1e}."]
    per_row = [r["peak"] / r["max_rows"] for r in ok if r["method"] == "ours" and r["T"] == TARGET_T
               and r["B"] == 1]
    if per_row:
        lines += ["", f"At the issue's m = 32, Captum's default would hold 32 path points of T = {TARGET_T} in one "
                  f"pass: {32 * max(per_row) / 2**30:.0f} GiB at our measured {max(per_row) / 2**30:.2f} GiB per "
                  f"point (a prediction, not run), where ours stays at one pass of {chunk} point(s) whatever m."]
    for r in results:
        if "error" in r and r["role"] != "default":
            lines += ["", f"Failed: {r['method']} T={r['T']} B={r['B']} m={r['m']}: {r['error']}"]
    if facts:
        lines += ["", f"Threads: {facts['threads']}; weights {facts['param_bytes'] / 2**20:.0f} MiB (live before "
                  f"every call, not counted). This run: {elapsed:.0f} s."]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="T = 256 and 512, m = 2, one round (a smoke run)")
    ap.add_argument("--lengths", default=None, help="context lengths, e.g. 512,1024,2048")
    ap.add_argument("--peer-lengths", default=None, help="lengths with rounds and Captum's default (default 512,1024)")
    ap.add_argument("--steps", type=int, default=None, help="m at the peer lengths (CPU default 4, CUDA 32)")
    ap.add_argument("--long-steps", type=int, default=None, help="m at the other lengths (CPU default 2, CUDA 32)")
    ap.add_argument("--chunk", type=int, default=None, help="path points per pass (CPU default 1, CUDA 4)")
    ap.add_argument("--rounds", type=int, default=None, help="ours/Captum rounds at the peer lengths (default 2)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes at a time (CPU default 2, CUDA 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1: thread CPU time)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return None
    from taskloss.utils import resolve_device
    device = str(resolve_device(args.device))
    cuda = device.startswith("cuda")
    if args.quick:
        lengths, peer, m, long_m, rounds, batch = "256,512", "256,512", 2, 2, 1, None
    elif cuda:
        lengths, peer, m, long_m, rounds, batch = "512,1024,2048", "512,1024,2048", 32, 32, 2, (4, 512, 8)
    else:
        lengths, peer, m, long_m, rounds, batch = "512,1024,2048", "512,1024", 4, 2, 2, (4, 256, 2)
    lengths = [int(t) for t in (args.lengths or lengths).split(",")]
    peer = [int(t) for t in (args.peer_lengths or peer).split(",")]
    m, long_m = args.steps or m, args.long_steps or long_m
    chunk, rounds = args.chunk or (4 if cuda else 1), args.rounds or rounds
    jobs = args.jobs or (1 if cuda else 2)
    threads = args.threads or (None if cuda else 1)
    t0 = time.perf_counter()
    results, facts = measure(plan(lengths, peer, m, long_m, chunk, rounds, batch), device, threads, jobs)
    print(format_markdown(results, facts, m, chunk, rounds, time.perf_counter() - t0))
    return results


if __name__ == "__main__":
    main()
