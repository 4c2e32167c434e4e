"""The harness's ``shampoo``, ``soap`` and ``muon`` rules: registered with what they wrap, the Muon / AdamW split on a
problem's model, SOAP's first proposed step (statistics, then a step on the same gradient, one pass), and Shampoo's
first step with the preconditioner's closed form (the polar factor of the weight's gradient, Adam's length)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from taskloss.curvature import SOAP, Shampoo, muon_with_adamw
from taskloss.harness import RULES, Problem, make_rule, propose


def _problem(seed: int = 0) -> Problem:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    torch.manual_seed(seed)
    return Problem(nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double(), X, y)


def test_registered_with_what_they_wrap():
    assert RULES["shampoo"].wraps == (Shampoo,)
    assert RULES["soap"].wraps == (SOAP,)
    assert RULES["muon"].wraps[0] is muon_with_adamw and torch.optim.Muon in RULES["muon"].wraps
    for n in ("shampoo", "soap", "muon"):
        assert RULES[n].objective == "surrogate"


def test_muon_rule_splits_matrices_and_the_rest():
    pb = _problem()
    rule = make_rule("muon", pb)
    muon = {id(p) for g in rule.opt.param_groups for p in g["params"]}
    rest = {id(p) for g in rule.opt_rest.param_groups for p in g["params"]}
    assert muon == {id(pb.model[0].weight), id(pb.model[2].weight)}
    assert rest == {id(pb.model[0].bias), id(pb.model[2].bias)}
    rule = make_rule("muon", _problem(), exclude=("2.weight",))        # an output head to AdamW
    assert len(rule.opt.param_groups[0]["params"]) == 1


def test_soap_rule_moves_on_its_first_step_with_one_pass():
    rec = propose("soap", _problem())
    assert float(rec.delta.norm()) > 0
    assert (rec.passes.forward, rec.passes.backward) == (1, 1)


def test_shampoo_rule_first_step_is_the_grafted_polar_factor():
    pb = _problem()
    w = pb.model[0].weight
    pb.model.zero_grad()
    pb.surrogate().backward()
    g = w.grad.detach().clone()
    rec = propose("shampoo", pb, lr=0.01, epsilon=1e-20)
    step = -rec.delta[: w.numel()].view_as(w)
    u, _, vh = torch.linalg.svd(g)
    polar = u[:, :5] @ vh
    adam_len = 0.01 * (g.abs() / (g.abs() + 1e-8)).norm()   # Adam's first step: lr·g/(|g| + ε)
    torch.testing.assert_close(step, polar * adam_len / polar.norm(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["shampoo", "soap", "muon"])
def test_bad_hyperparameters_raise(name):
    with pytest.raises((ValueError, TypeError)):
        make_rule(name, _problem(), lr=float("nan"))
