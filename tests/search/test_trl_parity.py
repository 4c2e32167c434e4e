"""Our GRPO family equals TRL's ``GRPOTrainer`` loss, for every ``loss_type`` it shares with us, to float round-off.

TRL (``trl`` 1.16) builds the batch itself: a ``rollout_func`` hands it fixed prompts and completions (TRL's own hook for
custom generation), a reward function gives fixed rewards, ``_generate_and_score_completions`` tokenizes, pads and
computes the group advantages, and ``_compute_loss`` the loss. We feed the same prompt and completion ids, attention
mask and rewards to :func:`taskloss.search.group_estimators.completion_logprobs` and our loss functions, and require
the same loss and the same gradient on every parameter of a tiny GPT-2 built offline. Off-policy ``old_logps`` make
PPO's clip act. The correspondence table lives in the module docstring of ``taskloss.search.group_estimators``.
"""
from __future__ import annotations

import pickle

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

from hf_models import VOCAB, tiny_gpt2  # noqa: E402

from taskloss.search.group_estimators import (  # noqa: E402
    completion_logprobs,
    dapo_loss,
    dr_grpo_loss,
    grpo_loss,
)

G = 4
EOS = VOCAB - 1
PROMPTS = ["w1 w2", "w3 w4 w5"]                         # different lengths: TRL left-pads the first
COMPLETIONS = [[5, 6, 7, EOS], [8, 9], [10, EOS], [11, 12, 13, 14],
               [15, EOS], [16, 17, 18], [19], [20, 21, EOS]]
REWARDS = [1.0, 0.0, 2.0, 0.5, 0.0, 0.0, 3.0, 1.0]
MAX_LEN = 4


def _dataset(rows):
    """A ``datasets.Dataset``; the fingerprint workaround only where hashing the data fails.

    The cause (notes/peers-offline.md saw ``PicklingError: Can't pickle <class 'MonthDayNano'>``): ``datasets``
    fingerprints a new dataset by pickling its arguments with ``dill``, and pyarrow defines the ``MonthDayNano``
    named tuple in C with ``__module__ == "builtins"``, so pickling the class *by reference* fails
    (``pickle.dumps(pyarrow.MonthDayNano)`` raises with pyarrow 26.0.1). With dill 0.4.1, datasets 5.2.0 here dill
    falls back to pickling it by value with a ``PicklingWarning`` and ``from_dict`` works; where it raises instead, a
    random fingerprint is harmless for this test, which never uses the dataset cache that the fingerprint keys.
    """
    try:
        return datasets.Dataset.from_dict(rows)
    except pickle.PicklingError:
        import uuid

        import datasets.arrow_dataset as ad
        ad.generate_fingerprint = lambda *args, **kwargs: uuid.uuid4().hex
        return datasets.Dataset.from_dict(rows)


def _tokenizer():
    from transformers import PreTrainedTokenizerFast
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", eos_token=f"w{EOS}")


def _trl_batch(loss_type: str, scale_rewards: str, tmp_path, epsilon=0.2, epsilon_high=0.28):
    from trl import GRPOConfig, GRPOTrainer
    tok = _tokenizer()

    def rollout(prompts, trainer):
        return {"prompt_ids": [tok(p)["input_ids"] for p in prompts], "completion_ids": COMPLETIONS[:len(prompts)],
                "logprobs": [[0.0] * len(c) for c in COMPLETIONS[:len(prompts)]]}

    def reward(prompts, completions, completion_ids, **kwargs):
        return [REWARDS[COMPLETIONS.index(list(c))] for c in completion_ids]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], num_generations=G,
                      per_device_train_batch_size=len(COMPLETIONS), max_completion_length=MAX_LEN,
                      loss_type=loss_type, scale_rewards=scale_rewards, epsilon=epsilon, epsilon_high=epsilon_high,
                      save_strategy="no", bf16=False)     # TRL defaults to bf16 autocast, also on a CPU
    trainer = GRPOTrainer(model=tiny_gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), reward_funcs=reward, args=args, train_dataset=_dataset({"prompt": PROMPTS}),
                          processing_class=tok, rollout_func=rollout)
    trainer.model.train()                                # dropout is 0: train mode is deterministic
    trainer.current_gradient_accumulation_steps = 1      # set by Trainer's training loop; one step, no accumulation
    batch = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(G)])
    return trainer, batch


def _ours(model, batch, loss_fn, old, **kwargs):
    mask = batch["completion_mask"]
    completions = batch["completion_ids"].masked_fill(mask == 0, -100)
    attention = torch.cat([batch["prompt_mask"], mask], dim=1)
    logps = completion_logprobs(model, batch["prompt_ids"], completions, attention_mask=attention)
    rewards = torch.tensor([REWARDS[COMPLETIONS.index(c)] for c in COMPLETIONS])
    return loss_fn(logps, mask.float(), rewards, G, old_logps=old, **kwargs), logps


CASES = [  # TRL loss_type, scale_rewards, our function, its keyword arguments
    ("grpo", "group", grpo_loss, {"clip_low": 0.2, "clip_high": 0.28}),
    ("grpo", "batch", grpo_loss, {"clip_low": 0.2, "clip_high": 0.28, "scale": "batch"}),
    ("dr_grpo", "none", dr_grpo_loss, {"clip_low": 0.2, "clip_high": 0.28, "max_length": MAX_LEN}),
    ("dapo", "group", dapo_loss, {"clip_low": 0.2, "clip_high": 0.28}),
    ("bnpo", "group", dapo_loss, {"clip_low": 0.2, "clip_high": 0.28}),
    ("dapo", "none", dapo_loss, {"clip_low": 0.2, "clip_high": 0.28, "scale": "none"}),
]


@pytest.mark.parametrize("off_policy", [False, True], ids=["on_policy", "clipped"])
@pytest.mark.parametrize("loss_type,scale_rewards,loss_fn,kwargs", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_trl_grpo_loss_and_gradient_equal_ours(loss_type, scale_rewards, loss_fn, kwargs, off_policy, tmp_path):
    trainer, batch = _trl_batch(loss_type, scale_rewards, tmp_path)
    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    old = None
    if off_policy:     # a sampling policy far enough away that ratios leave [1-ε, 1+ε_high] on both sides
        with torch.no_grad():
            _, logps = _ours(model, batch, loss_fn, None, **kwargs)
        old = logps + 0.5 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(0))
        batch = {**batch, "old_per_token_logps": old}
    theirs = trainer._compute_loss(model, batch)
    g_theirs = torch.autograd.grad(theirs, params)
    ours, logps = _ours(model, batch, loss_fn, old, **kwargs)
    g_ours = torch.autograd.grad(ours, params)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert max(float(g.abs().max()) for g in g_ours) > 1e-4            # a zero gradient would prove nothing
    if off_policy:                                                     # the clip acted on some tokens
        ratio = (logps.detach() - old).exp()[batch["completion_mask"].bool()]
        assert bool((ratio < 0.8).any()) and bool((ratio > 1.28).any())


def test_trl_advantages_equal_ours(tmp_path):
    from taskloss.search.group_estimators import group_advantages
    rewards = torch.tensor(REWARDS)
    for scale in ("group", "batch", "none"):
        _, batch = _trl_batch("grpo", scale, tmp_path)
        ours = group_advantages(rewards, G, baseline="mean", scale=scale)
        torch.testing.assert_close(ours, batch["advantages"].float(), rtol=1e-6, atol=1e-6)
