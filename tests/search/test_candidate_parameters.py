"""A candidate's parameters reach every call a scoring function makes — the module, its methods, its submodules, a
Hugging Face model's ``generate`` — in MGS's loop and vmap modes alike, or the call is refused. Before, the vmap
modes handed ``forward_fn`` a proxy whose attributes were the module's own: a method or a submodule scored θ for
every candidate, silently."""
from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.losses import edit_distance
from taskloss.search import MGS, call_with_parameters, gaussian_smoothing_grad, mgs_step_reference
from taskloss.parameter_vectors import functional_loss
from helpers import mgs_closure, mgs_step, with_surrogate


class Net(nn.Module):
    """A classifier used through a submodule and a method other than ``forward``."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 6)
        self.head = nn.Linear(6, 2)

    def scores(self, x):
        return self.head(torch.tanh(self.encoder(x)))

    def forward(self, x):
        return self.scores(x)


def _net_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(24, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (24,), generator=g)
    torch.manual_seed(seed)
    return Net().double(), (X, y)


def _ce(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def _task(out, batch):
    return 3.0 * F.cross_entropy(out, batch[1])


def _losses(model, batch, forward_fn, copy_model=True, **kw):
    """The candidates' task losses of one MGS step (on a copy of ``model``), and the parameters after it."""
    model = copy.deepcopy(model) if copy_model else model
    kw = {"n_samples": 5, "seed": 11, "sigma": 0.5, "sigma_mode": "absolute", **kw}
    mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), kw.pop("task", _task),
                             forward_fn=forward_fn, **kw), _ce)
    stats = mgs_step(mgs, batch)
    return stats.task_losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]), mgs


FORWARDS = {
    "submodules": lambda m, b: m.head(torch.tanh(m.encoder(b[0]))),
    "method": lambda m, b: m.scores(b[0]),
    "module": lambda m, b: m(b[0]),
}


@pytest.mark.parametrize("name", list(FORWARDS))
@pytest.mark.parametrize("vmap_task_loss", [True, False])
def test_loop_equals_vmap_through_submodules_and_methods(name, vmap_task_loss):
    model, batch = _net_problem()
    loop, theta_loop, _ = _losses(model, batch, FORWARDS[name], parallel=False)
    vm, theta_vmap, mgs = _losses(model, batch, FORWARDS[name], parallel=True, vmap_task_loss=vmap_task_loss)
    assert mgs.mode == ("vmap" if vmap_task_loss else "vmap_forward")
    assert len(set(loop.tolist())) == len(loop)              # the candidates differ, so the regression is visible
    torch.testing.assert_close(vm, loop, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(theta_vmap, theta_loop, rtol=1e-12, atol=1e-12)


def test_a_task_loss_that_drives_the_model_sees_the_candidate_in_vmap_mode():
    """``forward_fn`` may return the model and ``task_loss_fn`` run it: in "vmap" mode both are inside the swap."""
    model, batch = _net_problem()
    task = lambda m, b: _task(m.scores(b[0]), b)  # noqa: E731
    loop, _, _ = _losses(model, batch, lambda m, b: m, task=task, parallel=False)
    vm, _, mgs = _losses(model, batch, lambda m, b: m, task=task, parallel=True, vmap_task_loss=True)
    assert mgs.mode == "vmap"
    torch.testing.assert_close(vm, loop, rtol=1e-12, atol=1e-12)


def test_a_parameter_captured_before_the_step_is_refused_in_vmap_mode():
    def losses(**kw):
        model, batch = _net_problem()
        W = model.head.weight                                 # read outside the call: would stay at θ

        def forward(m, b):
            return F.linear(torch.tanh(m.encoder(b[0])), W, m.head.bias)

        return _losses(model, batch, forward, copy_model=False, **kw)

    with pytest.raises(ValueError, match="'head.weight' was read directly"):
        losses(parallel=True, vmap_task_loss=True)
    loop, _, _ = losses(parallel=False)                       # the loop writes θ + Δθ_k into W itself
    with pytest.warns(RuntimeWarning, match="falling back"):
        auto, _, mgs = losses(parallel=True, vmap_task_loss="auto")
    assert mgs.mode == "loop"
    torch.testing.assert_close(auto, loop, rtol=0, atol=0)


def test_outputs_that_ignore_the_candidate_are_refused_in_vmap_mode():
    model, batch = _net_problem()
    frozen_copy = copy.deepcopy(model)
    for vmap_task_loss in (True, False):
        with pytest.raises(ValueError, match="same for every candidate"):
            _losses(model, batch, lambda m, b: frozen_copy(b[0]), parallel=True, vmap_task_loss=vmap_task_loss)


# ------------------------------------------------------------------------------------------- Hugging Face
def _greedy_tokens(m, b):
    """Three greedy tokens by ``generate`` (data-dependent stopping: not traceable by vmap)."""
    prefix = b[0]
    out = m.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=3, do_sample=False,
                     pad_token_id=0)
    return out[:, prefix.shape[1]:]


def _token_edit_distance(hyp, b):
    return edit_distance(hyp, b[1]).mean()


def _lm_batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 90, (3, 5), generator=g), torch.randint(0, 90, (3, 3), generator=g)


def _lm_surrogate(m, b):
    ids = torch.cat([b[0], b[1]], 1)
    return m(ids, labels=ids).loss


def _lm_step(model, forward_fn, task, return_deltas=False, batch=None, **kw):
    batch = _lm_batch() if batch is None else batch
    model = copy.deepcopy(model)
    kw = {"n_samples": 4, "seed": 5, "sigma": 0.3, "sigma_mode": "absolute", "ess_warning": None, **kw}
    mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, forward_fn=forward_fn, **kw),
                         _lm_surrogate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")   # SDPA under vmap on a CPU
        stats = mgs_step(mgs, batch, return_deltas=return_deltas)
    return stats.task_losses, mgs


def test_gpt2_generate_scores_each_candidate_or_is_refused(gpt2):
    prefix = _lm_batch()[0]
    batch = (prefix, _greedy_tokens(gpt2, (prefix,)))        # references: θ's own continuations (distance 0)
    run = lambda **kw: _lm_step(gpt2, _greedy_tokens, _token_edit_distance, batch=batch, **kw)  # noqa: E731
    loop, mgs = run(parallel=False, return_deltas=True, sigma=0.02)
    reference = []                                            # each candidate decoded after writing it into a copy
    for delta in mgs.last_stats.deltas:
        m = copy.deepcopy(gpt2)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.add_(delta[n])
        reference.append(float(_token_edit_distance(_greedy_tokens(m, batch), batch)))
    torch.testing.assert_close(loop, torch.tensor(reference, dtype=torch.float64), rtol=0, atol=0)
    assert len(set(loop.tolist())) > 1
    # vmap: generate stops on a data-dependent condition, which vmap cannot trace — refused, not scored at θ
    with pytest.raises(RuntimeError, match="data-dependent") as info:
        run(parallel=True, vmap_task_loss=False, sigma=0.02)
    if sys.version_info >= (3, 11):                          # exception notes
        assert "parallel=False" in "".join(info.value.__notes__)
    with pytest.warns(RuntimeWarning) as caught:
        auto, mgs = run(parallel=True, vmap_task_loss="auto", sigma=0.02)
    assert [str(w.message).rsplit("; ", 1)[-1] for w in caught] == ["falling back to 'vmap_forward'",
                                                                     "falling back to 'loop'"]
    assert mgs.mode == "loop"
    torch.testing.assert_close(auto, loop, rtol=0, atol=0)


def _submodule_logits(m, b):
    """Next-token logits through GPT-2's submodules (``transformer`` and ``lm_head``), not its forward."""
    ids = torch.cat([b[0], b[1]], 1)
    return m.lm_head(m.transformer(ids).last_hidden_state)


def _next_token_nll(logits, b):
    ids = torch.cat([b[0], b[1]], 1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("vmap_task_loss", [True, False])
def test_gpt2_submodules_loop_equals_vmap(gpt2, vmap_task_loss):
    loop, _ = _lm_step(gpt2, _submodule_logits, _next_token_nll, parallel=False)
    vm, mgs = _lm_step(gpt2, _submodule_logits, _next_token_nll, parallel=True, vmap_task_loss=vmap_task_loss)
    assert mgs.mode == ("vmap" if vmap_task_loss else "vmap_forward")
    assert len(set(loop.tolist())) == len(loop)
    torch.testing.assert_close(vm, loop, rtol=1e-5, atol=1e-6)     # batched vs plain attention kernels


def test_mgs_reference_reaches_methods_too():
    """The readable reference scores through the same whole-call swap: equal to the loop on a method."""
    model, batch = _net_problem()
    loop, theta, mgs = _losses(model, batch, FORWARDS["method"], parallel=False, max_update_norm=None)
    ref_model = copy.deepcopy(model)
    _, res = mgs_step_reference(ref_model, torch.optim.SGD(ref_model.parameters(), lr=1.0),
                                mgs_closure(ref_model, _ce, batch), _task, seed=11, n_samples=5, sigma=0.5,
                                sigma_mode="absolute", forward_fn=FORWARDS["method"], max_update_norm=None)
    assert res.samples.shape[0] == len(loop)
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in ref_model.parameters()]), theta,
                               rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------ call_with_parameters
def _perturbed(model, scale=0.3, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=g, dtype=p.dtype)
            for n, p in model.named_parameters()}


def _written(model, params):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(params[n])
    return m


def test_call_with_parameters_reaches_generate_and_restores(gpt2):
    params = _perturbed(gpt2)
    prefix = _lm_batch()[0]
    before = [p.detach().clone() for p in gpt2.parameters()]
    got = call_with_parameters(gpt2, params, _greedy_tokens, (prefix,))
    torch.testing.assert_close(got, _greedy_tokens(_written(gpt2, params), (prefix,)), rtol=0, atol=0)
    assert not torch.equal(got, _greedy_tokens(gpt2, (prefix,)))
    for p, b in zip(gpt2.parameters(), before):
        assert torch.equal(p, b)
    with pytest.raises(ZeroDivisionError):                     # restored on error too
        call_with_parameters(gpt2, params, lambda m: 1 / 0)
    for p, b in zip(gpt2.parameters(), before):
        assert torch.equal(p, b)


def test_call_with_parameters_follows_tied_embeddings(llama):
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    params = _perturbed(llama)
    assert "lm_head.weight" not in params                    # the shared weight is named once
    ids = _lm_batch()[0]
    got = call_with_parameters(llama, params, lambda m: m.lm_head(m.model(ids).last_hidden_state))
    torch.testing.assert_close(got, _written(llama, params)(ids).logits, rtol=1e-5, atol=1e-6)


def test_zeroth_order_refuses_an_f_that_ignores_theta_under_vmap():
    model, batch = _net_problem()
    f_good, theta = functional_loss(model, lambda out: _task(out, batch), batch[0])
    gaussian_smoothing_grad(f_good, theta, 0.1, 3, generator=torch.Generator().manual_seed(0))
    f_bad = lambda p: _task(model(batch[0]), batch)  # noqa: E731  (the model at its own parameters)
    with pytest.raises(ValueError, match="does not depend on the parameters"):
        gaussian_smoothing_grad(f_bad, theta, 0.1, 3, generator=torch.Generator().manual_seed(0))
    g = gaussian_smoothing_grad(f_bad, theta, 0.1, 3, baseline="value", vectorize=False)
    assert all(float(v.abs().max()) == 0.0 for v in g.values())   # a constant f has zero smoothed gradient
