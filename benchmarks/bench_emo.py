"""Benchmark: the EMO loss of taskloss.losses.emo beside the EMO authors' code, cross-entropy and the FLOP floor.

Forward + backward of a loss on the same logits ``[N, V]`` (float32), cost embeddings ``[V, d]``. One process,
interleaved repeats (every method once per round, the order rotated each round), per thread count; each cell is
the median over rounds with the range ``[min–max]``. A ratio to a peer is the median of the per-round ratios (both
measured in the same round), so load that drifts between rounds on a shared machine cancels.

Peers (what a user would pick instead):

* ``emoloss`` — the authors' PyPI package ``emoloss`` 0.0.3 (``from emo import EMOLoss``), the plain formula;
  ``mode=1`` = our ``combine="emo_mle_ratio", ratio_max=3``; ``mode=2`` = ``combine="mle_scaled_by_emo"``. It takes
  unshifted ``[B, T+1, V]`` logits and shifts them itself; ours gets the same ``N`` tokens already shifted.
* ``official patch`` — the formula of ``emo_patch.py`` ``emo1_adaptive`` (github.com/DRSY/EMO, commit 14da9d5):
  ``q − sg(q ⊙ onehot)``, ``½(sg(MLE/EMO)·EMO + MLE)``, restated here (the file is a transformers monkey patch, not
  an importable loss); ours: ``combine="emo_mle_ratio", variant="patch"``.
* ``cross_entropy`` — ``torch.nn.functional.cross_entropy`` (the cost of MLE alone).

Ours is :class:`taskloss.losses.EMOLoss` (unit-norm cost table held as a buffer, as a training loop uses it; the
peers normalize their table on every call, as the official code does). ``ours, per-token kernel`` is
``reduction="none"`` then a mean: the per-token kernel (one ``N·V·d`` product in each direction) instead of the
fused loss (one in all). ``compiled autograd formula`` (``--compile``) is ``torch.compile`` of the plain-autograd
formula, measured as an option.

Floor fraction: ``4·N·V·d`` FLOPs (EMO's two ``N·V·d`` products, forward and backward) at this machine's matrix
rate, measured in the same rounds on the two product shapes, over the method's time. The fused loss needs only
``2·N·V·d`` (its backward is built in the forward pass), so its fraction can exceed 1: the ``4·N·V·d`` floor is
the floor of the per-token formulation, not of EMO.

Peak memory above the inputs: ``benchmarks/_timing.peak_bytes`` (CPU: torch.profiler allocator trace; CUDA:
``max_memory_allocated``).

    python benchmarks/bench_emo.py [--device auto|cpu|cuda] [--quick] [--threads 1,2] [--tokens 512]
                                   [--sizes 30522:384,50257:768] [--repeats 5] [--compile]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import peak_bytes, sync  # noqa: E402

from taskloss.losses import EMOLoss  # noqa: E402
from taskloss.utils import resolve_device

RATIO_TARGET, FLOOR_TARGET = 0.5, 0.6


def official_patch_emo1(logits, labels, cost, ignore_index=-100):
    """The formula of emo_patch.py ``emo1_adaptive`` (labels already aligned with logits ``[N, V]``)."""
    mask = (labels != ignore_index).to(logits.dtype)
    mle = F.cross_entropy(logits, labels, reduction="none", ignore_index=ignore_index)
    lab = labels.masked_fill(labels == ignore_index, 0)
    one_hot = F.one_hot(lab, logits.shape[-1]).to(logits.dtype)
    target = (one_hot + 1e-15) / torch.linalg.vector_norm(one_hot + 1e-15, ord=1, dim=-1, keepdim=True)
    e_hat = cost / torch.linalg.vector_norm(cost, ord=2, dim=1, keepdim=True)
    q = torch.log_softmax(logits, dim=-1).exp()
    q = q - (q * one_hot).detach()
    emo = (1 - ((target @ e_hat) * (q @ e_hat)).sum(-1)) * mask
    loss = ((mle / (emo + 1e-10)).detach() * emo + mle) * 0.5
    return (loss * mask).sum() / (1e-15 + mask.sum())


def _emoloss():
    try:
        from emo import EMOLoss as official
    except ImportError:
        return None
    return official


def methods_for(x, xf, t, tf, emb, crit, compile_fn):
    """name → (loss thunk, the logits tensor it differentiates, peer name or None, FLOPs it needs)."""
    official = _emoloss()
    m = {
        "ours emo_mle_ratio r_max=3": (lambda: crit["ratio3"](x, t), x, "emoloss mode=1"),
        "ours mle_scaled_by_emo": (lambda: crit["scaled"](x, t), x, "emoloss mode=2"),
        "ours emo_mle_ratio, patch": (lambda: crit["patch"](x, t), x, "official patch"),
        "ours, per-token kernel": (lambda: crit["none"](x, t).mean(), x, "emoloss mode=1"),
        "official patch": (lambda: official_patch_emo1(x, t, emb), x, None),
        "cross_entropy": (lambda: F.cross_entropy(x, t), x, None),
    }
    if official is not None:
        m["emoloss mode=1"] = (lambda: official(xf, tf, emb, mode=1), xf, None)
        m["emoloss mode=2"] = (lambda: official(xf, tf, emb, mode=2), xf, None)
    if compile_fn is not None:
        m["compiled autograd formula"] = (lambda: compile_fn(x, t), x, "emoloss mode=1")
    return m


def _step(fn, leaf):
    leaf.grad = None
    fn().backward()
    leaf.grad = None


def bench_size(n, v, d, device, threads, repeats, compile_opt):
    gen = torch.Generator().manual_seed(0)
    xf = (torch.randn(1, n + 1, v, generator=gen) * 2).to(device).requires_grad_()
    x = xf.detach()[0, :-1].clone().requires_grad_()
    t = torch.randint(0, v, (n,), generator=gen).to(device)
    tf = torch.cat([torch.zeros(1, dtype=torch.long, device=device), t])[None]
    emb = torch.randn(v, d, generator=gen).to(device)
    crit = {"ratio3": EMOLoss(emb, combine="emo_mle_ratio", ratio_max=3.0).to(device),
            "scaled": EMOLoss(emb, combine="mle_scaled_by_emo").to(device),
            "patch": EMOLoss(emb, combine="emo_mle_ratio", variant="patch").to(device),
            "none": EMOLoss(emb, combine="emo_mle_ratio", ratio_max=3.0, reduction="none").to(device)}
    compile_fn = None
    if compile_opt:
        from taskloss.losses.emo_kernel import reduced_loss_autograd
        e_hat = crit["ratio3"].cost_embeddings
        valid = torch.ones(n, dtype=torch.bool, device=device)
        scale = torch.tensor(1.0 / n, device=device)
        compiled = torch.compile(reduced_loss_autograd, dynamic=False)
        compile_fn = lambda x_, t_: compiled(x_, e_hat[t_], e_hat, t_, valid, "emo_mle_ratio", False,  # noqa: E731
                                             3.0, 1e-10, scale)
    meths = methods_for(x, xf, t, tf, emb, crit, compile_fn)
    a, b = torch.randn(n, v, generator=gen).to(device), crit["ratio3"].cost_embeddings
    c = torch.randn(n, d, generator=gen).to(device)

    def floor():  # the two N·V·d products: [N, V] @ [V, d] and [N, d] @ [d, V]
        torch.mm(a, b)
        torch.mm(c, b.T)

    rows = []
    for th in threads:
        torch.set_num_threads(th)
        names = list(meths) + ["floor"]
        for name in names:  # warm-up (torch.compile traces here)
            floor() if name == "floor" else _step(meths[name][0], meths[name][1])
        times = {k: [] for k in names}
        for r in range(repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                sync(device)
                t0 = time.perf_counter()
                floor() if name == "floor" else _step(meths[name][0], meths[name][1])
                sync(device)
                times[name].append(time.perf_counter() - t0)
        rate = 4 * n * v * d / statistics.median(times["floor"])
        for name, (fn, leaf, peer) in meths.items():
            ts = times[name]
            row = {"V": v, "d": d, "threads": th, "method": name, "peer": peer, "med": statistics.median(ts),
                   "min": min(ts), "max": max(ts), "floor": statistics.median(
                       [f / s for f, s in zip(times["floor"], ts)]), "gflops": rate / 1e9}
            if peer is not None and peer in times:
                ratios = [s / p for s, p in zip(ts, times[peer])]
                row.update(ratio=statistics.median(ratios), rmin=min(ratios), rmax=max(ratios))
            rows.append(row)
    torch.set_num_threads(threads[0])
    mem = {name: peak_bytes(lambda fn=fn, leaf=leaf: _step(fn, leaf), device) for name, (fn, leaf, _) in
           meths.items()}
    for row in rows:
        row["bytes"] = mem[row["method"]]
        row["ce_bytes"] = mem["cross_entropy"]
        row["peer_bytes"] = mem.get(row["peer"]) if row["peer"] else None
    return rows


def format_markdown(rows, n, device, repeats):
    lines = [
        "## emo", "",
        f"EMO loss forward+backward, N={n} tokens, float32 logits, device {device}; {repeats} interleaved rounds per "
        "thread count, median [min–max]. Ratio = median of per-round ratios to the named peer (target ≤ "
        f"{RATIO_TARGET}); floor = 4·N·V·d FLOPs at the measured matrix rate over the time (target ≥ {FLOOR_TARGET}; "
        "the fused loss needs 2·N·V·d, so it can exceed 1). Peak memory above the inputs.", "",
        "| V | d | threads | method | peer | time ms | ratio to peer | floor fraction | matmul GFLOP/s | "
        "peak MiB | peak / peer | peak / CE |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "—"
        if "ratio" in r:
            ok = "✓" if r["ratio"] <= RATIO_TARGET else "✗"
            ratio = f"{r['ratio']:.2f} [{r['rmin']:.2f}–{r['rmax']:.2f}] {ok}"
        is_ours = r["method"].startswith("ours")
        floor = f"{r['floor']:.2f}" + ((" ✓" if r["floor"] >= FLOOR_TARGET else " ✗") if is_ours else "")
        peer_mem = f"{r['bytes'] / r['peer_bytes']:.2f}" if r.get("peer_bytes") else "—"
        lines.append(
            f"| {r['V']} | {r['d']} | {r['threads']} | {r['method']} | {r['peer'] or '—'} | "
            f"{r['med'] * 1e3:.0f} [{r['min'] * 1e3:.0f}–{r['max'] * 1e3:.0f}] | {ratio} | {floor} | "
            f"{r['gflops']:.0f} | {r['bytes'] / 2**20:.1f} | {peer_mem} | {r['bytes'] / r['ce_bytes']:.2f} |")
    if _emoloss() is None:
        lines += ["", "_`emoloss` is not installed: its rows are missing (`pip install emoloss==0.0.3`)._"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds, 1 thread (a smoke run)")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--sizes", default=None, help="V:d pairs, e.g. 30522:384,50257:768")
    ap.add_argument("--threads", default=None, help="CPU thread counts, e.g. 1,2")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the autograd formula")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if args.quick:
        n, sizes, threads, repeats = args.tokens or 128, args.sizes or "2000:64,8000:128", args.threads or "1", \
            args.repeats or 2
    else:
        n, sizes, threads, repeats = args.tokens or 512, args.sizes or "30522:384,50257:768", args.threads or "1,2", \
            args.repeats or 5
    if device.type == "cuda":
        threads = str(torch.get_num_threads())
        n = args.tokens or 4096
    pairs = [tuple(int(z) for z in s.split(":")) for s in sizes.split(",")]
    ths = [int(z) for z in threads.split(",")]
    rows = []
    for v, d in pairs:
        rows += bench_size(n, v, d, device, ths, repeats, args.compile)
    print(format_markdown(rows, n, device, repeats))
    return rows


if __name__ == "__main__":
    main()
