"""The harness on a model no one here wrote: ``applicable_rules`` lists exactly the rules that build and step on a
wrapped Hugging Face BERT classifier (the others with the reason: a dense matrix too large, no double backward
through SDPA attention; K-FAC, which keeps the embeddings' plain gradients, and Hessian-free, whose GGN products run
SDPA under its math kernel, build and step), the trial steps leave the problem and the global
random state untouched, ``register`` refuses what is not a rule, and a meta-device model is refused clearly."""
from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from taskloss.harness import RULES, Problem, applicable_rules, inapplicable_rules, make_rule, register

EXPECTED_REASONS = {
    "grad_penalty": "derivative for .*scaled_dot_product",
    "newton": r"dense \[P, P\] Hessian: P = 22499 > max_params = 5000",
    "natural_exact": r"dense \[P, P\] Fisher: P = 22499",
    "natural_empirical": r"dense \[P, P\] Fisher: P = 22499",
}


def test_applicable_rules_tell_the_truth_about_a_wrapped_hf_classifier(bert_classifier):
    model, X, y = bert_classifier
    pb = Problem(model, X, y)
    before = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    reasons = inapplicable_rules(pb)
    assert torch.equal(torch.get_rng_state(), rng)                      # the trials ran on a forked RNG
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))   # and on copies
    assert set(reasons) == set(EXPECTED_REASONS)
    for name, pattern in EXPECTED_REASONS.items():
        assert re.search(pattern, reasons[name]), (name, reasons[name])
    applicable = applicable_rules(pb)
    assert applicable == [n for n in RULES if n not in EXPECTED_REASONS]
    assert set(applicable_rules(pb, trial=False)) == set(RULES)          # the stated reasons alone say nothing
    for name in applicable:                                              # what is listed builds and steps
        rule = make_rule(name, Problem(copy.deepcopy(model), X, y))
        rule.step()


def test_every_rule_applies_to_a_small_mlp_problem():
    torch.manual_seed(0)
    X, y = torch.randn(16, 3, dtype=torch.float64), torch.randint(0, 3, (16,))
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    assert applicable_rules(Problem(model, X, y, weight_decay=1e-2)) == list(RULES)


class _Rule:
    def __init__(self, problem, lr: float = 0.1):
        self.problem, self.lr = problem, lr

    def step(self):
        return None


@pytest.mark.parametrize("bad,exc,match", [
    (lambda problem: None, TypeError, "must be a class whose instances have a step"),
    (type("NoStep", (), {"__init__": lambda self, problem: None}), TypeError, "step"),
    (type("NoProblem", (), {"__init__": lambda self: None, "step": lambda self: None}), TypeError,
     "must take the problem"),
])
def test_register_refuses_what_is_not_a_rule(bad, exc, match):
    with pytest.raises(exc, match=match):
        register("bad", bad)
    assert "bad" not in RULES


def test_register_validates_defaults_description_and_wraps():
    with pytest.raises(ValueError, match=r"defaults \['momentum'\] are not arguments"):
        register("bad", _Rule, {"momentum": 0.9})
    with pytest.raises(TypeError, match="defaults must be a dict"):
        register("bad", _Rule, [("lr", 0.1)])
    with pytest.raises(TypeError, match="description"):
        register("bad", _Rule, description=3)
    with pytest.raises(TypeError, match="wraps"):
        register("bad", _Rule, wraps=("torch.optim.SGD",))
    assert "bad" not in RULES
    try:
        spec = register("mine", _Rule, {"lr": 0.5}, "a test rule", wraps=torch.optim.SGD)
        assert spec.wraps == (torch.optim.SGD,) and "mine" in applicable_rules(
            Problem(nn.Linear(2, 2), torch.zeros(3, 2), torch.tensor([0, 1, 0])))
    finally:
        RULES.pop("mine", None)


def test_meta_device_models_and_batches_are_refused():
    with torch.device("meta"):
        model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="meta device.*to_empty"):
        Problem(model, torch.zeros(4, 3), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="inputs is on the meta device"):
        Problem(nn.Linear(3, 2), torch.zeros(4, 3, device="meta"), torch.tensor([0, 1, 0, 1]))
