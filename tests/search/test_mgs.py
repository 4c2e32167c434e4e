"""MGS (taskloss.search.mgs): weights and mixture density against float64/scipy direct computations, evaluation modes
(vmap vs loop, low-memory vs stored noise), numerical robustness, the reference's density formula, bad input."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import logsumexp
from scipy.stats import norm
from torch import nn

from taskloss.sampling import effective_sample_size
from taskloss.search import MGS, mgs_weights, mixture_log_density
from helpers import mgs_closure, mgs_step, with_surrogate


# ------------------------------------------------------------------------------------------------ helpers
def direct_log_q(deltas, grads, sigmas, mix, unit_sigma=False):
    """float64 scipy/numpy log q(Δθ) for one candidate (lists of numpy arrays)."""
    if unit_sigma:  # the reference code's formula
        ee = sum(float((d * d).sum()) for d in deltas)
        dg = sum(float(((d + g) ** 2).sum()) for d, g in zip(deltas, grads))
        return float(np.log(mix * np.exp(-0.5 * ee) + (1 - mix) * np.exp(-0.5 * dg)))
    l0 = sum(norm.logpdf(d, loc=0.0, scale=s).sum() for d, s in zip(deltas, sigmas) if s > 0)
    l1 = sum(norm.logpdf(d, loc=-g, scale=s).sum() for d, g, s in zip(deltas, grads, sigmas) if s > 0)
    terms = ([l0 + np.log(mix)] if mix > 0 else []) + ([l1 + np.log1p(-mix)] if mix < 1 else [])
    return float(logsumexp(terms))


def direct_weights(losses, base, log_q, alpha):
    lw = -(np.asarray(losses, np.float64) - base) / alpha - np.asarray(log_q, np.float64)
    lw -= lw.max()
    w = np.exp(lw)
    return w / w.sum()


def tiny_problem(dtype=torch.float64, seed=0, n=32):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=dtype)
    y = torch.randint(0, 2, (n,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)
    return model, (X, y)


def ce_surrogate(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1])


def ce_task(out, batch):  # a smooth task loss: makes every candidate's weight differ
    return 3.0 * F.cross_entropy(out, batch[1])


def err_task(out, batch):
    return (out.argmax(-1) != batch[1]).to(out.dtype).mean()


def make(model, **kw):
    kw.setdefault("seed", 3)
    lr = kw.pop("lr", 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    surrogate, task = kw.pop("surrogate", ce_surrogate), kw.pop("task", ce_task)
    return with_surrogate(MGS(model, opt, task, **kw), surrogate)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ------------------------------------------------------------------------------------- functional core
@pytest.mark.parametrize("mix", [0.0, 0.3, 0.5, 1.0])
def test_mixture_log_density_matches_scipy(mix):
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 2, 2)]
    grads = [rng.normal(size=s) for s in shapes]
    sigmas = [0.3, 1.7, 0.05]
    K = 5
    deltas = [rng.normal(size=(K, *s)) * 0.5 - (rng.random() < 0.5) * g for s, g in zip(shapes, grads)]
    got = mixture_log_density([torch.tensor(d) for d in deltas], [torch.tensor(g) for g in grads], sigmas, mix)
    want = [direct_log_q([d[k] for d in deltas], grads, sigmas, mix) for k in range(K)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-9)
    one = mixture_log_density([torch.tensor(d[0]) for d in deltas], [torch.tensor(g) for g in grads], sigmas, mix)
    assert one.shape == () and math.isclose(float(one), want[0], rel_tol=1e-10)


def test_mixture_log_density_skips_unperturbed_tensors():
    g = [torch.tensor([1.0, -2.0], dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    d = [torch.tensor([0.1, 0.4], dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    full = mixture_log_density(d, g, [0.5, 0.0], 0.5)
    assert math.isclose(float(full), direct_log_q([d[0].numpy()], [g[0].numpy()], [0.5], 0.5), rel_tol=1e-12)


def test_mixture_log_density_unperturbed_tensor_is_an_atom():
    """σ_t = 0: component 0 is the point mass Δθ_t = 0, component 1 the point mass Δθ_t = −g_t (densities w.r.t.
    Lebesgue on the perturbed tensors × counting measure on the atoms). A Δθ_t on neither atom has density 0."""
    g = [torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([0.5, 0.25, -1.0], dtype=torch.float64)]
    live = torch.tensor([0.1, 0.4], dtype=torch.float64)
    l0 = float(norm.logpdf(live.numpy(), 0.0, 0.5).sum())                 # the live tensor under each component
    l1 = float(norm.logpdf(live.numpy(), -g[0].numpy(), 0.5).sum())
    on_zero = mixture_log_density([live, torch.zeros(3, dtype=torch.float64)], g, [0.5, 0.0], 0.3)
    on_mle = mixture_log_density([live, -g[1]], g, [0.5, 0.0], 0.3)
    off = mixture_log_density([live, torch.full((3,), 0.1, dtype=torch.float64)], g, [0.5, 0.0], 0.3)
    assert math.isclose(float(on_zero), math.log(0.3) + l0, rel_tol=1e-12)     # only the zero-centred atom
    assert math.isclose(float(on_mle), math.log(0.7) + l1, rel_tol=1e-12)      # only the MLE-centred atom
    assert float(off) == -math.inf                                             # on neither: q = 0
    with pytest.raises(ValueError, match="log_q must be finite"):              # such a Δθ cannot come from q
        mgs_weights(torch.zeros(2), 0.0, torch.stack([on_zero, off]), 1.0)
    # MGS leaves a tensor with zero gradient (σ_t = 0 in relative mode) at Δθ_t = 0: both atoms coincide
    model, batch = tiny_problem()
    model.unused = nn.Parameter(torch.ones(3, dtype=torch.float64))       # no gradient reaches it
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(ce_surrogate(model, batch), list(model.parameters()), allow_unused=True)
    st = mgs_step(make(model, n_samples=4, max_grad_norm=None, density="mixture"), batch, return_deltas=True)
    assert st.sigmas[names.index("unused")] == 0.0 and all(bool((d["unused"] == 0).all()) for d in st.deltas)
    assert all(math.isfinite(v) for v in st.log_q.tolist())
    want = mixture_log_density([torch.stack([d[n] for d in st.deltas]) for n in names],
                               [torch.zeros_like(p) if g is None else g for g, p in zip(grads, model.parameters())],
                               st.sigmas, 0.5)
    torch.testing.assert_close(st.log_q, want, rtol=1e-10, atol=1e-8)


def test_unit_sigma_reproduces_reference_formula():
    rng = np.random.default_rng(1)
    g = [rng.normal(size=(4, 3)) * 0.3, rng.normal(size=5) * 0.3]
    d = [rng.normal(size=(4, 3)) * 0.2 - g[0], rng.normal(size=5) * 0.2 - g[1]]
    # the reference: q = 0.5 exp(-½ε·ε) + 0.5 exp(-½ε·ε + ε·n - ½n·n) with n = -∇ (its "g")
    n = [-x for x in g]
    ee = sum((x * x).sum() for x in d)
    en = sum((x * y).sum() for x, y in zip(d, n))
    nn_ = sum((y * y).sum() for y in n)
    ref = math.log(0.5 * math.exp(-0.5 * ee) + 0.5 * math.exp(-0.5 * ee + en - 0.5 * nn_))
    got = mixture_log_density([torch.tensor(x) for x in d], [torch.tensor(x) for x in g], 123.0, 0.5,
                              density="unit_sigma")
    assert math.isclose(float(got), ref, rel_tol=1e-12)
    # where the reference's exp() underflows to log(0) = -inf, the logsumexp form stays finite
    big = [torch.full((1000,), 3.0)]
    assert math.isfinite(float(mixture_log_density(big, [torch.zeros(1000)], 1.0, 0.5, density="unit_sigma")))


def test_mgs_weights_match_direct():
    rng = np.random.default_rng(2)
    L, lq = rng.random(6), rng.normal(size=6) * 3
    got = mgs_weights(torch.tensor(L), 0.4, torch.tensor(lq), 0.2)
    torch.testing.assert_close(got, torch.tensor(direct_weights(L, 0.4, lq, 0.2)), rtol=1e-12, atol=1e-15)
    log = mgs_weights(torch.tensor(L), 0.4, torch.tensor(lq), 0.2, log=True)
    torch.testing.assert_close(log.exp(), got)


def test_mgs_weights_extreme_values_no_nan():
    L = torch.tensor([1e4, 1e4 + 1.0, 3e4, float("inf")])
    w = mgs_weights(L, 2e4, torch.tensor([-800.0, 900.0, 0.0, 0.0]), 1e-6)
    assert bool(torch.isfinite(w).all()) and math.isclose(float(w.sum()), 1.0)
    assert int(w.argmax()) == 0 and float(w[3]) == 0.0
    # summed losses ≫ 745 (exp overflow in float64) with an ordinary α
    w = mgs_weights(torch.tensor([5e3, 5e3 + 0.5]), 0.0, torch.zeros(2), 1.0)
    torch.testing.assert_close(w, torch.tensor([1.0, math.exp(-0.5)], dtype=torch.float64) / (1 + math.exp(-0.5)))


def test_effective_sample_size():
    assert effective_sample_size(torch.full((8,), 1 / 8)) == pytest.approx(8.0)
    assert effective_sample_size(torch.tensor([1.0, 0, 0])) == pytest.approx(1.0)


# -------------------------------------------------------------------------------------------- the step
@pytest.mark.parametrize("sigma_mode,include_mle,density", [("absolute", False, "mixture"),
                                                            ("relative", True, "mixture"),
                                                            ("relative", False, "unit_sigma")])
def test_step_equals_float64_direct_computation(sigma_mode, include_mle, density):
    model, batch = tiny_problem()
    ref = copy.deepcopy(model)
    sigma = 0.05 if sigma_mode == "absolute" else 0.5
    mgs = make(model, n_samples=6, alpha=0.05, sigma=sigma, sigma_mode=sigma_mode, include_mle=include_mle,
               density=density, max_grad_norm=None, max_update_norm=None)
    theta0 = flat(model)
    st = mgs_step(mgs, batch, return_deltas=True)
    # direct: surrogate gradient, candidate losses by loading θ + Δθ_k into a copy, density with scipy
    ref.zero_grad()
    ce_surrogate(ref, batch).backward()
    grads = [p.grad.double().numpy() for p in ref.parameters()]
    sig = st.sigmas
    if sigma_mode == "relative":
        np.testing.assert_allclose(sig, [sigma * np.abs(g).mean() for g in grads], rtol=1e-12)
    losses, log_q = [], []
    for k, dk in enumerate(st.deltas):
        cand = copy.deepcopy(ref)
        with torch.no_grad():
            for (name, p) in cand.named_parameters():
                p.add_(dk[name])
        with torch.no_grad():
            losses.append(float(ce_task(cand(batch[0]), batch)))
        log_q.append(direct_log_q([dk[n].numpy() for n, _ in ref.named_parameters()], grads, sig, 0.5,
                                  unit_sigma=density == "unit_sigma"))
    with torch.no_grad():
        base = float(ce_task(ref(batch[0]), batch))
    if include_mle:  # candidate 0 is exactly the MLE step -∇l̃
        for (name, _), g in zip(ref.named_parameters(), grads):
            np.testing.assert_allclose(st.deltas[0][name].numpy(), -g, rtol=1e-12)
        assert bool(st.from_mle[0])
    np.testing.assert_allclose(st.task_losses.numpy(), losses, rtol=1e-10)
    np.testing.assert_allclose(st.log_q.numpy(), log_q, rtol=1e-9, atol=1e-8)
    w = direct_weights(losses, base, log_q, 0.05)
    np.testing.assert_allclose(st.weights.numpy(), w, rtol=1e-7, atol=1e-12)
    assert st.ess == pytest.approx(1 / (w ** 2).sum(), rel=1e-7)
    assert st.mle_weight == pytest.approx(w[st.from_mle.numpy()].sum(), abs=1e-12)
    assert st.base_loss == pytest.approx(base, rel=1e-12)
    # SGD(lr=1), no clipping: θ ← θ + Σ_k w_k Δθ_k
    upd = sum(wk * torch.cat([dk[n].reshape(-1) for n, _ in ref.named_parameters()]) for wk, dk in
              zip(w, st.deltas))
    torch.testing.assert_close(flat(model) - theta0, upd, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("task", [ce_task, err_task])
def test_parallel_equals_sequential(task):
    results = []
    for parallel in (True, False):
        model, batch = tiny_problem(torch.float32)
        mgs = make(model, task=task, n_samples=8, chunk_size=3, parallel=parallel, alpha=0.1, sigma=0.5)
        stats = [mgs_step(mgs, batch) for _ in range(3)]
        assert mgs.mode == ("vmap" if parallel else "loop")
        results.append((flat(model), torch.stack([s.weights for s in stats])))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)


def test_low_memory_draws_the_stored_noise():
    """From the same θ, regenerated noise equals stored noise bit for bit, and so does log q up to float64 sums of
    other reduction shapes (a wrong draw would move log q by O(1) nats)."""
    out = []
    for low in (False, True):
        model, batch = tiny_problem(torch.float32)
        mgs = make(model, n_samples=5, include_mle=True, low_memory=low, chunk_size=2)
        stats = mgs_step(mgs, batch, return_deltas=True)
        out.append((stats.deltas, stats.log_q, flat(model)))
    assert len(out[0][0]) == len(out[1][0]) == 6
    for stored, regenerated in zip(out[0][0], out[1][0]):
        assert stored.keys() == regenerated.keys()
        for name in stored:
            assert torch.equal(stored[name], regenerated[name]), name
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-12, atol=0)
    # the update Σ w_k Δθ_k is one matrix product over the stored rows but K axpy calls over the regenerated
    # ones: other summation orders (and FMA or not, by CPU kernel), so θ agrees to float32 rounding only
    torch.testing.assert_close(out[0][2], out[1][2], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_low_memory_trajectory_equals_stored_noise(dtype, rtol):
    """Over several steps the two memory modes agree to the rounding of their weighted sums. After the first step
    they score candidates at parameters that may differ in the last bit (one matrix product against K axpy calls,
    whose rounding depends on the CPU's kernels: equal bits under one ATEN_CPU_CAPABILITY, one float32 ulp apart
    under another), so later log q agree to that rounding amplified once through the gradient, not to 1e-12."""
    out = []
    for low in (False, True):
        model, batch = tiny_problem(dtype)
        mgs = make(model, n_samples=5, include_mle=True, low_memory=low, chunk_size=2)
        stats = [mgs_step(mgs, batch) for _ in range(3)]
        out.append((flat(model), torch.stack([s.log_q for s in stats])))
    torch.testing.assert_close(out[0][1], out[1][1], rtol=rtol, atol=0)
    torch.testing.assert_close(out[0][0], out[1][0], rtol=10 * rtol, atol=10 * rtol)


def test_non_vmappable_task_loss_falls_back():
    def python_task(out, batch):  # .item() and Python arithmetic: not vmappable
        return float((out.argmax(-1) != batch[1]).sum().item()) / len(batch[1])

    res = {}
    for mode, kw in {"auto": {"parallel": True}, "forward": {"parallel": True, "vmap_task_loss": False},
                     "loop": {"parallel": False}}.items():
        model, batch = tiny_problem(torch.float32)
        mgs = make(model, task=python_task, n_samples=4, **kw)
        if mode == "auto":
            with pytest.warns(RuntimeWarning, match="falling back to 'vmap_forward'"):
                mgs_step(mgs, batch)
            assert mgs.mode == "vmap_forward"
            mgs_step(mgs, batch)
        else:
            mgs_step(mgs, batch)
            mgs_step(mgs, batch)
        res[mode] = flat(model)
    torch.testing.assert_close(res["auto"], res["loop"])
    torch.testing.assert_close(res["forward"], res["loop"])
    model, batch = tiny_problem(torch.float32)
    with pytest.raises(RuntimeError):  # vmap_task_loss=True: no silent fallback
        mgs_step(make(model, task=python_task, parallel=True, vmap_task_loss=True), batch)


def test_stratified_and_random_assignment():
    model, batch = tiny_problem(torch.float32)
    st = mgs_step(make(model, n_samples=4, assignment="stratified"), batch)
    assert st.from_mle.tolist() == [True, False, True, False]  # the reference alternates MLE, zero, ...
    model, batch = tiny_problem(torch.float32)
    assert mgs_step(make(model, n_samples=3, mix=0.0, assignment="stratified"), batch).from_mle.all()
    model, batch = tiny_problem(torch.float32)
    assert not mgs_step(make(model, n_samples=3, mix=1.0), batch).from_mle.any()
    model, batch = tiny_problem(torch.float32)
    mgs = make(model, n_samples=64, mix=0.3)
    frac = torch.cat([mgs_step(mgs, batch).from_mle for _ in range(4)]).double().mean()
    assert 0.6 < float(frac) < 0.8  # P(MLE component) = 1 - λ = 0.7 over 256 draws


def test_seed_reproducible_and_noise_changes_each_step():
    a, batch = tiny_problem(torch.float32)
    b, _ = tiny_problem(torch.float32)
    sa, sb = make(a, seed=11), make(b, seed=11)
    s1, s2 = mgs_step(sa, batch), mgs_step(sb, batch)
    assert s1.seeds == s2.seeds and mgs_step(sa, batch).seeds != s1.seeds
    torch.testing.assert_close(s1.weights, s2.weights)


def test_no_nan_with_tiny_alpha_and_huge_losses():
    model, batch = tiny_problem(torch.float32)
    big = lambda out, b: 1e4 + 1e4 * F.cross_entropy(out, b[1])  # noqa: E731
    st = mgs_step(make(model, task=big, alpha=1e-6, n_samples=6), batch)
    assert bool(torch.isfinite(st.weights).all()) and st.weights.sum().item() == pytest.approx(1.0)
    assert int(st.weights.argmax()) == int(st.task_losses.argmin())
    assert bool(torch.isfinite(flat(model)).all())


def test_update_clipping_and_optimizer_are_used():
    model, batch = tiny_problem(torch.float32)
    theta0 = flat(model)
    mgs = make(model, sigma=5.0, sigma_mode="absolute", max_update_norm=0.01, lr=1.0)
    st = mgs_step(mgs, batch)
    assert st.update_norm > 0.01
    assert float((flat(model) - theta0).norm()) == pytest.approx(0.01, rel=1e-3)
    model, batch = tiny_problem(torch.float32)
    theta0 = flat(model)
    mgs = make(model, lr=0.0)  # the optimizer applies the step: lr = 0 leaves θ unchanged
    mgs_step(mgs, batch)
    torch.testing.assert_close(flat(model), theta0)


def test_mgs_reduces_a_non_differentiable_task_loss():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 5, generator=g)
    y = (X @ torch.randn(5, generator=g) > 0).long()
    model = nn.Linear(5, 2)
    mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), err_task, n_samples=8, alpha=0.01,
                             seed=0), ce_surrogate)
    first = mgs_step(mgs, (X, y)).base_loss
    for _ in range(30):
        last = mgs_step(mgs, (X, y)).base_loss
    assert last < first - 0.1, (first, last)


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,err", [({"alpha": 0.0}, ValueError), ({"alpha": -1.0}, ValueError),
                                    ({"sigma": 0.0}, ValueError), ({"sigma": -0.1}, ValueError),
                                    ({"mix": 1.5}, ValueError), ({"mix": -0.1}, ValueError),
                                    ({"n_samples": 0}, ValueError), ({"n_samples": 2.5}, TypeError),
                                    ({"sigma_mode": "uniform"}, ValueError), ({"density": "x"}, ValueError),
                                    ({"assignment": "x"}, ValueError), ({"chunk_size": 0}, ValueError),
                                    ({"max_grad_norm": 0.0}, ValueError), ({"vmap_task_loss": "yes"}, ValueError),
                                    ({"alpha": float("nan")}, ValueError), ({"seed": -1}, ValueError)])
def test_bad_hyperparameters_raise(kw, err):
    model, _ = tiny_problem(torch.float32)
    with pytest.raises(err):
        make(model, **kw)


def test_bad_objects_raise():
    model, batch = tiny_problem(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(TypeError):
        with_surrogate(MGS(lambda x: x, opt, ce_task), ce_surrogate)
    with pytest.raises(TypeError):
        with_surrogate(MGS(model, None, ce_task), ce_surrogate)
    with pytest.raises(TypeError):
        MGS(model, opt, "ce")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        with_surrogate(MGS(frozen, opt, ce_task), ce_surrogate)


def test_the_closure_protocol_is_checked():
    """``step(closure)``: the closure computes l̃ on a batch, calls backward, returns ``(loss, batch)``."""
    model, batch = tiny_problem(torch.float32)
    mgs = make(model)
    with pytest.raises(TypeError, match="closure"):
        mgs.step(batch)                                           # the former step(batch)
    with pytest.raises(ValueError, match=r"\(loss, batch\)"):
        mgs.step(lambda: ce_surrogate(model, batch))               # the batch is missing
    with pytest.raises(ValueError, match="must call backward"):
        mgs.step(lambda: (ce_surrogate(model, batch), batch))      # no backward: no gradient
    loss = mgs.step(mgs_closure(model, ce_surrogate, batch))
    assert isinstance(loss, torch.Tensor) and mgs.last_stats.surrogate_loss == float(loss.detach())


def test_an_optimizer_over_other_parameters_is_refused():
    """Issue case: an optimizer over other parameters reported update_norm 1.26 and changed nothing."""
    model, batch = tiny_problem(torch.float32)
    other = nn.Linear(3, 4)
    with pytest.raises(ValueError, match="does not hold the model's trainable parameters"):
        MGS(model, torch.optim.SGD(other.parameters(), lr=1.0), ce_task)
    with pytest.raises(ValueError, match="not trainable parameters of the model"):
        MGS(model, torch.optim.SGD([*model.parameters(), *other.parameters()], lr=1.0), ce_task)
    model[0].bias.requires_grad_(False)                            # a frozen parameter in the optimizer is fine
    mgs = with_surrogate(MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), ce_task, seed=0), ce_surrogate)
    before = model[0].bias.detach().clone()
    mgs_step(mgs, batch)
    assert torch.equal(model[0].bias, before) and "0.bias" not in mgs.names


@pytest.mark.parametrize("flag", ["include_mle", "low_memory", "eval_mode", "eager_base_loss", "keep_deltas"])
def test_flags_must_be_bools(flag):
    """Issue case: 'no' switched on MGS(include_mle=…, eval_mode=…)."""
    model, _ = tiny_problem(torch.float32)
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            make(model, **{flag: bad})
    make(model, **{flag: np.bool_(False)})


def test_nan_losses_raise_clear_errors():
    model, batch = tiny_problem(torch.float32)
    nan_task = lambda out, b: out.sum() * float("nan")  # noqa: E731
    with pytest.raises(ValueError, match="task loss is NaN"):
        mgs_step(make(model, task=nan_task), batch)
    with pytest.raises(ValueError, match=r"not finite: l\(θ\)"):     # the check at θ, on request
        mgs_step(make(model, task=nan_task, eager_base_loss=True), batch)
    calls = []

    def nan_candidates(out, b):  # finite at θ (first call), NaN at the candidates
        calls.append(1)
        return ce_task(out, b) * (1.0 if len(calls) == 1 else float("nan"))

    with pytest.raises(ValueError, match="NaN"):
        mgs_step(make(model, task=nan_candidates, parallel=False), batch)
    with pytest.raises(ValueError, match="surrogate"):
        mgs_step(make(model, surrogate=lambda m, b: m(b[0]).sum() * float("nan")), batch)
    with pytest.raises(ValueError, match="scalar"):       # a closure returning a non-scalar loss
        make(model).step(lambda: (model(batch[0]), batch))
    with pytest.raises(ValueError, match="scalar"):
        mgs_step(make(model, task=lambda out, b: out, parallel=False), batch)


def test_functional_core_bad_input():
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([0.1, float("nan")]), 0.0, torch.zeros(2), 1.0)
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([0.1, 0.2]), 0.0, torch.zeros(3), 1.0)
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([]), 0.0, torch.zeros(0), 1.0)
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([0.1]), 0.0, torch.zeros(1), 0.0)
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([0.1]), float("inf"), torch.zeros(1), 1.0)
    with pytest.raises(ValueError):
        mgs_weights(torch.tensor([float("inf")] * 2), 0.0, torch.zeros(2), 1.0)
    with pytest.raises(ValueError):
        mixture_log_density([torch.zeros(3)], [torch.zeros(4)], 1.0)
    with pytest.raises(ValueError):
        mixture_log_density([torch.zeros(3)], [torch.zeros(3), torch.zeros(1)], 1.0)
    with pytest.raises(ValueError):
        mixture_log_density([torch.zeros(3)], [torch.zeros(3)], [1.0, 2.0])
    with pytest.raises(ValueError):
        mixture_log_density([torch.zeros(3)], [torch.zeros(3)], -1.0)
    with pytest.raises(ValueError):
        mixture_log_density([torch.full((3,), float("nan"))], [torch.zeros(3)], 1.0)
    with pytest.raises(ValueError):
        mixture_log_density([torch.zeros(3)], [torch.zeros(3)], 1.0, density="exact")
    with pytest.raises(ValueError):
        effective_sample_size(torch.tensor([0.5, 0.6]))


def test_loop_mode_hands_the_module_and_restores_parameters():
    model, batch = tiny_problem(torch.float32)
    theta0 = flat(model)
    seen = []

    def forward(model_k, b):  # Python control flow on values + the module's own attributes: loop mode only
        seen.append(isinstance(model_k, nn.Module) and model_k is model and not model_k.training)
        out = model_k(b[0])
        return out if float(out.abs().max()) < 1e6 else out.clamp(-1e6, 1e6)

    mgs = make(model, forward_fn=forward, parallel=False, n_samples=3, lr=0.0)
    mgs_step(mgs, batch)
    assert seen == [True] * 3 and model.training           # 3 candidates (l(θ) is lazy); train mode restored
    torch.testing.assert_close(flat(model), theta0, rtol=0, atol=0)  # lr = 0: candidates were swapped back

    calls = []

    def failing(out, b):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("decoder crashed")
        return ce_task(out, b)

    model, batch = tiny_problem(torch.float32)
    with pytest.raises(RuntimeError, match="decoder crashed"):
        mgs_step(make(model, task=failing, parallel=False), batch)
    torch.testing.assert_close(flat(model), theta0, rtol=0, atol=0)  # θ restored after the error


def test_vmap_modes_hand_forward_fn_the_module_with_its_attributes():
    model, batch = tiny_problem(torch.float32)
    model.n_out = 2
    mgs = make(model, forward_fn=lambda m, b: m(b[0])[:, : m.n_out], parallel=True, vmap_task_loss=True)
    mgs_step(mgs, batch)
    assert mgs.mode == "vmap"


def test_state_dict_resumes_identically():
    a, batch = tiny_problem(torch.float32)
    ma = make(a, seed=5)
    for _ in range(2):
        mgs_step(ma, batch)
    b = copy.deepcopy(a)
    mb = make(b, seed=999)
    mb.load_state_dict(ma.state_dict())
    sa, sb = mgs_step(ma, batch), mgs_step(mb, batch)
    assert sa.seeds == sb.seeds
    torch.testing.assert_close(flat(a), flat(b), rtol=0, atol=0)


def test_base_loss_is_lazy_and_equals_the_eager_value():
    """l(θ) cancels in the weights: the step does not compute it (one forward fewer); MGSStats.base_loss evaluates
    it at that step's parameters when read — equal to the value computed inside the step on request."""
    out = {}
    for eager in (False, True):
        model, batch = tiny_problem()
        calls = []
        task = lambda o, b: calls.append(1) or ce_task(o, b)  # noqa: E731
        mgs = make(model, task=task, n_samples=3, eager_base_loss=eager)
        stats = [mgs_step(mgs, batch) for _ in range(3)]
        assert len(calls) == 3 * (3 + int(eager))                # K candidates (+ l(θ) when eager) per step
        out[eager] = (stats, flat(model))
    torch.testing.assert_close(out[False][1], out[True][1], rtol=0, atol=0)   # same updates
    for lazy, eager in zip(out[False][0], out[True][0]):
        assert lazy.base_loss == pytest.approx(eager.base_loss, rel=1e-12)    # read after later steps: that step's θ
        torch.testing.assert_close(lazy.weights, eager.weights, rtol=0, atol=0)


def test_parallel_auto_chooses_the_loop_on_cpu():
    model, batch = tiny_problem(torch.float32)
    mgs = make(model)
    assert mgs.parallel is False and mgs.mode == "loop"
    assert make(model, parallel=True).mode == "vmap"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_mgs_on_cuda_defaults_to_vmap_and_scores_its_candidates():
    """On a GPU the default is the vmap; its candidate losses equal the loss of θ + Δθ_k evaluated on a CPU copy,
    and SGD(lr=1) moves θ by Σ_k w_k Δθ_k (float64 throughout: tight tolerances)."""
    model, (X, y) = tiny_problem(torch.float64)
    cpu = copy.deepcopy(model)
    model = model.cuda()
    mgs = make(model, n_samples=6, alpha=0.1, sigma=0.5, sigma_mode="absolute", max_grad_norm=None, max_update_norm=None)
    assert mgs.mode == "vmap"
    theta0 = flat(model).cpu()
    st = mgs_step(mgs, (X.cuda(), y.cuda()), return_deltas=True)
    for k, dk in enumerate(st.deltas):
        cand = copy.deepcopy(cpu)
        with torch.no_grad():
            for name, p in cand.named_parameters():
                p.add_(dk[name].cpu())
            assert math.isclose(float(ce_task(cand(X), (X, y))), float(st.task_losses[k]), rel_tol=1e-9)
    upd = sum(float(w) * torch.cat([d[n].reshape(-1).cpu() for n, _ in cpu.named_parameters()])
              for w, d in zip(st.weights, st.deltas))
    torch.testing.assert_close(flat(model).cpu() - theta0, upd, rtol=1e-9, atol=1e-12)


def test_candidate_noise_is_one_randn_per_tensor_from_the_candidates_seed():
    """The batched draw (runs of tensors merged into one randn, long runs cut into cache-sized pieces, all
    candidates at once) yields the stream of one ``randn`` per parameter tensor from generator(seeds[k]), scaled
    by σ_t, minus g for MLE-centred candidates. Sizes: not multiples of 16, under 16, and one tensor longer than
    a chunk, so every merge/cut rule is exercised."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(37, 70), nn.Tanh(), nn.Linear(70, 1200), nn.Tanh(), nn.Linear(1200, 3))
    X, y = torch.randn(16, 37), torch.randint(0, 3, (16,))
    mgs = make(model, n_samples=5, include_mle=True, sigma=0.3, sigma_mode="absolute", max_grad_norm=None,
               max_update_norm=None, lr=0.0)
    grads = torch.autograd.grad(ce_surrogate(model, (X, y)), list(model.parameters()))
    st = mgs_step(mgs, (X, y), return_deltas=True)
    gen = torch.Generator()
    for k, (seed, d) in enumerate(zip(st.seeds, st.deltas)):
        gen.manual_seed(seed)
        for (name, p), g in zip(model.named_parameters(), grads):
            if k == 0:                      # include_mle: exactly −g, no noise drawn
                want = -g
            else:
                want = torch.randn(p.numel(), generator=gen).reshape(p.shape) * 0.3
                want = want - g if bool(st.from_mle[k]) else want
            # equal up to float32 rounding (σz − g rounded once or twice); a wrong stream is off by O(σ)
            torch.testing.assert_close(d[name], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("threads", [1, 2])
def test_row_by_row_draw_is_bit_identical_to_the_batched_draw_and_one_randn_per_tensor(monkeypatch, threads):
    """On a CPU with P ≥ ROW_BLOCK the candidates are drawn row by row (σ_t·z drawn by ``normal_``), spread over
    worker threads from P ≥ THREAD_MIN; below ROW_BLOCK (and on a GPU) all rows together. Both must give, bit for
    bit, the Δθ_k of one ``randn`` per tensor from generator(seeds[k]), times σ_t, minus g for MLE-centred
    candidates — whichever thread draws a row. ROW_BLOCK and THREAD_MIN are lowered so a small model takes the
    threaded row path with several blocks per row (sizes not multiples of 16, under 16, and longer than a block);
    the float64 statistics of the scaled noise s = σ_t z agree with a direct float64 computation."""
    import taskloss.search.mgs_noise as noise_module

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(37, 70), nn.Tanh(), nn.Linear(70, 130), nn.Tanh(), nn.Linear(130, 3))
    X, y = torch.randn(16, 37), torch.randint(0, 3, (16,))
    kw = dict(n_samples=6, include_mle=True, sigma=0.3, sigma_mode="relative", max_grad_norm=None, lr=0.0, seed=11)
    n_threads = torch.get_num_threads()
    recorded = {}
    real_log_q = noise_module.CandidateDraws.log_q

    def spy(self, mix, density):              # keep the draws' float64 statistics for the check below
        recorded["ss"], recorded["sg"], recorded["sigma"] = self.ss.clone(), self.sg.clone(), self.p.sigma
        return real_log_q(self, mix, density)

    monkeypatch.setattr(noise_module.CandidateDraws, "log_q", spy)
    monkeypatch.setattr(noise_module.CandidateDraws, "THREAD_MIN", 0)    # worker threads even for this small P
    deltas, stats = {}, {}
    try:
        torch.set_num_threads(threads)
        for path, block in (("rows", 128), ("batched", 1 << 30)):
            monkeypatch.setattr(noise_module.CandidateDraws, "ROW_BLOCK", block)
            st = mgs_step(make(copy.deepcopy(model), **kw), (X, y), return_deltas=True)
            deltas[path], stats[path] = st, dict(recorded)
            # the workers run torch single-threaded (a thread-local setting): the caller keeps its thread count
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(n_threads)
    st = deltas["rows"]
    grads = torch.autograd.grad(ce_surrogate(model, (X, y)), list(model.parameters()))
    sig = stats["rows"]["sigma"].tolist()
    gen = torch.Generator()
    for k, seed in enumerate(st.seeds):
        gen.manual_seed(seed)
        ss, sg = [], []
        for t, ((name, p), g) in enumerate(zip(model.named_parameters(), grads)):
            assert torch.equal(st.deltas[k][name], deltas["batched"].deltas[k][name]), (k, name)
            if k == 0:                      # include_mle: exactly −g, no noise drawn
                want, s = torch.zeros_like(p).mul_(sig[t]).sub_(g), torch.zeros(p.numel())
            else:
                s = torch.randn(p.numel(), generator=gen).mul_(sig[t])      # σ_t z, rounded to float32
                want = s.reshape(p.shape).clone()
                want = want.sub_(g) if bool(st.from_mle[k]) else want
            assert torch.equal(st.deltas[k][name], want), (k, name)
            ss.append(float((s.double() ** 2).sum()))
            sg.append(float(s.double() @ g.reshape(-1).double()))
        for path in ("rows", "batched"):  # float64 sums in other orders: equal to float64 rounding
            torch.testing.assert_close(stats[path]["ss"][k], torch.tensor(ss, dtype=torch.float64), rtol=1e-12,
                                       atol=1e-14)
            torch.testing.assert_close(stats[path]["sg"][k], torch.tensor(sg, dtype=torch.float64), rtol=1e-12,
                                       atol=1e-14)
