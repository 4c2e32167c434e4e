"""Language models at work: batched decoding and sequence log-probabilities, one interface over our LM and
Hugging Face causal LMs with cached greedy decoding, text-completion tasks scored by sequence task losses,
and the committed pretrained small LM.

Notebooks: 04_sequence_task_losses, 09_emo_loss, 13_recurrent_gradients, 15_integrated_gradients,
16_update_rule_harness.

Modules:

- :mod:`~taskloss.lm.generation`           — batched greedy / sampled decoding, sequence log-probabilities
- :mod:`~taskloss.lm.causal_lm`            — one causal-LM interface, KV-cached greedy decoding that vmaps
- :mod:`~taskloss.lm.completion`           — completion tasks, their task losses, perplexity
- :mod:`~taskloss.lm.pretrained`           — the committed small LM pretrained on the corpus
"""
from taskloss.lm.causal_lm import CausalLM, HFTokenizer, greedy_decode, load_causal_lm
from taskloss.lm.completion import (
    TASK_LOSSES,
    CompletionBatch,
    CompletionTask,
    block_nll,
    completion_pairs,
    evaluate_completions,
    heldout_blocks,
    pad_sequences,
    parse_task_loss,
    perplexity,
    task_loss_terms,
    window_nll,
)
from taskloss.lm.generation import generate, sequence_logprob
from taskloss.lm.pretrained import PRETRAINED_DIR, load_pretrained_lm

__all__ = [
    "generate", "sequence_logprob", "CausalLM", "HFTokenizer", "load_causal_lm", "greedy_decode", "TASK_LOSSES",
    "parse_task_loss", "task_loss_terms", "CompletionBatch", "CompletionTask", "pad_sequences",
    "completion_pairs", "heldout_blocks", "window_nll", "block_nll", "perplexity", "evaluate_completions",
    "PRETRAINED_DIR", "load_pretrained_lm",
]
