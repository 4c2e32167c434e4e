"""One harness for every update rule, read as an estimate of the ideal update Δθ* = E_p[Δθ] with
p(Δθ) ∝ exp(−[l(θ+Δθ) − l(θ)]/α): the rules of the package behind one interface, their passes counted and
their CPU seconds measured, Δθ* with its Monte Carlo error where it is computable, and training to a pass budget.

Notebook: 16_update_rule_harness (the update distribution is derived in 01_optimization_as_sampling).

Modules:

- :mod:`~taskloss.harness.problem`    — the problem a rule sees (model, batch, surrogate, task loss); pass counting
- :mod:`~taskloss.harness.sequence`   — a causal LM on text completion: token NLL surrogate, greedy task loss
- :mod:`~taskloss.harness.rules`      — the registry: SGD … MeZO wrapped around the real implementations
- :mod:`~taskloss.harness.reference`  — Δθ* by self-normalized importance sampling, its error; step agreement
- :mod:`~taskloss.harness.measure`    — one proposed step, or a training run to an equal pass budget
"""
from taskloss.harness.measure import StepRecord, TrainRecord, propose, train
from taskloss.harness.problem import PassCount, PassCounter, Problem, grad_hessian
from taskloss.harness.reference import IdealUpdate, ideal_update, step_agreement
from taskloss.harness.rules import RULES, RuleSpec, applicable_rules, inapplicable_rules, make_rule, register
from taskloss.harness.sequence import SequenceProblem

__all__ = [
    "Problem", "PassCounter", "PassCount", "grad_hessian", "RULES", "RuleSpec", "register", "make_rule", "applicable_rules",
    "inapplicable_rules",
    "SequenceProblem", "IdealUpdate",
    "ideal_update", "step_agreement", "StepRecord", "TrainRecord", "propose", "train",
]
