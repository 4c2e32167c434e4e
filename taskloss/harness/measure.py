"""Running rules on a problem: one proposed step (parameters restored) or a training run to a pass budget,
with passes counted by :class:`~taskloss.harness.problem.PassCounter` and CPU seconds measured.

Derived in notebook 16_update_rule_harness.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from torch import Tensor

from taskloss.harness.problem import PassCount, PassCounter, Problem
from taskloss.harness.rules import make_rule
from taskloss.validation import all_finite, check_int

__all__ = ["StepRecord", "TrainRecord", "propose", "train"]


def _clock() -> float:
    """CPU seconds of this process (less sensitive than wall time to other work on a shared machine)."""
    return time.process_time()


@dataclass
class StepRecord:
    """One step of ``rule`` from fresh optimizer state: ``delta [P]`` = θ_after − θ_before, the counted
    ``passes``, ``seconds`` (CPU) and the task loss before/after."""

    rule: str
    delta: Tensor
    passes: PassCount
    seconds: float
    loss_before: float
    loss_after: float


def propose(name: str, problem: Problem, **hp) -> StepRecord:
    """The step rule ``name`` takes at the current parameters (its first step); the parameters are restored.

    Raises ``ValueError`` when the step produces NaN/inf parameters (they are restored first), ``TypeError`` when
    ``problem`` is not a :class:`Problem`."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a taskloss.harness.Problem, got {type(problem).__name__}")
    theta = problem.flat_params().clone()
    rule = make_rule(name, problem, **hp)
    before = problem.task_loss()
    try:
        with PassCounter(problem.counted_module, problem.inputs.shape[0]) as counter:
            t0 = _clock()
            rule.step()
            seconds = _clock() - t0
        delta = problem.flat_params() - theta
        after = problem.task_loss() if all_finite(delta) else float("nan")
    finally:
        problem.set_flat_params(theta)
        for p in problem.params:
            p.grad = None
    if not all_finite(delta):
        raise ValueError(f"rule {name!r} produced non-finite parameters")
    return StepRecord(name, delta, counter.count, seconds, before, after)


@dataclass
class TrainRecord:
    """A training run: ``steps`` taken, cumulative ``passes`` and ``seconds``, and ``history`` rows
    ``{"step", "passes", "seconds", **evaluate()}`` (row 0 before the first step)."""

    rule: str
    steps: int
    passes: PassCount
    seconds: float
    history: list[dict] = field(default_factory=list)

    @property
    def final(self) -> dict:
        """The last evaluation of the run."""
        return self.history[-1]


def train(name: str, problem: Problem, *, budget: int, evaluate: Callable[[], dict] | None = None,
          eval_every: int = 1, eval_every_passes: float | None = None, next_batch: Callable[[], tuple] | None = None,
          max_steps: int = 100000, **hp) -> TrainRecord:
    """Step rule ``name`` until its counted passes (``PassCount.total``) reach ``budget`` (or ``max_steps``).

    ``evaluate()`` → dict of floats (e.g. validation task losses), called before the first step, every
    ``eval_every`` steps (or, with ``eval_every_passes``, at the first step on or past each multiple of that many
    counted passes) and after the last; its time is not counted. ``next_batch()`` → ``(inputs, targets)``, when
    given, is swapped in by :meth:`Problem.set_batch` before every step (minibatches; not timed). Raises
    ``ValueError`` when the parameters become non-finite (the run cannot go on) or on a non-positive budget or
    evaluation interval."""
    budget = check_int("budget", budget, minimum=1)
    eval_every = check_int("eval_every", eval_every, minimum=1)
    max_steps = check_int("max_steps", max_steps, minimum=1)
    if eval_every_passes is not None and not (isinstance(eval_every_passes, (int, float)) and eval_every_passes > 0):
        raise ValueError(f"eval_every_passes must be a positive number or None, got {eval_every_passes!r}")
    if next_batch is not None and not callable(next_batch):
        raise TypeError("next_batch must be callable () -> (inputs, targets) or None")
    rule = make_rule(name, problem, **hp)
    evaluate = evaluate or (lambda: {"task_loss": problem.task_loss()})
    rec = TrainRecord(name, 0, PassCount(), 0.0, [{"step": 0, "passes": 0, "seconds": 0.0, **evaluate()}])
    mark = eval_every_passes
    with PassCounter(problem.counted_module, problem.inputs.shape[0]) as counter:
        while counter.count.total < budget and rec.steps < max_steps:
            if next_batch is not None:
                problem.set_batch(*next_batch())
                if problem.inputs.shape[0] != counter.batch_size:    # passes are counted in units of N rows
                    raise ValueError(f"next_batch gave {problem.inputs.shape[0]} rows, the first batch had "
                                     f"{counter.batch_size}: minibatches must keep the batch size")
            t0 = _clock()
            rule.step()
            rec.seconds += _clock() - t0
            rec.steps += 1
            if not all(all_finite(p) for p in problem.params):
                raise ValueError(f"rule {name!r} made the parameters non-finite at step {rec.steps}")
            last = counter.count.total >= budget or rec.steps >= max_steps
            if mark is None:
                due = rec.steps % eval_every == 0
            else:
                due = counter.count.total >= mark
                while mark <= counter.count.total:
                    mark += eval_every_passes
            if due or last:
                counter.__exit__()           # evaluation passes are not the rule's
                row = evaluate()
                counter.__enter__()
                rec.history.append({"step": rec.steps, "passes": counter.count.total, "seconds": rec.seconds, **row})
    rec.passes = counter.count
    return rec
