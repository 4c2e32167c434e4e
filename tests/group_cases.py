"""Bad-input cases for the group policy-gradient names of ``taskloss.search`` (notebook 18), walked by
``test_bad_inputs.py`` beside the rest of the subpackage's public API."""
from __future__ import annotations

import torch
from torch import nn

import taskloss.search as S

NAN = float("nan")
LP = torch.zeros(4, 3)
MASK = torch.ones(4, 3)
R = torch.arange(4.0)
SEQS, SMASK = S.enumerate_sequences(3, 2, 0)
POL = S.TabularPolicy(3, 2)
PROMPT = torch.tensor([0])
RS = torch.zeros(len(SEQS), dtype=torch.float64)

GROUP_CASES = {
    "completion_mask": [
        ("wrong-dtype completions", lambda: S.completion_mask(torch.zeros(2, 3), 1, 0), TypeError, "integer tensor"),
        ("out-of-range pad", lambda: S.completion_mask(torch.zeros(2, 3, dtype=torch.long), 1, -1), ValueError,
         "pad_id must be >= 0"),
    ],
    "token_logprobs": [
        ("wrong-shape logits", lambda: S.token_logprobs(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)),
         ValueError, r"logits \[N, C, V\]"),
        ("wrong-dtype logits", lambda: S.token_logprobs(torch.zeros(2, 3, 4, dtype=torch.long),
                                                        torch.zeros(2, 3, dtype=torch.long)), TypeError, "floating"),
        ("NaN temperature", lambda: S.token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), NAN),
         ValueError, "temperature must be > 0"),
    ],
    "completion_logprobs": [
        ("wrong-type model", lambda: S.completion_logprobs("gpt", torch.zeros(1, 1, dtype=torch.long),
                                                           torch.zeros(1, 2, dtype=torch.long)), TypeError,
         "model must be an nn.Module"),
        ("wrong-dtype prompts", lambda: S.completion_logprobs(nn.Linear(2, 2), torch.zeros(1, 1),
                                                              torch.zeros(1, 2, dtype=torch.long)), TypeError,
         "prompts must be an integer tensor"),
        ("empty prompt", lambda: S.completion_logprobs(nn.Linear(2, 2), torch.zeros(1, 0, dtype=torch.long),
                                                       torch.zeros(1, 2, dtype=torch.long)), ValueError,
         "at least one prompt token"),
    ],
    "sample_groups": [
        ("out-of-range group", lambda: S.sample_groups(POL, torch.zeros(1, 1, dtype=torch.long), 0, 2, eos_id=0,
                                                       pad_id=0), ValueError, "group_size must be >= 1"),
        ("wrong-type generator", lambda: S.sample_groups(POL, torch.zeros(1, 1, dtype=torch.long), 2, 2, eos_id=0,
                                                         pad_id=0, generator=1), TypeError, "generator must be"),
    ],
    "group_advantages": [
        ("NaN rewards", lambda: S.group_advantages(torch.tensor([1.0, NAN]), 2), ValueError, "NaN"),
        ("group of one with a baseline", lambda: S.group_advantages(R, 1), ValueError, "group_size must be >= 2"),
        ("uneven groups", lambda: S.group_advantages(R, 3), ValueError, "do not split into groups of 3"),
        ("wrong-shape rewards", lambda: S.group_advantages(R.reshape(2, 2), 2), ValueError, r"non-empty \[N\]"),
        ("wrong-dtype rewards", lambda: S.group_advantages(torch.arange(4), 2), TypeError, "floating"),
        ("bool group size", lambda: S.group_advantages(R, True), TypeError, "group_size must be an int"),
        ("unknown baseline", lambda: S.group_advantages(R, 2, baseline="median"), ValueError, "baseline must be one"),
        ("unknown scale", lambda: S.group_advantages(R, 2, scale=True), ValueError, "scale must be one"),
        ("NaN eps", lambda: S.group_advantages(R, 2, eps=NAN), ValueError, "eps must be > 0"),
    ],
    "policy_gradient_surrogate": [
        ("NaN logps", lambda: S.policy_gradient_surrogate(LP * NAN, MASK, R), ValueError, "NaN"),
        ("NaN advantages", lambda: S.policy_gradient_surrogate(LP, MASK, R * NAN), ValueError, "NaN"),
        ("wrong-shape mask", lambda: S.policy_gradient_surrogate(LP, MASK[:, :2], R), ValueError, "mask must be"),
        ("non-binary mask", lambda: S.policy_gradient_surrogate(LP, MASK * 2, R), ValueError, "only 0 and 1"),
        ("wrong-shape advantages", lambda: S.policy_gradient_surrogate(LP, MASK, R[:3]), ValueError,
         r"advantages must be a tensor \[N=4\]"),
        ("empty logps", lambda: S.policy_gradient_surrogate(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0)),
         ValueError, "non-empty"),
        ("unknown aggregation", lambda: S.policy_gradient_surrogate(LP, MASK, R, aggregation="max"), ValueError,
         "aggregation must be one"),
        ("negative clip", lambda: S.policy_gradient_surrogate(LP, MASK, R, clip_low=-0.1), ValueError,
         "clip_low must be >= 0"),
        ("NaN clip", lambda: S.policy_gradient_surrogate(LP, MASK, R, clip_high=NAN), ValueError, "clip_high"),
        ("wrong-shape old", lambda: S.policy_gradient_surrogate(LP, MASK, R, old_logps=LP[:2]), ValueError,
         "old_logps shape"),
        ("out-of-range max_length", lambda: S.policy_gradient_surrogate(LP, MASK, R, aggregation="constant",
                                                                         max_length=0), ValueError,
         "max_length must be >= 1"),
    ],
    "reinforce_mean_baseline_loss": [
        ("group of one", lambda: S.reinforce_mean_baseline_loss(LP, MASK, R, 1), ValueError, "group_size must be >= 2"),
    ],
    "rloo_loss": [
        ("NaN rewards", lambda: S.rloo_loss(LP, MASK, R * NAN, 2), ValueError, "NaN"),
        ("group of one", lambda: S.rloo_loss(LP, MASK, R, 1), ValueError, "group_size must be >= 2"),
    ],
    "grpo_loss": [
        ("uneven groups", lambda: S.grpo_loss(LP, MASK, R, 3), ValueError, "groups of 3"),
        ("unknown scale", lambda: S.grpo_loss(LP, MASK, R, 2, scale="token"), ValueError, "scale must be one"),
    ],
    "dr_grpo_loss": [
        ("wrong-type max_length", lambda: S.dr_grpo_loss(LP, MASK, R, 2, max_length=2.5), TypeError,
         "max_length must be an int"),
    ],
    "dapo_loss": [
        ("NaN old logps", lambda: S.dapo_loss(LP, MASK, R, 2, old_logps=LP * NAN), ValueError, "NaN"),
    ],
    "enumerate_sequences": [
        ("too large a vocabulary", lambda: S.enumerate_sequences(9, 2, 0), ValueError, "n_tokens must be <= 8"),
        ("too long", lambda: S.enumerate_sequences(3, 6, 0), ValueError, "max_length must be <= 5"),
        ("out-of-range eos", lambda: S.enumerate_sequences(3, 2, 3), ValueError, "eos_id must be <= 2"),
    ],
    "TabularPolicy": [
        ("out-of-range vocabulary", lambda: S.TabularPolicy(1, 2), ValueError, "n_tokens must be >= 2"),
        ("bool length", lambda: S.TabularPolicy(3, True), TypeError, "max_length must be an int"),
    ],
    "sequence_scores": [
        ("batched prompt", lambda: S.sequence_scores(POL, PROMPT[None], SEQS, SMASK), ValueError, "one sequence"),
    ],
    "exact_objective": [
        ("missing sequences", lambda: S.exact_objective(POL, PROMPT, SEQS[:-1], SMASK[:-1], RS[:-1]), ValueError,
         "not 1: is every sequence enumerated"),
    ],
    "exact_group_moments": [
        ("wrong-shape rewards", lambda: S.exact_group_moments(S.rloo_loss, POL, PROMPT, SEQS, SMASK, RS[:2], 2),
         ValueError, "rewards must be a tensor"),
        ("too many groups", lambda: S.exact_group_moments(S.rloo_loss, POL, PROMPT, SEQS, SMASK, RS, 9), ValueError,
         "too many to enumerate"),
    ],
    "sampled_group_moments": [
        ("out-of-range draws", lambda: S.sampled_group_moments(S.rloo_loss, POL, PROMPT, SEQS, SMASK, RS, 2, 1),
         ValueError, "n_groups must be >= 2"),
    ],
}
GROUP_EXEMPT = {"BASELINES": "constant", "SCALES": "constant", "AGGREGATIONS": "constant", "GRPO_EPS": "constant",
                "GroupMoments": "result record built by exact_group_moments and sampled_group_moments"}
