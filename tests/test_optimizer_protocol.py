"""The optimizer protocol, derived: every optimizer-like class of the package against torch.optim's shape, column by
column, and the table in ``docs/vocabulary.md`` equal to what the checks find (a "yes" passes its check, a "no"
fails it and carries a reason that the class's docstring states too).

Columns: a ``torch.optim.Optimizer``; ``step(closure)``; ``step()``; hyperparameters in ``param_groups``;
``add_param_group``; an LR scheduler (``LambdaLR`` and ``StepLR``) changes the steps as a manual change of ``lr``
would; ``state_dict`` round trip (resuming after a save gives the same next steps as an uninterrupted run, RNG
state included)."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.curvature import (
    KFAC,
    SOAP,
    FisherDiagonalPreconditioner,
    HessianFree,
    NaturalGaussianVI,
    NaturalGradientDescent,
    Shampoo,
    ggn_matrix,
    nll_loss,
)
from taskloss.dynamics import ClippedSGD
from taskloss.harness import Problem, make_rule
from taskloss.search import MGS, MeZO
from taskloss.utils import REPO_ROOT

COLUMNS = ["torch.optim.Optimizer", "step(closure)", "step()", "param_groups", "add_param_group", "LR scheduler",
           "state_dict round trip"]
X = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(1))


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def _backward(net):
    def closure():
        for p in net.parameters():
            p.grad = None
        loss = nll_loss(net(X), Y)
        loss.backward()
        return loss
    return closure


@dataclass
class Case:
    """How to build one class over a fresh model and take its most natural step."""

    build: Callable[[int], tuple]                # seed -> (obj, model-or-state holder)
    step: Callable[[object, object], None]       # (obj, holder) -> one step
    closure: Callable[[object, object], Callable] | None = None
    prepare: Callable[[object, object], None] | None = None       # before a plain step(): set the gradients
    state: Callable[[object, object], list] = lambda o, h: [p.detach().clone() for p in h.parameters()]
    lr_of: Callable[[object], list] | None = None                 # the object with the learning rates


def _mgs(seed):
    net = _net()
    return MGS(net, torch.optim.SGD(net.parameters(), lr=1.0), lambda out, b: F.cross_entropy(out, b[1]),
               seed=seed, n_samples=3), net


def _mgs_closure(o, net):
    def closure():
        loss = F.cross_entropy(net(X), Y)
        loss.backward()
        return loss, (X, Y)
    return closure


def _mezo_closure(o, net):
    return lambda: nll_loss(net(X), Y)


def _hf_closure(o, net):
    def closure():
        return _backward(net)(), X
    return closure


def _vi(seed):
    vi = NaturalGaussianVI(lambda z: -(z ** 2).sum(), torch.zeros(2), torch.eye(2), lr=0.5,
                           generator=torch.Generator().manual_seed(seed))
    return vi, vi


def _kfac(seed):
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    return KFAC(net, fisher_type="mc", kl_clip=1e-2, optimizer=opt, inverse_update_interval=2,
                generator=torch.Generator().manual_seed(seed)), (net, opt)


def _kfac_step(k, h):
    net, opt = h
    out = net(X)
    k.update_statistics(X, Y, outputs=out)
    opt.zero_grad()
    nll_loss(out, Y).backward()
    k.precondition_()
    opt.step()


def _diag(seed):
    net = _net()
    return FisherDiagonalPreconditioner(net, "mc", generator=torch.Generator().manual_seed(seed)), \
        (net, torch.optim.SGD(net.parameters(), lr=0.1))


def _diag_step(p, h):
    net, opt = h
    _backward(net)()
    p.update_statistics(X, Y)
    p.precondition_()
    opt.step()


def _soap(seed):
    net = _net()
    opt = SOAP(net.parameters(), lr=0.01, precondition_frequency=2)
    opt.step(_backward(net))          # SOAP's first call gathers statistics only: built past it, its steps move
    return opt, net


def _rule(seed):
    net = _net()
    return make_rule("mgs", Problem(net, X, Y), seed=seed, n_samples=3), net


CASES = {
    "MGS": Case(_mgs, lambda o, h: o.step(_mgs_closure(o, h)), _mgs_closure),
    "MeZO": Case(lambda s: (lambda n: (MeZO(n.parameters(), lr=0.1, sigma=1e-2, seed=s), n))(_net()),
                 lambda o, h: o.step(_mezo_closure(o, h)), _mezo_closure),
    "HessianFree": Case(lambda s: (lambda n: (HessianFree(n.parameters(), n, cg_iters=3), n))(_net()),
                        lambda o, h: o.step(_hf_closure(o, h)), _hf_closure),
    "NaturalGradientDescent": Case(
        lambda s: (lambda n: (NaturalGradientDescent(n.parameters(), lambda: ggn_matrix(n, None, X), lr=0.5,
                                                     damping=1e-3), n))(_net()),
        lambda o, h: o.step(_backward(h)), lambda o, h: _backward(h), lambda o, h: _backward(h)()),
    "ClippedSGD": Case(lambda s: (lambda n: (ClippedSGD(n.parameters(), lr=0.1, gamma=0.5, momentum=0.9), n))(_net()),
                       lambda o, h: o.step(_backward(h)), lambda o, h: _backward(h), lambda o, h: _backward(h)()),
    "Shampoo": Case(lambda s: (lambda n: (Shampoo(n.parameters(), lr=0.01, betas=(0.9, 0.99)), n))(_net()),
                    lambda o, h: o.step(_backward(h)), lambda o, h: _backward(h), lambda o, h: _backward(h)()),
    "SOAP": Case(_soap, lambda o, h: o.step(_backward(h)), lambda o, h: _backward(h), lambda o, h: _backward(h)()),
    "NaturalGaussianVI": Case(_vi, lambda o, h: o.step(), state=lambda o, h: [o.mean.clone(), o.precision.clone()]),
    "KFAC": Case(_kfac, _kfac_step, state=lambda o, h: [p.detach().clone() for p in h[0].parameters()],
                 lr_of=lambda o: None),
    "FisherDiagonalPreconditioner": Case(_diag, _diag_step,
                                         state=lambda o, h: [p.detach().clone() for p in h[0].parameters()]),
    "harness rules (make_rule)": Case(_rule, lambda o, h: o.step()),
}


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _ok(fn) -> bool:
    try:
        return bool(fn())
    except (TypeError, ValueError, RuntimeError, AttributeError, KeyError):
        return False


def check(name: str, column: str) -> bool:
    c = CASES[name]
    o, h = c.build(0)
    if column == "torch.optim.Optimizer":
        return isinstance(o, torch.optim.Optimizer)
    if column == "step(closure)":
        def run():
            before = c.state(o, h)
            o.step(c.closure(o, h))
            return not _equal(before, c.state(o, h))
        return c.closure is not None and _ok(run)
    if column == "step()":
        def run():
            if c.prepare is not None:
                c.prepare(o, h)
            before = c.state(o, h)
            o.step()
            return not _equal(before, c.state(o, h))
        return _ok(run)
    if column == "param_groups":
        groups = getattr(o, "param_groups", None)
        return isinstance(o, torch.optim.Optimizer) and bool(groups) and all(len(g) > 1 for g in groups)
    if column == "add_param_group":
        def run():
            extra = nn.Parameter(torch.zeros(2))
            if isinstance(h, nn.Module):             # a parameter of the model the optimizer does not hold yet
                h.register_parameter("extra", extra)
            n = len(o.param_groups)
            o.add_param_group({"params": [extra]})
            return len(o.param_groups) == n + 1
        return isinstance(o, torch.optim.Optimizer) and _ok(run)
    if column == "LR scheduler":
        if not isinstance(o, torch.optim.Optimizer) or "lr" not in o.param_groups[0]:
            return False

        def run():
            for make in (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5 ** e),
                         lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)):
                a, ha = c.build(0)
                b, hb = c.build(0)
                sched = make(a)
                c.step(a, ha)
                sched.step()                         # a: halved by the scheduler
                c.step(b, hb)
                for g in b.param_groups:             # b: halved by hand
                    g["lr"] = 0.5 * g["lr"]
                if [g["lr"] for g in a.param_groups] != [g["lr"] for g in b.param_groups]:
                    return False
                c.step(a, ha)
                c.step(b, hb)
                if not _equal(c.state(a, ha), c.state(b, hb)):
                    return False
            return True
        return _ok(run)
    if column == "state_dict round trip":
        def run():
            torch.manual_seed(7)
            a, ha = c.build(0)
            for _ in range(2):
                c.step(a, ha)
            saved = copy.deepcopy((a.state_dict(), _holder_state(ha), torch.get_rng_state()))
            for _ in range(2):
                c.step(a, ha)
            straight = c.state(a, ha)
            b, hb = c.build(1)                       # another seed: everything comes from the state_dict
            _load_holder(hb, saved[1])
            b.load_state_dict(saved[0])
            torch.set_rng_state(saved[2])
            for _ in range(2):
                c.step(b, hb)
            return _equal(straight, c.state(b, hb))
        return hasattr(o, "state_dict") and _ok(run)
    raise KeyError(column)


def _holder_state(h):
    if isinstance(h, tuple):                         # (model, optimizer) of a preconditioner
        return h[0].state_dict(), h[1].state_dict()
    return h.state_dict() if isinstance(h, nn.Module) else None


def _load_holder(h, state):
    if isinstance(h, tuple):
        h[0].load_state_dict(state[0])
        h[1].load_state_dict(state[1])
    elif isinstance(h, nn.Module):
        h.load_state_dict(state)


def _documented_table() -> dict[str, dict[str, str]]:
    text = (REPO_ROOT / "docs" / "vocabulary.md").read_text(encoding="utf-8")
    block = text[text.index("<!-- optimizer table -->"):text.index("<!-- end of the optimizer table -->")]
    rows = [r for r in block.splitlines() if r.startswith("| ") and not r.startswith("| class") and "---" not in r]
    table = {}
    for r in rows:
        cells = [x.strip() for x in r.strip("|").split("|")]
        table[cells[0].strip("`")] = dict(zip(COLUMNS, cells[1:]))
    return table


TABLE = _documented_table()


def test_the_table_has_every_class_and_column():
    assert set(TABLE) == set(CASES)
    assert all(list(row) == COLUMNS for row in TABLE.values())


@pytest.mark.parametrize("name,column", [(n, c) for n in CASES for c in COLUMNS])
def test_each_cell_is_what_the_check_finds(name, column):
    cell = TABLE[name][column]
    assert cell == "yes" or re.match(r"no[¹²³⁴⁵⁶⁷⁸⁹]+$", cell), f"{name} / {column}: {cell!r} is not yes or no+note"
    assert check(name, column) == (cell == "yes"), f"{name} / {column}: the table says {cell!r}"


def test_classes_that_are_not_optimizers_say_why_in_their_docstring():
    from taskloss.harness.rules import _Rule
    for cls in (KFAC, FisherDiagonalPreconditioner, NaturalGaussianVI, _Rule):
        assert "Not a ``torch.optim.Optimizer``" in (cls.__doc__ or ""), cls.__name__
