"""MGS under torch.distributed: 2 gloo processes on CPU (candidates split across ranks, losses all-gathered,
shared noise seeds) give the same update as 1 process; ranks with different batches are refused."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from taskloss.search import MGS
from helpers import mgs_step, with_surrogate

CONFIGS = [dict(n_samples=3, include_mle=True, chunk_size=None, low_memory=False),   # 4 candidates, 2 per rank
           dict(n_samples=4, include_mle=False, chunk_size=1, low_memory=True)]       # odd/even split, regenerated noise


def _problem():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(48, 5, generator=g)
    y = torch.randint(0, 3, (48,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, (X, y)


def _run(config: dict, seed: int, steps: int = 3):
    """Train a fresh model for `steps` MGS steps; return the final flat parameters and the weights per step."""
    torch.set_num_threads(1)
    model, batch = _problem()
    mgs = with_surrogate(MGS(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                             lambda out, b: 2.0 * F.cross_entropy(out, b[1]), alpha=0.05, sigma=0.5, seed=seed,
                             **config), lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    weights = [mgs_step(mgs, batch).weights for _ in range(steps)]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, torch.stack(weights), mgs


def _worker(rank: int, world: int, init_file: str, out_dir: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        res = {}
        for i, cfg in enumerate(CONFIGS):
            # rank 1 passes a different seed: rank 0's seed is broadcast, so both must still agree
            flat, w, _ = _run(cfg, seed=7 if rank == 0 else 99)
            res[i] = (flat, w)
        model, (X, y) = _problem()
        mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                 lambda out, b: F.cross_entropy(out, b[1]), seed=1),
                             lambda m, b: F.cross_entropy(m(b[0]), b[1]))
        try:  # a different batch on each rank must be refused, not silently averaged
            mgs_step(mgs, (X[rank::2], y[rank::2]))
            res["mismatch"] = "no error"
        except RuntimeError as e:
            res["mismatch"] = str(e)
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
        single_flat, single_w, mgs = _run(cfg, seed=7)
        assert mgs.world() == (1, 0)
        for r in range(2):
            torch.testing.assert_close(ranks[r][i][1], single_w, rtol=1e-6, atol=1e-9)
            torch.testing.assert_close(ranks[r][i][0], single_flat, rtol=1e-6, atol=1e-7)
        # the two ranks hold bit-identical parameters (same gathered losses, same seeds, same arithmetic)
        assert torch.equal(ranks[0][i][0], ranks[1][i][0])
    for r in range(2):
        assert "same batch" in ranks[r]["mismatch"]
