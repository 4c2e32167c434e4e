"""MGS (taskloss.search.mgs) step internals that exist for speed: views of the kept buffers built once per layout
(and rebuilt when a buffer is replaced), the batched draw with and without its kept float64 chunk, task losses
stacked once, candidates written into non-contiguous parameters, and the -inf / all-inf checks of the weights made
on Python floats. Each path is compared with a reference: another path of the same code that must agree bit for
bit, or a direct computation."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskloss.search.mgs_noise as noise_module
from taskloss.search import MGS
from taskloss.search.mgs_scoring import _scalar_loss, _stack_losses


def problem(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(40, 37, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (40,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(37, 70), nn.Tanh(), nn.Linear(70, 130), nn.Tanh(), nn.Linear(130, 3)).to(dtype)
    return model, (X, y)


def surrogate(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def task(out, batch):
    return 3.0 * F.cross_entropy(out, batch[1])


def make(model, **kw):
    kw.setdefault("seed", 7)
    return MGS(model, torch.optim.SGD(model.parameters(), lr=kw.pop("lr", 1.0)), surrogate, kw.pop("task", task),
               **kw)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_batched_draw_is_bit_identical_with_and_without_the_kept_float64_chunk(monkeypatch):
    """On a CPU the batched draw keeps its float64 chunk (and the views into it) in the plan; on a GPU it takes a
    temporary per chunk. Forcing the GPU's way on a CPU gives the same Δθ_k bit for bit and the same statistics
    (same kernels on the same numbers)."""
    out = {}
    for keep in (True, False):
        monkeypatch.setattr(noise_module.CandidateDraws, "KEEP_CHUNK64", keep)
        model, batch = problem()
        mgs = make(model, K=5, include_mle=True, sigma=0.3, max_grad_norm=None)
        out[keep] = [mgs.step(batch, return_deltas=True) for _ in range(2)] + [flat(model)]
    for a, b in zip(out[True][:2], out[False][:2]):
        for da, db in zip(a.deltas, b.deltas):
            for name in da:
                assert torch.equal(da[name], db[name]), name
        torch.testing.assert_close(a.log_q, b.log_q, rtol=1e-13, atol=0)   # float64 sums: same kernels
    torch.testing.assert_close(out[True][2], out[False][2], rtol=1e-6, atol=1e-7)


def test_cached_views_are_rebuilt_when_the_buffers_change():
    """Views of the plan's buffers are reused while the buffers are the same tensors. Converting the model to
    float64 between steps replaces every buffer (new dtype): the next step must equal a fresh MGS with the same
    state on a float64 copy — stale views would write into the old float32 buffers."""
    model, batch = problem()
    mgs = make(model, K=4, sigma=0.5)
    for _ in range(2):
        mgs.step(batch)
    model.double()
    twin = copy.deepcopy(model)
    fresh = make(twin, K=4, sigma=0.5)
    fresh.load_state_dict(mgs.state_dict())
    batch64 = (batch[0].double(), batch[1])
    a, b = mgs.step(batch64, return_deltas=True), fresh.step(batch64, return_deltas=True)
    assert a.seeds == b.seeds
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)
    torch.testing.assert_close(flat(model), flat(twin), rtol=0, atol=0)
    assert all(p.grad.dtype == torch.float64 for p in model.parameters())


def test_gradients_set_to_none_between_steps_are_set_again():
    """``p.grad`` are views of the kept update buffer, set once; ``zero_grad(set_to_none=True)`` between steps
    drops them, and the next step must set them again (same trajectory as without it)."""
    runs = []
    for drop in (False, True):
        model, batch = problem()
        mgs = make(model, K=3)
        for _ in range(3):
            mgs.step(batch)
            if drop:
                mgs.optimizer.zero_grad(set_to_none=True)
        runs.append(flat(model))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_loop_writes_candidates_into_non_contiguous_parameters():
    """θ + Δθ_k is written by ``torch.add(..., out=p)`` per tensor; with a transposed (non-contiguous) weight the
    candidate losses, the update and the restored θ equal those of the same model with contiguous weights."""
    runs = []
    for transpose in (False, True):
        model, batch = problem()
        if transpose:
            w = model[2].weight.detach()
            model[2].weight = nn.Parameter(w.t().contiguous().t())        # same values, strides (1, 70)
            assert not model[2].weight.is_contiguous()
        mgs = make(model, K=4, parallel=False)
        stats = mgs.step(batch)
        runs.append((stats.task_losses, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=0, atol=0)


def test_stacked_losses_equal_the_per_candidate_conversion():
    values = [torch.tensor(0.25), torch.tensor([1.5]), torch.tensor(3.0)]
    want = torch.stack([_scalar_loss(v, "loop") for v in values])
    got = _stack_losses(values, "loop")
    assert got.dtype == torch.float64 and torch.equal(got, want)
    mixed = [0.1, torch.tensor(0.2, dtype=torch.float64), 3]          # Python numbers and another dtype
    assert torch.equal(_stack_losses(mixed, "loop"), torch.stack([_scalar_loss(v, "loop") for v in mixed]))
    with pytest.raises(ValueError, match="task_loss_fn must return a scalar"):
        _stack_losses([torch.tensor(1.0), torch.ones(2)], "loop")


def test_a_float_task_loss_gives_the_tensor_task_losss_step():
    """task_loss_fn may return a Python float in loop mode: with a float32 model the float equals the float32
    tensor's value, so both steps agree bit for bit."""
    runs = []
    for as_float in (False, True):
        model, batch = problem()
        fn = (lambda o, b: float(task(o, b))) if as_float else task
        stats = make(model, K=4, task=fn, parallel=False).step(batch)
        runs.append((stats.weights, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=0, atol=0)


def test_minus_inf_and_all_inf_task_losses_raise():
    model, batch = problem()
    with pytest.raises(ValueError, match="NaN or -inf"):
        make(model, task=lambda o, b: task(o, b) * 0 - float("inf")).step(batch)
    with pytest.raises(ValueError, match="every candidate has an infinite task loss"):
        make(model, task=lambda o, b: task(o, b) * 0 + float("inf")).step(batch)
    calls = []

    def some_inf(o, b):                  # +inf for one candidate: weight 0, the step goes on
        calls.append(1)
        return task(o, b) + (float("inf") if len(calls) == 2 else 0.0)

    stats = make(model, task=some_inf, K=4).step(batch)
    assert float(stats.weights[1]) == 0.0 and abs(float(stats.weights.sum()) - 1.0) < 1e-12


def test_vmap_with_regenerated_noise_equals_the_loop_with_stored_rows():
    """``parallel=True, low_memory=True`` draws each candidate into a temporary chunk (views not cached: the cache
    would keep the temporary alive); the loop with stored rows uses the kept buffers and cached views. Same seeds:
    same losses to float rounding (batched vs single forwards) and the same update."""
    runs = []
    for kw in (dict(parallel=True, low_memory=True, chunk_size=3), dict(parallel=False)):
        model, batch = problem()
        stats = make(model, K=5, include_mle=True, **kw).step(batch)
        runs.append((stats.task_losses, stats.log_q, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-12, atol=0)     # float64 sums, same numbers
    torch.testing.assert_close(runs[0][2], runs[1][2], rtol=1e-5, atol=1e-6)
