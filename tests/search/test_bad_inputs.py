"""Bad input across ``taskloss.search``'s public API: every name in ``__all__`` is walked with NaN, empty,
wrong-shape, wrong-dtype and out-of-range inputs and must raise a clear exception (type and message); a step
that fails leaves the model's parameters as they were; extreme but valid input gives finite output."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taskloss.search as S
from group_cases import GROUP_CASES, GROUP_EXEMPT
from helpers import mgs_step, with_surrogate

NAN, INF = float("nan"), float("inf")


def _mgs(**kw):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    task = kw.pop("task", lambda out, b: F.cross_entropy(out, b[1]))
    kw = {"n_samples": 3, "seed": 0, **kw}
    return with_surrogate(S.MGS(model, opt, task, **kw), lambda m, b: F.cross_entropy(m(b[0]), b[1])), model


X, Y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1] * 4)
LOGITS, TARGET = torch.randn(3, 4), torch.tensor([0, 1, 2])
QUAD = lambda t: (t ** 2).sum()  # noqa: E731
THETA = torch.randn(3)
MIXED = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())


def _mezo(**kw):
    lin = nn.Linear(2, 1)
    return S.MeZO(lin.parameters(), **kw), lin


def _mezo_step(closure_value):
    opt, _ = _mezo()
    return opt.step(lambda: closure_value)


def _mezo_lr_changed():
    opt, lin = _mezo()
    opt.param_groups[0]["lr"] = -1.0           # changed after construction: rechecked at each step
    return opt.step(lambda: lin(torch.ones(1, 2)).sum())


def _mezo_changing_weight():
    opt, lin = _mezo()
    sizes = iter([4, 5])
    return opt.step(lambda: (lin(torch.ones(1, 2)).sum(), next(sizes)))


# name -> [(category, thunk, exception type, message regex)]
CASES = {
    "MGS": [
        ("out-of-range n_samples", lambda: _mgs(n_samples=0), ValueError, "n_samples must be >= 1"),
        ("wrong-dtype n_samples", lambda: _mgs(n_samples=True), TypeError, "n_samples must be an int"),
        ("NaN alpha", lambda: _mgs(alpha=NAN), ValueError, "alpha must be > 0"),
        ("out-of-range sigma", lambda: _mgs(sigma=INF), ValueError, "sigma must be > 0 and finite"),
        ("NaN mix", lambda: _mgs(mix=NAN), ValueError, r"mix must lie in \[0, 1\]"),
        ("wrong-value parallel", lambda: _mgs(parallel="yes"), ValueError, "parallel must be True, False or 'auto'"),
        ("wrong-dtype parameters", lambda: S.MGS(MIXED, torch.optim.SGD(MIXED.parameters(), lr=1), F.mse_loss),
         ValueError, "share one floating dtype"),
        ("out-of-range optimizer", lambda: S.MGS(nn.Linear(3, 2), torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1),
                                                 F.mse_loss), ValueError, "does not hold the model's trainable"),
        ("NaN batch", lambda: mgs_step(_mgs()[0], (torch.full((8, 3), NAN), Y)), ValueError,
         "surrogate loss is not finite"),
        ("empty batch", lambda: mgs_step(_mgs()[0], (X[:0], Y[:0])), ValueError, "surrogate loss is not finite"),
        ("NaN task loss", lambda: mgs_step(_mgs(task=lambda o, b: o.sum() * NAN)[0], (X, Y)), ValueError,
         "task loss is NaN"),
        ("wrong-shape task loss", lambda: mgs_step(_mgs(task=lambda o, b: o.sum(0))[0], (X, Y)), ValueError,
         "scalar per candidate"),
        ("wrong-shape surrogate", lambda: _mgs()[0].step(lambda: (_mgs()[1](X), (X, Y))),
         ValueError, "scalar surrogate loss"),
        ("out-of-range state", lambda: _mgs()[0].load_state_dict({"mgs": {"seed": -1, "steps_done": 0},
                                                                 "optimizer": {}}), ValueError,
         "seed must be >= 0"),
        ("empty state", lambda: _mgs()[0].load_state_dict({}), ValueError, "not an MGS state_dict"),
    ],
    "mixture_log_density": [
        ("empty K", lambda: S.mixture_log_density(torch.zeros(0, 3), torch.zeros(3), 1.0), ValueError,
         "no candidate"),
        ("empty list", lambda: S.mixture_log_density([], [], 1.0), ValueError, "same non-zero number"),
        ("wrong-dtype delta", lambda: S.mixture_log_density(torch.zeros(3, dtype=torch.long), torch.zeros(3), 1.0),
         TypeError, "floating tensor"),
        ("wrong-shape delta", lambda: S.mixture_log_density(torch.zeros(4), torch.zeros(3), 1.0), ValueError,
         "has shape"),
        ("NaN delta", lambda: S.mixture_log_density(torch.full((3,), NAN), torch.zeros(3), 1.0), ValueError,
         "NaN or inf"),
        ("NaN sigma", lambda: S.mixture_log_density(torch.zeros(3), torch.zeros(3), NAN), ValueError,
         "sigma must be finite"),
        ("wrong-dtype sigma", lambda: S.mixture_log_density(torch.zeros(3), torch.zeros(3), "1"), TypeError,
         "sigma must be a number"),
        ("out-of-range mix", lambda: S.mixture_log_density(torch.zeros(3), torch.zeros(3), 1.0, 2.0), ValueError,
         r"mix must lie in \[0, 1\]"),
    ],
    "mgs_weights": [
        ("NaN losses", lambda: S.mgs_weights(torch.tensor([NAN]), 0.0, torch.zeros(1), 1.0), ValueError, "NaN"),
        ("empty", lambda: S.mgs_weights(torch.zeros(0), 0.0, torch.zeros(0), 1.0), ValueError, "non-empty 1-D"),
        ("wrong-shape log_q", lambda: S.mgs_weights(torch.zeros(2), 0.0, torch.zeros(3), 1.0), ValueError,
         "log_q must have shape"),
        ("wrong-dtype losses", lambda: S.mgs_weights(["a"], 0.0, torch.zeros(1), 1.0), TypeError,
         "task_losses must be real numbers"),
        ("wrong-dtype base", lambda: S.mgs_weights(torch.zeros(1), "x", torch.zeros(1), 1.0), TypeError,
         "base_loss must be real numbers"),
        ("out-of-range log_q", lambda: S.mgs_weights(torch.zeros(2), 0.0, torch.tensor([0.0, -INF]), 1.0),
         ValueError, "log_q must be finite"),
        ("out-of-range alpha", lambda: S.mgs_weights(torch.zeros(2), 0.0, torch.zeros(2), 0.0), ValueError,
         "alpha must be > 0"),
    ],
    "default_forward": [
        ("wrong-type batch", lambda: S.default_forward(nn.Linear(2, 2), "batch"), TypeError, "pass forward_fn"),
        ("empty batch", lambda: S.default_forward(nn.Linear(2, 2), ()), TypeError, "pass forward_fn"),
    ],
    "reinforce_loss": [
        ("NaN logprobs", lambda: S.reinforce_loss(torch.tensor([NAN, 1.0]), torch.ones(2)), ValueError,
         "logprobs contains NaN"),
        ("NaN rewards", lambda: S.reinforce_loss(torch.zeros(2), torch.tensor([NAN, 1.0])), ValueError,
         "rewards contains NaN"),
        ("empty", lambda: S.reinforce_loss(torch.zeros(0), torch.zeros(0)), ValueError, "empty"),
        ("wrong-shape", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(4)), ValueError, "shape"),
        ("wrong-dtype rewards", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(3, dtype=torch.long)),
         TypeError, "floating-point"),
        ("wrong-dtype baseline", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(3), True), TypeError,
         "baseline must be"),
        ("NaN baseline", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(3), NAN), ValueError,
         "baseline must be finite"),
        ("wrong-shape baseline", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(3), torch.zeros(2)),
         ValueError, "does not broadcast"),
        ("out-of-range reduction", lambda: S.reinforce_loss(torch.zeros(3), torch.zeros(3), reduction="max"),
         ValueError, "reduction must be"),
    ],
    "leave_one_out_baseline": [
        ("NaN", lambda: S.leave_one_out_baseline(torch.tensor([1.0, NAN])), ValueError, "NaN"),
        ("empty", lambda: S.leave_one_out_baseline(torch.ones(0, 2)), ValueError, "at least 2 samples"),
        ("wrong-dtype", lambda: S.leave_one_out_baseline(torch.ones(3, dtype=torch.long)), TypeError,
         "floating-point"),
        ("out-of-range dim", lambda: S.leave_one_out_baseline(torch.ones(3, 2), dim=2), ValueError,
         "out of range"),
        ("wrong-shape scalar", lambda: S.leave_one_out_baseline(torch.tensor(1.0)), ValueError, "out of range"),
    ],
    "MovingAverageBaseline": [
        ("out-of-range momentum", lambda: S.MovingAverageBaseline(1.0), ValueError, r"\[0, 1\)"),
        ("NaN momentum", lambda: S.MovingAverageBaseline(NAN), ValueError, "finite"),
        ("NaN rewards", lambda: S.MovingAverageBaseline()(torch.tensor([NAN])), ValueError, "NaN"),
        ("empty rewards", lambda: S.MovingAverageBaseline()(torch.zeros(0)), ValueError, "empty"),
        ("wrong-dtype rewards", lambda: S.MovingAverageBaseline()(torch.zeros(2, dtype=torch.long)), TypeError,
         "floating-point"),
        ("out-of-range state", lambda: S.MovingAverageBaseline().load_state_dict({"momentum": 2.0, "value": 1.0}),
         ValueError, r"\[0, 1\)"),
        ("NaN state", lambda: S.MovingAverageBaseline().load_state_dict({"momentum": 0.5, "value": NAN}),
         ValueError, "finite"),
    ],
    "expected_reward": [
        ("NaN", lambda: S.expected_reward(torch.tensor([[NAN, 1.0]]), torch.ones(1, 2)), ValueError, "NaN"),
        ("NaN table", lambda: S.expected_reward(torch.zeros(2, 2), torch.full((2, 2), NAN)), ValueError,
         "reward_table contains NaN"),
        ("empty", lambda: S.expected_reward(torch.zeros(0, 2), torch.zeros(0, 2)), ValueError, "empty"),
        ("wrong-shape", lambda: S.expected_reward(torch.zeros(2, 2), torch.zeros(2, 3)), ValueError, "must match"),
        ("wrong-dtype", lambda: S.expected_reward(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2)),
         TypeError, "floating-point"),
    ],
    "classification_reinforce": [
        ("out-of-range labels", lambda: S.classification_reinforce(LOGITS, torch.tensor([0, 1, 4])), ValueError,
         r"outside \[0, C=4\)"),
        ("out-of-range negative labels", lambda: S.classification_reinforce(LOGITS, torch.tensor([0, -1, 2])),
         ValueError, r"outside \[0, C=4\)"),
        ("NaN logits", lambda: S.classification_reinforce(torch.full((3, 4), NAN), TARGET), ValueError, "NaN"),
        ("empty", lambda: S.classification_reinforce(torch.zeros(0, 4), TARGET[:0]), ValueError, "empty"),
        ("wrong-shape", lambda: S.classification_reinforce(torch.zeros(4), TARGET), ValueError, r"\[N, C\]"),
        ("wrong-dtype target", lambda: S.classification_reinforce(LOGITS, TARGET.float()), TypeError,
         "integer tensor"),
        ("out-of-range samples", lambda: S.classification_reinforce(LOGITS, TARGET, 0), ValueError,
         "n_samples must be >= 1"),
        ("NaN reward", lambda: S.classification_reinforce(LOGITS, TARGET, 2,
                                                          reward=lambda s, t: torch.full(s.shape, NAN)),
         ValueError, "rewards contains NaN"),
        ("wrong-shape reward", lambda: S.classification_reinforce(LOGITS, TARGET, 2, reward=lambda s, t: torch.ones(5)),
         ValueError, "reward must return shape"),
        ("wrong-type generator", lambda: S.classification_reinforce(LOGITS, TARGET, 2, generator=3), TypeError,
         "generator must be"),
        ("NaN baseline", lambda: S.classification_reinforce(LOGITS, TARGET, 2, baseline=NAN), ValueError, "NaN"),
    ],
    "sequence_reinforce": [
        ("wrong-shape prefix", lambda: S.sequence_reinforce(nn.Linear(2, 2), torch.zeros(3, dtype=torch.long), [[1]],
                                                            lambda h, r: h, eos_id=None, pad_id=0),
         ValueError, r"\[B, P\]"),
        ("wrong-type task loss", lambda: S.sequence_reinforce(nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long),
                                                              [[1]], "edit", eos_id=None, pad_id=0),
         TypeError, "task_loss must be a callable"),
        ("out-of-range samples", lambda: S.sequence_reinforce(nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long),
                                                              [[1]], lambda h, r: h, n_samples=0, eos_id=None,
                                                              pad_id=0),
         ValueError, "n_samples must be >= 1"),
        ("wrong-length references", lambda: S.sequence_reinforce(nn.Linear(2, 2), torch.zeros(2, 2, dtype=torch.long),
                                                                 [[1]], lambda h, r: h, eos_id=None, pad_id=0),
         ValueError, "batch sizes differ"),
    ],
    "gaussian_smoothing_grad": [
        ("NaN theta", lambda: S.gaussian_smoothing_grad(QUAD, torch.full((3,), NAN), 0.1, 2), ValueError, "NaN"),
        ("empty theta", lambda: S.gaussian_smoothing_grad(QUAD, torch.zeros(0), 0.1, 2), ValueError, "no entries"),
        ("empty dict", lambda: S.gaussian_smoothing_grad(QUAD, {}, 0.1, 2), TypeError, "non-empty dict"),
        ("wrong-dtype theta", lambda: S.gaussian_smoothing_grad(QUAD, torch.zeros(3, dtype=torch.long), 0.1, 2),
         TypeError, "floating point"),
        ("wrong-shape f", lambda: S.gaussian_smoothing_grad(lambda t: t, THETA, 0.1, 2), ValueError,
         "f must return a scalar"),
        ("wrong-shape f (loop)", lambda: S.gaussian_smoothing_grad(lambda t: t, THETA, 0.1, 2, vectorize=False),
         ValueError, "f must return a scalar"),
        ("wrong-type f output", lambda: S.gaussian_smoothing_grad(lambda t: 1.0, THETA, 0.1, 2), ValueError,
         "scalar tensor under vmap"),
        ("NaN f", lambda: S.gaussian_smoothing_grad(lambda t: t.sum() * NAN, THETA, 0.1, 2), ValueError, "NaN"),
        ("NaN sigma", lambda: S.gaussian_smoothing_grad(QUAD, THETA, NAN, 2), ValueError, "sigma must be > 0"),
        ("out-of-range samples", lambda: S.gaussian_smoothing_grad(QUAD, THETA, 0.1, 0), ValueError,
         "n_samples must be >= 1"),
        ("out-of-range chunk", lambda: S.gaussian_smoothing_grad(QUAD, THETA, 0.1, 2, chunk_size=0), ValueError,
         "chunk_size must be >= 1"),
        ("wrong-type f", lambda: S.gaussian_smoothing_grad(3, THETA, 0.1, 2), TypeError, "f must be callable"),
        ("wrong-type generator", lambda: S.gaussian_smoothing_grad(QUAD, THETA, 0.1, 2, generator="g"), TypeError,
         "generator must be"),
        ("NaN n_examples", lambda: S.gaussian_smoothing_grad(QUAD, THETA, 0.1, 2, n_examples=NAN), ValueError,
         "n_examples must be > 0"),
    ],
    "spsa_grad": [
        ("wrong-shape f", lambda: S.spsa_grad(lambda t: t, THETA, 0.1, 2), ValueError, "f must return a scalar"),
        ("out-of-range samples", lambda: S.spsa_grad(QUAD, THETA, 0.1, 0), ValueError, "n_samples must be >= 1"),
        ("NaN theta", lambda: S.spsa_grad(QUAD, THETA * NAN, 0.1, 1), ValueError, "NaN"),
        ("out-of-range sigma", lambda: S.spsa_grad(QUAD, THETA, 0.0), ValueError, "sigma must be > 0"),
        ("empty theta", lambda: S.spsa_grad(QUAD, torch.zeros(0), 0.1), ValueError, "no entries"),
        ("wrong-type n_examples", lambda: S.spsa_grad(QUAD, THETA, 0.1, n_examples=True), TypeError,
         "n_examples must be a number"),
    ],
    "MeZO": [
        ("NaN lr", lambda: _mezo(lr=NAN), ValueError, "lr must be > 0"),
        ("out-of-range seed", lambda: _mezo(seed=-1), ValueError, "seed must be >= 0"),
        ("empty params", lambda: S.MeZO([]), ValueError, "empty parameter list"),
        ("wrong-shape closure", lambda: _mezo_step(torch.ones(3)), ValueError, "scalar loss"),
        ("wrong-type closure", lambda: _mezo_step("x"), TypeError, "scalar loss"),
        ("NaN closure", lambda: _mezo_step(torch.tensor(NAN)), ValueError, "NaN"),
        ("out-of-range lr after construction", _mezo_lr_changed, ValueError, "lr must be > 0"),
        ("out-of-range n_examples", lambda: _mezo_step((torch.tensor(1.0), 0)), ValueError, "n_examples must be > 0"),
        ("wrong-type n_examples", lambda: _mezo_step((torch.tensor(1.0), "8")), TypeError, "n_examples must be a"),
        ("wrong-shape closure tuple", lambda: _mezo_step((torch.tensor(1.0), 8, 1)), ValueError, "tuple of 3"),
        ("changing n_examples", _mezo_changing_weight, ValueError, "different n_examples within one step"),
        ("wrong state", lambda: _mezo()[0].load_state_dict({"state": {}, "param_groups": []}), ValueError,
         "not a MeZO state_dict"),
    ],
}
CASES["call_with_parameters"] = [
    ("wrong-type model", lambda: S.call_with_parameters("model", {}, lambda m: 0), TypeError,
     "model must be an nn.Module"),
    ("wrong-type fn", lambda: S.call_with_parameters(nn.Linear(2, 2), {}, 3), TypeError, "fn must be callable"),
    ("wrong-type params", lambda: S.call_with_parameters(nn.Linear(2, 2), [torch.zeros(2)], lambda m: 0), TypeError,
     "params must be a mapping"),
    ("unknown name", lambda: S.call_with_parameters(nn.Linear(2, 2), {"weights": torch.zeros(2, 2)}, lambda m: 0),
     ValueError, "not parameters or buffers"),
]
EXEMPT = {   # names that take no input to validate
    "SIGMA_MODES": "constant", "ASSIGNMENTS": "constant", "DENSITIES": "constant",
    "MGSStats": "result record built by MGS.step",
    "mgs_step_reference": "the readable reference of MGS.step, for reading and the equality tests: it trusts its "
                          "inputs (MGS validates them)", "PGResult": "result record built by the REINFORCE steps",
}
CASES.update(GROUP_CASES)      # the group policy gradients of notebook 18, listed in their own module
EXEMPT.update(GROUP_EXEMPT)


def test_every_public_name_is_walked():
    assert set(S.__all__) == set(CASES) | set(EXEMPT), set(S.__all__) ^ (set(CASES) | set(EXEMPT))


@pytest.mark.parametrize("name,category,thunk,exc,match",
                         [(n, *c) for n, cases in CASES.items() for c in cases],
                         ids=[f"{n}-{c[0]}" for n, cases in CASES.items() for c in cases])
def test_bad_input_raises_clearly(name, category, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_failed_steps_leave_parameters_unchanged():
    """An error inside a step (the user's loss, a NaN candidate, a bad closure) restores θ before propagating."""
    for parallel in (False, True):
        calls = []

        def fails_third(out, b):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("task loss crashed")
            return F.cross_entropy(out, b[1])

        mgs, model = _mgs(task=fails_third, parallel=parallel, vmap_task_loss=False)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(RuntimeError, match="task loss crashed"):
            mgs_step(mgs, (X, Y))
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    opt, lin = _mezo()
    before = [p.detach().clone() for p in lin.parameters()]
    for bad in (lambda: torch.ones(3), lambda: (_ for _ in ()).throw(RuntimeError("closure crashed"))):
        with pytest.raises((ValueError, RuntimeError)):
            opt.step(bad)
        for p, q in zip(lin.parameters(), before):
            torch.testing.assert_close(p.detach(), q)       # θ + εz − εz: equal up to rounding


def test_extreme_valid_inputs_stay_finite():
    w = S.mgs_weights(torch.tensor([1e30, 1e30 + 1e24, INF]), 0.0, torch.tensor([-700.0, 700.0, 0.0]), 1e-12)
    assert bool(torch.isfinite(w).all()) and math.isclose(float(w.sum()), 1.0)
    loss = S.reinforce_loss(torch.full((4,), -1e4), torch.full((4,), 1e30), 1e30)
    assert bool(torch.isfinite(loss))
    lq = S.mixture_log_density(torch.full((5, 1000), 50.0), torch.zeros(1000), 1e-3)
    assert bool(torch.isfinite(lq).all())


def test_value_checks_step_aside_inside_torch_func():
    """Functions that notebooks vmap over stacked parameters (the zeroth-order estimators do) keep working: the NaN
    checks need ``.item()``, which a transform cannot provide, so they run only outside transforms."""
    logits, table = torch.randn(3, 5, 4), torch.nn.functional.one_hot(torch.tensor([0, 1, 3, 2, 1]), 4)
    out = torch.func.vmap(lambda z: S.expected_reward(z, table))(logits)
    torch.testing.assert_close(out, torch.stack([S.expected_reward(z, table) for z in logits]))
    r = torch.randn(2, 4, 3)
    torch.testing.assert_close(torch.func.vmap(S.leave_one_out_baseline)(r),
                               torch.stack([S.leave_one_out_baseline(x) for x in r]))
