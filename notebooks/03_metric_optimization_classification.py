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
# as fine-tuning from an MLE start?
#
# Source: *MLE-guided parameter search for task loss minimization in neural sequence modeling* (Welleck & Cho,
# AAAI 2021); policy gradient after *Simple statistical gradient-following algorithms for connectionist
# reinforcement learning* (Williams, 1992). Package code: `taskloss.search.mgs`, `taskloss.search.policy_gradient`,
# `taskloss.search.zeroth_order`, metrics from `taskloss.losses.metrics`.

# %% tags=["parameters"]
seed: int = 0
device: str = "auto"
output_dir: str = ""
n_seeds: int = 3             # [> 0] independent runs (initialization and minibatch order) per method
hidden: int = 32             # [> 0] MLP width
batch_size: int = 128                 # [> 0]
lr: float = 0.003            # [> 0] Adam(W) learning rate for MLE and for MGS from scratch
finetune_lr: float = 0.001   # [> 0] learning rate of every method started from the MLE solution
mle_steps: int = 300         # [> 0] MLE training steps that produce the MLE start
finetune_steps: int = 100    # [> 0] steps of each method from the MLE start (MLE itself continues as many)
scratch_steps: int = 200     # [> 0] steps of MGS and of MLE from a random initialization
K: int = 4                   # [> 0] MGS candidates per step
mgs_alpha: float = 0.01      # [> 0] MGS temperature (the reference's 1/β)
mgs_sigma: float = 1.0       # [> 0] MGS noise, relative to mean|g| per tensor (the reference's default)
mgs_mix: float = 0.5         # [>= 0, <= 1] λ, weight of the zero-centred component
pg_samples: int = 4          # [> 0] sampled label vectors per REINFORCE step
zo_samples: int = 8          # [> 0] antithetic perturbation pairs per zeroth-order step
zo_sigma: float = 0.01       # [> 0] zeroth-order smoothing scale
eval_every: int = 25                  # [> 0]

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

import taskloss.runner
from taskloss.datasets import load_digits_splits
from taskloss.losses import accuracy, macro_f1
from taskloss.models import MLP
from taskloss.search import MGS, classification_reinforce, functional_loss, gaussian_smoothing_grad

run = taskloss.runner.start("03_metric_optimization_classification", output_dir, device=device, seed=seed)
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
with torch.no_grad():
    pred = probe(Xte).argmax(-1)
assert math.isclose(float(accuracy(pred, yte)), accuracy_score(yte.cpu(), pred.cpu()), rel_tol=1e-6)
assert math.isclose(float(macro_f1(pred, yte, C)), f1_score(yte.cpu(), pred.cpu(), labels=range(C), average="macro",
                                                           zero_division=0), rel_tol=1e-6)
unchanged = 0
for i in range(20):
    m2 = copy.deepcopy(probe)
    with torch.no_grad():
        for p in m2.parameters():
            p.add_(1e-4 * torch.randn_like(p))
        unchanged += int(float(zero_one(m2(Xte), (Xte, yte))) == float(zero_one(probe(Xte), (Xte, yte))))
print(f"test accuracy unchanged by a 1e-4 random step in {unchanged}/20 draws")
assert unchanged >= 15

# %% [markdown]
# ## 2 · One MGS step on the classifier, and what drives its weights
#
# `MGS(model, optimizer, surrogate_loss_fn, task_loss_fn)` evaluates the K candidates θ+Δθ_k in one
# `torch.func.vmap` over stacked parameters; the task loss receives the candidate's logits and the batch.
# (Macro-F1 as written in `taskloss.losses.metrics` checks its class range with `.item()`, which vmap cannot trace:
# for it we pass `vmap_task_loss=False`, which vmaps the forward pass and scores each candidate's logits in a
# loop.) The update's log-weights are a sum of two terms,
#
# $$\log w_k = \underbrace{-\frac{l(\theta+\Delta\theta_k)-l(\theta)}{\alpha}}_{\text{task term}}
#   \;\underbrace{-\,\log q(\Delta\theta_k)}_{\text{density term}} + \text{const}.$$
#
# Notebook 02 predicted that with the true mixture density the density term varies between candidates by
# about √(d/2) — here d ≈ 2 400 parameters — and swamps the task term (differences of 1/N per example, divided
# by α). The reference code's density (`density="unit_sigma"`) evaluates the Gaussians at unit variance on a
# noise that is tiny (σ_t = mean|g_t|), so its density term is nearly constant and the task term decides. One
# step with each, on the same candidates (same seed):

# %%
def mgs_probe(density):
    torch.manual_seed(seed)
    model = MLP(64, (hidden,), C).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    mgs = MGS(model, opt, lambda m, b: F.cross_entropy(m(b[0]), b[1]), zero_one, K=8, alpha=mgs_alpha,
              sigma=mgs_sigma, mix=mgs_mix, density=density, seed=seed)
    return mgs.step((Xtr[:batch_size], ytr[:batch_size]))


probe_stats = {dens: mgs_probe(dens) for dens in ("mixture", "unit_sigma")}
n_params = sum(p.numel() for p in probe.parameters())
for dens, st in probe_stats.items():
    task_term = -(st.task_losses - st.base_loss) / mgs_alpha
    dens_term = -st.log_q
    print(f"{dens:10s}: spread of task term {float(task_term.max() - task_term.min()):7.2f}, of density term "
          f"{float(dens_term.max() - dens_term.min()):7.2f}; ESS {st.ess:.2f}; weights {st.weights.numpy().round(3)}")
torch.testing.assert_close(probe_stats["mixture"].task_losses, probe_stats["unit_sigma"].task_losses)
spread = {d: float(st.log_q.max() - st.log_q.min()) for d, st in probe_stats.items()}
assert spread["mixture"] > 0.5 * math.sqrt(n_params / 2)        # of order √(d/2), not O(1)
assert spread["unit_sigma"] < 1.0

# %% [markdown]
# ## 3 · The methods
#
# Every method sees minibatches of `batch_size` training digits in the same seeded order and is scored on the
# 360 test digits. *Fine-tuning* methods start from the same MLE solution (`mle_steps` Adam steps) and run
# `finetune_steps` steps; the fair baseline is MLE continued for as many steps. *From scratch*, MGS and MLE both
# run `scratch_steps` steps from the same random initialization.
#
# * **MLE**: Adam on cross-entropy.
# * **MGS**: `taskloss.search.mgs.MGS` with AdamW, K candidates, the reference's defaults (α = 0.01, σ = 1 relative,
#   λ = ½, gradient and update clipped to norm 1); the task loss is the minibatch's 1 − metric. Two variants:
#   the true mixture density (default) and the reference's unit-σ density.
# * **Policy gradient**: `classification_reinforce`, `pg_samples` label vectors per step with a leave-one-out
#   baseline; reward per-example correctness (accuracy) or the batch's macro-F1 of each sampled label vector.
# * **Zeroth-order**: `gaussian_smoothing_grad` with antithetic pairs on the minibatch task loss, fed to Adam.

# %%
def batches(n_steps, gen):
    n = len(ytr)
    perm = torch.randperm(n, generator=gen)
    out, i = [], 0
    for _ in range(n_steps):
        if i + batch_size > n:
            perm, i = torch.randperm(n, generator=gen), 0
        idx = perm[i:i + batch_size].to(dev)
        out.append((Xtr[idx], ytr[idx]))
        i += batch_size
    return out


@torch.no_grad()
def evaluate(model):
    model.eval()
    pred = model(Xte).argmax(-1)
    model.train()
    return {"accuracy": float(accuracy(pred, yte)), "macro_f1": float(macro_f1(pred, yte, C))}


def train(model, method, metric, data, lr_, record_every=eval_every, seed_=0):
    """Run one method; returns (final test metrics, curve of test metrics, MGS diagnostics)."""
    curve, diag = [(0, evaluate(model))], []
    opt_cls = torch.optim.AdamW if method.startswith("mgs") else torch.optim.Adam
    opt = opt_cls(model.parameters(), lr=lr_)
    if method.startswith("mgs"):
        mgs = MGS(model, opt, lambda m, b: F.cross_entropy(m(b[0]), b[1]), TASKS[metric], K=K, alpha=mgs_alpha,
                  sigma=mgs_sigma, mix=mgs_mix, density="unit_sigma" if method == "mgs_unit_sigma" else "mixture",
                  vmap_task_loss=(metric == "accuracy"), seed=seed_)
    if method == "zo":
        zo_gen = torch.Generator(device=dev).manual_seed(seed_)
    pg_gen = torch.Generator(device=dev).manual_seed(seed_)
    for t, batch in enumerate(data, 1):
        if method == "mle":
            opt.zero_grad()
            F.cross_entropy(model(batch[0]), batch[1]).backward()
            opt.step()
        elif method.startswith("mgs"):
            st = mgs.step(batch)
            diag.append((st.ess, st.mle_weight, int(st.weights.argmax()) == int(st.task_losses.argmin()),
                         float(st.task_losses.max() - st.task_losses.min())))
        elif method == "pg":
            reward = "accuracy" if metric == "accuracy" else (lambda s, y: macro_f1(s, y, C))
            opt.zero_grad()
            classification_reinforce(model(batch[0]), batch[1], pg_samples, reward=reward,
                                     generator=pg_gen).loss.backward()
            opt.step()
        elif method == "zo":
            f, theta = functional_loss(model, lambda out: TASKS[metric](out, batch), batch[0])
            g = gaussian_smoothing_grad(f, theta, zo_sigma, zo_samples, baseline="antithetic", generator=zo_gen,
                                        vectorize=(metric == "accuracy"))
            opt.zero_grad()
            for name, p in model.named_parameters():
                p.grad = g[name]
            opt.step()
        if t % record_every == 0 or t == len(data):
            curve.append((t, evaluate(model)))
    return curve[-1][1], curve, diag


FINETUNE = ["mle", "mgs", "mgs_unit_sigma", "pg", "zo"]
SCRATCH = ["mle", "mgs"]
LABEL = {"mle": "MLE", "mgs": "MGS", "mgs_unit_sigma": "MGS (unit-σ density)", "pg": "policy gradient",
         "zo": "zeroth-order"}
results = {}      # (setting, metric, method) -> list over seeds of the final test metric
curves, diags = {}, {}
for s in tqdm(range(n_seeds), desc="seeds"):
    run_seed = 1000 * seed + s
    gen = torch.Generator().manual_seed(run_seed)
    data_pre, data_ft, data_sc = batches(mle_steps, gen), batches(finetune_steps, gen), batches(scratch_steps, gen)
    torch.manual_seed(run_seed)
    init = MLP(64, (hidden,), C).to(dev)
    mle_start = copy.deepcopy(init)
    train(mle_start, "mle", "accuracy", data_pre, lr)
    for metric in TASKS:
        for method in FINETUNE:
            if method == "mle" and metric != "accuracy":   # MLE ignores the metric: one run serves both
                continue
            final, curve, diag = train(copy.deepcopy(mle_start), method, metric, data_ft, finetune_lr, seed_=run_seed)
            for m_ in (TASKS if method == "mle" else [metric]):
                results.setdefault(("finetune", m_, method), []).append(final[m_])
                curves.setdefault(("finetune", m_, method), []).append(curve)
            diags.setdefault(("finetune", metric, method), []).extend(diag)
        for method in SCRATCH:
            if method == "mle" and metric != "accuracy":
                continue
            final, curve, diag = train(copy.deepcopy(init), method, metric, data_sc, lr, seed_=run_seed)
            for m_ in (TASKS if method == "mle" else [metric]):
                results.setdefault(("scratch", m_, method), []).append(final[m_])
                curves.setdefault(("scratch", m_, method), []).append(curve)
            diags.setdefault(("scratch", metric, method), []).extend(diag)
print(f"trained in {time.time() - t_start:.1f} s")

# %% [markdown]
# ## 4 · Held-out results
#
# Mean ± standard deviation over seeds of the test metric; "Δ vs MLE" is the paired difference (same seed, same
# start, same minibatches) with its standard error. A method counts as *beating* MLE below when the paired
# mean difference is positive and larger than twice its standard error; *losing* when it is negative beyond
# the same margin; otherwise it is *indistinguishable* at this number of seeds.

# %%
def verdict(diff):
    d = np.asarray(diff)
    se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("inf")
    if d.mean() > 2 * se:
        return "beats MLE"
    if d.mean() < -2 * se:
        return "loses to MLE"
    return "indistinguishable from MLE"


rows, verdicts = [], {}
for setting, methods in (("finetune", FINETUNE), ("scratch", SCRATCH)):
    for metric in TASKS:
        base = np.array(results[(setting, metric, "mle")])
        for method in methods:
            v = np.array(results[(setting, metric, method)])
            diff = v - base
            se = diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")
            ver = "—" if method == "mle" else verdict(diff)
            verdicts[(setting, metric, method)] = ver
            rows.append(f"| {setting} | {metric} | {LABEL[method]} | {v.mean():.4f} ± {v.std(ddof=1):.4f} | "
                        f"{diff.mean():+.4f} ± {se:.4f} | {ver} |")
            run.record(f"{setting}/{metric}/{method}", float(v.mean()))
print("| setting | metric | method | test metric | Δ vs MLE | verdict |\n|---|---|---|---|---|---|")
print("\n".join(rows))

fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
for ax, metric in zip(axes, TASKS):
    labels, means, stds, colors = [], [], [], []
    for setting, methods, col in (("finetune", FINETUNE, "C0"), ("scratch", SCRATCH, "C2")):
        for method in methods:
            v = np.array(results[(setting, metric, method)])
            labels.append(f"{LABEL[method]}\n({'from MLE' if setting == 'finetune' else 'scratch'})")
            means.append(v.mean())
            stds.append(v.std(ddof=1))
            colors.append(col)
    ax.bar(range(len(labels)), means, yerr=stds, color=colors, capsize=3)
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize=7)
    lo = min(m - s for m, s in zip(means, stds))
    ax.set(ylim=(max(0.0, lo - 0.05), 1.0), ylabel=f"test {metric}", title=f"trained on 1 − {metric}")
fig.tight_layout()
run.savefig(fig, "heldout_metrics.png")
plt.show()

# %% [markdown]
# Training curves (test metric, mean over seeds) of the fine-tuning methods and of the from-scratch runs:

# %%
fig, axes = plt.subplots(2, 2, figsize=(12, 6.5))
for row, metric in zip(axes, TASKS):
    for ax, (setting, methods) in zip(row, (("scratch", SCRATCH), ("finetune", FINETUNE))):
        for method in methods:
            cs = curves[(setting, metric, method)]
            steps = [t for t, _ in cs[0]]
            vals = np.mean([[e[metric] for _, e in c] for c in cs], 0)
            ax.plot(steps, vals, "o-", ms=3, label=LABEL[method])
        where = "from a random initialization" if setting == "scratch" else "from the MLE start"
        ax.set(xlabel="training step", ylabel=f"test {metric}", title=f"trained on 1 − {metric}, {where}")
        ax.legend(fontsize=7)
fig.tight_layout()
run.savefig(fig, "training_curves.png")
plt.show()

# %% [markdown]
# ## 5 · What MGS's weights did during training
#
# Per MGS step: the ESS of the weights, the total weight on MLE-centred candidates, and whether the candidate
# with the largest weight was also the one with the lowest minibatch task loss (with K = 4 and ties, chance
# level is at least 1/4).

# %%
print("| setting | metric | density | median ESS | mean weight on MLE-centred | argmax w = argmin l |")
print("|---|---|---|---|---|---|")
follow = {}
for (setting, metric, method), d in diags.items():
    if not d:
        continue
    ess, mlew, agree, _ = map(np.array, zip(*d))
    follow[(setting, metric, method)] = agree.mean()
    print(f"| {setting} | {metric} | {'unit σ' if method == 'mgs_unit_sigma' else 'mixture'} | {np.median(ess):.2f} | "
          f"{mlew.mean():.2f} | {agree.mean():.2f} |")
ess_mix = np.median([e for (st, mt, me), d in diags.items() if me == "mgs" for e, *_ in d])
ess_unit = np.median([e for (st, mt, me), d in diags.items() if me == "mgs_unit_sigma" for e, *_ in d])
run.record("mgs/median_ess_mixture_density", float(ess_mix), headline=True)
run.record("mgs/median_ess_unit_sigma_density", float(ess_unit))
# claims: with the true density the weights collapse (ESS ≈ 1) and follow the task loss less often than with
# the reference's density, whose near-constant log q leaves the choice to the task loss
assert ess_mix < 1.5
assert follow[("finetune", "accuracy", "mgs_unit_sigma")] > follow[("finetune", "accuracy", "mgs")]

# %% [markdown]
# ## 6 · Verdicts and checks

# %%
for key, ver in verdicts.items():
    if ver != "—":
        setting, metric, method = key
        print(f"{setting:8s} {metric:9s} {LABEL[method]:22s} {ver}")
beat = [f"{LABEL[m]} ({s}, {mt})" for (s, mt, m), v in verdicts.items() if v == "beats MLE"]
run.record("n_methods_beating_mle", len(beat), headline=True)
run.record("finetune/accuracy/mle_minus_mgs",
           float(np.mean(results[("finetune", "accuracy", "mle")]) - np.mean(results[("finetune", "accuracy", "mgs")])),
           headline=True)
run.record("scratch/accuracy/mle_minus_mgs",
           float(np.mean(results[("scratch", "accuracy", "mle")]) - np.mean(results[("scratch", "accuracy", "mgs")])),
           headline=True)
groups = {v: [f"{LABEL[m]} ({s}, {mt})" for (s, mt, m), vv in verdicts.items() if vv == v]
          for v in ("beats MLE", "indistinguishable from MLE", "loses to MLE")}
print(f"\nOn the held-out test set, over {n_seeds} seeds:")
for v, names in groups.items():
    print(f"  {v}: {', '.join(names) if names else 'none'}")

# sanity claims that hold at CI scale across seeds
assert np.mean(results[("finetune", "accuracy", "mle")]) > 0.85           # the MLE start is a good classifier
assert np.mean(results[("scratch", "accuracy", "mgs")]) > 0.5              # MGS from scratch learns (chance: 0.1)
for metric in TASKS:                                                          # fine-tuning does not wreck the start
    for method in FINETUNE:
        assert np.mean(results[("finetune", metric, method)]) > np.mean(results[("finetune", metric, "mle")]) - 0.1

# %% [markdown]
# ## Results

# %%
run.record("runtime_s", time.time() - t_start)
run.table()

# %% [markdown]
# **Reading the numbers.** The verdict table above is computed, not written: a method "beats MLE" only when its
# paired advantage over MLE exceeds two standard errors across seeds, and the list printed under it names every
# method that did — at CI scale (a few hundred steps, three seeds) it is typically short or empty, and
# `params/03_metric_optimization_classification/full.yaml` runs more seeds and longer training.
#
# What the asserts guarantee across seeds: the MLE start is already a good classifier (> 85 % test accuracy);
# MGS learns from scratch far above chance (its candidates are centred on the cross-entropy step; the minibatch
# metric only weights them), while the recorded gap `scratch/accuracy/mle_minus_mgs` shows how far it stays
# from MLE trained for as many steps; no fine-tuning method ends more than 0.1 below MLE continued for as many
# steps.
#
# Why MGS is not a free win here: with the true proposal density the importance weights of a ~2 400-parameter
# model collapse onto one candidate (median ESS ≈ 1), and that candidate is picked mostly by its noise's
# density, not by its accuracy — as notebook 02 predicted for high dimension. The reference code's unit-σ
# density removes that term, so its choice follows the task loss more often; either way an MGS step is
# "take one of K surrogate-guided or random steps", and on a problem where cross-entropy and accuracy agree
# as well as they do on digits, the cross-entropy step is hard to improve on.
