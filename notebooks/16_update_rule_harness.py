# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 16 · One harness for every update rule: each optimizer as an estimate of Δθ*
#
# Notebook 01 made an optimizer step a random variable: at θ the update Δθ has density
#
# $$p(\Delta\theta) \propto \exp\!\Big(-\frac{l(\theta+\Delta\theta)-l(\theta)}{\alpha}\Big)\quad\text{on } \|\Delta\theta\|\le\varepsilon,
# \qquad \Delta\theta_* = \mathbb E_p[\Delta\theta].$$
#
# Its two limits, used throughout this notebook: at **large α** (on a ball ‖Δθ‖ ≤ ε) Δθ* points along −∇l̃, gradient
# descent's direction; at **small α** Δθ* tends to the step to the minimizer of l̃(θ + Δθ) (inside the ball). On a
# quadratic that step *is* Newton's step; on any other loss Newton's first step only approximates it. §2 and §3
# check both statements numerically. MLE-guided parameter search (MGS) is a Monte Carlo estimate of it. Every other rule in this repository
# proposes a Δθ too: momentum, Adam, natural gradient with the exact, K-FAC, diagonal or empirical Fisher,
# Hessian-free, REINFORCE, zeroth-order search, clipped and gradient-penalized SGD.

# %% [markdown]
# **Question.** Read through that lens, how close does each rule's step come to Δθ*, where Δθ* is computable, and
# at what counted cost? Trained at an equal budget, which rules reach a lower task loss than SGD and Adam: on
# digits with accuracy and macro-F1 as task losses, and on a small language model with a sequence task loss of
# its greedy continuations?
#
# **Sources.**
# - Su Jianlin, *从采样看优化：可导优化与不可导优化的统一视角* (Optimization seen as sampling: one view of
#   differentiable and non-differentiable optimization), Scientific Spaces, 2020,
#   [kexue.fm/archives/7521](https://kexue.fm/archives/7521): the update as a random variable.
# - Su Jianlin, *殊途同归的策略梯度与零阶优化* (Policy gradient and zeroth-order optimization: two roads, one
#   destination), Scientific Spaces, 2020, [kexue.fm/archives/7737](https://kexue.fm/archives/7737).
# - S. Welleck, K. Cho, *MLE-guided parameter search for task loss minimization in neural sequence modeling*,
#   AAAI 2021, [arXiv:2006.03158](https://arxiv.org/abs/2006.03158): MGS.
# - K. P. Murphy, *Probabilistic Machine Learning: Advanced Topics*, MIT Press, 2023, the section on natural
#   gradient descent; J. Martens, R. Grosse, *Optimizing neural networks with Kronecker-factored approximate
#   curvature*, ICML 2015, [arXiv:1503.05671](https://arxiv.org/abs/1503.05671); J. Martens, *Deep learning via
#   Hessian-free optimization*, ICML 2010.
# - R. J. Williams, *Simple statistical gradient-following algorithms for connectionist reinforcement learning*,
#   Machine Learning 8, 1992, [doi:10.1007/BF00992696](https://doi.org/10.1007/BF00992696); J. C. Spall,
#   *Multivariate stochastic approximation using a simultaneous perturbation gradient approximation*, IEEE TAC
#   37(3), 1992, [doi:10.1109/9.119632](https://doi.org/10.1109/9.119632); S. Malladi et al., *Fine-tuning
#   language models with just forward passes*, NeurIPS 2023, [arXiv:2305.17333](https://arxiv.org/abs/2305.17333)
#   (MeZO).
#
# Everything runs through `taskloss.harness`. `Problem` holds model, batch, surrogate and task loss. The registry
# `RULES` has entries that *call* the package's implementations. `PassCounter` counts forward, backward and
# `torch.func` calls by hooks. `ideal_update` estimates Δθ* by self-normalized importance sampling, with its
# Monte Carlo error. `propose` takes one step and restores the parameters; `train` runs to a pass budget.

# %% tags=["parameters"]
seed: int = 0                         # [≥ 0] seed of the problems, the samplers and the comparison seeds
device: str = "auto"                  # "auto" (cuda when available), "cpu" or "cuda"
output_dir: str = ""                  # run folder; "" lets the runner choose (runs/interactive/… by hand)
quad_dim: int = 10                    # [≥ 1] dimension of the quadratic
quad_alphas: list[float] = [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0]   # [> 0] temperatures on the quadratic
logit_alphas: list[float] = [1e-4, 1e-3, 1e-2]   # [> 0] temperatures on logistic regression
n_ref: int = 20000                    # [≥ 2] draws per proposal for Δθ*
budget: int = 300                     # [≥ 1] counted passes per training run
n_seeds: int = 5                      # [≥ 3] seeds of the training comparison (a paired verdict needs 3)
hidden: int = 32                      # [≥ 1] hidden width of the digits MLP
n_train: int = 1078                   # [≥ 10, ≤ 1078] training examples used
tune_grid: list[float] = [0.316, 1.0, 3.16]   # [> 0] multipliers of each rule's base learning rate tried
tune_budget: int = 300                # [≥ 1] counted passes per tuning run (held-out 20 % of train)
tune_seeds: int = 2                   # [≥ 1] tuning initializations; a step size is scored by its worst one
n_average: int = 64                   # [≥ 1] independent one-step proposals averaged in §3
logit_budget: int = 24                # [≥ 1] counted passes per run of the logistic-regression race
lm_budget: int = 96                   # [≥ 1] counted passes per run of the small-LM comparison (§6)
lm_seeds: int = 3                     # [≥ 3] seeds of the small-LM comparison (a paired verdict needs 3)
lm_batch: int = 16                    # [≥ 1] prefixes per step
lm_prefix_len: int = 16               # [≥ 1] prefix tokens
lm_decode_len: int = 8                # [≥ 1] greedy tokens decoded (the reference continuation's length)
lm_task_loss: str = "edit_distance+repetition"   # terms of taskloss.lm.completion.TASK_LOSSES joined by '+'
lm_train_prefixes: int = 512          # [≥ 10] training pool (its last 20 % is the tuning hold-out)
lm_eval_prefixes: int = 64            # [≥ 1] held-out (valid split) prefixes every rule is judged on
lm_ppl_blocks: int = 8                # [≥ 1] held-out 64-token blocks for perplexity
lm_tune: bool = False                 # tune each rule's step size as §4 does (the base values of §6 came from it)
lm_tune_grid: list[float] = [0.316, 1.0, 3.16]   # [> 0] multipliers of each rule's base step size
race_seeds: int = 10                  # [≥ 3] paired seeds of the Shampoo/SOAP/Muon race of §7 (at least n_seeds)

# %%
import copy
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

import taskloss.results
from taskloss.results.records import corrected_phrase, load_record
from taskloss.datasets import load_digits_splits
from taskloss.harness import (RULES, PassCounter, Problem, SequenceProblem, applicable_rules, ideal_update, propose,
                              step_agreement, train)
from taskloss.lm import (CompletionTask, completion_pairs, evaluate_completions, heldout_blocks, load_pretrained_lm,
                         perplexity)
from taskloss.losses import accuracy, macro_f1
from taskloss.models import MLP
from taskloss.results.headlines import Tolerance, seed_spread
from taskloss.results.plotting import (FRACTION, MIN_SEEDS_FOR_INTERVAL, NONNEGATIVE, bounded_interval, label_axes,
                                       mean_interval, seed_band, show, small_multiples)

# %%
run = taskloss.results.start("16_update_rule_harness", output_dir, device=device, seed=seed)
dev, f64 = run.device, torch.float64
print("device:", dev, "| rules:", ", ".join(RULES))

# %% [markdown]
# ## 1 · One interface, counted cost
#
# A **rule** comes from `make_rule(name, problem, **hyperparameters)`, and `rule.step()` updates the model in
# place exactly as the wrapped implementation would. A test checks every registered rule bit for bit against
# direct use. Gradient and curvature rules descend the differentiable **surrogate** $\tilde l$: the mean negative
# log-likelihood plus $\tfrac\lambda2\|\theta\|^2$. MGS, the zeroth-order rules and REINFORCE use the **task loss**
# $l$. Where no task loss is given, $l=\tilde l$, and then all rules estimate the same Δθ*.

# %% [markdown]
# Cost is **counted** by hooks on the model, not estimated. A *forward* is a call of the model, a *backward* a
# gradient that autograd propagates through the model's output, and a *functional* call one evaluation inside a
# `torch.func` transform (a GGN-vector product, a per-example Jacobian, a Hessian), counted apart.
#
# One convention keeps rules comparable. A forward under `vmap` over K parameter sets counts K, as K forwards one
# after another would. One that sees r of the batch's N rows counts r/N, so a vmap over the N examples one at a
# time counts one pass. Backward sweeps inside a transform are invisible to the hooks, so a Hessian counts one
# call. CPU seconds (`time.process_time`, one thread) are the other axis, and the fair one for such rules.

# %%
X_all, y_all = load_digits_splits(seed).train
rows = [(n, s.description) for n, s in RULES.items()]
print("\n".join(f"{n:18s} {d}" for n, d in rows))
pb_demo = Problem(nn.Linear(64, 10).to(dev), X_all[:64].to(dev), y_all[:64].to(dev))
with PassCounter(pb_demo.model) as c:
    pb_demo.surrogate().backward()
assert (c.count.forward, c.count.backward, c.count.functional) == (1, 1, 0)
mgs_count = propose("mgs", pb_demo, n_samples=6).passes
assert (mgs_count.forward, mgs_count.backward) == (1 + 6, 1)   # one surrogate pass + K candidate forwards
print("one surrogate backward:", c.count, "| one MGS step with K = 6:", mgs_count)

# %% [markdown]
# ## 2 · A quadratic: where Δθ* is known in closed form
#
# Least squares $\tilde l(\theta)=\frac1{2N}\|y-X\theta\|^2$ is a quadratic with Hessian $H=X^\top X/N$, which is
# also its Fisher (Gaussian likelihood). Without a ball, $p$ is exactly $\mathcal N(-H^{-1}g,\ \alpha H^{-1})$, so
# Δθ* is Newton's step at every α. We put θ at distance 1 from the minimizer in a random direction, so
# ‖H⁻¹g‖ = 1, and take the ball $\|\Delta\theta\|\le\varepsilon$ with ε = 1.5, which holds the Newton point. On the
# ball the small-α limit is still Newton's step, which here is the step to the minimizer.

# %% [markdown]
# For large α the target tends to the uniform distribution tilted by the loss. To first order in 1/α,
# $\Delta\theta_*\approx-\frac1\alpha\mathbb E_U\big[\tfrac{\varepsilon^2-\|\Delta\|^2}2\nabla\tilde l(\theta+\Delta)\big]
# = -\frac{\varepsilon^2}{(d+2)\alpha}\,g$. For a quadratic the curvature term averages out exactly, so the limit
# is gradient descent's direction. `ideal_update` estimates Δθ* by self-normalized importance sampling with two
# proposals, a Laplace one and a uniform-ball one. It keeps the one with the larger effective sample size and
# returns the estimate's standard error with it.

# %%
gq = torch.Generator().manual_seed(seed)
U, _ = torch.linalg.qr(torch.randn(quad_dim, quad_dim, generator=gq, dtype=f64))
spectrum = torch.logspace(0, -2, quad_dim, dtype=f64)                  # condition number 100
Q, _ = torch.linalg.qr(torch.randn(4 * quad_dim, quad_dim, generator=gq, dtype=f64))   # orthonormal columns
Xq = math.sqrt(Q.shape[0]) * Q @ torch.diag(spectrum.sqrt()) @ U.T                    # XᵀX/N = U S Uᵀ
yq = torch.randn(Xq.shape[0], 1, generator=gq, dtype=f64)
quad = Problem(nn.Linear(quad_dim, 1, bias=False).to(dev, f64), Xq.to(dev), yq.to(dev), likelihood="gaussian")
Hq = Xq.T @ Xq / Xq.shape[0]
torch.testing.assert_close(torch.linalg.eigvalsh(Hq), spectrum.flip(0))
theta_star = torch.linalg.lstsq(Xq, yq).solution[:, 0]                # the minimizer
v = torch.randn(quad_dim, generator=gq, dtype=f64)
quad.set_flat_params((theta_star + v / v.norm()).to(dev))              # θ one unit from it: ‖H⁻¹g‖ = 1
gq_ = torch.func.grad(quad.flat_loss())(quad.flat_params())
newton_q = -torch.linalg.solve(Hq, gq_)
torch.testing.assert_close(newton_q.norm(), torch.tensor(1.0, dtype=f64))
radius_q = 1.5
print(f"‖g‖ = {float(gq_.norm()):.3f}, ‖H⁻¹g‖ = {float(newton_q.norm()):.3f}, ε = {radius_q:.3f}")

# %% [markdown]
# The hyperparameters of each rule are shared by the two Δθ* problems. Each rule takes one step from fresh state,
# so Adam's first step is a signed gradient and momentum's equals SGD's. Cosines are scale-free; the relative
# error $\|\Delta\theta-\Delta\theta_*\|/\|\Delta\theta_*\|$ also judges the step length.

# %%
HP = {
    "sgd": dict(lr=1.0), "momentum": dict(lr=1.0), "adam": dict(lr=0.1), "clipped_sgd": dict(lr=1.0, gamma=1.0),
    "grad_penalty": dict(lr=1.0, mu=0.1), "newton": {}, "natural_exact": dict(lr=1.0, damping=0.0),
    "natural_empirical": dict(lr=1.0, damping=1e-3), "kfac": dict(lr=1.0, damping=1e-3),
    "diag_fisher": dict(lr=1.0, damping=1e-3), "diag_empirical": dict(lr=0.1, damping=1e-3),
    "hessian_free": dict(lr=1.0, damping=1e-4, cg_iters=10), "mgs": dict(n_samples=32, alpha=1e-3, lr=1.0, seed=seed),
    "zo_gaussian": dict(lr=1.0, sigma=1e-3, n_samples=16, seed=seed),
    "spsa": dict(lr=1.0, sigma=1e-3, n_samples=16, seed=seed),
    "mezo": dict(lr=1.0, sigma=1e-3, n_samples=16, seed=seed),
}
steps_q = {n: propose(n, quad, **hp) for n, hp in HP.items()}
torch.testing.assert_close(steps_q["newton"].delta, newton_q)                  # Newton's rule is −H⁻¹g
torch.testing.assert_close(steps_q["natural_exact"].delta, newton_q)           # Fisher = Hessian here
torch.testing.assert_close(steps_q["sgd"].delta, -gq_)

# %%
refs_q, agree_q = {}, {n: [] for n in HP}
for a in tqdm(quad_alphas, desc="quadratic: Δθ* over α"):
    refs_q[a] = ideal_update(quad, a, radius=radius_q, n_samples=n_ref,
                             generator=torch.Generator(device=dev).manual_seed(seed))
    for n, s in steps_q.items():
        agree_q[n].append(step_agreement(s.delta, refs_q[a].delta))
for a, r in refs_q.items():
    print(f"α = {a:8.0e}: proposal {r.proposal:7s} ESS {r.ess:8.0f}  ‖Δθ*‖ = {float(r.delta.norm()):.2e} "
          f"± {float(r.stderr.norm()):.1e}  cos(Newton) = {step_agreement(newton_q, r.delta)['cosine']:.4f}  "
          f"cos(−g) = {step_agreement(-gq_, r.delta)['cosine']:.4f}")

# %%
cos_q = {n: np.array([d["cosine"] for d in v]) for n, v in agree_q.items()}
lo, hi = quad_alphas[0], quad_alphas[-1]
# at large α the curvature term left by the control variate sets the noise: ~ε·λ_max/(‖g‖√n) relative
run.claim("quadratic/reference_precise", "the Monte Carlo reference is precise enough to judge at both ends",
          refs_q[lo].rel_stderr < 0.02 and refs_q[hi].rel_stderr < 0.12,
          value=[refs_q[lo].rel_stderr, refs_q[hi].rel_stderr], bound="relative stderr < 0.02 and < 0.12")
run.claim("quadratic/two_limits", "Newton's step is Δθ* at the smallest α, gradient descent's at the largest",
          cos_q["newton"][0] > 0.999 and cos_q["sgd"][-1] > 0.99, value=[cos_q["newton"][0], cos_q["sgd"][-1]],
          bound="cosines > 0.999 and > 0.99")
run.claim("quadratic/hand_over", "each limit loses at the other end, and the hand-over is monotone up to 5 % noise",
          bool(cos_q["sgd"][0] < cos_q["newton"][0] and cos_q["newton"][-1] < cos_q["sgd"][-1]
               and np.all(np.diff(cos_q["sgd"]) > -0.05) and np.all(np.diff(cos_q["newton"]) < 0.05)),
          value=[cos_q["sgd"][0], cos_q["newton"][-1]], bound="monotone within 0.05")
run.record("quadratic/cos_newton_small_alpha", float(cos_q["newton"][0]), headline=True)
run.record("quadratic/cos_sgd_large_alpha", float(cos_q["sgd"][-1]), headline=True)
run.record("quadratic/cos_sgd_small_alpha", float(cos_q["sgd"][0]))
run.record("quadratic/cos_newton_large_alpha", float(cos_q["newton"][-1]))
_ = run.record("quadratic/ref_rel_stderr_max", max(r.rel_stderr for r in refs_q.values()))

# %% [markdown]
# The small-α statement checked in length as well as direction: Δθ* at the smallest α against the step to the
# minimizer, θ_min − θ, which on this quadratic is Newton's step.

# %%
to_min_q = theta_star.to(dev) - quad.flat_params()
torch.testing.assert_close(to_min_q, newton_q.to(dev))                 # the step to the minimizer = Newton's step
agree_min_q = step_agreement(refs_q[lo].delta, to_min_q)
assert agree_min_q["cosine"] > 0.999 and agree_min_q["rel_error"] < 0.02, agree_min_q
print(f"α = {lo:g}: cos∠(Δθ*, θ_min − θ) = {agree_min_q['cosine']:.5f}, relative error {agree_min_q['rel_error']:.4f}")
_ = run.record("quadratic/small_alpha_vs_minimizer_rel_error", agree_min_q["rel_error"])

# %% tags=["hide-input"]
def mean_ci(values, bounds):
    """(mean, [[down], [up]] error bar of its 95 % t-interval clipped to ``bounds``) — no bar below three seeds."""
    mu, lo, hi = mean_interval(np.asarray(values, dtype=float))
    lo, hi = bounded_interval(lo, hi, bounds, clip=True)
    return float(mu), ([[mu - lo], [hi - mu]] if len(values) >= MIN_SEEDS_FOR_INTERVAL else None)


fig, axes = small_multiples(len(cos_q), ncols=4, panel_size=(3.1, 2.1))
for ax, (n, c) in zip(axes, cos_q.items()):
    ax.plot(quad_alphas, cos_q["newton"], color="0.55", ls="--", lw=1)
    ax.plot(quad_alphas, cos_q["sgd"], color="0.55", ls=":", lw=1.3)
    ax.plot(quad_alphas, c, "o-", ms=3, color="C0")
    ax.set_xscale("log")
    ax.set_title(n, fontsize=9)
fig.supxlabel("temperature α (loss units)")
fig.supylabel("cos∠(rule's step, Δθ*) (higher is better)")
fig.suptitle(f"quadratic, d = {quad_dim}, κ = 100: each rule (blue) beside Newton (dashed) and SGD (dotted)")
run.savefig(fig, "quadratic_cosine_vs_alpha.png")
show(fig, "one panel per rule: the cosine between its one step and Δθ* across the temperatures α, with Newton's "
          "(dashed) and gradient descent's (dotted) in every panel. Newton's cosine is "
          "{quadratic/cos_newton_small_alpha:.4f} at the smallest α and {quadratic/cos_newton_large_alpha:.3f} at the "
          "largest; gradient descent's {quadratic/cos_sgd_small_alpha:.3f} and {quadratic/cos_sgd_large_alpha:.4f}.",
     run=run)

# %% [markdown]
# ## 3 · Logistic regression on digits: Δθ* without a closed form
#
# Digits 3 vs 8: the train split, 64 pixels plus a bias, two logits, 130 parameters in float64. Weight decay
# λ = 10⁻² makes the surrogate strictly convex. Δθ* is no longer Newton's step. The Laplace proposal is centred at
# the *minimizer* of $\tilde l(\theta+\Delta)$, and at small α Δθ* tends to the step to that minimizer, which Newton's
# first step only approximates (the same statement as on the quadratic, where the two coincide). We take θ at initialization, no ball, and report each rule's agreement with its counted
# cost. REINFORCE is left out: it estimates the gradient of an expected *accuracy*, not of $\tilde l$, so Δθ* of
# $\tilde l$ is not its target.

# %%
m38 = (y_all == 3) | (y_all == 8)
torch.manual_seed(seed)
logit = Problem(nn.Linear(64, 2).to(dev, f64), X_all[m38].to(dev, f64), (y_all[m38] == 8).long().to(dev),
                weight_decay=1e-2)
HP_l = {**HP, "mgs": dict(n_samples=32, alpha=1e-3, lr=1.0, seed=seed)}
steps_l = {n: propose(n, logit, **hp) for n, hp in HP_l.items()}
refs_l = {a: ideal_update(logit, a, n_samples=n_ref, generator=torch.Generator(device=dev).manual_seed(seed))
          for a in tqdm(logit_alphas, desc="logistic: Δθ* over α")}
for a, r in refs_l.items():
    print(f"α = {a:.0e}: ESS {r.ess:7.0f} of {n_ref}, ‖Δθ*‖ = {float(r.delta.norm()):.3f}, "
          f"MC relative error {r.rel_stderr:.4f}")
torch.testing.assert_close(steps_l["natural_exact"].delta, steps_l["newton"].delta)   # GGN = Hessian: linear model

# %% [markdown]
# The small-α statement checked here too. Newton's method run to convergence (with step halving) gives the
# minimizer θ_min of the strictly convex surrogate. Δθ* at the smallest α is compared with the step to it, θ_min − θ,
# and so is each rule's single step.

# %%
f_l, theta_l0 = logit.flat_loss(), logit.flat_params()
theta_min = theta_l0.clone()
for _ in range(100):
    g_l = torch.func.grad(f_l)(theta_min)
    if float(g_l.norm()) < 1e-12:
        break
    d_l, t_l = -torch.linalg.solve(torch.func.hessian(f_l)(theta_min), g_l), 1.0
    while float(f_l(theta_min + t_l * d_l)) > float(f_l(theta_min)) and t_l > 1e-8:
        t_l /= 2
    theta_min = theta_min + t_l * d_l
assert float(torch.func.grad(f_l)(theta_min).norm()) < 1e-9           # a stationary point of a convex loss
to_min_l = theta_min - theta_l0
ref_vs_min = step_agreement(refs_l[logit_alphas[0]].delta, to_min_l)
cos_to_min = {n: step_agreement(steps_l[n].delta, to_min_l)["cosine"] for n in ("newton", "kfac", "hessian_free", "sgd")}
assert ref_vs_min["cosine"] > 0.99 and ref_vs_min["rel_error"] < 0.1, ref_vs_min
print(f"α = {logit_alphas[0]:g}: cos∠(Δθ*, θ_min − θ) = {ref_vs_min['cosine']:.4f}, relative error "
      f"{ref_vs_min['rel_error']:.4f}; one step's cosine with θ_min − θ: "
      + ", ".join(f"{n} {c:.3f}" for n, c in cos_to_min.items()))
run.record("logistic/small_alpha_vs_minimizer_cos", ref_vs_min["cosine"])
for n, c in cos_to_min.items():
    run.record(f"logistic/cos_to_minimizer_{n}", c)

# %%
a_mid = logit_alphas[len(logit_alphas) // 2]
table = {}
for n, s in steps_l.items():
    table[n] = {"cos": [step_agreement(s.delta, refs_l[a].delta)["cosine"] for a in logit_alphas],
                "rel": step_agreement(s.delta, refs_l[a_mid].delta)["rel_error"], "passes": s.passes,
                "ms": 1e3 * s.seconds, "after": s.loss_after}
hdr = "| rule | " + " | ".join(f"cos α={a:.0e}" for a in logit_alphas) + \
    f" | rel. error α={a_mid:.0e} | fwd | bwd | func | CPU ms | l̃ after (before {steps_l['sgd'].loss_before:.3f}) |"
lines = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
for n, t in sorted(table.items(), key=lambda kv: -kv[1]["cos"][1]):
    lines.append(f"| {n} | " + " | ".join(f"{c:.3f}" for c in t["cos"]) + f" | {t['rel']:.3f} | "
                 f"{t['passes'].forward} | {t['passes'].backward} | {t['passes'].functional} | {t['ms']:.1f} | "
                 f"{t['after']:.3f} |")
print("\n".join(lines))

# %%
cos_l = {n: t["cos"][len(logit_alphas) // 2] for n, t in table.items()}   # at the middle α
best = max(cos_l, key=cos_l.get)
run.claim("logistic/reference_precise", "Δθ* at the middle α is precise enough to rank rules",
          refs_l[a_mid].rel_stderr < 0.1, value=refs_l[a_mid].rel_stderr, bound="relative stderr < 0.1")
run.claim("logistic/curvature_closer_than_sgd", "Newton and Hessian-free point closer to Δθ* than SGD",
          cos_l["newton"] > cos_l["sgd"] and cos_l["hessian_free"] > cos_l["sgd"],
          value=[cos_l["newton"], cos_l["hessian_free"], cos_l["sgd"]], bound="cosines above SGD's")
run.claim("logistic/zeroth_order_noisier_than_sgd", "one zeroth-order step (16 antithetic directions in 130 "
          "dimensions) points less close to Δθ* than SGD", cos_l["zo_gaussian"] < cos_l["sgd"],
          value=[cos_l["zo_gaussian"], cos_l["sgd"]], bound="cosine below SGD's")
run.record("logistic/best_rule_mid_alpha", best)
for n in ("sgd", "adam", "newton", "kfac", "hessian_free", "mgs", "zo_gaussian"):
    run.record(f"logistic/cos_{n}", cos_l[n], headline=n in ("newton", "sgd", "mgs"))
_ = run.record("logistic/ref_rel_stderr_mid_alpha", refs_l[a_mid].rel_stderr)

# %% tags=["hide-input"]
order = sorted(table, key=lambda n: cos_l[n])                  # one row per rule, the best at the top
ypos = np.arange(len(order))
fig, axes = plt.subplots(1, 3, figsize=(13, 0.3 * len(order) + 1.8), sharey=True, layout="constrained")
columns = ((cos_l[n], max(steps_l[n].passes.total, 1), max(steps_l[n].seconds * 1e3, 1e-2)) for n in order)
for ax, xs in zip(axes, zip(*columns)):
    ax.hlines(ypos, 0 if ax is axes[0] else min(xs) / 2, xs, color="0.8", lw=1)
    ax.plot(xs, ypos, "o", color="C0")
axes[0].set_yticks(ypos, order)
label_axes(axes[0], f"cos∠(step, Δθ*) at α = {a_mid:g} (higher is better)", "", "agreement with Δθ*", legend=False)
label_axes(axes[1], "counted passes per step (forward + backward + functional)", "", "cost in passes", logx=True,
           legend=False)
label_axes(axes[2], "CPU time per step (ms)", "", "cost in time", logx=True, legend=False)
fig.suptitle("logistic regression, 3 vs 8: one step of each rule from the same θ")
run.savefig(fig, "logistic_cosine_vs_cost.png")
show(fig, "one row per rule, sorted by the cosine between its step and Δθ* at α = {a_mid:g} (left), beside what the "
          "step cost in counted passes (middle) and CPU time (right). Newton {logistic/cos_newton:.3f}, SGD "
          "{logistic/cos_sgd:.3f}, one MGS step {logistic/cos_mgs:.3f}.", run=run, a_mid=a_mid)

# %% [markdown]
# **Reading the two tables.** On the quadratic every rule's step is fixed while Δθ* moves with α. Without damping,
# the exact natural gradient (Fisher = Hessian here), K-FAC (on one linear layer its Kronecker factorization is
# exact) and Hessian-free (CG converges in d = 10 iterations) would give Newton's step exactly; their damping
# (table `HP`) moves them slightly. Momentum's and clipped SGD's first steps have gradient descent's direction.
# Measured:

# %%
like_newton = {n: step_agreement(steps_q[n].delta, newton_q)["cosine"] for n in ("natural_exact", "kfac", "hessian_free")}
like_sgd = {n: step_agreement(steps_q[n].delta, -gq_)["cosine"] for n in ("momentum", "clipped_sgd", "grad_penalty")}
ends = {n: (cos_q[n][0], cos_q[n][-1]) for n in ("grad_penalty", "diag_fisher", "adam")}
run.say("Cosine with Newton's step: " + ", ".join(f"{n} {c:.4f}" for n, c in like_newton.items())
        + ". Cosine with −g: " + ", ".join(f"{n} {c:.4f}" for n, c in like_sgd.items())
        + ". By their cosine with Δθ* at the smallest and the largest α (Newton "
        f"{cos_q['newton'][0]:.3f} → {cos_q['newton'][-1]:.3f}, gradient descent {cos_q['sgd'][0]:.3f} → "
        f"{cos_q['sgd'][-1]:.3f}): " + "; ".join(f"{n} {a:.3f} → {b:.3f}" for n, (a, b) in ends.items())
        + ". Adam's first step is a signed gradient.")

# %% [markdown]
# Does averaging many steps of a random-direction estimator approach Δθ*? Measured on the logistic problem: the
# mean of `n_average` independent one-step proposals (new seeds, same θ) of MGS and of the zeroth-order rule,
# against Δθ* at the middle α.

# %%
avg_steps = {n: torch.stack([propose(n, logit, **{**HP_l[n], "seed": 10_000 + i}).delta for i in range(n_average)])
             for n in ("mgs", "zo_gaussian")}
cos_avg = {n: step_agreement(d.mean(0), refs_l[a_mid].delta)["cosine"] for n, d in avg_steps.items()}
cos_avg_sgd = {n: step_agreement(d.mean(0), steps_l["sgd"].delta)["cosine"] for n, d in avg_steps.items()}
for n in cos_avg:
    run.record(f"logistic/cos_mean_of_{n}_steps", cos_avg[n])
print({n: f"mean of {n_average}: cos with Δθ* {cos_avg[n]:.3f}, with −g {cos_avg_sgd[n]:.3f}" for n in cos_avg})

# %%
curv = sorted(("newton", "natural_exact", "hessian_free", "kfac"), key=lambda n: -cos_l[n])
top = sorted(cos_l, key=lambda n: -cos_l[n])[:len(curv)]
random_dir = {n: cos_l[n] for n in ("zo_gaussian", "mezo", "mgs")}
run.say("On logistic regression the Hessian-aware rules "
        + ("point closest to Δθ*" if set(top) == set(curv) else "are not the four closest to Δθ*") + " (cosines "
        + ", ".join(f"{n} {cos_l[n]:.3f}" for n in curv) + f"), against SGD's {cos_l['sgd']:.3f}. At the smallest "
        f"α Δθ* has cosine {ref_vs_min['cosine']:.4f} with the step to the minimizer (relative error "
        f"{ref_vs_min['rel_error']:.3f}); Newton's first step has cosine {cos_to_min['newton']:.3f} with that step "
        f"and K-FAC's {cos_to_min['kfac']:.3f}. "
        + ("So a rule can rank above Newton here: Newton's first step is an approximation of the target, not the "
           "target. " if cos_l["kfac"] > cos_l["newton"] else "")
        + "One step of a random-direction estimator "
        + ("points nearly orthogonally to Δθ* (cosines below 0.1)" if max(random_dir.values()) < 0.1 else
           "has cosine") + ": zeroth order "
        f"{cos_l['zo_gaussian']:.3f}, MeZO {cos_l['mezo']:.3f}, MGS with its {HP_l['mgs']['n_samples']} candidates "
        f"{cos_l['mgs']:.3f}. The mean of {n_average} such steps reaches cosine {cos_avg['mgs']:.3f} (MGS) and "
        f"{cos_avg['zo_gaussian']:.3f} (zeroth order) with Δθ*, and {cos_avg_sgd['mgs']:.3f} and "
        f"{cos_avg_sgd['zo_gaussian']:.3f} with SGD's direction −g, whose own cosine with Δθ* is {cos_l['sgd']:.3f}.")

# %% [markdown]
# ## 4 · Training digits at an equal budget
#
# Ten-class digits, an MLP 64 → hidden → 10, full-batch on the train split. Each rule gets the same budget of
# counted passes and the same seeds. Gradient and curvature rules train on cross-entropy, the search rules on the
# task loss: either the **error rate** 1 − accuracy or **1 − macro-F1**, both measured on the validation split.
# Functional calls count as described in §1: a vmap over K counts K, and the backward sweeps inside a transform
# are not seen. That understates the curvature rules' cost; the CPU-seconds axis of the Pareto plot shows what
# they really take.

# %% [markdown]
# **Tuned against tuned.** Each rule's step size is tuned before it is compared. The grid is its base learning
# rate times `tune_grid` (log-spaced, factor ≈ √10). Each value trains from `tune_seeds` initializations (seeds
# 9000, 9001, …, none of them a comparison seed) on the first 80 % of the train split, for `tune_budget` passes.
# It is scored by its *worst* task loss on the held-out last 20 % of the train split; ties go to the value
# nearest the base rate.
#
# The worst case guards against a step size at the edge of stability, which can win on one seed and fail on
# others. The validation split, on which the comparison is made, is never seen by the tuning. The other
# hyperparameters keep their hand-set values. `tune_budget` defaults to the comparison budget, because a step size
# tuned over a shorter horizon can favour larger steps (not measured here).

# %%
(Xtr, ytr), (Xva, yva), _ = load_digits_splits(seed)
Xtr, ytr, Xva, yva = Xtr[:n_train].to(dev), ytr[:n_train].to(dev), Xva.to(dev), yva.to(dev)
TASKS = {"error": lambda o, y: 1 - accuracy(o.argmax(-1), y), "1-macroF1": lambda o, y: 1 - macro_f1(o.argmax(-1), y, 10)}
LABEL_TASKS = {"error": None,   # REINFORCE's per-example accuracy reward (lower variance than a batch reward)
               "1-macroF1": lambda s, y: 1 - macro_f1(s, y, 10)}   # macro-F1 is a batch-level reward
HP_B = {
    "sgd": dict(lr=0.5), "momentum": dict(lr=0.1), "adam": dict(lr=1e-2), "clipped_sgd": dict(lr=0.5, gamma=0.3),
    "grad_penalty": dict(lr=0.5, mu=0.01), "kfac": dict(lr=0.3, damping=1e-2),
    "diag_empirical": dict(lr=0.01, damping=1e-4), "hessian_free": dict(lr=1.0, damping=1.0, cg_iters=5,
                                                                        adapt_damping=True),
    "mgs": dict(lr=0.5, n_samples=8, alpha=0.01), "reinforce": dict(lr=0.5, n_samples=8),
    "zo_gaussian": dict(lr=0.5, sigma=0.01, n_samples=8), "mezo": dict(lr=0.5, sigma=1e-2, n_samples=4),
}
SEARCH = [n for n in HP_B if RULES[n].objective == "task" or n == "reinforce"]
print("search rules (trained on the task loss):", SEARCH)

# %%
def run_rule(name, task, s, lr, make_model=lambda: MLP(64, hidden, 10), hps=HP_B, search=SEARCH,
             data=(Xtr, ytr, Xva, yva), budget_=budget, wd=0.0):
    """Train rule ``name`` at learning rate ``lr`` from the seed-``s`` initialization to the budget on
    ``data = (X_fit, y_fit, X_eval, y_eval)``; the evaluation task losses every 5 steps."""
    Xf, yf, Xe, ye = data
    torch.manual_seed(1000 + s)
    model = make_model().to(dev)
    pb = Problem(model, Xf, yf, task_loss_fn=TASKS[task], task_labels_fn=LABEL_TASKS[task], weight_decay=wd)

    def evaluate():
        with torch.no_grad():
            o = model(Xe)
        return {t: float(f(o, ye)) for t, f in TASKS.items()}

    hp = {**hps[name], "lr": lr, **({"seed": s} if name in search else {})}
    return train(name, pb, budget=budget_, evaluate=evaluate, eval_every=5, **hp)


# %%
n_fit = int(0.8 * len(Xtr))
TUNE_DATA = (Xtr[:n_fit], ytr[:n_fit], Xtr[n_fit:], ytr[n_fit:])   # held out from the train split


def tune(name, task, budget_=tune_budget, **kw):
    """The learning rate of ``base × tune_grid`` whose worst held-out task loss over the tuning seeds is lowest."""
    base = kw.get("hps", HP_B)[name]["lr"]
    scores = {}
    for m in tune_grid:
        try:
            scores[m] = max(run_rule(name, task, 9000 + j, m * base, data=TUNE_DATA, budget_=budget_, **kw).final[task]
                            for j in range(tune_seeds))
        except ValueError:           # the parameters diverged: this value is out
            scores[m] = math.inf
    m_best = min(scores, key=lambda m: (scores[m], abs(math.log(m))))
    return m_best * base, {m * base: v for m, v in scores.items()}


# %%
tuned, runs = {}, {}   # (rule, task) → (lr, grid scores); (rule, task) → list of TrainRecord over seeds
for name in tqdm(HP_B, desc="rules (tune, then compare)"):
    for task in (TASKS if name in SEARCH else ["error"]):
        tuned[(name, task)] = tune(name, task)
        runs[(name, task)] = [run_rule(name, task, s, tuned[(name, task)][0]) for s in range(n_seeds)]
for name in HP_B:                      # gradient rules: one run serves both task losses
    if name not in SEARCH:
        runs[(name, "1-macroF1")] = runs[(name, "error")]
        tuned[(name, "1-macroF1")] = tuned[(name, "error")]
print("tuned learning rates:", {f"{n}/{t}": f"{v[0]:.3g}" for (n, t), v in tuned.items()})
at_edge = sorted({f"{n}/{t}" for (n, t), (lr, sc) in tuned.items() if lr in (min(sc), max(sc))})
run.record("digits/tuned_at_grid_edge", ", ".join(at_edge) or "none")
for n in ("sgd", "adam", "kfac", "mgs"):
    run.record(f"digits/lr_{n}", float(tuned[(n, "error")][0]))

# %% [markdown]
# Paired comparisons on the same seeds and budget, each rule at its tuned step size, against SGD and against Adam.
# Each is on the validation task loss the rule is judged by (lower is better). The table is the rule × problem
# summary: task loss, cost, interval and the verdict *before* the family-wise correction, which comes at the end
# of the notebook. §5 and §6 append their rows to `harness_summary.md`.

# %%
def versus_baselines(key, name, vals, finals, metric):
    """Paired comparisons (`run.compare`, lower is better) of rule `name`'s per-seed `vals` with SGD's and Adam's
    (`finals[base]`) under `key/name_vs_base`; returns them and the table's two cells per baseline."""
    out, cells = {}, []
    for base in ("sgd", "adam"):
        if name == base or (name == "sgd" and base == "adam"):
            cells += ["—", "baseline"]
            continue
        c = out[base] = run.compare(f"{key}/{name}_vs_{base}", vals, finals[base], name=name, baseline=base,
                                    metric=metric, lower_is_better=True)
        cells += [f"{c.effect:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]", f"{c.verdict} (uncorrected)"]
    return out, cells


final = {k: np.array([r.final[k[1]] for r in v]) for k, v in runs.items()}
summary = []
for (name, task), vals in sorted(final.items(), key=lambda kv: (kv[0][1], kv[1].mean())):
    recs = runs[(name, task)]
    row = {"rule": name, "task": task, "mean": vals.mean(), "lr": tuned[(name, task)][0], "passes": np.mean([r.passes.total for r in recs]),
           "func": np.mean([r.passes.functional for r in recs]), "cpu_s": np.mean([r.seconds for r in recs]),
           "steps": np.mean([r.steps for r in recs])}
    if task == "1-macroF1" and name not in SEARCH and name not in ("sgd", "adam"):
        # one metric per run: a gradient rule's macro-F1 row reads the same runs as its error row
        row["vs"], row["cells"] = {}, ["—", "same runs as its error row: not compared twice"] * 2
    else:
        row["vs"], row["cells"] = versus_baselines(f"digits/{task}", name, vals,
                                                   {b: final[(b, task)] for b in ("sgd", "adam")}, f"validation {task}")
    summary.append(row)

# %%
hdr = ("| rule | task loss | tuned lr | mean (5 seeds) | steps | passes (of which functional) | CPU s | vs SGD: effect [uncorrected 95 % CI] "
       "| verdict | vs Adam: effect [uncorrected 95 % CI] | verdict |")
lines = [hdr.replace("5 seeds", f"{n_seeds} seeds"), "|" + "---|" * 11]
for r in summary:
    lines.append(f"| {r['rule']} | {r['task']} | {r['lr']:.3g} | {r['mean']:.3f} | {r['steps']:.0f} | {r['passes']:.0f} "
                 f"({r['func']:.0f}) | {r['cpu_s']:.2f} | " + " | ".join(r["cells"]) + " |")
summary_md = "\n".join(lines)
print(summary_md)
_ = (run.dir / "harness_summary.md").write_text(summary_md + "\n")

# %%
def lowest(means, fmt=".3f"):
    """'a (x)' for the lowest of ``means``, or 'a and b tie at x' when several print equal at precision ``fmt``."""
    low = format(min(means.values()), fmt)
    tied = [n for n, v in sorted(means.items(), key=lambda kv: kv[1]) if format(v, fmt) == low]
    return f"{tied[0]} ({low})" if len(tied) == 1 else f"{', '.join(tied[:-1])} and {tied[-1]} tie at {low}"


err = {n: final[(n, "error")].mean() for n, _ in runs if (n, "error") in final}
run.record("digits/best_rule_error", lowest(err))
for n in ("sgd", "adam", "kfac", "mgs", "reinforce", "zo_gaussian"):
    run.record(f"digits/error_{n}", float(err[n]), headline=n in ("sgd", "adam", "kfac", "mgs"),
               across_machines=seed_spread(final[(n, "error")]))
run.record("digits/f1loss_mgs", float(final[("mgs", "1-macroF1")].mean()))
run.claim("digits/baselines_learn", "SGD and Adam reach a validation error below 0.15", err["sgd"] < 0.15 and
          err["adam"] < 0.15, value=[float(err["sgd"]), float(err["adam"])], bound="< 0.15")
_ = run.claim("digits/zeroth_order_behind_sgd", "zeroth-order search (8 directions per step in 2410 dimensions) "
              "ends above SGD's error at equal passes", err["zo_gaussian"] > err["sgd"],
              value=[float(err["zo_gaussian"]), float(err["sgd"])], bound="error above SGD's")

# %% tags=["hide-input"]
def error_curves(recs):
    """(counted passes, [seeds, evaluations] validation error) of one rule's runs, cut to the shortest run."""
    m = min(len(r.history) for r in recs)
    return (np.array([h["passes"] for h in recs[0].history[:m]]),
            np.array([[h["error"] for h in r.history[:m]] for r in recs]))


# %% tags=["hide-input"]
rules_d = [n for n, t in runs if t == "error"]
sgd_x, sgd_ys = error_curves(runs[("sgd", "error")])
fig, axes = small_multiples(len(rules_d), ncols=4, panel_size=(3.1, 2.1))
for ax, name in zip(axes, rules_d):
    ax.plot(sgd_x, sgd_ys.mean(0), color="0.6", lw=1)
    seed_band(ax, *error_curves(runs[(name, "error")]), color="C0", bounds=FRACTION, clip=True)
    ax.set_yscale("log")
    ax.set_title(name, fontsize=9)
fig.supxlabel("counted passes (forward + backward + functional)")
fig.supylabel("validation error rate (lower is better)")
fig.suptitle(f"digits MLP, tuned step sizes: each rule (blue, mean of {n_seeds} seeds) beside SGD (grey)")
run.savefig(fig, "digits_curves.png")
show(fig, "one panel per rule: the digits MLP's validation error rate against counted passes up to the budget of "
          "{budget} (mean of {n_seeds} seeds, 95 % t-band clipped to [0, 1]; grey: SGD's mean, in every panel).",
     run=run, budget=budget, n_seeds=n_seeds)

# %% tags=["hide-input"]
order = sorted(rules_d, key=lambda n: -final[(n, "error")].mean())       # the lowest error at the top
fig, axes = plt.subplots(1, 2, figsize=(12, 0.3 * len(order) + 1.8), sharey=True, layout="constrained")
for y, name in enumerate(order):
    mu, err = mean_ci(final[(name, "error")], FRACTION)
    axes[0].errorbar(mu, y, xerr=err, fmt="o", color="C0", capsize=3)
    mu, err = mean_ci([r.seconds for r in runs[(name, "error")]], NONNEGATIVE)
    axes[1].errorbar(mu, y, xerr=err, fmt="o", color="C1", capsize=3)
axes[0].set_yticks(range(len(order)), order)
label_axes(axes[0], "final validation error rate (lower is better)", "", f"at {budget} passes", logx=True,
           legend=False)
label_axes(axes[1], "CPU seconds to the pass budget (one thread)", "", "time it took", logx=True, legend=False)
fig.suptitle(f"digits MLP: mean over {n_seeds} seeds with 95 % t-intervals (error clipped to [0, 1])")
run.savefig(fig, "digits_pareto.png")
show(fig, "the final validation error rate of each rule (left, sorted) and the CPU time its run took (right). SGD "
          "{digits/error_sgd:.3f}, Adam {digits/error_adam:.3f}, K-FAC {digits/error_kfac:.3f}, MGS "
          "{digits/error_mgs:.3f}; the lowest mean error at the printed precision: {digits/best_rule_error}.", run=run)

# %% [markdown]
# ## 5 · Newton, exact natural gradient and SPSA in a race they can run
#
# Newton's rule and the exact natural gradient need a dense P × P matrix per step. That is out of reach for the
# MLP (P = 2410) at CI cost. Multinomial logistic regression on all ten digits (64 → 10, P = 650, weight decay
# λ = 10⁻³ so the Hessian is definite) is small enough. The protocol is §4's: tuned step sizes, the same seeds, an
# equal budget of `logit_budget` counted passes, and the validation error rate. The rules are SGD, Adam, Newton,
# the exact natural gradient and SPSA on the error rate. For a linear softmax model the Fisher equals the Hessian
# of the likelihood term, and the wrapper adds λ to the damping, so natural gradient should track Newton.
#
# A Newton or natural-gradient step counts its matrix as functional calls, so the two rules take different numbers
# of steps within the same pass budget: the table shows how many. Read the CPU seconds beside the passes.

# %%
HP_LR = {"sgd": dict(lr=0.5), "adam": dict(lr=1e-2), "newton": dict(lr=1.0, damping=0.0),
         "natural_exact": dict(lr=1.0, damping=1e-4), "spsa": dict(lr=0.5, sigma=0.01, n_samples=8)}
LR_KW = dict(make_model=lambda: nn.Linear(64, 10), hps=HP_LR, search=["spsa"], budget_=logit_budget, wd=1e-3)
tuned_lr, runs_lr = {}, {}
for name in tqdm(HP_LR, desc="logistic race (tune, then compare)"):
    tuned_lr[name] = tune(name, "error", **LR_KW)
    runs_lr[name] = [run_rule(name, "error", s, tuned_lr[name][0], **LR_KW) for s in range(n_seeds)]
final_lr = {n: np.array([r.final["error"] for r in v]) for n, v in runs_lr.items()}
print({n: f"lr {tuned_lr[n][0]:.3g}: error {v.mean():.3f}" for n, v in final_lr.items()})

# %%
rows_lr = []
order_lr, same_as = sorted(final_lr, key=lambda n: n == "newton"), {}   # Newton is checked last
for i, name in enumerate(order_lr):   # a rule whose per-seed errors equal an earlier one's adds nothing to the family
    twins = [k for k in order_lr[:i] if k not in ("sgd", "adam") and k not in same_as
             and np.array_equal(final_lr[name], final_lr[k])]
    if twins and name not in ("sgd", "adam"):
        same_as[name] = twins[0]
run.record("digits_logreg/identical_to", dict(same_as) or "none")
for name, vals in final_lr.items():
    recs = runs_lr[name]
    if name in same_as:
        cells = ["—", f"per-seed errors identical to {same_as[name]}'s: not compared twice"] * 2
    else:
        _, cells = versus_baselines("digits_logreg/error", name, vals, final_lr,
                                    "validation error (logistic regression)")
    rows_lr.append(f"| {name} | error (logreg) | {tuned_lr[name][0]:.3g} | {vals.mean():.3f} | "
                   f"{np.mean([r.steps for r in recs]):.0f} | {np.mean([r.passes.total for r in recs]):.0f} "
                   f"({np.mean([r.passes.functional for r in recs]):.0f}) | {np.mean([r.seconds for r in recs]):.2f} | "
                   + " | ".join(cells) + " |")
    run.record(f"digits_logreg/error_{name}", float(vals.mean()), headline=name in ("newton", "sgd"),
               across_machines=seed_spread(vals))
    run.record(f"digits_logreg/cpu_s_{name}", float(np.mean([r.seconds for r in recs])))
    run.record(f"digits_logreg/steps_{name}", float(np.mean([r.steps for r in recs])))
print("\n".join(rows_lr))
_ = (run.dir / "harness_summary.md").write_text(summary_md + "\n" + "\n".join(rows_lr) + "\n")
_ = run.claim("digits_logreg/sgd_learns", "SGD's logistic regression reaches a validation error below 0.2",
              final_lr["sgd"].mean() < 0.2, value=float(final_lr["sgd"].mean()), bound="< 0.2")

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
for i, (name, recs) in enumerate(runs_lr.items()):
    color = plt.cm.tab10(i)
    x, ys = error_curves(recs)
    axes[0].plot(x, ys.mean(0), color=color, label=name)
    axes[0].fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.15)
    (mu_x, err_x), (mu_y, err_y) = mean_ci([r.seconds for r in recs], NONNEGATIVE), mean_ci(final_lr[name], FRACTION)
    axes[1].errorbar(mu_x, mu_y, xerr=err_x, yerr=err_y, fmt="o", color=color, label=name, capsize=2)
label_axes(axes[0], "counted passes (forward + backward + functional)", "validation error rate",
           "logistic regression: error against passes (mean, min–max of seeds)", lower_is_better=True, logy=True)
label_axes(axes[1], "CPU seconds to the pass budget (one thread)", "final validation error rate",
           "error against time (95 % t-intervals over seeds)", lower_is_better=True, logx=True, logy=True)
run.savefig(fig, "logreg_race.png")
show(fig, "multinomial logistic regression on the ten digits, tuned step sizes, {n_seeds} seeds: left, the "
          "validation error rate against counted passes (mean, shaded from the best to the worst seed); right, the "
          "final error against the CPU time of the run. At {logit_budget} passes Newton ends at "
          "{digits_logreg/error_newton:.3f} after {digits_logreg/steps_newton:.0f} steps in "
          "{digits_logreg/cpu_s_newton:.2f} CPU s, the exact natural gradient at {digits_logreg/error_natural_exact:.3f} "
          "after {digits_logreg/steps_natural_exact:.0f} steps, SGD at {digits_logreg/error_sgd:.3f} after "
          "{digits_logreg/steps_sgd:.0f} steps in {digits_logreg/cpu_s_sgd:.3f} s.",
     run=run, n_seeds=n_seeds, logit_budget=logit_budget)

# %% [markdown]
# ## 6 · A small LM with a sequence task loss
#
# The third problem is the text completion of notebook 04_sequence_task_losses. The committed small causal
# Transformer (`taskloss.lm.pretrained.load_pretrained_lm`, about 10⁶ parameters, pretrained by MLE on the corpus)
# receives the first `lm_prefix_len` tokens of a line and continues it greedily for `lm_decode_len` tokens. The
# **surrogate** is the teacher-forced mean token NLL of the reference continuation (`window_nll`). The **task
# loss** is `lm_task_loss` of the greedy continuation: edit distance to the reference plus the 4-gram repetition
# rate, each in [0, 1]. It is piecewise constant in θ, since an argmax chooses every token.

# %% [markdown]
# `SequenceProblem` gives the rules the interface they already call. Gradient rules descend the surrogate. MGS
# scores each candidate by the task loss of its greedy continuations, as notebook 04 does. REINFORCE samples
# continuations with reward −task loss (`sequence_reinforce`, leave-one-out baseline, plus the surrogate with
# weight 1, as in 04). MeZO perturbs θ in place and compares the task losses of two greedy decodings.
#
# **Counting.** One forward is one next-token evaluation over the batch's B rows: one call of the output layer,
# which every path through the model ends in. A teacher-forced window counts one forward, its gradient one
# backward. A greedy decoding of T tokens counts **T forwards**: the prefix, then T − 1 key/value-cached steps of
# one new position each. S sampled continuations per prefix count S·T. A cached step costs fewer FLOPs than a
# window, so the pass axis can overstate the decoding rules' cost; CPU seconds are the other axis, and the closing
# text sets the two ratios side by side.
#
# **Which rules apply.** The registry answers per problem. The curvature rules need per-example output
# likelihoods, and the gradient penalty a second derivative that fused attention lacks:

# %%
lm0, tok = load_pretrained_lm(dev)                    # eval mode: no dropout, a deterministic task loss
lm_task = CompletionTask(lm_task_loss, lm_decode_len, tok.eos_id, tok.pad_id)
pool = completion_pairs("train", tok, lm_prefix_len, lm_decode_len, max_items=lm_train_prefixes, with_eos=True).to(dev)
held_lm = completion_pairs("valid", tok, lm_prefix_len, lm_decode_len, max_items=lm_eval_prefixes,
                           with_eos=True).to(dev)
held_snapshot = held_lm.prefixes.clone()
ppl_blocks = heldout_blocks("valid", tok, 64, max_blocks=lm_ppl_blocks).to(dev)
probe_lm = SequenceProblem(copy.deepcopy(lm0), pool[:lm_batch], lm_task)
lm_rules = applicable_rules(probe_lm)
for n in RULES:
    print(f"{n:18s}", "applies" if n in lm_rules else "—  " + RULES[n].unsupported(probe_lm)[:90])
assert set(RULES) - set(lm_rules) == {"newton", "natural_exact", "natural_empirical", "kfac", "diag_fisher",
                                      "diag_empirical", "hessian_free", "grad_penalty"}
with PassCounter(probe_lm.counted_module, lm_batch) as c:
    probe_lm.task_outputs()
assert (c.count.forward, c.count.backward) == (lm_decode_len, 0)   # one greedy decoding: T forwards
print(f"{len(pool)} training prefixes, {len(held_lm)} held-out prefixes; one greedy decoding of "
      f"{lm_decode_len} tokens counted {c.count.forward:g} forwards")

# %% [markdown]
# **Protocol.** SGD, Adam, MGS, REINFORCE and MeZO each get `lm_budget` counted passes from the pretrained model.
# They train on minibatches of `lm_batch` prefixes drawn from the first 80 % of the training pool, the same draws
# for every rule of a seed. They are judged on `lm_eval_prefixes` held-out prefixes of the valid split, by the
# task loss of the greedy continuation and by the held-out perplexity. A run stops at the first step that reaches
# the budget, so a rule whose steps cost many passes may overshoot by part of one step (the table shows the passes
# used).
#
# **Step sizes.** With `lm_tune` each is tuned as in §4: grid `lm_tune_grid` × base, `tune_seeds` tuning seeds
# scored by their worst task loss on the held-out last 20 % of the pool, at the full budget. By default the
# tuning is skipped and the base values below are used; they were chosen by running this tuning once on a wider
# grid, and `-p lm_tune true` repeats it. MGS's update is applied as is: SGD with rate 1 on Δθ*, its MLE-centred
# candidates at −lr·∇l̃. Its K, α and MeZO's σ keep hand-set values.

# %%
HP_LM = {"sgd": dict(lr=0.1), "adam": dict(lr=1e-3), "mgs": dict(lr=9.5e-3, n_samples=4, alpha=0.01),
         "reinforce": dict(lr=1e-3, n_samples=2, mle_weight=1.0),
         "mezo": dict(lr=3.2e-4, sigma=1e-3, n_samples=1)}
assert set(HP_LM) <= set(lm_rules)
n_fit_lm = int(0.8 * len(pool))
base_lm = {"task_loss": evaluate_completions(lm0, held_lm, lm_task)[0]["task_loss"],
           "perplexity": perplexity(lm0, ppl_blocks)}


# %%
def run_lm(name, s, lr, fit=pool[:n_fit_lm], held=held_lm, budget_=lm_budget, marks=3, with_ppl=True):
    """Fine-tune a copy of the pretrained LM with rule ``name`` at step size ``lr`` (seed ``s``: minibatches and
    the rule's own randomness) to the pass budget ``budget_``; held-out task loss and (``with_ppl``) perplexity at
    ``marks`` pass marks."""
    model, gen, calls = copy.deepcopy(lm0), torch.Generator().manual_seed(s), []

    def draw():
        b = fit[torch.randint(len(fit), (lm_batch,), generator=gen)]
        return b.prefixes, b.refs

    def evaluate():
        calls.append(len(calls))
        if len(calls) == 1 and held is held_lm:   # step 0 is the pretrained model: its scores are known
            return dict(base_lm)
        row = {"task_loss": evaluate_completions(model, held, lm_task)[0]["task_loss"]}
        return {**row, "perplexity": perplexity(model, ppl_blocks)} if with_ppl else row

    pb = SequenceProblem(model, fit[:lm_batch], lm_task)
    hp = {**HP_LM[name], "lr": lr, **({"seed": s} if RULES[name].objective == "task" or name == "reinforce" else {})}
    return train(name, pb, budget=budget_, evaluate=evaluate, eval_every_passes=budget_ / marks, next_batch=draw, **hp)


# %%
def tune_lm(name):
    """As `tune` in §4: the step size of base × grid whose worst held-out task loss over the tuning seeds is lowest."""
    base, scores = HP_LM[name]["lr"], {}
    for m in lm_tune_grid:
        try:
            scores[m] = max(run_lm(name, 9000 + j, m * base, held=pool[n_fit_lm:]).final["task_loss"]
                            for j in range(tune_seeds))
        except ValueError:           # the parameters or the perplexity diverged: this value is out
            scores[m] = math.inf
    m_best = min(scores, key=lambda m: (scores[m], abs(math.log(m))))
    return m_best * base, {m * base: v for m, v in scores.items()}

# %%
tuned_lm = {n: tune_lm(n) for n in tqdm(HP_LM, desc="LM: tune step sizes")} if lm_tune else {}
lr_lm = {n: tuned_lm[n][0] if lm_tune else HP_LM[n]["lr"] for n in HP_LM}
for n, (lr_, sc) in tuned_lm.items():
    print(f"tuning {n:10s}: " + ", ".join(f"{k:.3g} → {v:.4f}" for k, v in sc.items()) + f"  (chosen {lr_:.3g})")
run.record("lm/tuned_at_grid_edge", ", ".join(n for n, (lr_, sc) in tuned_lm.items() if lr_ in (min(sc), max(sc)))
           or ("none" if lm_tune else "not tuned (lm_tune false)"))
runs_lm = {n: [run_lm(n, seed + i, lr_lm[n]) for i in range(lm_seeds)] for n in tqdm(HP_LM, desc="LM: rules × seeds")}
final_lm = {n: {k: np.array([r.final[k] for r in v]) for k in ("task_loss", "perplexity")} for n, v in runs_lm.items()}
for n, v in final_lm.items():
    print(f"{n:10s} lr {lr_lm[n]:.3g}: task loss {v['task_loss'].mean():.4f}, perplexity {v['perplexity'].mean():.2f} "
          f"({np.mean([r.steps for r in runs_lm[n]]):.0f} steps, {np.mean([r.seconds for r in runs_lm[n]]):.2f} CPU s)")
print(f"pretrained: task loss {base_lm['task_loss']:.4f}, perplexity {base_lm['perplexity']:.2f}")

# %% [markdown]
# Paired comparisons on the same seeds, minibatches and budget, against SGD and against Adam: the held-out task
# loss of greedy decoding (the objective of the search rules) and the held-out perplexity (what MLE fine-tuning
# improves). The rows join the summary table `harness_summary.md`.

# %%
rows_lm = []
for name, vals in final_lm.items():
    recs = runs_lm[name]
    _, cells = versus_baselines("lm/task_loss", name, vals["task_loss"], {b: final_lm[b]["task_loss"] for b in final_lm},
                                f"held-out {lm_task.spec} of greedy decoding")
    versus_baselines("lm_perplexity", name, vals["perplexity"], {b: final_lm[b]["perplexity"] for b in final_lm},
                     "held-out perplexity")
    rows_lm.append(f"| {name} | {lm_task.spec} (small LM) | {lr_lm[name]:.3g} | {vals['task_loss'].mean():.3f} | "
                   f"{np.mean([r.steps for r in recs]):.0f} | {np.mean([r.passes.total for r in recs]):.0f} (0) | "
                   f"{np.mean([r.seconds for r in recs]):.2f} | " + " | ".join(cells) + " |")
    run.record(f"lm/task_loss_{name}", float(vals["task_loss"].mean()), headline=name in ("sgd", "adam", "mgs"),
               across_machines=seed_spread(vals["task_loss"]))
    run.record(f"lm/ppl_{name}", float(vals["perplexity"].mean()))
    run.record(f"lm/cpu_s_{name}", float(np.mean([r.seconds for r in recs])))
    run.record(f"lm/steps_{name}", float(np.mean([r.steps for r in recs])))
for n in final_lm:
    run.record(f"lm/cpu_s_per_step_{n}", float(np.mean([r.seconds / r.steps for r in runs_lm[n]])))
run.record("lm/base_task_loss", base_lm["task_loss"])
run.record("lm/base_ppl", base_lm["perplexity"])
print("\n".join(rows_lm))
_ = (run.dir / "harness_summary.md").write_text("\n".join([summary_md, *rows_lr, *rows_lm]) + "\n")

# %% tags=["hide-input"]
def lm_curve(recs, key):
    """(mean counted passes, [seeds, evaluations] values of ``key``) of one rule's runs, cut to the shortest."""
    m = min(len(r.history) for r in recs)
    return (np.mean([[h["passes"] for h in r.history[:m]] for r in recs], 0),
            np.array([[h[key] for h in r.history[:m]] for r in recs]))


# %% tags=["hide-input"]
fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), layout="constrained")
for i, (name, recs) in enumerate(runs_lm.items()):
    color = plt.cm.tab10(i)
    for row, key in enumerate(("task_loss", "perplexity")):
        x, ys = lm_curve(recs, key)
        axes[row, 0].plot(x, ys.mean(0), "o-", ms=3, color=color, label=name)
        axes[row, 0].fill_between(x, ys.min(0), ys.max(0), color=color, alpha=0.15)
        (mu_x, err_x), (mu_y, err_y) = (mean_ci([r.seconds for r in recs], NONNEGATIVE),
                                        mean_ci(final_lm[name][key], NONNEGATIVE))
        axes[row, 1].errorbar(mu_x, mu_y, xerr=err_x, yerr=err_y, fmt="o", color=color, label=name, capsize=2)
for row, (key, lab) in enumerate((("task_loss", f"held-out {lm_task.spec}"), ("perplexity", "held-out perplexity"))):
    for ax in axes[row]:
        ax.axhline(base_lm[key], color="k", ls=":", lw=1, label="pretrained")
    label_axes(axes[row, 0], "counted passes (forward + backward)", lab,
               f"small LM: {key.replace('_', ' ')} against passes (mean, min–max of seeds)", lower_is_better=True)
    label_axes(axes[row, 1], "CPU seconds to the pass budget (one thread)", f"final {lab}",
               "against time (95 % t-intervals over seeds)", lower_is_better=True, logx=True)
run.savefig(fig, "lm_task_loss_perplexity.png")
show(fig, "the committed small LM fine-tuned on completions, {lm_seeds} seeds, {lm_budget} counted passes: top, the "
          "held-out task loss of greedy decoding ({spec}); bottom, the held-out perplexity; left against passes "
          "(mean, shaded from the best to the worst seed), right the final value against CPU time; dotted: the "
          "pretrained model. Task loss: pretrained {lm/base_task_loss:.3f}, SGD {lm/task_loss_sgd:.3f}, Adam "
          "{lm/task_loss_adam:.3f}, MGS {lm/task_loss_mgs:.3f}; perplexity: pretrained {lm/base_ppl:.1f}, SGD "
          "{lm/ppl_sgd:.1f}, Adam {lm/ppl_adam:.1f}.", run=run, lm_seeds=lm_seeds, lm_budget=lm_budget,
     spec=lm_task.spec)

# %% [markdown]
# **Equal steps.** At an equal pass budget a decoding rule takes a few steps where SGD and Adam take dozens, so a
# worse task loss could mean a weak rule or a starved one. The second view gives SGD and Adam exactly as many steps
# as MGS or REINFORCE took on the same seed (same minibatches, same step sizes), judged on the same held-out
# prefixes. These comparisons form their own family.

# %%
eq_steps, eq_runs = {}, {}
for n in ("mgs", "reinforce"):
    eq_steps[n] = [r.steps for r in runs_lm[n]]
    for b in ("sgd", "adam"):
        per_step = runs_lm[b][0].passes.total / runs_lm[b][0].steps          # 2 counted passes: forward + backward
        eq_runs[(n, b)] = [run_lm(b, seed + i, lr_lm[b], budget_=max(1, round(k * per_step)), marks=1,
                                  with_ppl=False)
                           for i, k in enumerate(eq_steps[n])]
        assert [r.steps for r in eq_runs[(n, b)]] == eq_steps[n], (n, b)
        run.compare(f"lm_equal_steps/{n}_vs_{b}", final_lm[n]["task_loss"],
                    [r.final["task_loss"] for r in eq_runs[(n, b)]], name=n, baseline=f"{b} at {n}'s steps",
                    metric=f"held-out {lm_task.spec} at equal steps", lower_is_better=True)
        run.record(f"lm_equal_steps/task_loss_{b}_at_{n}_steps",
                   float(np.mean([r.final["task_loss"] for r in eq_runs[(n, b)]])))
    run.record(f"lm_equal_steps/steps_{n}", float(np.mean(eq_steps[n])))
print({f"{b} at {n}'s {np.mean(eq_steps[n]):.0f} steps": f"{np.mean([r.final['task_loss'] for r in v]):.4f}"
       for (n, b), v in eq_runs.items()})

# %% [markdown]
# Identities that hold whatever the verdicts: every run used its budget and at most one step more; the held-out
# prefixes every rule was judged on are one fixed set from the valid split; every held-out perplexity is finite.
# That no held-out prefix is also a training prefix depends on the prefix length, so it is a claim. How far a rule moved the perplexity is reported, not asserted. Step sizes are tuned
# on the task loss, so a rule may buy task loss with perplexity; the closing summary names every rule whose
# perplexity ended above twice the pretrained model's. The training windows are line openings and the perplexity
# blocks a running text, so fine-tuning need not lower the held-out perplexity.

# %%
for name, recs in runs_lm.items():
    per_step = [r.passes.total / r.steps for r in recs]
    assert all(lm_budget <= r.passes.total < lm_budget + ps + 1e-9 for r, ps in zip(recs, per_step)), name
assert torch.equal(held_lm.prefixes, held_snapshot)
train_rows = {tuple(r) for r in pool.prefixes.tolist()}
n_shared = sum(tuple(r) in train_rows for r in held_lm.prefixes.tolist())
run.claim("lm/heldout_prefixes_unseen", f"no held-out prefix of {lm_prefix_len} tokens is also a training prefix",
          n_shared == 0, value=n_shared, bound="0 shared prefixes")       # short prefixes can repeat across splits
ppl_all = np.concatenate([v["perplexity"] for v in final_lm.values()])
assert np.isfinite(ppl_all).all(), ppl_all
run.record("lm/ppl_max_over_base", float(ppl_all.max() / base_lm["perplexity"]))
_ = run.record("lm/ppl_over_2x_base", ", ".join(n for n, v in final_lm.items()
                                                if v["perplexity"].max() >= 2 * base_lm["perplexity"]) or "none")

# %% [markdown]
# ## 7 · Shampoo, SOAP and Muon beside K-FAC and Hessian-free
#
# Three preconditioners in wide use today join the harness as `shampoo`, `soap` and `muon` (derived beside K-FAC in
# notebook 07_fisher_approximations, §9). **Shampoo** (Gupta, Koren and Singer, ICML 2018, arXiv:1802.09568)
# steps along $L^{-1/4}GR^{-1/4}$ with $L=\sum GG^\top$, $R=\sum G^\top G$, its length grafted from Adam's step.
# **SOAP** (Vyas et al., arXiv:2409.11321) runs Adam in the eigenbasis of $L$ and $R$. **Muon** (Jordan et al.,
# 2024, `torch.optim.Muon`) orthogonalizes each hidden matrix's momentum by Newton–Schulz; the other parameters
# (biases, here) go to AdamW. Two questions, as in §3 and §4: how close is one step to Δθ* on logistic regression,
# and where does each end on digits at the same pass budget, tuned on the same grid?

# %%
HP_P = {"shampoo": dict(lr=0.01), "soap": dict(lr=0.01), "muon": dict(lr=0.02, adamw_lr=0.01)}
steps_p = {n: propose(n, logit, **hp) for n, hp in HP_P.items()}
for n, s in steps_p.items():
    cos_l[n] = step_agreement(s.delta, refs_l[a_mid].delta)["cosine"]
    run.record(f"precond/logistic_cos_{n}", float(cos_l[n]))
    run.record(f"precond/logistic_passes_{n}", float(steps_p[n].passes.total))
compared_p = ("sgd", "adam", "kfac", "hessian_free", "shampoo", "soap", "muon")
print("| rule | cos∠(step, Δθ*) at α = %g | counted passes |" % a_mid)
print("|---|---|---|")
for n in sorted(compared_p, key=lambda n: -cos_l[n]):
    passes = (steps_p[n] if n in steps_p else steps_l[n]).passes.total
    print(f"| {n} | {cos_l[n]:.3f} | {passes:g} |")

# %% [markdown]
# On the two-class logistic regression the weight is a $2\times 64$ matrix. Shampoo's and Muon's first steps
# replace its gradient by (nearly) its polar factor, which keeps the gradient's row and column spaces but sets every
# singular value to one (Shampoo's graft then gives it Adam's length). SOAP's first step is Adam's in the
# eigenbasis of $GG^\top$ and $G^\top G$. None of them uses the curvature of the loss, so none should be expected to
# point at Δθ*, which at small α is the step to the regularized minimizer.
#
# **Training.** Digits MLP of §4, budget `budget` passes, the error rate on the validation split. Each new rule's
# step size is tuned exactly as §4 tuned the others (grid `tune_grid` × base, `tune_seeds` seeds, worst held-out
# error); SGD, Adam, K-FAC and Hessian-free keep their §4 step sizes. All seven run on `race_seeds` paired seeds
# (the first `n_seeds` are §4's runs), and each new rule is compared with SGD, Adam and K-FAC.

# %%
HP_BP = {**HP_B, **HP_P}
tuned_p = {n: tune(n, "error", hps=HP_BP) for n in tqdm(HP_P, desc="tune Shampoo, SOAP, Muon")}
runs_p = {n: [run_rule(n, "error", s, tuned_p[n][0], hps=HP_BP) for s in range(race_seeds)] for n in HP_P}
for n in ("sgd", "adam", "kfac", "hessian_free"):
    lr_n = tuned[(n, "error")][0]
    runs_p[n] = runs[(n, "error")][:race_seeds] + [run_rule(n, "error", s, lr_n)
                                                   for s in range(n_seeds, race_seeds)]
final_p = {n: np.array([r.final["error"] for r in v]) for n, v in runs_p.items()}
rows_p = []
for n in compared_p:
    recs = runs_p[n]
    lr_n = tuned_p[n][0] if n in tuned_p else tuned[(n, "error")][0]
    cells = []
    for base in ("sgd", "adam", "kfac"):
        if n in HP_P:
            c = run.compare(f"digits_precond/error/{n}_vs_{base}", final_p[n], final_p[base], name=n, baseline=base,
                            metric="validation error (digits MLP)", lower_is_better=True)
            cells.append(f"{c.effect:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}] {c.verdict}")
        else:
            cells.append("—")
    rows_p.append(f"| {n} | {lr_n:.3g} | {final_p[n].mean():.3f} | {np.mean([r.steps for r in recs]):.0f} | "
                  f"{np.mean([r.passes.total for r in recs]):.0f} | {np.mean([r.seconds for r in recs]):.2f} | "
                  + " | ".join(cells) + " |")
    run.record(f"precond/error_{n}", float(final_p[n].mean()), across_machines=seed_spread(final_p[n]))
    run.record(f"precond/cpu_s_{n}", float(np.mean([r.seconds for r in recs])))
    run.record(f"precond/lr_{n}", float(lr_n))
print(f"| rule | lr | mean error ({race_seeds} seeds) | steps | passes | CPU s | vs SGD | vs Adam | vs K-FAC |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows_p))
_ = (run.dir / "harness_summary.md").write_text(
    (run.dir / "harness_summary.md").read_text() + "\n".join(rows_p) + "\n")

# %%
edge_p = sorted(n for n, (lr_n, sc) in tuned_p.items() if lr_n in (min(sc), max(sc)))
run.record("precond/tuned_at_grid_edge", ", ".join(edge_p) or "none")
best_p = min(final_p, key=lambda n: final_p[n].mean())
run.record("precond/best_rule", best_p)
run.claim("precond/all_learn", "Shampoo, SOAP and Muon each reach a mean validation error below 0.15 on digits",
          all(final_p[n].mean() < 0.15 for n in HP_P), value=[float(final_p[n].mean()) for n in HP_P],
          bound="< 0.15")
_ = run.claim("precond/no_curvature_no_delta_star", "on logistic regression, Newton's step is closer to Δθ* than "
              "the step of Shampoo, SOAP or Muon", all(cos_l["newton"] > cos_l[n] for n in HP_P),
              value=[float(cos_l[n]) for n in ("newton", *HP_P)], bound="Newton's cosine the largest")

# %% tags=["hide-input"]
order_p = sorted(compared_p, key=lambda n: -final_p[n].mean())
fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(order_p) + 1.8), sharey=True, layout="constrained")
for y, n in enumerate(order_p):
    mu, e = mean_ci(final_p[n], FRACTION)
    axes[0].errorbar(mu, y, xerr=e, fmt="o", color="C2" if n in HP_P else "C0", capsize=3)
    mu, e = mean_ci([r.seconds for r in runs_p[n]], NONNEGATIVE)
    axes[1].errorbar(mu, y, xerr=e, fmt="o", color="C2" if n in HP_P else "C1", capsize=3)
axes[0].set_yticks(range(len(order_p)), order_p)
label_axes(axes[0], "final validation error rate (lower is better)", "", f"at {budget} passes", logx=True,
           legend=False)
label_axes(axes[1], "CPU seconds to the pass budget (one thread)", "", "time it took", logx=True, legend=False)
fig.suptitle(f"digits MLP: Shampoo, SOAP, Muon (green) beside §4's rules, {race_seeds} seeds, 95 % t-intervals")
run.savefig(fig, "digits_preconditioners.png")
show(fig, "final validation error (left) and CPU time (right) of each rule at the same pass budget, mean over "
          "{race_seeds} paired seeds. Shampoo {precond/error_shampoo:.3f}, SOAP {precond/error_soap:.3f}, Muon "
          "{precond/error_muon:.3f}; SGD {precond/error_sgd:.3f}, Adam {precond/error_adam:.3f}, K-FAC "
          "{precond/error_kfac:.3f}.", run=run, race_seeds=race_seeds)

# %%
verdicts_p = {f"{n} vs {b}": run.comparisons[f"digits_precond/error/{n}_vs_{b}"].verdict
              for n in HP_P for b in ("sgd", "adam", "kfac")}
run.say(
    "**Shampoo, SOAP and Muon.** One step on logistic regression has cosine {precond/logistic_cos_shampoo:.3f} "
    "(Shampoo), {precond/logistic_cos_soap:.3f} (SOAP) and {precond/logistic_cos_muon:.3f} (Muon) with Δθ* at "
    f"α = {a_mid:g}, against Newton's {cos_l['newton']:.3f}, K-FAC's {cos_l['kfac']:.3f} and SGD's "
    f"{cos_l['sgd']:.3f}. On digits at {budget} passes ({race_seeds} seeds, tuned step sizes) the mean validation "
    "error is {precond/error_shampoo:.3f} (Shampoo), {precond/error_soap:.3f} (SOAP), {precond/error_muon:.3f} "
    "(Muon), {precond/error_sgd:.3f} (SGD), {precond/error_adam:.3f} (Adam), {precond/error_kfac:.3f} (K-FAC) and "
    "{precond/error_hessian_free:.3f} (Hessian-free); the lowest: {precond/best_rule}. Verdicts before the "
    "correction: " + "; ".join(f"{k} **{v}**" for k, v in verdicts_p.items()) + ". Tuned at the edge of the grid: "
    "{precond/tuned_at_grid_edge}.")

# %% [markdown]
# **The verdict family.** One Holm correction runs across the comparisons that answer the notebook's question,
# built by one rule: *each run enters once, on the task loss it is judged by.* So a gradient rule's runs, which serve
# both digits task losses, are compared on the error rate only; a search rule, trained separately on each task loss,
# is compared on each. A rule whose per-seed outcomes are identical to another's is dropped (printed below). The
# small LM's perplexity is a second metric of the same runs: its comparisons form a family of their own, as do the
# equal-steps comparisons and §7's preconditioner race (runs of its own, `race_seeds` seeds, its own question). The
# closing text reads the corrected verdicts.

# %%
OWN_FAMILIES = ("lm_perplexity/", "lm_equal_steps/", "digits_precond/")
FAMILY = [k for k in run.comparisons if not k.startswith(OWN_FAMILIES)]
print("dropped as identical (rule: twin):", run.results["digits_logreg/identical_to"])
_ = run.comparison_table(FAMILY)
C = {k: run.comparisons[k] for k in FAMILY}
family = len(C)

# %%
_ = run.comparison_table([k for k in run.comparisons if k.startswith("lm_perplexity/")])

# %%
_ = run.comparison_table([k for k in run.comparisons if k.startswith("lm_equal_steps/")])

# %%
PRECOND = [k for k in run.comparisons if k.startswith("digits_precond/")]
_ = run.comparison_table(PRECOND)             # §7: Shampoo, SOAP, Muon against SGD, Adam and K-FAC, one family
n_precond = sum(run.comparisons[k].verdict_adjusted != "inconclusive" for k in PRECOND)
_ = run.say(f"§7's race, Holm-corrected across its own {len(PRECOND)} comparisons: {n_precond} decided — "
            + "; ".join(f"{run.comparisons[k].name} vs {run.comparisons[k].baseline} "
                        f"**{run.comparisons[k].verdict_adjusted}**" for k in PRECOND) + ".")


def corrected(prefix, verdict, bases=("sgd", "adam")):
    """'rule vs base' for every comparison under ``prefix`` whose Holm-corrected verdict is ``verdict``."""
    return [f"{k.split('/')[-1].replace('_vs_', ' vs ')}" for k, c in C.items()
            if k.startswith(prefix + "/") and k.split("_vs_")[-1] in bases and c.verdict_adjusted == verdict]

# %% [markdown]
# ## What the harness shows

# %%
decided = sum(c.verdict != "inconclusive" for c in C.values())
kept = sum(c.verdict_adjusted != "inconclusive" for c in C.values())
better_sgd = corrected("digits/error", "better", ("sgd",))
VERDICT_DRIFT = Tolerance(atol=3, reason="verdicts whose p-value sits near 0.05 can move on other numerics")
run.record("compare/n_comparisons", family, headline=True)
run.record("compare/n_decided_uncorrected", decided, headline=True, across_machines=VERDICT_DRIFT)
run.record("compare/n_decided_holm", kept, headline=True, across_machines=VERDICT_DRIFT)
run.record("digits/n_rules_better_than_sgd_error", len(better_sgd), headline=True, across_machines=VERDICT_DRIFT)
zo_minus_sgd = final[("zo_gaussian", "error")] - final[("sgd", "error")]       # paired: the same seeds
_ = run.claim("digits/zeroth_order_worse_than_sgd", "zeroth-order search ends above SGD's digits error rate on "
              "every paired seed (a statement that needs no test; the corrected verdict is in the table)",
              bool((zo_minus_sgd > 0).all()), value=float(zo_minus_sgd.min()),
              bound="smallest paired difference > 0")

# %%
run.say(
    "* **Quadratic.** Newton's step has cosine {quadratic/cos_newton_small_alpha:.4f} with Δθ* at α = {lo:g} and "
    "{quadratic/cos_newton_large_alpha:.3f} at α = {hi:g}. Gradient descent goes the other way, "
    "{quadratic/cos_sgd_small_alpha:.3f} → {quadratic/cos_sgd_large_alpha:.4f}. The Monte Carlo error of the "
    "reference stays below {quadratic/ref_rel_stderr_max:.3f} of ‖Δθ*‖ at every α. At the smallest α, Δθ* differs "
    "from the step to the minimizer (Newton's step here) by {quadratic/small_alpha_vs_minimizer_rel_error:.4f} of its "
    "length.\n"
    "* **Logistic regression.** At α = {a_mid:g} the cosine with Δθ* is {logistic/cos_newton:.3f} for Newton, "
    "{logistic/cos_hessian_free:.3f} for Hessian-free, {logistic/cos_kfac:.3f} for K-FAC, {logistic/cos_sgd:.3f} for "
    "SGD and {logistic/cos_adam:.3f} for Adam. One MGS step reaches {logistic/cos_mgs:.3f} and one zeroth-order step "
    "{logistic/cos_zo_gaussian:.3f}; the mean of {n_average} independent steps reaches "
    "{logistic/cos_mean_of_mgs_steps:.3f} (MGS) and {logistic/cos_mean_of_zo_gaussian_steps:.3f} (zeroth order). "
    "At the smallest α Δθ* has cosine {logistic/small_alpha_vs_minimizer_cos:.4f} with the step to the minimizer, "
    "Newton's first step {logistic/cos_to_minimizer_newton:.3f}.",
    lo=quad_alphas[0], hi=quad_alphas[-1], a_mid=a_mid, n_average=n_average)

# %%
kh = {f"{r} vs {b}": C[f"digits/error/{r}_vs_{b}"].verdict_adjusted for r in ("kfac", "hessian_free")
      for b in ("sgd", "adam")}
run.say(
    "* **Digits at {budget} passes.** Validation error: SGD {digits/error_sgd:.3f}, Adam {digits/error_adam:.3f}, "
    "K-FAC {digits/error_kfac:.3f}, MGS {digits/error_mgs:.3f}, REINFORCE {digits/error_reinforce:.3f}, zeroth "
    "order {digits/error_zo_gaussian:.3f}; the lowest mean at this precision: {digits/best_rule_error}. After the "
    f"Holm correction {len(better_sgd)} of the rules beat SGD on the error rate"
    + (f" ({', '.join(better_sgd)})" if better_sgd else "")
    + ". K-FAC and Hessian-free against SGD and Adam: " + "; ".join(f"{k} **{v}**" for k, v in kh.items())
    + f" (K-FAC vs SGD: {C['digits/error/kfac_vs_sgd'].detectable('.3f')}, in error-rate units)"
    + ". Every rule ran at its tuned step size (SGD {digits/lr_sgd:.3g}, Adam {digits/lr_adam:.3g}, K-FAC "
    "{digits/lr_kfac:.3g}, MGS {digits/lr_mgs:.3g}); chosen at the edge of the grid: {digits/tuned_at_grid_edge}.",
    budget=budget)

# %%
lr_steps = {n: run.results[f"digits_logreg/steps_{n}"] for n in ("newton", "natural_exact", "sgd")}
cpu_x = {n: run.results[f"digits_logreg/cpu_s_{n}"] / run.results["digits_logreg/cpu_s_sgd"]
         for n in ("newton", "natural_exact")}
second = [n for n in ("newton", "natural_exact") if n not in same_as]
c_second = {n: C[f"digits_logreg/error/{n}_vs_sgd"] for n in second}
run.say(
    "* **Logistic regression on digits at {logit_budget} passes.** Validation error: Newton "
    "{digits_logreg/error_newton:.3f} ({digits_logreg/steps_newton:.0f} steps, {digits_logreg/cpu_s_newton:.2f} CPU "
    "s), exact natural gradient {digits_logreg/error_natural_exact:.3f} ({digits_logreg/steps_natural_exact:.0f} "
    "steps, {digits_logreg/cpu_s_natural_exact:.2f} s), SGD {digits_logreg/error_sgd:.3f} "
    "({digits_logreg/steps_sgd:.0f} steps, {digits_logreg/cpu_s_sgd:.2f} s), Adam {digits_logreg/error_adam:.3f}, "
    "SPSA {digits_logreg/error_spsa:.3f}. "
    + "".join(f"The per-seed errors of {n} are identical to those of {k}, so only {k} enters the family. "
              for n, k in same_as.items())
    + "Against SGD after the correction, at equal counted passes: "
    + "; ".join(f"{n} **{c.verdict_adjusted}** ({c.detectable('.3f')})" for n, c in c_second.items())
    + f". The CPU time the pass count does not show: Newton's runs took ×{cpu_x['newton']:.0f} SGD's CPU seconds, the "
    f"natural gradient's ×{cpu_x['natural_exact']:.0f}. Within the same passes the natural gradient takes "
    + ("as many steps as" if lr_steps["natural_exact"] == lr_steps["sgd"]
       else "fewer steps than" if lr_steps["natural_exact"] < lr_steps["sgd"] else "more steps than") + " SGD.",
    logit_budget=logit_budget)

# %%
lm_better, lm_worse = corrected("lm/task_loss", "better"), corrected("lm/task_loss", "worse")
EQ = {k: run.comparisons[k] for k in run.comparisons if k.startswith("lm_equal_steps/")}
per_step_x = {n: run.results[f"lm/cpu_s_per_step_{n}"] / run.results["lm/cpu_s_per_step_sgd"] for n in ("mgs", "reinforce")}
pass_x = {n: np.mean([r.passes.total / r.steps for r in runs_lm[n]]) / np.mean([r.passes.total / r.steps
                                                                               for r in runs_lm["sgd"]])
          for n in ("mgs", "reinforce")}
run.say(
    "* **Small LM at {lm_budget} passes ({lm_seeds} seeds).** Held-out {spec} of greedy decoding: pretrained "
    "{lm/base_task_loss:.3f}; SGD {lm/task_loss_sgd:.3f} ({lm/steps_sgd:.0f} steps, {lm/cpu_s_sgd:.1f} CPU s), Adam "
    "{lm/task_loss_adam:.3f} ({lm/steps_adam:.0f} steps), MGS {lm/task_loss_mgs:.3f} ({lm/steps_mgs:.0f} steps, "
    "{lm/cpu_s_mgs:.1f} s), REINFORCE {lm/task_loss_reinforce:.3f} ({lm/steps_reinforce:.0f} steps), MeZO "
    "{lm/task_loss_mezo:.3f} ({lm/steps_mezo:.0f} steps). Perplexity: pretrained {lm/base_ppl:.1f}, SGD "
    "{lm/ppl_sgd:.1f}, Adam {lm/ppl_adam:.1f}, MGS {lm/ppl_mgs:.1f}, REINFORCE {lm/ppl_reinforce:.1f}, MeZO "
    "{lm/ppl_mezo:.1f}; above twice the pretrained perplexity at some seed: {lm/ppl_over_2x_base}. After the "
    "correction, better than SGD or Adam on the task loss: " + (", ".join(lm_better) or "none") + "; worse: "
    + (", ".join(lm_worse) or "none") + "; every other pair inconclusive (MGS vs SGD: "
    + C["lm/task_loss/mgs_vs_sgd"].detectable('.3f') + ").\n"
    "* **Equal steps on the small LM.** A greedy decoding costs T = {lm_decode_len} counted forwards, so at equal "
    "passes MGS took {lm/steps_mgs:.0f} steps and REINFORCE {lm/steps_reinforce:.0f} where SGD took "
    "{lm/steps_sgd:.0f}. Given the same number of steps, SGD reaches {lm_equal_steps/task_loss_sgd_at_mgs_steps:.3f} "
    "and Adam {lm_equal_steps/task_loss_adam_at_mgs_steps:.3f} at MGS's steps, "
    "{lm_equal_steps/task_loss_sgd_at_reinforce_steps:.3f} and {lm_equal_steps/task_loss_adam_at_reinforce_steps:.3f} "
    "at REINFORCE's. Paired at equal steps (own Holm family of " + str(len(EQ)) + "): "
    + "; ".join(f"{c.name} vs {c.baseline} **{c.verdict_adjusted}**" for c in EQ.values()) + ".\n"
    f"* **CPU time.** One MGS step cost ×{per_step_x['mgs']:.1f} an SGD step's CPU seconds and one REINFORCE step "
    f"×{per_step_x['reinforce']:.1f}, against ×{pass_x['mgs']:.1f} and ×{pass_x['reinforce']:.1f} in counted passes; "
    "over the whole pass budget MGS used {lm/cpu_s_mgs:.1f} s against SGD's {lm/cpu_s_sgd:.1f} s.", lm_budget=lm_budget, lm_seeds=lm_seeds, lm_decode_len=lm_decode_len, spec=lm_task.spec)

# %% [markdown]
# > **Caveats: what this harness does not claim.** Functional calls are counted by the forwards the hooks see: a
# > vmap over K candidates as K passes, a vmap over the N examples one at a time as one pass. The backward sweeps
# > inside a transform are invisible. A dense Hessian or a GGN-vector product counts one call although it costs up
# > to ~P backward sweeps, so the pass axis flatters Newton, natural gradient and Hessian-free; the CPU-seconds
# > axis is the one to read for them.
# >
# > Only the step size is tuned, on a three-point grid with two tuning seeds (worst case) at the full budget. A
# > rule's other hyperparameters (K, α, σ, damping) keep hand-set values, and a rule whose best value sits at the
# > edge of the grid may gain from a wider one (the tuned values are printed above). In the small-LM comparison of
# > §6 the step sizes are fixed by default (`-p lm_tune true` tunes them), the decoding rules get a few steps of
# > budget, and `lm_seeds` seeds can decide only differences near or above the smallest detectable effect that the
# > closing text quotes. Counting a greedy decoding of T tokens as T forwards is
# > one convention among several, which is why the CPU-seconds panel sits beside it. The curvature rules and the
# > gradient penalty do not run there; the registry says why.

# %%
held = sum(c["held"] for c in run.claims.values())
_ = run.claims_table()
limits = run.claims["quadratic/two_limits"]["held"] and run.claims["quadratic/hand_over"]["held"]
run.say(f"**Summary.** At these parameters {held} of the {len(run.claims)} claims hold (table above). The quadratic "
        + ("shows" if limits else "does not show") + " the two limits of notebook 01, and both Δθ* problems rank the "
        f"rules by agreement beside their counted cost. The verdict family holds {family} paired comparisons; "
        f"{decided} are decided at p < 0.05 one by one, {kept} after the Holm correction across all of them. With "
        f"{n_seeds} seeds on digits and {lm_seeds} on the small LM the comparisons could detect, at 80 % power: K-FAC "
        f"vs SGD on the digits error, {C['digits/error/kfac_vs_sgd'].detectable('.3f')}; MGS vs SGD on the small LM's task "
        f"loss, {C['lm/task_loss/mgs_vs_sgd'].detectable('.3f')}. "
        + ("No comparison of the family can be decided at these seeds, whatever its effect"
           if not any(math.isfinite(c.mde_family) for c in C.values()) else
           "A difference below a comparison's detectable effect is likely to stay inconclusive at these seeds")
        + "; the next section reads the committed record of `params/16_update_rule_harness/full.yaml`.")

# %% [markdown]
# ## The verdict family at full scale: a committed record
#
# Holm across the 42 comparisons of the verdict family needs at least 11 seeds that agree at the exact sign test's
# level, so the defaults' 5 and 3 seeds report what they could detect, not verdicts.
# `params/16_update_rule_harness/full.yaml` runs the same comparisons with 16 seeds on digits, on the small LM and
# in §7's race, at a budget of 1,000 counted passes (tuned on 600, over a five-point grid), with the small LM's step
# sizes tuned. Its run is committed as a record (`data/records/16_update_rule_harness/full`); the tables below are
# *re-decided* here from its per-seed values by today's `paired_comparison` and Holm correction, family by family as
# above (a record the procedure no longer reproduces is refused; `tests/results/test_records.py` checks it ran the set
# as the set stands). The record also holds that run's tuned step sizes (`digits/lr_…`, `precond/lr_…`); the
# closing paragraph names the rules whose step size was chosen at the edge of its grid.

# %%
record = load_record("16_update_rule_harness", "full")
if record is None:
    print("No record of params/16_update_rule_harness/full.yaml beside this package (a clone has one in "
          "data/records/). Make one: python -m taskloss.runner run 16 --set full, then python -m taskloss.runner "
          "record runs/16_update_rule_harness/full")
else:
    print(record.describe())
    FULL = record.comparison_table([k for k in record.comparisons if not k.startswith(OWN_FAMILIES)])
    FULL_OWN = {}
    for own in OWN_FAMILIES:
        print()
        FULL_OWN[own] = record.comparison_table([k for k in record.comparisons if k.startswith(own)])
    full_p = record.parameters
    for name in ("n_seeds", "lm_seeds", "race_seeds", "budget", "lm_budget"):
        run.record(f"full/{name}", full_p[name], headline=name == "n_seeds")
    run.record("full/n_comparisons", len(FULL), headline=True)
    run.record("full/n_decided", sum(c.verdict_adjusted != "inconclusive" for c in FULL.values()),
               headline=True)
    for own, fam in FULL_OWN.items():
        run.record(f"full/n_decided_{own.rstrip('/')}", sum(c.verdict_adjusted != "inconclusive" for c in fam.values()))

# %%
def full_listing(fam, verdict):
    """'on <problem> <metric>: rule vs base, …; …' for the comparisons of a record's family with that corrected
    verdict, grouped by problem and metric."""
    groups = {}
    for k, c in fam.items():
        if c.verdict_adjusted == verdict:
            problem, metric = k.split("/")[:2]
            groups.setdefault(f"{problem.replace('_', ' ')} {metric}", []).append(f"{c.name} vs {c.baseline}")
    return "; ".join(f"on {g}, {', '.join(v)}" for g, v in groups.items()) or "none"


if record is not None:
    own_counts = "; ".join(f"{own.rstrip('/').replace('_', ' ')} {run.results['full/n_decided_' + own.rstrip('/')]}"
                           f" of {len(fam)}" for own, fam in FULL_OWN.items())
    _ = run.say(
        "**At full scale** (the committed record: {full/n_seeds} seeds on digits, {full/lm_seeds} on the small LM, "
        "{full/race_seeds} in the race; budget {full/budget} passes on digits, {full/lm_budget} on the LM). Holm across "
        "the {full/n_comparisons} comparisons of the verdict family decides {full/n_decided}. Better: {better}. "
        "Worse: {worse}. K-FAC vs SGD on the digits error: {kfac}. MGS vs SGD on the small LM's task loss: {mgs_lm}. "
        "The families of their own, decided after their corrections: {own}. Step sizes chosen at the edge of the "
        "five-point grid (a wider grid may move them): on digits, {edge_d}; on the LM, {edge_lm}. ({describe})",
        better=full_listing(FULL, "better"), worse=full_listing(FULL, "worse"),
        kfac=corrected_phrase(FULL["digits/error/kfac_vs_sgd"]), mgs_lm=corrected_phrase(FULL["lm/task_loss/mgs_vs_sgd"]),
        own=own_counts, describe=record.describe(), edge_d=record.results["digits/tuned_at_grid_edge"],
        edge_lm=record.results["lm/tuned_at_grid_edge"] or "none")

# %% [markdown]
# **Try this**
#
# * The full set whose record the last section reads, and a new record from it:
#   `python -m taskloss.runner run 16 --set full`, then `python -m taskloss.runner record runs/16_update_rule_harness/full`.
# * A larger ideal-update sample, to see which cosines are Monte Carlo noise:
#   `python -m taskloss.runner run 16 -p n_ref 200000`.
# * The small LM with tuned step sizes, a longer budget and more seeds:
#   `python -m taskloss.runner run 16 -p lm_tune true -p lm_budget 400 -p lm_seeds 10`.
# * A wider network: `python -m taskloss.runner run 16 -p hidden 128`; add your own rule with
#   `taskloss.harness.register(name, cls, defaults)` and it joins every table.
# * Seconds, not minutes: `python -m taskloss.runner run 16 --set smoke`.
