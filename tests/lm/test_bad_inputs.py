"""Bad input across ``taskloss.lm``'s public API: every name in ``__all__`` is walked with NaN, empty, wrong-shape,
wrong-dtype and out-of-range inputs and must raise a clear exception (type and message). Token ids are ints
(no float, bool or str through ``int()``) wherever they are taken: decoding, scoring, completion tasks."""
from __future__ import annotations

import pytest
import torch
from helpers import V, make_lm, tokens

import taskloss.lm as LM

NAN = float("nan")


@pytest.fixture(scope="module")
def models():
    broken = make_lm("pre")
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(NAN)
    return make_lm("pre"), make_lm("lstm"), broken


class _NoEos:
    eos_token_id = None


def cases(m, rnn, broken, tok):
    p = tokens(2, 4)
    c = LM.CausalLM(m)
    task = LM.CompletionTask("repetition", 2, 1, 0)
    return {
        "generate": [
            ("wrong-dtype eos_id", lambda: LM.generate(m, p, 3, 0.5, 0), TypeError, "eos_id must be an int"),
            ("wrong-dtype pad_id", lambda: LM.generate(m, p, 3, None, "0"), TypeError, "pad_id must be an int"),
            ("out-of-range pad_id", lambda: LM.generate(m, p, 3, None, V), ValueError, f"pad_id must be <= {V - 1}"),
            ("wrong-dtype prefix", lambda: LM.generate(m, p.float(), 3, None, 0), TypeError, "integer token ids"),
            ("empty prefix", lambda: LM.generate(m, p[:0], 3, None, 0), ValueError, "empty"),
            ("out-of-range prefix", lambda: LM.generate(m, p + V, 3, None, 0), ValueError, "outside"),
            ("wrong-shape prefix", lambda: LM.generate(m, p[0], 3, None, 0), ValueError, r"\[B, T\]"),
            ("out-of-range length", lambda: LM.generate(m, p, 0, None, 0), ValueError, "max_new_tokens must be >= 1"),
            ("NaN temperature", lambda: LM.generate(m, p, 2, None, 0, greedy=False, temperature=NAN), ValueError,
             "temperature must be > 0"),
            ("out-of-range top_k", lambda: LM.generate(m, p, 2, None, 0, greedy=False, top_k=0), ValueError,
             "top_k must be >= 1"),
            ("wrong-type generator", lambda: LM.generate(m, p, 2, None, 0, greedy=False, generator=1), TypeError,
             "generator must be"),
            ("wrong-dtype greedy", lambda: LM.generate(m, p, 2, None, 0, greedy="no"), TypeError, "greedy must be"),
            ("wrong-type model", lambda: LM.generate("m", p, 2, None, 0), TypeError, "nn.Module"),
            ("NaN model", lambda: LM.generate(broken, p, 2, None, 0), ValueError, "NaN or inf logits"),
        ],
        "sequence_logprob": [
            ("wrong-dtype continuation", lambda: LM.sequence_logprob(m, p, p.float(), 0), TypeError, "integer"),
            ("wrong-dtype pad_id", lambda: LM.sequence_logprob(m, p, p, 0.5), TypeError, "pad_id must be an int"),
            ("wrong-dtype eos_id", lambda: LM.sequence_logprob(m, p, p, 0, eos_id=True), TypeError,
             "eos_id must be an int"),
            ("wrong-shape batch", lambda: LM.sequence_logprob(m, p, p[:1], 0), ValueError, "batch sizes differ"),
            ("out-of-range length", lambda: LM.sequence_logprob(m, tokens(1, 20), tokens(1, 10), 0), ValueError,
             "exceeds the model's max_len"),
        ],
        "greedy_decode": [
            ("wrong-dtype eos_id", lambda: LM.greedy_decode(m, p, 2, 1.5, 0), TypeError, "eos_id must be an int"),
            ("wrong-dtype pad_id", lambda: LM.greedy_decode(m, p, 2, None, False), TypeError, "pad_id must be an int"),
            ("out-of-range length", lambda: LM.greedy_decode(m, p, 0, None, 0), ValueError,
             "max_new_tokens must be >= 1"),
            ("wrong-dtype prefix", lambda: LM.greedy_decode(m, p.float(), 2, None, 0), TypeError, "integer"),
            ("wrong-dtype cache", lambda: LM.greedy_decode(m, p, 2, None, 0, cache="no"), TypeError,
             "cache must be a bool"),
            ("wrong-type model", lambda: LM.greedy_decode(rnn, p, 2, None, 0), TypeError, "recurrent"),
        ],
        "CausalLM": [
            ("wrong-type model", lambda: LM.CausalLM(torch.nn.Linear(2, 2)), TypeError, "cannot adapt Linear"),
            ("wrong-type wrapped twice", lambda: LM.CausalLM(c), TypeError, "already a CausalLM"),
            ("wrong-dtype decode", lambda: c(p, decode=2.5), TypeError, "decode must be an int"),
            ("out-of-range decode", lambda: c(p, decode=-1), ValueError, "decode must be >= 0"),
            ("wrong-dtype eos_id", lambda: c(p, decode=2, eos_id="1"), TypeError, "eos_id must be an int"),
            ("wrong-dtype idx", lambda: c(p.float()), TypeError, "integer token ids"),
            ("wrong-dtype last_only", lambda: c(p, last_only="yes"), TypeError, "last_only must be a bool"),
        ],
        "load_causal_lm": [
            ("wrong-type path", lambda: LM.load_causal_lm(3), TypeError, "model_path must be a str"),
            ("missing path", lambda: LM.load_causal_lm("/nonexistent/model"), FileNotFoundError, "not a folder"),
            ("wrong-type device", lambda: LM.load_causal_lm("", device=3), TypeError, "device must be"),
        ],
        "HFTokenizer": [("out-of-range tokenizer", lambda: LM.HFTokenizer(_NoEos()), ValueError, "no eos_token")],
        "parse_task_loss": [
            ("out-of-range term", lambda: LM.parse_task_loss("edit_distance+bleu"), ValueError, "unknown task loss"),
            ("wrong-type", lambda: LM.parse_task_loss(3), TypeError, "must be a str"),
            ("empty", lambda: LM.parse_task_loss(""), ValueError, "unknown task loss"),
            ("out-of-range repeat", lambda: LM.parse_task_loss("repetition+repetition"), ValueError, "repeats"),
        ],
        "task_loss_terms": [
            ("wrong-dtype hyp", lambda: LM.task_loss_terms(p.float(), p, eos_id=1, pad_id=0), TypeError, "integer"),
            ("wrong-shape hyp", lambda: LM.task_loss_terms(p[0], p, eos_id=1, pad_id=0), ValueError, r"\[B, N\]"),
            ("wrong-dtype eos_id", lambda: LM.task_loss_terms(p, p, eos_id=1.0, pad_id=0), TypeError,
             "eos_id must be an int"),
            ("wrong-dtype pad_id", lambda: LM.task_loss_terms(p, p, eos_id=1, pad_id="0"), TypeError,
             "pad_id must be an int"),
            ("wrong-shape refs", lambda: LM.task_loss_terms(p, p[:1], eos_id=1, pad_id=0), ValueError,
             "batch sizes differ"),
            ("out-of-range ngram", lambda: LM.task_loss_terms(p, p, eos_id=1, pad_id=0, ngram=0), ValueError,
             "n must be >= 1"),
            ("empty", lambda: LM.task_loss_terms(p[:0], p[:0], eos_id=1, pad_id=0), ValueError, "empty"),
        ],
        "pad_sequences": [
            ("empty", lambda: LM.pad_sequences([], 0), ValueError, "empty"),
            ("wrong-dtype pad_id", lambda: LM.pad_sequences([[1]], 0.5), TypeError, "pad_id must be an int"),
            ("out-of-range width", lambda: LM.pad_sequences([[1, 2]], 0, width=1), ValueError, "width must be >= 2"),
            ("wrong-dtype ids", lambda: LM.pad_sequences([[1.5]], 0), TypeError, "int token ids"),
            ("wrong-type", lambda: LM.pad_sequences("abc", 0), TypeError, "list of token lists"),
        ],
        "CompletionBatch": [
            ("wrong-dtype", lambda: LM.CompletionBatch(p.float(), p), ValueError, r"\[B, T\] LongTensor"),
            ("wrong-shape", lambda: LM.CompletionBatch(p, p[:1]), ValueError, "batch sizes differ"),
            ("empty", lambda: LM.CompletionBatch(p[:0], p[:0]), ValueError, "empty"),
            ("out-of-range blocks", lambda: LM.CompletionBatch(p, p, p[:, :1]), ValueError, "at least 2 tokens"),
        ],
        "CompletionTask": [
            ("out-of-range term", lambda: LM.CompletionTask("bleu", 3, 1, 0), ValueError, "unknown task loss"),
            ("out-of-range length", lambda: LM.CompletionTask("repetition", 0, 1, 0), ValueError,
             "decode_len must be >= 1"),
            ("wrong-dtype eos_id", lambda: LM.CompletionTask("repetition", 3, 1.0, 0), TypeError,
             "eos_id must be an int"),
        ],
        "window_nll": [
            ("wrong-dtype pad_id", lambda: LM.window_nll(m, p, p, 0.5), TypeError, "pad_id must be an int"),
            ("wrong-dtype eos_id", lambda: LM.window_nll(m, p, p, 0, "1"), TypeError, "eos_id must be an int"),
            ("wrong-shape", lambda: LM.window_nll(m, p, p[:1], 0), ValueError, "batch sizes differ"),
            ("wrong-dtype tokens", lambda: LM.window_nll(m, p.float(), p, 0), TypeError, "integer tensor"),
        ],
        "block_nll": [
            ("wrong-shape", lambda: LM.block_nll(m, p[:, :1]), ValueError, r"\[M, T\+1\]"),
            ("wrong-dtype", lambda: LM.block_nll(m, p.float()), TypeError, "integer token ids"),
            ("empty", lambda: LM.block_nll(m, p[:0]), ValueError, "empty"),
        ],
        "perplexity": [
            ("out-of-range batch_size", lambda: LM.perplexity(m, p, 0), ValueError, "batch_size must be >= 1"),
            ("wrong-dtype", lambda: LM.perplexity(m, p.float()), TypeError, "integer token ids"),
            ("NaN model", lambda: LM.perplexity(broken, p), ValueError, "not finite"),
        ],
        "evaluate_completions": [("wrong-type batch", lambda: LM.evaluate_completions(m, "b", task), TypeError,
                                  "CompletionBatch")],
        "completion_pairs": [
            ("out-of-range prefix_len", lambda: LM.completion_pairs("valid", tok, 0, 2), ValueError,
             "prefix_len must be >= 1"),
            ("wrong-type tokenizer", lambda: LM.completion_pairs("valid", "tok", 2, 2), TypeError, "encode_batch"),
        ],
        "heldout_blocks": [
            ("out-of-range block_size", lambda: LM.heldout_blocks("valid", tok, 0), ValueError,
             "block_size must be >= 1"),
            ("out-of-range max_blocks", lambda: LM.heldout_blocks("valid", tok, 4, max_blocks=0), ValueError,
             "max_blocks must be >= 1"),
        ],
        "load_pretrained_lm": [
            ("missing folder", lambda: LM.load_pretrained_lm(folder="/nonexistent", rebuild_if_missing=False),
             FileNotFoundError, "pretrained LM missing"),
            ("wrong-type device", lambda: LM.load_pretrained_lm(device=3), TypeError, "device must be"),
        ],
    }


EXEMPT = {"TASK_LOSSES": "constant", "PRETRAINED_DIR": "constant"}


def test_every_public_name_is_walked(models, tok):
    walked = set(cases(*models, tok))
    assert set(LM.__all__) == walked | set(EXEMPT), set(LM.__all__) ^ (walked | set(EXEMPT))


def test_bad_input_raises_clearly(models, tok):
    failures = []
    for name, items in cases(*models, tok).items():
        for category, thunk, exc, match in items:
            try:
                with pytest.raises(exc, match=match):
                    thunk()
            except BaseException as e:  # noqa: BLE001 — collect every miss, report them together
                failures.append(f"{name} [{category}]: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)


def test_hf_tokenizer_decode_takes_int_ids_only():
    class Fake:                     # the smallest Hugging Face tokenizer surface HFTokenizer uses
        eos_token_id, pad_token_id, bos_token_id = 2, None, None

        def __len__(self):
            return 10

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    hf = LM.HFTokenizer(Fake())
    assert hf.decode([1, 3]) == "1 3" and hf.decode(torch.tensor([4])) == "4"
    for bad, exc in (([1.5], TypeError), ([True], TypeError), (torch.tensor([1.0]), TypeError), ("12", TypeError)):
        with pytest.raises(exc):
            hf.decode(bad)
