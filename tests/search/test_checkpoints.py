"""Optimizer-like classes of ``taskloss.search`` checkpoint as ``torch.optim`` does: train k steps, save, restore into
fresh objects (new model, new optimizer, new MGS/MeZO built with other seeds), continue — the parameters and the
per-step diagnostics are bit-identical to an uninterrupted run in the same process."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.search import MGS, MeZO
from helpers import mgs_step, with_surrogate

K_BEFORE, K_AFTER = 3, 3


def CE(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(32, 5, generator=g)
    return X, (X[:, 0] > 0).long()


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 2))


def _mgs(model, seed, **kw):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    task = lambda out, b: (out.argmax(-1) != b[1]).to(out.dtype).mean() + 0.1 * F.cross_entropy(out, b[1])  # noqa
    mgs = with_surrogate(MGS(model, opt, task, n_samples=4, alpha=0.05, sigma=0.5, seed=seed, **kw), CE)
    return mgs, opt


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("kw", [dict(parallel=False), dict(parallel=True, chunk_size=3),
                                dict(parallel=False, low_memory=True, include_mle=True),
                                dict(parallel=False, seed=None)])
def test_mgs_resumes_bit_identically(kw):
    batch = _data()
    seed = kw.pop("seed", 11)
    model = _model(0)
    torch.manual_seed(123)                      # the dropout masks of the surrogate come from torch's global RNG
    mgs, opt = _mgs(model, seed, **kw)
    for _ in range(K_BEFORE):
        mgs_step(mgs, batch)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "mgs": mgs.state_dict(),
                           "rng": torch.get_rng_state()})
    straight = [mgs_step(mgs, batch).weights for _ in range(K_AFTER)]

    fresh = _model(99)                          # another initialization, another MGS seed: all overwritten
    mgs2, opt2 = _mgs(fresh, None if seed is None else seed + 1000, **kw)
    fresh.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    mgs2.load_state_dict(saved["mgs"])
    torch.set_rng_state(saved["rng"])
    resumed = [mgs_step(mgs2, batch).weights for _ in range(K_AFTER)]
    assert torch.equal(_flat(fresh), _flat(model))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    assert mgs2.steps_done == mgs.steps_done == K_BEFORE + K_AFTER


def test_mgs_state_dict_keeps_a_fallback_mode():
    batch = _data()

    def python_task(out, b):                    # .item(): vmap cannot trace it, "auto" falls back
        return float((out.argmax(-1) != b[1]).sum().item()) / len(b[1])

    model = _model(0)
    mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), python_task, n_samples=3, seed=0,
                             parallel=True), CE)
    with pytest.warns(RuntimeWarning, match="falling back"):
        mgs_step(mgs, batch)
    other = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), python_task, n_samples=3, seed=5,
                               parallel=True), CE)
    other.load_state_dict(mgs.state_dict())
    assert other.mode == mgs.mode == "vmap_forward"


def _mezo_run(model, opt, batch, steps):
    X, Y = batch
    losses = []
    for _ in range(steps):
        losses.append(opt.step(lambda: F.mse_loss(model(X).squeeze(-1), Y.float())))
    return losses


@pytest.mark.parametrize("n_samples,weight_decay", [(1, 0.0), (3, 1e-3)])
def test_mezo_resumes_bit_identically(n_samples, weight_decay):
    batch = _data()
    torch.manual_seed(0)
    model = nn.Linear(5, 1)
    opt = MeZO(model.parameters(), lr=1e-2, sigma=1e-3, seed=7, n_samples=n_samples,
               weight_decay=weight_decay)
    _mezo_run(model, opt, batch, K_BEFORE)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    straight = _mezo_run(model, opt, batch, K_AFTER)

    torch.manual_seed(1)
    fresh = nn.Linear(5, 1)
    opt2 = MeZO(fresh.parameters(), lr=1e-2, sigma=1e-3, seed=1234, n_samples=1, weight_decay=weight_decay)
    fresh.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[0]["n_samples"] == n_samples
    resumed = _mezo_run(fresh, opt2, batch, K_AFTER)
    assert torch.equal(_flat(fresh), _flat(model))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    # without the generator state the continuation differs: the state_dict is what makes the resume exact
    opt3 = MeZO(fresh.parameters(), lr=1e-2, sigma=1e-3, seed=1234, n_samples=n_samples,
                weight_decay=weight_decay)
    fresh.load_state_dict(saved["model"])
    plain = dict(saved["opt"])
    plain.pop("mezo")
    torch.optim.Optimizer.load_state_dict(opt3, plain)
    _mezo_run(fresh, opt3, batch, K_AFTER)
    assert not torch.equal(_flat(fresh), _flat(model))
