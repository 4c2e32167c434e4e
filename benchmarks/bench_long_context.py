"""Benchmark: integrated gradients of a GPT-2-small-shaped causal LM over long contexts (512–2048 tokens), ours
(:class:`taskloss.attribution.EmbeddingIntegratedGradients`) against Captum 0.9's ``LayerIntegratedGradients`` on
the token embedding, at the same user-set chunk of path points per pass.

Model: ``transformers.GPT2LMHeadModel(GPT2Config(n_positions=max(T, 1024)))`` — GPT-2 small's shape (12 layers,
width 768, 12 heads, vocabulary 50257, 124M parameters), random weights (seed 0), built offline in each worker
process, float32, SDPA attention, eval mode. Target: log p(next token) at the last position for the token the
model predicts there (only the last position's logits are computed: ``logits_to_keep=1``, in both methods'
forward function); baseline: the ``<|endoftext|>`` token (50256) at every position; Gauss–Legendre rule, ``m``
steps; completeness error returned by both (Captum: ``return_convergence_delta=True``).

Each measurement runs in a fresh process (``--worker``), one attribution per process after a small warm-up
attribution. Time: on the CPU one torch thread and the thread's CPU time (``--threads 1``, the default: time the
thread spends descheduled on a shared machine is not counted), else the wall clock. Peak memory above what is live
before the call: on the CPU the process's peak resident set above its RSS before the call
(``benchmarks/_timing.rss_peak_delta``, the kernel's exact high-water mark, no profiler), with glibc's mmap
threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``) so that every freed activation returns to the system and
RSS follows torch's live bytes: at T = 256 it then equals the allocator's peak from the profiler trace (0.889 GiB at
m = 4 and 16 alike), where with glibc's default, adaptive threshold the RSS of a second call grew with the number of
chunks (0.11 → 0.58 GiB from m = 4 to 16) though torch's live bytes stayed flat. On CUDA
``torch.cuda.max_memory_allocated`` above the memory allocated before the call. A hook on ``transformer.drop``
(the hidden states after the embedding) counts the rows of every forward pass: the path points alive in one pass.

* ``ours``                 — ``internal_batch_size = chunk`` rows per pass; a step's sequences are split when one
  step has more rows than the chunk;
* ``captum``               — ``internal_batch_size = chunk``; Captum's chunks are whole steps, at least B rows
  (a smaller value is raised to B with a warning), so with B > chunk its passes hold B rows;
* ``captum default``       — ``internal_batch_size=None`` (Captum's default: all m·B path points in one pass);
  run only where the predicted peak (m·B/chunk × our measured peak) fits in the memory available, else reported
  as not fitting.

Targets: at T = 1024, peak memory ≤ 0.5× Captum's and time ≤ 1× Captum's at equal output (max |ours − Captum| /
max |attribution| ≤ 1e-4 in float32).

Plan (default): at the peer lengths 512 and 1024, ours then Captum with m = 32, ``repeats`` times; once: ours alone
at T = 2048 with ``--long-steps`` 8 (the memory of a chunked run does not depend on m: checked at T = 1024 with
m = 4), Captum's default where it fits, and B = 4 sequences × 512 tokens with m = 4 (a chunk below the batch).

    python benchmarks/bench_long_context.py [--quick] [--lengths 512,1024,2048] [--peer-lengths 512,1024]
                                            [--steps 32] [--long-steps 8] [--chunk 4] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _timing import run_worker, value_range  # noqa: E402

TIME_TARGET, MEM_TARGET, EQUAL_TOL, TARGET_T = 1.0, 0.5, 1e-4, 1024
BASELINE_TOKEN = 50256
MMAP_THRESHOLD = 128 * 1024     # glibc: every block ≥ 128 KiB mmap-ed and returned on free (see the module doc)


# ------------------------------------------------------------------------------------------------ the worker
def _worker(spec: dict) -> dict:
    import torch
    import transformers
    from _timing import peak_bytes, rss_peak_delta, sync

    from taskloss.attribution import EmbeddingIntegratedGradients

    T, B, m, chunk, method = spec["T"], spec["B"], spec["m"], spec["chunk"], spec["method"]
    device = torch.device(spec.get("device", "cpu"))
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
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
    rows: list[int] = []

    def attribute(x, b, tgt, n_steps, ibs):
        if method == "ours":
            got = EmbeddingIntegratedGradients(fwd, wte).attribute(x, baselines=b, target=tgt, n_steps=n_steps,
                                                                   internal_batch_size=ibs)
            return got.attributions, got.completeness_error
        import warnings

        from captum.attr import LayerIntegratedGradients
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # "internal batch size cannot be less than the examples"
            attr, delta = LayerIntegratedGradients(fwd, wte).attribute(
                x, baselines=b, target=tgt, n_steps=n_steps, internal_batch_size=ibs, return_convergence_delta=True)
        return attr.sum(-1), delta

    ibs = None if method == "captum default" else chunk
    attribute(ids[:, :16], base[:, :16], target, 2, ibs)            # warm-up: kernels, thread pool, caches
    handle = model.transformer.drop.register_forward_hook(lambda mod, i, out: rows.append(out.shape[0]))
    call = lambda: attribute(ids, base, target, m, ibs)          # noqa: E731
    now = time.thread_time if cpu_clock else time.perf_counter
    sync(device)
    t0 = now()
    if device.type == "cuda":
        out: list = []
        peak = peak_bytes(lambda: out.append(call()), device)
        attr, err = out[0]
    else:
        (attr, err), peak = rss_peak_delta(call)
    sync(device)
    seconds = now() - t0
    handle.remove()
    torch.save(attr.cpu(), spec["out"])
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return dict(spec, seconds=seconds, peak=peak, max_rows=max(rows), passes=len(rows),
                completeness=float(err.abs().max()), param_bytes=param_bytes, threads=torch.get_num_threads(),
                clock="thread CPU time" if cpu_clock else "wall clock")



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


# ------------------------------------------------------------------------------------------------ the driver
def measure(lengths, peer_lengths, m, chunk, repeats, batch_case, m_check, long_m, tmp, device="cpu",
            threads=None) -> list[dict]:
    """Every measurement, each in a fresh process, tagged by ``role``: per repeat and peer length ours then Captum at
    the same chunk (``pair``); once: Captum's default where it is predicted to fit (``default``), ours alone at the
    lengths without a peer run with ``long_m`` steps (``long``), ours at ``m_check`` steps at T = 1024 (``mcheck``),
    and the batch case (``batch``: B sequences, ours one row per pass against Captum's smallest chunk, B rows)."""
    import torch

    results = []

    def run(role, **spec):
        spec = dict(spec, role=role, out=os.path.join(tmp, f"{len(results)}.pt"), device=device, threads=threads)
        r = run_worker(__file__, spec, env={"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
        print(f"  {r['method']:>14} T={r['T']} B={r['B']} m={r['m']} chunk={r['chunk']}: "
              + (r["error"] if "error" in r else f"{r['seconds']:.0f} s, peak {r['peak'] / 2**30:.2f} GiB, "
                 f"≤ {r['max_rows']} rows per pass"), file=sys.stderr, flush=True)
        results.append(r)
        return r

    def compare(a, b):
        if "error" not in a and "error" not in b:
            x, y = torch.load(a["out"]), torch.load(b["out"])
            a["rel_diff"] = b["rel_diff"] = float((x - y).abs().max() / x.abs().max())

    for rep in range(repeats):
        for T in [t for t in lengths if t in peer_lengths]:
            ours = run("pair", method="ours", T=T, B=1, m=m, chunk=chunk, rep=rep)
            compare(ours, run("pair", method="captum", T=T, B=1, m=m, chunk=chunk, rep=rep))
            if rep == 0 and "error" not in ours:
                predicted = ours["peak"] * m / min(chunk, m)     # all m points where ours holds `chunk`
                if predicted < 0.7 * available_bytes(device):
                    run("default", method="captum default", T=T, B=1, m=m, chunk=chunk, rep=rep)
                else:
                    results.append(dict(role="default", method="captum default", T=T, B=1, m=m, chunk=None,
                                        rep=rep, predicted=predicted,
                                        error=f"does not fit: predicted {predicted / 2**30:.1f} GiB (m/chunk × "
                                              f"ours) > 70 % of the {available_bytes(device) / 2**30:.1f} GiB "
                                              "available"))
    for T in [t for t in lengths if t not in peer_lengths]:
        run("long", method="ours", T=T, B=1, m=long_m, chunk=chunk, rep=0)
    if m_check and TARGET_T in lengths:
        run("mcheck", method="ours", T=TARGET_T, B=1, m=m_check, chunk=chunk, rep=0)
    if batch_case:
        Bb, Tb, mb = batch_case
        compare(run("batch", method="ours", T=Tb, B=Bb, m=mb, chunk=1, rep=0),
                run("batch", method="captum", T=Tb, B=Bb, m=mb, chunk=1, rep=0))
    return results


def format_markdown(results, m, chunk) -> str:
    gib = lambda b: f"{b / 2**30:.2f}"                           # noqa: E731
    secs = lambda v: f"{v:.0f}"                                  # noqa: E731
    ok = [r for r in results if "error" not in r]
    clock = ok[0]["clock"] if ok else "?"
    lines = ["## long-context attribution", "",
             "Integrated gradients of a GPT-2-small-shaped LM (124M parameters, random weights) in embedding space, "
             f"Gauss–Legendre, float32, one sequence unless stated; each figure from a fresh process ({clock}), range "
             "over repeats. Peak: peak RSS above the RSS before the call (weights excluded; glibc's mmap threshold "
             "fixed at 128 KiB so RSS follows torch's live bytes). "
             f"Chunk: {chunk} path points per pass for both. Targets at T = {TARGET_T}: peak ≤ {MEM_TARGET}× Captum's, time ≤ {TIME_TARGET:g}× "
             "Captum's, equal output.", "",
             "| T | m | ours s | Captum s | time ours / Captum | ours peak GiB | Captum peak GiB | peak ours / Captum "
             "| Captum default (all points in one pass) | rows per pass ours / Captum | equal output |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def by(role, meth, T):
        return sorted([r for r in ok if (r["role"], r["method"], r["T"]) == (role, meth, T)], key=lambda r: r["rep"])

    for T in sorted({r["T"] for r in results if r["role"] in ("pair", "long")}):
        ours, cap = by("pair", "ours", T) or by("long", "ours", T), by("pair", "captum", T)
        default = [r for r in results if r["role"] == "default" and r["T"] == T]
        dflt = "—"
        if default:
            d = default[0]
            dflt = d["error"] if "error" in d else f"{secs(d['seconds'])} s, peak {gib(d['peak'])} GiB"
        if not ours:
            continue
        row = [str(T), str(ours[0]["m"]), value_range([r["seconds"] for r in ours], secs)]
        if cap:
            pairs = list(zip(ours, cap))
            t_ratio = [o["seconds"] / c["seconds"] for o, c in pairs]
            m_ratio = [o["peak"] / c["peak"] for o, c in pairs]
            tgt = T == TARGET_T
            tr = value_range(t_ratio, "{:.2f}".format) + ((" ✓" if max(t_ratio) <= TIME_TARGET else " ✗") if tgt else "")
            mr = value_range(m_ratio, "{:.2f}".format) + ((" ✓" if max(m_ratio) <= MEM_TARGET else " ✗") if tgt else "")
            rel = max(r.get("rel_diff", float("nan")) for r in ours)
            row += [value_range([r["seconds"] for r in cap], secs), tr, value_range([r["peak"] for r in ours], gib),
                    value_range([r["peak"] for r in cap], gib), mr, dflt,
                    f"{max(r['max_rows'] for r in ours)} / {max(r['max_rows'] for r in cap)}",
                    f"{rel:.1e} {'✓' if rel <= EQUAL_TOL else '✗'}"]
        else:
            row += ["—", "—", value_range([r["peak"] for r in ours], gib), "—", "—", dflt,
                    f"{max(r['max_rows'] for r in ours)} / —", "—"]
        lines.append("| " + " | ".join(row) + " |")
    checks = [r for r in ok if r["role"] == "mcheck"]
    if checks:
        ref = by("pair", "ours", checks[0]["T"])
        lines += ["", f"Independence of m: ours at T = {checks[0]['T']} with m = {checks[0]['m']} peaks at "
                  f"{value_range([r['peak'] for r in checks], gib)} GiB against {value_range([r['peak'] for r in ref], gib)} GiB "
                  f"with m = {m} (same chunk of {chunk})."]
    o = [r for r in ok if r["role"] == "batch" and r["method"] == "ours"]
    c = [r for r in ok if r["role"] == "batch" and r["method"] == "captum"]
    if o and c:
        b0 = o[0]
        lines += ["", f"A chunk below the batch: B = {b0['B']} sequences × T = {b0['T']}, m = {b0['m']}; ours with one "
                  f"sequence per pass ({value_range([r['seconds'] for r in o], secs)} s, peak "
                  f"{value_range([r['peak'] for r in o], gib)} GiB, ≤ {max(r['max_rows'] for r in o)} row per pass) against "
                  f"Captum at its smallest chunk, one step of B rows ({value_range([r['seconds'] for r in c], secs)} s, "
                  f"peak {value_range([r['peak'] for r in c], gib)} GiB, ≤ {max(r['max_rows'] for r in c)} rows per "
                  f"pass): peak ours / Captum {value_range([x['peak'] / y['peak'] for x, y in zip(o, c)], '{:.2f}'.format)}"
                  f", time {value_range([x['seconds'] / y['seconds'] for x, y in zip(o, c)], '{:.2f}'.format)}; equal "
                  f"output {max(r.get('rel_diff', float('nan')) for r in o):.1e}."]
    for r in results:
        if "error" in r and r["role"] != "default":
            lines += ["", f"Failed: {r['method']} T={r['T']} B={r['B']} m={r['m']}: {r['error']}"]
    if ok:
        lines += ["", f"Threads: {ok[0]['threads']}; weights {ok[0]['param_bytes'] / 2**20:.0f} MiB (live before "
                  "every call, not counted)."]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="T = 256 and 512, m = 8, one repeat (a smoke run)")
    ap.add_argument("--lengths", default=None, help="context lengths, e.g. 512,1024,2048")
    ap.add_argument("--peer-lengths", default=None, help="lengths at which Captum is run too (default 512,1024)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--long-steps", type=int, default=None,
                    help="steps at the lengths without a Captum run (default 8: memory does not depend on m)")
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1: thread CPU time)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return None
    from taskloss.utils import resolve_device
    device = str(resolve_device(args.device))
    if args.quick:
        lengths = [int(t) for t in (args.lengths or "256,512").split(",")]
        peer = [int(t) for t in (args.peer_lengths or "256,512").split(",")]
        m, repeats, m_check, batch, long_m = args.steps or 8, args.repeats or 1, 0, None, args.long_steps or 4
    else:
        lengths = [int(t) for t in (args.lengths or "512,1024,2048").split(",")]
        peer = [int(t) for t in (args.peer_lengths or "512,1024").split(",")]
        m, repeats, m_check, batch = args.steps or 32, args.repeats or 2, 4, (4, 512, 4)
        long_m = args.long_steps or 8
    with tempfile.TemporaryDirectory() as tmp:
        threads = args.threads or (1 if device == "cpu" else None)
        results = measure(lengths, peer, m, args.chunk, repeats, batch, m_check, long_m, tmp, device, threads)
    print(format_markdown(results, m, args.chunk))
    return results


if __name__ == "__main__":
    main()
