"""Shampoo and SOAP under DistributedDataParallel with 2 gloo ranks: the only statistic they use is the gradient,
which DDP all-reduces once per backward, so the optimizers issue no collective of their own, the ranks' factors,
bases and parameters are bit-identical, and they equal one process on the whole batch to round-off."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from taskloss.curvature import SOAP, Shampoo

N, WORLD, STEPS = 24, 2, 4


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 5, generator=g, dtype=torch.float64), torch.randn(N, 5, generator=g, dtype=torch.float64)


def _model():
    # square weights: SOAP's first basis is the eigenbasis of G Gᵀ and Gᵀ G, unique only where both are full rank;
    # a degenerate (null) eigenspace would be resolved differently by a round-off-sized change of the gradient
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 5)).double()


def _train(make_opt, X, Y, world: int = 1) -> dict:
    model = _model()
    net = DDP(model) if world > 1 else model
    opt = make_opt(model.parameters())
    for _ in range(STEPS):
        opt.zero_grad()
        ((net(X) - Y) ** 2).mean().backward()          # DDP averages the ranks' gradients (equal parts)
        opt.step()
    w = model[0].weight
    st = opt.state[w]
    return {"params": torch.cat([p.detach().flatten() for p in model.parameters()]),
            "factors": [f.clone() for f in st["factors"]]}


MAKERS = {
    "shampoo": lambda ps: Shampoo(ps, lr=0.05, betas=(0.9, 0.99)),
    "soap": lambda ps: SOAP(ps, lr=0.05, precondition_frequency=2),
}


def _worker(rank: int, world: int, init_file: str, out_dir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    calls = []
    real = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "all_gather")}
    try:
        X, Y = _data()
        part = torch.arange(N).tensor_split(world)[rank]
        for name, fn in real.items():
            setattr(dist, name, lambda *a, _n=name, _f=fn, **k: (calls.append(_n), _f(*a, **k))[1])
        res = {}
        for name, make in MAKERS.items():
            before = len(calls)
            res[name] = _train(make, X[part], Y[part], world)
            res[name]["calls"] = len(calls) - before
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gloo_ranks_are_bit_identical_and_equal_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(WORLD, os.path.join(tmp, "init"), tmp), nprocs=WORLD, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    X, Y = _data()
    for name, make in MAKERS.items():
        single = _train(make, X, Y)
        for res in ranks:
            got = res[name]
            assert got["calls"] == 0, name               # no collective of the optimizer's own
            assert torch.equal(got["params"], ranks[0][name]["params"]), name
            for f, f0, fs in zip(got["factors"], ranks[0][name]["factors"], single["factors"]):
                assert torch.equal(f, f0), name
                torch.testing.assert_close(f, fs, rtol=1e-9, atol=1e-11)
            # round-off of the averaged gradient, amplified by the eigenbasis (SOAP) and 1/√v: still ~1e-9
            torch.testing.assert_close(got["params"], single["params"], rtol=0, atol=1e-8)
        assert (single["params"] - torch.cat([p.detach().flatten() for p in _model().parameters()])).abs().max() > 1e-3
