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
from taskloss.search.mgs_scoring import _scalar_loss, stack_losses
from helpers import mgs_step, with_surrogate


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
    opt = torch.optim.SGD(model.parameters(), lr=kw.pop("lr", 1.0))
    return with_surrogate(MGS(model, opt, kw.pop("task", task), **kw), surrogate)


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
        mgs = make(model, n_samples=5, include_mle=True, sigma=0.3, max_grad_norm=None)
        out[keep] = [mgs_step(mgs, batch, return_deltas=True) for _ in range(2)] + [flat(model)]
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
    mgs = make(model, n_samples=4, sigma=0.5)
    for _ in range(2):
        mgs_step(mgs, batch)
    model.double()
    twin = copy.deepcopy(model)
    fresh = make(twin, n_samples=4, sigma=0.5)
    fresh.load_state_dict(mgs.state_dict())
    batch64 = (batch[0].double(), batch[1])
    a, b = mgs_step(mgs, batch64, return_deltas=True), mgs_step(fresh, batch64, return_deltas=True)
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
        mgs = make(model, n_samples=3)
        for _ in range(3):
            mgs_step(mgs, batch)
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
        mgs = make(model, n_samples=4, parallel=False)
        stats = mgs_step(mgs, batch)
        runs.append((stats.task_losses, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    # the update is a weighted sum over candidates whose forward passes read the transposed weight through another
    # matmul kernel on some CPU code paths (ATEN_CPU_CAPABILITY=default: 7e-9 apart), so θ agrees to float32 rounding
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-7)


def test_stacked_losses_equal_the_per_candidate_conversion():
    values = [torch.tensor(0.25), torch.tensor([1.5]), torch.tensor(3.0)]
    want = torch.stack([_scalar_loss(v, "loop") for v in values])
    got = stack_losses(values, "loop")
    assert got.dtype == torch.float64 and torch.equal(got, want)
    mixed = [0.1, torch.tensor(0.2, dtype=torch.float64), 3]          # Python numbers and another dtype
    assert torch.equal(stack_losses(mixed, "loop"), torch.stack([_scalar_loss(v, "loop") for v in mixed]))
    with pytest.raises(ValueError, match="task_loss_fn must return a scalar"):
        stack_losses([torch.tensor(1.0), torch.ones(2)], "loop")


def test_a_float_task_loss_gives_the_tensor_task_losss_step():
    """task_loss_fn may return a Python float in loop mode: with a float32 model the float equals the float32
    tensor's value, so both steps agree bit for bit."""
    runs = []
    for as_float in (False, True):
        model, batch = problem()
        fn = (lambda o, b: float(task(o, b))) if as_float else task
        stats = mgs_step(make(model, n_samples=4, task=fn, parallel=False), batch)
        runs.append((stats.weights, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    # the update is a weighted sum over candidates whose forward passes read the transposed weight through another
    # matmul kernel on some CPU code paths (ATEN_CPU_CAPABILITY=default: 7e-9 apart), so θ agrees to float32 rounding
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-5, atol=1e-7)


def test_minus_inf_and_all_inf_task_losses_raise():
    model, batch = problem()
    with pytest.raises(ValueError, match="NaN or -inf"):
        mgs_step(make(model, task=lambda o, b: task(o, b) * 0 - float("inf")), batch)
    with pytest.raises(ValueError, match="every candidate has an infinite task loss"):
        mgs_step(make(model, task=lambda o, b: task(o, b) * 0 + float("inf")), batch)
    calls = []

    def some_inf(o, b):                  # +inf for one candidate: weight 0, the step goes on
        calls.append(1)
        return task(o, b) + (float("inf") if len(calls) == 2 else 0.0)

    stats = mgs_step(make(model, task=some_inf, n_samples=4), batch)
    assert float(stats.weights[1]) == 0.0 and abs(float(stats.weights.sum()) - 1.0) < 1e-12


def test_vmap_with_regenerated_noise_equals_the_loop_with_stored_rows():
    """``parallel=True, low_memory=True`` draws each candidate into a temporary chunk (views not cached: the cache
    would keep the temporary alive); the loop with stored rows uses the kept buffers and cached views. Same seeds:
    same losses to float rounding (batched vs single forwards) and the same update."""
    runs = []
    for kw in (dict(parallel=True, low_memory=True, chunk_size=3), dict(parallel=False)):
        model, batch = problem()
        stats = mgs_step(make(model, n_samples=5, include_mle=True, **kw), batch)
        runs.append((stats.task_losses, stats.log_q, flat(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-12, atol=0)     # float64 sums, same numbers
    torch.testing.assert_close(runs[0][2], runs[1][2], rtol=1e-5, atol=1e-6)


def test_small_models_candidate_buffer_writes_the_per_tensor_adds_numbers(monkeypatch):
    """Below ``ROW_BLOCK`` parameters the loop forms every θ + Δθ_k in one add into a kept [n, P] buffer and
    copies each candidate in with one foreach call; above it, one add per tensor into the module. Lowering
    ``ROW_BLOCK`` sends the same model down the per-tensor path (and the row-by-row draw, bit-identical to the
    batched one): the candidates' task losses (a continuous loss here) agree bit for bit, the parameters after
    the step to float rounding (the float64 noise statistics are reduced in other orders)."""
    runs = []
    for block in (None, 128):
        if block is not None:
            monkeypatch.setattr(noise_module.CandidateDraws, "ROW_BLOCK", block)
        model, batch = problem()
        assert sum(p.numel() for p in model.parameters()) < noise_module.CandidateDraws.ROW_BLOCK or block
        mgs = make(model, n_samples=5, include_mle=True, sigma=0.3, parallel=False)
        stats = [mgs_step(mgs, batch) for _ in range(2)]
        runs.append(([s.task_losses for s in stats], flat(model)))
    for a, b in zip(runs[0][0], runs[1][0]):
        assert torch.equal(a, b)
    torch.testing.assert_close(runs[0][1], runs[1][1], rtol=1e-6, atol=1e-7)


class _KeepsEvalFlag(nn.Sequential):
    """A module that overrides ``train`` (as some libraries do to keep a part frozen): MGS must go through it."""

    def train(self, mode: bool = True):
        super().train(mode)
        self[1].training = False          # the dropout stays off whatever the mode
        return self


@pytest.mark.parametrize("override,all_eval", [(False, False), (True, False), (False, True)])
def test_scoring_restores_every_submodules_own_training_flag(override, all_eval):
    """Candidates are scored in eval mode; after the step (and after reading the lazy ``base_loss``) every
    submodule is back in its own mode — a frozen, eval-mode submodule inside a training model stays frozen (a
    plain ``model.train(was_training)`` would switch it back on). Also through a module overriding ``train``."""
    torch.manual_seed(0)
    cls = _KeepsEvalFlag if override else nn.Sequential
    model = cls(nn.Linear(37, 16), nn.Dropout(0.5), nn.BatchNorm1d(16), nn.Linear(16, 3))
    model.train()
    model[2].eval()                       # frozen normalization statistics
    if all_eval:                          # nothing to switch: left alone
        model.eval()
    seen = []

    def task_checking_mode(out, batch):
        seen.append([m.training for m in model.modules()])
        return task(out, batch)

    before = [m.training for m in model.modules()]
    mgs = make(model, n_samples=3, task=task_checking_mode, parallel=False)
    _, batch = problem()
    stats = mgs_step(mgs, batch)
    assert [m.training for m in model.modules()] == before
    assert seen and all(not any(flags) for flags in seen)          # every candidate scored in eval mode
    stats.base_loss
    assert [m.training for m in model.modules()] == before


def test_python_float_density_and_weights_equal_the_tensor_formulas():
    """The step combines its K × T statistics on Python floats (``log_q_floats``, ``log_weights_floats``); the
    tensor formulas (``log_q_from_sq`` and ``sampling.normalized_log_weights``, behind ``mixture_log_density`` and
    ``mgs_weights``) give the same numbers to float64 rounding, for both densities, λ ∈ {0, 0.3, 1} and a +inf
    loss; σ_t = 0 is left to the tensor formula (``None``)."""
    from taskloss.sampling import normalized_log_weights
    from taskloss.search.mgs_density import log_q_floats, log_q_from_sq, log_weights_floats

    g = torch.Generator().manual_seed(3)
    numel = [4096.0, 64.0, 640.0, 10.0]
    sig = (torch.rand(4, generator=g, dtype=torch.float64) * 0.01 + 1e-3)
    d0 = torch.rand(6, 4, generator=g, dtype=torch.float64) * sig ** 2 * torch.tensor(numel, dtype=torch.float64)
    d1 = d0 * (1 + torch.rand(6, 4, generator=g, dtype=torch.float64))
    for density in ("mixture", "unit_sigma"):
        for mix in (0.0, 0.3, 1.0):
            want = log_q_from_sq(d0, d1, sig, torch.tensor(numel, dtype=torch.float64), mix, density)
            got = log_q_floats(d0.tolist(), d1.tolist(), sig.tolist(), numel, mix, density)
            torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want, rtol=1e-13, atol=0)
    assert log_q_floats(d0.tolist(), d1.tolist(), [0.0, 1.0, 1.0, 1.0], numel, 0.5, "mixture") is None
    L = torch.tensor([0.3, 0.1, float("inf"), 0.2, 0.1, 0.5], dtype=torch.float64)
    lq = torch.randn(6, generator=g, dtype=torch.float64) * 50
    want = normalized_log_weights(-(L - 0.1) / 0.01, lq)
    got = torch.tensor(log_weights_floats(L.tolist(), lq.tolist(), 0.01, 0.1), dtype=torch.float64)
    assert got[2] == -float("inf") and want[2] == -float("inf")
    keep = torch.isfinite(want)
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-12, atol=1e-12)
