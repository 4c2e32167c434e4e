"""Benchmark: integrated gradients (taskloss.attribution) against Captum 0.9 on the same model, rule, steps and batch,
and the number of steps each quadrature rule needs for a completeness error of 1e-3.

Part 1 — speed at equal output. For each model the same float32 inputs, target, baseline, rule and number of
steps m go to
* ``ours``   — :class:`taskloss.attribution.IntegratedGradients` (or ``EmbeddingIntegratedGradients`` for the LM),
  which always returns the completeness error;
* ``captum`` — ``captum.attr.IntegratedGradients`` (``LayerIntegratedGradients`` on the token embedding for the
  LM) with ``return_convergence_delta=True``, i.e. the same outputs;
* ``floor``  — one plain forward + backward of the m·B path points (``torch.autograd.grad`` of the target's sum
  with respect to the points): the work no implementation of the rule can avoid.
Reported: attributions per second (B / median seconds; ours and Captum timed in interleaved repeats in one
process), Captum time / ours (target ≥ 1.5), ours / floor (the floor fraction; 1.00 = no overhead over the
unavoidable passes), peak memory above the inputs (``benchmarks/_timing.py``), and the largest difference
between the two attributions relative to their largest magnitude (equal output: ≤ 1e-5). Captum's trapezoid
rule weights differ (see ``taskloss/attribution/quadrature.py``), so the rules timed are Gauss–Legendre and the
midpoint rule, whose nodes and weights agree.

Part 2 — steps to a completeness error of 1e-3 (median over the examples of |Σ attributions − (F(x) − F(x′))|,
in the target's units): the smallest m on a grid, per rule, for a smooth model (tanh MLP), a piecewise-linear one
(ReLU CNN with max-pooling) and the pretrained small LM (log-probability of its next token, zero-embedding
baseline). Target: Gauss–Legendre needs at most half the steps of the best Riemann rule.

    python benchmarks/bench_attribution.py [--device auto|cpu|cuda] [--quick] [--repeats N]
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
from _timing import peak_bytes, quiet_stderr, sync  # noqa: E402

from taskloss.attribution import METHODS, EmbeddingIntegratedGradients, IntegratedGradients  # noqa: E402
from taskloss.lm import load_pretrained_lm  # noqa: E402
from taskloss.models import MLP, SmallCNN  # noqa: E402
from taskloss.utils import resolve_device

SPEED_TARGET, STEPS_TARGET, TOL = 1.5, 0.5, 1e-3




def _interleaved(fns: dict, device, repeats: int) -> dict:
    """Median seconds per function, the functions called in turn within each repeat (shared machine noise hits
    all of them alike), after one untimed warm-up call each."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _vision_case(name, model, x, target, method, n_steps):
    from captum.attr import IntegratedGradients as CaptumIG

    ours = lambda: IntegratedGradients(model).attribute(x, target=target, n_steps=n_steps, method=method)  # noqa: E731
    captum = lambda: CaptumIG(model).attribute(x, target=target, n_steps=n_steps, method=method,  # noqa: E731
                                               return_convergence_delta=True)
    points = x.repeat(n_steps, *[1] * (x.ndim - 1))

    def floor():
        z = points.clone().requires_grad_()
        torch.autograd.grad(model(z)[:, target].sum(), z)

    a, b = ours().attributions, captum()[0]
    return name, {"ours": ours, "captum": captum, "floor": floor}, a, b


def _lm_case(name, lm, ids, method, n_steps):
    from captum.attr import LayerIntegratedGradients

    fwd = lambda i: lm(i)[:, -1].log_softmax(-1)                                         # noqa: E731
    with torch.no_grad():
        target = fwd(ids).argmax(-1)
    eig = EmbeddingIntegratedGradients(fwd, lm.tok_emb)
    base = torch.zeros_like(ids)                                              # [PAD] (id 0) at every position
    ours = lambda: eig.attribute(ids, baselines=base, target=target, n_steps=n_steps, method=method)  # noqa: E731
    captum = lambda: LayerIntegratedGradients(fwd, lm.tok_emb).attribute(  # noqa: E731
        ids, baselines=base, target=target, n_steps=n_steps, method=method, return_convergence_delta=True)
    ids_rep = ids.repeat(n_steps, 1)
    with torch.no_grad():
        emb = lm.tok_emb(ids_rep)

    def floor():
        z = emb.clone().requires_grad_()
        handle = lm.tok_emb.register_forward_hook(lambda m, i, o: z)
        try:
            out = fwd(ids_rep).gather(1, target.repeat(n_steps)[:, None]).sum()
        finally:
            handle.remove()
        torch.autograd.grad(out, z)

    a, b = ours().attributions, captum()[0].sum(-1)
    return name, {"ours": ours, "captum": captum, "floor": floor}, a, b


def speed(device, quick: bool, repeats: int):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mlp = MLP(64, (128, 128), 10).to(device).eval()
    cnn = SmallCNN(width=16).to(device).eval()
    lm, tok = load_pretrained_lm(device=device)
    batches = (32,) if quick else (32, 128)
    cases = []
    for B in batches:
        x_flat = torch.rand(B, 64, generator=gen).to(device)
        x_img = torch.rand(B, 1, 8, 8, generator=gen).to(device)
        for method in ("gausslegendre", "riemann_middle"):
            cases.append((f"digits MLP 64-128-128-10, B={B}", method, 50,
                          lambda m=method, x=x_flat: _vision_case("mlp", mlp, x, 3, m, 50)))
            cases.append((f"SmallCNN width 16, B={B}", method, 50,
                          lambda m=method, x=x_img: _vision_case("cnn", cnn, x, 3, m, 50)))
    lm_batch = 8 if quick else 16
    ids = torch.randint(4, tok.vocab_size, (lm_batch, 24), generator=gen).to(device)
    cases.append((f"small LM (1M params), next token, B={lm_batch}×24 tokens", "gausslegendre", 32,
                  lambda: _lm_case("lm", lm, ids, "gausslegendre", 32)))
    rows = []
    for label, method, n_steps, build in cases:
        _, fns, a, b = build()
        rel = float((a - b).abs().max() / a.abs().max())
        t = _interleaved(fns, device, repeats)
        with quiet_stderr():
            mem = {k: peak_bytes(fns[k], device) for k in ("ours", "captum")}
        rows.append(dict(label=label, method=method, n_steps=n_steps, batch=a.shape[0], rel=rel, **t,
                         mem_ours=mem["ours"], mem_captum=mem["captum"]))
    return rows


def _steps_grid(max_steps):
    grid = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    return [m for m in grid if m <= max_steps]


def _trained(model, flat: bool, device, steps: int = 300):
    """``model`` trained by Adam on the digits (cross-entropy, batches of 64), float64, eval mode; and test inputs
    and labels. Attribution targets of a trained model have realistic scales (log-probabilities of a few nats)."""
    import torch.nn.functional as F

    from taskloss.datasets import digits_images, load_digits_splits

    (X, y), _, (Xt, yt) = load_digits_splits(0)
    X, Xt = (X, Xt) if flat else (digits_images(X), digits_images(Xt))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(X), (64,), generator=gen)
        loss = F.cross_entropy(model(X[idx].to(device)), y[idx].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.double().eval(), Xt.double().to(device), yt.to(device)


def steps_needed(device, quick: bool):
    """{model: {rule: smallest m with median |completeness error| ≤ TOL (None: not within the grid)}}."""
    torch.manual_seed(1)
    n = 8 if quick else 32
    mlp, x_flat, y_flat = _trained(MLP(64, (64, 64), 10, activation="tanh"), True, device)
    cnn, x_img, y_img = _trained(SmallCNN(width=8), False, device)
    lm, tok = load_pretrained_lm(device=device)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(4, tok.vocab_size, (max(2, n // 4), 16), generator=gen).to(device)
    lm_fwd = lambda i: lm(i)[:, -1].log_softmax(-1)                                      # noqa: E731
    with torch.no_grad():
        lm_target = lm_fwd(ids).argmax(-1)
    logp = lambda model: (lambda z: model(z).log_softmax(-1))                            # noqa: E731
    models = {   # target: log-probability of the true class / of the predicted next token; zero baselines
        "tanh MLP (smooth), log p(class)": lambda m, k: IntegratedGradients(logp(mlp)).attribute(
            x_flat[:n], target=y_flat[:n], n_steps=k, method=m, internal_batch_size=8192),
        "ReLU CNN (piecewise linear), log p(class)": lambda m, k: IntegratedGradients(logp(cnn)).attribute(
            x_img[:n], target=y_img[:n], n_steps=k, method=m, internal_batch_size=8192),
        "small LM, log p(next token)": lambda m, k: EmbeddingIntegratedGradients(lm_fwd, lm.tok_emb).attribute(
            ids, target=lm_target, n_steps=k, method=m, internal_batch_size=512),
    }
    out = {}
    for name, attribute in models.items():
        out[name] = {}
        for method in METHODS:
            found = None
            for k in _steps_grid(256 if quick else 1024):
                if float(attribute(method, k).completeness_error.abs().median()) <= TOL:
                    found = k
                    break
            out[name][method] = found
    return out


def format_markdown(rows, steps, device, repeats) -> str:
    lines = ["## attribution", "",
             f"Integrated gradients, float32, device {device}, median of {repeats} interleaved repeats. Peer: "
             "Captum 0.9 `IntegratedGradients` (`LayerIntegratedGradients` on the token embedding for the LM) with "
             "`return_convergence_delta=True`, same model, rule, steps, batch and baseline. Floor: one plain "
             "forward + backward of the m·B path points. Equal output: max |ours − Captum| / max |attribution|.", "",
             "| model | rule | m | ours attr/s | Captum attr/s | Captum / ours time (target ≥ 1.5) | ours / floor "
             "| floor ms | peak mem ours / Captum | equal output |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = r["captum"] / r["ours"]
        mem = f"{r['mem_ours'] / 2**20:.1f} / {r['mem_captum'] / 2**20:.1f} MiB"
        lines.append(f"| {r['label']} | {r['method']} | {r['n_steps']} | {r['batch'] / r['ours']:.0f} | "
                     f"{r['batch'] / r['captum']:.0f} | {speedup:.2f}× {'✓' if speedup >= SPEED_TARGET else '✗'} | "
                     f"{r['ours'] / r['floor']:.2f} | {r['floor'] * 1e3:.1f} | {mem} | "
                     f"{r['rel']:.1e} {'✓' if r['rel'] <= 1e-5 else '✗'} |")
    lines += ["", f"Steps for a median completeness error ≤ {TOL:g} (smallest m on the grid 2, 3, 4, 6, 8, 12, …; "
              "'—' = not within the grid). Target: Gauss–Legendre ≤ half the steps of the best Riemann rule.", "",
              "| model | " + " | ".join(m.replace("riemann_", "") for m in METHODS) + " | GL / best Riemann |",
              "|---|" + "---|" * (len(METHODS) + 1)]
    for name, per in steps.items():
        riemann = [v for m, v in per.items() if m != "gausslegendre" and v is not None]
        gl = per["gausslegendre"]
        if gl is not None and riemann:
            ratio = gl / min(riemann)
            verdict = f"{ratio:.2f} {'✓' if ratio <= STEPS_TARGET else '✗'}"
        elif gl is not None:
            verdict = "✓ (no Riemann rule within the grid)"
        else:
            verdict = "✗ (not within the grid)"
        lines.append(f"| {name} | " + " | ".join("—" if v is None else str(v) for v in per.values()) +
                     f" | {verdict} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="fewer cases, smaller grid (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    repeats = args.repeats or (3 if args.quick else 11)
    rows = speed(device, args.quick, repeats)
    steps = steps_needed(device, args.quick)
    print(format_markdown(rows, steps, device, repeats))
    return rows, steps


if __name__ == "__main__":
    main()
