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
# # 09 · EMO: the earth mover distance as a language-model loss
#
# Next-token cross-entropy is the KL divergence from a one-hot target to the model's distribution: every wrong
# token is equally wrong, whether the model put its mass on a synonym or on punctuation. **EMO** replaces it
# with an *optimal-transport* cost — how much work it takes to move the predicted distribution onto the target
# token when moving mass between similar tokens is cheap — with similarity measured by fixed token embeddings.
#
# **Question.** What is the EMO loss exactly (and when is the cheap formula the true earth mover distance),
# how does it behave as a training signal next to MLE, and which of the paper's claims survive at the scale of
# this repository?
#
# Source: *EMO: Earth Mover Distance Optimization for Auto-Regressive Language Modeling* (Ren et al., ICLR
# 2024); the quality score follows the recipe of *MAUVE: Measuring the Gap Between Neural Text and Human Text
# using Divergence Frontiers*. The package code is `taskloss.losses.emo` (the chunked, memory-lean loss and its MLE
# mixes); the distribution-level quality scores are `taskloss.losses.text_quality`; `benchmarks/bench_emo.py` measures
# the loss's time and memory against cross-entropy.

# %% tags=["parameters"]
seed: int = 0
device: str = "auto"
output_dir: str = ""
seeds: int = 2                 # [> 0] seeds of the continued-training experiment
corpus_path: str = ""          # empty: default corpus; else a WikiText raw folder holding wiki.train.raw etc.
pretrained_folder: str = ""    # empty: the committed small LM in data/pretrained/small_lm
lm_d_model: int = 0            # [>= 0] 0: continue training the committed LM; positive: first pretrain an LM this wide
lm_layers: int = 2             # [> 0] (used when lm_d_model > 0)
lm_heads: int = 4              # [> 0] (used when lm_d_model > 0)
pretrain_steps: int = 0        # [>= 0] MLE pretraining steps of that LM (used when lm_d_model > 0)
pretrain_lr: float = 0.001            # [> 0]
block_size: int = 64                  # [> 0]
batch_size: int = 8                   # [> 0]
finetune_steps: int = 12       # [> 0] continued-training steps per method and seed
finetune_lr: float = 0.0003           # [> 0]
eval_blocks: int = 32          # [> 0] held-out blocks for perplexity
n_prompts: int = 32            # [> 0] prompts for sampled continuations (the quality score)
prefix_len: int = 16                  # [> 0]
cont_len: int = 24                    # [> 0]
scratch_steps: int = 40        # [> 0] from-scratch training steps per loss
scratch_eval_every: int = 10          # [> 0]
scratch_d_model: int = 64             # [> 0]
scratch_lr: float = 0.003             # [> 0]
scratch_seeds: int = 1                # [> 0]

# %%
import copy
import math
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from scipy.optimize import linprog
from tqdm.auto import tqdm

import taskloss.runner
from taskloss.datasets import get_tokenizer, lm_blocks, minilm_token_embeddings, prefix_continuations
from taskloss.lm import generate, load_pretrained_lm
from taskloss.losses import (
    EMOLoss,
    embed_texts,
    emo_cost_matrix,
    emo_loss,
    emo_soft_upper_bound,
    frontier_score,
    mmd2,
    repetition,
)
from taskloss.models import TransformerLM
from taskloss.runner.plotting import label_axes, mean_interval, seed_band

run = taskloss.runner.start("09_emo_loss", output_dir, device=device, seed=seed)
dev, D = run.device, torch.float64
t_start = time.time()
print("device:", dev)

# %% [markdown]
# ## 1 · From KL to transport
#
# With predicted probabilities $p \in \Delta^{V}$ and target token $t$ (one-hot $\tau = \mathbb 1_t$),
# cross-entropy is $-\log p_t = -\sum_i \tau_i \log p_i = \mathrm{KL}(\tau\,\|\,p) + H(\tau)$. The earth mover
# distance between $p$ and $\tau$ under a cost $c_{ij}$ (the price of moving one unit of mass from token $i$
# to token $j$) is the cheapest transport plan with those marginals,
#
# $$\mathcal C[p,\tau] = \min_{\gamma \in \Pi[p,\tau]} \sum_{i,j}\gamma_{ij} c_{ij},\qquad
#   \Pi[p,\tau] = \{\gamma \ge 0:\ \textstyle\sum_j\gamma_{ij} = p_i,\ \sum_i \gamma_{ij} = \tau_j\}.$$
#
# **One-hot target.** All of $\tau$'s mass sits on $t$, so every column $j \neq t$ of $\gamma$ is zero and
# column $t$ must equal $p$: the plan $\gamma_{it} = p_i$ is the *only* feasible one, and
# $\mathcal C[p, \mathbb 1_t] = \sum_i p_i c_{it}$ exactly — no optimization needed.
#
# Check: solve the linear program with `scipy.optimize.linprog` and compare.

# %%
def emd_lp(p, tau, c):
    """Exact earth mover distance between histograms p and tau (cost matrix c) by linear programming."""
    v = len(p)
    a_eq = np.zeros((2 * v, v * v))
    for i in range(v):
        a_eq[i, i * v:(i + 1) * v] = 1.0      # Σ_j γ_ij = p_i
        a_eq[v + i, i::v] = 1.0               # Σ_i γ_ij = τ_j
    res = linprog(c.reshape(-1), A_eq=a_eq, b_eq=np.concatenate([p, tau]), bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    return res.fun


g = torch.Generator().manual_seed(seed)
V_small, d_small = 8, 4
E_small = torch.randn(V_small, d_small, generator=g, dtype=D)
C_small = emo_cost_matrix(E_small)                         # c_ij = 1 - cos(e_i, e_j), dense, float64
logits_small = torch.randn(5, V_small, generator=g, dtype=D) * 2
t_small = torch.randint(0, V_small, (5,), generator=g)
p_small = logits_small.softmax(-1)
lp_onehot = np.array([emd_lp(p_small[n].numpy(), np.eye(V_small)[t_small[n]], C_small.numpy()) for n in range(5)])
closed = (p_small * C_small[:, t_small].T).sum(-1)          # Σ_i p_i c_it
print("LP  :", np.round(lp_onehot, 6))
print("Σpc :", np.round(closed.numpy(), 6))
np.testing.assert_allclose(lp_onehot, closed.numpy(), atol=1e-8)

# %% [markdown]
# **Cosine cost and the $O(Vd)$ form.** With fixed token embeddings $e_i$ and $\hat e = e/\lVert e\rVert$, take
# $c_{ij} = 1 - \langle \hat e_i, \hat e_j\rangle$. Because $\sum_i p_i = 1$,
#
# $$\mathrm{EMO}(p, t) = \sum_i p_i \bigl(1 - \langle\hat e_i, \hat e_t\rangle\bigr)
#   = 1 - \Bigl\langle \sum_i p_i \hat e_i,\ \hat e_t \Bigr\rangle .$$
#
# Forming $\sum_i p_i \hat e_i$ first costs $O(Vd)$ per token instead of the $O(V^2)$ of the cost matrix — with a
# 30k vocabulary and $d = 384$ that is a 80× saving, and no $V \times V$ matrix is ever stored. Below, a
# three-line from-scratch version next to the dense $O(V^2)$ one and `taskloss.losses.emo.emo_loss` (chunked custom
# autograd function; the target embedding is gathered by index, never via a dense one-hot matrix).
#
# A zero embedding row has no direction; `taskloss` defines $\hat e = 0$ there, so that token costs $1$ to
# every token (itself included) and nothing becomes NaN.

# %%
def emo_scratch(logits, targets, emb):
    e_hat = emb / emb.norm(dim=1, keepdim=True)
    return 1 - (logits.softmax(-1) @ e_hat * e_hat[targets]).sum(-1)


dense = (p_small @ C_small).gather(1, t_small[:, None]).squeeze(1)      # O(V²): Σ_i p_i c_it via the matrix
torch.testing.assert_close(emo_scratch(logits_small, t_small, E_small), dense)
torch.testing.assert_close(emo_loss(logits_small, t_small, E_small, reduction="none", chunk_size=2), dense)
print("O(V·d) scratch = O(V²) dense = taskloss.losses.emo_loss:", dense.numpy().round(5))

# %% [markdown]
# **The $c = 1-\delta$ special case.** If every wrong token costs $1$ (identity embeddings, all mutually
# orthogonal), $\mathrm{EMO} = \sum_{i\neq t} p_i = 1 - p_t$: the expected 0–1 loss, a smooth accuracy. Its
# gradient vanishes as $p_t \to 0$ — no push at all on examples the model gets badly wrong, unlike $-\log p_t$.

# %%
per = emo_loss(logits_small, t_small, torch.eye(V_small, dtype=D), reduction="none")
torch.testing.assert_close(per, 1 - p_small.gather(1, t_small[:, None]).squeeze(1))
print("c = 1 - δ gives 1 - p_t:", per.numpy().round(5))

# %% [markdown]
# **Soft targets.** For a general target distribution $\tau$ the plan must be optimized. The independent plan
# $\gamma_{ij} = p_i\tau_j$ is always feasible, so
#
# $$\mathcal C[p,\tau] \le \sum_{i,j} p_i\tau_j c_{ij} = 1 - \Bigl\langle \sum_i p_i\hat e_i,\ \sum_j \tau_j\hat e_j\Bigr\rangle$$
#
# (`emo_soft_upper_bound`, still $O(Vd)$). The bound is tight when the independent plan is optimal: for one-hot
# targets (it is the only plan), or when the cost is *additively separable*, $c_{ij} = a_i + b_j$, because then
# every plan costs $\sum_i p_i a_i + \sum_j \tau_j b_j$. It is loose otherwise — for $p = \tau$ spread over
# several tokens the distance is $0$ but the bound is the expected cost between two independent draws.

# %%
tau_soft = torch.softmax(torch.randn(5, V_small, generator=g, dtype=D) * 2, -1)
bound = emo_soft_upper_bound(logits_small, tau_soft, E_small, reduction="none")
lp_soft = np.array([emd_lp(p_small[n].numpy(), tau_soft[n].numpy(), C_small.numpy()) for n in range(5)])
print("soft τ: bound", bound.numpy().round(4), "\n        EMD  ", lp_soft.round(4))
assert (bound.numpy() >= lp_soft - 1e-9).all()
onehot = F.one_hot(t_small, V_small).to(D)
torch.testing.assert_close(emo_soft_upper_bound(logits_small, onehot, E_small, reduction="none"),
                           torch.from_numpy(lp_onehot))                               # tight: one-hot
a, b = torch.rand(V_small, generator=g, dtype=D), torch.rand(V_small, generator=g, dtype=D)
C_sep = (a[:, None] + b[None, :]).numpy()                                              # separable cost
lp_sep = np.array([emd_lp(p_small[n].numpy(), tau_soft[n].numpy(), C_sep) for n in range(5)])
np.testing.assert_allclose(lp_sep, ((p_small @ torch.from_numpy(C_sep)) * tau_soft).sum(-1).numpy(), atol=1e-8)
same = emo_soft_upper_bound(tau_soft.log(), tau_soft, E_small, reduction="none")        # p = τ: EMD = 0
lp_same = np.array([emd_lp(tau_soft[n].numpy(), tau_soft[n].numpy(), C_small.numpy()) for n in range(5)])
print("p = τ:  bound", same.numpy().round(4), "  EMD", lp_same.round(6))
assert np.allclose(lp_same, 0, atol=1e-9) and (same.numpy() > 1e-3).all()
run.record("derivation/soft_bound_gap_mean", float((bound.numpy() - lp_soft).mean()))

# %% [markdown]
# ## 2 · Gradients, and why EMO alone starts slowly
#
# Differentiating $\mathrm{EMO} = \sum_i p_i c_{it}$ through the softmax ($\partial p_i/\partial x_k =
# p_i(\delta_{ik} - p_k)$):
#
# $$\frac{\partial\,\mathrm{EMO}}{\partial x_k} = p_k\,\bigl(c_{kt} - \mathrm{EMO}\bigr),\qquad
#   \frac{\partial(-\log p_t)}{\partial x_k} = p_k - \delta_{kt}.$$
#
# Every EMO gradient entry carries a factor $p_k$: logits of tokens the model already ignores get almost no
# push, and at a uniform initialization ($p_k = 1/V$) the whole gradient is $O(1/\sqrt V)$ of MLE's, whose
# $-\delta_{kt}$ term pulls the target up with unit force however small $p_t$ is. The essay's worry — a loss
# that does not blow up in the wrong direction converges slowly from scratch — is visible in this formula.
#
# The reference code does not use EMO alone; it mixes it with MLE through a *stop-gradient* ratio
# ($\mathrm{sg}$), per token:
#
# * `emo_mle_ratio`: $\tfrac12\bigl(\mathrm{sg}(\mathrm{MLE}/\mathrm{EMO})\cdot\mathrm{EMO} + \mathrm{MLE}\bigr)$ —
#   value $=\mathrm{MLE}$, gradient $\tfrac12(\nabla\mathrm{MLE} + \tfrac{\mathrm{MLE}}{\mathrm{EMO}}\nabla\mathrm{EMO})$:
#   EMO rescaled to MLE's magnitude (the language-modeling script; capped at 3 in the packaged loss's `mode=1`);
# * `mle_scaled_by_emo`: $\mathrm{sg}(\mathrm{EMO}/\mathrm{MLE})\cdot\mathrm{MLE} + \mathrm{EMO}$ — gradient
#   $\nabla\mathrm{EMO} + \tfrac{\mathrm{EMO}}{\mathrm{MLE}}\nabla\mathrm{MLE}$ (the packaged loss's `mode=2`).
#
# A mix's gradient is not the gradient of its value; it is the gradient of the objective with the ratio
# frozen at the current point. Check both against central finite differences in float64.

# %%
x0 = torch.randn(3, V_small, generator=g, dtype=D)
t0 = t_small[:3]


def fd_grad(f, x, h=1e-6):
    out = torch.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = torch.zeros_like(x)
        e[idx] = h
        out[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return out


emo_of = lambda x: emo_loss(x, t0, E_small)                          # noqa: E731
xg = x0.clone().requires_grad_()
emo_loss(xg, t0, E_small).backward()
torch.testing.assert_close(xg.grad, fd_grad(emo_of, x0), rtol=1e-6, atol=1e-9)
pk = x0.softmax(-1)
e_per = emo_loss(x0, t0, E_small, reduction="none")
torch.testing.assert_close(xg.grad, pk * (C_small[:, t0].T - e_per[:, None]) / 3)   # p_k (c_kt - EMO), mean
frozen = {}
for mix in ("emo_mle_ratio", "mle_scaled_by_emo"):
    e_tok = emo_loss(x0, t0, E_small, reduction="none")
    m_tok = F.cross_entropy(x0, t0, reduction="none")
    if mix == "emo_mle_ratio":
        r = m_tok / e_tok
        f = lambda x, r=r: (0.5 * (r * emo_loss(x, t0, E_small, reduction="none")                 # noqa: E731
                                   + F.cross_entropy(x, t0, reduction="none"))).mean()
    else:
        r = e_tok / m_tok
        f = lambda x, r=r: (r * F.cross_entropy(x, t0, reduction="none")                          # noqa: E731
                            + emo_loss(x, t0, E_small, reduction="none")).mean()
    xg = x0.clone().requires_grad_()
    emo_loss(xg, t0, E_small, combine=mix).backward()
    torch.testing.assert_close(xg.grad, fd_grad(f, x0), rtol=1e-6, atol=1e-9)
    frozen[mix] = float((xg.grad - fd_grad(f, x0)).abs().max())
print("autograd vs finite differences (frozen ratio), max |diff|:", frozen)

# %% [markdown]
# **EMO is linear in $p$ — not a proper scoring rule.** If the next token really is random, $t \sim q$, the
# expected loss is $\mathbb E_{t\sim q}\,\mathrm{EMO}(p,t) = \sum_i p_i\, m_i$ with $m_i = \sum_t q_t c_{it}$:
# linear in $p$, so it is minimized by putting *all* mass on $\arg\min_i m_i$, not by $p = q$. Expected
# cross-entropy, $-\sum_t q_t\log p_t$, is minimized exactly at $p = q$ (Gibbs' inequality). Pure EMO therefore
# rewards confident, low-entropy predictions — a Bayes *decision* rather than a distribution — and would raise
# perplexity when trained to convergence; the MLE term of the mixes is what keeps the prediction calibrated.
# Check by descending both expected losses from uniform logits.

# %%
q_true = torch.softmax(torch.randn(V_small, generator=g, dtype=D), -1)
m_cost = C_small @ q_true                                     # m_i = Σ_t q_t c_it
fits = {}
for name in ("EMO", "CE"):
    z = torch.zeros(V_small, dtype=D, requires_grad=True)
    opt = torch.optim.Adam([z], lr=0.1)
    for _ in range(500):
        p_fit = z.softmax(-1)
        risk = (p_fit * m_cost).sum() if name == "EMO" else -(q_true * p_fit.log()).sum()
        opt.zero_grad()
        risk.backward()
        opt.step()
    fits[name] = z.detach().softmax(-1)
print("target q     :", q_true.numpy().round(3))
print("argmin EMO p :", fits["EMO"].numpy().round(3), " (argmin_i m_i =", int(m_cost.argmin()), ")")
print("argmin CE  p :", fits["CE"].numpy().round(3))
assert fits["EMO"][m_cost.argmin()] > 0.95                    # collapses onto the cheapest token
torch.testing.assert_close(fits["CE"], q_true, atol=1e-3, rtol=0)
assert (fits["EMO"] * m_cost).sum() < (q_true * m_cost).sum()  # q itself is not EMO-optimal
run.record("derivation/emo_optimum_mass_on_one_token", float(fits["EMO"].max()))

# %% [markdown]
# How small is EMO's push at initialization, with a real cost? Load the tokenizer and the two costs used below:
# the pretrained LM's own output layer (as in the paper) and MiniLM's pretrained token embeddings, restricted to
# our vocabulary. At uniform logits, compare the gradient norms per token.

# %%
if lm_d_model > 0 and pretrain_steps < 1:
    raise ValueError("lm_d_model > 0 asks for a freshly pretrained LM: set pretrain_steps >= 1")
if lm_d_model == 0:
    base_lm, tok = load_pretrained_lm(device="cpu", folder=pretrained_folder or None)
else:
    tok = get_tokenizer(path=corpus_path or None)
    base_lm = None
V = tok.vocab_size
corpus = corpus_path or None
E_minilm = minilm_token_embeddings(tok)                                 # [V, 384]
train_blocks = lm_blocks("train", block_size, tok, path=corpus)
valid_blocks = lm_blocks("valid", block_size, tok, path=corpus)[:eval_blocks]
print(f"vocabulary {V}, train blocks {tuple(train_blocks.shape)}, eval blocks {tuple(valid_blocks.shape)}")

targets0 = train_blocks[:4, 1:].reshape(-1)
x_unif = torch.zeros(len(targets0), V, requires_grad=True)
emo_loss(x_unif, targets0, E_minilm, reduction="sum").backward()
g_emo = x_unif.grad.norm(dim=1).mean().item()
x_unif.grad = None
F.cross_entropy(x_unif, targets0, reduction="sum").backward()
g_mle = x_unif.grad.norm(dim=1).mean().item()
print(f"per-token gradient norm at uniform logits: EMO {g_emo:.2e}, MLE {g_mle:.3f}, ratio {g_emo / g_mle:.2e}")
run.record("gradient/emo_over_mle_at_uniform", g_emo / g_mle, headline=True)
assert g_emo / g_mle < 0.05

# %% [markdown]
# ## 3 · Experiment: continued training of a pretrained LM
#
# Start from the small LM pretrained by MLE (`taskloss.lm.pretrained.load_pretrained_lm`) and continue training it on
# the training split with four objectives for the same number of AdamW steps and batches:
#
# * **MLE** — cross-entropy;
# * **EMO (LM head)** — pure EMO, cost from a frozen copy of the LM's own output layer (the paper's choice);
# * **EMO (MiniLM)** — pure EMO, cost from MiniLM's pretrained token embeddings (an external semantic cost);
# * **EMO+MLE (LM head)** — the `emo_mle_ratio` mix of the reference language-modeling script.
#
# Then measure, per seed:
#
# * held-out **perplexity** on `eval_blocks` validation blocks;
# * a **distribution-level quality score** of sampled continuations against the human continuations of the
#   same prompts. MAUVE itself needs GPT-2-large features that cannot be loaded offline, so we follow MAUVE's
#   own recipe on a different featurizer: MiniLM sentence embeddings of the generated and the reference
#   continuations (pooled, L2-normalized) → PCA keeping 90 % of the variance → k-means with $k = n/10$
#   clusters on the union → cluster histograms $P$ (reference) and $Q$ (model) → the divergence frontier
#   $\bigl(e^{-5\,\mathrm{KL}(Q\|R_\lambda)}, e^{-5\,\mathrm{KL}(P\|R_\lambda)}\bigr)$, $R_\lambda = \lambda P +
#   (1-\lambda)Q$, $\lambda \in (0,1)$, and its area (1 = indistinguishable). We call it **frontier-MiniLM**;
#   its values are *not* comparable with published MAUVE numbers. As a calibration, the same score between two
#   disjoint sets of human continuations is reported: the level two independent human samples reach at this
#   sample size (a model can land above it by chance — the score is that noisy at small n). A second, simpler
#   distance: the unbiased MMD² with an RBF kernel (median bandwidth) on the same embeddings (0 = same);
# * **repetition** of the sampled continuations: seq-rep-4 (`taskloss.losses.metrics.repetition`), the fraction of
#   repeated 4-grams;
# * the mean **entropy** of the predicted next-token distributions on the held-out blocks (section 2 predicts
#   that pure EMO lowers it).

# %%
prefixes, refs = prefix_continuations("valid", prefix_len, cont_len, tok, max_items=2 * n_prompts, path=corpus)
n_p = min(n_prompts, len(refs) // 2)
prompts = prefixes[:n_p]
ref_text = [tok.decode(r) for r in refs[:n_p]]
ref_emb = embed_texts(ref_text + [tok.decode(r) for r in refs[n_p:2 * n_p]], device=dev)
ref_a, ref_b = ref_emb[:n_p], ref_emb[n_p:2 * n_p]
assert abs(frontier_score(ref_a.numpy(), ref_a.numpy(), seed=seed) - 1.0) < 1e-9   # identical sets → 1
far = frontier_score(ref_a.numpy(), -ref_a.numpy() + 5.0, seed=seed)                  # disjoint clouds → ~0
assert far < 0.05, far
ceiling = frontier_score(ref_a.numpy(), ref_b.numpy(), seed=seed)
print(f"{n_p} prompts; frontier-MiniLM between two sets of human continuations: {ceiling:.3f}, "
      f"MMD² {mmd2(ref_a, ref_b):.4f}")
run.record("quality/human_vs_human", ceiling)

# %%
def lm_batches(blocks, steps, bs, gen):
    for _ in range(steps):
        yield blocks[torch.randint(len(blocks), (bs,), generator=gen)]


@torch.no_grad()
def perplexity(model, blocks, bs=32, with_entropy=False):
    """exp(mean next-token NLL) on ``blocks``; optionally also the mean entropy (nats) of the predictions."""
    model.eval()
    nll, ent, n = 0.0, 0.0, 0
    for i in range(0, len(blocks), bs):
        b = blocks[i:i + bs].to(dev)
        logits = model(b[:, :-1]).reshape(-1, V).double()
        nll += F.cross_entropy(logits, b[:, 1:].reshape(-1), reduction="sum").item()
        ent += -(logits.softmax(-1) * logits.log_softmax(-1)).sum().item()
        n += b[:, 1:].numel()
    return (math.exp(nll / n), ent / n) if with_entropy else math.exp(nll / n)


def make_loss(name, model):
    if name == "MLE":
        return lambda logits, y: F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    head = model.output_embedding.detach()
    crit = {"EMO (LM head)": lambda: EMOLoss(head),
            "EMO (MiniLM)": lambda: EMOLoss(E_minilm),
            "EMO+MLE (LM head)": lambda: EMOLoss(head, combine="emo_mle_ratio"),
            "EMO+MLE (MiniLM)": lambda: EMOLoss(E_minilm, combine="emo_mle_ratio")}[name]().to(dev)
    return crit                                       # the cost is frozen here, before any update


def train(model, loss_name, steps, lr, gen, eval_every=0, desc="", warmup=0):
    loss_fn = make_loss(loss_name, model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    curve = []
    for step, b in enumerate(tqdm(lm_batches(train_blocks, steps, batch_size, gen), total=steps, desc=desc,
                                  leave=False), start=1):
        model.train()
        b = b.to(dev)
        loss = loss_fn(model(b[:, :-1]), b[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if eval_every and (step % eval_every == 0 or step == steps):
            curve.append((step, perplexity(model, valid_blocks)))
    return curve


def evaluate(model, s):
    gen = torch.Generator(device=dev).manual_seed(1000 + s)
    out = generate(model, prompts.to(dev), cont_len, eos_id=None, pad_id=tok.pad_id, greedy=False, generator=gen)
    gen_emb = embed_texts([tok.decode(r) for r in out.cpu().tolist()], device=dev)
    ppl, entropy = perplexity(model, valid_blocks, with_entropy=True)
    return {"ppl": ppl, "entropy": entropy, "frontier": frontier_score(ref_a.numpy(), gen_emb.numpy(), seed=s),
            "mmd2": mmd2(ref_a, gen_emb), "rep4": float(repetition(out.cpu(), n=4).mean())}


if base_lm is None:                                      # pretrain an LM of the requested size by MLE first
    torch.manual_seed(seed)
    base_lm = TransformerLM(V, d_model=lm_d_model, n_layers=lm_layers, n_heads=lm_heads,
                            max_len=max(block_size, prefix_len + cont_len)).to(dev)
    train(base_lm, "MLE", pretrain_steps, pretrain_lr, torch.Generator().manual_seed(seed), desc="pretrain",
          warmup=max(1, pretrain_steps // 20))
base_lm = base_lm.to(dev)

# %%
methods = ["MLE", "EMO (LM head)", "EMO (MiniLM)", "EMO+MLE (LM head)"]
results = {m: [] for m in methods}
start = {}
for s in range(seeds):
    start.setdefault("pretrained", []).append(evaluate(base_lm, s))
    for m in methods:
        torch.manual_seed(seed * 100 + s)
        model = copy.deepcopy(base_lm)
        train(model, m, finetune_steps, finetune_lr, torch.Generator().manual_seed(seed * 100 + s), desc=f"{m} s{s}")
        results[m].append(evaluate(model, s))
results = {"pretrained": start["pretrained"], **results}


KEYS = {"pretrained": "pretrained", "MLE": "mle", "EMO (LM head)": "emo_lm_head", "EMO (MiniLM)": "emo_minilm",
        "EMO+MLE (LM head)": "emo_mle_lm_head"}


def agg(rows, key):
    v = np.array([r[key] for r in rows])
    return v.mean(), v.std(ddof=1) if len(v) > 1 else 0.0


METRICS = ("ppl", "entropy", "frontier", "mmd2", "rep4")
print(f"{'method':18s}" + "".join(f"{h:>19s}" for h in ("perplexity", "entropy (nats)", "frontier-MiniLM",
                                                      "MMD²", "seq-rep-4")))
for m, rows in results.items():
    cells = [f"{agg(rows, k)[0]:8.3f} ± {agg(rows, k)[1]:.3f}" for k in METRICS]
    print(f"{m:18s}" + "".join(f"{c:>19s}" for c in cells))
    for k in METRICS:
        run.record(f"continued/{KEYS[m]}/{k}", agg(rows, k)[0])
print(f"(mean ± sd over {seeds} seeds; frontier score of human vs human at n={n_p}: {ceiling:.3f})")

# %%
PANELS = [("ppl", "held-out perplexity\n(effective choices/token)", True, "perplexity"),
          ("entropy", "predictive entropy\n(nats/token)", None, "entropy (a drop = sharper)"),
          ("frontier", "frontier-MiniLM\n(area, 0 to 1)", False, "frontier-MiniLM vs human text"),
          ("rep4", "seq-rep-4\n(fraction of 4-grams)", True, "repetition in samples")]
names, CI = list(results), (0.68 if seeds < 4 else 0.95)   # 2 seeds: a 95 % t-interval is ±9 sd wide
fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
for ax, (k, ylabel, lower, title) in zip(axes, PANELS):
    per_seed = [np.array([r[k] for r in results[m]]) for m in names]
    mean, lo, hi = (np.array(v) for v in zip(*(mean_interval(v, CI) for v in per_seed)))
    ax.bar(range(len(names)), mean, yerr=[mean - lo, hi - mean], capsize=4,
           color=["0.6", "C0", "C1", "C2", "C3"][:len(names)])       # bars start at 0
    for i, v in enumerate(per_seed):
        ax.scatter([i] * len(v), v, color="k", s=10, zorder=3)
    if k == "frontier":
        ax.axhline(ceiling, ls="--", color="k", lw=0.8)
    ax.set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=8)
    label_axes(ax, "", ylabel, title, lower_is_better=lower, legend=False)
fig.legend(handles=[Patch(color="0.6", label=f"mean over {seeds} seeds, {100 * CI:.0f} % t-interval"),
                    Line2D([], [], ls="", marker="o", color="k", ms=4, label="one seed"),
                    Line2D([], [], ls="--", color="k", lw=0.8, label="human vs human (frontier ceiling)")],
           loc="lower center", ncol=3, fontsize=9, frameon=False)
fig.suptitle(f"continued training, {finetune_steps} steps × {batch_size}×{block_size} tokens, {seeds} seeds")
fig.tight_layout(rect=(0, 0.07, 1, 1))
run.savefig(fig, "continued_training.png")
plt.show()

# %% [markdown]
# *Figure: bars start at 0; error bars are t-intervals of the mean over the seeds, 68 % with fewer than
# four seeds (with two, a 95 % interval spans about ±9 standard deviations), dots are single seeds.
# EMO alone (orange, green) raises held-out perplexity and lowers the predictive entropy; mixed with MLE
# (red) it stays within about 20 % of MLE's (blue) perplexity. The frontier-MiniLM differences are within
# the seed spread at this size.*

# %% [markdown]
# ## 4 · Experiment: from scratch
#
# The essay's caveat: without a term that grows without bound on wrong predictions, EMO alone should converge
# slowly from a random initialization (section 2: its gradient is $O(1/\sqrt V)$ of MLE's at a uniform
# start), so a mix with MLE is what one would use. A small Transformer is trained from scratch with MLE, pure
# EMO and the `emo_mle_ratio` mix, cost from MiniLM's token embeddings (there is no trained output layer yet),
# same batches and learning rate; held-out perplexity is tracked.

# %%
scratch = {}
for name in ["MLE", "EMO (MiniLM)", "EMO+MLE (MiniLM)"]:
    curves = []
    for s in range(scratch_seeds):
        torch.manual_seed(seed * 100 + s)
        model = TransformerLM(V, d_model=scratch_d_model, n_layers=1, n_heads=2, max_len=block_size).to(dev)
        curve = [(0, perplexity(model, valid_blocks))]
        curve += train(model, name, scratch_steps, scratch_lr, torch.Generator().manual_seed(seed * 100 + s),
                       eval_every=scratch_eval_every, desc=f"scratch {name}")
        curves.append(curve)
    scratch[name] = np.array([[p for _, p in c] for c in curves])       # [seeds, evals]
    steps_axis = [st for st, _ in curves[0]]


# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
for i, (name, ppl) in enumerate(scratch.items()):
    seed_band(ax, steps_axis, ppl, label=name, color=f"C{i}", marker="o")
label_axes(ax, f"training step (batches of {batch_size}×{block_size} tokens)",
           "held-out perplexity\n(effective choices/token)",
           f"from scratch (d={scratch_d_model}, V={V}, {scratch_seeds} seed{'s' if scratch_seeds > 1 else ''})",
           lower_is_better=True, logy=True)
run.savefig(fig, "from_scratch.png")
plt.show()

# %% [markdown]
# *Figure: held-out perplexity (log scale) while training from a random start. MLE and the EMO+MLE mix
# fall together; pure EMO falls more slowly (its gradient is $O(1/\sqrt V)$ of MLE's at a uniform start,
# section 2) and at the default settings turns back up above its starting perplexity. With several seeds
# the line is the mean and the band its 95 % interval.*

# %%
final = {k: float(v[:, -1].mean()) for k, v in scratch.items()}
print("final perplexity:", {k: round(v, 1) for k, v in final.items()}, " (start:", round(float(scratch['MLE'][:, 0].mean()), 1), ")")
run.record("scratch/mle_ppl", final["MLE"], headline=True)
run.record("scratch/emo_ppl", final["EMO (MiniLM)"], headline=True)
run.record("scratch/emo_mle_ppl", final["EMO+MLE (MiniLM)"])

# %% [markdown]
# ## 5 · Which claims held at this scale
#
# The table is computed from the numbers above; "held" requires the difference of seed means to exceed the
# larger seed standard deviation (with one seed, any difference counts — read it as anecdotal).

# %%
def better(a, b, key, higher=True):
    (ma, sa), (mb, sb) = agg(results[a], key), agg(results[b], key)
    diff = (ma - mb) if higher else (mb - ma)
    return diff > max(sa, sb), ma, mb


claims = []
for m in ["EMO (LM head)", "EMO+MLE (LM head)", "EMO (MiniLM)"]:
    ok, ma, mb = better(m, "MLE", "frontier")
    claims.append((f"{m} beats MLE on the distribution-quality score (paper: MAUVE)", ok,
                   f"{ma:.3f} vs {mb:.3f}"))
    ok, ma, mb = better(m, "MLE", "ppl", higher=False)
    claims.append((f"{m} reaches lower perplexity than MLE", ok, f"{ma:.2f} vs {mb:.2f}"))
ok, ma, mb = better("MLE", "EMO (LM head)", "entropy")
claims.append(("pure EMO (LM head) lowers the predictive entropy vs MLE (section 2: EMO is mode-seeking)", ok,
               f"{mb:.2f} vs {ma:.2f} nats"))
slow = final["EMO (MiniLM)"] > 1.5 * final["MLE"]
claims.append(("pure EMO converges more slowly than MLE from scratch (essay caveat)", slow,
               f"ppl {final['EMO (MiniLM)']:.0f} vs {final['MLE']:.0f} after {scratch_steps} steps"))
mix_ok = final["EMO+MLE (MiniLM)"] < 0.5 * final["EMO (MiniLM)"]
claims.append(("mixing with MLE restores from-scratch convergence", mix_ok,
               f"ppl {final['EMO+MLE (MiniLM)']:.0f} vs pure EMO {final['EMO (MiniLM)']:.0f}"))
print(f"{'claim':80s} {'held':6s} numbers")
for c, ok, nums in claims:
    print(f"{c:80s} {'yes' if ok else 'no':6s} {nums}")
run.record("claims/held", [c for c, ok, _ in claims if ok])
run.record("claims/not_held", [c for c, ok, _ in claims if not ok])
# the paper's language-modeling "EMO" is the emo_mle_ratio mix: its differences to MLE are the headline numbers
run.record("continued/emo_mle_minus_mle_frontier",
           agg(results["EMO+MLE (LM head)"], "frontier")[0] - agg(results["MLE"], "frontier")[0], headline=True)
run.record("continued/emo_mle_over_mle_ppl",
           agg(results["EMO+MLE (LM head)"], "ppl")[0] / agg(results["MLE"], "ppl")[0], headline=True)
run.record("runtime_s", time.time() - t_start)
run.table()

# %% [markdown]
# **Reading the numbers.** The derivation checks are exact and asserted: for a one-hot target the EMO loss *is*
# the earth mover distance, computed in $O(Vd)$ without a $V\times V$ matrix; the soft-target formula is an
# upper bound, equal to the distance for one-hot targets and separable costs, strictly above it when both
# distributions are spread; $c = 1-\delta$ gives $1 - p_t$; the mixes' gradients are those of the objective
# with the ratio frozen.
#
# Two structural facts explain most of what the experiments show, and both are asserted below.
# (1) Every EMO gradient entry is scaled by $p_k$, so at a uniform start EMO's gradient is a tiny fraction of
# MLE's (the recorded ratio, asserted < 0.05): trained from scratch, pure EMO is asserted to end with at least
# 1.5× MLE's perplexity — the essay's caveat holds — while the stop-gradient mix, which keeps
# $\tfrac12\nabla\mathrm{MLE}$ at full strength, converges like MLE. (2) EMO is linear in $p$, hence not a
# proper scoring rule: its optimum is a point mass on the cheapest token. Continued training with pure EMO is
# asserted to lower the predictive entropy relative to MLE; how much that costs in perplexity and in the
# quality of *sampled* text is in the table for this run.
#
# The paper's headline claims concern continued training (its language-modeling "EMO" is the
# `emo_mle_ratio` mix, so the relevant row is *EMO+MLE (LM head)*): a higher MAUVE and a lower perplexity
# than MLE. The claims table prints which comparisons came out in EMO's favour beyond seed noise. Differences
# from the paper's setting that matter: a ~1M-parameter LM instead of GPT-2, continued training on the corpus
# it was pretrained on (no domain shift to adapt to), a few dozen steps, tens of prompts (the human-vs-human
# level of the quality score shows how coarse it is at this sample size), and MiniLM instead of GPT-2-large
# features. A claim reported as not held is a measurement at this scale, not a refutation; `full.yaml` and
# `gpu.yaml` rerun the same code with more prompts, steps and seeds, and (gpu) a GPT-2-small-sized LM on
# WikiText-103.

# %%
# Assertions at CI scale (margins that hold across seeds)
assert g_emo / g_mle < 0.05
assert final["EMO (MiniLM)"] > 1.5 * final["MLE"], final          # EMO alone is slow from scratch
assert final["EMO+MLE (MiniLM)"] < final["EMO (MiniLM)"], final    # the mix converges faster than EMO alone
# pure EMO is mode-seeking: continued training sharpens the predictions relative to MLE (≥ 0.3 nats)
assert agg(results["EMO (LM head)"], "entropy")[0] < agg(results["MLE"], "entropy")[0] - 0.3
for m, rows in results.items():
    for r in rows:
        assert all(math.isfinite(v) for v in r.values()), (m, r)
        assert 0.0 <= r["frontier"] <= 1.0 + 1e-9 and 0.0 <= r["rep4"] < 1.0
print(f"all assertions passed; notebook runtime {time.time() - t_start:.0f} s")
