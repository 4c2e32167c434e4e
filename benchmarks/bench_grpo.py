"""Benchmark: one GRPO step of ours (taskloss.search.grpo_loss) beside TRL's GRPOTrainer on the same tiny GPT-2.

A *step* is what a GRPO iteration costs: sample ``G`` completions for each of ``B`` prompts with ``transformers``'
``generate`` (``do_sample=True``, temperature 1, every completion ``C`` tokens long: ``min_new_tokens = C``), score
them with the same reward function, form the group advantages, one forward/backward of the loss, one AdamW step.

* **ours** — ``model.generate`` on the prompts repeated ``G`` times, :func:`taskloss.search.completion_logprobs` and
  :func:`taskloss.search.grpo_loss` (``scale="group"``, per-sequence token means, clip 0.2).
* **TRL** (peer) — ``GRPOTrainer._generate_and_score_completions`` (its own generation, reward call, advantages)
  and ``GRPOTrainer._compute_loss`` with ``loss_type="grpo"``, ``bf16=False`` (TRL's default bf16 autocast would
  change the numerics), then the same backward and AdamW step. The trainer's ``train()`` loop (data loader,
  callbacks, logging) is left out: both columns time the same work.
* **floor** — ``generate`` plus one forward/backward of the completions' summed log-probs and the AdamW step:
  what any on-policy method must pay; no advantage, no loss terms.

Two of TRL's defaults shape its column and are kept (they are what a user gets): ``gradient_checkpointing=True``
(the backward recomputes the forward) and the chunked log-prob kernel of ``add_fused_lm_head``, which allocates a
``[tokens, 32768]`` tile whatever the vocabulary — most of TRL's peak memory at this tiny vocabulary, a saving at a
real one (50k tokens) where the full ``[tokens, V]`` logits would be larger.

Time per sampled token is the median over interleaved rounds (each method once per round) divided by ``B·G·C``;
peak memory is the allocator's peak above the live tensors before the step (``_timing.peak_bytes``).

    python benchmarks/bench_grpo.py [--prompts 4] [--group 4] [--tokens 16] [--repeats 5] [--width 64]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved_median_times, peak_bytes  # noqa: E402

from taskloss.search import completion_logprobs, grpo_loss  # noqa: E402

VOCAB = 97


def build(width: int, seed: int = 0):
    import transformers
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=width, vocab_size=VOCAB, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
                                  eos_token_id=VOCAB - 1)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg)


def tokenizer():
    import tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", eos_token=f"w{VOCAB - 1}")


def reward_of(ids: torch.Tensor) -> torch.Tensor:
    """A task reward on token ids: the fraction of even tokens."""
    return (ids % 2 == 0).float().mean(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--width", type=int, default=64)
    args = ap.parse_args()
    B, G, C = args.prompts, args.group, args.tokens
    dev = torch.device("cpu")
    from trl import GRPOConfig, GRPOTrainer
    import datasets

    tok = tokenizer()
    prompts_text = [" ".join(f"w{(7 * b + j) % 90 + 1}" for j in range(4)) for b in range(B)]
    prompt_ids = torch.tensor([tok(p)["input_ids"] for p in prompts_text])
    gen_kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "max_new_tokens": C, "min_new_tokens": C,
                  "pad_token_id": 0}

    ours_model = build(args.width)
    ours_opt = torch.optim.AdamW(ours_model.parameters(), lr=1e-4)

    def sample(model):
        model.eval()
        with torch.no_grad():
            out = model.generate(prompt_ids.repeat_interleave(G, 0), attention_mask=torch.ones(B * G, 4,
                                 dtype=torch.long), **gen_kwargs)
        model.train()
        return prompt_ids.repeat_interleave(G, 0), out[:, prompt_ids.shape[1]:]

    def ours_step():
        prompts, comp = sample(ours_model)
        mask = torch.ones(comp.shape)
        loss = grpo_loss(completion_logprobs(ours_model, prompts, comp), mask, reward_of(comp), G)
        ours_opt.zero_grad()
        loss.backward()
        ours_opt.step()

    floor_model = build(args.width)
    floor_opt = torch.optim.AdamW(floor_model.parameters(), lr=1e-4)

    def floor_step():
        prompts, comp = sample(floor_model)
        loss = -completion_logprobs(floor_model, prompts, comp).sum()
        floor_opt.zero_grad()
        loss.backward()
        floor_opt.step()

    def reward(prompts, completions, completion_ids, **kwargs):
        return reward_of(torch.tensor(completion_ids)).tolist()

    out_dir = tempfile.mkdtemp(prefix="bench_grpo_")
    cfg = GRPOConfig(output_dir=out_dir, use_cpu=True, report_to=[], num_generations=G,
                     per_device_train_batch_size=B * G, max_completion_length=C, loss_type="grpo",
                     scale_rewards="group", bf16=False, save_strategy="no", temperature=1.0, top_k=0,
                     generation_kwargs={"min_new_tokens": C}, learning_rate=1e-4)
    trainer = GRPOTrainer(model=build(args.width), reward_funcs=reward, args=cfg,
                          train_dataset=datasets.Dataset.from_dict({"prompt": prompts_text}), processing_class=tok)
    trl_model = trainer.model
    trl_opt = torch.optim.AdamW(trl_model.parameters(), lr=1e-4)
    trainer.current_gradient_accumulation_steps = 1
    batch_inputs = [{"prompt": p} for p in prompts_text for _ in range(G)]

    def trl_step():
        trl_model.train()
        batch = trainer._generate_and_score_completions(batch_inputs)
        assert batch["completion_ids"].shape == (B * G, C)
        loss = trainer._compute_loss(trl_model, batch)
        trl_opt.zero_grad()
        loss.backward()
        trl_opt.step()

    fns = {"ours (grpo_loss)": ours_step, "TRL GRPOTrainer": trl_step, "floor (generate + fwd/bwd)": floor_step}
    times = interleaved_median_times(fns, dev, repeats=args.repeats, warmup=1, clock="cpu")
    tokens = B * G * C
    peaks = {k: peak_bytes(f, dev) for k, f in fns.items()}
    ours_t, floor_t = times["ours (grpo_loss)"], times["floor (generate + fwd/bwd)"]
    print(f"GRPO step on a GPT-2 (2 layers, width {args.width}, vocabulary {VOCAB}); {B} prompts × {G} completions × "
          f"{C} tokens = {tokens} sampled tokens per step; {torch.get_num_threads()} thread(s), CPU time per step, "
          f"median of {args.repeats} interleaved rounds.\n")
    print("| method | µs / sampled token | peak MiB / step | ours ÷ this | this ÷ floor |")
    print("|---|---:|---:|---:|---:|")
    for k in fns:
        t = times[k]
        print(f"| {k} | {1e6 * t / tokens:.1f} | {peaks[k] / 2 ** 20:.2f} | {ours_t / t:.2f} | {t / floor_t:.2f} |")


if __name__ == "__main__":
    main()
