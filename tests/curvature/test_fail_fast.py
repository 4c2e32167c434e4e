"""Failing fast across ranks (issue 41): one of 3 gloo ranks cannot form its statistics — every label ignored, a NaN
input, targets of the wrong shape, a NaN loss — and every rank raises the same ``RankFailure`` naming that rank within
seconds (the ranks agree on a status before the all-reduce), for K-FAC, the Fisher family, Hessian-free, MeZO and
MGS; the group still works afterwards. The processes are those of :mod:`curvature.gloo_ranks` (one spawn for every module)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from curvature.gloo_ranks import TIMEOUT, rank_results
from torch import nn

from taskloss.curvature import KFAC, HessianFree, empirical_fisher, ggn_diagonal, nll_loss
from taskloss.curvature.distributed import RankFailure
from taskloss.search import MGS, MeZO

BAD = 1                       # the rank that fails


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _batch(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(3, 6, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (3, 6), generator=g)


def _outcome(fn) -> dict:
    """What ``fn()`` did on this rank: the error's type and message, and the seconds it took."""
    start = time.perf_counter()
    try:
        fn()
        return {"error": None, "seconds": time.perf_counter() - start}
    except Exception as e:     # noqa: BLE001 - what each rank raised is the result
        return {"error": type(e).__name__, "message": str(e), "seconds": time.perf_counter() - start}


def _kfac_update(X, y):
    model = _model()
    k = KFAC(model, fisher_type="empirical")
    k.update_statistics(X, y, outputs=model(X))


def _hessian_free_step(X, y, nan):
    model = _model()
    opt = HessianFree(model.parameters(), model, adapt_damping=False)

    def closure():
        opt.zero_grad()
        loss = nll_loss(model(X), y)
        loss.backward()
        return (loss * float("nan") if nan else loss), X
    opt.step(closure)


def _mezo_step(X, y):
    model = _model()
    opt = MeZO(model.parameters(), lr=0.1, sigma=1e-3, seed=0)
    opt.step(lambda: F.cross_entropy(model(X.reshape(-1, 4)), y.reshape(-1)))


def _mgs_step(X, y, bad):
    model = _model()
    task = (lambda out, b: F.cross_entropy(out, b[1][:-1])) if bad else (lambda out, b: F.cross_entropy(out, b[1]))
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, seed=1)
    batch = (X.reshape(-1, 4), y.reshape(-1))

    def closure():
        mgs.zero_grad()
        loss = F.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        return loss, batch
    mgs.step(closure)


def _cases(rank: int) -> dict:
    X, y = _batch(rank)
    bad = rank == BAD
    masked = torch.full_like(y, -100) if bad else y
    nan_x = X.clone()
    if bad:
        nan_x[0, 0, 0] = float("nan")
    return {
        "kfac all ignored": lambda: _kfac_update(X, masked),
        "kfac nan input": lambda: _kfac_update(nan_x, y),
        "kfac wrong target shape": lambda: _kfac_update(X, y[:, :-1] if bad else y),
        "ggn_diagonal nothing left": lambda: ggn_diagonal(_model(), None, X,
                                                          mask=torch.zeros_like(y, dtype=torch.bool) if bad else None),
        "empirical_fisher all ignored": lambda: empirical_fisher(_model(), None, X, masked),
        "hessian_free nan loss": lambda: _hessian_free_step(X, y, bad),
        "mezo closure error": lambda: _mezo_step(X, y[:, :-1] if bad else y),
        "mgs task loss error": lambda: _mgs_step(X, y, bad),
        "kfac afterwards": lambda: _kfac_update(X, y),
    }


def rank_case(rank: int, world: int) -> dict:
    """Per case, what rank ``rank`` of 3 gloo processes raised (run by :mod:`curvature.gloo_ranks`)."""
    if world != 3:
        return {}
    return {name: _outcome(fn) for name, fn in _cases(rank).items()}


@pytest.mark.parametrize("case,reason", [("kfac all ignored", "no loss term left"),
                                         ("kfac nan input", "NaN or inf"),
                                         ("kfac wrong target shape", "shapes that do not match"),
                                         ("ggn_diagonal nothing left", "no loss term left"),
                                         ("empirical_fisher all ignored", "no loss term left"),
                                         ("hessian_free nan loss", "NaN or inf"),
                                         ("mezo closure error", "shapes that do not match"),
                                         ("mgs task loss error", "shapes that do not match")])
def test_one_failing_rank_makes_every_rank_raise_the_same_error_in_seconds(case, reason):
    ranks = [r[case] for r in rank_results(3, "curvature.test_fail_fast")]
    messages = {r["message"] for r in ranks if r["error"] is not None}
    assert [r["error"] for r in ranks] == [RankFailure.__name__] * 3, ranks
    assert len(messages) == 1, messages                                             # the same error everywhere
    message = messages.pop()
    assert f"rank {BAD} " in message and reason in message and "rank 0 " not in message, message
    assert max(r["seconds"] for r in ranks) < min(10.0, TIMEOUT.total_seconds() / 2), ranks


def test_the_group_still_works_after_a_failure():
    ranks = [r["kfac afterwards"] for r in rank_results(3, "curvature.test_fail_fast")]
    assert [r["error"] for r in ranks] == [None] * 3, ranks
