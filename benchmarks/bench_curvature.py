"""Benchmark: the cost of curvature — K-FAC against its FLOP floor and against curvlinops (the peer), the
EKFAC-style eigenbasis reuse as an option, diagonal-Fisher / Hessian-free steps over SGD, and the wall-clock race
to a target training loss on a digits deep autoencoder (SGD vs Adam vs K-FAC).

    python benchmarks/bench_curvature.py [--device auto|cpu|cuda] [--quick] [--threads N]
        [--models mlp,cnn] [--batches 128,512] [--step-table-only]

(``--models``, ``--batches``, ``--step-table-only``: a subset of the step-time table — the K-FAC rows at the chosen
shapes without the diagonal-Fisher / Hessian-free rows, the eigenbasis-quality table and the autoencoder race.)

Clock: on CPU with one thread, CPU time of the process (``time.process_time``: on a shared machine the time
other processes take the core is not counted); otherwise wall-clock ``time.perf_counter`` (CUDA-synchronized).
On CPU denormals are flushed to zero for every method (``torch.set_flush_denormal``): once a batch is fit, tiny
gradients otherwise make all arithmetic of the faster-converging methods many times slower.
Step times: median over ``repeats`` windows of 50 consecutive steps (a window spans whole factor, inverse and
eigenbasis periods, so their costs are amortized exactly); the trainers' windows are interleaved.

Floor. Each unavoidable kernel is timed alone at its shape on this machine (median): per layer with ``R`` rows
(examples × locations), input width ``D`` (+1 for the bias column of ``A``) and ``O`` outputs —
forward ``[R,D]·[D,O]``; backward ``[O,R]·[R,D]`` (weight) and ``[R,O]·[O,D]`` (input, not for the first layer);
every ``T_cov`` steps the MC backward (input products again) and the factor products ``[D,R]·[R,D]``,
``[O,R]·[R,O]`` — for a convolution also the patch matrix ``[R,D]`` that the ``A`` product needs, counted as a
contiguous copy of ``R·D`` numbers (no GEMM-based ``A`` avoids writing the patches once; any im2col is at least this
copy: 0.4 ms of the 3 ms ``A`` product for the CNN's second layer at batch 128 here); every ``T_inv`` steps ``eigh`` of both factors (eigen damping) or Cholesky + inverse (π damping) —
or, between eigendecompositions with eigenbasis reuse, ``F·Q`` per factor; every step the preconditioning products
(4 for eigen, 2 for π). Convolutions count as their im2col GEMMs. Two fractions, both ``floor time / measured
time`` (1 = at the floor):

* strict: the floor is the sum of all the kernels above (SGD's own floor for the SGD row) — everything outside
  these GEMMs and factorizations (activations, pooling, the loss, the optimizer update, Python) counts as waste;
* SGD-anchored: the floor is the measured SGD step plus K-FAC's extra kernels — the fraction of K-FAC's
  *additional* time that its additional FLOPs explain. The K-FAC target (≥ 80% at ``T_cov = T_inv = 10``) applies to
  this one: the strict fraction of K-FAC cannot exceed SGD's own strict fraction by much, which the framework
  overhead of a small network caps well below 80% (the table prints it);
* in loop (information, no target): the measured time of a trainer that runs the SGD step plus exactly these extra
  kernels on random operands of the same shapes, where K-FAC runs its own (``FloorKernels``), over K-FAC's time.
  The isolated kernels above are timed hot in cache; inside a training step they compete with the network's own
  data for the caches (and slow the SGD kernels around them), which no implementation of these kernels avoids. On
  a small network this gap alone can keep the anchored fraction below 80 %: the in-loop column shows how much of
  K-FAC's time the unavoidable kernels take when they run where K-FAC runs them.

Peer: curvlinops' ``KFACLinearOperator`` (MC Fisher, one sample) rebuilt every ``T_cov`` steps on the current batch
and ``KFACInverseLinearOperator`` (``use_heuristic_damping`` = π, ``use_exact_damping`` = eigen) every ``T_inv``,
applied to the gradients every step with the same KL clipping. Memory: on GPU ``torch.cuda.max_memory_allocated``;
on CPU the bytes of K-FAC's extra state (factors + inverses) relative to the parameters.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import sync  # noqa: E402

from taskloss.curvature import KFAC, FisherDiagonalPreconditioner, HessianFree, nll_loss  # noqa: E402
from taskloss.datasets import digits_images, load_digits_splits  # noqa: E402
from taskloss.models import MLP, SmallCNN  # noqa: E402
from taskloss.utils import resolve_device

AE_HIDDEN = (128, 64, 32, 8, 32, 64, 128)  # the K-FAC paper's deep autoencoder shape, scaled to 8×8 digits
WINDOW = 50                                # steps per timed window: a multiple of every interval below
FLOOR_TARGET = 0.8
CLOCK = {"fn": time.perf_counter}


class Trainer:
    """One training method as ``step(x, t)``: sgd | adam | kfac | curvlinops | hf | diag (MC diagonal Fisher)."""

    def __init__(self, net, method, likelihood, lr, seed=0, **kw):
        self.net, self.method, self.lik, self.lr, self.kw, self.i = net, method, likelihood, lr, kw, 0
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
                             eigenbasis_update_interval=kw.get("teig"), damping_mode=kw.get("mode", "pi"),
                             kl_clip=kw.get("kl_clip", 1e-2), optimizer=self.opt, generator=gen)
        if method == "diag":
            self.pre = FisherDiagonalPreconditioner(net, "mc", likelihood=likelihood, damping=kw.get("damping", 1.0),
                                                    generator=gen)

    def step(self, x, t):
        if self.method == "floor":
            return self._floor_step(x, t)
        if self.method == "hf":
            def closure():
                self.opt.zero_grad()
                loss = nll_loss(self.net(x), t, self.lik)
                loss.backward()
                return loss, x
            return self.opt.step(closure)
        out = self.net(x)
        loss = nll_loss(out, t, self.lik)
        if self.kfac is not None:
            self.kfac.update_statistics(x, t, outputs=out)
        self.opt.zero_grad()
        loss.backward()
        if self.kfac is not None:
            self.kfac.precondition_()
        if self.pre is not None:
            self.pre.update_statistics(x, t)
            self.pre.precondition_()
        if self.method == "curvlinops":
            self._curvlinops_precondition(x, t)
        self.opt.step()
        self.i += 1
        return loss.detach()

    def _floor_step(self, x, t):
        """The SGD step plus exactly the floor's extra kernels (``FloorKernels``) where K-FAC runs its own: factor
        kernels after the forward every ``T_cov`` steps, inverses every ``T_inv`` and preconditioning every step
        after the backward."""
        kern = self.kw["kernels"]
        out = self.net(x)
        loss = nll_loss(out, t, self.lik)
        if self.i % self.kw["tcov"] == 0:
            kern.factors()
        self.opt.zero_grad()
        loss.backward()
        if self.i % self.kw["tinv"] == 0:
            kern.inverses()
        kern.precondition()
        self.opt.step()
        self.i += 1
        return loss.detach()

    def _curvlinops_precondition(self, x, t):
        import curvlinops
        kw, params = self.kw, [p for p in self.net.parameters()]
        if self.i % kw.get("tcov", 1) == 0:
            loss_fn = nn.CrossEntropyLoss() if self.lik == "categorical" else nn.MSELoss(reduction="sum")
            self.op = curvlinops.KFACLinearOperator(
                self.net, loss_fn, params, [(x, t)], fisher_type="mc", check_deterministic=False, num_data=len(x),
                num_per_example_loss_terms=1, separate_weight_and_bias=False, seed=self.i)
            self.op.compute_kronecker_factors()
        if self.i % kw.get("tinv", 10) == 0:
            mode = kw.get("mode", "pi")
            self.inv = curvlinops.KFACInverseLinearOperator(self.op, damping=kw.get("damping", 0.1),
                                                            use_heuristic_damping=mode == "pi",
                                                            use_exact_damping=mode == "eigen")
        grads = [p.grad for p in params]
        new = self.inv @ grads
        vg = float(sum((n * g).sum() for n, g in zip(new, grads))) * self.lr**2
        nu = min(1.0, math.sqrt(kw.get("kl_clip", 1e-2) / vg)) if vg > 0 else 1.0
        for p, n in zip(params, new):
            p.grad.copy_(n.mul_(nu))

    def state_bytes(self):
        if self.kfac is None:
            return 0
        tensors = list(self.kfac.factors.A.values()) + list(self.kfac.factors.G.values())
        tensors += [t for inv in self.kfac.factors.inverses.values() for t in inv]
        return sum(t.numel() * t.element_size() for t in tensors)


def _batches(X, T, bs, n, gen):
    idx = torch.randint(0, X.shape[0], (n, bs), generator=gen).to(X.device)
    return [(X[i], T[i]) for i in idx]


def time_steps(makers, X, T, bs, repeats, device):
    """Median seconds per step of each trainer over ``repeats`` interleaved windows of ``WINDOW`` steps (after one
    warm-up window each). Returns ``[(seconds, peak_gpu_bytes or None, trainer)]``."""
    batches = _batches(X, T, bs, WINDOW, torch.Generator().manual_seed(0))
    trainers = [mk() for mk in makers]
    for tr in trainers:  # warm-up (also the first factors / inverses)
        for x, t in batches:
            tr.step(x, t)
    times, peaks = [[] for _ in trainers], [0 for _ in trainers]
    for _ in range(repeats):
        for i, tr in enumerate(trainers):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            t0 = CLOCK["fn"]()
            for x, t in batches:
                tr.step(x, t)
            sync(device)
            times[i].append((CLOCK["fn"]() - t0) / WINDOW)
            if device.type == "cuda":
                peaks[i] = max(peaks[i], torch.cuda.max_memory_allocated())
    return [(statistics.median(ts), pk if device.type == "cuda" else None, tr)
            for ts, pk, tr in zip(times, peaks, trainers)]


# ------------------------------------------------------------------------------------------------- floor
def _kernel_seconds(fn, device, budget=2e-3, repeats=7):
    """Median seconds of ``fn()`` alone (batched into calls of ≥ ``budget`` seconds)."""
    fn()
    sync(device)
    t0 = CLOCK["fn"]()
    fn()
    sync(device)
    inner = max(1, int(budget / max(CLOCK["fn"]() - t0, 1e-7)))
    out = []
    for _ in range(repeats):
        sync(device)
        t0 = CLOCK["fn"]()
        for _ in range(inner):
            fn()
        sync(device)
        out.append((CLOCK["fn"]() - t0) / inner)
    return statistics.median(out)


class Floor:
    """Per-shape kernel times of one model and batch (see the module docstring)."""

    def __init__(self, make_net, x, device):
        self.device, self.cache, self.layers = device, {}, []
        net = make_net().to(device)
        hooks = [m.register_forward_hook(self._shape_hook) for m in net.modules() if isinstance(m, (nn.Linear,
                                                                                                    nn.Conv2d))]
        with torch.no_grad():
            net(x)
        for h in hooks:
            h.remove()

    def _shape_hook(self, mod, inputs, output):
        if isinstance(mod, nn.Conv2d):
            rows = output.shape[0] * output.shape[2] * output.shape[3]
            d = mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1]
            out = mod.out_channels
        else:
            rows, d, out = inputs[0].numel() // mod.in_features, mod.in_features, mod.out_features
        self.layers.append((rows, d, out, mod.bias is not None, isinstance(mod, nn.Conv2d)))

    def _t(self, key, make):
        if key not in self.cache:
            args = make()
            op = {"mm": torch.mm, "eigh": torch.linalg.eigh, "copy": torch.Tensor.copy_,
                  "chol": lambda m: torch.cholesky_inverse(torch.linalg.cholesky(m))}[key[0]]
            self.cache[key] = _kernel_seconds(lambda: op(*args), self.device)
        return self.cache[key]

    def mm(self, a, b, c):
        return self._t(("mm", a, b, c), lambda: (torch.randn(a, b, device=self.device),
                                                  torch.randn(b, c, device=self.device)))

    def copy(self, r, d):
        return self._t(("copy", r, d), lambda: (torch.empty(r, d, device=self.device),
                                                 torch.randn(r, d, device=self.device)))

    def spd(self, kind, n):
        def make():
            m = torch.randn(n, 2 * n, device=self.device)
            return (m @ m.T / n + torch.eye(n, device=self.device),)
        return self._t((kind, n), make)

    def sgd(self):
        return sum(self.mm(r, d, o) + self.mm(o, r, d) + (self.mm(r, o, d) if i else 0.0)
                   for i, (r, d, o, _, _) in enumerate(self.layers))

    def kfac_extra(self, mode, tcov, tinv, teig=None):
        """(per-step preconditioning, amortized factor work, amortized inverse work) in seconds."""
        pre = fac = inv = 0.0
        teig = teig or tinv
        for i, (r, d, o, bias, conv) in enumerate(self.layers):
            db = d + bias
            pre += (2 * self.mm(o, o, db) + 2 * self.mm(o, db, db)) if mode == "eigen" else (
                self.mm(o, o, db) + self.mm(o, db, db))
            fac += (self.mm(db, r, db) + self.mm(o, r, o) + (self.mm(r, o, d) if i else 0.0)
                    + (self.copy(r, db) if conv else 0.0)) / tcov
            if mode == "pi":
                inv += (self.spd("chol", db) + self.spd("chol", o)) / tinv
            else:
                eig = self.spd("eigh", db) + self.spd("eigh", o)
                rescale = self.mm(db, db, db) + self.mm(o, o, o)
                inv += eig / teig + rescale * (1 / tinv - 1 / teig)
        return pre, fac, inv


class FloorKernels:
    """The kernels of ``Floor.kfac_extra`` on random operands of the same shapes, to be run inside a training loop
    (``method="floor"`` of ``Trainer``): the in-loop floor. Same ops as the isolated floor (``torch.mm`` with a new
    output, ``eigh``, Cholesky + ``cholesky_inverse``, the conv patch copy); nothing else of K-FAC (no hooks, no
    sampling, no autograd pass, no copies, no KL clip, no Python bookkeeping)."""

    def __init__(self, layers, mode, device):
        g = torch.Generator(device=device).manual_seed(0)

        def rnd(*shape):
            return torch.randn(*shape, generator=g, device=device)

        def spd(n):
            m = rnd(n, 2 * n)
            return m @ m.T / n + torch.eye(n, device=device)
        self.mode, self.layers = mode, []
        for i, (r, d, o, bias, conv) in enumerate(layers):
            db = d + bias
            self.layers.append(dict(i=i, conv=conv, m=rnd(o, db), ia=spd(db), ig=spd(o), rows=rnd(r, db),
                                    gout=rnd(r, o), w=rnd(o, d), patches=torch.empty(r, db, device=device),
                                    src=rnd(r, db), fa=spd(db), fg=spd(o)))

    def precondition(self):
        for L in self.layers:
            if self.mode == "eigen":  # 2 · [O,O]·[O,D] + 2 · [O,D]·[D,D], as Floor.kfac_extra counts them
                torch.mm(L["ig"], torch.mm(torch.mm(L["ig"], L["m"]), L["ia"]))
                torch.mm(L["m"], L["ia"])
            else:
                torch.mm(torch.mm(L["ig"], L["m"]), L["ia"])

    def factors(self):
        for L in self.layers:
            if L["conv"]:
                L["patches"].copy_(L["src"])
            torch.mm(L["rows"].T, L["rows"])
            torch.mm(L["gout"].T, L["gout"])
            if L["i"]:
                torch.mm(L["gout"], L["w"])

    def inverses(self):
        for L in self.layers:
            for f in (L["fa"], L["fg"]):
                if self.mode == "eigen":
                    torch.linalg.eigh(f)
                else:
                    torch.cholesky_inverse(torch.linalg.cholesky(f))


# ---------------------------------------------------------------------------------------------- tables
KFAC_CONFIGS = [  # label, kwargs; the T = 10 rows carry the targets
    ("π-damping, T_cov=T_inv=10", dict(mode="pi", tcov=10, tinv=10), True),
    ("eigen-damping, T_cov=T_inv=10", dict(mode="eigen", tcov=10, tinv=10), True),
    ("eigen, T_cov=T_inv=10, eigenbasis every 50 (EKFAC-style rescaling)", dict(mode="eigen", tcov=10, tinv=10,
                                                                                   teig=50), False),
    ("π-damping, T_cov=1, T_inv=10", dict(mode="pi", tcov=1, tinv=10), False),
]


def step_time_table(device, quick, models=("mlp", "cnn"), batches=None, extras=True):
    d = load_digits_splits(0)
    X, y = d.train[0].to(device), d.train[1].to(device)
    Ximg = digits_images(X)
    repeats = 3 if quick else 7
    rows, notes = [], []
    nets = {"mlp": ("digits MLP 64-128-128-10", lambda: MLP(64, (128, 128), 10, activation="tanh"), X),
            "cnn": ("SmallCNN (width 16)", lambda: SmallCNN(1, 10, width=16), Ximg)}
    for name, make_net, inputs in [nets[m] for m in models]:
        params = sum(p.numel() * p.element_size() for p in make_net().parameters())
        for bs in batches or ((128,) if quick else (128, 512)):
            floor = Floor(make_net, inputs[:bs], device)

            def trainer(method, **kw):
                def make():
                    torch.manual_seed(0)
                    return Trainer(make_net().to(device), method, "categorical", lr=0.1, **kw)
                return make
            makers = [trainer("sgd")]
            for _, kw, targeted in KFAC_CONFIGS:
                makers += [trainer("kfac", **kw), trainer("curvlinops", **kw) if "teig" not in kw else None,
                           trainer("floor", kernels=FloorKernels(floor.layers, kw["mode"], device), **kw)
                           if targeted else None]
            extra = [("diagonal MC Fisher (per-example vmap)", trainer("diag")),
                     ("Hessian-free (10 CG iters, LM damping)", trainer("hf"))] if bs == 128 and extras else []
            timed = time_steps([m for m in makers if m is not None] + [m for _, m in extra], inputs, y, bs, repeats,
                               device)
            sgd_t, sgd_peak, _ = timed[0]
            sgd_floor = floor.sgd()
            rows.append((name, bs, "SGD (momentum 0.9)", sgd_t, 1.0, sgd_floor / sgd_t, None, None, None, None,
                         "—"))
            it = iter(timed[1:])
            for label, kw, targeted in KFAC_CONFIGS:
                t, peak, tr = next(it)
                peer = next(it)[0] if "teig" not in kw else None
                in_loop = next(it)[0] if targeted else None
                pre, fac, inv = floor.kfac_extra(kw["mode"], kw["tcov"], kw["tinv"], kw.get("teig"))
                strict = (sgd_floor + pre + fac + inv) / t
                anchored = (sgd_t + pre + fac + inv) / t
                mem = (f"{peak / max(sgd_peak, 1):.2f}× SGD peak" if peak is not None
                       else f"+{tr.state_bytes() / params:.1f}× param bytes")
                rows.append((name, bs, "K-FAC " + label, t, t / sgd_t, strict, anchored,
                             None if in_loop is None else in_loop / t, peer, targeted, mem))
                if targeted and bs == 128:
                    notes.append(f"{name}, batch {bs}, {kw['mode']}: floor = SGD {sgd_t * 1e3:.2f} ms measured "
                                 f"(its GEMMs alone {sgd_floor * 1e3:.2f} ms) + preconditioning {pre * 1e3:.3f} + "
                                 f"factors {fac * 1e3:.3f} + inverses {inv * 1e3:.3f} ms per step; in the loop "
                                 f"SGD + these kernels take {in_loop * 1e3:.2f} ms")
            for label, _ in extra:
                t = next(it)[0]
                rows.append((name, bs, label, t, t / sgd_t, None, None, None, None, None, "—"))
    return rows, notes


def ekfac_quality(device, quick):
    """Final full-train loss after ``steps`` K-FAC steps on the digits MLP: eigh at every refresh vs eigenbasis
    reuse (same seeds, data and budget)."""
    d = load_digits_splits(0)
    X, y = d.train[0].to(device), d.train[1].to(device)
    steps, seeds = (60, [0, 1]) if quick else (120, [0, 1, 2, 3])  # before the training loss reaches ~1e-4
    out = {}
    for label, teig in (("eigh every refresh (T_inv=10)", None), ("eigenbasis every 50, rescaled between", 50)):
        finals = []
        for seed in seeds:
            torch.manual_seed(seed)
            tr = Trainer(MLP(64, (128, 128), 10, activation="tanh").to(device), "kfac", "categorical", lr=0.1,
                         seed=seed, mode="eigen", tcov=10, tinv=10, teig=teig)
            for x, t in _batches(X, y, 128, steps, torch.Generator().manual_seed(100 + seed)):
                tr.step(x, t)
            with torch.no_grad():
                finals.append(float(nll_loss(tr.net(X), y)))
        out[label] = finals
    return steps, out


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
            tr = Trainer(MLP(64, AE_HIDDEN, 64, activation="tanh").to(device), method, "gaussian", lr, seed=seed, **kw)
            gen = torch.Generator().manual_seed(seed)
            clock, hit, it, loss = 0.0, None, 0, float("nan")
            while clock < max_seconds and hit is None:
                batches = _batches(X, X, bs, eval_every, gen)
                sync(device)
                t0 = CLOCK["fn"]()
                for x, t in batches:
                    tr.step(x, t)
                sync(device)
                clock += CLOCK["fn"]() - t0  # evaluation below is not on the clock
                it += eval_every
                with torch.no_grad():
                    loss = float(nll_loss(tr.net(X), X, "gaussian"))
                if loss <= target:
                    hit = clock
            hits.append(hit)
            finals.append((loss, it, clock))
        results[label] = (hits, finals)
    return target, max_seconds, results


def _mark(ok):
    return " ✓" if ok else " ✗"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,cnn", help="comma-separated subset of mlp,cnn")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 128,512; --quick 128)")
    ap.add_argument("--step-table-only", action="store_true", help="only the step-time table, no extra rows")
    args = ap.parse_args(argv)
    models = tuple(args.models.split(","))
    if not set(models) <= {"mlp", "cnn"}:
        ap.error(f"--models must be a subset of mlp,cnn, got {args.models!r}")
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else None
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    if device.type == "cpu":  # denormal gradients (a well-fit batch) slow every method's CPU arithmetic alike
        torch.set_flush_denormal(True)
    cpu_clock = device.type == "cpu" and args.threads == 1
    CLOCK["fn"] = time.process_time if cpu_clock else time.perf_counter
    print("## curvature\n")
    print(f"device: {device}; threads: {torch.get_num_threads()}; clock: {'CPU time' if cpu_clock else 'wall'}; "
          f"median of windows of {WINDOW} steps; peer: curvlinops KFACLinearOperator + KFACInverseLinearOperator. "
          "Floor fractions = floor time / measured time (strict: GEMM/factorization kernels only; anchored: "
          f"measured SGD + K-FAC's extra kernels). Targets: anchored ≥ {FLOOR_TARGET:.0%} and time ≤ curvlinops' at "
          "T_cov = T_inv = 10.\n")
    print("| model | batch | method | ms/step | ratio to SGD | floor fraction strict | floor fraction anchored "
          "| floor fraction in loop | curvlinops ms/step | ours / curvlinops | memory |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows, notes = step_time_table(device, args.quick, models, batches, not args.step_table_only)
    for name, bs, label, t, ratio, strict, anchored, in_loop, peer, targeted, mem in rows:
        st = f"{strict:.0%}" if strict is not None else "—"
        an = "—" if anchored is None else f"{anchored:.0%}" + (_mark(anchored >= FLOOR_TARGET) if targeted else "")
        il = "—" if in_loop is None else f"{in_loop:.0%}"
        pr = "—" if peer is None else f"{peer * 1e3:.2f}"
        vs = "—" if peer is None else f"{t / peer:.2f}×" + (_mark(t <= peer) if targeted else "")
        print(f"| {name} | {bs} | {label} | {t * 1e3:.2f} | {ratio:.2f}× | {st} | {an} | {il} | {pr} | {vs} "
              f"| {mem} |")
    print("\nFloor per step (batch 128): " + "; ".join(notes) + ".")
    if args.step_table_only:
        return
    steps, quality = ekfac_quality(device, args.quick)
    print(f"\nEigenbasis reuse, quality: digits MLP, eigen damping, T_cov=T_inv=10, full-train loss after {steps} "
          "steps (per seed, same data stream):\n")
    print("| K-FAC eigenbasis | final loss per seed | mean |")
    print("|---|---|---|")
    for label, finals in quality.items():
        print(f"| {label} | {', '.join(f'{v:.4g}' for v in finals)} | {statistics.mean(finals):.4g} |")
    target, max_seconds, results = autoencoder_race(device, args.quick)
    print(f"\nDeep autoencoder 64-{'-'.join(map(str, AE_HIDDEN))}-64 (tanh, ½‖x−f‖², batch 128): seconds of training "
          f"steps (evaluation excluded) to reach full-train loss ≤ {target}, budget {max_seconds:.0f} s.\n")
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
