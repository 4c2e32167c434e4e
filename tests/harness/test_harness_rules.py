"""The harness against closed forms (Newton = Δθ* of a quadratic; gradient descent = its large-α limit on the
ball), exact pass counts, and bit-identity of each wrapped rule with the implementation used directly."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from taskloss.curvature import SOAP, Shampoo, muon_with_adamw
from taskloss.harness import RULES, PassCounter, Problem, ideal_update, make_rule, propose, step_agreement, train
from taskloss.sampling import ball_expected_update, newton_direction
from taskloss.search import MGS, MeZO
from helpers import mgs_closure


def quadratic(d: int = 4, n: int = 32, seed: int = 0) -> Problem:
    """Least squares ½·mean‖y − Xθ‖²: a quadratic whose Hessian XᵀX/n is also its Fisher (Gaussian likelihood)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, 1, generator=g, dtype=torch.float64)
    model = nn.Linear(d, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.randn(1, d, generator=g, dtype=torch.float64))
    return Problem(model, X, y, likelihood="gaussian")


def softmax_regression(seed: int = 0, wd: float = 1e-2) -> Problem:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(40, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    torch.manual_seed(seed)
    return Problem(nn.Linear(5, 3).double(), X, y, weight_decay=wd)


def closed_form(pb: Problem):
    X, y, th = pb.inputs, pb.targets, pb.flat_params()
    H = X.T @ X / X.shape[0]
    g = X.T @ (X @ th - y[:, 0]) / X.shape[0]
    return g, H


def test_quadratic_newton_is_ideal_update_for_every_alpha():
    pb = quadratic()
    g, H = closed_form(pb)
    newton = -newton_direction(H, g)
    step = propose("newton", pb).delta
    torch.testing.assert_close(step, newton, rtol=1e-10, atol=1e-12)   # the rule is Newton's step
    for alpha in (1e-4, 1e-2, 1.0):   # no ball: p = N(−H⁻¹g, αH⁻¹), mean −H⁻¹g whatever α
        ref = ideal_update(pb, alpha, n_samples=20000, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(ref.newton, newton, rtol=1e-10, atol=1e-12)
        assert ref.ess > 0.99 * 20000                                    # the proposal is p itself
        err = (ref.delta - newton).abs()
        assert bool((err <= 5 * ref.stderr + 1e-12).all()), (alpha, err, ref.stderr)   # within 5 MC std errors
        assert step_agreement(step, ref.delta)["cosine"] > 1 - 1e-3 if alpha < 1 else True


def test_gradient_descent_is_the_first_order_limit_on_the_ball():
    # a ball small enough that the loss is linear on it (ε²λ_max/α ≈ 1e-3): Δθ* is the linear loss's closed form
    # −ε r_{d/2}(x) g/‖g‖ (ball_expected_update), i.e. along −g, with x = ‖g‖ε/α = 0.3
    pb = quadratic(d=3)
    g, H = closed_form(pb)
    eps = 0.01
    alpha = float(g.norm()) * eps / 0.3
    ref = ideal_update(pb, alpha, radius=eps, n_samples=200000, generator=torch.Generator().manual_seed(2))
    assert ref.proposal == "ball"
    assert ref.rel_stderr < 0.05
    linear = ball_expected_update(g, alpha, eps)
    torch.testing.assert_close(ref.delta, linear, rtol=0, atol=float(5 * ref.stderr.max()))
    sgd = propose("sgd", pb, lr=0.1).delta
    torch.testing.assert_close(sgd, -0.1 * g, rtol=1e-10, atol=1e-12)
    assert step_agreement(sgd, ref.delta)["cosine"] > 0.99
    # Newton's direction is not the first-order limit: it is further from Δθ* than gradient descent's
    assert step_agreement(ref.newton, ref.delta)["cosine"] < step_agreement(sgd, ref.delta)["cosine"] - 0.01


def test_natural_gradient_is_newton_for_a_linear_softmax_model():
    pb = softmax_regression()   # GGN = Hessian of the cross-entropy for a linear model; λ from weight decay
    a = propose("natural_exact", pb, lr=1.0, damping=0.0).delta
    b = propose("newton", pb).delta
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name, hp, expected", [
    ("sgd", {}, (1, 1, 0)),
    ("adam", {}, (1, 1, 0)),
    ("grad_penalty", {}, (1, 2, 0)),                         # double backward: the penalty's graph is traversed
    ("mgs", {"n_samples": 4}, (5, 1, 0)),                            # surrogate forward + K candidate forwards
    ("zo_gaussian", {"n_samples": 3}, (6, 0, 0)),          # antithetic: 2n forwards
    ("spsa", {"n_samples": 2}, (4, 0, 0)),
    ("mezo", {"n_samples": 3}, (6, 0, 0)),
    ("reinforce", {}, (1, 1, 0)),
])
def test_pass_counts_are_exact(name, hp, expected):
    pb = softmax_regression()
    c = propose(name, pb, **hp).passes
    assert (c.forward, c.backward, c.functional) == expected


def test_functional_calls_are_counted_apart():
    pb = softmax_regression()
    c = propose("hessian_free", pb, cg_iters=3).passes
    assert c.forward == 1 and c.backward == 1 and c.functional >= 2
    with PassCounter(pb.model) as counter:
        torch.func.vmap(lambda w: torch.func.functional_call(pb.model, {"weight": w, "bias": pb.model.bias},
                                                             (pb.inputs,)).sum())(torch.randn(4, 3, 5).double())
    assert (counter.count.forward, counter.count.functional) == (0, 4)   # a vmap over K = 4 counts 4 forwards
    with PassCounter(pb.model) as counter:                              # nested vmaps multiply: 2 × 3 = 6
        torch.func.vmap(torch.func.vmap(lambda w: torch.func.functional_call(
            pb.model, {"weight": w, "bias": pb.model.bias}, (pb.inputs,)).sum()))(torch.randn(2, 3, 3, 5).double())
    assert counter.count.functional == 6
    pb2, pb3 = softmax_regression(), softmax_regression()             # MGS: vmapped candidates = looped ones
    c_loop = propose("mgs", pb2, n_samples=5).passes
    with PassCounter(pb3.model) as counter:
        MGS(pb3.model, torch.optim.SGD(pb3.model.parameters(), lr=1.0), lambda out, b: pb3.surrogate_from_outputs(out),
            n_samples=5, alpha=0.05, parallel=True, eval_mode=False, seed=0).step(
            mgs_closure(pb3.model, lambda m, b: pb3.surrogate(m), (pb3.inputs, pb3.targets)))
    assert c_loop.forward + c_loop.functional == counter.count.forward + counter.count.functional == 1 + 5
    # per-example vmaps (a Fisher) over N rows one at a time count one pass over the batch when N is known
    pb4 = softmax_regression()
    from taskloss.curvature import fisher_matrix
    for n_known, expected in ((None, 40), (40, 1.0)):
        with PassCounter(pb4.model, n_known) as counter:
            fisher_matrix(pb4.model, None, pb4.inputs, pb4.likelihood)
        assert counter.count.functional == pytest.approx(expected), n_known   # float sum of 1/N weights
    with pytest.raises(ValueError, match="batch_size"):
        PassCounter(pb4.model, 0)


def _params(m):
    return [p.detach().clone() for p in m.parameters()]


def _direct_adam(pb):
    opt = torch.optim.Adam(pb.model.parameters(), lr=0.05)

    def step():
        opt.zero_grad()
        pb.surrogate().backward()
        opt.step()
    return step


def _direct_mgs(pb):
    """MGS used directly (loop mode, SGD(lr=1)); the rule's lr = 1 leaves the surrogate unscaled."""
    mgs = MGS(pb.model, torch.optim.SGD(pb.model.parameters(), lr=1.0), lambda out, b: pb.surrogate_from_outputs(out),
              n_samples=4, alpha=0.05, sigma=1.0, max_grad_norm=None, max_update_norm=None, parallel=False,
              eval_mode=False, seed=3)
    return lambda: mgs.step(mgs_closure(pb.model, lambda m, b: pb.surrogate(m), (pb.inputs, pb.targets)))


def _direct_mezo(pb):
    mezo = MeZO(pb.model.parameters(), lr=0.1, sigma=1e-2, n_samples=2, seed=5)
    return lambda: mezo.step(lambda: pb.surrogate())


def test_every_registered_rule_steps_and_restores():
    pb = softmax_regression()
    before = pb.flat_params().clone()
    for name in RULES:
        rec = propose(name, pb)
        assert torch.equal(pb.flat_params(), before), name
        assert rec.delta.shape == before.shape and float(rec.delta.norm()) > 0, name
        assert rec.passes.total >= 1 and rec.seconds >= 0


def test_train_reaches_budget_and_lowers_the_loss():
    pb = softmax_regression()
    rec = train("sgd", pb, budget=20, lr=0.5)
    assert rec.passes.total >= 20 and rec.steps == 10     # 2 passes per SGD step
    assert rec.final["task_loss"] < rec.history[0]["task_loss"]


def test_bad_inputs_raise_clear_errors():
    pb = quadratic()
    with pytest.raises(ValueError, match="alpha"):
        ideal_update(pb, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        ideal_update(pb, -1.0)
    with pytest.raises(ValueError, match="radius"):
        ideal_update(pb, 1.0, radius=0.0)
    with pytest.raises(ValueError, match="empty batch"):
        Problem(nn.Linear(3, 2), torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="inputs"):
        Problem(nn.Linear(3, 2), torch.full((2, 3), math.nan), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        Problem(nn.Linear(3, 1), torch.zeros(2, 3), torch.tensor([[0.0], [math.inf]]), likelihood="gaussian")
    with pytest.raises(ValueError, match="batch sizes"):
        Problem(nn.Linear(3, 2), torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="likelihood"):
        Problem(nn.Linear(3, 2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), likelihood="poisson")
    with pytest.raises(ValueError, match="unknown rule"):
        make_rule("lbfgs", pb)
    with pytest.raises(ValueError, match="zero step"):
        step_agreement(torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="NaN|finite"):
        step_agreement(torch.tensor([1.0, math.nan]), torch.ones(2))
    with pytest.raises(ValueError, match="lr"):
        propose("sgd", pb, lr=-1.0)
    with pytest.raises(ValueError, match="categorical"):
        propose("reinforce", pb)
    with pytest.raises(ValueError, match="budget"):
        train("sgd", pb, budget=0)


@pytest.mark.parametrize("alpha, proposal", [(1e-2, "laplace"), (0.5, "ball")])
def test_reported_stderr_matches_the_spread_of_independent_estimates(alpha, proposal):
    pb = quadratic(d=3)
    g, H = closed_form(pb)
    eps = 2.0 * float(newton_direction(H, g).norm())
    reps = [ideal_update(pb, alpha, radius=eps, n_samples=2000, proposal=proposal,
                         generator=torch.Generator().manual_seed(100 + i)) for i in range(40)]
    est = torch.stack([r.delta for r in reps])
    spread = est.std(0)
    reported = torch.stack([r.stderr for r in reps]).mean(0)
    ratio = spread / reported
    # 40 replicates: the sample std is within ±35 % of the true one with overwhelming probability
    assert bool(((ratio > 0.6) & (ratio < 1.5)).all()), ratio


def test_set_batch_is_validated_and_read_by_the_rules():
    pb = softmax_regression()
    other = softmax_regression(seed=1)
    with pytest.raises(ValueError, match="empty batch"):
        pb.set_batch(torch.zeros(0, 5, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    assert pb.inputs.shape[0] == 40                                   # the old batch is kept on error
    rule = make_rule("hessian_free", pb, cg_iters=3)
    pb.set_batch(other.inputs, other.targets)
    other.set_flat_params(pb.flat_params())
    a = make_rule("hessian_free", other, cg_iters=3)
    rule.step()
    a.step()
    torch.testing.assert_close(pb.flat_params(), other.flat_params(), rtol=0, atol=0)   # same batch, same step


def test_grad_hessian_matches_autograd():
    pb = softmax_regression()
    g, H = pb.grad_hessian()
    f = pb.flat_loss()
    H_ref = torch.autograd.functional.hessian(f, pb.flat_params())
    torch.testing.assert_close(H, H_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, torch.autograd.functional.jacobian(f, pb.flat_params()), rtol=1e-10, atol=1e-12)


def _direct_kfac(pb):
    from taskloss.curvature import KFAC
    opt = torch.optim.SGD(pb.model.parameters(), lr=0.2)
    kfac = KFAC(pb.model, damping=1e-2 + pb.weight_decay, fisher_type="exact", decay=0.0, inverse_update_interval=1,
                generator=torch.Generator().manual_seed(0))

    def step():
        opt.zero_grad()
        out = pb.model(pb.inputs)
        pb.surrogate_from_outputs(out).backward(retain_graph=True)
        kfac.update_statistics(pb.inputs, pb.targets, outputs=out)
        kfac.precondition_()
        opt.step()
    return step


def _direct_clipped(pb):
    from taskloss.dynamics import ClippedSGD
    opt = ClippedSGD(pb.model.parameters(), lr=0.5, gamma=0.1)

    def closure():
        opt.zero_grad()
        loss = pb.surrogate()
        loss.backward()
        return loss
    return lambda: opt.step(closure)


def _direct_hf(pb):
    from taskloss.curvature import HessianFree
    opt = HessianFree(dict(pb.model.named_parameters()), pb.model, lr=1.0, damping=1e-2 + pb.weight_decay,
                      cg_iters=4, adapt_damping=True)

    def closure():
        opt.zero_grad()
        loss = pb.surrogate()
        loss.backward()
        return loss, pb.inputs
    return lambda: opt.step(closure)


def _direct_zo(pb):
    from torch.func import functional_call

    from taskloss.search import gaussian_smoothing_grad
    gen = torch.Generator().manual_seed(4)

    def step():
        theta = {k: p.detach() for k, p in pb.model.named_parameters()}
        f = lambda p: pb.surrogate_from_outputs(functional_call(pb.model, p, (pb.inputs,)), p.values())  # noqa: E731
        g = gaussian_smoothing_grad(f, theta, 1e-2, 5, baseline="antithetic", generator=gen, vectorize=False)
        with torch.no_grad():
            for k, p in pb.model.named_parameters():
                p.sub_(0.3 * g[k])
    return step


MORE_DIRECT = [
    ("adam", dict(lr=0.05), _direct_adam),
    ("mgs", dict(n_samples=4, alpha=0.05, lr=1.0, seed=3), _direct_mgs),
    ("mezo", dict(lr=0.1, sigma=1e-2, n_samples=2, seed=5), _direct_mezo),
    ("kfac", dict(lr=0.2, damping=1e-2, seed=0), _direct_kfac),
    ("clipped_sgd", dict(lr=0.5, gamma=0.1), _direct_clipped),
    ("hessian_free", dict(lr=1.0, damping=1e-2, cg_iters=4, adapt_damping=True), _direct_hf),
    ("zo_gaussian", dict(lr=0.3, sigma=1e-2, n_samples=5, seed=4), _direct_zo),
]


def _closure_of(pb, opt, extra=None):
    def closure():
        opt.zero_grad()
        loss = pb.surrogate()
        (loss if extra is None else loss + extra(loss)).backward()
        return loss
    return closure


def _direct_sgd(pb, **kw):
    opt = torch.optim.SGD(pb.model.parameters(), lr=0.3, **kw)
    return lambda: opt.step(_closure_of(pb, opt))


def _direct_penalty(pb):
    from taskloss.dynamics import gradient_norm_penalty
    opt = torch.optim.SGD(pb.model.parameters(), lr=0.3)
    return lambda: opt.step(_closure_of(pb, opt, lambda loss: 0.05 * gradient_norm_penalty(loss, list(
        pb.model.parameters()))))


def _direct_newton(pb):
    from taskloss.harness import grad_hessian

    def step():
        theta = pb.flat_params()
        g, H = grad_hessian(pb.flat_loss(), theta)
        pb.set_flat_params(theta - 0.5 * newton_direction(H + 1e-3 * torch.eye(H.shape[0], dtype=H.dtype), g))
    return step


def _direct_natural(fisher):
    def build(pb):
        from taskloss.curvature import NaturalGradientDescent, empirical_fisher, fisher_matrix
        fn = ((lambda: fisher_matrix(pb.model, None, pb.inputs, pb.likelihood)) if fisher == "exact" else
              (lambda: empirical_fisher(pb.model, None, pb.inputs, pb.targets, pb.likelihood)))
        opt = NaturalGradientDescent(list(pb.model.parameters()), fn, lr=0.5, damping=1e-3 + pb.weight_decay)
        return lambda: opt.step(_closure_of(pb, opt))
    return build


def _direct_diag(fisher_type, power):
    def build(pb):
        from taskloss.curvature import FisherDiagonalPreconditioner
        opt = torch.optim.SGD(pb.model.parameters(), lr=0.2)
        pre = FisherDiagonalPreconditioner(pb.model, fisher_type, likelihood=pb.likelihood,
                                           damping=1e-2 + pb.weight_decay, decay=0.0, power=power,
                                           generator=torch.Generator().manual_seed(2))

        def step():
            _closure_of(pb, opt)()
            pre.update_statistics(pb.inputs, pb.targets)
            pre.precondition_()
            opt.step()
        return step
    return build


def _direct_reinforce(pb):
    from taskloss.search import classification_reinforce
    opt, gen = torch.optim.SGD(pb.model.parameters(), lr=0.3), torch.Generator().manual_seed(6)

    def step():
        opt.zero_grad()
        classification_reinforce(pb.model(pb.inputs), pb.targets, 5, reward="accuracy", mle_weight=0.0,
                                 generator=gen).loss.backward()
        opt.step()
    return step


def _direct_spsa(pb):
    from torch.func import functional_call

    from taskloss.search import spsa_grad
    gen = torch.Generator().manual_seed(7)

    def step():
        theta = {k: p.detach() for k, p in pb.model.named_parameters()}
        f = lambda p: pb.surrogate_from_outputs(functional_call(pb.model, p, (pb.inputs,)), p.values())  # noqa: E731
        g = spsa_grad(f, theta, 1e-2, 3, generator=gen, vectorize=False)
        with torch.no_grad():
            for k, p in pb.model.named_parameters():
                p.sub_(0.3 * g[k])
    return step


def _direct_shampoo(pb):
    opt = Shampoo(pb.model.parameters(), lr=0.05, epsilon=1e-8)
    return lambda: opt.step(lambda: _surrogate_backward(pb))


def _direct_soap(pb):
    opt = SOAP(pb.model.parameters(), lr=0.05, weight_decay=0.0, precondition_frequency=2)

    def step():
        first = not opt.state
        opt.step(lambda: _surrogate_backward(pb))
        if first:                                   # the rule's documented second call on the first gradient
            opt.step()
    return step


def _direct_muon(pb):
    muon, adamw = muon_with_adamw(pb.model, lr=0.05, momentum=0.9, adamw_lr=0.02)

    def step():
        _surrogate_backward(pb)
        muon.step()
        adamw.step()
    return step


def _surrogate_backward(pb):
    pb.model.zero_grad(set_to_none=True)
    loss = pb.surrogate()
    loss.backward()
    return loss


REMAINING_DIRECT = [
    ("sgd", dict(lr=0.3), _direct_sgd),
    ("momentum", dict(lr=0.3, momentum=0.9), lambda pb: _direct_sgd(pb, momentum=0.9)),
    ("grad_penalty", dict(lr=0.3, mu=0.05), _direct_penalty),
    ("newton", dict(lr=0.5, damping=1e-3), _direct_newton),
    ("natural_exact", dict(lr=0.5, damping=1e-3), _direct_natural("exact")),
    ("natural_empirical", dict(lr=0.5, damping=1e-3), _direct_natural("empirical")),
    ("diag_fisher", dict(lr=0.2, damping=1e-2, seed=2), _direct_diag("exact", 1.0)),
    ("diag_empirical", dict(lr=0.2, damping=1e-2, seed=2), _direct_diag("empirical", 0.5)),
    ("reinforce", dict(lr=0.3, n_samples=5, seed=6), _direct_reinforce),
    ("spsa", dict(lr=0.3, sigma=1e-2, n_samples=3, seed=7), _direct_spsa),
    ("shampoo", dict(lr=0.05), _direct_shampoo),
    ("soap", dict(lr=0.05, precondition_frequency=2), _direct_soap),
    ("muon", dict(lr=0.05, momentum=0.9, adamw_lr=0.02), _direct_muon),
]


@pytest.mark.parametrize("name, hp, direct", MORE_DIRECT + REMAINING_DIRECT)
def test_more_wrapped_rules_equal_direct_use_bit_for_bit(name, hp, direct):
    pb, other = softmax_regression(), softmax_regression()
    rule, step = make_rule(name, pb, **hp), direct(other)
    for _ in range(3):
        rule.step()
        step()
    for a, b in zip(_params(pb.model), _params(other.model)):
        assert torch.equal(a, b), name


def test_every_registered_rule_has_a_bit_for_bit_test():
    """The cases of ``test_more_wrapped_rules_equal_direct_use_bit_for_bit`` are read from its own parametrization:
    a rule registered without a bit-for-bit case (or a case for a rule that is gone) fails here."""
    marks = [m for m in test_more_wrapped_rules_equal_direct_use_bit_for_bit.pytestmark if m.name == "parametrize"]
    covered = [case[0] for m in marks for case in m.args[1]]
    twice = sorted({c for c in covered if covered.count(c) > 1})
    assert not twice, f"rules tested twice: {twice}"
    assert set(covered) == set(RULES), (f"rules without a bit-for-bit test: {sorted(set(RULES) - set(covered))}; "
                                        f"tests of unregistered rules: {sorted(set(covered) - set(RULES))}")
