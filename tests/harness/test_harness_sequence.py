"""The harness on a causal LM with a sequence task loss: pass counts of greedy decoding and sampling, every rule that
applies bit for bit against the implementation used directly (as notebook 04 uses it), and the rules that do not
apply refused with their reason."""
from __future__ import annotations

import pytest
import torch
from helpers import V, make_lm, mgs_closure, tokens
from torch import nn
from torch.func import functional_call

from taskloss.curvature import SOAP, Shampoo, muon_with_adamw
from taskloss.dynamics import ClippedSGD
from taskloss.harness import RULES, PassCounter, Problem, SequenceProblem, applicable_rules, make_rule, propose, train
from taskloss.lm import CausalLM, CompletionBatch, CompletionTask, greedy_decode, window_nll
from taskloss.search import MGS, MeZO, gaussian_smoothing_grad, sequence_reinforce, spsa_grad

B, P, C, T = 4, 5, 4, 6
EOS, PAD = 1, 0
CURVATURE = {"newton", "natural_exact", "natural_empirical", "kfac", "diag_fisher", "diag_empirical", "hessian_free"}


def completion(seed: int = 0):
    """A tiny random Transformer LM (eval mode: no dropout), B prefixes, references ending in EOS or padded."""
    lm = make_lm("pre", seed=seed).eval()
    pre = tokens(B, P, seed=seed + 1).clamp_min(2)
    refs = tokens(B, C, seed=seed + 2).clamp_min(2)
    refs[0, 2], refs[0, 3] = EOS, PAD
    task = CompletionTask("edit_distance+repetition", T, EOS, PAD, ngram=2)
    return lm, CompletionBatch(pre, refs), task


def seq_problem(seed: int = 0) -> SequenceProblem:
    lm, batch, task = completion(seed)
    return SequenceProblem(lm, batch, task)


def test_surrogate_and_task_loss_are_the_lm_functions():
    pb = seq_problem()
    lm, batch, task = completion()
    torch.testing.assert_close(pb.surrogate(), window_nll(lm, batch.prefixes, batch.refs, PAD, EOS), rtol=0, atol=0)
    hyp = greedy_decode(lm, batch.prefixes, T, EOS, PAD)
    assert torch.equal(pb.task_outputs(), hyp)
    assert pb.task_loss() == float(task.per_sequence(hyp, batch.refs).mean())
    assert isinstance(pb.model, CausalLM) and pb.inputs.shape == (B, P)


@pytest.mark.parametrize("cache", [True, False])
def test_one_greedy_decoding_counts_T_forwards(cache):
    pb = seq_problem()
    pb.task.cache = cache                            # prefill + T − 1 cached steps, or T full recomputations
    with PassCounter(pb.counted_module, B) as c:
        pb.task_outputs()
    assert (c.count.forward, c.count.backward, c.count.functional) == (T, 0, 0)
    with PassCounter(pb.counted_module, B) as c:     # one teacher-forced window: one forward, one backward
        pb.surrogate().backward()
    assert (c.count.forward, c.count.backward) == (1, 1)


@pytest.mark.parametrize("name, hp, expected", [
    ("sgd", {}, (1, 1)),
    ("adam", {}, (1, 1)),
    ("mgs", {"n_samples": 3}, (1 + 3 * T, 1)),                     # surrogate + K greedy decodings of T tokens
    ("mezo", {"n_samples": 2}, (2 * 2 * T, 0)),    # two decodings per perturbation
    ("zo_gaussian", {"n_samples": 2}, (2 * 2 * T, 0)),   # antithetic pairs
    ("spsa", {"n_samples": 2}, (2 * 2 * T, 0)),
    # S sampled continuations per prefix: S rows per prefix for T steps, their log-probs (S), the MLE window (1)
    ("reinforce", {"n_samples": 3, "mle_weight": 1.0}, (3 * T + 3 + 1, 3 + 1)),
])
def test_rule_pass_counts_on_a_sequence_problem(name, hp, expected):
    c = propose(name, seq_problem(), **hp).passes
    assert (c.forward, c.backward, c.functional) == (*expected, 0), name


def test_curvature_rules_do_not_apply_and_say_why():
    pb = seq_problem()
    assert set(applicable_rules(pb)) == set(RULES) - CURVATURE - {"grad_penalty"}
    with pytest.raises(ValueError, match="second derivative"):
        make_rule("grad_penalty", pb)
    for name in CURVATURE:
        with pytest.raises(ValueError, match="does not apply.*per-example likelihood"):
            make_rule(name, pb)
        with pytest.raises(ValueError, match="does not apply"):
            RULES[name].cls(pb)                          # the class refuses too, not only the registry
    g = torch.Generator().manual_seed(0)                               # random inputs: a definite Hessian
    gauss = Problem(nn.Linear(3, 1), torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g),
                    likelihood="gaussian")
    assert "reinforce" not in applicable_rules(gauss) and "newton" in applicable_rules(gauss)
    with pytest.raises(TypeError, match="surrogate"):
        pb.surrogate_from_outputs(torch.zeros(B, V))
    with pytest.raises(TypeError, match="Hessian"):
        pb.grad_hessian()


def test_bad_sequence_inputs_raise():
    lm, batch, task = completion()
    with pytest.raises(TypeError, match="task"):
        SequenceProblem(lm, batch, "edit_distance")
    with pytest.raises(TypeError, match="batch"):
        SequenceProblem(lm, (batch.prefixes, batch.refs), task)
    with pytest.raises(TypeError, match="model"):
        SequenceProblem("lm", batch, task)
    with pytest.raises(ValueError, match="outside"):
        SequenceProblem(lm, CompletionBatch(batch.prefixes + V, batch.refs), task)
    with pytest.raises(ValueError, match="batch sizes"):
        SequenceProblem(lm, CompletionBatch(batch.prefixes, batch.refs[:2]), task)
    pb = SequenceProblem(lm, batch, task)
    with pytest.raises(ValueError, match="n_samples"):
        pb.sequence_reinforce_loss(1)
    with pytest.raises(ValueError, match="outside"):
        pb.set_batch(batch.prefixes, batch.refs - 1)       # a negative id
    assert torch.equal(pb.targets, batch.refs)              # the old batch is kept on error
    with pytest.raises(TypeError, match="problem"):
        applicable_rules("not a problem")


def test_train_on_a_sequence_problem_counts_and_evaluates():
    pb = seq_problem()
    rec = train("sgd", pb, budget=6, lr=0.05)
    assert rec.steps == 3 and rec.passes.total == 6          # evaluation (a greedy decoding) is not counted
    assert [h["passes"] for h in rec.history] == [0, 2, 4, 6]
    # minibatches swapped in before every step, evaluation at pass marks: MGS (1 + 2T passes a step) every 2T
    other = seq_problem(seed=1)
    seen = []

    def next_batch():
        seen.append(len(seen))
        return (other.inputs, other.targets) if len(seen) % 2 else (pb.inputs, pb.targets)
    rec = train("mgs", seq_problem(), budget=3 * (2 + 2 * T), n_samples=2, next_batch=next_batch, eval_every_passes=2 * T)
    assert rec.steps == 3 == len(seen)
    assert [h["passes"] for h in rec.history] == [0, 2 + 2 * T, 2 * (2 + 2 * T), 3 * (2 + 2 * T)]
    with pytest.raises(ValueError, match="batch size"):
        train("sgd", seq_problem(), budget=4, next_batch=lambda: (other.inputs[:2], other.targets[:2]))
    with pytest.raises(ValueError, match="eval_every_passes"):
        train("sgd", seq_problem(), budget=4, eval_every_passes=0)


# ---------------------------------------------------------------- bit for bit: the rule used directly, as in 04
def _params(m):
    return [p.detach().clone() for p in m.parameters()]


def _nll(model, batch):
    return window_nll(model, batch.prefixes, batch.refs, PAD, EOS)


def _direct_optim(make_opt):
    def build(model, batch, task):
        opt = make_opt(model.parameters())

        def closure():
            opt.zero_grad()
            loss = _nll(model, batch)
            loss.backward()
            return loss
        return lambda: opt.step(closure)
    return build


def _direct_mgs(model, batch, task):
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task.batch_task_loss, forward_fn=task.decode,
              n_samples=3, alpha=0.05, sigma=1.0, mix=0.5, max_grad_norm=None, max_update_norm=None, parallel=False,
              eval_mode=False, seed=3)
    return lambda: mgs.step(mgs_closure(model, lambda m, b: 0.5 * task.surrogate_loss(m, b), batch))


def _direct_reinforce(model, batch, task):
    opt, gen = torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(6)

    def step():
        opt.zero_grad()
        res = sequence_reinforce(model, batch.prefixes, batch.refs, task.per_sequence, n_samples=3,
                                 max_new_tokens=T, eos_id=EOS, pad_id=PAD, baseline="loo", generator=gen)
        (res.loss + 0.5 * _nll(model, batch)).backward()
        opt.step()
    return step


def _direct_mezo(model, batch, task):
    mezo = MeZO(model.parameters(), lr=0.1, sigma=1e-2, n_samples=2, seed=5)
    return lambda: mezo.step(lambda: task.batch_task_loss(greedy_decode(model, batch.prefixes, T, EOS, PAD), batch))


def _direct_zo(estimator):
    def build(model, batch, task):
        gen = torch.Generator().manual_seed(4)

        def f(p):
            call = lambda *a, **kw: functional_call(model, p, a, kw)  # noqa: E731
            return task.batch_task_loss(task.decode(call, batch), batch)

        def step():
            theta = {k: p.detach() for k, p in model.named_parameters()}
            g = (gaussian_smoothing_grad(f, theta, 0.05, 2, baseline="antithetic", generator=gen, vectorize=False)
                 if estimator == "gaussian" else spsa_grad(f, theta, 0.05, 2, generator=gen, vectorize=False))
            with torch.no_grad():
                for k, p in model.named_parameters():
                    p.sub_(0.3 * g[k])
        return step
    return build


def _direct_soap(model, batch, task):
    opt = SOAP(model.parameters(), lr=1e-2, weight_decay=0.0)

    def closure():
        opt.zero_grad()
        loss = _nll(model, batch)
        loss.backward()
        return loss

    def step():
        first = not opt.state
        opt.step(closure)
        if first:                          # the rule steps SOAP again on its first gradient
            opt.step()
    return step


def _direct_muon(model, batch, task):
    muon, adamw = muon_with_adamw(model, lr=0.02, momentum=0.95, adamw_lr=1e-2)

    def step():
        model.zero_grad()
        _nll(model, batch).backward()
        muon.step()
        adamw.step()
    return step


SEQUENCE_DIRECT = [
    ("sgd", dict(lr=0.1), _direct_optim(lambda ps: torch.optim.SGD(ps, lr=0.1))),
    ("momentum", dict(lr=0.1, momentum=0.9), _direct_optim(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))),
    ("adam", dict(lr=1e-2), _direct_optim(lambda ps: torch.optim.Adam(ps, lr=1e-2))),
    ("clipped_sgd", dict(lr=0.5, gamma=0.1), _direct_optim(lambda ps: ClippedSGD(ps, lr=0.5, gamma=0.1))),
    ("mgs", dict(n_samples=3, alpha=0.05, lr=0.5, seed=3), _direct_mgs),
    ("reinforce", dict(lr=0.1, n_samples=3, mle_weight=0.5, seed=6), _direct_reinforce),
    ("mezo", dict(lr=0.1, sigma=1e-2, n_samples=2, seed=5), _direct_mezo),
    ("zo_gaussian", dict(lr=0.3, sigma=0.05, n_samples=2, seed=4), _direct_zo("gaussian")),
    ("spsa", dict(lr=0.3, sigma=0.05, n_samples=2, seed=4), _direct_zo("spsa")),
    ("shampoo", dict(lr=1e-2), _direct_optim(lambda ps: Shampoo(ps, lr=1e-2, epsilon=1e-8))),
    ("soap", dict(lr=1e-2), _direct_soap),
    ("muon", dict(lr=0.02, adamw_lr=1e-2), _direct_muon),
]


@pytest.mark.parametrize("name, hp, direct", SEQUENCE_DIRECT)
def test_wrapped_rules_on_an_lm_equal_direct_use_bit_for_bit(name, hp, direct):
    pb = seq_problem()
    lm, batch, task = completion()
    model = CausalLM(lm)
    rule, step = make_rule(name, pb, **hp), direct(model, batch, task)
    moved = False
    for _ in range(3):
        before = _params(pb.model)
        rule.step()
        step()
        moved |= any(not torch.equal(a, b) for a, b in zip(before, _params(pb.model)))
    for a, b in zip(_params(pb.model), _params(model)):
        assert torch.equal(a, b), name
    assert moved or name in ("mezo", "zo_gaussian", "spsa"), name   # a flat task loss may leave ZO rules still


def test_every_gradient_or_search_rule_has_a_sequence_bit_for_bit_test():
    covered = {n for n, _, _ in SEQUENCE_DIRECT}
    assert set(applicable_rules(seq_problem())) <= covered
