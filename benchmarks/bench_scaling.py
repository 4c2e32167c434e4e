"""Benchmark: how a step's time and peak memory grow with the work — MGS with parameters P and candidates K, K-FAC
with layer width and batch, EMO with vocabulary V and tokens N, integrated gradients with steps m and context
length T, exact contrastive accumulation with batch B at a fixed micro-batch, MeZO with P — beside the peers of
the fixed-size benchmarks and the slope the algorithm implies.

For every family and axis: 5 sizes spanning 16× or more, every method timed at every size in each of ``repeats``
rounds (methods interleaved within a size, sizes within a round; each cell is the median of ``inner`` calls after
one untimed warm-up call). Per round the log-log slope of time against size is fitted by least squares; the table
gives the median slope over rounds and its range [min–max]. *Implied* is the slope of the algorithm's own FLOP
count at the same sizes (the formulas are in ``implied_flops`` below; e.g. MGS ∝ (3 + K)·B·P, EMO ∝ N·V·d,
integrated gradients ∝ m·(cost of one pass)). A measured slope below the implied one means fixed per-call costs
still matter at the small sizes; one above it is a finding (the table's last column says what explains it).

Peak memory above what is live before the call: ``benchmarks/_timing.peak_bytes`` of the *first* call of a freshly
built method (so state the method allocates on its first step — MGS's K×P candidate rows, K-FAC's factors, Adam's
moments — counts): on CPU the allocator trace of ``torch.profiler`` (bytes handed out by torch's CPU allocator, not
RSS); on CUDA ``torch.cuda.max_memory_allocated``.

Peers, built as in the fixed-size benchmarks: curvlinops ``KFACLinearOperator`` + ``KFACInverseLinearOperator``
(``bench_curvature.Trainer``), Captum ``LayerIntegratedGradients``, the official EMO patch formula and the authors'
``emoloss`` package (``bench_emo``), sentence-transformers ``CachedMultipleNegativesRankingLoss`` — GradCache's
method (``bench_contrastive``). MGS and MeZO have no peer library: the MLE/Adam step and an inference forward of
the same model are shown beside them.

CPU default: one torch thread and the thread's CPU time (``--clock cpu``): on a shared machine the time the thread
is descheduled is not counted. Figures: ``benchmarks/scaling_time.png`` and ``benchmarks/scaling_memory.png``.

    python benchmarks/bench_scaling.py [--device auto|cpu|cuda] [--quick] [--repeats N] [--only mgs,emo,...]
                                       [--threads N] [--clock cpu|wall] [--no-figure]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _timing import peak_bytes, quiet_stderr, sync  # noqa: E402

from taskloss.utils import resolve_device

SLOPE_SLACK = 0.1       # ours is marked ✓ when its median slope is at most the implied one + this
FAMILIES = ("mgs", "kfac", "emo", "ig", "contrastive", "mezo")


@dataclass
class Axis:
    """One family along one axis: ``build(size)`` → {method: (fn, role)} with fresh objects; ``flops(size)`` the
    algorithm's FLOP count (its log-log slope is the implied one)."""
    family: str
    axis: str
    fixed: str
    sizes: list
    build: Callable[[int], dict]
    flops: Callable[[int], float]
    inner: int = 3
    note: str = ""
    times: dict = field(default_factory=dict)     # method → [round][size] seconds
    mem: dict = field(default_factory=dict)       # method → [size] bytes
    roles: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- families
def _digits(n, device):
    from taskloss.datasets import load_digits_splits

    (X, y), _, _ = load_digits_splits(0)
    return X[:n].to(device), y[:n].to(device)


def _mlp_macs(dims):
    return sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def mgs_axes(device, quick):
    from bench_mgs import surrogate, zero_one

    from taskloss.models import MLP
    from taskloss.search import MGS

    B = 256
    batch = _digits(B, device)

    def build(hidden, K):
        def make():
            torch.manual_seed(0)
            model = MLP(64, hidden, 10).to(device)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
        m1, o1 = make()
        mgs = MGS(m1, o1, surrogate, zero_one, K=K, seed=0, vmap_task_loss=True)
        m2, o2 = make()

        def mle():
            o2.zero_grad(set_to_none=True)
            surrogate(m2, batch).backward()
            o2.step()

        m3 = make()[0].eval()

        @torch.no_grad()
        def k_forwards():
            for _ in range(K):
                zero_one(m3(batch[0]), batch)
        return {"MGS step (ours)": (lambda: mgs.step(batch), "ours"), "MLE step (AdamW)": (mle, "reference"),
                "K forwards": (k_forwards, "reference")}

    def flops(hidden, K):      # MLE step (3 passes) + K forwards, and ~4 operations per candidate entry (draw,
        macs = _mlp_macs((64, *hidden, 10))    # shift, add to θ, weighted sum) on K·P numbers
        return 2 * B * macs * (3 + K) + 4 * K * _mlp_params(hidden[0])
    widths = [128, 256, 512, 1024, 2048] if not quick else [128, 512, 2048]
    ks = [2, 4, 8, 16, 32] if not quick else [2, 8, 32]
    return [
        Axis("MGS", "parameters P (MLP 64-h-h-10)", f"K = 8, batch {B}", [_mlp_params(h) for h in widths],
             lambda P: build((_width_of(P),) * 2, 8), lambda P: flops((_width_of(P),) * 2, 8)),
        Axis("MGS", "candidates K", f"P = {_mlp_params(512)} (h = 512), batch {B}", ks,
             lambda K: build((512, 512), K), lambda K: flops((512, 512), K)),
    ]


def _mlp_params(h):
    return 64 * h + h + h * h + h + 10 * h + 10


def _width_of(P):
    return next(h for h in range(1, 8192) if _mlp_params(h) == P)


def kfac_axes(device, quick):
    from bench_curvature import Trainer

    from taskloss.models import MLP

    X, y = _digits(1024, device)

    def build(width, B):
        x, t = X[:B], y[:B]

        def trainer(method):
            torch.manual_seed(0)
            tr = Trainer(MLP(64, (width, width), 10, activation="tanh").to(device), method, "categorical", lr=0.1,
                         tcov=1, tinv=1, mode="pi")
            return lambda: tr.step(x, t)
        return {"K-FAC step (ours)": (trainer("kfac"), "ours"), "curvlinops K-FAC": (trainer("curvlinops"), "peer"),
                "SGD step": (trainer("sgd"), "reference")}

    def flops(width, B):
        dims = (64 + 1, width + 1, width + 1, 10)         # +1: the bias column of A
        layers = list(zip(dims[:-1], dims[1:]))
        passes = 2 * B * _mlp_macs(dims) * (3 + 2)        # forward, backward, MC backward (2 products)
        factors = sum(2 * B * (a * a + b * b) for a, b in layers)
        inverses = sum(2 * (a ** 3 + b ** 3) for a, b in layers)   # Cholesky + triangular inverse, both factors
        precond = sum(2 * (a * a * b + a * b * b) for a, b in layers)
        return passes + factors + inverses + precond
    widths = [128, 256, 512, 1024, 2048] if not quick else [128, 512, 2048]
    batches = [64, 128, 256, 512, 1024] if not quick else [64, 256, 1024]
    return [
        Axis("K-FAC", "layer width w (MLP 64-w-w-10)", "batch 256, π-damping, factors and inverses every step",
             widths, lambda w: build(w, 256), lambda w: flops(w, 256), inner=3),
        Axis("K-FAC", "batch B", "w = 256, π-damping, factors and inverses every step", batches,
             lambda b: build(256, b), lambda b: flops(256, b), inner=3),
    ]


def emo_axes(device, quick):
    from bench_emo import _emoloss, official_patch_emo1

    from taskloss.losses import EMOLoss

    d = 128
    official = _emoloss()

    def build(N, V):
        gen = torch.Generator().manual_seed(0)
        xf = (torch.randn(1, N + 1, V, generator=gen) * 2).to(device).requires_grad_()
        x = xf.detach()[0, :-1].clone().requires_grad_()
        t = torch.randint(0, V, (N,), generator=gen).to(device)
        tf = torch.cat([torch.zeros(1, dtype=torch.long, device=device), t])[None]
        emb = torch.randn(V, d, generator=gen).to(device)
        ours = EMOLoss(emb, combine="emo_mle_ratio", ratio_max=3.0).to(device)

        def step(fn, leaf):
            def run():
                leaf.grad = None
                fn().backward()
                leaf.grad = None
            return run
        out = {"EMO loss (ours)": (step(lambda: ours(x, t), x), "ours"),
               "official patch formula": (step(lambda: official_patch_emo1(x, t, emb), x), "peer")}
        if official is not None:
            out["emoloss mode=1"] = (step(lambda: official(xf, tf, emb, mode=1), xf), "peer")
        return out

    flops = lambda N, V: 4 * N * V * d + 20 * N * V          # noqa: E731  two N·V·d products each way + softmax
    vs = [2048, 4096, 8192, 16384, 32768] if not quick else [2048, 8192, 32768]
    ns = [64, 128, 256, 512, 1024] if not quick else [64, 256, 1024]
    return [
        Axis("EMO", "vocabulary V", f"N = 256 tokens, d = {d}", vs, lambda V: build(256, V),
             lambda V: flops(256, V)),
        Axis("EMO", "tokens N", f"V = 8192, d = {d}", ns, lambda N: build(N, 8192), lambda N: flops(N, 8192)),
    ]


def tiny_gpt2(device, n_positions=512, seed=0):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=1024, n_positions=n_positions, n_embd=64, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).to(device).eval()


def ig_axes(device, quick):
    from captum.attr import LayerIntegratedGradients

    from taskloss.attribution import EmbeddingIntegratedGradients

    model = tiny_gpt2(device)
    fwd = lambda i: model(i, logits_to_keep=1).logits[:, -1].log_softmax(-1)   # noqa: E731
    chunk = 4

    def build(m, T):
        ids = torch.randint(1, 1024, (1, T), generator=torch.Generator().manual_seed(1)).to(device)
        base, target = torch.zeros_like(ids), torch.tensor([5], device=device)
        eig = EmbeddingIntegratedGradients(fwd, model.transformer.wte)
        lig = LayerIntegratedGradients(fwd, model.transformer.wte)
        ours = lambda ibs: (lambda: eig.attribute(ids, baselines=base, target=target, n_steps=m,  # noqa: E731
                                                  internal_batch_size=ibs))
        captum = lambda ibs: (lambda: lig.attribute(ids, baselines=base, target=target, n_steps=m,  # noqa: E731
                                                    internal_batch_size=ibs, return_convergence_delta=True))
        with torch.no_grad():
            emb = model.transformer.wte(ids.repeat(m, 1))

        def one_pass():      # forward + backward of the m path points: the work every implementation repeats
            z = emb.clone().requires_grad_()
            out = model(inputs_embeds=z, logits_to_keep=1).logits[:, -1].log_softmax(-1)[:, 5].sum()
            torch.autograd.grad(out, z)
        return {"IG (ours, all points at once)": (ours(None), "ours"),
                "Captum LayerIG (default)": (captum(None), "peer"),
                f"IG (ours, chunk {chunk})": (ours(chunk), "ours"),
                f"Captum LayerIG (internal_batch_size {chunk})": (captum(chunk), "peer"),
                "one fwd+bwd of the m points": (one_pass, "reference")}

    d, L, V = 64, 2, 1024
    flops = lambda m, T: 3 * m * L * (24 * T * d * d + 4 * T * T * d) + 3 * m * 2 * d * V   # noqa: E731
    ms = [4, 8, 16, 32, 64] if not quick else [4, 16, 64]
    ts = [32, 64, 128, 256, 512] if not quick else [32, 128, 512]
    return [
        Axis("integrated gradients", "steps m", "tiny GPT-2 (2 layers, d = 64, V = 1024), T = 128, one sequence",
             ms, lambda m: build(m, 128), lambda m: flops(m, 128)),
        Axis("integrated gradients", "context length T", "tiny GPT-2 (2 layers, d = 64, V = 1024), m = 16, one "
             "sequence", ts, lambda T: build(16, T), lambda T: flops(16, T)),
    ]


def contrastive_axes(device, quick, tmp):
    import functools

    import torch.nn.functional as F
    from bench_contrastive import TAU, build_st_model, make_features
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    from taskloss.contrastive import accumulated_backward, info_nce

    T, micro = 16, 8
    model = build_st_model("small", T, device, tmp)
    feats_all = make_features(model, 128, T)
    loss_fn = functools.partial(info_nce, temperature=TAU)
    encoder = lambda f: F.normalize(model(dict(f))["sentence_embedding"], dim=-1)     # noqa: E731

    def build(B):
        feats = [{k: v[:B] if isinstance(v, torch.Tensor) else v for k, v in f.items()} for f in feats_all]
        st = CachedMultipleNegativesRankingLoss(model, scale=1 / TAU, mini_batch_size=micro)

        def wrap(fn):
            def run():
                model.zero_grad(set_to_none=False)
                fn()
            return run
        return {"exact accumulation (ours)": (wrap(lambda: accumulated_backward(encoder, feats, loss_fn, micro)),
                                              "ours"),
                "sentence-transformers cached MNRL": (wrap(lambda: st([dict(f) for f in feats], None).backward()),
                                                      "peer"),
                "full batch, one graph": (wrap(lambda: loss_fn(*[encoder(f) for f in feats]).backward()),
                                          "reference")}

    flops = lambda B: 4 * 2 * B * T * 3.2e6 * 2 + 2 * B * B * 256                       # noqa: E731
    bs = [8, 16, 32, 64, 128] if not quick else [8, 32, 128]
    return [Axis("contrastive accumulation", "batch B (pairs)", f"micro-batch {micro}, BERT 4×256 from config, "
                 f"{T} tokens", bs, build, flops, inner=1)]


def mezo_axes(device, quick):
    import torch.nn.functional as F

    from taskloss.models import MLP
    from taskloss.search import MeZO

    B = 256
    x, y = _digits(B, device)

    def build(P):
        h = _width_of(P)

        def make():
            torch.manual_seed(0)
            return MLP(64, (h, h), 10).to(device)
        m1, m2, m3 = make(), make(), make().eval()
        mezo = MeZO(m1.parameters(), lr=1e-4)           # defaults for the rest (the API's names may change)
        adam = torch.optim.Adam(m2.parameters(), lr=1e-3)
        loss = lambda m: F.cross_entropy(m(x), y)       # noqa: E731

        def adam_step():
            adam.zero_grad(set_to_none=True)
            loss(m2).backward()
            adam.step()

        @torch.no_grad()
        def forward():
            loss(m3)
        return {"MeZO step (ours)": (lambda: mezo.step(lambda: loss(m1)), "ours"),
                "Adam step": (adam_step, "reference"), "inference forward": (forward, "reference")}

    widths = [128, 256, 512, 1024, 2048] if not quick else [128, 512, 2048]
    flops = lambda P: 2 * 2 * B * _mlp_macs((64, _width_of(P), _width_of(P), 10)) + 10 * P   # noqa: E731
    return [Axis("MeZO", "parameters P (MLP 64-h-h-10)", f"batch {B}, one perturbation", [_mlp_params(h) for h in
                                                                                          widths], build, flops)]


# --------------------------------------------------------------------------------------------------- measuring
def measure(ax: Axis, device, repeats: int, clock: str) -> None:
    """Fill ``ax.times`` (interleaved rounds) and ``ax.mem`` (first call of freshly built methods)."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    cases = [ax.build(s) for s in ax.sizes]
    ax.roles = {k: role for k, (_, role) in cases[0].items()}
    ax.times = {k: [[0.0] * len(ax.sizes) for _ in range(repeats)] for k in ax.roles}
    for i, case in enumerate(cases):                    # warm-up
        for fn, _ in case.values():
            fn()
    for r in range(repeats):
        for i, case in enumerate(cases):
            for name, (fn, _) in case.items():
                ts = []
                for _ in range(ax.inner):
                    sync(device)
                    t0 = now()
                    fn()
                    sync(device)
                    ts.append(now() - t0)
                ax.times[name][r][i] = statistics.median(ts)
    del cases
    ax.mem = {k: [] for k in ax.roles}
    for s in ax.sizes:
        fresh = ax.build(s)
        with quiet_stderr():
            for name, (fn, _) in fresh.items():
                ax.mem[name].append(peak_bytes(fn, device))


def slope(sizes, values) -> float:
    """Least-squares slope of log(values) against log(sizes)."""
    x, y = np.log(np.asarray(sizes, float)), np.log(np.maximum(np.asarray(values, float), 1e-12))
    return float(np.polyfit(x, y, 1)[0])


def _fmt_size(s):
    return f"{s / 1000:.0f}K" if s >= 10000 else str(s)


def _fmt_time(s):
    return f"{s * 1e3:.3g}"


def format_markdown(axes, device, repeats, clock, threads) -> str:
    lines = ["## scaling", "",
             f"Time and peak memory against size, device {device}"
             f"{f', {threads} CPU thread(s)' if device.type == 'cpu' else ''}; {repeats} rounds "
             f"({'thread CPU time' if clock == 'cpu' else 'wall clock'}), each cell the median of its calls. Slope: "
             "least-squares log-log slope of time against size, median over rounds [min–max]. Implied: the slope "
             "of the algorithm's FLOP count at the same sizes. Peak memory: first call of a freshly built method, "
             f"above what was live before it ({'torch.cuda.max_memory_allocated' if device.type == 'cuda' else 'torch.profiler CPU allocator trace'}); "
             "its slope is fitted over the sizes where it is non-zero.", "",
             "| family | axis (fixed) | sizes | method | time ms at the sizes | time slope | implied | peak MiB at "
             "the sizes | memory slope |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ax in axes:
        implied = slope(ax.sizes, [ax.flops(s) for s in ax.sizes])
        sizes = ", ".join(_fmt_size(s) for s in ax.sizes)
        for name, role in ax.roles.items():
            per_round = [slope(ax.sizes, ts) for ts in ax.times[name]]
            med = [statistics.median(col) for col in zip(*ax.times[name])]
            mem = ax.mem[name]
            nz = [(s, b) for s, b in zip(ax.sizes, mem) if b > 0]
            mem_slope = f"{slope(*zip(*nz)):.2f}" if len(nz) >= 3 else "—"
            tag = {"ours": "**", "peer": "", "reference": "_"}[role]
            mark = ("" if role != "ours" else
                    " ✓" if statistics.median(per_round) <= implied + SLOPE_SLACK else " ✗")
            lines.append(
                f"| {ax.family} | {ax.axis} ({ax.fixed}) | {sizes} | {tag}{name}{tag} | "
                f"{', '.join(_fmt_time(t) for t in med)} | {statistics.median(per_round):.2f} "
                f"[{min(per_round):.2f}–{max(per_round):.2f}]{mark} | {implied:.2f} | "
                f"{', '.join(f'{b / 2**20:.2f}' for b in mem)} | {mem_slope} |")
    lines += ["", f"✓ / ✗ on our rows: median time slope ≤ / > the implied slope + {SLOPE_SLACK} (a slope above the "
              "algorithm's is a finding). Bold: ours; plain: the peer library; italic: a reference measured beside it (the MLE / Adam / "
              "SGD step, K forwards, an inference forward, one forward+backward of the path points)."]
    return "\n".join(lines)


def plot(axes, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    paths = []
    style = {"ours": dict(lw=2, marker="o"), "peer": dict(lw=1.5, ls="--", marker="s"),
             "reference": dict(lw=1, ls=":", marker=".")}
    for kind in ("time", "memory"):
        cols = 5
        rows = math.ceil(len(axes) / cols)
        fig, grid = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.6 * rows), squeeze=False)
        for k, ax in enumerate(axes):
            a = grid[k // cols][k % cols]
            for name, role in ax.roles.items():
                if kind == "time":
                    vals = [statistics.median(col) * 1e3 for col in zip(*ax.times[name])]
                else:
                    vals = [b / 2**20 for b in ax.mem[name]]
                pts = [(s, v) for s, v in zip(ax.sizes, vals) if v > 0]
                if pts:
                    a.loglog(*zip(*pts), label=name, **style[role])
            if kind == "time":                 # the implied slope through the ours series' first point
                name = next(n for n, r in ax.roles.items() if r == "ours")
                t0 = statistics.median(ts[0] for ts in ax.times[name]) * 1e3
                f = [ax.flops(s) / ax.flops(ax.sizes[0]) * t0 for s in ax.sizes]
                a.loglog(ax.sizes, f, color="0.6", lw=0.8, label="implied (FLOPs)")
            a.set_title(f"{ax.family}: {ax.axis.split(' (')[0]}", fontsize=8)
            a.xaxis.set_minor_formatter(NullFormatter())
            a.yaxis.set_minor_formatter(NullFormatter())
            a.tick_params(labelsize=7)
            a.set_ylabel("ms" if kind == "time" else "peak MiB", fontsize=7)
            a.legend(fontsize=5, loc="upper left")
        for k in range(len(axes), rows * cols):
            grid[k // cols][k % cols].axis("off")
        fig.suptitle(f"Scaling: {'time per call' if kind == 'time' else 'peak memory of the first call'} "
                     "(log-log; solid ours, dashed peer, dotted reference)", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"scaling_{kind}.png"
        fig.savefig(path, dpi=70)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="3 sizes per axis, 1 round (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", default=None, help=f"comma-separated families of {', '.join(FAMILIES)}")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    ap.add_argument("--clock", default=None, choices=["cpu", "wall"],
                    help="thread CPU time (default on a CPU with one thread) or wall clock")
    ap.add_argument("--no-figure", action="store_true")
    ap.add_argument("--figure-dir", default=str(HERE))
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else torch.get_num_threads())
    torch.set_num_threads(threads)
    clock = args.clock or ("cpu" if device.type == "cpu" and threads == 1 else "wall")
    if clock == "cpu" and (device.type != "cpu" or threads != 1):
        ap.error("--clock cpu needs a CPU device and --threads 1")
    repeats = args.repeats or (1 if args.quick else 3)
    only = args.only.split(",") if args.only else FAMILIES
    unknown = set(only) - set(FAMILIES)
    if unknown:
        ap.error(f"unknown families {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    axes, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        builders = {"mgs": lambda: mgs_axes(device, args.quick), "kfac": lambda: kfac_axes(device, args.quick),
                    "emo": lambda: emo_axes(device, args.quick), "ig": lambda: ig_axes(device, args.quick),
                    "contrastive": lambda: contrastive_axes(device, args.quick, tmp),
                    "mezo": lambda: mezo_axes(device, args.quick)}
        for fam in FAMILIES:
            if fam in only:
                for ax in builders[fam]():
                    t0 = time.perf_counter()
                    measure(ax, device, repeats, clock)
                    print(f"{ax.family} / {ax.axis}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
                    axes.append(ax)
    print(format_markdown(axes, device, repeats, clock, threads))
    if not args.no_figure:
        paths = plot(axes, Path(args.figure_dir))
        print("\nFigures: " + ", ".join(f"`{p.name}`" for p in paths) + f" (this run: "
              f"{time.perf_counter() - started:.0f} s).")
    return axes


if __name__ == "__main__":
    main()
