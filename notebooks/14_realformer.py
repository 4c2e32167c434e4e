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
# # 14 · Post-LN, Pre-LN and RealFormer: where the gradient goes
#
# A Transformer layer adds a sublayer's output to its input and normalizes. Where the LayerNorm sits changes
# the paths a gradient takes back through depth. **Post-LN**, the original Transformer, normalizes after the
# residual sum. **Pre-LN** normalizes the sublayer's input and leaves the residual stream untouched.
# **RealFormer** keeps Post-LN but adds each layer's raw attention scores to the next layer's: a residual
# connection on the attention logits.
#
# Su Jianlin's summary of the two papers: Pre-LN is easier to optimize (faster convergence, robust to the
# learning rate, no warm-up needed) but tends to end slightly worse than Post-LN. RealFormer is said to have
# Pre-LN's ease of optimization *and* to beat Post-LN.

# %% [markdown]
# **Question.** What changes in each gradient path (derived and checked numerically)? How do the gradient norms
# per layer look at initialization? One harness trains all three on the same corpus, parameter count and budget,
# over a learning-rate sweep without warm-up and several seeds. Which of the claims hold there: Post-LN failing
# at large learning rates, RealFormer as easy to optimize as Pre-LN and at least as good as Post-LN, RealFormer's
# sparser attention?
#
# **Sources.**
# - Su Jianlin, *RealFormer：把残差转移到Attention矩阵上面去* (RealFormer: moving the residual onto the attention
#   matrix), Scientific Spaces, 2020, [kexue.fm/archives/8027](https://kexue.fm/archives/8027).
# - R. He, A. Ravula, B. Kanagal, J. Ainslie, *RealFormer: Transformer likes residual attention*, Findings of ACL
#   2021, [arXiv:2012.11747](https://arxiv.org/abs/2012.11747).
# - R. Xiong, Y. Yang, D. He, K. Zheng, S. Zheng, C. Xing, H. Zhang, Y. Lan, L. Wang, T.-Y. Liu, *On layer
#   normalization in the Transformer architecture*, ICML 2020, [arXiv:2002.04745](https://arxiv.org/abs/2002.04745).
#
# **Package code.** `taskloss.models.transformer` holds the three layouts, `taskloss.gradflow.attention` the
# attention entropy and the gradient norms by layer, `taskloss.gradflow.training` the harness. The RealFormer
# layout is tested against x-transformers' `residual_attn` and a float64 reference (`tests/models`).

# %% tags=["parameters"]
seed: int = 0                         # [≥ 0] seed of the initializations and batches (seed·100 + s for seed s)
device: str = "auto"                  # "auto" (cuda when available), "cpu" or "cuda"
output_dir: str = ""                  # run folder; "" lets the runner choose (runs/interactive/… by hand)
min_count: int = 20                   # [≥ 1] tokenizer cut: ids seen fewer times become [UNK] (1 keeps all 4500)
d_model: int = 32                     # [≥ 1] model width (a multiple of n_heads)
n_layers: int = 3                     # [≥ 1] layers of the trained models
n_heads: int = 4                      # [≥ 1] attention heads per layer
block_size: int = 32                  # [≥ 2] tokens per training block
batch_size: int = 8                   # [≥ 1] blocks per training step
steps: int = 100                      # [≥ 1] AdamW steps per run (no warm-up, no clipping)
lrs: list[float] = [0.01, 0.03]       # [> 0] learning-rate grid, increasing (full.yaml: 0.001 … 0.03)
seeds: int = 10                       # [≥ 3] seeds per (layout, learning rate) (the sign test decides from 6)
init: str = "xavier"                  # "xavier" (Xiong et al.'s setting) or "gpt2" (the repository's default)
warmup_arm: int = 0                   # [≥ 0] >0: also train Post-LN and RealFormer at the largest rate with this warm-up
entropy_lr: float = 0.01              # [> 0] the models trained at this rate (one of lrs) are probed for attention entropy
deep_layers: int = 8                  # [≥ 1] depth of the untrained models whose gradient norms are measured
eval_blocks: int = 64                 # [≥ 1] held-out blocks for validation perplexity

# %%
import math
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch.func import jacrev
from tqdm.auto import tqdm

import taskloss.results
from taskloss.datasets import UnknownTokenWarning, get_tokenizer, lm_blocks, unigram_perplexity
from taskloss.gradflow import attention_entropy, layer_gradient_norms, train_lm, xavier_init_
from taskloss.models import RESIDUAL_MODES, TransformerLM
from taskloss.results.headlines import Tolerance, seed_spread
from taskloss.results.plotting import FRACTION, NONNEGATIVE, label_axes, seed_band, show
from taskloss.parameter_vectors import count_parameters

# %%
if init not in ("xavier", "gpt2"):
    raise ValueError(f"init must be 'xavier' or 'gpt2', got {init!r}")
if not any(math.isclose(entropy_lr, lr) for lr in lrs) or sorted(lrs) != list(lrs) or d_model % n_heads:
    raise ValueError(f"entropy_lr ({entropy_lr}) must be one of lrs ({lrs}), lrs increasing, and d_model "
                     f"({d_model}) a multiple of n_heads ({n_heads})")
run = taskloss.results.start("14_realformer", output_dir, device=device, seed=seed)
dev, D = run.device, torch.float64
LAYOUTS = ("post", "pre", "realformer")
assert set(LAYOUTS) == set(RESIDUAL_MODES)
t_start = time.time()
print("device:", dev)

# %% [markdown]
# ## 1 · The three layouts and their gradient paths
#
# With $F_l$ the attention or feed-forward sublayer and $\mathrm{LN}$ a LayerNorm,
#
# $$\text{Post-LN: } x_{l+1} = \mathrm{LN}\bigl(x_l + F_l(x_l)\bigr),\qquad
#   \text{Pre-LN: } x_{l+1} = x_l + F_l\bigl(\mathrm{LN}(x_l)\bigr),$$
#
# and RealFormer is Post-LN whose attention uses $S_l = Q_lK_l^\top/\sqrt{d_h} + S_{l-1}$ ($S_0 = 0$),
# $A_l = \mathrm{softmax}(\mathrm{mask}(S_l))$, per head.
#
# **LayerNorm's Jacobian.** For $z\in\mathbb R^d$ with mean $\mu$, standard deviation $\sigma$ and
# $\hat z = (z-\mu)/\sigma$, $\mathrm{LN}(z) = \gamma\odot\hat z + \beta$ has
#
# $$\frac{\partial\,\mathrm{LN}}{\partial z} = \frac{\operatorname{diag}(\gamma)}{\sigma}
#   \Bigl(I - \tfrac1d\mathbb 1\mathbb 1^\top - \tfrac1d\hat z\hat z^\top\Bigr),$$
#
# a projection scaled by $1/\sigma$: it removes the mean direction and the direction of $z$ itself. With
# $\gamma = 1$ its singular values are $1/\sigma$ ($d-2$ times) and $0$ (twice). Check against `torch.func`.

# %%
g = torch.Generator().manual_seed(seed)
d = 16
z = torch.randn(d, generator=g, dtype=D) * 3 + 1
ln = torch.nn.LayerNorm(d, eps=0.0).double()
mu, sigma = z.mean(), z.std(unbiased=False)
zh = (z - mu) / sigma
J_closed = (torch.eye(d, dtype=D) - torch.ones(d, d, dtype=D) / d - torch.outer(zh, zh) / d) / sigma
torch.testing.assert_close(jacrev(ln)(z), J_closed)
sv = torch.linalg.svdvals(J_closed)
torch.testing.assert_close(sv[: d - 2], torch.full((d - 2,), 1 / sigma.item(), dtype=D))
assert sv[d - 2:].abs().max() < 1e-12
print(f"σ = {sigma:.3f}: singular values of ∂LN/∂z = 1/σ = {1 / sigma:.3f} (×{d - 2}) and 0 (×2)")

# %% [markdown]
# **What that does to each layout.** Backpropagating through $L$ layers multiplies the gradient by the
# transposed layer Jacobians.
#
# - *Post-LN*: $\partial x_{l+1}/\partial x_l = J_{\mathrm{LN}}(z_l)\,(I + \partial F_l/\partial x_l)$ with
#   $z_l = x_l + F_l(x_l)$. Every path crosses every LayerNorm above it; there is no other. With unit-scale $x_l$
#   and a sublayer adding variance, $\sigma(z_l) = \sqrt{1 + \operatorname{var}F_l} > 1$. Each layer then shrinks
#   the gradient reaching the layers below, and the top layers get the largest gradients. That is why Xiong et
#   al. find that Post-LN needs a learning-rate warm-up.
# - *Pre-LN*: $\partial x_{l+1}/\partial x_l = I + \frac{\partial F_l}{\partial u}\,J_{\mathrm{LN}}(x_l)$, an
#   identity path from every layer to the output. The residual stream grows with depth,
#   $\sigma(x_l)\sim\sqrt l$. So the branch terms shrink like $1/\sqrt l$, and the gradient of the last layers'
#   parameters scales like $1/\sqrt L$.

# %% [markdown]
# - *RealFormer*: the Post-LN paths plus one along the scores, $\partial S_{l+1}/\partial S_l = I$, so
#   $\frac{\partial\ell}{\partial S_l} = \frac{\partial\ell}{\partial S_l}\big|_{A_l} +
#   \frac{\partial\ell}{\partial S_{l+1}}$.
#   Whatever gradient reaches a layer's attention logits is handed to the logits of every layer below, unchanged
#   and without crossing a LayerNorm. Values, output projections and feed-forward layers still see only Post-LN
#   paths.
#
# The check runs on the package's model in float64. Each layer gets a *copy* of the carried scores, a separate
# node in the graph. Its gradient must be exactly the gradient of that layer's own scores: the identity path.
# Then we compare the gradient norms of the attention logits, layer by layer, with Post-LN at the same weights.

# %%
def carried_grads(model, idx):
    """(∂ℓ/∂S_l per layer, ∂ℓ/∂(the copy of S_{l-1} handed to layer l)) of a RealFormer LM, run block by block."""
    x = model.tok_emb(idx[:, :-1]) + model.pos_emb(torch.arange(idx.shape[1] - 1))
    carried, scores, copies = None, [], []
    for blk in model.blocks:
        if carried is not None:
            carried = carried.clone()
            carried.retain_grad()
            copies.append(carried)
        x, carried = blk(x, carried)
        carried.retain_grad()
        scores.append(carried)
    logits = model.head(model.ln_f(x))
    torch.testing.assert_close(logits, model(idx[:, :-1]))                       # the model's own forward
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    return [s.grad for s in scores], [c.grad for c in copies]


def logit_grad_norms(model, idx):
    """‖∂ℓ/∂S_l‖ per layer through the public API (``return_scores``)."""
    logits, scores = model(idx[:, :-1], return_scores=True)
    for sc in scores:
        sc.retain_grad()
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    return np.array([sc.grad.norm().item() for sc in scores])


# %%
torch.manual_seed(seed)
rf = TransformerLM(50, d_model=32, n_layers=4, n_heads=4, max_len=16, residual="realformer").double()
with torch.no_grad():                                # larger attention logits than the init, so softmax matters
    for blk in rf.blocks:
        blk.attn.qkv.weight.mul_(8)
idx = torch.randint(0, 50, (3, 16), generator=g)
own, handed = carried_grads(rf, idx)
for l in range(3):
    torch.testing.assert_close(handed[l], own[l + 1], rtol=0, atol=0)            # ∂S_{l+1}/∂S_l = I, exactly
post = TransformerLM(50, d_model=32, n_layers=4, n_heads=4, max_len=16, residual="post").double()
post.load_state_dict(rf.state_dict())
norms_rf, norms_post = logit_grad_norms(rf, idx), logit_grad_norms(post, idx)
print("‖∂ℓ/∂S_l‖ bottom → top   RealFormer:", norms_rf.round(4), "  Post-LN:", norms_post.round(4))
_ = run.claim("paths/carried_scores_add_gradient", "at these weights the carried-score path raises the gradient of "
              "the bottom layer's attention logits above Post-LN's", bool(norms_rf[0] > norms_post[0]),
              value=float(norms_rf[0] / norms_post[0]), bound="ratio > 1")

# %% [markdown]
# ## 2 · Gradient norms by layer at initialization
#
# `layer_gradient_norms` gives, for every block, the norm of the loss gradient with respect to its
# feed-forward weights (the quantity Xiong et al. bound) and with respect to its input $x_l$. We compare two
# initializations on untrained models of `deep_layers` layers, three draws each.
#
# - **Xavier** with unit-variance embeddings and an untied output layer (`xavier_init_`). This is the setting
#   of Xiong et al.'s analysis, closest to BERT's normalized embeddings.
# - The repository's **GPT-2** default: $\mathcal N(0, 0.02)$, residual projections scaled by $1/\sqrt{2L}$, and
#   a tied output layer.

# %%
tok = get_tokenizer(min_count=min_count)
V = tok.vocab_size
with warnings.catch_warnings():      # the min_count cut makes rare words [UNK] on purpose (rate printed below)
    warnings.simplefilter("ignore", UnknownTokenWarning)
    train_blocks = lm_blocks("train", block_size, tok)
    valid_blocks = lm_blocks("valid", block_size, tok)[:eval_blocks]
    unigram = unigram_perplexity("valid", tok)
unk = (train_blocks[:, 1:] == tok.unk_id).double().mean().item()
print(f"vocabulary {V} (min_count {min_count}, {unk:.1%} of training tokens [UNK]); unigram perplexity {unigram:.1f}")
probe_batch = train_blocks[torch.randint(len(train_blocks), (16,), generator=torch.Generator().manual_seed(seed))]

# %%
def build(layout, s, n_layers=n_layers, init=init):
    torch.manual_seed(s)
    m = TransformerLM(V, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_len=block_size,
                      residual=layout, tie_weights=init == "gpt2")
    if init == "xavier":
        xavier_init_(m, torch.Generator().manual_seed(s))
    return m.to(dev)


# %%
init_grads = {}                                          # (init, layout) → [seeds, layers] FFN gradient norms
init_stream = {}
for ini in ("xavier", "gpt2"):
    for layout in LAYOUTS:
        res = [layer_gradient_norms(build(layout, seed * 100 + s, deep_layers, ini), probe_batch.to(dev))
               for s in range(3)]
        init_grads[ini, layout] = np.stack([r.feedforward.numpy() for r in res])
        init_stream[ini, layout] = np.stack([r.stream.numpy() for r in res])
        ff = init_grads[ini, layout].mean(0)
        run.record(f"init/{ini}/{layout}/ffn_grad_top", float(ff[-1]))
        run.record(f"init/{ini}/{layout}/ffn_grad_top_over_bottom", float(ff[-1] / ff[0]))
print({k: round(v, 3) for k, v in run.results.items() if k.startswith("init/")})

# %% tags=["hide-input"]
fig, axes = plt.subplots(1, 4, figsize=(19, 3.8), layout="constrained")
layers = np.arange(1, deep_layers + 1)
for j, ini in enumerate(("xavier", "gpt2")):
    for i, layout in enumerate(LAYOUTS):
        for ax, norms in ((axes[2 * j], init_grads), (axes[2 * j + 1], init_stream)):
            seed_band(ax, layers, norms[ini, layout], label=layout, color=f"C{i}", marker="o", ms=3,
                      bounds=NONNEGATIVE, clip=True)
    label_axes(axes[2 * j], "layer (1 = next to the embeddings)", "‖∂ℓ/∂W_FFN‖ (Frobenius)",
               f"{ini} init: feed-forward weights", logy=True)
    label_axes(axes[2 * j + 1], "layer (1 = next to the embeddings)", "‖∂ℓ/∂x_l‖ (input of layer l)",
               f"{ini} init: residual stream", logy=True)
fig.suptitle(f"gradient norms at initialization, {deep_layers} layers, d = {d_model} (bands: 3 initializations)")
run.savefig(fig, "gradients_at_init.png")
show(fig, "gradient norms by layer of untrained {deep_layers}-layer models, Xavier's initialization (left pair) and "
          "GPT-2's (right pair); means over 3 initializations with 95 % t-bands (clipped at 0). Top-over-bottom ratio "
          "of the feed-forward gradient with Xavier's initialization (above 1: larger at the top): Post-LN "
          "{init/xavier/post/ffn_grad_top_over_bottom:.2f}, Pre-LN {init/xavier/pre/ffn_grad_top_over_bottom:.2f}, "
          "RealFormer {init/xavier/realformer/ffn_grad_top_over_bottom:.2f}; its top-layer value "
          "{init/xavier/post/ffn_grad_top:.3g} (Post-LN) against {init/xavier/pre/ffn_grad_top:.3g} (Pre-LN).",
     run=run, deep_layers=deep_layers)

# %% [markdown]
# Xiong et al.'s picture predicts that with Xavier's initialization Post-LN's top-layer feed-forward gradient
# exceeds Pre-LN's, and that Pre-LN's falls from the bottom to the top layer. Both are claims about this size and
# these draws.

# %%
xav = {k: run.results[f"init/xavier/{k}"] for k in ("post/ffn_grad_top", "pre/ffn_grad_top",
                                                     "pre/ffn_grad_top_over_bottom")}
run.claim("init/xavier_post_top_exceeds_pre", "Xavier init: Post-LN's top-layer FFN gradient exceeds 1.5× Pre-LN's",
          xav["post/ffn_grad_top"] > 1.5 * xav["pre/ffn_grad_top"],
          value=xav["post/ffn_grad_top"] / xav["pre/ffn_grad_top"], bound="ratio > 1.5")
_ = run.claim("init/xavier_pre_falls_to_top", "Xavier init: Pre-LN's FFN gradient falls from the bottom to the top "
              "layer", xav["pre/ffn_grad_top_over_bottom"] < 1, value=xav["pre/ffn_grad_top_over_bottom"],
              bound="top/bottom < 1")

# %% [markdown]
# ## 3 · One harness: a learning-rate sweep without warm-up
#
# Each layout trains on the corpus with the same parameter count; Pre-LN carries one extra final LayerNorm,
# $2d$ parameters. All share the initialization draw and the (seeded) batches. They use AdamW with
# $\beta_2 = 0.98$, no warm-up and no clipping, for `steps` steps at every learning rate in `lrs`, on `seeds`
# seeds.
#
# A run **fails** when its loss becomes non-finite, or when it ends above its initial validation loss
# (`train_lm`'s `diverged`). It also fails when it ends no better than the unigram model, at or above the
# unigram perplexity printed above. A too-large learning rate ends there: the model predicts token frequencies
# and stays. But so does a run whose budget is too short to leave that level, a slow start. Only a longer run
# tells the two apart.

# %%
counts = {layout: count_parameters(build(layout, 0)) for layout in LAYOUTS}
print("parameters:", counts)
assert max(counts.values()) - min(counts.values()) <= 2 * d_model                    # only Pre-LN's final LN
run.record("params", counts)

results = {}                                               # (layout, lr, seed) → TrainResult
entropy = {}                                               # (layout, seed) → [layers, heads] normalized entropy
probe_idx = valid_blocks[:16, :-1].to(dev)
jobs = [(layout, lr, s) for lr in lrs for s in range(seeds) for layout in LAYOUTS]
for layout, lr, s in tqdm(jobs, desc="sweep (runs)"):
    model = build(layout, seed * 100 + s)
    results[layout, lr, s] = train_lm(model, train_blocks, valid_blocks, steps=steps, lr=lr, batch_size=batch_size,
                                      warmup_steps=0, seed=seed * 100 + s)
    assert math.isfinite(results[layout, lr, s].initial_nll) and len(results[layout, lr, s].train_loss) == \
        results[layout, lr, s].steps_run                   # the harness records every step it ran
    if math.isclose(lr, entropy_lr):
        model.eval()
        entropy[layout, s] = attention_entropy(model, probe_idx, normalized=True).numpy()

# %%
def failed(r):
    return r.diverged or not r.valid_ppl < unigram


def capped_nll(r):
    """Validation NLL, with a non-finite run counted at its initial NLL (what a uniform-ish model scores)."""
    return min(r.valid_nll, r.initial_nll)


nll = {layout: np.array([[capped_nll(results[layout, lr, s]) for lr in lrs] for s in range(seeds)])
       for layout in LAYOUTS}                               # [seeds, lrs]
fail = {layout: np.array([[failed(results[layout, lr, s]) for lr in lrs] for s in range(seeds)]) for layout in LAYOUTS}
for layout in LAYOUTS:
    run.record(f"sweep/{layout}/valid_ppl_by_lr", np.exp(nll[layout].mean(0)))
    run.record(f"sweep/{layout}/fraction_failed", float(fail[layout].mean()), headline=True,
               across_machines=Tolerance(atol=1 / fail[layout].size + 1e-9, reason="one run may cross the "
                                         "failure line on other numerics"))
    run.record(f"sweep/{layout}/best_valid_ppl", float(np.exp(nll[layout].min(1)).mean()), headline=True,
               across_machines=seed_spread(np.exp(nll[layout].min(1))))
print("validation perplexity (mean over seeds) by learning rate", lrs)
for layout in LAYOUTS:
    print(f"  {layout:10s}", np.exp(nll[layout].mean(0)).round(1), " failed:", fail[layout].mean(0))

# %% tags=["hide-input"]
def sweep_figure(ppl):
    """Perplexity by rate, failures by rate, and the gradient norm along training at the largest rate."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4), layout="constrained")
    for i, layout in enumerate(LAYOUTS):
        seed_band(axes[0], lrs, ppl[layout], label=layout, color=f"C{i}", marker="o", bounds=NONNEGATIVE, clip=True)
        axes[1].plot(lrs, fail[layout].mean(0), ["o-", "s--", "^:"][i], color=f"C{i}", ms=9 - 2 * i, label=layout)
        grad_curve = np.array([results[layout, max(lrs), s].grad_norm for s in range(seeds)])
        seed_band(axes[2], np.arange(1, grad_curve.shape[1] + 1), grad_curve, label=layout, color=f"C{i}",
                  bounds=NONNEGATIVE, clip=True)
    axes[0].axhline(unigram, color="k", ls="--", lw=0.8, label="unigram model")
    all_ppl = np.concatenate([p.ravel() for p in ppl.values()] + [[unigram]])
    label_axes(axes[0], "learning rate (no warm-up)", "validation perplexity", f"{steps} steps, {seeds} seeds",
               lower_is_better=True, logx=True, logy=all_ppl.max() > 10 * all_ppl.min())   # log only across decades
    label_axes(axes[1], "learning rate (no warm-up)", "fraction of failed runs", "failure: non-finite, worse than "
               "at start, or ≥ unigram", lower_is_better=True, logx=True)
    axes[1].set_ylim(-0.05, 1.05)
    label_axes(axes[2], "training step", "‖∇θ loss‖ before the step", f"gradient norm at lr = {max(lrs):g}",
               logy=True)
    for ax in axes[:2]:
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.xaxis.set_minor_locator(plt.NullLocator())
    return fig


# %% tags=["hide-input"]
fig = sweep_figure({layout: np.exp(nll[layout]) for layout in LAYOUTS})                # [seeds, lrs] each
run.savefig(fig, "lr_sweep.png")
spread = "thin lines: the seeds" if seeds < 3 else "bands: 95 % t-intervals"
show(fig, "left, validation perplexity after {steps} AdamW steps without warm-up at each learning rate (dashed: the "
          "unigram model, {unigram:.0f}); best over the rates, mean over {seeds} seeds: Post-LN "
          "{sweep/post/best_valid_ppl:.0f}, Pre-LN {sweep/pre/best_valid_ppl:.0f}, RealFormer "
          "{sweep/realformer/best_valid_ppl:.0f}. Middle, the fraction of failed runs: Post-LN "
          "{sweep/post/fraction_failed:.0%}, Pre-LN {sweep/pre/fraction_failed:.0%}, RealFormer "
          "{sweep/realformer/fraction_failed:.0%}. Right, the gradient norm along training at the largest rate. "
          "Thick lines: means over the seeds ({spread}).",
     run=run, steps=steps, unigram=unigram, seeds=seeds, spread=spread)

# %% [markdown]
# ## 4 · Attention entropy by layer
#
# He et al. report that RealFormer's attention is sparser (lower entropy), especially in the upper layers, because
# each layer starts from the logits of the one below. `attention_entropy` gives the normalized entropy of every
# attention row: 1 is uniform over the visible keys, 0 a single key. We average it by layer, on held-out text, for
# the models trained at learning rate `entropy_lr`.

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
lay_axis = np.arange(1, n_layers + 1)
mean_entropy = {}
for i, layout in enumerate(LAYOUTS):
    ent = np.stack([entropy[layout, s].mean(1) for s in range(seeds)])               # [seeds, layers]
    seed_band(ax, lay_axis, ent, label=layout, color=f"C{i}", marker="o", bounds=FRACTION, clip=True)
    run.record(f"entropy/{layout}/by_layer", ent.mean(0))
    mean_entropy[layout] = float(ent.mean())
label_axes(ax, "layer (1 = next to the embeddings)", "normalized attention entropy (1 = uniform)",
           f"trained at lr = {entropy_lr:g}, {steps} steps")
ax.set_xticks(lay_axis)
ax.set_ylim(0, 1)                                          # the quantity's whole range
run.savefig(fig, "attention_entropy.png")
spread = "thin lines: the seeds" if seeds < 3 else "bands: 95 % t-intervals, clipped to [0, 1]"
show(fig, "normalized entropy of the attention rows by layer on held-out text (1 = uniform over the visible keys, "
          "0 = a single key), models trained at learning rate {entropy_lr:g}; means over {seeds} seeds ({spread}). "
          "Mean over layers: Post-LN {post:.2f}, Pre-LN {pre:.2f}, RealFormer {realformer:.2f}.",
     run=run, entropy_lr=entropy_lr, seeds=seeds, spread=spread, **mean_entropy)

# %% [markdown]
# ## 5 · Does warm-up rescue the failing layouts?
#
# Xiong et al.'s explanation predicts that Post-LN's failure at a large learning rate is a start-up problem, which
# a linear warm-up removes. With `warmup_arm > 0`, Post-LN and RealFormer train once more at the largest learning
# rate with that many warm-up steps, on the same seeds and budget. The default parameters skip this arm;
# `params/14_realformer/full.yaml` includes it.

# %%
warm = {}
if warmup_arm > 0:
    for layout in ("post", "realformer"):
        rows = [train_lm(build(layout, seed * 100 + s), train_blocks, valid_blocks, steps=steps, lr=max(lrs),
                         batch_size=batch_size, warmup_steps=warmup_arm, seed=seed * 100 + s)
                for s in tqdm(range(seeds), desc=f"{layout} + warm-up")]
        warm[layout] = rows
        run.record(f"warmup/{layout}/valid_ppl", float(np.mean([r.valid_ppl for r in rows])))
        run.record(f"warmup/{layout}/fraction_failed", float(np.mean([failed(r) for r in rows])))
        print(f"{layout} at lr {max(lrs):g}: without warm-up ppl {np.exp(nll[layout][:, -1]).mean():.1f}, "
              f"with {warmup_arm} warm-up steps {np.mean([r.valid_ppl for r in rows]):.1f}")
else:
    print("warm-up arm skipped (warmup_arm = 0)")

# %% [markdown]
# ## 6 · The paper's claims, compared on the same seeds
#
# Each comparison pairs the per-seed values of two layouts: same initialization draw, batches and budget
# (`run.compare`). It reports the effect with its 95 % t-interval. The metrics, per seed:
#
# - *fraction of failed runs* over the learning-rate grid: "easy to optimize", bluntly;
# - *best validation NLL*, the lowest over the grid: "at least as good" at a tuned rate;
# - *sweep-mean validation NLL*, the mean over the grid (a non-finite run counted at its initial NLL): the area
#   under the sweep, lower when a layout tolerates more learning rates;
# - *attention entropy*, the mean normalized entropy over layers and heads at `entropy_lr`: lower is sparser.
#
# The table treats all its comparisons as one family, with a Holm correction across them. A difference that is
# Every comparison states the median of its paired differences, tested by the exact sign test (tied seeds, such
# as two layouts that both failed on every rate, are dropped from the test).

# %%
best = {layout: nll[layout].min(1) for layout in LAYOUTS}                # [seeds]
area = {layout: nll[layout].mean(1) for layout in LAYOUTS}
ent_mean = {layout: np.array([entropy[layout, s].mean() for s in range(seeds)]) for layout in LAYOUTS}
fail_rate = {layout: fail[layout].mean(1) for layout in LAYOUTS}
pairs = [("realformer", "post"), ("realformer", "pre"), ("pre", "post")]
for a, b in pairs:
    run.compare(f"failed/{a}_vs_{b}", fail_rate[a], fail_rate[b], name=a, baseline=b,
                metric="fraction of failed runs", lower_is_better=True)
    run.compare(f"best_nll/{a}_vs_{b}", best[a], best[b], name=a, baseline=b, metric="best validation NLL (nats)",
                lower_is_better=True, headline=(a, b) == ("realformer", "post"))
    run.compare(f"sweep_nll/{a}_vs_{b}", area[a], area[b], name=a, baseline=b,
                metric="sweep-mean validation NLL (nats)", lower_is_better=True,
                headline=(a, b) == ("realformer", "pre"))
for b in ("post", "pre"):
    run.compare(f"entropy/realformer_vs_{b}", ent_mean["realformer"], ent_mean[b], name="realformer", baseline=b,
                metric="normalized attention entropy", lower_is_better=True)
_ = run.comparison_table()

# %% [markdown]
# The failure counts are claims too, read as counts over all runs: no test is needed to count, but no verdict
# comes from them either.

# %%
C = run.comparisons
top = {layout: float(fail[layout][:, -1].mean()) for layout in LAYOUTS}
low = {layout: float(fail[layout][:, 0].mean()) for layout in LAYOUTS}
run.claim("sweep/post_fails_at_largest_rate", f"Post-LN fails at the largest rate ({max(lrs):g}) without warm-up on "
          "at least half the seeds", top["post"] >= 0.5, value=top["post"], bound=">= 0.5")
run.claim("sweep/pre_fails_less_than_post", "Pre-LN fails on fewer runs than Post-LN",
          fail["pre"].mean() < fail["post"].mean(), value=[float(fail["pre"].mean()), float(fail["post"].mean())],
          bound="Pre-LN's fraction < Post-LN's")
run.claim("sweep/realformer_fails_more_than_pre", "RealFormer fails on more runs than Pre-LN, not as few",
          fail["realformer"].mean() > fail["pre"].mean(),
          value=[float(fail["realformer"].mean()), float(fail["pre"].mean())], bound="RealFormer's fraction > Pre-LN's")
_ = run.claim("sweep/pre_trains_at_smallest_rate", f"Pre-LN trains at the smallest rate ({min(lrs):g}) on at least "
              "half the seeds", low["pre"] <= 0.5, value=low["pre"], bound="failed fraction <= 0.5")

# %%
decided = {k: c.verdict_adjusted for k, c in C.items() if c.verdict_adjusted != "inconclusive"}
print(f"{len(C)} comparisons; decided after the Holm correction: {decided or 'none'}")
_ = run.claim("compare/realformer_entropy_sparser_than_pre", "RealFormer's attention is sparser than Pre-LN's "
              "(Holm-corrected verdict)", C["entropy/realformer_vs_pre"].verdict_adjusted == "better",
              value=C["entropy/realformer_vs_pre"].effect, bound="verdict after correction 'better'")

# %%
run.record("runtime_s", time.time() - t_start)
_ = run.claims_table()

# %% [markdown]
# ## Reading the numbers

# %%
run.say(r"""**The gradient paths.** The derivations are exact and asserted. LayerNorm's Jacobian is a projection
scaled by $1/\sigma$. In RealFormer the gradient reaching layer $l+1$'s attention logits is handed unchanged to layer
$l$'s. At the weights of section 1, RealFormer's bottom-layer logit gradient is {rf_ratio:.1f}× Post-LN's.""",
        rf_ratio=float(norms_rf[0] / norms_post[0]))

# %%
R = run.results
post_grows, pre_falls = R["init/xavier/post/ffn_grad_top_over_bottom"] > 1, R["init/xavier/pre/ffn_grad_top_over_bottom"] < 1
flips = R["init/gpt2/post/ffn_grad_top"] < R["init/gpt2/pre/ffn_grad_top"]
run.say(r"""*At initialization* (Xavier, {deep_layers} layers) Post-LN's top-layer feed-forward gradient is
{init/xavier/post/ffn_grad_top:.3f} against Pre-LN's {init/xavier/pre/ffn_grad_top:.3f}. Post-LN's """
        + ("grows" if post_grows else "does not grow") + r""" toward the top (top/bottom
{init/xavier/post/ffn_grad_top_over_bottom:.2f}), Pre-LN's """ + ("shrinks" if pre_falls else "does not shrink")
        + r""" ({init/xavier/pre/ffn_grad_top_over_bottom:.2f}). With the repository's GPT-2 initialization the
ordering """ + ("flips" if flips else "holds") + r""": Post-LN {init/gpt2/post/ffn_grad_top:.3f}, Pre-LN
{init/gpt2/pre/ffn_grad_top:.3f}.""" + (r""" Its residual stream has scale 0.02, so Pre-LN's final LayerNorm
multiplies every gradient by $1/\sigma$ (tens), while Post-LN renormalizes the stream to unit scale in its first
layer. "Post-LN has the larger gradients" is a statement about an initialization, not about the layout alone."""
                                        if flips else ""), deep_layers=deep_layers)

# %%
ppl = {layout: np.exp(nll[layout].mean(0)) for layout in LAYOUTS}
i_ent = next(i for i, lr in enumerate(lrs) if math.isclose(lr, entropy_lr))     # the entropy probe's rate
run.say("*The sweep* ({steps} steps, learning rates {lrs}, {seeds} seeds, no warm-up). Validation perplexity by "
        "rate: Post-LN {p_post}, Pre-LN {p_pre}, RealFormer {p_rf} (unigram {unigram:.0f}). Failed runs: Post-LN "
        "{sweep/post/fraction_failed:.0%}, Pre-LN {sweep/pre/fraction_failed:.0%}, RealFormer "
        "{sweep/realformer/fraction_failed:.0%}.", steps=steps, lrs=lrs, seeds=seeds, unigram=unigram,
        p_post=np.round(ppl["post"], 1).tolist(), p_pre=np.round(ppl["pre"], 1).tolist(),
        p_rf=np.round(ppl["realformer"], 1).tolist())
if low["post"] >= 0.5:
    reading = (f"Post-LN fails at the smallest rate of the grid as well ({low['post']:.0%} of the seeds at "
               f"{min(lrs):g}), not only at the largest ({top['post']:.0%} at {max(lrs):g}). So this budget cannot "
               "tell a collapse at a large rate, which Xiong et al. predict, from a slow start.")
elif top["post"] >= 0.5:
    reading = (f"Post-LN trains at {min(lrs):g} and fails at {max(lrs):g} ({top['post']:.0%} of the seeds): the "
               "collapse at a large rate that Xiong et al. predict.")
else:
    reading = "Post-LN trains through the largest rate: this run does not show the collapse Xiong et al. predict."
same = "as often as" if math.isclose(fail["realformer"].mean(), fail["post"].mean()) else (
    "more often than" if fail["realformer"].mean() > fail["post"].mean() else "less often than")
run.say(reading + f" RealFormer fails {same} Post-LN. " + (
    "The warm-up arm ran: see section 5." if warm else
    "The warm-up arm did not run (`warmup_arm` = 0), so this run says nothing about whether warm-up rescues "
    "Post-LN or RealFormer."))

# %%
def verdict(key):
    return f"**{C[key].verdict_adjusted}**" + (f" ({C[key].note})" if C[key].note else "")


n_decided = sum(c.verdict_adjusted != "inconclusive" for c in C.values())
run.say(f"*The comparisons.* The table holds {len(C)} comparisons; after the Holm correction {n_decided} are decided. "
        "RealFormer against Post-LN: " + verdict("best_nll/realformer_vs_post") + " on the best validation NLL, "
        + verdict("entropy/realformer_vs_post") + " on attention entropy. RealFormer against Pre-LN: "
        + verdict("sweep_nll/realformer_vs_pre") + " on the sweep-mean NLL, " + verdict("entropy/realformer_vs_pre")
        + " on attention entropy (lower is sparser). Pre-LN against Post-LN: " + verdict("best_nll/pre_vs_post")
        + " on the best validation NLL. The failure fractions compare as "
        + verdict("failed/pre_vs_post") + " (Pre-LN against Post-LN) and " + verdict("failed/realformer_vs_pre")
        + " (RealFormer against Pre-LN).")
if min(ppl["post"][i_ent], ppl["realformer"][i_ent]) >= 0.9 * unigram:
    run.say("The entropy comparisons involve models that have not left the unigram level: Post-LN and RealFormer "
            f"end at perplexity {ppl['post'][i_ent]:.1f} and {ppl['realformer'][i_ent]:.1f} at {entropy_lr:g}. They "
            "say little about the paper's sparser-attention claim at this budget.")

# %%
easy = fail["realformer"].mean() <= fail["pre"].mean()
run.say("**What the run says about the source.** Su's post says RealFormer has Pre-LN's ease of optimization. On "
        f"this harness, without warm-up, RealFormer failed on {fail['realformer'].mean():.0%} of its runs against "
        f"Pre-LN's {fail['pre'].mean():.0%}: " + ("consistent with the post." if easy else
                                                  "RealFormer behaved like Post-LN, the layout it builds on, not like "
                                                  "Pre-LN.")
        + " He et al. trained with warm-up throughout, so their claim concerns quality under a tuned schedule, not "
        "robustness without one.")

# %%
held = sum(c["held"] for c in run.claims.values())
run.say(f"**Summary.** At these parameters {held} of the {len(run.claims)} claims hold (table above). The "
        "gradient-path derivations hold exactly; the gradient norms at initialization depend on the "
        "initialization. The sweep separates Pre-LN from the two Post-LN layouts by failure counts. The paired "
        f"comparisons over {seeds} seeds decide {n_decided} of {len(C)} after the correction; an undecided one "
        "is not an equality: its uncorrected interval in the table shows the differences it leaves open. Telling a collapse "
        "from a slow start and testing warm-up need a longer run with the warm-up arm "
        "(`params/14_realformer/full.yaml`: training from a rate of 0.001, ten seeds), which is not run here.")

# %% [markdown]
# **Try this.**
# - The full sweep with a warm-up arm (tens of minutes on one core):
#   `python -m taskloss.runner run 14 -f params/14_realformer/full.yaml`
# - The repository's GPT-2 initialization instead of Xavier: `python -m taskloss.runner run 14 -p init gpt2`
# - Deeper models, where Xiong et al.'s depth effects grow:
#   `python -m taskloss.runner run 14 -p n_layers 6 -p deep_layers 12`
# - Seconds, not minutes: `python -m taskloss.runner run 14 --set smoke`
