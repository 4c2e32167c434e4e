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
# A Transformer layer adds a sublayer's output to its input and normalizes — but where the LayerNorm sits
# changes the paths a gradient takes back through depth. **Post-LN** (the original Transformer) normalizes
# after the residual sum; **Pre-LN** normalizes the sublayer's input and leaves the residual stream untouched;
# **RealFormer** keeps Post-LN but adds each layer's raw attention scores to the next layer's, a residual
# connection on the attention logits. The essay's summary of the two papers: Pre-LN is easier to optimize
# (faster convergence, robust to the learning rate, no warm-up needed) but tends to end slightly worse than
# Post-LN; RealFormer is said to have Pre-LN's optimization-friendliness *and* to beat Post-LN.
#
# **Question.** What changes in each gradient path (derived and checked numerically); how do the gradient
# norms per layer look at initialization; and on one harness — the same corpus, parameter count, budget and
# learning-rate sweep without warm-up, several seeds — which of the claims hold at this scale: Post-LN
# diverging at large learning rates, RealFormer as optimization-friendly as Pre-LN and at least as good as
# Post-LN, RealFormer's sparser attention?
#
# Sources: the essay on RealFormer in the listing of the README's source essays (Su, *Scientific Spaces*, 2020; our
# copy holds its lead paragraph); He, Ravula, Kanagal & Ainslie, *RealFormer: Transformer Likes Residual
# Attention* (Findings of ACL 2021); Xiong et al., *On Layer Normalization in the Transformer Architecture*
# (ICML 2020). Package code: `taskloss.models.transformer` (the three layouts), `taskloss.gradflow.attention`
# (attention entropy, gradient norms by layer) and `taskloss.gradflow.training` (the harness). The RealFormer
# implementation is tested against x-transformers' `residual_attn` and a float64 reference (tests/models).

# %% tags=["parameters"]
seed: int = 0
device: str = "auto"
output_dir: str = ""
min_count: int = 20                   # tokenizer cut: ids seen fewer times become [UNK] (1 keeps all 4500)
d_model: int = 32
n_layers: int = 3
n_heads: int = 4
block_size: int = 32
batch_size: int = 8
steps: int = 100                      # AdamW steps per run (no warm-up, no clipping)
lrs: list[float] = [0.01, 0.03]      # full.yaml: 0.001 … 0.03
seeds: int = 2                        # seeds per (layout, learning rate)
init: str = "xavier"                  # "xavier" (Xiong et al.'s setting) or "gpt2" (the repository's default)
warmup_arm: int = 0                   # >0: also train Post-LN and RealFormer at the largest rate with this warm-up
entropy_lr: float = 0.01              # the models trained at this rate (one of lrs) are probed for attention entropy
deep_layers: int = 8                  # depth of the untrained models whose gradient norms are measured
eval_blocks: int = 64                 # held-out blocks for validation perplexity

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
from taskloss.utils import count_parameters

run = taskloss.results.start("14_realformer", output_dir, device=device, seed=seed)
dev, D = run.device, torch.float64
assert init in ("xavier", "gpt2"), f"init must be 'xavier' or 'gpt2', got {init!r}"
LAYOUTS = ("post", "pre", "realformer")
assert set(LAYOUTS) == set(RESIDUAL_MODES)
assert any(math.isclose(entropy_lr, lr) for lr in lrs), f"entropy_lr {entropy_lr} must be one of lrs {lrs}"
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
# a projection (it removes the mean direction and the direction of $z$ itself) scaled by $1/\sigma$: with
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
#   $z_l = x_l + F_l(x_l)$. Every path — there is no other — crosses every LayerNorm above it. With unit-scale
#   $x_l$ and a sublayer adding variance, $\sigma(z_l) = \sqrt{1 + \operatorname{var}F_l} > 1$, so each layer
#   shrinks the gradient reaching the layers below: the top layers get the largest gradients, which is why
#   Xiong et al. find Post-LN needs a learning-rate warm-up.
# - *Pre-LN*: $\partial x_{l+1}/\partial x_l = I + \frac{\partial F_l}{\partial u}\,J_{\mathrm{LN}}(x_l)$ — an
#   identity path from every layer to the output. The residual stream grows with depth
#   ($\sigma(x_l)\sim\sqrt l$), so the branch terms shrink like $1/\sqrt l$ and the gradient of the last layers'
#   parameters scales like $1/\sqrt L$.
# - *RealFormer*: the Post-LN paths plus one along the scores, $\partial S_{l+1}/\partial S_l = I$, so
#   $\frac{\partial\ell}{\partial S_l} = \frac{\partial\ell}{\partial S_l}\big|_{A_l} +
#   \frac{\partial\ell}{\partial S_{l+1}}$:
#   whatever gradient reaches a layer's attention logits is handed, unchanged and without crossing a LayerNorm,
#   to the logits of every layer below. (Values, output projections and feed-forward layers still see only
#   Post-LN paths.)
#
# Check on the package's model in float64: feed each layer a *copy* of the carried scores (a separate node in
# the graph) and verify that its gradient is exactly the gradient of that layer's own scores — the identity path —
# then compare the gradient norms of the attention logits layer by layer with Post-LN at the same weights.

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

# %% [markdown]
# ## 2 · Gradient norms by layer at initialization
#
# `layer_gradient_norms` gives, for every block, the norm of the loss gradient with respect to its
# feed-forward weights (the quantity Xiong et al. bound) and with respect to its input $x_l$. Two
# initializations: **Xavier** with unit-variance embeddings (the setting of Xiong et al.'s analysis, closest to
# BERT's normalized embeddings; `xavier_init_`, untied output layer) and the repository's **GPT-2** default
# ($\mathcal N(0, 0.02)$, residual projections scaled by $1/\sqrt{2L}$, tied output layer), on untrained
# models of `deep_layers` layers, three initializations each.

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


def build(layout, s, n_layers=n_layers, init=init):
    torch.manual_seed(s)
    m = TransformerLM(V, d_model=d_model, n_layers=n_layers, n_heads=n_heads, max_len=block_size,
                      residual=layout, tie_weights=init == "gpt2")
    if init == "xavier":
        xavier_init_(m, torch.Generator().manual_seed(s))
    return m.to(dev)


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
# ## 3 · One harness: a learning-rate sweep without warm-up
#
# Each layout is trained on the corpus with the same parameter count (Pre-LN carries one extra final LayerNorm,
# $2d$ parameters), the same initialization draw, the same batches (seeded), AdamW with $\beta_2 = 0.98$,
# no warm-up and no clipping, for `steps` steps at every learning rate in `lrs`, on `seeds` seeds. A run
# **fails** when its loss becomes non-finite, when it ends above its initial validation loss (`train_lm`'s
# `diverged`), or when it ends no better than the unigram model (validation perplexity at or above the
# unigram perplexity printed above). A too-large learning rate ends there (the model predicts token frequencies
# and stays there), but so does a run whose budget is too short to leave that level (a slow start); only a longer
# run tells the two apart (`params/14_realformer/full.yaml` trains six times longer, from a rate of 0.001).

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
fig, axes = plt.subplots(1, 3, figsize=(16, 4), layout="constrained")
ppl = {layout: np.exp(nll[layout]) for layout in LAYOUTS}                       # [seeds, lrs]
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
# He et al. report that RealFormer's attention is sparser (lower entropy), especially in the upper layers,
# because each layer starts from the logits of the one below. The normalized entropy of every attention row
# (1 = uniform over the visible keys, 0 = a single key; `attention_entropy`) by layer, for the models trained at
# learning rate `entropy_lr`, on held-out text.

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
# Xiong et al.'s explanation predicts that Post-LN's failure at a large learning rate is a start-up problem
# that a linear warm-up removes. With `warmup_arm > 0`, Post-LN and RealFormer are trained once more at the
# largest learning rate with that many warm-up steps (same seeds, same budget). The CI default skips it; the
# full run (`params/14_realformer/full.yaml`) includes it.

# %%
warm = {}
if warmup_arm > 0:
    for layout in ("post", "realformer"):
        rows = []
        for s in tqdm(range(seeds), desc=f"{layout} + warm-up"):
            r = train_lm(build(layout, seed * 100 + s), train_blocks, valid_blocks, steps=steps, lr=max(lrs),
                         batch_size=batch_size, warmup_steps=warmup_arm, seed=seed * 100 + s)
            rows.append(r)
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
# Each comparison pairs the per-seed values of two layouts (same initialization draw, batches and budget) and
# reports the effect with its 95 % t-interval (`run.compare`). The metrics, per seed:
#
# - *fraction of failed runs* over the learning-rate grid — "optimization-friendly", bluntly;
# - *best validation NLL*: the lowest over the learning-rate grid — "at least as good" at a tuned rate;
# - *sweep-mean validation NLL*: the mean over the grid (a non-finite run counted at its initial NLL) — the
#   area under the sweep, lower when a layout tolerates more learning rates: "optimization-friendly";
# - *attention entropy*: the mean normalized entropy over layers and heads at `entropy_lr` — lower is sparser.

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
run.compare("entropy/realformer_vs_post", ent_mean["realformer"], ent_mean["post"], name="realformer", baseline="post",
            metric="normalized attention entropy", lower_is_better=True)
run.compare("entropy/realformer_vs_pre", ent_mean["realformer"], ent_mean["pre"], name="realformer", baseline="pre",
            metric="normalized attention entropy", lower_is_better=True)
table = run.comparison_table()

# %%
C = run.comparisons


def verdict_claim(key, want):
    """'held' when the comparison's verdict is ``want``, 'not held' when it is the opposite, else 'undecided'."""
    v = C[key].verdict
    return "held" if v == want else ("undecided" if v == "inconclusive" else "not held")


def at_least_as_good(key):
    """'A is at least as good as B': refuted by 'worse'; confirmed only by 'better' (no equivalence test here)."""
    v = C[key].verdict
    return "not held" if v == "worse" else ("held" if v == "better" else "undecided")


# %%
claims = [
    ("Post-LN fails at the largest learning rate without warm-up (≥ half the seeds)",
     "held" if fail["post"][:, -1].mean() >= 0.5 else "not held",
     f"{fail['post'][:, -1].mean():.2f} at lr {max(lrs):g}"),
    ("Pre-LN fails less often than Post-LN", verdict_claim("failed/pre_vs_post", "better"),
     f"{fail['pre'].mean():.2f} vs {fail['post'].mean():.2f}; " + C["failed/pre_vs_post"].verdict),
    ("RealFormer fails no more often than Pre-LN (optimization-friendly)", at_least_as_good("failed/realformer_vs_pre"),
     f"{fail['realformer'].mean():.2f} vs {fail['pre'].mean():.2f}; " + C["failed/realformer_vs_pre"].verdict),
    ("RealFormer's sweep-mean NLL no worse than Pre-LN's", at_least_as_good("sweep_nll/realformer_vs_pre"),
     C["sweep_nll/realformer_vs_pre"].sentence()),
    ("RealFormer's best NLL at least as good as Post-LN's", at_least_as_good("best_nll/realformer_vs_post"),
     C["best_nll/realformer_vs_post"].sentence()),
    ("RealFormer's attention sparser than Post-LN's", verdict_claim("entropy/realformer_vs_post", "better"),
     C["entropy/realformer_vs_post"].sentence()),
    ("Xavier init: Post-LN's top-layer FFN gradient exceeds Pre-LN's (Xiong et al.)",
     "held" if run.results["init/xavier/post/ffn_grad_top"] > run.results["init/xavier/pre/ffn_grad_top"]
     else "not held",
     f"{run.results['init/xavier/post/ffn_grad_top']:.3f} vs {run.results['init/xavier/pre/ffn_grad_top']:.3f}"),
    ("Xavier init: Pre-LN's FFN gradient falls from the bottom to the top layer",
     "held" if run.results["init/xavier/pre/ffn_grad_top_over_bottom"] < 1 else "not held",
     f"top/bottom = {run.results['init/xavier/pre/ffn_grad_top_over_bottom']:.2f}"),
]
if warm:
    claims.append(("warm-up rescues Post-LN at the largest learning rate",
                   "held" if run.results["warmup/post/fraction_failed"] < fail["post"][:, -1].mean() else "not held",
                   f"failed {fail['post'][:, -1].mean():.2f} → {run.results['warmup/post/fraction_failed']:.2f}"))

# %%
print(f"{'claim':80s} {'status':10s} numbers")
for c, status, nums in claims:
    print(f"{c:80s} {status:10s} {nums}")
for status in ("held", "not held", "undecided"):
    run.record(f"claims/{status.replace(' ', '_')}", [c for c, st, _ in claims if st == status])
run.record("runtime_s", time.time() - t_start)

# %%
ppl = {layout: np.exp(nll[layout].mean(0)) for layout in LAYOUTS}
i_ent = next(i for i, lr in enumerate(lrs) if math.isclose(lr, entropy_lr))     # the entropy probe's rate
run.say(r"""**Reading the numbers.** The gradient-path derivations are exact and asserted: LayerNorm's Jacobian is a
projection scaled by $1/\sigma$, and in RealFormer the gradient reaching layer $l+1$'s attention logits is handed
unchanged to layer $l$'s (RealFormer's bottom-layer logit gradient was {rf_ratio:.1f}× Post-LN's at the same weights).

*At initialization* (Xavier, {deep_layers} layers) Post-LN's top-layer feed-forward gradient is
{init/xavier/post/ffn_grad_top:.3f} against Pre-LN's {init/xavier/pre/ffn_grad_top:.3f}, and it grows toward the top
(top/bottom {init/xavier/post/ffn_grad_top_over_bottom:.2f}) while Pre-LN's shrinks
({init/xavier/pre/ffn_grad_top_over_bottom:.2f}): Xiong et al.'s picture. With the repository's GPT-2
initialization the ordering flips (Post-LN {init/gpt2/post/ffn_grad_top:.3f}, Pre-LN
{init/gpt2/pre/ffn_grad_top:.3f}): its residual stream has scale 0.02, so Pre-LN's final LayerNorm multiplies
every gradient by $1/\sigma$ (tens), while Post-LN renormalizes the stream to unit scale in its first layer.
"Post-LN has the larger gradients" is a statement about an initialization, not about the layout alone.

*The sweep* ({steps} steps, learning rates {lrs}, {seeds} seeds, no warm-up): validation perplexity Post-LN
{p_post}, Pre-LN {p_pre}, RealFormer {p_rf} (unigram {unigram:.0f}); failed runs
Post-LN {sweep/post/fraction_failed:.0%}, Pre-LN {sweep/pre/fraction_failed:.0%}, RealFormer
{sweep/realformer/fraction_failed:.0%}.
At the largest rate ({max_lr:g}, no warm-up) Post-LN failed on {post_top:.0%} of the seeds and RealFormer on
{rf_top:.0%}, Pre-LN on {pre_top:.0%}: {collapse_reading} {budget_reading} With {seeds} seeds the paired comparisons decide only large,
consistent effects: RealFormer against Post-LN reads **{best_nll/realformer_vs_post.verdict}** on the best
validation NLL and **{entropy/realformer_vs_post.verdict}** on attention entropy (lower = sparser) here{seeds_reading}""",
        rf_ratio=float(norms_rf[0] / norms_post[0]), deep_layers=deep_layers, steps=steps, lrs=lrs, seeds=seeds,
        unigram=unigram, p_post=np.round(ppl["post"], 1).tolist(), p_pre=np.round(ppl["pre"], 1).tolist(),
        p_rf=np.round(ppl["realformer"], 1).tolist(), max_lr=max(lrs), post_top=float(fail["post"][:, -1].mean()),
        rf_top=float(fail["realformer"][:, -1].mean()), pre_top=float(fail["pre"][:, -1].mean()),
        seeds_reading="; the full run's ten seeds decide more." if seeds < 10 else ".",
        budget_reading=(
            f"At the entropy probe's rate ({entropy_lr:g}) Post-LN leaves the unigram level (perplexity "
            f"{ppl['post'][i_ent]:.1f} against {unigram:.0f}), so this run tells a collapse at the "
            f"larger rates from a slow start, and the entropy comparison (section 4) is between trained models."
            if ppl["post"][i_ent] < 0.9 * unigram else
            f"A {steps}-step budget cannot tell a collapse from a slow start — both end at the unigram level — so the "
            f"CI grid starts at a rate where Pre-LN learns within it; the full run (`full.yaml`: 600 steps, rates from "
            f"0.001) separates the two. The entropy comparison (section 4) is between models of which the Post-LN "
            f"layouts have not left the unigram level (Post-LN perplexity {ppl['post'][i_ent]:.1f} "
            f"at {entropy_lr:g}), so it says little about the paper's sparser-attention claim at this budget."),
        collapse_reading=(
            "Post-LN collapses there as Xiong et al. predict, and RealFormer fails where Post-LN fails — on this "
            "harness it inherits Post-LN's need for warm-up rather than Pre-LN's robustness, so the essay's \"as "
            "optimization-friendly as Pre-LN\" is not what this run shows."
            if fail["post"][:, -1].mean() >= 0.5 and fail["realformer"][:, -1].mean() >= 0.5 else
            f"the failure count (diverged, or not below the unigram level) registers few of them, but their mean "
            f"validation perplexity there, {ppl['post'][-1]:.1f} (Post-LN) and {ppl['realformer'][-1]:.1f} "
            f"(RealFormer) against the unigram {unigram:.0f} and Pre-LN's {ppl['pre'][-1]:.1f}, is the unigram "
            f"plateau: they end just below it rather than above. Read the perplexities by rate, not the count."
            if min(ppl["post"][-1], ppl["realformer"][-1]) >= 0.9 * unigram else
            "at this budget and size the Post-LN layouts train through the largest rate, so this run does not show "
            "the collapse Xiong et al. predict; the paired comparisons below say whether RealFormer is as "
            "optimization-friendly as Pre-LN."))

# %%
# Assertions at CI scale (margins checked over seeds 0–19: Post-LN/Pre-LN top FFN gradient ≥ 2.6, Pre-LN
# top/bottom ≤ 0.78, Pre-LN failed ≤ 0.75 of its runs where both Post-LN layouts failed all)
assert norms_rf[0] > norms_post[0]                        # the carried-score path adds gradient at the bottom layer
if init == "xavier":
    assert run.results["init/xavier/post/ffn_grad_top"] > 1.5 * run.results["init/xavier/pre/ffn_grad_top"]
    assert run.results["init/xavier/pre/ffn_grad_top_over_bottom"] < 1
    assert fail["pre"].mean() < fail["post"].mean()                          # Pre-LN tolerates more learning rates
    # Whether both Post-LN layouts collapse at the largest rate depends on the budget: at the CI budget (100 steps,
    # 3 layers) they fail on every seed at 0.03; in the full.yaml run (600 steps, 4 layers, d 64, 10 seeds) Post-LN
    # ended on the unigram plateau at 0.01 and 0.03 (perplexity 162-164 against 167) but just below it, so it
    # "failed" on 2 of 40 runs only. It is the claims table's first row (held / not held), not an assert.
    if max(lrs) >= 0.03:
        # Pre-LN trains at 0.01 on most seeds; 100 steps is a slow start on some (seed 18: one of two runs ended
        # above the unigram level), so the bound is "at most half", not "never" (checked over seeds 0-19)
        assert fail["pre"][:, lrs.index(0.01)].mean() <= 0.5 if 0.01 in lrs else True
for r in results.values():
    assert math.isfinite(r.initial_nll) and len(r.train_loss) == r.steps_run
print(f"all assertions passed; notebook runtime {time.time() - t_start:.0f} s")

# %% [markdown]
# > **Errata to the source.** (1) The copy of the essay in this repository holds only its lead paragraph; its
# > claims are taken from it and from the two papers. (2) "RealFormer has Pre-LN's optimization-friendliness" did
# > not hold on this harness: RealFormer *is* Post-LN on every path except the attention logits, and it failed at the
# > same learning rates as Post-LN without warm-up (the full run's warm-up arm tests whether warm-up rescues
# > both). The paper trained with warm-up throughout, so its claim is about quality under a tuned schedule, not
# > robustness without one.
# > (3) Which layout has the larger gradients at initialization depends on the initialization (section 2).
#
# **Try this.**
# - The full sweep with a warm-up arm (tens of minutes on one core):
#   `python -m taskloss.runner run 14 -f params/14_realformer/full.yaml`
# - The repository's GPT-2 initialization instead of Xavier: `python -m taskloss.runner run 14 -p init gpt2`
# - Deeper models, where Xiong et al.'s depth effects grow:
#   `python -m taskloss.runner run 14 -p n_layers 6 -p deep_layers 12`
