#!/usr/bin/env python
"""Build the pretrained small LM committed in ``data/pretrained/small_lm/`` (deterministic).

    python data/build_pretrained_lm.py            # build unless the folder is complete
    python data/build_pretrained_lm.py --force    # rebuild (``make pretrained``)

Trains ``taskloss.models.TransformerLM`` by maximum likelihood (next-token cross-entropy) on the train
split of the default corpus (:func:`taskloss.datasets.corpus.load_corpus`), tokenized with the compact MiniLM
tokenizer (:func:`taskloss.datasets.corpus.get_tokenizer`). Everything is seeded; batches come from a seeded
``torch.Generator``; PyTorch runs on ``threads`` intra-op threads (default 1: float reductions then happen
in a fixed order, so a rebuild with the same torch version on the same CPU type gives the same weights;
other torch versions/CPUs give the same recipe up to float rounding). The valid loss is measured every
``eval_every`` steps and the best checkpoint is kept (a deterministic choice).

Outputs: ``model.pt`` (fp16 state_dict, ``torch.save``; tied weights stored once), ``tokenizer.json``
(the LM's own copy of its tokenizer) and ``meta.json`` (config, corpus and tokenizer sha256, steps, seed,
losses and perplexities, unigram baseline, versions, build time).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from taskloss.datasets import corpus  # noqa: E402
from taskloss.models import TransformerLM  # noqa: E402

OUT_DIR = REPO / "data" / "pretrained" / "small_lm"

# The declared recipe; tests check that meta.json records exactly this.
CONFIG = {
    "model": {"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "max_len": 128, "dropout": 0.1,
              "residual": "pre", "tie_weights": True},
    "train": {"seed": 0, "min_count": 1, "block_size": 128, "batch_size": 16, "steps": 300, "lr": 3e-3,
              "warmup": 30, "min_lr_ratio": 0.1, "weight_decay": 0.1, "betas": [0.9, 0.95], "grad_clip": 1.0,
              "eval_every": 50},
    "check_blocks": 16,  # meta["check"]: perplexity on the first 16 valid blocks (for a fast test)
}


def lr_at(step: int, cfg: dict) -> float:
    """Linear warm-up to ``lr`` then cosine decay to ``lr * min_lr_ratio`` at ``steps``."""
    lr, warm, total = cfg["lr"], cfg["warmup"], cfg["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return lr * (cfg["min_lr_ratio"] + (1 - cfg["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def mean_nll(model: torch.nn.Module, blocks: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token negative log-likelihood (nats/token) of ``model`` over ``blocks [N, T+1]``."""
    was = model.training
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        b = blocks[i:i + batch_size]
        logits = model(b[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), b[:, 1:].reshape(-1),
                                 reduction="sum").item()
        n += b[:, 1:].numel()
    model.train(was)
    return total / n


def fp16_roundtrip(model: torch.nn.Module) -> None:
    """Round the weights to fp16 and back, so what is evaluated is exactly what is saved."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def build(out_dir: str | os.PathLike = OUT_DIR, force: bool = False, threads: int = 1, steps: int | None = None,
          verbose: bool = True) -> dict:
    """Train and save the LM into ``out_dir``; returns the metadata. Skips when complete unless ``force``."""
    out_dir = Path(out_dir)
    if not force and all((out_dir / n).is_file() for n in ("model.pt", "tokenizer.json", "meta.json")):
        if verbose:
            print(f"{out_dir} is complete; use --force to rebuild")
        return json.loads((out_dir / "meta.json").read_text())
    t0 = time.time()
    cfg = json.loads(json.dumps(CONFIG))  # deep copy
    tc = cfg["train"]
    if steps is not None:  # a shorter build (tests/debugging) — recorded, and then not the declared recipe
        tc["steps"] = int(steps)
    torch.set_num_threads(threads)
    torch.manual_seed(tc["seed"])
    tok = corpus.get_tokenizer(tc["min_count"])
    train = corpus.lm_blocks("train", tc["block_size"], tok)
    valid = corpus.lm_blocks("valid", tc["block_size"], tok)
    test = corpus.lm_blocks("test", tc["block_size"], tok)
    model = TransformerLM(tok.vocab_size, **cfg["model"])
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos_emb" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos_emb" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=tc["lr"], betas=tuple(tc["betas"]))
    gen = torch.Generator().manual_seed(tc["seed"])
    best = (float("inf"), -1, None)
    history = []
    run_loss = None
    model.train()
    for step in range(tc["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        b = train[torch.randint(len(train), (tc["batch_size"],), generator=gen)]
        logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        run_loss = loss.item() if run_loss is None else 0.95 * run_loss + 0.05 * loss.item()
        if (step + 1) % tc["eval_every"] == 0 or step + 1 == tc["steps"]:
            v = mean_nll(model, valid)
            history.append({"step": step + 1, "train_loss_ema": round(run_loss, 4), "valid_loss": round(v, 4)})
            if verbose:
                print(f"step {step + 1:5d}  train(ema) {run_loss:.3f}  valid {v:.3f}  ppl {math.exp(v):.1f}  "
                      f"{time.time() - t0:.0f}s", flush=True)
            if v < best[0]:
                best = (v, step + 1, {k: t.detach().clone() for k, t in model.state_dict().items()})
    model.load_state_dict(best[2])
    fp16_roundtrip(model)
    model.eval()
    train_loss, valid_loss, test_loss = (mean_nll(model, x) for x in (train, valid, test))
    check = mean_nll(model, valid[: cfg["check_blocks"]])
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.half().state_dict(), out_dir / "model.pt")  # tied weights share storage → saved once
    model.float()
    tok.save(out_dir / "tokenizer.json")
    meta = {
        "config": cfg, "declared_steps": CONFIG["train"]["steps"], "best_step": best[1],
        "corpus_sha256": corpus.corpus_hash(), "corpus_stats": corpus.corpus_stats(),
        "tokenizer_sha256": tok.hash, "vocab_size": tok.vocab_size,
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_loss": train_loss, "valid_loss": valid_loss, "test_loss": test_loss,
        "train_ppl": math.exp(train_loss), "valid_ppl": math.exp(valid_loss), "test_ppl": math.exp(test_loss),
        "unigram_valid_ppl": corpus.unigram_perplexity("valid", tok),
        "unigram_test_ppl": corpus.unigram_perplexity("test", tok),
        "check": {"blocks": cfg["check_blocks"], "valid_loss": check, "valid_ppl": math.exp(check)},
        "history": history, "threads": threads,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "build_seconds": round(time.time() - t0, 1),
        "model_file_bytes": (out_dir / "model.pt").stat().st_size,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if verbose:
        print(f"saved {out_dir}: valid ppl {meta['valid_ppl']:.1f} (unigram {meta['unigram_valid_ppl']:.1f}), "
              f"{meta['n_params']} params, {meta['model_file_bytes'] / 1e6:.2f} MB, {meta['build_seconds']} s")
    return meta


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the folder is complete")
    ap.add_argument("--out", default=str(OUT_DIR), help="output folder (default data/pretrained/small_lm)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = reproducible order)")
    ap.add_argument("--steps", type=int, default=None, help="override the number of steps (debugging only)")
    args = ap.parse_args(argv)
    build(args.out, force=args.force, threads=args.threads, steps=args.steps)


if __name__ == "__main__":
    main()
