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
# # 17 · Your own model: the methods on Hugging Face models, in a plain training loop
#
# The other notebooks derive each method on models small enough to check by hand. This one is the page to copy
# from. It builds a GPT-2, a Llama and a BERT offline from `transformers` configs, in seconds. Then it uses five
# methods of the package on them, each inside the training code a researcher already has. Every section ends with
# a check against a reference: Hugging Face's own loss, a readable reference step, curvlinops or Captum.

# %% [markdown]
# **Question.** Does each method run on the models researchers use, and does it give the reference's numbers there?
#
# **Sources.**
# - S. Ren, Z. Wu, K. Q. Zhu, *EMO: Earth Mover Distance Optimization for Auto-Regressive Language Modeling*,
#   ICLR 2024, [arXiv:2310.04691](https://arxiv.org/abs/2310.04691) (notebook 09).
# - S. Welleck, K. Cho, *MLE-guided parameter search for task loss minimization in neural sequence modeling*,
#   AAAI 2021, [arXiv:2006.03158](https://arxiv.org/abs/2006.03158) (notebooks 02–04).
# - J. Martens, R. Grosse, *Optimizing neural networks with Kronecker-factored approximate curvature*, ICML 2015,
#   [arXiv:1503.05671](https://arxiv.org/abs/1503.05671) (notebook 07).
# - M. Sundararajan, A. Taly, Q. Yan, *Axiomatic attribution for deep networks*, ICML 2017,
#   [arXiv:1703.01365](https://arxiv.org/abs/1703.01365) (notebook 15).
# - L. Gao, Y. Zhang, J. Han, J. Callan, *Scaling deep contrastive learning batch size under memory limited setup*
#   (GradCache), RepL4NLP 2021, [arXiv:2101.06983](https://arxiv.org/abs/2101.06983); Su Jianlin,
#   *对比学习可以使用梯度累积吗？* (Can contrastive learning use gradient accumulation?), Scientific Spaces, 2021
#   (notebook 10).
#
# **Package code.** `taskloss.losses.EMOLoss`, `taskloss.search.MGS`, `taskloss.curvature.KFAC`,
# `taskloss.attribution.EmbeddingIntegratedGradients`, `taskloss.contrastive.accumulated_backward`.
# References: `transformers`' own loss, `taskloss.search.mgs_step_reference`, curvlinops' `KFACLinearOperator`,
# Captum's `LayerIntegratedGradients`, the full-batch gradient.

# %% tags=["parameters"]
seed: int = 0                # [≥ 0] seed of the models' initialisation and of the random token batches
device: str = "auto"         # "auto" (cuda when available), "cpu" or "cuda"
output_dir: str = ""         # run folder; "" lets the runner choose (runs/interactive/… by hand)
width: int = 32              # [≥ 8] hidden size of the three tiny models (a multiple of their 2 heads)
batch_size: int = 4          # [≥ 2] sequences per batch (the contrastive loss needs 2 pairs)
seq_len: int = 12            # [≥ 4] tokens per sequence
train_steps: int = 8         # [≥ 2] AdamW steps of the EMO fine-tune
lr: float = 0.003            # [> 0] AdamW learning rate of the EMO fine-tune
mgs_samples: int = 4         # [≥ 1] MGS candidates per step
mgs_sigma: float = 1.0       # [> 0] MGS noise scale σ, relative to mean|g_t| per tensor (MGS's default)
ig_steps: int = 16           # [≥ 1] Gauss–Legendre nodes of integrated gradients
micro_batch: int = 2         # [≥ 1] sequences per micro-batch of the contrastive accumulation
kfac_lm_seeds: int = 10      # [≥ 6] paired seeds of the K-FAC / AdamW / SGD comparison on three LM families
kfac_lm_steps: int = 12      # [≥ 2] optimizer steps per run of that comparison
kfac_lm_dampings: str = "0.1"     # comma-separated K-FAC dampings tuned with its learning rate (full: 3 values)

# %%
import copy
import importlib.util
import math
import time
import warnings

import curvlinops
import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers
from captum.attr import LayerIntegratedGradients
from torch import nn

import taskloss.results
from taskloss.results.headlines import Tolerance
from taskloss.results.plotting import label_axes, show
from taskloss.attribution import EmbeddingIntegratedGradients
from taskloss.contrastive import accumulated_backward, info_nce
from taskloss.curvature import KFAC, nll_loss
from taskloss.curvature.kfac_math import kfac_precondition_reference
from taskloss.losses import EMOLoss, edit_distance, emo_loss, emo_loss_reference
from taskloss.search import MGS, MeZO, mgs_step_reference

# %%
if width % 2:
    raise ValueError(f"width must be a multiple of the models' 2 attention heads, got {width}")
t_start = time.time()
run = taskloss.results.start("17_your_own_model", output_dir, device=device, seed=seed)
dev = run.device
transformers.logging.set_verbosity_error()
# K-FAC names, when built, every layer it leaves alone; here that is always the tied lm_head (it keeps its plain
# gradient, as the coverage printed for each model below says). PEFT calls a transformers property that warns of its
# own future removal. Neither is about this notebook's numbers.
warnings.filterwarnings("ignore", message="K-FAC cannot precondition 'lm_head'", category=UserWarning)
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
print("device:", dev, "· transformers", transformers.__version__)

# %% [markdown]
# ## 0 · Three models from configs, no download
#
# A config and a seed are all a model needs; `from_pretrained` would read the same classes from a folder.
# The vocabulary is small (97 tokens) and the widths tiny, so every section runs in seconds on one core.
# GPT-2 keeps its `Conv1D` projections and tied `lm_head`; the Llama ties its embeddings and uses RMSNorm;
# BERT keeps dropout (so it is put in `eval()` where a method needs determinism).

# %%
VOCAB = 97


def tiny(kind: str, **kw) -> nn.Module:
    """A 2-layer, 2-head model of ``width`` built from its config with seed ``seed``, in eval mode."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=width, vocab_size=VOCAB, n_positions=64,
                                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, **kw)
        return transformers.GPT2LMHeadModel(cfg).to(dev).eval()
    common = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=width, intermediate_size=2 * width,
                  vocab_size=VOCAB, max_position_embeddings=64, **kw)
    if kind == "llama":
        cfg = transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True, **common)
        return transformers.LlamaForCausalLM(cfg).to(dev).eval()
    return transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=3, **common)).to(dev).eval()


for kind in ("gpt2", "llama", "bert"):
    m = tiny(kind)
    print(f"{type(m).__name__:32s} {sum(p.numel() for p in m.parameters()):>7,d} parameters")

# %% [markdown]
# Three helpers the sections share: a batch of random tokens with one padded row, the largest difference between
# paired tensors, and `parity`, which asserts that a check's residual is below its bound and records it.

# %%
def token_batch(n: int, length: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids ``[n, length]`` and an attention mask whose last row is right-padded to half its length."""
    g = torch.Generator().manual_seed(seed + offset)
    ids = torch.randint(1, VOCAB - 1, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[-1, length // 2:] = 0
    return ids.masked_fill(mask == 0, 0).to(dev), mask.to(dev)


def max_abs_diff(xs, ys) -> float:
    """The largest entry of |x − y| over paired tensors (parameters, gradients)."""
    with torch.no_grad():
        return max(float((x - y).abs().max()) for x, y in zip(xs, ys))


def parity(key: str, value: float, bound: float) -> float:
    """Assert that a check's residual is below ``bound``, and record it as a headline that may move by round-off."""
    assert value < bound, f"{key}: {value:.3g} is not below {bound:.0e}"
    return run.record(key, value, headline=True, across_machines=Tolerance(
        rtol=0.0, atol=bound, reason="a parity residual: round-off, asserted below this bound on every machine"))

# %% [markdown]
# ## 1 · EMO as the loss of a causal-LM fine-tune
#
# A causal LM predicts token $t+1$ from the tokens up to $t$. Its logits at position $t$ meet the label at $t+1$,
# and padding carries the label $-100$. `EMOLoss` takes logits `[B, T, V]` and labels `[B, T]` with that
# convention. Its cost embeddings are a frozen, unit-norm copy of the output layer, as in the paper.
# One function holds the shift. The plain loop below and `transformers.Trainer` both call it.

# %%
def causal_lm_loss(loss_fn, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``loss_fn`` of the logits at positions 0…T−2 against the labels at 1…T−1 (``-100``: not counted)."""
    return loss_fn(logits[:, :-1], labels[:, 1:])


gpt2 = tiny("gpt2", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)     # no dropout: train() = eval()
ids, mask = token_batch(batch_size, seq_len)
labels = ids.masked_fill(mask == 0, -100)
emo = EMOLoss(gpt2.lm_head.weight)                                       # frozen unit-norm cost embeddings
out = gpt2(input_ids=ids, attention_mask=mask)
print(f"EMO loss at initialisation: {causal_lm_loss(emo, out.logits, labels).item():.4f}")

# %% [markdown]
# Two identities. With `combine="mle"` the same call is cross-entropy, so it must equal the loss `transformers`
# computes itself from `labels=`. And the fused, chunked kernel behind `EMOLoss` must equal the paper's formula
# written plainly, `emo_loss_reference`, on the same logits.

# %%
mle = EMOLoss(gpt2.lm_head.weight, combine="mle")
with torch.no_grad():
    hf_loss = gpt2(input_ids=ids, attention_mask=mask, labels=labels).loss
    ours_mle = causal_lm_loss(mle, out.logits, labels)
torch.testing.assert_close(ours_mle, hf_loss, rtol=1e-5, atol=1e-6)
plain = causal_lm_loss(lambda x, y: emo_loss_reference(x, y, emo.cost_embeddings), out.logits, labels).detach()
fused = causal_lm_loss(lambda x, y: emo_loss(x, y, emo.cost_embeddings), out.logits, labels).detach()
torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
parity("emo/mle_vs_transformers_abs_diff", float((ours_mle - hf_loss).abs()), 1e-5)
parity("emo/fused_vs_reference_abs_diff", float((fused - plain).abs()), 1e-5)
print(f"MLE: ours {float(ours_mle):.6f}, transformers {float(hf_loss):.6f}; EMO fused {float(fused):.6f}, "
      f"reference {float(plain):.6f}")

# %% [markdown]
# The fine-tune is an ordinary loop: forward, `causal_lm_loss(emo, …)`, backward, AdamW. Nothing else changes.

# %%
def emo_fine_tune(model: nn.Module, steps: int) -> list[float]:
    """``steps`` AdamW steps on the one batch with the EMO loss; the loss before each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        loss = causal_lm_loss(emo, model(input_ids=ids, attention_mask=mask).logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


loop_model = copy.deepcopy(gpt2)
emo_losses = emo_fine_tune(loop_model, train_steps)
run.record("emo/loss_first", emo_losses[0])
run.record("emo/loss_last", emo_losses[-1], headline=True, across_machines=Tolerance(
    rtol=1e-3, reason="float32 AdamW steps: another CPU's kernels round differently, and the steps carry it on"))
run.claim("emo/fine_tune_lowers_the_loss", f"{train_steps} AdamW steps lower the EMO loss on the batch",
          emo_losses[-1] < emo_losses[0], value=emo_losses[-1] - emo_losses[0], bound="< 0")

# %% [markdown]
# **As `Trainer.compute_loss`.** `transformers.Trainer` calls `compute_loss(model, inputs)` for every batch.
# A subclass that returns the same `causal_lm_loss` makes it train with EMO. `Trainer` needs the `accelerate`
# package. Where it is installed, the cell after next trains a copy of the model with it and checks that its
# weights equal the plain loop's (constant learning rate, no clipping, the whole batch every step).

# %%
class EMOTrainer(transformers.Trainer):
    """``Trainer`` with the EMO loss of the causal-LM labels (``inputs["labels"]``, ``-100`` where unused)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        targets = inputs.pop("labels")
        outputs = model(**inputs)
        loss = causal_lm_loss(emo, outputs.logits, targets)
        return (loss, outputs) if return_outputs else loss


# %%
has_accelerate = importlib.util.find_spec("accelerate") is not None
if has_accelerate:
    rows = [{"input_ids": i, "attention_mask": a, "labels": y} for i, a, y in zip(ids, mask, labels)]
    tr_model = copy.deepcopy(gpt2)
    tr_opt = torch.optim.AdamW(tr_model.parameters(), lr=lr, weight_decay=0.0)
    args = transformers.TrainingArguments(                # constant lr, no clipping: the plain loop's steps
        output_dir=str(run.dir / "trainer"), max_steps=train_steps, per_device_train_batch_size=batch_size,
        max_grad_norm=0.0, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        use_cpu=dev.type == "cpu", seed=seed)
    trainer = EMOTrainer(model=tr_model, args=args, train_dataset=rows,
                         optimizers=(tr_opt, torch.optim.lr_scheduler.LambdaLR(tr_opt, lambda _: 1.0)))
    trainer.train()
    trainer_gap = max_abs_diff(tr_model.parameters(), loop_model.parameters())
    assert trainer_gap < 1e-4, trainer_gap             # the same steps; only float summation order differs
    run.record("emo/trainer_vs_loop_max_param_diff", trainer_gap)
    print(f"Trainer vs plain loop: largest weight difference {trainer_gap:.2e}")
else:
    print("accelerate is not installed here, so transformers.Trainer cannot be built (pip install accelerate). "
          "EMOTrainer above is the code; the plain loop above is the training it runs.")

# %% [markdown]
# ## 2 · An MGS step on a GPT-2 with a sequence task loss
#
# MGS scores candidate parameters θ + Δθ_k by a task loss that need not be differentiable. Here the task loss
# decodes three greedy tokens with GPT-2's own `generate` and measures their edit distance to reference
# continuations. `forward_fn` may call any method of the model: each candidate's parameters reach it.
# `parallel=False` scores the candidates one after another, as MGS does on a CPU by default. `generate` stops on
# a data-dependent condition, which `vmap` cannot trace, so it needs the loop on a GPU too.
# The surrogate, whose gradient centres half the proposal, is the model's own next-token cross-entropy.

# %%
def greedy_continuation(model, batch):
    """Three greedy tokens after the prefix ``batch[0]``, decoded by ``generate``."""
    prefix = batch[0]
    out = model.generate(prefix, attention_mask=torch.ones_like(prefix), max_new_tokens=3, do_sample=False,
                         pad_token_id=0)
    return out[:, prefix.shape[1]:]


def task_loss(hyp, batch):
    return edit_distance(hyp, batch[1]).mean()        # normalized token edit distance, lower is better


def closure_for(model, batch):
    def closure():
        seqs = torch.cat(batch, 1)
        loss = model(input_ids=seqs, labels=seqs).loss
        loss.backward()
        return loss, batch
    return closure


# %% [markdown]
# The step below is MGS with its defaults (σ relative to each tensor's mean |gradient|, the flat density, whose
# weights are a softmax of the candidates' task losses, notebook 02 §6); only the forward, the task loss and the
# seed are ours. `keep_deltas=True` keeps each candidate's Δθ_k so that we can decode what it generates.

# %%
prefix, _ = token_batch(batch_size, seq_len // 2, offset=1)
refs, _ = token_batch(batch_size, 3, offset=2)
mgs_batch = (prefix, refs)
mgs_model, ref_model, theta_model = copy.deepcopy(gpt2), copy.deepcopy(gpt2), copy.deepcopy(gpt2)
mgs_kw = dict(n_samples=mgs_samples, sigma=mgs_sigma, forward_fn=greedy_continuation)
mgs = MGS(mgs_model, torch.optim.SGD(mgs_model.parameters(), lr=1.0), task_loss, seed=seed, parallel=False,
          keep_deltas=True, **mgs_kw)
mgs.step(closure_for(mgs_model, mgs_batch))
st = mgs.last_stats
print(f"density {mgs.density!r}, effective sample size {st.ess:.2f} of {len(st.weights)}")
print("reference continuations:", refs.tolist())
for k, delta in enumerate(st.deltas):            # what each candidate θ + Δθ_k generates, its loss and weight
    cand = copy.deepcopy(theta_model)
    with torch.no_grad():
        for n, p_ in cand.named_parameters():
            p_.add_(delta[n])
    print(f"candidate {k}: task loss {float(st.task_losses[k]):.3f}, weight {float(st.weights[k]):.3f}, "
          f"generates {greedy_continuation(cand, mgs_batch).tolist()}")

# %% [markdown]
# The check is the same step written plainly, `mgs_step_reference` (about thirty lines on self-normalized
# importance sampling), from the same seed on a copy of the model. The weights and the new parameters must agree.

# %%
ref_opt = torch.optim.SGD(ref_model.parameters(), lr=1.0)
_, res = mgs_step_reference(ref_model, ref_opt, closure_for(ref_model, mgs_batch), task_loss, seed=seed, **mgs_kw)
torch.testing.assert_close(st.weights, res.weights, rtol=1e-5, atol=1e-7)
torch.testing.assert_close(st.weights, torch.softmax(-st.task_losses / mgs.param_groups[0]["alpha"], 0))  # flat
mgs_gap = max_abs_diff(mgs_model.parameters(), ref_model.parameters())
parity("mgs/vs_reference_max_param_diff", mgs_gap, 1e-5)
run.record("mgs/ess", st.ess, headline=True)
_ = run.claim("mgs/candidates_differ", "the candidates' decoded continuations give more than one task-loss value",
              len(set(st.task_losses.tolist())) > 1, value=len(set(st.task_losses.tolist())), bound="> 1")

# %% [markdown]
# What decides the weights? The log-weight of candidate $k$ has two terms, the task loss and the proposal density:
#
# $$\log w_k = -\frac{l(\theta+\Delta\theta_k) - l(\theta)}{\alpha} - \log q(\Delta\theta_k).$$
#
# The default sets $\log q \equiv 0$. The exact mixture density (`density="mixture"`) keeps it. Across
# candidates its $-\log q$ varies by about $\sqrt{P/2}$ nats whatever σ is (notebook 02 §6), against at most
# $1/\alpha$ for a task loss in [0, 1]. The cell below runs three steps with each density from the same seed on
# copies of the model, and compares the two terms' spreads on the first step's candidates.

# %%
def mgs_three_steps(density):
    """Three MGS steps on a copy of the GPT-2 with ``density``; their stats."""
    m = copy.deepcopy(theta_model)
    opt = MGS(m, torch.optim.SGD(m.parameters(), lr=1.0), task_loss, seed=seed, parallel=False, density=density,
              ess_warning=None, **mgs_kw)
    out = []
    for _ in range(3):
        opt.step(closure_for(m, mgs_batch))
        out.append(opt.last_stats)
    return out, opt


three = {d: mgs_three_steps(d) for d in ("flat", "mixture")}
torch.testing.assert_close(three["flat"][0][0].task_losses, three["mixture"][0][0].task_losses)  # same candidates
torch.testing.assert_close(three["flat"][0][0].weights, st.weights)                              # = the step above
for d, (stats_, _) in three.items():
    print(f"{d:8s}: ESS per step {[round(x.ess, 2) for x in stats_]}, first step's weights "
          f"{[round(x, 3) for x in stats_[0].weights.tolist()]}")
ex = three["mixture"][0][0]
alpha_mgs = mgs.param_groups[0]["alpha"]
spread = lambda v: max(v) - min(v)                                                  # noqa: E731
run.record("mgs/task_term_spread", spread((ex.task_losses / alpha_mgs).tolist()))
run.record("mgs/density_term_spread_mixture", spread((-ex.log_q).tolist()))
run.record("mgs/ess_steps_flat", [x.ess for x in three["flat"][0]])
run.record("mgs/ess_steps_mixture", [x.ess for x in three["mixture"][0]])
run.record("mgs/min_ess_flat", min(x.ess for x in three["flat"][0]))
run.record("mgs/max_ess_mixture", max(x.ess for x in three["mixture"][0]))
_ = run.claim("mgs/default_keeps_ess", "with MGS's default (flat) density the ESS stays above 1 on each of 3 steps",
              min(x.ess for x in three["flat"][0]) > 1.0, value=min(x.ess for x in three["flat"][0]), bound="> 1")

# %%
P_gpt2 = sum(p_.numel() for p_ in mgs_model.parameters())
lowest = float(ex.task_losses.min())
top_m, top_f = int(ex.weights.argmax()), int(st.weights.argmax())
run.say("With the exact mixture density, −log q varies by {mgs/density_term_spread_mixture:.3g} nats across the "
        "first step's candidates (√(P/2) = {half:.0f} for P = {P:,}), the task term by {mgs/task_term_spread:.3g}. "
        "The " + ("proposal density" if spread((-ex.log_q).tolist()) > spread((ex.task_losses / alpha_mgs).tolist())
                  else "task loss") + " decides: the ESS is at most {mgs/max_ess_mixture:.2f} over three steps, and "
        "the largest weight ({wm:.2f}) goes to a candidate whose task loss {lm:.3f} is "
        + ("the lowest" if float(ex.task_losses[top_m]) == lowest else "not the lowest ({lo:.3f})") + ". "
        "With the default flat density the ESS is at least {mgs/min_ess_flat:.2f} on each step, and the largest "
        "weight ({wf:.2f}) goes to a candidate with task loss {lf:.3f}"
        + (" (the lowest)" if float(st.task_losses[top_f]) == lowest else "") + ". A step whose ESS falls below "
        "1.5 warns once, naming the term that collapsed it and the remedy.",
        half=math.sqrt(P_gpt2 / 2), P=P_gpt2, wm=float(ex.weights[top_m]), lm=float(ex.task_losses[top_m]),
        lo=lowest, wf=float(st.weights[top_f]), lf=float(st.task_losses[top_f]))

# %% [markdown]
# ## 3 · K-FAC on a Llama and on a GPT-2, with its coverage
#
# `KFAC(model)` finds the layers it can precondition: `nn.Linear` and `transformers`' `Conv1D`. It leaves
# embeddings, norms and tied weights with their plain gradients and says so in `kfac.coverage`.
# A tied weight's gradient sums its uses (the embedding lookup and the output layer), so one use's factors
# would be wrong for it. Labels are the next tokens, `-100` where there is none, as for the loss.
# The loop is the module docstring's: forward, `update_statistics`, backward, `precondition_()`, step.

# %%
def kfac_step(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[KFAC, dict]:
    """One K-FAC-preconditioned SGD step on the next-token loss: the K-FAC object (hooks removed) and the
    plain weight gradients of its layers, before preconditioning."""
    batch = {"input_ids": ids, "attention_mask": mask}
    targets = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1).masked_fill(
        torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1) == 0, -100)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with KFAC(model, damping=1e-3, fisher_type="empirical", decay=0.0, trust_region=None) as kfac:  # the plain step
        out = model(**batch)
        kfac.update_statistics(batch, targets, outputs=out)
        opt.zero_grad()
        nll_loss(out, targets).backward()
        plain_grads = {n: m.weight.grad.clone() for n, m in kfac.modules.items()}
        kfac.precondition_()
        opt.step()
    return kfac, plain_grads


# %%
llama = tiny("llama")
k_llama, llama_grads = kfac_step(llama, *token_batch(batch_size, seq_len, offset=3))
print(k_llama.coverage)

# %% [markdown]
# Check one: the preconditioned gradient of every Llama layer equals the plain K-FAC step,
# $(A \otimes G + \lambda I)^{-1} \operatorname{vec} \nabla W$ by one dense solve
# (`kfac_precondition_reference`), from the same factors.

# %%
A, G = k_llama.factors.A, k_llama.factors.G
want = kfac_precondition_reference(A, G, llama_grads, damping=1e-3)
gap_llama = max(float((k_llama.modules[n].weight.grad - want[n]).abs().max() / want[n].abs().max()) for n in want)
parity("kfac/llama_vs_reference_rel_diff", gap_llama, 1e-4)
run.record("kfac/llama_coverage", k_llama.coverage.fraction, headline=True)

# %% [markdown]
# Check two: the factors of a GPT-2 equal curvlinops' K-FAC. Curvlinops knows `nn.Linear`, not `Conv1D`
# (`y = x W + b` with `W` stored `[in, out]`). So its reference is a copy of the model with each `Conv1D`
# replaced by the `nn.Linear` that holds the transposed weight: the same function, the same factors.

# %%
def linearized(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``Conv1D`` replaced by the equivalent ``nn.Linear`` (weight ``Wᵀ``)."""
    twin = copy.deepcopy(model)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, transformers.pytorch_utils.Conv1D):
            lin = nn.Linear(*mod.weight.shape).to(mod.weight)
            with torch.no_grad():
                lin.weight.copy_(mod.weight.T)
                lin.bias.copy_(mod.bias)
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, lin)
    return twin


class LogitsNVT(nn.Module):
    """``input_ids → logits [N, V, T]``, the layout ``nn.CrossEntropyLoss`` (and curvlinops) takes."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m(input_ids=x).logits.transpose(1, 2)


# %%
gpt2_k = tiny("gpt2").double()
seqs, _ = token_batch(batch_size, seq_len + 1, offset=4)
x, y = seqs[:, :-1], seqs[:, 1:]
k_gpt2 = KFAC(gpt2_k, fisher_type="empirical", decay=0.0)
k_gpt2.update_statistics(x, y)
k_gpt2.remove()
print(k_gpt2.coverage)
twin = LogitsNVT(linearized(gpt2_k))
params = [p for n in k_gpt2.modules for p in twin.m.get_submodule(n).parameters()]
op = curvlinops.KFACLinearOperator(twin, nn.CrossEntropyLoss(), params, [(x, y)], fisher_type="empirical",
                                   separate_weight_and_bias=False, check_deterministic=False)
op.compute_kronecker_factors()
ref = op.state_dict()

# %%
gap_gpt2 = max(max(float((k_gpt2.factors.A[n] - ref["input_covariances"][f"m.{n}"]).abs().max()),
                   float((k_gpt2.factors.G[n] - ref["gradient_covariances"][f"m.{n}"]).abs().max()))
               for n in k_gpt2.modules)
parity("kfac/gpt2_vs_curvlinops_max_abs_diff", gap_gpt2, 1e-10)
run.record("kfac/gpt2_coverage", k_gpt2.coverage.fraction, headline=True)
print(f"GPT-2 factors vs curvlinops: {gap_gpt2:.1e}; Llama step vs the plain K-FAC step: {gap_llama:.1e}")

# %% [markdown]
# ## 4 · Integrated gradients on a BERT classifier, against Captum
#
# Token ids are discrete, so the path from baseline to input runs through the output of the word-embedding layer.
# `EmbeddingIntegratedGradients` hooks that layer while the model runs unchanged, as Captum's
# `LayerIntegratedGradients` does. The baseline is the `[PAD]` token (id 0) at every position. The attention mask
# follows each example through `additional_forward_args`. Both run in float64, so they must agree to rounding.

# %%
bert = tiny("bert").double()
ids_b, mask_b = token_batch(batch_size, seq_len, offset=5)
logits_of = lambda i, a: bert(input_ids=i, attention_mask=a).logits.log_softmax(-1)      # noqa: E731
emb_layer = bert.get_input_embeddings()
target = bert(input_ids=ids_b, attention_mask=mask_b).logits.argmax(-1)
ours = EmbeddingIntegratedGradients(logits_of, emb_layer).attribute(
    ids_b, baselines=0, target=target, n_steps=ig_steps, additional_forward_args=(mask_b,))
captum_attr, captum_delta = LayerIntegratedGradients(logits_of, emb_layer).attribute(
    ids_b, baselines=torch.zeros_like(ids_b), target=target, n_steps=ig_steps, method="gausslegendre",
    additional_forward_args=(mask_b,), return_convergence_delta=True)

# %%
ig_gap = float((ours.attributions - captum_attr.sum(-1)).abs().max())
delta_gap = float((ours.completeness_error - captum_delta).abs().max())
parity("ig/bert_vs_captum_max_abs_diff", ig_gap, 1e-9)
parity("ig/bert_completeness_error_vs_captum_max_abs_diff", delta_gap, 1e-9)
run.record("ig/bert_completeness_error_max", float(ours.completeness_error.abs().max()))
print(f"largest difference from Captum: attributions {ig_gap:.1e}, completeness error {delta_gap:.1e}")
print("token attributions of example 0:", " ".join(f"{v:+.1e}" for v in ours.attributions[0].tolist()))

# %% [markdown]
# ## 5 · Exact contrastive accumulation with a BERT encoder
#
# An in-batch-negatives loss couples every pair in the batch. Plain gradient accumulation would give each
# micro-batch only its own negatives, a different loss. `accumulated_backward` embeds the batch micro-batch by
# micro-batch without a graph and takes the loss's gradient with respect to the embeddings. Then it replays each
# micro-batch's forward with its graph (GradCache's scheme). Peak activation memory is one micro-batch's graph
# plus the embeddings; the gradient is the full batch's. The encoder here is BERT's `[CLS]` state.

# %%
encoder_model = tiny("bert").bert.double()         # BertModel; its pooler is unused by the [CLS] state


def encode(batch):
    """Unit-norm ``[CLS]`` embeddings of a mapping ``{"input_ids", "attention_mask"}``."""
    h = encoder_model(**batch).last_hidden_state[:, 0]
    return nn.functional.normalize(h, dim=-1)


q_ids, q_mask = token_batch(batch_size, seq_len, offset=6)
d_ids, d_mask = token_batch(batch_size, seq_len, offset=7)
queries = {"input_ids": q_ids, "attention_mask": q_mask}
docs = {"input_ids": d_ids, "attention_mask": d_mask}

# %%
encoder_model.zero_grad()
full_loss = info_nce(encode(queries), encode(docs))
full_loss.backward()
full = {n: p.grad.clone() for n, p in encoder_model.named_parameters() if p.grad is not None}
encoder_model.zero_grad()
acc = accumulated_backward(encode, [queries, docs], info_nce, micro_batch)
assert {n for n, p in encoder_model.named_parameters() if p.grad is not None} == set(full)
acc_gap = max_abs_diff([encoder_model.get_parameter(n).grad for n in full], full.values())
scale = max(float(g.abs().max()) for g in full.values())
assert abs(acc.loss.item() - full_loss.item()) < 1e-10
parity("contrastive/bert_vs_full_batch_max_abs_diff", acc_gap, 1e-10 * max(1.0, scale))
run.record("contrastive/loss", acc.loss.item(), headline=True)
print(f"InfoNCE {acc.loss.item():.4f}; largest gradient difference from the full batch {acc_gap:.1e} "
      f"(largest gradient entry {scale:.2e}), micro-batches of {micro_batch}")

# %% [markdown]
# ## 6 · Second pass: K-FAC on language models, the `-100` convention, LoRA adapters
#
# **The `-100` convention.** A label `-100` inside the real tokens is not a loss term, and K-FAC's output factor
# `G` ignores it. Its input factor `A` could still count the position, since the model computes it.
# `KFAC(masked_rows="drop")`, the default, leaves the row out of a layer's `A` wherever no gradient flows through
# it in that layer: the output layer and the last block. Where gradient does flow through it (lower layers,
# through attention to later positions) it stays. The factors then average over the rows that shape the gradient
# being preconditioned. `masked_rows="keep"` counts every computed position, as curvlinops does; the two are
# tested equal to curvlinops in their own setting (`tests/curvature/test_hf_kfac.py`). Padding leaves both factors
# in both modes.
#
# **Does K-FAC help a language model?** Three families (GPT-2, Qwen2, Mistral), each built tiny from its config.
# Each learns a noisy bigram language: every token follows the one before through a fixed permutation, except for
# one token in five, drawn at random. Every method gets the same number of steps on the same batches. The
# score is the cross-entropy on held-out sequences. Each method's learning rate is tuned on a three-point grid,
# by the median over the seeds. K-FAC's damping is `kfac_lm_dampings`: 0.1 here; the `full` run tunes 1e-3 (its
# default, which beats SGD on the digits MLP), 1e-2 and 0.1 with the learning rate. K-FAC runs at its other
# defaults: the trust region, MC Fisher, inverses every 10 steps. The same seeds then give the paired comparison
# (the tuning used them too, which favours every method alike).

# %%
LM_GRIDS = {"SGD": (0.1, 0.3, 1.0), "AdamW": (0.003, 0.01, 0.03), "K-FAC + SGD": (0.03, 0.1, 0.3)}
LM_DAMPINGS = tuple(float(v) for v in kfac_lm_dampings.split(","))
LM_BATCH, LM_LEN, LM_HELD = 8, 16, 64


def lm_family(family: str, s: int) -> nn.Module:
    """A 2-layer, 2-head causal LM of ``family`` and width ``width`` from its config, seed ``s``, in eval mode."""
    torch.manual_seed(s)
    common = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=width, intermediate_size=2 * width,
                  vocab_size=VOCAB, max_position_embeddings=64)
    if family == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=width, vocab_size=VOCAB, n_positions=64, bos_token_id=VOCAB - 1,
            eos_token_id=VOCAB - 1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(dev).eval()
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **common)).to(dev).eval()
    return transformers.MistralForCausalLM(transformers.MistralConfig(num_key_value_heads=1, head_dim=width // 2,
                                                                      **common)).to(dev).eval()


def bigram_batches(s: int, steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``steps`` training batches and one held-out batch of the noisy bigram language (seed ``s``)."""
    g = torch.Generator().manual_seed(10_000 + s)
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))

    def draw(n):
        ids = torch.empty(n, LM_LEN, dtype=torch.long)
        ids[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        for t in range(1, LM_LEN):
            noise = torch.rand(n, generator=g) < 0.2
            ids[:, t] = torch.where(noise, torch.randint(0, VOCAB, (n,), generator=g), perm[ids[:, t - 1]])
        return ids.to(dev)
    return [draw(LM_BATCH) for _ in range(steps)], draw(LM_HELD)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def lm_run(family: str, s: int, method: str, lr_: float, damping: float = 1e-3) -> float:
    """The held-out loss after ``kfac_lm_steps`` steps of ``method`` (inf if it diverged)."""
    model = lm_family(family, s)
    train, held = bigram_batches(s, kfac_lm_steps)
    opt = (torch.optim.AdamW(model.parameters(), lr=lr_, weight_decay=0.0) if method == "AdamW"
           else torch.optim.SGD(model.parameters(), lr=lr_))
    kfac = None
    if method == "K-FAC + SGD":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # (the tied lm_head is named; it keeps its plain gradient)
            kfac = KFAC(model, damping=damping, generator=torch.Generator().manual_seed(s))
    for ids in train:
        out = model(input_ids=ids).logits
        loss = next_token_loss(out, ids)
        if not torch.isfinite(loss):
            return float("inf")
        if kfac is not None:
            labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)   # position t predicts t+1
            kfac.update_statistics(ids, labels, outputs=out)
        opt.zero_grad()
        loss.backward()
        if kfac is not None:
            kfac.precondition_()
        opt.step()
    with torch.no_grad():
        v = float(next_token_loss(model(input_ids=held).logits, held))
    return v if v == v else float("inf")


t_lm = time.time()
lm_scores: dict = {}                                  # family → method → (lr, damping) → per-seed held-out loss
for family in ("gpt2", "qwen2", "mistral"):
    for method, grid in LM_GRIDS.items():
        configs = [(lr_, d) for lr_ in grid for d in (LM_DAMPINGS if method == "K-FAC + SGD" else (1e-3,))]
        lm_scores.setdefault(family, {})[method] = {
            c: [lm_run(family, s, method, *c) for s in range(seed, seed + kfac_lm_seeds)] for c in configs}
run.record("kfac_lm/runtime_s", time.time() - t_lm)
lm_best = {f: {m: min(cfgs, key=lambda c: float(np.median(cfgs[c]))) for m, cfgs in ms.items()}
           for f, ms in lm_scores.items()}
for family, methods in lm_best.items():
    print(family, " · ".join(f"{m}: lr {c[0]:g}" + (f", damping {c[1]:g}" if m.startswith("K-FAC") else "")
                             + f" → median {np.median(lm_scores[family][m][c]):.3f}" for m, c in methods.items()))

# %%
lm_keys = []
for family in lm_best:
    best = {m: lm_scores[family][m][c] for m, c in lm_best[family].items()}
    for other in ("AdamW", "SGD"):
        key = f"kfac_lm/{family}/kfac_vs_{other.lower()}"
        run.compare(key, best["K-FAC + SGD"], best[other], name=f"K-FAC + SGD ({family})", baseline=other,
                    metric="held-out loss", lower_is_better=True)
        lm_keys.append(key)
_ = run.comparison_table(lm_keys)
lm_wins = {k: run.comparisons[k].verdict_adjusted == "better" for k in lm_keys}
vs_adamw = [k for k in lm_keys if k.endswith("adamw")]
vs_sgd = [k for k in lm_keys if k.endswith("sgd")]
lm_losses = {k: run.comparisons[k].verdict_adjusted == "worse" for k in lm_keys}
run.claim("kfac_lm/never_worse_than_sgd", "tuned K-FAC + SGD is worse than tuned SGD on none of the three families "
          "(paired seeds, family-corrected)", not any(lm_losses[k] for k in vs_sgd),
          value=sum(lm_losses[k] for k in vs_sgd), bound="= 0")
run.claim("kfac_lm/does_not_beat_adamw", "tuned K-FAC + SGD beats tuned AdamW on none of the three families (paired "
          "seeds, family-corrected)", not any(lm_wins[k] for k in vs_adamw),
          value=sum(lm_wins[k] for k in vs_adamw), bound="= 0")
run.say("On {n} paired seeds and {steps} steps, tuned K-FAC + SGD beats tuned AdamW on {wa} of 3 families and "
        "tuned SGD on {ws} of 3 (family-corrected verdicts: "
        + "; ".join(f"{k.split('/')[1]} vs {k.rsplit('_', 1)[1]}: {{{k}.verdict_adjusted}}" for k in lm_keys)
        + "). " + ("K-FAC helps these language models at this budget." if any(lm_wins[k] for k in vs_adamw) else
                   "K-FAC does not beat AdamW on these language models at this budget. A likely reason: AdamW's "
                   "per-parameter scales reach the embeddings and the tied output layer, which K-FAC leaves to "
                   "plain SGD."),
        n=kfac_lm_seeds, steps=kfac_lm_steps, wa=sum(lm_wins[k] for k in vs_adamw),
        ws=sum(lm_wins[k] for k in vs_sgd))

# %% [markdown]
# **LoRA adapters.** Most fine-tunes train adapters only: PEFT's LoRA adds trainable low-rank matrices `A`
# (`lora_A`) and `B` (`lora_B`) beside each frozen projection. Each is an `nn.Linear`, so K-FAC preconditions
# both. MeZO perturbs only what trains. Below, one MeZO step and one K-FAC step on a GPT-2 with adapters. The
# frozen base must come out bit-identical (`tests/test_families.py` also runs EMO, MGS and integrated gradients
# this way; `benchmarks/bench_lora.py` measures MeZO's memory with and without adapters).

# %%
import peft  # noqa: E402

lora = peft.get_peft_model(tiny("gpt2", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), peft.LoraConfig(
    r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_dropout=0.0))
with torch.no_grad():                                 # PEFT starts B at zero; a random B gives A a gradient too
    for name_, p in lora.named_parameters():
        if "lora_B" in name_:
            p.normal_(0.0, 0.1, generator=torch.Generator(device=p.device).manual_seed(seed))
base_before = {n: p.detach().clone() for n, p in lora.named_parameters() if not p.requires_grad}
adapters_before = {n: p.detach().clone() for n, p in lora.named_parameters() if p.requires_grad}
lora_ids, lora_mask = token_batch(batch_size, seq_len, offset=7)
lora_labels = lora_ids.masked_fill(lora_mask == 0, -100)
mezo = MeZO(lora.parameters(), lr=1e-2, sigma=1e-3, seed=seed)
with torch.no_grad():
    mezo.step(lambda: lora(input_ids=lora_ids, attention_mask=lora_mask, labels=lora_labels).loss)
lora_opt = torch.optim.SGD(lora.parameters(), lr=0.1)
k_lora = KFAC(lora, fisher_type="empirical")
out = lora(input_ids=lora_ids, attention_mask=lora_mask)
k_lora.update_statistics({"input_ids": lora_ids, "attention_mask": lora_mask}, lora_labels, outputs=out)
lora_opt.zero_grad()
nll_loss(out.logits, lora_labels).backward()
k_lora.precondition_()
lora_opt.step()
base_gap = max(float((p - base_before[n]).abs().max()) for n, p in lora.named_parameters() if not p.requires_grad)
adapter_move = max(float((p.detach() - adapters_before[n]).abs().max()) for n, p in lora.named_parameters()
                   if p.requires_grad)
parity("lora/frozen_base_max_abs_change", base_gap, 1e-30)
run.record("lora/adapter_max_abs_change", adapter_move)
run.record("lora/kfac_coverage", k_lora.coverage.fraction)
run.record("lora/adapter_params", sum(p.numel() for p in lora.parameters() if p.requires_grad))
run.claim("lora/kfac_preconditions_every_adapter", "K-FAC preconditions every lora_A and lora_B matrix",
          k_lora.coverage.fraction == 1.0, value=k_lora.coverage.fraction, bound="= 1")
run.say("MeZO and K-FAC + SGD moved the {lora/adapter_params:,} adapter parameters by up to "
        "{lora/adapter_max_abs_change:.1e}; the frozen base changed by {lora/frozen_base_max_abs_change:.0e}, and "
        "K-FAC preconditions {lora/kfac_coverage:.0%} of what trains.")

# %% [markdown]
# ## Results
#
# Two of the checks drawn: the loss of the plain EMO fine-tune, and each BERT token's attribution against Captum's.

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.plot(range(1, len(emo_losses) + 1), emo_losses, marker="o")
label_axes(ax1, "AdamW step", "EMO loss before the step", "EMO fine-tune of the GPT-2", lower_is_better=True)
ref_tok = captum_attr.sum(-1).flatten().detach().cpu().numpy()
ax2.plot(ref_tok, ours.attributions.flatten().cpu().numpy(), ".", ms=5)
lim = [float(ref_tok.min()), float(ref_tok.max())]
ax2.plot(lim, lim, "k--", lw=0.8)
label_axes(ax2, "Captum's attribution", "taskloss's attribution", "token attributions, BERT")
run.savefig(fig, "emo_loss_and_ig_parity.png")
show(fig, "left, the EMO loss of the GPT-2 on its batch before each of {n} AdamW steps; right, the attribution of "
     "each of the {tokens} BERT tokens, ours against Captum's (dashed: equal; largest difference "
     "{ig/bert_vs_captum_max_abs_diff:.0e}).", run=run, n=len(emo_losses), tokens=ref_tok.size)

# %%
run.record("runtime_s", time.time() - t_start)
_ = run.claims_table()

# %%
held = sum(c["held"] for c in run.claims.values())
run.say(
    "**Summary.** The parity checks are asserts, so a run that reaches this line passed all of them: EMO's MLE mode "
    "gives `transformers`' loss (difference "
    "{emo/mle_vs_transformers_abs_diff:.1e}); the MGS step equals the plain reference step (parameters within "
    "{mgs/vs_reference_max_param_diff:.1e}); K-FAC's GPT-2 factors equal curvlinops' within "
    "{kfac/gpt2_vs_curvlinops_max_abs_diff:.1e}; integrated gradients on BERT equal Captum's within "
    "{ig/bert_vs_captum_max_abs_diff:.1e}; the accumulated contrastive gradient equals the full batch's within "
    "{contrastive/bert_vs_full_batch_max_abs_diff:.1e}. K-FAC preconditions {kfac/gpt2_coverage:.0%} of the "
    "GPT-2's parameters and {kfac/llama_coverage:.0%} of the Llama's; the coverage tables above give the reason for "
    "every module left out. "
    f"{held} of the {len(run.claims)} claims hold. They are about these tiny random models only: whether EMO or "
    "MGS improves a real fine-tune needs a pretrained model and held-out data (notebooks 04 and 09).")

# %% [markdown]
# **Try this.**
# * Wider models and longer sequences: `python -m taskloss.runner run 17 -p width 64 -p seq_len 32`
# * More MGS candidates and noise: `python -m taskloss.runner run 17 -p mgs_samples 16 -p mgs_sigma 4`
# * Seconds, not minutes: `python -m taskloss.runner run 17 --set smoke`
# * Your own model: replace `tiny(...)` by `transformers.AutoModelForCausalLM.from_pretrained(folder)`.
