"""Benchmark: optimizer steps of Shampoo and SOAP (taskloss.curvature) against pytorch_optimizer's and heavyball's,
and the harness's Muon rule against ``torch.optim.Muon`` used directly.

Task: one square weight ``[d, d]`` with a fixed random gradient (float32), at three widths ``d``. Each timed call is
a block of 10 optimizer steps, so SOAP's basis refresh (every 10 updates) and Shampoo's roots at the interval used
are inside it; every figure is the median over interleaved rounds (one block of each method per round,
``benchmarks/_timing.interleaved_median_times``), reported per step. Configurations, equal where the definitions
coincide (tests/curvature/test_shampoo*.py):

* ``Shampoo``  — ours with ``grafting="none"``, roots every step, against ``pytorch_optimizer.Shampoo`` (roots by
  SVD every step); and ours with Adam grafting and roots every 10 steps (the practical setting);
* ``SOAP``     — ours against ``pytorch_optimizer.SOAP`` (same algorithm, QR refresh every 10) and
  ``heavyball.SOAP`` (its own conventions; compiled by torch.inductor on its first step, which the warm-up
  round absorbs);
* ``Muon``     — the harness's ``muon`` rule step (closure: forward + backward of an MLP ``d → d → d → 10`` on a
  batch of 64, then ``torch.optim.Muon`` on the hidden matrices and AdamW on the rest) against the same four calls
  written directly. Target ≤ 1.2×.

Floors: the matrix products a step cannot avoid, at this machine's measured ``mm`` rate (float32, and bfloat16 for
Muon's Newton–Schulz, which torch runs in bfloat16): Shampoo's statistics ``GGᵀ``, ``GᵀG`` (2·2d³ FLOPs), its two
preconditioning products (2·2d³), the two roots ``Q diag Qᵀ`` (2·2d³) and two symmetric eigendecompositions with
vectors (≈ 9d³ each, Golub & Van Loan's count for the symmetric QR algorithm) at every root; SOAP's statistics
(4d³), four rotations (8d³) and, every 10 updates, two power-iteration products (4d³) and two QRs (≈ 4/3 d³ each);
Newton–Schulz's 5 steps of ``X Xᵀ``, ``A A`` and ``B X`` (5·6d³ for square ``X``). Peak memory: the bytes torch's CPU
allocator hands out during one block above what was live before it (``benchmarks/_timing.peak_bytes``; on CUDA
``max_memory_allocated``), after a warm-up block so that the optimizers' state is allocated.

    python benchmarks/bench_preconditioners.py [--device auto|cpu|cuda] [--quick] [--widths 64,256,512]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import add_timing_arguments, interleaved_median_times, peak_bytes, quiet_stderr  # noqa: E402

from taskloss.curvature import SOAP, Shampoo, muon_with_adamw  # noqa: E402
from taskloss.harness import Problem, make_rule  # noqa: E402
from taskloss.utils import resolve_device

BLOCK = 10


def _weight(d: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    w = nn.Parameter(torch.randn(d, d, generator=g, device=device) / d ** 0.5)
    w.grad = torch.randn(d, d, generator=g, device=device) * 1e-2
    return w


def _block(opt, w):
    g0 = w.grad.detach().clone()

    def run():                     # a fresh copy of the gradient at every step: heavyball clears .grad after its
        for _ in range(BLOCK):     # step, pytorch_optimizer's Shampoo may write into it
            w.grad = g0.clone()
            opt.step()
    return run


def _optimizers(d: int, device, heavy: bool) -> dict:
    import pytorch_optimizer as po
    make = {
        "Shampoo (ours, no grafting, root every step)":
            lambda w: Shampoo([w], lr=1e-3, grafting="none", epsilon=1e-6),
        "Shampoo (pytorch_optimizer, root every step)": lambda w: po.Shampoo([w], lr=1e-3, matrix_eps=1e-6),
        "Shampoo (ours, Adam grafting, root every 10)":
            lambda w: Shampoo([w], lr=1e-3, precondition_interval=10),
        "SOAP (ours, QR every 10)": lambda w: SOAP([w], lr=1e-3),
        "SOAP (pytorch_optimizer, QR every 10)": lambda w: po.SOAP([w], lr=1e-3),
    }
    if heavy:
        import heavyball
        make["SOAP (heavyball, compiled; its defaults)"] = lambda w: heavyball.SOAP([w], lr=1e-3)
    out = {}
    for name, fn in make.items():
        w = _weight(d, device)
        out[name] = _block(fn(w), w)
    return out


def _mm_rate(d: int, device, dtype) -> float:
    a = torch.randn(d, d, device=device).to(dtype)
    b = torch.randn(d, d, device=device).to(dtype)
    t = interleaved_median_times({"mm": lambda: a @ b}, device, repeats=7, warmup=2)["mm"]
    return 2 * d ** 3 / t


def _floors(d: int, rate32: float, rate16: float) -> dict:
    shampoo_root = 2 * 2 * d ** 3 + 2 * 9 * d ** 3
    shampoo = 4 * d ** 3 + 4 * d ** 3
    soap = 4 * d ** 3 + 8 * d ** 3
    soap_refresh = 4 * d ** 3 + 2 * (4 / 3) * d ** 3
    return {
        "Shampoo root every step": (shampoo + shampoo_root) / rate32,
        "Shampoo root every 10": (shampoo + shampoo_root / 10) / rate32,
        "SOAP": (soap + soap_refresh / 10) / rate32,
        "NS (5 steps, bf16)": 5 * 6 * d ** 3 / rate16,
    }


def _muon_pair(d: int, device):
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(64, d, generator=g, device=device)
    y = torch.randint(0, 10, (64,), generator=g, device=device)

    def mlp():
        torch.manual_seed(2)
        return nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 10)).to(device)

    rule = make_rule("muon", Problem(mlp(), x, y))
    model = mlp()
    muon, adamw = muon_with_adamw(model, lr=0.02, momentum=0.95, adamw_lr=0.01)

    def direct():
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        muon.step()
        adamw.step()
    return {"muon rule (harness)": rule.step, "torch.optim.Muon + AdamW (direct)": direct}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_timing_arguments(ap)
    ap.add_argument("--widths", default=None, help="comma-separated widths (default 64,256,512; --quick 64,128)")
    ap.add_argument("--no-heavyball", action="store_true", help="skip heavyball (its first step compiles)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    widths = [int(w) for w in (args.widths or ("64,128" if args.quick else "64,256,512")).split(",")]
    repeats = args.repeats or (3 if args.quick else 7)
    print("## preconditioners\n")
    print(f"device: {device}; threads: {torch.get_num_threads()}; clock: {args.clock}; statistic: {args.statistic}; "
          f"{repeats} interleaved rounds of {BLOCK}-step blocks, per step\n")
    print("| d | optimizer | ms/step | ratio to ours | floor ms/step | floor fraction | peak MiB (10 steps) |")
    print("|---|---|---|---|---|---|---|")
    for d in widths:
        rate32 = _mm_rate(d, device, torch.float32)
        rate16 = _mm_rate(d, device, torch.bfloat16)
        floors = _floors(d, rate32, rate16)
        t0 = time.perf_counter()
        with quiet_stderr():
            fns = _optimizers(d, device, heavy=not args.no_heavyball)
            times = interleaved_median_times(fns, device, repeats=repeats, warmup=1, statistic=args.statistic,
                                             clock=args.clock)
            peaks = {name: peak_bytes(fn, device) for name, fn in fns.items()}
        ours = {"Shampoo (ours, no grafting, root every step)": times["Shampoo (ours, no grafting, root every step)"],
                "SOAP": times["SOAP (ours, QR every 10)"]}
        for name, t in times.items():
            per = t / BLOCK
            if name.startswith("Shampoo"):
                ref = ours["Shampoo (ours, no grafting, root every step)"]
                floor = floors["Shampoo root every 10" if "every 10" in name else "Shampoo root every step"]
            else:
                ref, floor = ours["SOAP"], floors["SOAP"]
            print(f"| {d} | {name} | {per * 1e3:.3f} | {t / ref:.2f}× | {floor * 1e3:.3f} | {floor / per:.2f} | "
                  f"{peaks[name] / 2 ** 20:.2f} |")
        print(f"<!-- d={d}: mm rate {rate32 / 1e9:.1f} GFLOP/s float32, {rate16 / 1e9:.1f} bfloat16; "
              f"{time.perf_counter() - t0:.1f} s -->")
    print("\n| d | Muon step | ms/step | ratio to direct | NS floor ms (hidden matrices) |")
    print("|---|---|---|---|---|")
    for d in widths:
        fns = _muon_pair(d, device)
        times = interleaved_median_times(fns, device, repeats=repeats * 3, warmup=2, statistic=args.statistic,
                                         clock=args.clock)
        ns = 2 * _floors(d, _mm_rate(d, device, torch.float32), _mm_rate(d, device, torch.bfloat16))[
            "NS (5 steps, bf16)"]
        ref = times["torch.optim.Muon + AdamW (direct)"]
        for name, t in times.items():
            print(f"| {d} | {name} | {t * 1e3:.3f} | {t / ref:.2f}× | {ns * 1e3:.3f} |")


if __name__ == "__main__":
    main()
