"""In-batch negatives under torch.distributed: 2 gloo processes, each with its shard of the batch, a
DistributedDataParallel encoder, the gathered loss (taskloss.contrastive.distributed) and exact accumulation,
give the same synchronized gradient as 1 process with the whole batch (float64, dropout off: each rank draws its
own masks, so dropout exactness is tested in one process)."""
from __future__ import annotations

import functools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from taskloss.contrastive import accumulated_backward, distributed_info_nce, gather_with_grad, info_nce

D = torch.float64
# (shard sizes per rank, micro-batch, towers, loss options)
CONFIGS = [
    dict(shards=(5, 5), micro=3, towers=1, hard=2, kw=dict(temperature=0.3, symmetric=True)),
    dict(shards=(4, 6), micro=4, towers=2, hard=0, kw=dict(temperature=0.5, reduction="sum")),
    dict(shards=(6, 6), micro=None, towers=1, hard=1, kw=dict(temperature=0.2)),      # no accumulation: gather alone
]


def _encoders(towers: int):
    torch.manual_seed(0)
    encs = [nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4)).to(D) for _ in range(towers)]
    return encs


def _data(shards, hard):
    g = torch.Generator().manual_seed(1)
    B = sum(shards)
    q, p = torch.randn(B, 6, generator=g, dtype=D), torch.randn(B, 6, generator=g, dtype=D)
    h = torch.randn(hard * len(shards), 6, generator=g, dtype=D)
    return q, p, h


def _shard(x, sizes, rank):
    start = sum(sizes[:rank])
    return x[start: start + sizes[rank]]


def _single_process(cfg):
    encs = _encoders(cfg["towers"])
    q, p, h = _data(cfg["shards"], cfg["hard"])
    qe, de = encs[0], encs[-1]
    loss = info_nce(qe(q), de(p), hard_negatives=de(h) if cfg["hard"] else None, **cfg["kw"])
    loss.backward()
    return loss.detach(), [prm.grad.clone() for e in encs for prm in e.parameters()]


def _worker(rank: int, world: int, init_file: str, out_dir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {}
        for i, cfg in enumerate(CONFIGS):
            encs = [DDP(e) for e in _encoders(cfg["towers"])]
            q, p, h = _data(cfg["shards"], cfg["hard"])
            q, p = _shard(q, cfg["shards"], rank), _shard(p, cfg["shards"], rank)
            h = _shard(h, [cfg["hard"]] * world, rank)
            qe, de = encs[0], encs[-1]
            if cfg["micro"] is None:
                loss = distributed_info_nce(qe(q), de(p), hard_negatives=de(h), **cfg["kw"])
                loss.backward()
                loss = loss.detach()
            elif cfg["hard"]:
                fn = lambda a, b, c, kw=cfg["kw"]: distributed_info_nce(a, b, hard_negatives=c, **kw)  # noqa: E731
                loss = accumulated_backward((qe, de, de), (q, p, h), fn, cfg["micro"]).loss
            else:
                fn = functools.partial(distributed_info_nce, **cfg["kw"])
                loss = accumulated_backward((qe, de), (q, p), fn, cfg["micro"]).loss
            res[i] = (loss, [prm.grad.clone() for e in encs for prm in e.module.parameters()])
        x = torch.full((rank + 1, 2), float(rank), dtype=D, requires_grad=True)       # unequal rows: 1 and 2
        gathered = gather_with_grad(x)
        (gathered * torch.arange(1, 4, dtype=D)[:, None]).sum().backward()
        res["gather"] = (gathered.detach(), x.grad.clone())
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gloo_processes_equal_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for i, cfg in enumerate(CONFIGS):
        loss, grads = _single_process(cfg)
        # the full-batch loss is the mean of the ranks' scaled shares
        torch.testing.assert_close((ranks[0][i][0] + ranks[1][i][0]) / 2, loss)
        for r in range(2):
            assert len(ranks[r][i][1]) == len(grads)
            for a, b in zip(ranks[r][i][1], grads):
                # DDP averages in another summation order than one process: close, not bit-identical
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    expected = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], dtype=D)
    for r in range(2):
        torch.testing.assert_close(ranks[r]["gather"][0], expected)
    # d/dx of Σ_ranks Σ_rows w_row·x_row, summed over both ranks' losses: 2·w of the own rows
    torch.testing.assert_close(ranks[0]["gather"][1], torch.full((1, 2), 2.0, dtype=D))
    torch.testing.assert_close(ranks[1]["gather"][1], torch.tensor([[4.0, 4.0], [6.0, 6.0]], dtype=D))
