"""The readable MGS step (``taskloss.search.mgs_reference``) against the tuned one (``taskloss.search.mgs.MGS``): the
same seeds, components, weights and update, to float rounding, over several steps and settings."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.search import MGS, mgs_step_reference
from helpers import mgs_closure


def _problem(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(48, 5, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (48,), generator=g)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype), (X, y)


def _surrogate(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _task(out, batch):
    return (out.argmax(-1) != batch[1]).to(out.dtype).mean() + 0.5 * F.cross_entropy(out, batch[1])


SETTINGS = [dict(),
            dict(include_mle=True, sigma=0.3, sigma_mode="absolute", max_update_norm=None),
            dict(mix=0.3, assignment="stratified", density="unit_sigma", alpha=0.05),
            dict(n_samples=7, max_grad_norm=0.1, lr=0.5, low_memory=True)]


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(kw) or "defaults")
def test_reference_step_equals_the_fast_step(kw):
    model, batch = _problem()
    twin = copy.deepcopy(model)
    fast_kw = {k: v for k, v in kw.items() if k != "low_memory"}
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), _task, seed=11, parallel=False, **kw)
    opt = torch.optim.SGD(twin.parameters(), lr=1.0)
    for step in range(3):
        loss = mgs.step(mgs_closure(model, _surrogate, batch))
        ref_loss, res = mgs_step_reference(twin, opt, mgs_closure(twin, _surrogate, batch), _task, seed=11, step=step,
                                           **fast_kw)
        st = mgs.last_stats
        assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-6)
        torch.testing.assert_close(st.weights, res.weights, rtol=1e-5, atol=1e-7)
        assert st.ess == pytest.approx(float(res.ess), rel=1e-5)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_reference_candidates_are_the_fast_candidates():
    """Bit for bit on the noise (one ``randn`` per tensor from each candidate's seed) and the task losses."""
    model, batch = _problem(1)
    twin = copy.deepcopy(model)
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=0.0), _task, n_samples=5, include_mle=True, seed=2,
              parallel=False, keep_deltas=True)
    mgs.step(mgs_closure(model, _surrogate, batch))
    _, res = mgs_step_reference(twin, torch.optim.SGD(twin.parameters(), lr=0.0), mgs_closure(twin, _surrogate, batch),
                                _task, seed=2, n_samples=5, include_mle=True)
    fast = torch.stack([torch.cat([d[n].reshape(-1) for n in mgs.names]) for d in mgs.last_stats.deltas])
    assert torch.equal(fast, res.samples)
