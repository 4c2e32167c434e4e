"""Benchmark: exact contrastive accumulation (taskloss.contrastive.accumulation) — time against the full-batch
step, peak memory against batch size at a fixed micro-batch, and both against sentence-transformers'
``CachedMultipleNegativesRankingLoss`` on the same encoder and batch.

Encoder: a BERT of MiniLM's family built from a config with random weights (``--encoder small``: 4 layers, width
256, 4 heads, vocabulary 30522, mean pooling, L2 normalization) — all-MiniLM-L6-v2 itself (``--encoder minilm``)
is too slow for repeated steps on this shared 2-core CPU; the word-embedding matrix is frozen (its dense gradient
would dominate every peak alike). Pairs: ``B`` query/positive sequences of ``T`` tokens
(paragraph halves of the corpus, every one truncated to exactly ``T`` tokens so no padding is trimmed), InfoNCE
with τ = 0.05 (sentence-transformers' scale 20). One step = loss + backward into the parameters' ``.grad``.

* ``full``      — one forward of all 2B sequences with a graph, InfoNCE, one backward;
* ``exact``     — :func:`taskloss.contrastive.accumulated_backward` with micro-batch m (pass 1 without graph,
  cache, pass 2 with graph per micro-batch);
* ``st_cached`` — ``CachedMultipleNegativesRankingLoss(mini_batch_size=m)`` on the same SentenceTransformer
  (``loss(features).backward()``); our step wraps the same model: ``normalize(model(features)["sentence_embedding"])``.

Time: the median over ``repeats`` of each method, the methods interleaved within every repeat (a busy machine
slows all of them alike). Floor: the step's matmul FLOPs (``torch.utils.flop_counter.FlopCounterMode``: forward
and backward matmuls and attention) over this machine's measured matmul rate (a [B·T, 256] × [256, 1024] product,
the encoder's largest); ``× floor`` = measured time / floor time. The exact step's floor includes its second
forward: its FLOPs are ≈ 4/3 of the full step's (backward ≈ 2 forwards), so a ≤ 1.25× time target is below the
floor. Peak memory above what is live before the step (parameters and their allocated ``.grad``):
``benchmarks/_timing.py`` (CUDA allocator peak; on CPU the allocator trace of ``torch.profiler``).

Targets (from the issue): exact/full time ≤ 1.25× at m = B/8; peak memory flat in B at fixed m apart from the B×d
embeddings and B×B scores; against the cached sentence-transformers loss: not slower, less memory.

    python benchmarks/bench_contrastive.py [--device auto|cpu|cuda] [--quick] [--encoder small|minilm]
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import peak_bytes, quiet_stderr, sync  # noqa: E402

from taskloss.contrastive import accumulated_backward, info_nce, paragraph_pairs  # noqa: E402
from taskloss.utils import resolve_device

TIME_TARGET = 1.25
TAU = 0.05




def build_st_model(encoder: str, max_tokens: int, device, folder: str):
    """A SentenceTransformer (Transformer → mean Pooling → Normalize) around the chosen BERT."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from taskloss.datasets.tokenizer import minilm_path

    path = str(minilm_path())
    if encoder == "small":
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, max_position_embeddings=512)
        BertModel(cfg).save_pretrained(folder)
        AutoTokenizer.from_pretrained(path, local_files_only=True).save_pretrained(folder)
        path = folder
    tr = models.Transformer(path, max_seq_length=max_tokens)
    model = SentenceTransformer(modules=[tr, models.Pooling(tr.get_embedding_dimension(), "mean"),
                                         models.Normalize()], device=str(device))
    # The word-embedding matrix is frozen: its dense [30522, d] gradient (31 MiB at d = 256) would be allocated by
    # every backward alike and hide the activation memory this benchmark is about.
    tr.auto_model.get_input_embeddings().weight.requires_grad_(False)
    model.train()                      # dropout on, as in training
    return model


def make_features(model, B: int, T: int):
    pairs = [(q, p) for q, p, _ in paragraph_pairs("train", min_words=2 * T)
             if min(len(q.split()), len(p.split())) >= T]
    if len(pairs) < B:
        raise SystemExit(f"only {len(pairs)} paragraphs long enough for {B} pairs of {T} tokens")
    feats = [model.preprocess([x[i] for x in pairs[:B]]) for i in (0, 1)]
    dev = next(model.parameters()).device
    feats = [{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in f.items()} for f in feats]
    assert all(f["input_ids"].shape == (B, T) and bool(f["attention_mask"].all()) for f in feats), "padding left"
    return feats


def steps(model, feats, m):
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    encoder = lambda f: F.normalize(model(dict(f))["sentence_embedding"], dim=-1)     # noqa: E731
    loss_fn = functools.partial(info_nce, temperature=TAU)
    st_loss = CachedMultipleNegativesRankingLoss(model, scale=1 / TAU, mini_batch_size=m)
    return {
        "full": lambda: loss_fn(*[encoder(f) for f in feats]).backward(),
        "exact": lambda: accumulated_backward(encoder, feats, loss_fn, m),
        "st_cached": lambda: st_loss([dict(f) for f in feats], None).backward(),
    }


def interleaved_medians(fns: dict, model, device, repeats: int) -> dict[str, float]:
    times = {k: [] for k in fns}
    for fn in fns.values():                     # warm-up: allocator, lazy inits, .grad allocated
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            model.zero_grad(set_to_none=False)
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def matmul_rate(n: int, device, repeats: int = 5) -> float:
    a, b = torch.randn(n, 256, device=device), torch.randn(256, 1024, device=device)
    a @ b
    ts = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        ts.append(time.perf_counter() - t0)
    return 2 * n * 256 * 1024 / statistics.median(ts)


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def peak(fn, model, device) -> int:
    model.zero_grad(set_to_none=False)
    with quiet_stderr():
        return peak_bytes(fn, device)


def bench(encoder, B, T, Bs_memory, m_memory, device, repeats):
    with tempfile.TemporaryDirectory() as tmp:
        model = build_st_model(encoder, T, device, tmp)
        d = model.get_embedding_dimension()
        feats = make_features(model, B, T)
        m = B // 8
        fns = steps(model, feats, m)
        times = interleaved_medians(fns, model, device, repeats)
        fl = {k: flops(fn) for k, fn in fns.items()}
        rate = matmul_rate(2 * B * T, device)
        mem = {k: peak(fn, model, device) for k, fn in fns.items()}
        mem_rows = []
        for b in Bs_memory:
            f_b = make_features(model, b, T)
            fb = steps(model, f_b, m_memory)
            mem_rows.append({"B": b, **{k: peak(fb[k], model, device) for k in ("exact", "full", "st_cached")}})
    return dict(times=times, flops=fl, rate=rate, mem=mem, mem_rows=mem_rows, d=d, m=m)


def format_markdown(r, encoder, B, T, m_memory, device, repeats):
    t, fl, rate, mem, d = r["times"], r["flops"], r["rate"], r["mem"], r["d"]
    mib = lambda x: f"{x / 2**20:.1f} MiB"                                  # noqa: E731
    floor = {k: fl[k] / rate for k in fl}
    enc = ("BERT from config, random weights: 4 layers, width 256, 4 heads (MiniLM too slow on this CPU)"
           if encoder == "small" else "all-MiniLM-L6-v2") + ", word embeddings frozen"
    lines = [
        "## contrastive", "",
        f"Encoder: {enc}; B = {B} pairs × {T} tokens, d = {d}, τ = {TAU}, dropout on; device {device}; median of "
        f"{repeats} interleaved repeats; matmul rate {rate / 1e9:.1f} GFLOP/s. Peer: sentence-transformers "
        "`CachedMultipleNegativesRankingLoss` (same model, same features, same mini-batch).", "",
        "| step | micro-batch | time | vs full | vs ST cached (target ≤ 1×) | GFLOP | floor | × floor | peak memory | "
        "vs full | vs ST cached (target < 1×) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, name in (("full", "full batch, one graph"), ("exact", "exact accumulation (ours)"),
                    ("st_cached", "sentence-transformers cached MNRL")):
        mb = "—" if k == "full" else str(r["m"])
        vs_full = t[k] / t["full"]
        mark = f" {'✓' if vs_full <= TIME_TARGET else '✗'} (target ≤ {TIME_TARGET})" if k == "exact" else ""
        vs_st = f"{t[k] / t['st_cached']:.2f}" + (" ✓" if k == "exact" and t[k] <= t["st_cached"] else
                                                    " ✗" if k == "exact" else "")
        mem_st = f"{mem[k] / mem['st_cached']:.2f}" + (" ✓" if k == "exact" and mem[k] < mem["st_cached"] else
                                                        " ✗" if k == "exact" else "")
        lines.append(f"| {name} | {mb} | {t[k] * 1e3:.0f} ms | {vs_full:.2f}{mark} | {vs_st} | {fl[k] / 1e9:.1f} | "
                     f"{floor[k] * 1e3:.0f} ms | {t[k] / floor[k]:.1f} | {mib(mem[k])} | {mem[k] / mem['full']:.2f} | "
                     f"{mem_st} |")
    lines += ["", f"Floor ratio exact/full = {fl['exact'] / fl['full']:.2f} (the second forward): a time target of "
              f"{TIME_TARGET}× is below the floor when this exceeds it.", "",
              f"Peak memory against batch size at fixed micro-batch m = {m_memory} (embeddings + cache: "
              f"2·B·d floats several times; scores: B×B):", "",
              "| B | exact | growth since first B | B·d + B² floats (×4 B) | full batch | ST cached |",
              "|---|---|---|---|---|---|"]
    base = r["mem_rows"][0]
    for row in r["mem_rows"]:
        b = row["B"]
        pred = 4 * ((b * d + b * b) - (base["B"] * d + base["B"] ** 2))
        lines.append(f"| {b} | {mib(row['exact'])} | {mib(row['exact'] - base['exact'])} | {mib(pred)} | "
                     f"{mib(row['full'])} | {mib(row['st_cached'])} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (a smoke run)")
    ap.add_argument("--encoder", default="small", choices=["small", "minilm"])
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    torch.manual_seed(0)
    if args.quick:
        B, T, Bs, m_mem, repeats = 32, 16, [16, 32, 64], 8, args.repeats or 3
    else:
        B, T, Bs, m_mem, repeats = 64, 24, [16, 32, 64, 128], 8, args.repeats or 7
    r = bench(args.encoder, B, T, Bs, m_mem, device, repeats)
    print(format_markdown(r, args.encoder, B, T, m_mem, device, repeats))
    return r


if __name__ == "__main__":
    main()
