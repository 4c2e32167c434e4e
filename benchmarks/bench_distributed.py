"""Benchmark: the communication of K-FAC across ranks (taskloss.curvature.kfac, ``process_group``) against DDP's own
gradient all-reduce, per step, at factor update intervals T_cov = 1 and 10.

Two gloo processes on the CPU, the model wrapped in ``DistributedDataParallel`` (25 MiB buckets, its default), each
step ``forward → KFAC.update_statistics → backward (DDP's all-reduce) → precondition_ → SGD``. Counted, not timed:

* DDP — a comm hook (``register_comm_hook``) wrapping torch's ``allreduce_hook`` counts the buckets and their bytes;
* K-FAC — a wrapper around ``torch.distributed.all_reduce`` counts K-FAC's collectives and their bytes (DDP's reducer
  does not go through it, so the two counts are separate).

K-FAC sends the upper triangle of every factor (``A`` ``[cols, cols]``, ``G`` ``[out, out]`` per layer) and one
count per factor in one buffer per update, so a factor update costs ``Σ_layers (cols² + out²)/2`` numbers against
DDP's ``Σ params`` per step: about 1× for square layers, less for wide ones. No inverse is communicated: every rank eigendecomposes the
bit-identical factors itself. The alternative — each rank eigendecomposing its share of the layers and broadcasting
``(Q_A, Q_G, λ_A, λ_G)`` — would send about the factors' bytes again at every inverse refresh to save
``(world − 1)/world`` of the ``eigh`` time, which the table shows next to the step's traffic (``eigh`` per refresh,
measured once on rank 0, wall clock).

Models: a ``taskloss.models.MLP`` on 784-dimensional inputs and a two-layer GPT-2 (``transformers``, built from a
config, tied embeddings: ``wte``/``lm_head`` keep plain gradients, K-FAC covers the ``Conv1D`` layers).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from taskloss.curvature import KFAC


def _mlp(hidden):
    from taskloss.models import MLP
    torch.manual_seed(0)
    return MLP(784, hidden, 10)


def _gpt2(n_embd):
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=n_embd, n_head=4, n_positions=64, vocab_size=512,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _batch(kind, rank, batch):
    g = torch.Generator().manual_seed(rank)
    if kind == "mlp":
        return torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)
    ids = torch.randint(0, 512, (batch, 32), generator=g)
    labels = torch.cat([ids[:, 1:], torch.full((batch, 1), -100)], dim=1)
    return {"input_ids": ids}, labels


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


def _run(kind, size, t_cov, steps, batch, rank):
    model = _mlp(size) if kind == "mlp" else _gpt2(size)
    ddp = DDP(model)
    ddp_log, in_hook = [], [False]

    def counting_hook(state, bucket):
        ddp_log.append(bucket.buffer().numel() * bucket.buffer().element_size())
        in_hook[0] = True          # torch's hook calls dist.all_reduce: not one of K-FAC's
        try:
            return allreduce_hook(state, bucket)
        finally:
            in_hook[0] = False
    ddp.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kfac = KFAC(ddp, factor_update_interval=t_cov, inverse_update_interval=10, fisher_type="empirical",
                optimizer=opt)
    x, y = _batch(kind, rank, batch)
    kfac_log = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        if not in_hook[0]:
            kfac_log.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counting
    try:
        for _ in range(steps):
            out = ddp(**x) if isinstance(x, dict) else ddp(x)
            logits = _logits(out)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            kfac.update_statistics(x, y, outputs=out)
            opt.zero_grad()
            loss.backward()
            kfac.precondition_()
            opt.step()
    finally:
        dist.all_reduce = real
    t0 = time.perf_counter()
    kfac.factors.refresh(kfac.damping, new_basis=True)
    eigh = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    covered = sum(p.numel() for layer in kfac.layers for p in layer.params)
    return {"params": n_params, "covered": covered, "layers": len(kfac.layers), "ddp": ddp_log, "kfac": kfac_log,
            "eigh": eigh}


def _worker(rank, world, init_file, out_dir, cases, steps, batch):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {c: _run(*c, steps, batch, rank) for c in cases}
        if rank == 0:
            torch.save(res, os.path.join(out_dir, "rank0.pt"))
    finally:
        dist.destroy_process_group()


def bench(cases, steps, batch, world=2):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp, cases, steps, batch), nprocs=world,
                 join=True)
        return torch.load(os.path.join(tmp, "rank0.pt"), weights_only=False)


def _mib(b):
    return f"{b / 2**20:.2f} MiB"


def format_markdown(res, steps, batch, world):
    lines = [f"## distributed: K-FAC's communication against DDP's gradient all-reduce ({world} gloo processes)", "",
             f"Per step, averaged over {steps} steps (batch {batch} per rank, float32, `fisher_type=\"empirical\"`, "
             "T_inv = 10). DDP: its buckets (comm hook); K-FAC: its all-reduces (one buffer per factor update: every "
             "layer's `A`, `G` (upper triangles) and counts). No inverse is communicated (every rank eigendecomposes the identical "
             "factors); `eigh / refresh` is the wall time of one refresh of all layers on one rank, what splitting "
             "the layers over the ranks would divide.", "",
             "| model | params (K-FAC covers) | layers | T_cov | DDP collectives / step | DDP bytes / step | "
             "K-FAC collectives / step | K-FAC bytes / step | K-FAC / DDP bytes | eigh / refresh |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, size, t_cov), r in res.items():
        name = f"MLP 784-{'-'.join(map(str, size))}-10" if kind == "mlp" else f"GPT-2 2 layers, n_embd {size}"
        ddp_b, kfac_b = sum(r["ddp"]) / steps, sum(r["kfac"]) / steps
        lines.append(f"| {name} | {r['params']:,} ({r['covered']:,}) | {r['layers']} | {t_cov} | "
                     f"{len(r['ddp']) / steps:.1f} | {_mib(ddp_b)} | {len(r['kfac']) / steps:.1f} | {_mib(kfac_b)} | "
                     f"{kfac_b / ddp_b:.2f} | {r['eigh'] * 1e3:.0f} ms |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="gloo on the CPU in any case")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    args = ap.parse_args(argv)
    steps, batch = (10, 16) if args.quick else (20, 32)
    cases = [(kind, size, t) for kind, size in (("mlp", (512, 512)), ("gpt2", 128)) for t in (1, 10)]
    res = bench(cases, steps, batch)
    print(format_markdown(res, steps, batch, 2))
    return res


if __name__ == "__main__":
    main()
