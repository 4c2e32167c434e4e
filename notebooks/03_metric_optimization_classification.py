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
# # 03 · Optimizing accuracy and macro-F1 directly
#
# A digits classifier is trained with cross-entropy and judged by accuracy or macro-F1. Both metrics are
# piecewise constant in the parameters (they only change when an argmax flips), so their gradient is zero almost
# everywhere and gradient descent cannot use it. Three families optimize such a metric anyway:
#
# * **MGS** (MLE-guided parameter search) samples candidate *parameter* updates around the cross-entropy step
#   and averages them with weights from the metric (notebook 02);
# * **policy gradient** (REINFORCE) samples *outputs* from the softmax and reweights their log-likelihood by
#   the metric they achieve (notebook 05);
# * **zeroth-order** search estimates the gradient of a Gaussian-smoothed metric from metric values at
#   random parameter perturbations (notebook 05).
#
# **Question.** On held-out digits, does training on the metric itself beat plain MLE — from scratch, and
# as fine-tuning from an MLE start? And does MGS's importance weighting actually use the metric in the
# ~2 400 dimensions of this classifier, with either of the two proposal densities in use?
#
# Source: *MLE-guided parameter search for task loss minimization in neural sequence modeling* (Welleck & Cho,
# AAAI 2021) and the essay introducing it (reference 000); policy gradient after *Simple statistical
# gradient-following algorithms for connectionist reinforcement learning* (Williams, 1992). Package code:
# `taskloss.search.mgs`, `taskloss.search.policy_gradient`, `taskloss.search.zeroth_order`, metrics from
# `taskloss.losses.metrics`.
#
# Sections: 1 two task losses without a gradient · 2 what drives MGS's weights, and which σ, λ keep its ESS
# above 1 · 3 the methods · 4 held-out verdicts · 5 MGS's weights during training.

# %% tags=["parameters"]
seed: int = 0
device: str = "auto"
output_dir: str = ""
n_seeds: int = 5             # [>= 2] independent runs (initialization and minibatch order) per method
hidden: int = 32             # [> 0] MLP width
batch_size: int = 128        # [> 0]
lr: float = 0.003            # [> 0] Adam(W) learning rate for MLE and for MGS from scratch
finetune_lr: float = 0.001   # [> 0] learning rate of every method started from the MLE solution
mle_steps: int = 300         # [> 0] MLE training steps that produce the MLE start
finetune_steps: int = 100    # [> 0] steps of each method from the MLE start (MLE itself continues as many)
scratch_steps: int = 200     # [> 0] steps of MGS and of MLE from a random initialization
mgs_samples: int = 4         # [> 0] MGS candidates per step
mgs_alpha: float = 0.01      # [> 0] MGS temperature (the reference's 1/β)
mgs_sigma: float = 1.0       # [> 0] MGS noise, relative to mean|g| per tensor (the reference's default)
mgs_mix: float = 0.5         # [>= 0, <= 1] λ, weight of the zero-centred component
probe_sigmas: list[float] = [0.1, 0.3, 1.0, 3.0, 10.0]   # [> 0] relative σ values of the §2 ESS probe
probe_mixes: list[float] = [0.0, 0.5, 1.0]                # [>= 0, <= 1] λ values of the §2 ESS probe
probe_batches: int = 8       # [> 0] minibatches per (density, σ, λ) cell of the probe
pg_samples: int = 4          # [>= 2] sampled label vectors per REINFORCE step
zo_samples: int = 8          # [> 0] antithetic perturbation pairs per zeroth-order step
zo_sigma: float = 0.01       # [> 0] zeroth-order smoothing scale
eval_every: int = 25         # [> 0] steps between test evaluations (the budget sweep)

# %%
import copy
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, f1_score
from tqdm.auto import tqdm

import taskloss.results
from taskloss.datasets import load_digits_splits
from taskloss.losses import accuracy, macro_f1
from taskloss.models import MLP
from taskloss.results.plotting import comparison_forest, label_axes, seed_band
from taskloss.search import MGS, classification_reinforce, gaussian_smoothing_grad
from taskloss.utils import functional_loss

# %%
run = taskloss.results.start("03_metric_optimization_classification", output_dir, device=device, seed=seed)
dev = run.device
t_start = time.time()
splits = load_digits_splits(0)
(Xtr, ytr), (Xva, yva), (Xte, yte) = [(X.to(dev), y.to(dev)) for X, y in splits]
C = 10
print(f"device {dev}; train {len(ytr)}, valid {len(yva)}, test {len(yte)} digits")

# %% [markdown]
# ## 1 · Two task losses without a useful gradient
#
# On a batch of N examples with predictions ŷ = argmax f_θ(x): accuracy = (1/N)Σ[ŷ_n = y_n]; macro-F1 averages
# over the C classes F1_c = 2TP_c/(2TP_c + FP_c + FN_c). We minimize the task losses l = 1 − accuracy and
# l = 1 − macro-F1. Checks: the package metrics equal scikit-learn's, and a small random step of the parameters
# leaves them exactly unchanged on most draws — the "gradient" a finite difference sees is zero.

# %%
def zero_one(logits, batch):
    return 1.0 - accuracy(logits.argmax(-1), batch[1])


def f1_loss(logits, batch):
    return 1.0 - macro_f1(logits.argmax(-1), batch[1], C)


TASKS = {"accuracy": zero_one, "macro_f1": f1_loss}
torch.manual_seed(seed)
probe = MLP(64, (hidden,), C).to(dev)
n_params = sum(p.numel() for p in probe.parameters())
with torch.no_grad():
    pred = probe(Xte).argmax(-1)
assert math.isclose(float(accuracy(pred, yte)), accuracy_score(yte.cpu(), pred.cpu()), rel_tol=1e-6)
assert math.isclose(float(macro_f1(pred, yte, C)), f1_score(yte.cpu(), pred.cpu(), labels=range(C), average="macro",
                                                           zero_division=0), rel_tol=1e-6)
print(f"the MLP has d = {n_params} parameters; package metrics == scikit-learn's")

# %%
unchanged = 0
for i in range(20):
    m2 = copy.deepcopy(probe)
    with torch.no_grad():
        for p in m2.parameters():
            p.add_(1e-5 * torch.randn_like(p))
        unchanged += int(float(zero_one(m2(Xte), (Xte, yte))) == float(zero_one(probe(Xte), (Xte, yte))))
print(f"test accuracy unchanged by a 1e-5 random step in {unchanged}/20 draws")
assert unchanged >= 15

# %% [markdown]
# ## 2 · What drives MGS's weights
#
# `MGS(model, optimizer, task_loss_fn)` scores the K candidates θ+Δθ_k on the minibatch that its closure returns
# with the surrogate loss (`mgs.step(closure)`); the task loss receives the candidate's logits and the batch. The update's log-weights are a sum of two terms,
#
# $$\log w_k = \underbrace{-\frac{l(\theta+\Delta\theta_k)-l(\theta)}{\alpha}}_{\text{task term}}
#   \;\underbrace{-\,\log q(\Delta\theta_k)}_{\text{density term}} + \text{const}.$$
#
# Two densities are in use. The **true mixture density** (`density="mixture"`, the package default) is the
# density the candidates were drawn from. For a draw Δθ_k = μ + σz_k from one Gaussian component,
# −log q(Δθ_k) = ½‖z_k‖² + const: its spread between candidates is that of a χ²_d/2, standard deviation
# √(d/2) ≈ 35 here — *whatever σ and λ are*. The task term moves in steps of 1/(Nα) per flipped example. So the
# density term decides, and the winner is the candidate with the *largest* noise norm (notebooks 01 §6 and
# 02 §6 predict this collapse). The **reference code's density** (`density="unit_sigma"`) evaluates the two
# Gaussians at unit variance on a noise that is tiny (σ_t = σ·mean|g_t|), so its density term is nearly
# constant and the task term decides — it is not the density of the draws (notebook 02 §4 shows the bias),
# but it lets the metric steer. All MGS runs below use the reference's α = 0.01, σ = 1 (relative), λ = ½ and
# norm-1 clipping unless a probe says otherwise. First the models every later section starts from:
# `mle_steps` of Adam on cross-entropy, one per seed.

# %%
def batches(n_steps, gen):
    """`n_steps` minibatches of `batch_size` training digits in a seeded order (epochs reshuffled)."""
    n, out, i = len(ytr), [], 0
    perm = torch.randperm(n, generator=gen)
    for _ in range(n_steps):
        if i + batch_size > n:
            perm, i = torch.randperm(n, generator=gen), 0
        idx = perm[i:i + batch_size].to(dev)
        out.append((Xtr[idx], ytr[idx]))
        i += batch_size
    return out


def ce(m, b):
    return F.cross_entropy(m(b[0]), b[1])


def ce_closure(m, b):
    """MGS's closure: the cross-entropy surrogate on batch b, its gradient, and b for scoring the candidates."""
    def closure():
        loss = ce(m, b)
        loss.backward()
        return loss, b
    return closure


# %%
def pretrain(run_seed):
    """The MLE start of one seed (and its data streams): init, minibatches, `mle_steps` of Adam."""
    gen = torch.Generator().manual_seed(run_seed)
    data = {"pre": batches(mle_steps, gen), "ft": batches(finetune_steps, gen), "sc": batches(scratch_steps, gen)}
    torch.manual_seed(run_seed)
    init = MLP(64, (hidden,), C).to(dev)
    start = copy.deepcopy(init)
    opt = torch.optim.Adam(start.parameters(), lr=lr)
    for b in data["pre"]:
        opt.zero_grad()
        ce(start, b).backward()
        opt.step()
    return init, start, data


SEEDS = [1000 * seed + s for s in range(n_seeds)]
starts = {s: pretrain(s) for s in tqdm(SEEDS, desc="MLE starts")}

# %% [markdown]
# One MGS step at the first seed's MLE start with each density, on the same candidates (same noise seed): the
# spread of the two terms across the K candidates.

# %%
def mgs_step_stats(model, density, sigma_=mgs_sigma, mix=mgs_mix, batch=None, noise_seed=seed, K_=8):
    """Diagnostics of one MGS step that leaves `model` unchanged (SGD with lr = 0 applies no update)."""
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=0.0), zero_one, n_samples=K_, alpha=mgs_alpha,
              sigma=sigma_, mix=mix, density=density, seed=noise_seed)
    mgs.step(ce_closure(model, batch if batch is not None else (Xtr[:batch_size], ytr[:batch_size])))
    return mgs.last_stats


start0 = starts[SEEDS[0]][1]
probe_stats = {dens: mgs_step_stats(start0, dens) for dens in ("mixture", "unit_sigma")}
for dens, st in probe_stats.items():
    task_term, dens_term = -st.task_losses / mgs_alpha, -st.log_q       # l(θ) only shifts every term equally
    print(f"{dens:10s}: spread of task term {float(task_term.max() - task_term.min()):7.2f}, of density term "
          f"{float(dens_term.max() - dens_term.min()):7.2f}; ESS {st.ess:.2f}; weights {st.weights.numpy().round(3)}")
torch.testing.assert_close(probe_stats["mixture"].task_losses, probe_stats["unit_sigma"].task_losses)
spread = {d: float(st.log_q.max() - st.log_q.min()) for d, st in probe_stats.items()}
assert spread["mixture"] > 0.5 * math.sqrt(n_params / 2)        # of order √(d/2), not O(1)
assert spread["unit_sigma"] < 1.0
run.record("probe/density_term_spread_mixture", spread["mixture"])
_ = run.record("probe/density_term_spread_unit_sigma", spread["unit_sigma"])

# %% [markdown]
# **Which σ and λ keep the ESS above 1?** The same one-step probe over a grid of σ (relative) and λ, for both
# densities, at `probe_batches` minibatches each (K as in training): the median ESS of the weights.

# %%
ess_grid = {d: np.zeros((len(probe_mixes), len(probe_sigmas))) for d in ("mixture", "unit_sigma")}
probe_data = starts[SEEDS[0]][2]["ft"][:probe_batches]
for dens in ess_grid:
    for i, mix in enumerate(probe_mixes):
        for j, sg in enumerate(probe_sigmas):
            ess = [mgs_step_stats(start0, dens, sg, mix, b, noise_seed=100 * seed + t, K_=mgs_samples).ess
                   for t, b in enumerate(probe_data)]
            ess_grid[dens][i, j] = np.median(ess)
for dens, g in ess_grid.items():
    print(f"median ESS of K = {mgs_samples}, density = {dens} (rows λ = {probe_mixes}, columns σ = {probe_sigmas}):")
    print(np.round(g, 2))

# %%
keep = {d: [(probe_mixes[i], probe_sigmas[j]) for i, j in zip(*np.nonzero(g > 1.5))] for d, g in ess_grid.items()}
sig_keep = sorted({s for _, s in keep["unit_sigma"]})
run.record("probe/max_median_ess_mixture", float(ess_grid["mixture"].max()))
run.record("probe/max_median_ess_unit_sigma", float(ess_grid["unit_sigma"].max()))
run.record("probe/n_cells_ess_above_1.5_mixture", len(keep["mixture"]))
run.record("probe/n_cells_ess_above_1.5_unit_sigma", len(keep["unit_sigma"]))
run.record("probe/unit_sigma_sigmas_keeping_ess", sig_keep)
run.record("probe/ess_unit_sigma_reference", float(ess_grid["unit_sigma"][probe_mixes.index(mgs_mix),
                                                                             probe_sigmas.index(mgs_sigma)])
           if mgs_mix in probe_mixes and mgs_sigma in probe_sigmas else math.nan)
assert ess_grid["mixture"].max() < 1.5        # no σ, λ keeps the true density's ESS above 1 in d ≈ 2 400
assert ess_grid["unit_sigma"].max() > 1.5     # the reference density does, for small enough σ
print("ESS > 1.5 with the true density:", keep["mixture"] or "nowhere in the grid")
print("ESS > 1.5 with the unit-σ density at σ ∈", sig_keep)

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
for ax, (dens, g) in zip(axes, ess_grid.items()):
    im = ax.imshow(g, vmin=1, vmax=mgs_samples, cmap="viridis", aspect="auto", origin="lower")
    for (i, j), v in np.ndenumerate(g):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 * mgs_samples else "k", fontsize=8)
    ax.set_xticks(range(len(probe_sigmas)), probe_sigmas)
    ax.set_yticks(range(len(probe_mixes)), probe_mixes)
    ax.set(xlabel="σ (relative to mean|g_t| per tensor)", title=f"density = {dens!r}")
axes[0].set_ylabel("λ (weight of the zero-centred component)")
fig.colorbar(im, ax=axes, label=f"median ESS of K = {mgs_samples} candidates (higher = more of them used)")
run.savefig(fig, "ess_probe.png")
plt.show()

# %% [markdown]
# *What to see:* each cell is the median number of the K candidates the weights keep in play (ESS) at one σ, λ;
# left the true density, right the reference's unit-σ density.

# %%
run.record("probe/min_median_ess_unit_sigma", float(ess_grid["unit_sigma"].min()))
_ = run.say(
    "Over this grid the true density's median ESS never exceeded {probe/max_median_ess_mixture:.2f}; the unit-σ "
    "density's was above 1.5 in {probe/n_cells_ess_above_1.5_unit_sigma} of {n_cells} cells (σ ∈ "
    "{probe/unit_sigma_sigmas_keeping_ess}; lowest cell {probe/min_median_ess_unit_sigma:.2f}, "
    "{probe/ess_unit_sigma_reference:.2f} at the reference σ = 1, λ = ½). So the rows below compare **two** MGS "
    "settings, both at the reference's σ = 1 and λ = ½: the true density (collapsed, ESS ≈ 1) and the unit-σ "
    "density (ESS > 1); every conclusion names which one it uses.", n_cells=ess_grid["unit_sigma"].size)

# %% [markdown]
# ## 3 · The methods
#
# Every method sees minibatches of `batch_size` training digits in the same seeded order and is scored on the
# 360 test digits. *Fine-tuning* methods start from the same MLE solution and run `finetune_steps` steps; the
# fair baseline is MLE continued for as many steps. *From scratch*, MGS and MLE both run `scratch_steps` steps
# from the same random initialization. All methods share the learning rate of their setting (not tuned per
# method; see "Try this").
#
# * **MLE**: Adam on cross-entropy.
# * **MGS (true density)** and **MGS (unit-σ density)**: `taskloss.search.mgs.MGS` with AdamW, K candidates,
#   α = 0.01, σ = 1 relative, λ = ½, gradient and update clipped to norm 1; the task loss is the minibatch's
#   1 − metric.
# * **Policy gradient**: `classification_reinforce`, `pg_samples` label vectors per step with a leave-one-out
#   baseline; reward per-example correctness (accuracy) or the batch's macro-F1 of each sampled label vector.
# * **Zeroth-order**: `gaussian_smoothing_grad` with antithetic pairs on the minibatch task loss, fed to Adam.

# %%
@torch.no_grad()
def evaluate(model):
    model.eval()
    pred = model(Xte).argmax(-1)
    model.train()
    return {"accuracy": float(accuracy(pred, yte)), "macro_f1": float(macro_f1(pred, yte, C))}


def mgs_stepper(model, metric, lr_, seed_, density):
    """MGS with the reference's settings; macro-F1's `.item()` range check cannot be vmapped, so its candidates'
    logits are scored in a loop (vmap_task_loss=False)."""
    mgs = MGS(model, torch.optim.AdamW(model.parameters(), lr=lr_), TASKS[metric], n_samples=mgs_samples,
              alpha=mgs_alpha, sigma=mgs_sigma, mix=mgs_mix, density=density, vmap_task_loss=(metric == "accuracy"),
              seed=seed_)

    def step(batch):
        mgs.step(ce_closure(model, batch))
        st = mgs.last_stats
        return (st.ess, st.mle_weight, int(st.weights.argmax()) == int(st.task_losses.argmin()))
    return step


# %%
def grad_stepper(model, method, metric, lr_, seed_):
    """MLE, policy gradient or zeroth-order: a step function batch → None around Adam."""
    opt, gen = torch.optim.Adam(model.parameters(), lr=lr_), torch.Generator(device=dev).manual_seed(seed_)
    reward = "accuracy" if metric == "accuracy" else (lambda s, y: macro_f1(s, y, C))

    def step(batch):
        opt.zero_grad()
        if method == "mle":
            ce(model, batch).backward()
        elif method == "pg":
            classification_reinforce(model(batch[0]), batch[1], pg_samples, reward=reward, generator=gen).loss.backward()
        else:
            f, theta = functional_loss(model, lambda out: TASKS[metric](out, batch), batch[0])
            g = gaussian_smoothing_grad(f, theta, zo_sigma, zo_samples, baseline="antithetic", generator=gen,
                                        vectorize=(metric == "accuracy"))
            for name, p in model.named_parameters():
                p.grad = g[name]
        opt.step()
    return step


# %%
def train(model, method, metric, data, lr_, seed_):
    """Run one method; returns (curve of (step, test metrics), MGS diagnostics per step)."""
    if method.startswith("mgs"):
        step = mgs_stepper(model, metric, lr_, seed_, "unit_sigma" if method == "mgs_unit_sigma" else "mixture")
    else:
        step = grad_stepper(model, method, metric, lr_, seed_)
    curve, diag = [(0, evaluate(model))], []
    for t, batch in enumerate(data, 1):
        d = step(batch)
        if d is not None:
            diag.append(d)
        if t % eval_every == 0 or t == len(data):
            curve.append((t, evaluate(model)))
    return curve, diag


# %%
FINETUNE = ["mle", "mgs", "mgs_unit_sigma", "pg", "zo"]
SCRATCH = ["mle", "mgs", "mgs_unit_sigma"]
LABEL = {"mle": "MLE", "mgs": "MGS (true density)", "mgs_unit_sigma": "MGS (unit-σ density)",
         "pg": "policy gradient", "zo": "zeroth-order"}
curves, diags, follow_seed = {}, {}, {}  # (setting, metric, method) -> list over seeds (diags: over steps)
for s in tqdm(SEEDS, desc="seeds"):
    init, start, data = starts[s]
    for setting, methods, model0, key, lr_ in (("finetune", FINETUNE, start, "ft", finetune_lr),
                                              ("scratch", SCRATCH, init, "sc", lr)):
        for metric in TASKS:
            for method in methods:
                if method == "mle" and metric != "accuracy":   # MLE ignores the metric: one run serves both
                    continue
                curve, diag = train(copy.deepcopy(model0), method, metric, data[key], lr_, s)
                for m_ in (TASKS if method == "mle" else [metric]):
                    curves.setdefault((setting, m_, method), []).append(curve)
                diags.setdefault((setting, metric, method), []).extend(diag)
                if diag:                # per seed: fraction of steps whose largest weight had the lowest task loss
                    follow_seed.setdefault((setting, metric, method), []).append(float(np.mean([a for *_, a in diag])))
print(f"trained in {time.time() - t_start:.1f} s")

# %% [markdown]
# ## 4 · Held-out verdicts
#
# For every method and metric, the paired comparison with MLE over the same seeds (same initialization or MLE
# start, same minibatches): the mean difference of the final test metric, its 95 % t-interval and the verdict
# — "better"/"worse" only when the interval excludes 0, otherwise "inconclusive". The same for the two MGS
# densities against each other.

# %%
final = {k: np.array([c[-1][1][k[1]] for c in v]) for k, v in curves.items()}     # final test metric per seed
for setting, methods in (("finetune", FINETUNE), ("scratch", SCRATCH)):
    for metric in TASKS:
        base = final[(setting, metric, "mle")]
        run.record(f"{setting}/{metric}/mle", float(base.mean()))
        for method in methods[1:]:
            run.record(f"{setting}/{metric}/{method}", float(final[(setting, metric, method)].mean()))
            run.compare(f"{setting}/{metric}/{method}_vs_mle", final[(setting, metric, method)], base,
                        name=f"{LABEL[method]}, {setting}", baseline=f"MLE, {setting}", metric=f"test {metric}")
        run.compare(f"{setting}/{metric}/unit_sigma_vs_true_density", final[(setting, metric, "mgs_unit_sigma")],
                    final[(setting, metric, "mgs")], name=f"MGS unit-σ, {setting}", baseline=f"MGS true, {setting}",
                    metric=f"test {metric}")
_ = run.comparison_table()

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
for ax, metric in zip(axes, TASKS):
    keys = [k for k in run.comparisons if f"/{metric}/" in k]
    comparison_forest(ax, [run.comparisons[k] for k in keys])
    ax.set_title(f"trained on 1 − {metric}: each method − its paired baseline")
fig.tight_layout()
run.savefig(fig, "verdicts.png")
plt.show()

# %% [markdown]
# *What to see:* a dot right of the line beats its baseline (MLE unless the row says otherwise); an interval
# crossing the line is inconclusive at this number of seeds. The effects are in units of the test metric
# (0.01 = one point of accuracy).

# %% tags=["hide-input"]
fig, axes = plt.subplots(2, 2, figsize=(12, 7))
for row, metric in zip(axes, TASKS):
    for ax, (setting, methods) in zip(row, (("scratch", SCRATCH), ("finetune", FINETUNE))):
        for method in methods:
            cs = curves[(setting, metric, method)]
            seed_band(ax, [t for t, _ in cs[0]], [[e[metric] for _, e in c] for c in cs], label=LABEL[method])
        where = "from a random initialization" if setting == "scratch" else "from the MLE start"
        label_axes(ax, "training step", f"test {metric}", f"trained on 1 − {metric}, {where}",
                   lower_is_better=False)
        if setting == "scratch":
            ax.set_ylim(0.5, 1.0)
        ax.legend(fontsize=6)
fig.tight_layout()
run.savefig(fig, "training_curves.png")
plt.show()

# %% [markdown]
# *What to see:* the budget sweep behind the verdicts (mean and 95 % t-band over seeds): whether each curve has
# flattened by the last step — the closing text quotes each method's change over the last quarter of its run.

# %%
def late_gain(cs, metric):
    """Mean over seeds of the test metric's change over the last quarter of the run (the last evaluations)."""
    steps = [t for t, _ in cs[0]]
    i0 = next(i for i, t in enumerate(steps) if t >= 0.75 * steps[-1])
    return float(np.mean([c[-1][1][metric] - c[i0][1][metric] for c in cs]))


late = {k: late_gain(v, k[1]) for k, v in curves.items()}
for (setting, metric, method), v in late.items():
    run.record(f"late_gain/{setting}/{metric}/{method}", v)
print("largest |change| over the last quarter:", f"{max(map(abs, late.values())):.4f}")

# %% [markdown]
# ## 5 · What MGS's weights did during training
#
# Per MGS step: the ESS of the weights, the total weight on MLE-centred candidates, and whether the candidate
# with the largest weight was also the one with the lowest minibatch task loss (with K candidates and ties,
# chance level is at least 1/K).

# %%
rows, follow, ess_by = ["| setting | metric | density | median ESS | mean weight on MLE-centred | argmax w = argmin l |",
                        "|---|---|---|---|---|---|"], {}, {}
for (setting, metric, method), d in diags.items():
    if not d:
        continue
    ess, mlew, agree = map(np.array, zip(*d))
    follow[(setting, metric, method)] = float(agree.mean())
    ess_by.setdefault((setting, method), []).extend(ess)
    rows.append(f"| {setting} | {metric} | {LABEL[method]} | {np.median(ess):.2f} | {mlew.mean():.2f} | {agree.mean():.2f} |")
print("\n".join(rows))
for (setting, method), v in ess_by.items():      # the fine-tuning medians are the headline
    dens = "unit_sigma" if method == "mgs_unit_sigma" else "mixture"
    run.record(f"mgs/median_ess_{dens}_density_{setting}", float(np.median(v)), headline=(setting == "finetune"))
run.record("mgs/follow_task_loss_mixture", follow[("finetune", "accuracy", "mgs")])
_ = run.record("mgs/follow_task_loss_unit_sigma", follow[("finetune", "accuracy", "mgs_unit_sigma")])

# %%
# claims: with the true density the weights collapse (ESS ≈ 1), with the reference's density they do not. Whether
# the largest weight then follows the task loss more often is a paired comparison over seeds, not an assert: at the
# CI budget it does, in the full.yaml run (wider MLP, near-converged fine-tuning, 10 seeds) both rates sit at chance
for setting in ("finetune", "scratch"):
    assert np.median(ess_by[(setting, "mgs")]) < 1.1            # true density: one candidate takes the weight
assert np.median(ess_by[("finetune", "mgs_unit_sigma")]) > 1.5
_ = run.compare("mgs/follow_unit_sigma_vs_true_density", follow_seed[("finetune", "accuracy", "mgs_unit_sigma")],
                follow_seed[("finetune", "accuracy", "mgs")], name="MGS unit-σ, finetune", baseline="MGS true, finetune",
                metric="steps with argmax w = argmin l", lower_is_better=False)
# sanity claims that hold at CI scale across seeds
assert final[("finetune", "accuracy", "mle")].mean() > 0.85            # the MLE start is a good classifier
assert final[("scratch", "accuracy", "mgs")].mean() > 0.5              # MGS from scratch learns (chance: 0.1)
for (setting, metric, method), v in final.items():                     # fine-tuning does not wreck the start
    if setting == "finetune":
        assert v.mean() > final[("finetune", metric, "mle")].mean() - 0.1
n_better = sum(c.verdict == "better" for k, c in run.comparisons.items() if k.endswith("_vs_mle"))
run.record("n_methods_better_than_mle", n_better, headline=True)
_ = run.record("runtime_s", time.time() - t_start)

# %% [markdown]
# ## Results

# %%
_ = run.table()

# %% [markdown]
# ## What the numbers say
#
# Rendered from this run's recorded values (verdicts: paired t-intervals over the seeds).

# %%
def vs(key):
    """'better than B (effect, interval)' / 'worse than …' / 'not distinguishable from …' for a recorded comparison."""
    c = run.comparisons[key]
    word = {"better": "better than", "worse": "worse than", "inconclusive": "not distinguishable from"}[c.verdict]
    return f"{word} MLE ({c.effect:+.4f}, {100 * c.confidence:.0f} % CI [{c.ci_low:+.4f}, {c.ci_high:+.4f}])"


def verdict_list(setting, metric):
    return "; ".join(f"{LABEL[m]} {vs(f'{setting}/{metric}/{m}_vs_mle')}"
                     for m in (FINETUNE if setting == "finetune" else SCRATCH)[1:])


# %%
_ = run.say(
    "* **The weights, and which density each conclusion uses.** With the true mixture density (the package "
    "default) the density term's spread across candidates is {probe/density_term_spread_mixture:.0f} nats "
    "against {probe/density_term_spread_unit_sigma:.2f} for the reference's unit-σ density; over the probe's grid "
    "of σ and λ the true density's median ESS never exceeded {probe/max_median_ess_mixture:.2f} of {K}, while "
    "the unit-σ density kept it above 1.5 at σ ∈ {probe/unit_sigma_sigmas_keeping_ess} (at the reference σ = 1, "
    "λ = ½: {probe/ess_unit_sigma_reference:.2f}). In training, the median ESS was "
    "{mgs/median_ess_mixture_density_finetune:.2f} (true density) and "
    "{mgs/median_ess_unit_sigma_density_finetune:.2f} (unit-σ) when fine-tuning, "
    "{mgs/median_ess_mixture_density_scratch:.2f} and {mgs/median_ess_unit_sigma_density_scratch:.2f} from "
    "scratch. The largest weight went to the candidate with the lowest minibatch task loss in "
    "{mgs/follow_task_loss_mixture:.0%} and {mgs/follow_task_loss_unit_sigma:.0%} of the steps (chance ≥ "
    "{chance:.0%}; fine-tuning on accuracy; unit-σ against the true density, paired over seeds: "
    "{mgs/follow_unit_sigma_vs_true_density.effect:+.3f}, {mgs/follow_unit_sigma_vs_true_density.verdict}). With "
    "the true density MGS's update is one candidate picked by its noise norm; the unit-σ density spreads the weight "
    "over the candidates, which lets the metric steer only where the candidates' minibatch task losses differ.",
    K=mgs_samples, chance=1 / mgs_samples)

# %%
_ = run.say(
    "* **Fine-tuning from the MLE start** ({steps} steps, {n} seeds), trained on 1 − accuracy: {ft_acc}. "
    "Trained on 1 − macro-F1: {ft_f1}.\n"
    "* **From scratch** ({sc} steps): on accuracy {sc_acc}; on macro-F1 {sc_f1}.\n"
    "* **Density against density:** unit-σ − true, fine-tuning accuracy "
    "{finetune/accuracy/unit_sigma_vs_true_density.effect:+.4f} "
    "({finetune/accuracy/unit_sigma_vs_true_density.verdict}); from scratch accuracy "
    "{scratch/accuracy/unit_sigma_vs_true_density.effect:+.4f} ({scratch/accuracy/unit_sigma_vs_true_density.verdict}).\n"
    "* **Has the budget settled?** Change of test accuracy over the last quarter of the run, from scratch: "
    "MLE {late_gain/scratch/accuracy/mle:+.4f}, MGS true density {late_gain/scratch/accuracy/mgs:+.4f}, MGS "
    "unit-σ {late_gain/scratch/accuracy/mgs_unit_sigma:+.4f}; when fine-tuning, at most {ft_late:.4f} in "
    "absolute value for any method and metric. {settled}\n"
    "* {n_methods_better_than_mle} of the method-vs-MLE comparisons came out *better* than MLE. On digits, "
    "where cross-entropy and accuracy agree closely, the cross-entropy step is hard to improve on; "
    "`params/03_metric_optimization_classification/full.yaml` runs ten seeds and longer training.",
    steps=finetune_steps, n=n_seeds, sc=scratch_steps, ft_acc=verdict_list("finetune", "accuracy"),
    ft_late=max(abs(v) for k, v in late.items() if k[0] == "finetune"),
    settled=("From scratch at least one curve was still rising (> 0.005), so those verdicts hold for this budget only (the "
             "full-scale parameters run 1 500 steps)." if max(v for k, v in late.items() if k[0] == "scratch") > 0.005
             else "Both settings had flattened (< 0.005 over the last quarter)."),
    ft_f1=verdict_list("finetune", "macro_f1"), sc_acc=verdict_list("scratch", "accuracy"),
    sc_f1=verdict_list("scratch", "macro_f1"))

# %% [markdown]
# ## Errata vs. the source

# %%
_ = run.say(
    "> The essay presents MGS as optimizing the evaluation metric directly \"from start to finish\", guided by "
    "the surrogate. In a network of d parameters that holds only if the importance weights can respond to the "
    "metric. With the true proposal density they cannot once d is in the thousands: the −log q term varies by "
    "≈ √(d/2) between candidates (here {probe/density_term_spread_mixture:.0f} nats) and picks the winner; the "
    "metric decided the winner in {mgs/follow_task_loss_mixture:.0%} of the steps. The reference code's unit-σ "
    "density keeps the weights spread ({mgs/follow_task_loss_unit_sigma:.0%}, "
    "{mgs/follow_unit_sigma_vs_true_density.verdict} against the true density) at the price of weights that are not "
    "importance weights for its draws (notebook 02 §4). Either way, MGS trains here because its candidates are "
    "centred on the cross-entropy step.")

# %% [markdown]
# ## Try this
#
# * `python -m taskloss.runner run 03 -p mgs_samples 16` — more candidates per MGS step: does the unit-σ density's
#   ESS, and its verdict against MLE, move?
# * `python -m taskloss.runner run 03 -p finetune_steps 400 -p finetune_lr 0.0003` — a longer, gentler
#   fine-tuning budget for every method.
# * `python -m taskloss.runner run 03 -f params/03_metric_optimization_classification/full.yaml` — ten seeds,
#   a wider MLP and longer training (tens of minutes on one core).
