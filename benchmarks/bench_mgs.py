"""Benchmark: one MGS step (taskloss.search.mgs) against its floor — an MLE step, K candidate forwards and K·P normal
draws.

Task: digits classification (``taskloss.datasets.digits.load_digits_splits``), ``taskloss.models.MLP``; surrogate
cross-entropy, task loss the 0-1 error of the argmax (vmappable). Every figure is the median over interleaved
repeats (one call of each method per round, ``benchmarks/_timing.interleaved_median_times``) of one full call:

* ``MLE``         — cross-entropy forward + backward + AdamW step (the peer: what MGS adds its search to);
* ``K fwd``       — K forwards of the model plus the task loss, no gradient (the candidates' unavoidable work);
* ``noise``       — K draws of P standard normal numbers with torch's generator (P = number of parameters) into a
  preallocated buffer, one generator per candidate: the faster of drawing the candidates one after another and
  spreading them over ``torch.get_num_threads()`` Python threads (a generator's stream is sequential, so this
  is the fastest a CPU can draw them; with small P the threads' start-up costs more than it saves): MGS needs
  them and they are not free;
* ``default``     — ``MGS(...)`` with its defaults: ``parallel="auto"`` scores the candidates one after another
  on a CPU (the vmap on a GPU), l(θ) is not computed;
* ``parallel``    — ``parallel=True``: the K perturbed parameter sets stacked, one ``torch.func.vmap`` call;
* ``sequential``  — ``parallel=False`` (what ``default`` is on a CPU; timed separately);
* ``low_memory``  — ``parallel=False, low_memory=True``: noise regenerated from its seeds for the weighted sum;
* ``+ l(θ)``      — ``eager_base_loss=True``: the default plus the forward at the current parameters that older
  versions computed at every step (it cancels in the weights);
* ``bare MGS``    — ``_bare_mgs``: what every MGS step must do, written as a bare loop with none of the package's
  generality or checks (one σ, whole-vector float64 statistics, a stand-in log q from the same inputs). Not a
  target: it says how much of the distance to floor+noise belongs to the algorithm on eager kernels (the K
  candidate writes, the float64 statistics, the weighted sum) and how much to :class:`MGS` itself.

Floors: ``floor = MLE + K fwd`` (the issue's definition) and ``floor+noise = floor + noise``, the work MGS cannot
skip: candidate k's noise is a stream of P normals from its own seed (that is what makes the step reproducible and
the ranks agree), and for the 1M-parameter MLP drawing it costs a third of the candidates' forwards (26 ms
against 73 ms for K = 8, 2 threads, the normals drawn one candidate after another). The FLOP floor
fraction is the time the step's matrix products take at this machine's measured matmul rate (an ``mm`` of the
same sizes) over the measured default step. Peak memory above what is live before a call: on CUDA
``torch.cuda.max_memory_allocated``; on CPU the allocator trace of ``torch.profiler`` (``benchmarks/_timing``).
MGS keeps its K×P candidate rows and a few P-sized buffers between steps (fresh ones cost page faults at every
step: ≈ 9 ms a step for the 1M-parameter MLP on one thread), so after the first step they are live before a
call and do not count in its peak.

Targets: the default step ≤ 1.2× floor+noise on a CPU; parallel faster than sequential on a GPU. The issue asked
for 1.2× ``floor``, which leaves the noise out: for the (1024, 1024) MLP on 2 threads (floor 106 ms, noise 26 ms
drawn serially, about 13 ms over both threads) 1.2× floor = 127 ms is below floor+noise with serial draws and
leaves 8 ms for every pass over θ and the K×P noise with parallel ones. Both ratios are reported.

    python benchmarks/bench_mgs.py [--device auto|cpu|cuda] [--quick] [--threads 1,2]

On a CPU the tables are measured with 1 thread (thread CPU time: the noise is drawn in the calling thread) and with
all of torch's threads (wall clock: the noise workers run in other threads).
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import add_timing_arguments, interleaved_median_times, peak_bytes  # noqa: E402

from taskloss.datasets import load_digits_splits  # noqa: E402
from taskloss.models import MLP  # noqa: E402
from taskloss.search import MGS  # noqa: E402
from taskloss.utils import resolve_device

FLOOR_TARGET = 1.2
VARIANTS = {"default": {}, "parallel": dict(parallel=True), "sequential": dict(parallel=False),
            "low_memory": dict(parallel=False, low_memory=True), "eager_base": dict(eager_base_loss=True)}


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


def _closure(model, batch):
    """MGS's closure: the surrogate's forward and backward, and the batch the candidates are scored on."""
    def closure():
        loss = surrogate(model, batch)
        loss.backward()
        return loss, batch
    return closure


def matmul_flops(hidden, batch_size, K) -> float:
    """Matrix-product FLOPs of one step's floor: forward 2·B·Σ in·out; backward the weight gradients (2·B·in·out
    per layer) and the input gradients of every layer but the first; plus K forwards."""
    dims = (64, *hidden, 10)
    pairs = list(zip(dims[:-1], dims[1:]))
    fwd = sum(2 * batch_size * a * b for a, b in pairs)
    bwd = fwd + sum(2 * batch_size * a * b for a, b in pairs[1:])
    return fwd + bwd + K * fwd


def matmul_rate(device, n=1024, repeats=5, statistic="median", clock="wall") -> float:
    """FLOP/s of an n×n by n×n ``mm`` on ``device`` (median)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t = interleaved_median_times({"mm": lambda: a @ b}, device, repeats, statistic=statistic, clock=clock)["mm"]
    return 2 * n ** 3 / t


def _bare_mgs(hidden, batch_size, K, device, sigma=1e-3, alpha=0.01):
    """A bare MGS step: the arithmetic every MGS step must do, in as few eager calls as it can be written, with
    none of the package's generality or checks — the surrogate gradient gathered flat (and in float64), K draws
    from per-candidate generators scaled by one σ with every other row shifted by −g, the float64 statistics
    ‖s_k‖² and ⟨s_k, g⟩ over the whole vector (not per tensor), every θ + Δθ_k formed by one add and copied into
    the model per candidate, K forwards and task losses, θ restored, log-weights from one float64 expression (a
    stand-in for log q on the same statistics),
    Δθ* = w·rows, ``p.grad = −Δθ*`` and the optimizer step. What it leaves out (σ_t per tensor, the mixture
    density, the weight and input checks, the clipping norms, the statistics' per-tensor split) is what
    :class:`MGS` adds on top; its time is the reference for how much that adds."""
    model, opt, batch = _setup(hidden, batch_size, device)
    params = list(model.parameters())
    numels, shapes = [p.numel() for p in params], [p.shape for p in params]
    P = sum(numels)
    views = lambda flat: [v.view(sh) for v, sh in zip(flat.split(numels), shapes)]  # noqa: E731
    g, theta, upd = (torch.empty(P, device=device) for _ in range(3))
    g64 = torch.empty(P, dtype=torch.float64, device=device)
    rows, cands = torch.empty(K, P, device=device), torch.empty(K, P, device=device)
    s64 = torch.empty(K, P, dtype=torch.float64, device=device)
    g_v, theta_v, cand_v = views(g), views(theta), [views(c) for c in cands]
    for p, u in zip(params, views(upd)):
        p.grad = u
    gens = [torch.Generator(device=device) for _ in range(K)]

    def step():
        loss = surrogate(model, batch)
        torch._foreach_copy_(g_v, torch.autograd.grad(loss, params))
        g64.copy_(g)
        for k in range(K):
            torch.randn(P, generator=gens[k].manual_seed(k), out=rows[k], device=device)
        rows.mul_(sigma)
        s64.copy_(rows)
        sg, ss = s64 @ g64, s64.square_().sum(1)
        rows[::2].sub_(g)
        with torch.no_grad():
            torch._foreach_copy_(theta_v, params)
            torch.add(rows, theta, out=cands)
            losses = []
            for k in range(K):
                torch._foreach_copy_(params, cand_v[k])
                losses.append(zero_one(model(batch[0]), batch))
            torch._foreach_copy_(params, theta_v)
        L = torch.stack(losses).double()
        w = torch.softmax(-L / alpha + 0.5 * (ss + 2 * sg) / sigma ** 2, 0)
        torch.mm(w.to(rows.dtype)[None], rows, out=upd[None])
        upd.neg_()
        opt.step()

    return step


def bench_config(hidden, batch_size, K, device, repeats, rate, memory=True, statistic="median", clock="wall"):
    model, opt, batch = _setup(hidden, batch_size, device)
    P = sum(p.numel() for p in model.parameters())
    row = {"hidden": hidden, "batch": batch_size, "K": K, "params": P,
           "threads": torch.get_num_threads() if device.type == "cpu" else "—"}

    def mle():
        opt.zero_grad(set_to_none=True)
        surrogate(model, batch).backward()
        opt.step()

    fwd_model = _setup(hidden, batch_size, device)[0].eval()

    @torch.no_grad()
    def k_forwards():
        for _ in range(K):
            zero_one(fwd_model(batch[0]), batch)

    bufs = torch.empty(K, P, device=device)
    gens = [torch.Generator(device=device) for _ in range(K)]
    workers = min(K, torch.get_num_threads()) if device.type == "cpu" else 1
    pool = ThreadPoolExecutor(workers) if workers > 1 else None

    def draw(k):
        torch.randn(P, generator=gens[k].manual_seed(k), out=bufs[k], device=device)

    def noise_serial():
        for k in range(K):
            draw(k)

    bare = _bare_mgs(hidden, batch_size, K, device)
    fns = {"mle": mle, "kfwd": k_forwards, "noise_serial": noise_serial, "bare": bare}
    if pool is not None:
        fns["noise_threads"] = lambda: list(pool.map(draw, range(K)))
    steppers = {}
    for name, kw in VARIANTS.items():
        m, o, b = _setup(hidden, batch_size, device)
        steppers[name] = MGS(m, o, zero_one, n_samples=K, seed=0, vmap_task_loss=True, **kw)
        fns[name] = (lambda mgs=steppers[name], b=b: mgs.step(_closure(mgs.model, b)))
    times = interleaved_median_times(fns, device, repeats, statistic=statistic, clock=clock)
    row.update({f"{k}_s": v for k, v in times.items()})
    row["noise_s"] = min(v for k, v in times.items() if k.startswith("noise"))     # the faster way to draw them
    row["default_mode"] = steppers["default"].mode
    row["floor_s"] = row["mle_s"] + row["kfwd_s"]
    row["flop_s"] = matmul_flops(hidden, batch_size, K) / rate
    if memory:
        row.update({f"{k}_bytes": peak_bytes(fns[k], device) for k in ("mle", "default", "parallel", "sequential",
                                                                          "low_memory")})
    return row


def format_markdown(rows, device, repeats, rate, statistic="median", clock="wall") -> str:
    threads = torch.get_num_threads()
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    lines = ["## mgs", "",
             f"One MGS step (AdamW, 0-1 task loss, digits MLP) against its floor, device {device}"
             f"{f', {threads} CPU thread(s)' if device.type == 'cpu' else ''}, {statistic} of {repeats} interleaved "
             f"repeats ({'thread CPU time' if clock == 'cpu' else 'wall clock'}); matmul rate {rate / 1e9:.1f} GFLOP/s. "
             "floor = MLE step + K forwards (the peer: an MLE step); floor+noise adds K·P normal draws (one generator "
             "per candidate, candidates over the threads), the target's denominator. bare MGS: the arithmetic every "
             "MGS step must do written as a bare loop (per-candidate writes, float64 statistics, weights, update; no "
             "per-tensor σ, density, checks or norms: `_bare_mgs`), no target — it shows how much of the gap to "
             "floor+noise is the algorithm itself on eager kernels and how much is the package's step. Peak memory above what is live "
             "before the call "
             f"({'torch.cuda.max_memory_allocated' if device.type == 'cuda' else 'torch.profiler CPU allocator'}).",
             ""]
    if device.type != "cuda":
        lines += ["No GPU on this machine: the GPU target (parallel faster than sequential) is not measured here.",
                  ""]
    lines += ["| threads | MLP hidden | batch | K | params | MLE | K fwd | noise | default | parallel | sequential | "
              f"default / floor | default / (floor+noise) (target ≤ {FLOOR_TARGET:g}) | bare MGS / (floor+noise) | "
              "default / bare MGS | FLOP floor fraction | "
              "parallel / sequential | low_memory / sequential | + l(θ) / default | peak MLE | peak default | "
              "peak parallel | peak low_memory |",
              "|" + "---|" * 23]
    for r in rows:
        d = r["default_s"]
        lines.append(
            f"| {r['threads']} | {r['hidden']} | {r['batch']} | {r['K']} | {r['params']} | {ms(r['mle_s'])} | {ms(r['kfwd_s'])} | "
            f"{ms(r['noise_s'])} | {ms(d)} ({r['default_mode']}) | {ms(r['parallel_s'])} | {ms(r['sequential_s'])} | "
            f"{d / r['floor_s']:.2f} | {d / (r['floor_s'] + r['noise_s']):.2f} "
            f"{'✓' if d <= FLOOR_TARGET * (r['floor_s'] + r['noise_s']) else '✗'} | "
            f"{r['bare_s'] / (r['floor_s'] + r['noise_s']):.2f} | {d / r['bare_s']:.2f} | {r['flop_s'] / d:.0%} | "
            f"{r['parallel_s'] / r['sequential_s']:.2f} | {r['low_memory_s'] / r['sequential_s']:.2f} | "
            f"{r['eager_base_s'] / d:.2f} | "
            + " | ".join(mib(r[f"{k}_bytes"]) if f"{k}_bytes" in r else "—"
                         for k in ("mle", "default", "parallel", "low_memory")) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_arguments(ap)
    ap.add_argument("--no-memory", action="store_true", help="skip the (slow) profiler memory measurement")
    ap.add_argument("--threads", default=None,
                    help="CPU thread counts, one table each, e.g. 1,2 (default on a CPU: 1 and all of torch's threads;"
                         " one thread is timed with the thread's CPU time, more with the wall clock)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if args.quick:
        configs, repeats = [((64,), 128, 8)], args.repeats or 5
    else:
        configs = [((64,), 128, 8), ((256, 256), 1078, 4), ((256, 256), 1078, 8), ((1024, 1024), 1078, 8)]
        repeats = args.repeats or 15
    start = torch.get_num_threads()
    if device.type != "cpu":
        threads = [start]
    elif args.threads:
        threads = [int(t) for t in args.threads.split(",")]
    else:
        threads = sorted({1, start})
    tables, all_rows = [], []
    try:
        for n in threads:
            torch.set_num_threads(n)
            clock = "cpu" if device.type == "cpu" and n == 1 else args.clock
            rate = matmul_rate(device, statistic=args.statistic, clock=clock)
            rows = [bench_config(h, b, K, device, repeats, rate, memory=not args.no_memory and n == threads[-1],
                                 statistic=args.statistic, clock=clock) for h, b, K in configs]
            tables.append(format_markdown(rows, device, repeats, rate, args.statistic, clock))
            all_rows += rows
    finally:
        torch.set_num_threads(start)
    no_gpu = "No GPU on this machine: the GPU target (parallel faster than sequential) is not measured here.\n\n"
    print("\n\n".join(t if i == 0 else t.split("\n", 2)[2].replace(no_gpu, "") for i, t in enumerate(tables)))
    return all_rows


if __name__ == "__main__":
    main()
