"""K-FAC under torch.distributed: 2 and 3 gloo processes on CPU, the model wrapped in DistributedDataParallel, each
rank holding its part of the batch (the last part shorter), take the steps of one process on the whole batch to
float64 round-off — factors summed across ranks in one all-reduce per update, masks and ignored labels included —
and hold bit-identical factors, inverses and parameters; sharded (FSDP) models are refused."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from curvature.gloo_ranks import rank_results
from taskloss.curvature import KFAC, FisherDiagonalPreconditioner, HessianFree

N = 11                       # 2 ranks: 6 + 5 rows; 3 ranks: 4 + 4 + 3
NS, T = 5, 4                 # per-token batch: 2 ranks 3 + 2 sequences; 3 ranks 2 + 2 + 1


def _data():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(N, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)
    S = torch.randn(NS, T, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (NS, T), generator=g)
    labels[0, 2:] = -100
    labels[3, 0] = -100
    mask = torch.ones(NS, T, dtype=torch.long)
    mask[1, 3:] = 0
    mask[4, 2:] = 0
    return X, y, S, labels, mask


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _token_model():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    model[2].weight.requires_grad_(False)          # a bias-only block
    return model


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _unwrapped(d):
    """Layer names without DDP's ``module.`` prefix."""
    return {k.removeprefix("module."): v for k, v in d.items()}


def _kfac_state(kfac):
    f = kfac.factors
    inv = {k: torch.cat([t.reshape(-1) for t in v]) for k, v in f.inverses.items()}
    return {"A": _unwrapped(f.A), "G": _unwrapped(f.G), "inv": _unwrapped(inv)}


def _run_mlp(X, y, fisher_type, n_total, world=1):
    """Three K-FAC steps (SGD with momentum, KL clip); the loss scaled so that DDP's averaged gradient is the
    mean over the ``n_total`` examples of all ranks."""
    model = _mlp()
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kfac = KFAC(net, fisher_type=fisher_type, damping=1e-2, decay=0.5, inverse_update_interval=2, kl_clip=1e-2,
                optimizer=opt)
    for _ in range(3):
        out = net(X)
        loss = F.cross_entropy(out, y, reduction="sum") * world / n_total
        kfac.update_statistics(X, y, outputs=out)
        opt.zero_grad()
        loss.backward()
        kfac.precondition_()
        opt.step()
    return {"params": _flat(model), **_kfac_state(kfac)}


def _run_tokens(S, labels, mask, n_total, world=1):
    """Per-token outputs with padding and ignored labels, a bias-only layer, factors every second call."""
    model = _token_model()
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    kfac = KFAC(net, fisher_type="empirical", damping=1e-2, decay=0.3, factor_update_interval=2,
                inverse_update_interval=1, optimizer=opt)
    valid = (labels != -100) & mask.bool()
    for _ in range(3):
        out = net(S)
        loss = F.cross_entropy(out[valid], labels[valid], reduction="sum") * world / n_total
        kfac.update_statistics(S, labels, outputs=out, mask=mask)
        opt.zero_grad()
        loss.backward()
        kfac.precondition_()
        opt.step()
    return {"params": _flat(model), **_kfac_state(kfac)}


def _mc_factors(X, y, seed, world=1):
    model = _mlp()
    kfac = KFAC(DDP(model) if world > 1 else model, fisher_type="mc", decay=0.0,
                generator=torch.Generator().manual_seed(seed))
    kfac.update_statistics(X, y)
    return {"A": _unwrapped(kfac.factors.A), "G": _unwrapped(kfac.factors.G)}


def _counting_all_reduce(log):
    real = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        log.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)
    return real, all_reduce


def _fsdp_refusal(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    out = {}
    for name, make in (("KFAC", lambda: KFAC(model)),
                       ("FisherDiagonalPreconditioner", lambda: FisherDiagonalPreconditioner(model)),
                       ("HessianFree", lambda: HessianFree(model.parameters(), model))):
        try:
            make()
            out[name] = "no error"
        except ValueError as e:
            out[name] = str(e)
    return out


def rank_case(rank: int, world: int) -> dict:
    """What rank ``rank`` of ``world`` gloo processes computes (run by :mod:`curvature.gloo_ranks`)."""
    X, y, S, labels, mask = _data()
    part = torch.arange(N).tensor_split(world)[rank]
    seqs = torch.arange(NS).tensor_split(world)[rank]
    n_valid = int(((labels != -100) & mask.bool()).sum())
    log: list[int] = []
    real, counting = _counting_all_reduce(log)
    dist.all_reduce = counting
    try:
        res = {ft: _run_mlp(X[part], y[part], ft, N, world) for ft in ("empirical", "exact")}
        res["calls_mlp"] = list(log)
        res["tokens"] = _run_tokens(S[seqs], labels[seqs], mask[seqs], n_valid, world)
    finally:
        dist.all_reduce = real
    res["mc"] = _mc_factors(X[part], y[part], seed=10 + rank, world=world)
    if world == 2:
        res["fsdp"] = _fsdp_refusal(rank)
    return res


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _same_state(got, want, exact: bool):
    for key in ("A", "G", "inv"):
        assert got[key].keys() == want[key].keys()
        for k in want[key]:
            if exact:
                assert torch.equal(got[key][k], want[key][k]), (key, k)
            else:
                _close(got[key][k], want[key][k])
    if exact:
        assert torch.equal(got["params"], want["params"])
    else:
        _close(got["params"], want["params"])


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_processes_equal_one_process_on_the_whole_batch(world):
    ranks = rank_results(world, "curvature.test_kfac_distributed")
    X, y, S, labels, mask = _data()
    parts = torch.arange(N).tensor_split(world)
    assert len(parts[-1]) < len(parts[0])                                          # an uneven last batch
    n_valid = int(((labels != -100) & mask.bool()).sum())
    single = {ft: _run_mlp(X, y, ft, N) for ft in ("empirical", "exact")}
    single["tokens"] = _run_tokens(S, labels, mask, n_valid)
    for r, res in enumerate(ranks):
        for case in ("empirical", "exact", "tokens"):
            _same_state(res[case], single[case], exact=False)                     # = one process, to round-off
            _same_state(res[case], ranks[0][case], exact=True)                    # ranks bit-identical
    # one all-reduce per factor update (3 updates × 2 Fisher types), whatever the number of layers, after the ranks'
    # status (one int64 per rank: every rank is ready, none is left waiting if one fails)
    per_update = (15 + 15) + (6 + 21) + 3          # Σ_layers the triangles of G [out, out] and A [cols, cols], 3 counts
    assert ranks[0]["calls_mlp"] == [world * 8, per_update * 8] * 6        # int64 status, float64 moments
    # MC labels: each rank draws its own; the factors are the count-weighted mean of each part's one-process factors
    n = torch.tensor([len(p) for p in parts], dtype=torch.float64)
    per_part = [_mc_factors(X[p], y[p], seed=10 + r) for r, p in enumerate(parts)]
    for key in ("A", "G"):
        for k in per_part[0][key]:
            want = sum(w * f[key][k] for w, f in zip(n, per_part)) / n.sum()
            for res in ranks:
                _close(res["mc"][key][k], want)
    if world == 2:
        for res in ranks:
            for name, message in res["fsdp"].items():
                assert message.startswith(f"{name} does not support sharded parameters"), message
                assert "DistributedDataParallel" in message


def test_process_group_must_be_a_process_group():
    with pytest.raises(TypeError, match="process_group must be a torch.distributed ProcessGroup"):
        KFAC(_mlp(), process_group="gloo")
