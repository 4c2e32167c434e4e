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
# # 18 · Group policy gradients against the exact gradient: REINFORCE, RLOO, GRPO, Dr. GRPO, DAPO and MGS
#
# Language models are tuned on task metrics today by *group-sampled* policy gradients: draw $G$ completions per
# prompt, score each, and weight each completion's score function $\nabla\log p_\theta(y)$ by an *advantage* built
# from the group's rewards. The recipes differ in three small choices — the baseline, a division by the group's
# standard deviation, and how token terms are averaged — and those choices decide whether the estimator estimates
# $\nabla_\theta\,\mathbb E_{y\sim p_\theta}[R(y)]$ at all.
#
# **Question.** Which of these estimators are unbiased, how large is the bias of the others as a function of the
# group size and of the reward's spread, and what does it change when a small model is fine-tuned on a shaped reward
# while we watch the task metric? We answer the first two *exactly*, on a policy over short sequences whose every
# sequence can be enumerated, and place MGS's update and the zeroth-order estimate beside the ideal update $\Delta\theta^*$
# of notebook 01.
#
# **Sources.**
# * R. J. Williams, "Simple statistical gradient-following algorithms for connectionist reinforcement learning",
#   *Machine Learning* 8, 1992 (REINFORCE).
# * W. Kool, H. van Hoof and M. Welling, "Buy 4 REINFORCE samples, get a baseline for free!", ICLR DeepRLStructPred
#   workshop, 2019; A. Ahmadian et al., "Back to basics: revisiting REINFORCE style optimization for learning from
#   human feedback in LLMs", [arXiv:2402.14740](https://arxiv.org/abs/2402.14740) (RLOO).
# * Z. Shao et al., "DeepSeekMath", [arXiv:2402.03300](https://arxiv.org/abs/2402.03300) (GRPO).
# * Z. Liu et al., "Understanding R1-Zero-like training: a critical perspective",
#   [arXiv:2503.20783](https://arxiv.org/abs/2503.20783) (Dr. GRPO).
# * Q. Yu et al., "DAPO: an open-source LLM reinforcement learning system at scale",
#   [arXiv:2503.14476](https://arxiv.org/abs/2503.14476) (token-level loss, clip-higher).
# * S. Welleck and K. Cho, "MLE-guided parameter search for task loss minimization in neural sequence modeling",
#   AAAI 2021, [arXiv:2006.03158](https://arxiv.org/abs/2006.03158) (MGS).
# * TRL's `GRPOTrainer` (trl 1.16), whose `loss_type`s our functions equal to float round-off
#   (`tests/search/test_trl_parity.py`).
#
# Package code: `taskloss.search.group_estimators` (the family), `taskloss.search.exact_sequences` (enumeration),
# `taskloss.sampling` (Δθ*), `taskloss.search.mgs_reference` and `taskloss.search.zeroth_order`.
#
# Identities are asserted; claims — findings of this run at these parameters — are printed as held or not held and
# listed at the end.

# %% tags=["parameters"]
seed: int = 0                  # [≥ 0] seed of every random draw
device: str = "auto"           # "auto" (cuda when available), "cpu" or "cuda"
output_dir: str = ""           # run folder; empty: the runner's, or runs/interactive/<notebook>
n_tokens: int = 3              # [≥ 2, ≤ 8] symbols of the enumerable policy, EOS included (§1–3)
max_length: int = 3            # [≥ 1, ≤ 5] longest completion of the enumerable policy (§1–3)
group_sizes: list[int] = [2, 3, 4]   # [≥ 2] group sizes enumerated exactly (M^G groups each)
spreads: list[float] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]   # [> 0] reward scales for GRPO's bias (§2)
delta_samples: int = 20000     # [≥ 100] proposal draws for the ideal update Δθ* (§3)
search_sizes: list[int] = [4, 16, 64]   # [≥ 2] candidates / directions per MGS and zeroth-order estimate (§3)
search_reps: int = 10          # [≥ 2] independent estimates per size (§3)
search_radius: float = 0.3     # [> 0] radius ε of the ball of Δθ*; MGS and zeroth order use σ of ε/√d (§3)
ft_tokens: int = 5             # [≥ 2, ≤ 8] symbols of the fine-tuned policy, EOS included (§4)
ft_length: int = 5             # [≥ 2, ≤ 5] longest completion in the fine-tuning task (§4)
ft_model: str = "table"        # the fine-tuned policy: "table" (logits per position and previous token) or "transformer"
ft_width: int = 16             # [≥ 4] width of the "transformer" policy (2 layers, 2 heads)
ft_group: int = 4              # [≥ 2] completions per step (group size; MGS: candidates) (§4)
ft_token_budget: int = 600     # [≥ 10] sampled tokens per run (§4)
ft_seeds: int = 10             # [≥ 2] paired seeds per method (§4)
ft_lr: float = 0.1             # [> 0] Adam step of the policy-gradient methods
mgs_lr: float = 1.0            # [> 0] MGS step (SGD on Δθ*, update norm clipped at 1)
mgs_alpha: float = 0.05        # [> 0] MGS temperature α

# %%
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import taskloss.results
import taskloss.search as S
from taskloss.losses import edit_distance
from taskloss.models import TransformerLM
from taskloss.results.plotting import label_axes, median_band, show
from taskloss.sampling import UniformBallProposal, ball_expected_update, expected_update
from taskloss.search.mgs_reference import mgs_step_reference
from taskloss.search.zeroth_order import gaussian_smoothing_grad

# %%
run = taskloss.results.start("18_group_policy_gradients", output_dir, device=device, seed=seed)
torch.manual_seed(seed)
t_start = time.time()
EOS = 0
PROMPT = torch.tensor([EOS])          # the prompt is one start token; the policy's table reads the previous token


def flat_grad(value, params):
    """∇value as one flat vector."""
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)])


def cos(a, b):
    return float(a @ b / (a.norm() * b.norm()))


# %% [markdown]
# ## 1 · From the score-function identity to each estimator, checked exactly
#
# The policy is a table of logits per position and previous token, $p_\theta(y_t\mid y_{t-1}, t) =
# \mathrm{softmax}(\theta_{t, y_{t-1}})$: a causal "language model" small enough that every completion can be listed.
# A completion stops at its first EOS or after `max_length` tokens. With rewards $R(y)$ drawn once, the objective and
# its gradient are finite sums,
#
# $$J(\theta) = \sum_y p_\theta(y) R(y), \qquad \nabla J = \sum_y p_\theta(y) R(y)\,\nabla\log p_\theta(y)
# \quad\text{(the score-function identity, since } \nabla p = p\,\nabla\log p).$$
#
# **Step 1.** Autograd through $J$ and the explicit sum of $p R \nabla \log p$ agree.

# %%
seqs, mask = S.enumerate_sequences(n_tokens, max_length, EOS)
policy = S.TabularPolicy(n_tokens, max_length, seed=seed)
params = [policy.logits]
R = torch.randn(len(seqs), generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
J = S.exact_objective(policy, PROMPT, seqs, mask, R)
grad_J = flat_grad(J, params)
logps, jac = S.sequence_scores(policy, PROMPT, seqs, mask)
p = logps.sum(1).exp()
scores = jac.sum(1)                                    # ∇ log p(y) = Σ_t ∇ log p(y_t | ·)   [M, P]
torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=torch.float64))
torch.testing.assert_close((p * R) @ scores, grad_J)
print(f"{len(seqs)} sequences, {grad_J.numel()} parameters, J = {J.item():.4f}, |∇J| = {float(grad_J.norm()):.4f}")

# %% [markdown]
# **Step 2. A baseline costs nothing in expectation.** $\sum_y p(y)\nabla\log p(y) = \nabla \sum_y p(y) = 0$, so
# $\mathbb E[(R - b)\nabla\log p] = \nabla J$ for any $b$ that does not depend on the sampled $y$.
#
# **Step 3. RLOO.** Draw $G$ completions independently. The mean of the *other* rewards, $b_i = \frac1{G-1}\sum_{j\ne i}R_j$,
# is independent of $y_i$: the estimator $\hat g = \frac1G\sum_i (R_i - b_i)\nabla\log p(y_i)$ is unbiased.
#
# **Step 4. The mean baseline** $\bar R = \frac1G\sum_j R_j$ contains $R_i$ itself:
# $R_i - \bar R = \frac{G-1}{G}(R_i - b_i)$, so its expectation is $\frac{G-1}{G}\nabla J$ — a shrunk but correctly
# aimed gradient. **Dr. GRPO** uses this advantage and divides the token sum by a constant $G\cdot L_{\max}$: expectation
# $\frac{G-1}{G L_{\max}}\nabla J$.
#
# **Step 5. GRPO** divides the advantage by the group's standard deviation (a function of the sampled rewards, so
# of every $y_j$) and each sequence's token sum by its own length $|y_i|$. **DAPO** divides all token terms by the
# group's total token count $\sum_j |y_j|$. None of these is a constant: the expectation is no longer a multiple of
# $\nabla J$. The exact expectations below sum the package's own loss functions over all $M^G$ ordered groups.

# %%
torch.testing.assert_close(p @ scores, torch.zeros_like(grad_J), atol=1e-12, rtol=0)          # step 2
G0 = group_sizes[0]
Rg = R[:2 * G0].float()                                                                     # one from-scratch check
scratch_grpo = (Rg.view(-1, G0) - Rg.view(-1, G0).mean(1, keepdim=True)) / (Rg.view(-1, G0).std(1, keepdim=True) + 1e-4)
scratch_loo = Rg.view(-1, G0) - (Rg.view(-1, G0).sum(1, keepdim=True) - Rg.view(-1, G0)) / (G0 - 1)
torch.testing.assert_close(S.group_advantages(Rg, G0, scale="group"), scratch_grpo.reshape(-1))
torch.testing.assert_close(S.group_advantages(Rg, G0, baseline="loo"), scratch_loo.reshape(-1))

ESTIMATORS = {"REINFORCE (mean baseline)": S.reinforce_mean_baseline_loss, "RLOO": S.rloo_loss,
              "GRPO": S.grpo_loss, "Dr. GRPO": S.dr_grpo_loss, "DAPO (token-level)": S.dapo_loss}
PREDICTED = {"REINFORCE (mean baseline)": lambda G: (G - 1) / G, "RLOO": lambda G: 1.0,
             "Dr. GRPO": lambda G: (G - 1) / (G * max_length)}
moments = {}
for G in group_sizes:
    for name, fn in ESTIMATORS.items():
        moments[name, G] = S.exact_group_moments(fn, policy, PROMPT, seqs, mask, R, G)
        if name in PREDICTED:                                                    # steps 3 and 4, exactly
            torch.testing.assert_close(moments[name, G].mean, PREDICTED[name](G) * grad_J, rtol=1e-9, atol=1e-12)
print("RLOO is unbiased, the mean baseline and Dr. GRPO are the predicted multiples of ∇J, at G =", group_sizes)

# %% [markdown]
# ## 2 · Bias and variance at equal numbers of sampled sequences
#
# Every estimator sees one group of $G$ completions. For each we report its *scale* $c$ (the best multiple of
# $\nabla J$: $c = \langle \mathbb E\hat g, \nabla J\rangle/\|\nabla J\|^2$), its *direction bias*
# $\|\mathbb E\hat g - c\nabla J\|/\|\mathbb E\hat g\|$ (0 when it is aimed right), the cosine of its expectation to
# $\nabla J$, and its noise relative to its own scale, $\sqrt{\operatorname{tr}\operatorname{Cov}\hat g}/\|\mathbb E \hat g\|$
# (a step size rescales both, so this is what a tuned learning rate sees).

# %%
rows = []
for (name, G), m in moments.items():
    c = float(m.mean @ grad_J / (grad_J @ grad_J))
    rows.append({"estimator": name, "G": G, "scale": c,
                 "direction_bias": float((m.mean - c * grad_J).norm() / m.mean.norm()),
                 "cos": cos(m.mean, grad_J), "rel_noise": math.sqrt(m.trace_cov) / float(m.mean.norm())})
print("| estimator | G | scale c | direction bias | cos(E ĝ, ∇J) | noise / |E ĝ| |\n|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['estimator']} | {r['G']} | {r['scale']:.4f} | {r['direction_bias']:.2e} | {r['cos']:.4f} | "
          f"{r['rel_noise']:.2f} |")
Gmax = group_sizes[-1]
by = {(r["estimator"], r["G"]): r for r in rows}
run.record("bias/table", rows)
run.record("bias/grpo_direction_bias_Gmax", by["GRPO", Gmax]["direction_bias"], headline=True)
run.record("bias/dapo_direction_bias_Gmax", by["DAPO (token-level)", Gmax]["direction_bias"], headline=True)
run.record("bias/rloo_direction_bias_Gmax", by["RLOO", Gmax]["direction_bias"])
run.record("bias/grpo_scale_Gmax", by["GRPO", Gmax]["scale"])
run.record("variance/rloo_rel_noise_Gmax", by["RLOO", Gmax]["rel_noise"], headline=True)
run.record("variance/grpo_rel_noise_Gmax", by["GRPO", Gmax]["rel_noise"])
_ = run.claim("bias/grpo_biased", "GRPO's expectation misses the direction of ∇J by more than 1% at every group size",
              all(by["GRPO", G]["direction_bias"] > 0.01 for G in group_sizes),
              value=min(by["GRPO", G]["direction_bias"] for G in group_sizes), bound="> 0.01")

# %% [markdown]
# **GRPO's bias against the reward's spread.** Scaling the rewards by $s$ leaves RLOO's direction unchanged. GRPO
# divides by $\mathrm{std} + \epsilon$ with $\epsilon = 10^{-4}$: for $s \ll \epsilon$ the division is by a constant
# and only the length normalization biases it; for $s \gg \epsilon$ the advantage is scale-free and the
# per-group weighting $1/\mathrm{std}$ changes the bias (up or down: it depends on which groups it favours).

# %%
spread_bias = {"GRPO": [], "DAPO (token-level)": []}
for s in spreads:
    for name in spread_bias:
        m = S.exact_group_moments(ESTIMATORS[name], policy, PROMPT, seqs, mask, s * R, Gmax)
        c = float(m.mean @ grad_J / (grad_J @ grad_J))
        spread_bias[name].append(float((m.mean - c * grad_J).norm() / m.mean.norm()))
run.record("bias/grpo_vs_spread", dict(zip(map(str, spreads), spread_bias["GRPO"])))
_ = run.claim("bias/grpo_biased_at_every_spread", "GRPO's direction bias exceeds 1% at every reward scale (the "
              "length normalization alone biases it when the std is negligible beside ε)",
              min(spread_bias["GRPO"]) > 0.01, value=min(spread_bias["GRPO"]), bound="> 0.01")

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
for name in ESTIMATORS:
    axes[0].plot(group_sizes, [max(by[name, G]["direction_bias"], 1e-17) for G in group_sizes], "o-", label=name)  # log axis: no 0
label_axes(axes[0], "group size G", "direction bias ‖E ĝ − c∇J‖/‖E ĝ‖", "exact, by enumeration", logy=True,
           lower_is_better=True)
for name, ys in spread_bias.items():
    axes[1].plot(spreads, ys, "o-", label=name)
axes[1].axvline(1e-4, color="grey", ls=":", label="ε = 1e-4")
label_axes(axes[1], "reward scale s (rewards s·R)", "direction bias", f"G = {Gmax}", logx=True, lower_is_better=True)
run.savefig(fig, "bias.png")
show(fig, "Left: each estimator's exact direction bias against the group size (RLOO, the mean baseline and Dr. GRPO "
     "are at round-off, about 1e-16). Right: GRPO's and DAPO's bias against the rewards' scale; the dotted line is "
     "the ε added to the standard deviation.")

# %% [markdown]
# ## 3 · MGS and the zeroth-order estimate against the ideal update Δθ*
#
# Notebook 01 defines the ideal update as the mean of $p(\Delta\theta) \propto \exp(-[\ell(\theta+\Delta\theta) -
# \ell(\theta)]/\alpha)$ on the ball $\|\Delta\theta\|\le\varepsilon$; here $\ell = -J$ is exact, so $\Delta\theta^*$ is
# estimated from `delta_samples` uniform draws in the ball with self-normalized importance sampling and set beside
# the closed form of the linearized loss, at the temperature $\alpha = \varepsilon\|\nabla J\|$ where the linear loss
# change across the ball is one unit of $\alpha$ (its effective sample size is printed). MGS draws $K$ candidates
# (scale $\sigma = \varepsilon/\sqrt d$) from its MLE-guided mixture (the MLE
# direction of the best sequence) and weighs them by the same target; the zeroth-order estimate uses $K$ Gaussian
# directions. Both use $K$ evaluations of $J$; neither samples outputs, so their error is that of the search alone.

# %%
theta0 = policy.logits.detach().reshape(-1).clone()
sigma_search = search_radius / math.sqrt(theta0.numel())
context = torch.cat([PROMPT.expand(len(seqs), 1), seqs.clamp_min(0)], 1)[:, :-1]


def J_at(flat):
    """Exact J at the flat parameters ``flat`` [P] (vmappable)."""
    logits = torch.func.functional_call(policy, {"logits": flat.reshape(policy.logits.shape)}, (context,))
    lp = (torch.log_softmax(logits, -1).gather(-1, seqs.clamp_min(0)[..., None])[..., 0] * mask).sum(1)
    return (lp.exp() * R).sum()


def loss_points(points):
    """The loss −J at each row of points [K, P]."""
    return -torch.vmap(J_at)(points)


torch.testing.assert_close(-loss_points(theta0[None])[0], J.detach())
gen = torch.Generator().manual_seed(seed + 2)
proposal = UniformBallProposal(torch.zeros_like(theta0), search_radius)
alpha_search = search_radius * float(grad_J.norm())   # the linear loss change across the ball = one unit of α
ideal = expected_update(loss_points, theta0, alpha_search, proposal, delta_samples, gen, radius=search_radius)
delta_star = ideal.estimate
linear = ball_expected_update(-grad_J, alpha_search, search_radius)    # notebook 01's closed form, linearized loss
print(f"Δθ*: ESS {float(ideal.ess):.0f} of {delta_samples}, cos(Δθ*, ∇J) = {cos(delta_star, grad_J):.3f}, "
      f"‖Δθ*‖ = {float(delta_star.norm()):.4f} (linearized closed form {float(linear.norm()):.4f})")

best = int(R.argmax())
target_ids = seqs[best:best + 1]


def mgs_delta(K, s):
    """MGS's Δθ (before clipping) from the readable reference step, K candidates, seed s; θ restored afterwards."""
    opt = torch.optim.SGD(params, lr=0.0)

    def closure():
        nll = -(S.completion_logprobs(policy, PROMPT[None], target_ids) * mask[best:best + 1]).sum()
        nll.backward()
        return nll, None

    _, res = mgs_step_reference(policy, opt, closure, lambda out, batch: -S.exact_objective(
        policy, PROMPT, seqs, mask, R), seed=s, n_samples=K, alpha=alpha_search, sigma=sigma_search,
        sigma_mode="absolute", forward_fn=lambda m, b: None)
    return res.estimate


cos_rows = {"MGS": {}, "zeroth order": {}}
for K in search_sizes:
    cm, cz = [], []
    for r in range(search_reps):
        cm.append(cos(mgs_delta(K, 1000 * K + r), delta_star))
        gz = gaussian_smoothing_grad(lambda th: -J_at(th["w"]), {"w": theta0}, sigma_search, K, baseline="value",
                                     generator=torch.Generator().manual_seed(1000 * K + r))["w"]
        cz.append(cos(-gz, delta_star))
    cos_rows["MGS"][K], cos_rows["zeroth order"][K] = cm, cz
with torch.no_grad():
    assert torch.equal(policy.logits.reshape(-1), theta0)           # the reference step left θ where it was
for name, d in cos_rows.items():
    print(name, {K: f"{np.mean(v):.3f}" for K, v in d.items()})
Kmax = search_sizes[-1]
run.record("search/cos_delta_star_grad", cos(delta_star, grad_J))
run.record("search/mgs_cos_delta_star_Kmax", float(np.mean(cos_rows["MGS"][Kmax])), headline=True)
run.record("search/zo_cos_delta_star_Kmax", float(np.mean(cos_rows["zeroth order"][Kmax])))
run.record("search/delta_star_ess", float(ideal.ess))
run.record("search/cos_delta_star_linear_closed_form", cos(delta_star, linear))
_ = run.claim("search/mgs_aligned", f"MGS's Δθ with {Kmax} candidates has a positive mean cosine to Δθ*",
              float(np.mean(cos_rows["MGS"][Kmax])) > 0, value=float(np.mean(cos_rows["MGS"][Kmax])), bound="> 0")

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(5, 3.4))
for name, d in cos_rows.items():
    ax.errorbar(search_sizes, [np.mean(v) for v in d.values()],
                yerr=[np.std(v) / math.sqrt(len(v)) for v in d.values()], marker="o", capsize=3, label=name)
ax.axhline(cos(delta_star, grad_J), color="grey", ls=":", label="∇J itself")
ax.set_xscale("log", base=2)
label_axes(ax, "evaluations of J per estimate (K)", "cos(estimate, Δθ*)", lower_is_better=False)
run.savefig(fig, "search.png")
show(fig, "Mean cosine (± standard error over {reps} estimates) of MGS's Δθ and of the zeroth-order estimate to the "
     "ideal update Δθ*, against the number of candidates or directions; the dotted line is ∇J's own cosine to Δθ*.",
     run=run, reps=search_reps)

# %% [markdown]
# ## 4 · Fine-tuning on a shaped reward, watching the task metric
#
# A larger policy (`ft_tokens` symbols, completions up to `ft_length`; the same table by default, a two-layer causal
# transformer with `ft_model = "transformer"`) should produce the target
# sequence $y^\star = (1, 2, \dots, L-1, \mathrm{EOS})$. The **task metric** is $1 -$ the normalized edit distance
# to $y^\star$. The **shaped reward** is what is cheap to write: the fraction of $y^\star$'s tokens that occur in
# $y$, in any order. The two agree on $y^\star$ and disagree on every permutation of it. Each method gets the same
# budget of sampled tokens and the same seeds (initial policy and sampling), and both quantities are computed
# *exactly* over all completions after every step — no evaluation noise. MGS (Welleck & Cho) proposes from the MLE
# gradient of $y^\star$ and scores candidates by the shaped reward of one sampled completion each (common random
# numbers across candidates); it uses the reference, which the policy-gradient methods never see.
#
# Adam divides each coordinate's step by its running scale, so an estimator that is a constant multiple of another
# takes the same steps: RLOO, the mean baseline ((G−1)/G of RLOO's advantages, sample by sample) and Dr. GRPO (a further
# 1/L) must trace the same trajectory up to Adam's ε. The comparisons that remain are RLOO against GRPO (the std and
# length normalizations), GRPO against DAPO (per-sequence against per-token averaging) and MGS against RLOO.

# %%
ft_seqs, ft_mask = S.enumerate_sequences(ft_tokens, ft_length, EOS)
target = torch.tensor([list(range(1, ft_length)) + [EOS]])
body = set(range(1, ft_length))


def shaped_reward(rows):
    return torch.tensor([len(body & {t for t in r if t > 0}) / len(body) for r in rows.tolist()], dtype=torch.float64)


def task_metric(rows):
    hyp = rows.masked_fill(rows < 0, EOS)
    return 1 - edit_distance(hyp, target.expand(len(rows), -1), eos_id=EOS).double()


ft_R, ft_M = shaped_reward(ft_seqs), task_metric(ft_seqs)
index = {tuple(r): i for i, r in enumerate(ft_seqs.tolist())}
print(f"{len(ft_seqs)} completions; {int((ft_R == 1).sum())} have the full shaped reward, "
      f"{int((ft_M == 1).sum())} the full task metric")


def exact_values(pol):
    with torch.no_grad():
        lp = (S.completion_logprobs(pol, PROMPT.expand(len(ft_seqs), 1), ft_seqs) * ft_mask).sum(1).exp()
    return float(lp @ ft_R), float(lp @ ft_M)


def new_policy(s):
    """The policy of seed s: the table, or a small causal transformer (taskloss.models.TransformerLM)."""
    if ft_model == "table":
        return S.TabularPolicy(ft_tokens, ft_length, init_scale=0.5, seed=s)
    if ft_model != "transformer":
        raise ValueError(f"ft_model must be 'table' or 'transformer', got {ft_model!r}")
    torch.manual_seed(s)
    return TransformerLM(ft_tokens, d_model=ft_width, n_layers=2, n_heads=2, max_len=ft_length + 1).double()


def train(method, s):
    """One run: returns (tokens, expected reward, expected metric) after every step."""
    pol = new_policy(s)
    gen = torch.Generator().manual_seed(10_000 + s)              # the same samples for every method at seed s
    opt = torch.optim.SGD(pol.parameters(), lr=mgs_lr) if method == "MGS" else torch.optim.Adam(pol.parameters(),
                                                                                                lr=ft_lr)
    tokens, log = 0, [(0, *exact_values(pol))]
    step = 0
    while tokens < ft_token_budget:
        if method == "MGS":
            crn, used = 20_000 * (s + 1) + step, []

            def closure():
                nll = -S.completion_logprobs(pol, PROMPT[None], target).sum()
                nll.backward()
                return nll, None

            def sampled_loss(out, batch):          # every candidate draws with the same seed: common random numbers
                _, comp, cm = S.sample_groups(pol, PROMPT[None], 1, ft_length, eos_id=EOS, pad_id=EOS,
                                              generator=torch.Generator().manual_seed(crn))
                used.append(int(cm.sum()))
                return -shaped_reward(comp.masked_fill(cm == 0, -100))[0]

            mgs_step_reference(pol, opt, closure, sampled_loss, seed=s, step=step, n_samples=ft_group,
                               alpha=mgs_alpha, sigma=0.1, forward_fn=lambda m, b: None)
            tokens += sum(used)                      # ft_group candidates, one sampled completion each
        else:
            prompts, comp, cm = S.sample_groups(pol, PROMPT[None], ft_group, ft_length, eos_id=EOS, pad_id=EOS,
                                                generator=gen)
            comp = comp.masked_fill(cm == 0, -100)
            rewards = shaped_reward(comp)
            loss = FT_METHODS[method](S.completion_logprobs(pol, prompts, comp), cm.double(), rewards, ft_group)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tokens += int(cm.sum())
        step += 1
        log.append((tokens, *exact_values(pol)))
    return np.array(log)


FT_METHODS = {"REINFORCE (mean baseline)": S.reinforce_mean_baseline_loss, "RLOO": S.rloo_loss,
              "GRPO": S.grpo_loss, "Dr. GRPO": S.dr_grpo_loss, "DAPO (token-level)": S.dapo_loss, "MGS": None}
t0 = time.time()
logs = {m: [train(m, s) for s in range(seed, seed + ft_seeds)] for m in FT_METHODS}
print(f"{len(FT_METHODS)} methods × {ft_seeds} seeds in {time.time() - t0:.1f} s")
grid = np.linspace(0, ft_token_budget, 25)


def on_grid(log, col):
    return np.interp(grid, log[:, 0], log[:, col])


final_R = {m: np.array([on_grid(lg, 1)[-1] for lg in logs[m]]) for m in FT_METHODS}
final_M = {m: np.array([on_grid(lg, 2)[-1] for lg in logs[m]]) for m in FT_METHODS}
start_R, start_M = float(logs["RLOO"][0][0, 1]), float(logs["RLOO"][0][0, 2])
for m in FT_METHODS:
    run.record(f"ft/reward_{m}", float(np.median(final_R[m])))
    run.record(f"ft/metric_{m}", float(np.median(final_M[m])), headline=m in ("RLOO", "GRPO"))
same = max(float(np.abs(on_grid(a, c) - on_grid(b, c)).max()) for m in ("REINFORCE (mean baseline)", "Dr. GRPO")
           for a, b in zip(logs[m], logs["RLOO"]) for c in (1, 2))
run.record("ft/adam_cancels_constant_factors_max_diff", same)
adam_text = ("took the same steps (largest difference {:.1e}): their constant factors cancel" if same < 1e-6 else
             "drifted apart by up to {:.3f}: Adam's ε and then different samples separate them").format(same)
print(f"RLOO, the mean baseline and Dr. GRPO: {adam_text}")
PAIRS = [("RLOO", "GRPO"), ("GRPO", "DAPO (token-level)"), ("MGS", "RLOO")]
for a, b in PAIRS:
    run.compare(f"ft/metric_{a}_vs_{b}", final_M[a], final_M[b], name=a, baseline=b, metric="expected task metric",
                headline=(a, b) == ("RLOO", "GRPO"))
run.comparison_table([f"ft/metric_{a}_vs_{b}" for a, b in PAIRS])
gap = {m: float(np.median(final_R[m] - final_M[m])) for m in FT_METHODS}
run.record("ft/reward_minus_metric", gap)
_ = run.claim("ft/reward_outruns_metric", "for every policy-gradient method the median shaped reward rises more than "
              "the task metric over the budget",
              all(np.median(final_R[m]) - start_R > np.median(final_M[m]) - start_M for m in FT_METHODS if m != "MGS"),
              value=min(gap[m] for m in FT_METHODS if m != "MGS"), bound="reward gain > metric gain")

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, len(FT_METHODS), figsize=(3.0 * len(FT_METHODS), 3.2), sharey=True)
for ax, m in zip(axes, FT_METHODS):
    median_band(ax, grid, np.stack([on_grid(lg, 1) for lg in logs[m]]), label="shaped reward", color="C0")
    median_band(ax, grid, np.stack([on_grid(lg, 2) for lg in logs[m]]), label="task metric", color="C3")
    label_axes(ax, "sampled tokens", "expected value (exact)" if m == "REINFORCE (mean baseline)" else "", m,
               legend=m == "REINFORCE (mean baseline)")
run.savefig(fig, "reward_vs_metric.png")
show(fig, "The exact expected shaped reward (blue) and task metric (red) after every step, median and interquartile "
     "band over {n} paired seeds, against the sampled tokens spent. Where the blue curve rises above the red one the "
     "policy is learning the reward's loophole (the right tokens in the wrong order), not the task.", run=run,
     n=ft_seeds)

# %% [markdown]
# ## Summary
#
# Rendered from this run's recorded values.

# %%
def verdict(key):
    c = run.comparisons[key]
    return f"{c.effect:+.3f} ({c.verdict_adjusted}, Holm across {len(PAIRS)})"


run.record("runtime_s", time.time() - t_start)
_ = run.say(
    "* **Unbiased or not, exactly.** On {M} enumerated completions RLOO's expectation equals ∇J to round-off at every "
    "group size {gs}; the mean baseline's is (G−1)/G·∇J and Dr. GRPO's (G−1)/(G·L)·∇J, as derived. GRPO misses the "
    "direction of ∇J by {bias/grpo_direction_bias_Gmax:.1%} at G = {G} (scale {bias/grpo_scale_Gmax:.3f}), DAPO's "
    "token-level loss by {bias/dapo_direction_bias_Gmax:.1%}.\n"
    "* **Variance.** Relative to its own scale, one group's noise is {variance/rloo_rel_noise_Gmax:.2f} for RLOO and "
    "{variance/grpo_rel_noise_Gmax:.2f} for GRPO at G = {G}: {trade}.\n"
    "* **Spread.** GRPO's bias goes from {b0:.1%} at reward scale {s0:g} to {b1:.1%} at {s1:g}.\n"
    "* **Search.** The ideal update Δθ* has cosine {search/cos_delta_star_grad:.3f} to ∇J; with {K} evaluations MGS's "
    "Δθ reaches cosine {search/mgs_cos_delta_star_Kmax:.3f} to Δθ* and the zeroth-order estimate "
    "{search/zo_cos_delta_star_Kmax:.3f}.\n"
    "* **Fine-tuning** ({budget} sampled tokens, {n} paired seeds): the median final task metric is "
    "{rloo_m:.3f} for RLOO and {grpo_m:.3f} for GRPO, the shaped reward {rloo_r:.3f} and {grpo_r:.3f}. On the task "
    "metric, RLOO against GRPO: {v1}; GRPO against DAPO: {v2}; MGS (which sees the reference) against RLOO: {v3}. "
    "Under Adam, RLOO, the mean baseline and Dr. GRPO {adam}.",
    M=len(seqs), gs=group_sizes, G=Gmax, b0=spread_bias["GRPO"][0], b1=spread_bias["GRPO"][-1], s0=spreads[0],
    s1=spreads[-1], K=Kmax, budget=ft_token_budget, n=ft_seeds, rloo_m=float(np.median(final_M["RLOO"])),
    grpo_m=float(np.median(final_M["GRPO"])), rloo_r=float(np.median(final_R["RLOO"])),
    grpo_r=float(np.median(final_R["GRPO"])), v1=verdict("ft/metric_RLOO_vs_GRPO"),
    v2=verdict("ft/metric_GRPO_vs_DAPO (token-level)"), v3=verdict("ft/metric_MGS_vs_RLOO"), adam=adam_text,
    trade=("GRPO's normalizations buy a quieter estimate with their bias"
           if by["GRPO", Gmax]["rel_noise"] < by["RLOO", Gmax]["rel_noise"] else
           "GRPO's normalizations do not even make it quieter"))

# %%
_ = run.claims_table()

# %% [markdown]
# **Try this.**
# * More seeds and a longer budget: `python -m taskloss.runner run 18 -f params/18_group_policy_gradients/full.yaml`
# * Larger groups, enumerated exactly (M^G groups): `python -m taskloss.runner run 18 -p group_sizes "[2, 4, 6]"`
# * A longer enumerable policy: `python -m taskloss.runner run 18 -p n_tokens 4 -p max_length 3`
