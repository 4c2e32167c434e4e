"""MeZO and the zeroth-order estimators (and their harness rules) under torch.distributed: 2 and 3 gloo processes on
CPU, each holding its part of the batch (the last part shorter), give the step of one process on the whole batch to
float64 round-off — one perturbation stream shared by the ranks, each rank's mean loss weighted by its examples —
and the ranks hold bit-identical parameters; ranks that hold different parameters are refused."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from taskloss.harness import Problem, make_rule
from taskloss.search import MeZO, gaussian_smoothing_grad, spsa_grad
from taskloss.parameter_vectors import functional_loss

N = 11          # 2 ranks: 6 + 5 rows; 3 ranks: 4 + 4 + 3


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _mezo(X, y, weighted: bool):
    model = _model()
    opt = MeZO(model.parameters(), lr=0.05, sigma=1e-3, n_samples=2, weight_decay=1e-3, seed=3)
    firsts = []
    for _ in range(3):
        def closure():
            loss = F.cross_entropy(model(X), y)
            return (loss, len(X)) if weighted else loss
        firsts.append(float(opt.step(closure)))
    return {"params": _flat(model), "firsts": torch.tensor(firsts), "grads": torch.tensor(opt.last_projected_grads)}


def _estimators(X, y, seed: int):
    model = _model()
    f, theta = functional_loss(model, lambda out: F.cross_entropy(out, y), X)
    out = {}
    for baseline in ("value", "loo", "antithetic"):
        g, _, values = gaussian_smoothing_grad(f, theta, 0.1, 4, baseline=baseline, return_samples=True,
                                               generator=torch.Generator().manual_seed(seed), n_examples=len(X))
        out[baseline] = (torch.cat([v.reshape(-1) for v in g.values()]), values)
    g = spsa_grad(f, theta, 0.1, 3, generator=torch.Generator().manual_seed(seed), n_examples=len(X))
    out["spsa"] = torch.cat([v.reshape(-1) for v in g.values()])
    return out


def _rules(X, y):
    out = {}
    for name in ("zo_gaussian", "spsa", "mezo"):
        model = _model()
        rule = make_rule(name, Problem(model, X, y), n_samples=3)
        for _ in range(2):
            rule.step()
        out[name] = _flat(model)
    return out


def _all(X, y, seed: int = 0):
    return {"mezo": _mezo(X, y, True), "estimators": _estimators(X, y, seed), "rules": _rules(X, y)}


def _worker(rank: int, world: int, init_file: str, out_dir: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        X, y = _data()
        part = torch.arange(N).tensor_split(world)[rank]
        # each rank seeds its own generator differently: rank 0's stream must be the one every rank uses
        res = _all(X[part], y[part], seed=rank)
        model = _model()
        if rank == world - 1:
            with torch.no_grad():
                model[0].bias.add_(1e-3)               # this rank holds other parameters: refused, not averaged
        opt = MeZO(model.parameters(), lr=0.1, sigma=1e-3)
        try:
            opt.step(lambda: F.cross_entropy(model(X[part]), y[part]))
            res["mismatch"] = "no error"
        except RuntimeError as e:
            res["mismatch"] = str(e)
        even = torch.arange(N - 1).tensor_split(2)[rank] if world == 2 else None
        if even is not None:      # equal parts: the loss alone (each rank weighs 1, DDP's convention) is exact too
            res["even"] = _mezo(X[even], y[even], weighted=False)
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_processes_equal_one_process_on_the_whole_batch(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    X, y = _data()
    assert len(torch.arange(N).tensor_split(world)[-1]) < len(torch.arange(N).tensor_split(world)[0])  # uneven
    single = _all(X, y, seed=0)
    for r, res in enumerate(ranks):
        for key in ("params", "firsts", "grads"):
            _close(res["mezo"][key], single["mezo"][key])
            assert torch.equal(res["mezo"][key], ranks[0]["mezo"][key])       # ranks bit-identical
        for name, want in single["estimators"].items():
            got = res["estimators"][name]
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                _close(a, b)
        for name, want in single["rules"].items():
            _close(res["rules"][name], want)
        assert "different (or NaN) parameters" in res["mismatch"]
    if world == 2:
        even = _mezo(X[:N - 1], y[:N - 1], weighted=True)
        for res in ranks:
            for key in ("params", "firsts", "grads"):
                _close(res["even"][key], even[key])
