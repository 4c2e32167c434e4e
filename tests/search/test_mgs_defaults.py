"""MGS's default density (issue 46): the weights follow the task loss on the models a user brings, the effective
sample size is reported and a collapse warns, the exact mixture density stays selectable, and a Hugging Face
``ModelOutput`` handed to a task loss that needs a tensor is refused with the ``forward_fn`` fix (issue 41).

Run as a script (``PYTHONPATH=. python tests/search/test_mgs_defaults.py``) it prints the ESS of the old default
(``density="mixture"``) and the new one (``"flat"``) on notebook 17's GPT-2 and on the harness MLP of notebook 16.
"""
from __future__ import annotations

import copy
import math
import os
import sys
import warnings

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/ (hf_models)

from hf_models import tiny_gpt2  # noqa: E402

from taskloss.losses import accuracy, edit_distance  # noqa: E402
from taskloss.search import MGS, mgs_step_reference, mgs_weights, mixture_log_density  # noqa: E402
from taskloss.search.mgs_density import log_q_floats, log_q_from_sq  # noqa: E402
from taskloss.search.mgs_stats import ESS_WARNING  # noqa: E402

VOCAB = 97


# ------------------------------------------------------------------------------------ notebook 17's GPT-2 step
def nb17_gpt2():
    """Notebook 17's GPT-2 at its default parameters: 2 layers, width 32, 64 positions, no dropout (30,624)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_gpt2(0, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def nb17_batch(seed: int = 0, batch_size: int = 4, seq_len: int = 12):
    """Notebook 17's MGS batch: prefixes of ``seq_len // 2`` random tokens (last row half padded), 3 reference
    tokens each."""
    def tokens(n, length, offset):
        g = torch.Generator().manual_seed(seed + offset)
        ids = torch.randint(1, VOCAB - 1, (n, length), generator=g)
        mask = torch.ones(n, length, dtype=torch.long)
        mask[-1, length // 2:] = 0
        return ids.masked_fill(mask == 0, 0)
    return tokens(batch_size, seq_len // 2, 1), tokens(batch_size, 3, 2)


def greedy_continuation(model, batch):
    prefix = batch[0]
    out = model.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=3, do_sample=False,
                         pad_token_id=0)
    return out[:, prefix.shape[1]:]


def edit_task(hyp, batch):
    return edit_distance(hyp, batch[1]).mean()


def lm_closure(model, batch):
    def closure():
        seqs = torch.cat(batch, 1)
        loss = model(input_ids=seqs, labels=seqs).loss
        loss.backward()
        return loss, batch
    return closure


def gpt2_steps(steps: int = 3, **kw):
    """``steps`` MGS steps on notebook 17's GPT-2 (edit distance of ``generate``'s continuations); their stats."""
    model, batch = nb17_gpt2(), nb17_batch()
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), edit_task, forward_fn=greedy_continuation,
              parallel=False, seed=0, **kw)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            mgs.step(lm_closure(model, batch))
            out.append(mgs.last_stats)
    return out


# ------------------------------------------------------------------------------------ the harness MLP (nb 16)
def harness_mlp_steps(steps: int = 3, density: str | None = None, seed: int = 0):
    """``steps`` steps of the harness's MGS rule (notebook 16's hyperparameters) on its digits MLP 64-32-10,
    task loss the training error; ``density`` overrides MGS's (``None``: MGS's default)."""
    from taskloss.datasets import load_digits_splits
    from taskloss.harness import Problem, make_rule
    from taskloss.models import MLP

    (X, y), _, _ = load_digits_splits(seed)
    torch.manual_seed(1000 + seed)
    pb = Problem(MLP(64, 32, 10), X, y, task_loss_fn=lambda o, t: 1 - accuracy(o.argmax(-1), t))
    rule = make_rule("mgs", pb, lr=0.5, n_samples=8, alpha=0.01, seed=seed)
    if density is not None:
        rule.mgs.density = density
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            rule.step()
            out.append(rule.last_stats)
    return out


# ------------------------------------------------------------------------------------------------- tests
def test_default_density_is_flat_and_the_weights_are_the_task_terms_softmax():
    """With the default, log q ≡ 0 and w = softmax(−l_k/α), computed here in float64 from the losses alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    X, y = torch.randn(32, 4, dtype=torch.float64), torch.randint(0, 3, (32,))

    def closure():
        loss = nn.functional.cross_entropy(model(X), y)
        loss.backward()
        return loss, (X, y)

    task = lambda o, b: nn.functional.cross_entropy(o, b[1])      # noqa: E731  (smooth: distinct losses)
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=6, alpha=0.05, seed=1)
    assert mgs.density == "flat"
    mgs.step(closure)
    st = mgs.last_stats
    assert torch.equal(st.log_q, torch.zeros(6, dtype=torch.float64))
    want = torch.softmax(-st.task_losses / 0.05, 0)
    torch.testing.assert_close(st.weights, want, rtol=1e-12, atol=1e-15)
    assert math.isclose(st.ess, float(1 / (want ** 2).sum()), rel_tol=1e-12)
    assert st.task_ess == pytest.approx(st.ess, rel=1e-12)
    assert st.as_dict()["task_ess"] == st.task_ess


def test_flat_density_in_the_functional_core():
    g = [torch.randn(3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)]
    d = [torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, 2, dtype=torch.float64)]
    assert torch.equal(mixture_log_density(d, g, 0.3, 0.5, density="flat"), torch.zeros(5, dtype=torch.float64))
    d0, d1 = torch.rand(5, 2, dtype=torch.float64), torch.rand(5, 2, dtype=torch.float64)
    sig, numel = torch.tensor([0.5, 0.0], dtype=torch.float64), torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert torch.equal(log_q_from_sq(d0, d1, sig, numel, 0.5, "flat"), torch.zeros(5, dtype=torch.float64))
    assert log_q_floats(d0.tolist(), d1.tolist(), sig.tolist(), numel.tolist(), 0.5, "flat") == [0.0] * 5


def test_defaults_keep_ess_above_one_on_notebook_17s_gpt2():
    """Notebook 17's GPT-2 (30,624 parameters, edit distance through ``generate``), package defaults, 3 steps."""
    for K in (4, 8):
        stats = gpt2_steps(3, n_samples=K)
        assert all(st.ess > 1.5 for st in stats), [st.ess for st in stats]
        old = gpt2_steps(3, n_samples=K, density="mixture")                   # the same draws, the exact density
        assert [st.task_losses.tolist() for st in old[:1]] == [st.task_losses.tolist() for st in stats[:1]]
        assert old[0].ess < 1.01                                              # what the old default did


def test_defaults_keep_ess_above_one_on_the_harness_mlp():
    new, old = harness_mlp_steps(1), harness_mlp_steps(1, density="mixture")
    torch.testing.assert_close(new[0].task_losses, old[0].task_losses)        # the same candidates
    assert new[0].ess > 1.5
    assert old[0].ess < 1.01


def test_regression_the_numbers_of_issue_46():
    """Notebook 17's old step (σ = 0.5 absolute, the exact step −g as candidate 0, K = 4): the exact density puts
    all the weight on a candidate whose task loss is 1.000 while candidate 0 has 0.833; −log q spreads over ≈ P/2
    nats (≈ 1.5e4) against (1.000 − 0.833)/α = 16.7 for the task term. The flat density weights candidate 0."""
    kw = dict(n_samples=4, sigma=0.5, sigma_mode="absolute", include_mle=True)
    old, = gpt2_steps(1, density="mixture", **kw)
    new, = gpt2_steps(1, **kw)
    P = 30624
    L = old.task_losses
    torch.testing.assert_close(L, new.task_losses)
    assert L[0] == pytest.approx(10 / 12) and float(L[1:].min()) == pytest.approx(1.0)
    assert old.ess < 1.001 and int(old.weights.argmax()) != 0                 # a candidate with task loss 1.000
    spread = float(old.log_q.max() - old.log_q.min())
    assert 0.4 * P < spread < 0.6 * P                                        # ≈ P/2 = 15,312: the step −g at the mode
    assert float((L.max() - L.min()) / 0.01) == pytest.approx(16.67, abs=0.01)
    assert int(new.weights.argmax()) == 0 and float(new.weights[0]) > 0.999  # the flat density follows the task


def test_exact_mixture_density_is_selectable_and_equals_the_old_computation():
    """``density="mixture"``: log q is the true mixture density of the kept draws (float64, scipy-checked in
    test_mgs.py), the weights are ``mgs_weights`` of it, and the plain reference step agrees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    X, y = torch.randn(16, 3, dtype=torch.float64), torch.randint(0, 2, (16,))
    ref_model = copy.deepcopy(model)

    def closure_for(m):
        def closure():
            loss = nn.functional.cross_entropy(m(X), y)
            loss.backward()
            return loss, (X, y)
        return closure

    task = lambda o, b: nn.functional.cross_entropy(o, b[1])      # noqa: E731
    kw = dict(n_samples=5, alpha=1.0, sigma=0.05, sigma_mode="absolute", density="mixture", max_grad_norm=None,
              max_update_norm=None)
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, seed=3, keep_deltas=True,
              ess_warning=None, **kw)
    g = torch.autograd.grad(nn.functional.cross_entropy(model(X), y), list(model.parameters()))
    mgs.step(closure_for(model))
    st = mgs.last_stats
    names = [n for n, _ in model.named_parameters()]
    want = mixture_log_density([torch.stack([d[n] for d in st.deltas]) for n in names], list(g), st.sigmas, 0.5)
    torch.testing.assert_close(st.log_q, want, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(st.weights, mgs_weights(st.task_losses, 0.0, want, 1.0), rtol=1e-9, atol=1e-12)
    _, res = mgs_step_reference(ref_model, torch.optim.SGD(ref_model.parameters(), lr=1.0), closure_for(ref_model),
                                task, seed=3, **kw)
    torch.testing.assert_close(st.weights, res.weights, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(st.weights, torch.softmax(-st.task_losses, 0))     # not the flat weights


def _collapse_problem(P_hidden: int):
    """A linear model with ~P_hidden·10 parameters; its task loss is chosen by each test."""
    torch.manual_seed(0)
    model = nn.Linear(P_hidden, 10).double()
    X, y = torch.randn(8, P_hidden, dtype=torch.float64), torch.randint(0, 10, (8,))

    def closure():
        loss = nn.functional.cross_entropy(model(X), y)
        loss.backward()
        return loss, (X, y)
    return model, closure


def test_warning_names_the_flat_density_when_the_exact_density_collapses_the_weights():
    model, closure = _collapse_problem(400)                   # P = 4,010: −log q spreads by ≈ √(P/2) ≈ 45 nats
    constant = lambda o, b: torch.tensor(0.5)          # noqa: E731  every candidate ties: the task term is flat
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), constant, n_samples=4, density="mixture",
              sigma=0.1, sigma_mode="absolute", seed=0)
    with pytest.warns(UserWarning, match=r"density='flat'") as caught:
        mgs.step(closure)
    st = mgs.last_stats
    assert st.ess < ESS_WARNING and st.task_ess == pytest.approx(4.0)
    assert len([w for w in caught if issubclass(w.category, UserWarning)]) == 1
    assert caught[0].filename == __file__                       # points at the caller's line, not torch's
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # once per MGS: the second collapse is counted only
        mgs.step(closure)
    assert mgs.collapsed_steps == 2
    model, closure = _collapse_problem(400)
    flat = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), constant, n_samples=4, sigma=0.1,
               sigma_mode="absolute", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat.step(closure)                                      # the default on the same problem: no collapse
    assert flat.last_stats.ess == pytest.approx(4.0)


def test_warning_names_alpha_when_the_task_losses_collapse_the_weights_and_can_be_silenced():
    model, closure = _collapse_problem(4)
    spread = lambda o, b: o.sum() * 100.0                      # noqa: E731  losses far apart on the scale of α
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), spread, n_samples=4, seed=0)
    with pytest.warns(UserWarning, match="Raise alpha"):
        mgs.step(closure)
    assert mgs.last_stats.ess < ESS_WARNING
    quiet = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), spread, n_samples=4, seed=0, ess_warning=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.step(closure)
    one = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), spread, n_samples=1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one.step(closure)                                       # one candidate: ESS 1 is no collapse
    for bad, err in ((True, TypeError), (0.0, ValueError), (math.nan, ValueError), ("1.5", TypeError)):
        with pytest.raises(err):
            MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), spread, ess_warning=bad)


@pytest.mark.parametrize("parallel", [False, True])
def test_model_output_without_forward_fn_is_refused_with_the_fix(parallel):
    """Issue 41 item 6: a Hugging Face model without ``forward_fn`` hands the task loss a ``ModelOutput``."""
    model = tiny_gpt2(0)
    ids = torch.randint(1, VOCAB - 1, (2, 6), generator=torch.Generator().manual_seed(0))

    def closure():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss, (ids,)

    def task(logits, batch):                                    # needs a tensor (the issue's .reshape failure)
        return nn.functional.cross_entropy(logits.reshape(2, 6, VOCAB)[:, :-1].reshape(-1, VOCAB),
                                           batch[0][:, 1:].reshape(-1))

    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=2, seed=0, parallel=parallel,
              ess_warning=None)
    with pytest.raises(TypeError, match=r"CausalLMOutputWithCrossAttentions.*forward_fn") as info:
        mgs.step(closure)
    assert "forward_fn=lambda model, batch: model(batch[0]).logits" in str(info.value)
    assert isinstance(info.value.__cause__, AttributeError)
    fixed = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=2, seed=0, parallel=parallel,
                ess_warning=None, forward_fn=lambda model, batch: model(batch[0]).logits)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        fixed.step(closure)
    assert torch.isfinite(fixed.last_stats.task_losses).all()


def test_a_task_loss_that_reads_the_model_output_still_works():
    model = tiny_gpt2(0)
    ids = torch.randint(1, VOCAB - 1, (2, 6), generator=torch.Generator().manual_seed(0))

    def closure():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss, (ids,)

    task = lambda out, b: out.logits.float().logsumexp(-1).mean()   # noqa: E731  uses the ModelOutput's field
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=2, seed=0, parallel=False,
              ess_warning=None)
    mgs.step(closure)
    assert torch.isfinite(mgs.last_stats.task_losses).all()


def main() -> None:
    """The ESS table of the report: old default (exact mixture) vs new default (flat), same draws."""
    torch.set_num_threads(1)
    rows = []
    for K in (4, 8):
        for dens in ("mixture", "flat"):
            rows.append((f"notebook 17 GPT-2 (30,624 params), package defaults, K={K}", dens,
                         [round(st.ess, 2) for st in gpt2_steps(3, n_samples=K, density=dens)]))
    nb17 = dict(n_samples=4, sigma=0.5, sigma_mode="absolute", include_mle=True)
    for dens in ("mixture", "flat"):
        rows.append(("notebook 17 GPT-2, its old cell (σ=0.5 absolute, include_mle, K=4)", dens,
                     [round(st.ess, 2) for st in gpt2_steps(3, density=dens, **nb17)]))
    for dens in ("mixture", "flat"):
        rows.append(("harness MLP 64-32-10 on digits (2,410 params), rule 'mgs', K=8", dens,
                     [round(st.ess, 2) for st in harness_mlp_steps(5, density=dens)]))
    print("| model | density | ESS per step |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
