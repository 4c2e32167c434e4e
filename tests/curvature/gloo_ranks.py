"""Runs the multi-process cases of the distributed curvature tests in gloo processes on CPU, once per world size
for all of them: a spawn's cost is mostly the fresh interpreters' imports, so every test module's case runs in the
same processes. Each case is a function ``rank_case(rank, world) -> dict`` of a test module, called after
``init_process_group``; the results come back per rank, keyed by module."""
from __future__ import annotations

import datetime
import importlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = ("curvature.test_kfac_distributed", "curvature.test_fisher_distributed", "curvature.test_fail_fast")
#: A collective that waits longer than this fails (gloo's default is 30 minutes): a rank left waiting by another's
#: failure makes the test fail within it instead of hanging the suite.
TIMEOUT = datetime.timedelta(seconds=60)

_RESULTS: dict[int, list[dict]] = {}


def _worker(rank: int, world: int, init_file: str, out_dir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    try:
        res = {name: importlib.import_module(name).rank_case(rank, world) for name in CASES}
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def rank_results(world: int, case: str) -> list[dict]:
    """Per rank, what ``case``'s ``rank_case`` returned in ``world`` gloo processes (spawned once per world)."""
    if world not in _RESULTS:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world, join=True)
            _RESULTS[world] = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False)
                               for r in range(world)]
    return [res[case] for res in _RESULTS[world]]
