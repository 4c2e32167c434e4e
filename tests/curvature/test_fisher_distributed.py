"""The Fisher family and Hessian-free under torch.distributed: 2 and 3 gloo processes on CPU, each holding its part
of the batch (the last part shorter), get the dense and diagonal curvatures, the GGN-vector products, the diagonal
preconditioner's, Hessian-free's and the natural gradient's steps of one process on the whole batch to float64
round-off, masks and ignored labels included, and bit-identical results on every rank."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from curvature.gloo_ranks import rank_results
from taskloss.curvature import (
    FisherDiagonalPreconditioner,
    HessianFree,
    NaturalGradientDescent,
    empirical_fisher,
    empirical_fisher_diagonal,
    ggn_diagonal,
    ggn_matrix,
    ggn_operator,
    mc_fisher_diagonal,
)

N = 11                       # 2 ranks: 6 + 5 rows; 3 ranks: 4 + 4 + 3
NS, T = 5, 4


def _data():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(N, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (N,), generator=g)
    S = torch.randn(NS, T, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (NS, T), generator=g)
    labels[0, 2:] = -100
    mask = torch.ones(NS, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[4, 2:] = False
    v = torch.randn(sum(p.numel() for p in _mlp().parameters()), generator=g, dtype=torch.float64)
    return X, y, S, labels, mask, v


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _statistics(X, y, S, labels, mask, v):
    model = _mlp()
    torch.manual_seed(2)
    token_model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    return {"ggn_diag": ggn_diagonal(model, None, X),
            "ggn": ggn_matrix(model, None, X),
            "ef": empirical_fisher(model, None, X, y),
            "ef_diag_tokens": empirical_fisher_diagonal(token_model, None, S, labels, mask=mask),
            "ggn_v": ggn_operator(model, None, X)(v)}


def _diagonal_steps(X, y, world):
    model = _mlp()
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pre = FisherDiagonalPreconditioner(model, "empirical", damping=1e-2, decay=0.5, power=0.5)
    for _ in range(2):
        opt.zero_grad()
        (F.cross_entropy(net(X), y, reduction="sum") * world / N).backward()
        pre.update_statistics(X, y)
        pre.precondition_()
        opt.step()
    return _flat(model)


def _hessian_free_steps(X, y):
    model = _mlp()
    opt = HessianFree(model.parameters(), model, lr=1.0, damping=0.5, cg_iters=5)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        return loss, X
    losses = []
    for _ in range(3):
        opt.step(closure)
        losses.append(opt.last_info["loss"])               # the whole batch's loss (step returns the closure's)
    return {"params": _flat(model), "damping": opt.param_groups[0]["damping"], "accepted": opt.last_info["accepted"],
            "direction": opt.state[next(model.parameters())]["direction"], "losses": losses}


def _natural_gradient_steps(X, y, world):
    model = _mlp()
    net = DDP(model) if world > 1 else model
    opt = NaturalGradientDescent(model.parameters(), lambda: ggn_matrix(model, None, X), lr=0.5, damping=1e-2)
    for _ in range(2):
        opt.zero_grad()
        (F.cross_entropy(net(X), y, reduction="sum") * world / N).backward()
        opt.step()
    return _flat(model)


def _all(X, y, S, labels, mask, v, world=1):
    return {"stats": _statistics(X, y, S, labels, mask, v), "diagonal": _diagonal_steps(X, y, world),
            "hf": _hessian_free_steps(X, y), "ngd": _natural_gradient_steps(X, y, world)}


def rank_case(rank: int, world: int) -> dict:
    """What rank ``rank`` of ``world`` gloo processes computes (run by :mod:`curvature.gloo_ranks`)."""
    X, y, S, labels, mask, v = _data()
    part = torch.arange(N).tensor_split(world)[rank]
    seqs = torch.arange(NS).tensor_split(world)[rank]
    res = _all(X[part], y[part], S[seqs], labels[seqs], mask[seqs], v, world)
    res["mc"] = mc_fisher_diagonal(_mlp(), None, X[part], generator=torch.Generator().manual_seed(10 + rank))
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)
    dist.all_reduce = counting
    try:
        op = ggn_operator(_mlp(), None, X[part])
        for _ in range(3):
            op(v)
    finally:
        dist.all_reduce = real
    res["operator_calls"] = calls
    return res


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _compare(got, want, exact: bool):
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _compare(got[k], want[k], exact)
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want) if exact else _close(got, want) is None
    elif exact:
        assert got == want
    else:
        assert got == pytest.approx(want, rel=1e-10, abs=1e-12)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_gloo_processes_equal_one_process_on_the_whole_batch(world):
    ranks = rank_results(world, "curvature.test_fisher_distributed")
    data = _data()
    X = data[0]
    parts = torch.arange(N).tensor_split(world)
    assert len(parts[-1]) < len(parts[0])                                          # an uneven last batch
    single = _all(*data)
    for res in ranks:
        for key in single:
            _compare(res[key], single[key], exact=False)                          # = one process, to round-off
            _compare(res[key], ranks[0][key], exact=True)                         # bit-identical ranks
        # the ranks' status (one number per rank), the term count, the products
        assert res["operator_calls"] == [world, 1] + [sum(p.numel() for p in _mlp().parameters())] * 3
    n = torch.tensor([len(p) for p in parts], dtype=torch.float64)
    per_part = [mc_fisher_diagonal(_mlp(), None, X[p], generator=torch.Generator().manual_seed(10 + r))
                for r, p in enumerate(parts)]
    want = sum(w * d for w, d in zip(n, per_part)) / n.sum()
    for res in ranks:
        _close(res["mc"], want)


def test_process_group_and_wrappers_are_checked():
    model = _mlp()
    with pytest.raises(TypeError, match="process_group must be"):
        ggn_diagonal(model, None, torch.zeros(2, 4, dtype=torch.float64), process_group=1)
    with pytest.raises(TypeError, match="process_group must be"):
        FisherDiagonalPreconditioner(model, process_group="world")
    with pytest.raises(TypeError, match="process_group must be"):
        HessianFree(model.parameters(), model, process_group="world")
