"""Benchmark: the cost of curvature — K-FAC / Hessian-free / diagonal-Fisher steps over an SGD step, and the
wall-clock race to a target training loss on a digits deep autoencoder (SGD vs Adam vs K-FAC).

    python benchmarks/bench_curvature.py [--device auto|cpu|cuda] [--quick]

Step times: median over ``repeats`` windows of ``window`` consecutive steps (a window spans whole inverse-update
periods, so K-FAC's eigendecompositions are amortized), ``time.perf_counter`` (CUDA-synchronized on GPU).
Memory: on GPU ``torch.cuda.max_memory_allocated`` per method; on CPU the bytes of K-FAC's extra state
(factors + inverses) relative to the parameters, counted from the tensors (the CPU allocator has no peak counter).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import sync  # noqa: E402

from taskloss.curvature import (  # noqa: E402
    KFAC,  # noqa: E402
    FisherDiagonalPreconditioner,
    HessianFree,
    nll_loss,
)
from taskloss.datasets import digits_images, load_digits_splits  # noqa: E402
from taskloss.models import MLP, SmallCNN  # noqa: E402
from taskloss.utils import resolve_device  # noqa: E402

AE_HIDDEN = (128, 64, 32, 8, 32, 64, 128)  # the K-FAC paper's deep autoencoder shape, scaled to 8×8 digits
TARGET_STEP_RATIO = 1.5


class Trainer:
    """One training method as ``step(x, t)``: sgd | adam | kfac | hf | diag (MC diagonal Fisher)."""

    def __init__(self, net, method, likelihood, lr, seed=0, **kw):
        self.net, self.method, self.lik = net, method, likelihood
        gen = torch.Generator(device=next(net.parameters()).device).manual_seed(seed)
        self.kfac = self.pre = None
        if method == "adam":
            self.opt = torch.optim.Adam(net.parameters(), lr=lr)
        elif method == "hf":
            self.opt = HessianFree(net.parameters(), net, lr=1.0, damping=kw.get("damping", 1.0),
                                   cg_iters=kw.get("cg_iters", 10), likelihood=likelihood)
        else:
            self.opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        if method == "kfac":
            self.kfac = KFAC(net, damping=kw.get("damping", 0.1), fisher_type="mc", likelihood=likelihood,
                             factor_update_interval=kw.get("tcov", 1), inverse_update_interval=kw.get("tinv", 10),
                             damping_mode=kw.get("mode", "pi"), kl_clip=kw.get("kl_clip", 1e-2), lr=lr,
                             generator=gen)
        if method == "diag":
            self.pre = FisherDiagonalPreconditioner(net, "mc", likelihood=likelihood, damping=kw.get("damping", 1.0),
                                                    generator=gen)

    def step(self, x, t):
        if self.method == "hf":
            def closure():
                self.opt.zero_grad()
                loss = nll_loss(self.net(x), t, self.lik)
                loss.backward()
                return loss
            return self.opt.step(closure, x)
        out = self.net(x)
        loss = nll_loss(out, t, self.lik)
        if self.kfac is not None:
            self.kfac.update(out, t)
        self.opt.zero_grad()
        loss.backward()
        if self.kfac is not None:
            self.kfac.step()
        if self.pre is not None:
            self.pre.update(x, t)
            self.pre.step()
        self.opt.step()
        return loss.detach()

    def state_bytes(self):
        if self.kfac is None:
            return 0
        tensors = list(self.kfac.A.values()) + list(self.kfac.G.values())
        tensors += [t for inv in self.kfac._inv.values() for t in inv]
        return sum(t.numel() * t.element_size() for t in tensors)


def _batches(X, T, bs, n, gen):
    idx = torch.randint(0, X.shape[0], (n, bs), generator=gen).to(X.device)
    return [(X[i], T[i]) for i in idx]


def time_steps(makers, X, T, bs, window, repeats, device):
    """Median seconds per step of each trainer over ``repeats`` windows (after one warm-up window each).

    Windows of the different trainers are interleaved so that load drifts on a shared machine hit all alike.
    Returns ``[(seconds, peak_gpu_bytes or None, trainer)]``.
    """
    batches = _batches(X, T, bs, window, torch.Generator().manual_seed(0))
    trainers = [mk() for mk in makers]
    for tr in trainers:  # warm-up (also the first factors / inverses)
        for x, t in batches:
            tr.step(x, t)
    times = [[] for _ in trainers]
    peaks = [0 for _ in trainers]
    for _ in range(repeats):
        for i, tr in enumerate(trainers):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            t0 = time.perf_counter()
            for x, t in batches:
                tr.step(x, t)
            sync(device)
            times[i].append((time.perf_counter() - t0) / window)
            if device.type == "cuda":
                peaks[i] = max(peaks[i], torch.cuda.max_memory_allocated())
    return [(statistics.median(ts), pk if device.type == "cuda" else None, tr)
            for ts, pk, tr in zip(times, peaks, trainers)]


def step_time_table(device, quick):
    d = load_digits_splits(0)
    X, y = d.train[0].to(device), d.train[1].to(device)
    Ximg = digits_images(X)
    window, repeats = 10, (3 if quick else 7)
    rows = []
    for name, make_net, inputs in [("digits MLP 64-128-128-10", lambda: MLP(64, (128, 128), 10, activation="tanh"), X),
                                   ("SmallCNN (width 16)", lambda: SmallCNN(1, 10, width=16), Ximg)]:
        params = sum(p.numel() * p.element_size() for p in make_net().parameters())
        for bs in ((128,) if quick else (128, 512)):
            def trainer(method, **kw):
                def make():
                    torch.manual_seed(0)
                    return Trainer(make_net().to(device), method, "categorical", lr=0.1, **kw)
                return make
            configs = [("K-FAC eigen-damping, T_cov=1, T_inv=10", trainer("kfac", mode="eigen"), TARGET_STEP_RATIO),
                       ("K-FAC π-damping, T_cov=1, T_inv=10", trainer("kfac", mode="pi"), TARGET_STEP_RATIO),
                       ("K-FAC π-damping, T_cov=10, T_inv=10", trainer("kfac", mode="pi", tcov=10), TARGET_STEP_RATIO)]
            if bs == 128:
                configs += [("diagonal MC Fisher (per-example vmap)", trainer("diag"), None),
                            ("Hessian-free (10 CG iters, LM damping)", trainer("hf"), None)]
            timed = time_steps([trainer("sgd")] + [mk for _, mk, _ in configs], inputs, y, bs, window, repeats,
                               device)
            base, base_peak, _ = timed[0]
            for (label, _, target), (t, peak, tr) in zip(configs, timed[1:]):
                mem = (f"{peak / max(base_peak, 1):.2f}× SGD peak" if peak is not None
                       else (f"+{tr.state_bytes() / params:.1f}× param bytes" if tr.kfac is not None else "—"))
                rows.append((name, bs, label, t * 1e3, base * 1e3, t / base, target, mem))
    return rows


def autoencoder_race(device, quick):
    d = load_digits_splits(0)
    X = d.train[0].to(device)
    target = 0.7 if quick else 0.5
    max_seconds = 8.0 if quick else 25.0
    seeds = [0] if quick else [0, 1]
    methods = {"SGD (momentum 0.9, lr 0.03)": ("sgd", 0.03, {}),
               "Adam (lr 3e-3)": ("adam", 3e-3, {}),
               "K-FAC (lr 0.3, λ=0.1, π, KL-clip 0.01, T_cov=5, T_inv=10)": ("kfac", 0.3, dict(tcov=5))}
    bs, eval_every = 128, 10
    results = {}
    for label, (method, lr, kw) in methods.items():
        hits, finals = [], []
        for seed in seeds:
            torch.manual_seed(seed)
            net = MLP(64, AE_HIDDEN, 64, activation="tanh").to(device)
            tr = Trainer(net, method, "gaussian", lr, seed=seed, **kw)
            gen = torch.Generator().manual_seed(seed)
            clock, hit, it, loss = 0.0, None, 0, float("nan")
            while clock < max_seconds and hit is None:
                batches = _batches(X, X, bs, eval_every, gen)
                sync(device)
                t0 = time.perf_counter()
                for x, t in batches:
                    tr.step(x, t)
                sync(device)
                clock += time.perf_counter() - t0  # evaluation below is not on the clock
                it += eval_every
                with torch.no_grad():
                    loss = float(nll_loss(net(X), X, "gaussian"))
                if loss <= target:
                    hit = clock
            hits.append(hit)
            finals.append((loss, it, clock))
        results[label] = (hits, finals)
    return target, max_seconds, results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    torch.set_num_threads(torch.get_num_threads())
    print("## curvature\n")
    print(f"device: {device}; threads: {torch.get_num_threads()}; median of windows of 10 steps "
          "(one window = one inverse-update period)\n")
    print("| model | batch | method | ms/step | SGD ms/step | ratio to SGD | target | memory |")
    print("|---|---|---|---|---|---|---|---|")
    for name, bs, label, t, base, ratio, target, mem in step_time_table(device, args.quick):
        tgt = f"≤ {target}×" if target else "—"
        ok = "" if target is None else (" ✓" if ratio <= target else " ✗")
        print(f"| {name} | {bs} | {label} | {t:.2f} | {base:.2f} | {ratio:.2f}×{ok} | {tgt} | {mem} |")
    target, max_seconds, results = autoencoder_race(device, args.quick)
    print(f"\nDeep autoencoder 64-{'-'.join(map(str, AE_HIDDEN))}-64 (tanh, ½‖x−f‖², batch 128): wall-clock seconds "
          f"of training steps (evaluation excluded) to reach full-train loss ≤ {target}, budget {max_seconds:.0f} s.\n")
    print("| method | seconds to target (per seed) | final loss / steps / seconds | vs Adam | target |")
    print("|---|---|---|---|---|")
    adam = [h for k, (h, _) in results.items() if k.startswith("Adam")][0]
    adam_med = statistics.median([h if h is not None else float("inf") for h in adam])
    for label, (hits, finals) in results.items():
        med = statistics.median([h if h is not None else float("inf") for h in hits])
        secs = ", ".join(f"{h:.1f}" if h is not None else f"> {max_seconds:.0f}" for h in hits)
        fin = "; ".join(f"{L:.3f} / {i} / {c:.1f}" for L, i, c in finals)
        ratio = f"{med / adam_med:.2f}×" if med != float("inf") and adam_med != float("inf") else "—"
        tgt = "< 1× (fewer s than Adam)" if label.startswith("K-FAC") else "—"
        print(f"| {label} | {secs} | {fin} | {ratio} | {tgt} |")


if __name__ == "__main__":
    main()
