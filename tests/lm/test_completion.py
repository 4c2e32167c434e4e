"""taskloss.lm.completion: the CausalLM adapter (taskloss TransformerLM and a tiny random Hugging Face GPT-2, no
download), vmappable greedy decoding against taskloss.models.generate and transformers' own generate, task-loss
terms against rapidfuzz / direct Python, the MLE window loss and perplexity against float64 direct sums, data
glue against taskloss.datasets.corpus, MGS / REINFORCE integration, bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein
from torch.func import functional_call, vmap

from taskloss.lm import (
    CausalLM,
    CompletionBatch,
    CompletionTask,
    HFTokenizer,
    evaluate_completions,
    generate,
    greedy_decode,
    load_causal_lm,
    pad_sequences,
    parse_task_loss,
    perplexity,
    task_loss_terms,
    window_nll,
)
from taskloss.lm import completion as st_
from taskloss.models import RNNLM, TransformerLM
from taskloss.search import MGS, sequence_reinforce
from helpers import mgs_step, with_surrogate

torch.set_num_threads(1)
EOS, PAD, V = 3, 0, 11


def tiny_lm(seed=0, vocab=V, max_len=32, residual="pre"):
    torch.manual_seed(seed)
    m = TransformerLM(vocab, d_model=16, n_layers=2, n_heads=2, max_len=max_len, residual=residual)
    with torch.no_grad():  # larger weights: decodes that vary and hit EOS
        for p in m.parameters():
            if p.ndim == 2:
                p.mul_(25)
    return CausalLM(m).eval()


def prefixes(B=6, P=5, seed=1, vocab=V):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (B, P), generator=g)


# ------------------------------------------------------------------------------------------ tiny HF GPT-2
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["the quick brown fox jumps over the lazy dog and the cat"] * 20, trainer)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                                  bos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(hf_tok), n_positions=24, n_embd=32, n_layer=2, n_head=2,
                                  eos_token_id=hf_tok.eos_token_id, bos_token_id=hf_tok.eos_token_id)
    model = transformers.GPT2LMHeadModel(cfg)
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    model.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


def test_hf_adapter_loads_offline_and_matches_hf(hf_folder):
    model, tok = load_causal_lm(str(hf_folder))
    assert model.kind == "hf" and isinstance(tok, HFTokenizer)
    assert model.max_len == 24 and model.vocab_size == tok.vocab_size
    assert tok.pad_id == tok.eos_id  # GPT-2 has no pad token
    ids = tok.encode("the quick fox")
    assert tok.decode(ids) == "the quick fox"
    x = torch.tensor([ids, ids[::-1]])
    full = model(x)
    torch.testing.assert_close(full, model.lm(input_ids=x).logits)
    torch.testing.assert_close(model(x, last_only=True), full[:, -1], rtol=1e-5, atol=1e-5)
    # greedy decoding equals transformers' own greedy generate (the real library as reference)
    ours = greedy_decode(model, x, 8, tok.eos_id, tok.pad_id)
    assert torch.equal(ours, greedy_decode(model, x, 8, tok.eos_id, tok.pad_id, cache=False))
    ref = model.lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False,
                            pad_token_id=tok.pad_id, eos_token_id=tok.eos_id)[:, x.shape[1]:]
    n = ref.shape[1]
    torch.testing.assert_close(ours[:, :n], ref)
    assert torch.equal(ours, generate(model, x, 8, tok.eos_id, tok.pad_id))


def test_hf_adapter_under_vmap_and_mgs(hf_folder):
    model, tok = load_causal_lm(str(hf_folder))
    x = torch.tensor([tok.encode("the lazy dog"), tok.encode("the quick fox")[:3]])
    params = {k: v.detach() for k, v in model.named_parameters()}
    noise = {k: 0.05 * torch.randn_like(v) for k, v in params.items()}
    stacked = {k: torch.stack([v, v + noise[k]]) for k, v in params.items()}
    out = vmap(lambda p: greedy_decode(lambda i, **kw: functional_call(model, p, (i,), kw),
                                       x, 5, tok.eos_id, tok.pad_id))(stacked)
    assert torch.equal(out[0], greedy_decode(model, x, 5, tok.eos_id, tok.pad_id))
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.add_(noise[k])
    assert torch.equal(out[1], greedy_decode(model, x, 5, tok.eos_id, tok.pad_id))


def test_hf_missing_folder_and_bad_model():
    with pytest.raises(FileNotFoundError):
        load_causal_lm("/nonexistent/model/folder")
    with pytest.raises(TypeError):
        load_causal_lm(3)
    with pytest.raises(TypeError):
        CausalLM(torch.nn.Linear(3, 3))
    with pytest.raises(TypeError):
        CausalLM(RNNLM(V, 8, 8))
    with pytest.raises(TypeError):
        CausalLM(tiny_lm())
    with pytest.raises(TypeError):
        CausalLM("model")


# -------------------------------------------------------------------------------------------- decoding
def test_causal_lm_last_only_matches_full_logits():
    m = tiny_lm()
    x = prefixes()
    torch.testing.assert_close(m(x, last_only=True), m(x)[:, -1])
    torch.testing.assert_close(m(x), m.lm(x))


@pytest.mark.parametrize("residual", ["pre", "post", "realformer"])
@pytest.mark.parametrize("max_len", [32, 7])
def test_greedy_decode_matches_generate(max_len, residual):
    m = tiny_lm(max_len=max_len, residual=residual)
    x = prefixes(B=16)
    free = generate(m, x, 10, None, PAD, greedy=True)
    assert torch.equal(greedy_decode(m, x, 10, None, PAD), free)
    eos = int(free[0, 3])  # a token the decodes do produce: the EOS handling is exercised
    ref = generate(m, x, 10, eos, PAD, greedy=True)
    for cache in (True, False):  # max_len=7 < P + N: the cached path falls back to recomputing (cropping)
        assert torch.equal(greedy_decode(m, x, 10, eos, PAD, cache=cache), ref)
    assert torch.equal(greedy_decode(m.lm, x, 10, eos, PAD), ref)  # a bare TransformerLM is wrapped
    is_eos = ref == eos
    assert bool(is_eos[0].any())
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # after the first EOS everything is PAD
    assert bool(after.any()) and bool((ref[after] == PAD).all())


@pytest.mark.parametrize("max_len", [32, 7])
def test_sampled_generate_through_the_adapter_matches_the_bare_model(max_len):
    # generate() on a CausalLM decodes through the adapter's key/value cache (max_len=32) or recomputes the
    # cropped context (max_len=7); either way the same generator draws the same samples as the bare model.
    m = tiny_lm(max_len=max_len)
    x = prefixes(B=16)
    a = generate(m, x, 10, EOS, PAD, greedy=False, generator=torch.Generator().manual_seed(5))
    b = generate(m.lm, x, 10, EOS, PAD, greedy=False, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    assert len(set(a.flatten().tolist())) > 3   # real samples, not a constant decode


def test_cached_decoding_is_exact_on_long_continuations():
    m = tiny_lm(max_len=64, residual="realformer")
    with torch.no_grad():
        for p in m.parameters():
            p.div_(5)  # milder weights: long non-degenerate continuations
    x = prefixes(B=8, P=9)
    a = greedy_decode(m, x, 40, None, PAD, cache=True)
    assert torch.equal(a, greedy_decode(m, x, 40, None, PAD, cache=False))
    assert len(set(a.flatten().tolist())) > 3


@pytest.mark.parametrize("cache", [True, False])
def test_greedy_decode_vmaps_over_candidates(cache):
    m = tiny_lm()
    x = prefixes()
    params = {k: v.detach() for k, v in m.named_parameters()}
    g = torch.Generator().manual_seed(3)
    stacked = {k: torch.stack([v + 0.3 * torch.randn(v.shape, generator=g) for _ in range(3)])
               for k, v in params.items()}
    out = vmap(lambda p: greedy_decode(lambda i, **kw: functional_call(m, p, (i,), kw), x, 8, EOS, PAD,
                                       cache=cache))(stacked)
    for k in range(3):
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(stacked[n][k])
        assert torch.equal(out[k], generate(m, x, 8, EOS, PAD))


def test_greedy_decode_bad_input():
    m = tiny_lm()
    with pytest.raises(ValueError):
        greedy_decode(m, torch.zeros(0, 3, dtype=torch.long), 4, EOS, PAD)
    with pytest.raises(TypeError):
        greedy_decode(m, torch.zeros(2, 3), 4, EOS, PAD)
    with pytest.raises(ValueError):
        greedy_decode(m, torch.full((2, 3), V), 4, EOS, PAD)
    with pytest.raises(ValueError):
        greedy_decode(m, prefixes(), 0, EOS, PAD)
    with pytest.raises(TypeError):
        greedy_decode("m", prefixes(), 2, EOS, PAD)
    with pytest.raises(ValueError):
        greedy_decode(m, prefixes(), 2, EOS, -1)


# ----------------------------------------------------------------------------------------- task losses
def _cut(row, eos, pad):
    out = []
    for t in row:
        if t in (eos, pad):
            break
        out.append(t)
    return out


def _direct_terms(hyp_rows, ref_rows, eos, pad, n=4):
    res = {k: [] for k in st_.TASK_LOSSES}
    for h_full, r_full in zip(hyp_rows, ref_rows):
        h, r = _cut(h_full, eos, pad), _cut(r_full, eos, pad)
        d = Levenshtein.distance(h, r)
        res["edit_distance"].append(min(d / max(len(r), 1), 1.0) if (r or h) else 0.0)
        grams = [tuple(h[i:i + n]) for i in range(len(h) - n + 1)]
        res["repetition"].append(1 - len(set(grams)) / len(grams) if grams else 0.0)
        res["token_repeat_rate"].append(sum(h[i] in h[:i] for i in range(len(h))) / len(h) if h else 0.0)
        res["non_termination"].append(0.0 if eos in h_full else 1.0)
    return {k: np.asarray(v) for k, v in res.items()}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 9), st.integers(0, 10_000))
def test_task_loss_terms_match_direct(B, N, C, seed):
    g = torch.Generator().manual_seed(seed)
    hyp = torch.randint(3, 7, (B, N), generator=g)     # small alphabet: repeats; EOS = 3 occurs
    is_eos = hyp == EOS
    after = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    hyp[after] = PAD
    ref = torch.randint(4, 8, (B, C), generator=g)
    lens = torch.randint(0, C + 1, (B,), generator=g)
    ref[torch.arange(C)[None, :] >= lens[:, None]] = PAD
    got = task_loss_terms(hyp, ref, eos_id=EOS, pad_id=PAD)
    want = _direct_terms(hyp.tolist(), ref.tolist(), EOS, PAD)
    for k in st_.TASK_LOSSES:
        np.testing.assert_allclose(got[k].double().numpy(), want[k], atol=1e-6, err_msg=k)
        assert bool(((got[k] >= 0) & (got[k] <= 1)).all())
    task = CompletionTask("edit_distance+repetition", N, EOS, PAD)
    torch.testing.assert_close(task.per_sequence(hyp, ref), got["edit_distance"] + got["repetition"])
    batch = CompletionBatch(torch.ones(B, 2, dtype=torch.long), ref)
    torch.testing.assert_close(task.batch_task_loss(hyp, batch), (got["edit_distance"] + got["repetition"]).mean())


def test_parse_task_loss_and_task_bad_input():
    assert parse_task_loss("edit_distance") == ("edit_distance",)
    assert parse_task_loss(" repetition + non_termination ") == ("repetition", "non_termination")
    for bad in ("", "bleu", "edit_distance+edit_distance", "repetition+"):
        with pytest.raises(ValueError):
            parse_task_loss(bad)
    with pytest.raises(TypeError):
        parse_task_loss(["repetition"])
    with pytest.raises(ValueError):
        CompletionTask("repetition", 0, EOS, PAD)
    with pytest.raises(ValueError):
        task_loss_terms(torch.zeros(2, 3, dtype=torch.long), [[1]], eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError):
        task_loss_terms(torch.zeros(3, dtype=torch.long), [[1]], eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError):
        task_loss_terms(torch.zeros(0, 3, dtype=torch.long), [], eos_id=EOS, pad_id=PAD)
    with pytest.raises(ValueError):
        task_loss_terms(torch.zeros(1, 3, dtype=torch.long), [[1]], eos_id=EOS, pad_id=PAD, names=["bleu"])
    with pytest.raises(ValueError):
        CompletionBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        CompletionBatch(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.long))


def test_pad_sequences():
    t = pad_sequences([[1, 2], [3], [4, 5, 6]], pad_id=0)
    assert t.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert pad_sequences([[1]], 9, width=3).tolist() == [[1, 9, 9]]
    with pytest.raises(ValueError):
        pad_sequences([], 0)
    with pytest.raises(ValueError):
        pad_sequences([[1, 2]], 0, width=1)


# ---------------------------------------------------------------------------------- MLE and perplexity
def test_window_nll_matches_float64_direct():
    m = tiny_lm()
    pre = prefixes(B=4, P=3)
    refs = torch.tensor([[5, 6, 7, 8], [5, EOS, PAD, PAD], [9, PAD, PAD, PAD], [EOS, 4, 4, 4]])
    got = window_nll(m, pre, refs, PAD, EOS)
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(4):
            r = refs[b].tolist()
            keep = []
            for t in r:
                if t == PAD:
                    break
                keep.append(t)
                if t == EOS:
                    break
            win = pre[b].tolist() + keep
            logp = F.log_softmax(m(torch.tensor([win[:-1]])).double()[0], -1)
            total -= sum(float(logp[i, win[i + 1]]) for i in range(len(win) - 1))
            count += len(win) - 1
    assert math.isclose(float(got.detach()), total / count, rel_tol=1e-5)
    got.backward()
    assert all(p.grad is not None for p in m.parameters())
    with pytest.raises(ValueError):
        window_nll(m, pre, refs[:2], PAD)


def test_block_nll_and_surrogate_choice():
    m = tiny_lm()
    blocks = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(1))
    got = st_.block_nll(m, blocks)
    with torch.no_grad():
        lp = F.log_softmax(m(blocks[:, :-1]).double(), -1).gather(-1, blocks[:, 1:, None]).squeeze(-1)
    assert math.isclose(float(got.detach()), -float(lp.mean()), rel_tol=1e-5)
    task = CompletionTask("repetition", 4, EOS, PAD)
    pre, refs = prefixes(B=3), torch.randint(4, V, (3, 4))
    with torch.no_grad():
        assert math.isclose(float(task.surrogate_loss(m, CompletionBatch(pre, refs, blocks))), float(got), rel_tol=1e-6)
        assert math.isclose(float(task.surrogate_loss(m, CompletionBatch(pre, refs))),
                            float(window_nll(m, pre, refs, PAD, EOS)), rel_tol=1e-6)
    b = CompletionBatch(pre, refs, blocks)
    assert b[1:].blocks is blocks and len(b[1:]) == 2
    for bad in (blocks[:, :1], blocks[0], torch.zeros(0, 3, dtype=torch.long)):
        with pytest.raises(ValueError):
            st_.block_nll(m, bad)
    with pytest.raises(ValueError):
        CompletionBatch(pre, refs, blocks[:, :1])
    with pytest.raises(ValueError):
        CompletionBatch(pre, refs, blocks.float())


def test_perplexity_matches_direct():
    m = tiny_lm()
    blocks = torch.randint(0, V, (5, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp = F.log_softmax(m(blocks[:, :-1]).double(), -1).gather(-1, blocks[:, 1:, None]).squeeze(-1)
    want = math.exp(-float(lp.mean()))
    assert math.isclose(perplexity(m, blocks, batch_size=2), want, rel_tol=1e-5)
    for bad in (blocks[:, :1], torch.zeros(0, 4, dtype=torch.long), blocks[0]):
        with pytest.raises(ValueError):
            perplexity(m, bad)


def test_evaluate_completions():
    m = tiny_lm()
    pre = prefixes(B=7)
    refs = torch.randint(4, V, (7, 6))
    task = CompletionTask("edit_distance+repetition", 6, EOS, PAD)
    res, hyp = evaluate_completions(m, CompletionBatch(pre, refs), task, batch_size=3)
    assert torch.equal(hyp, greedy_decode(m, pre, 6, EOS, PAD))
    terms = task.terms(hyp, refs)
    for k in st_.TASK_LOSSES:
        assert math.isclose(res[k], float(terms[k].mean()), rel_tol=1e-6)
    assert math.isclose(res["task_loss"], res["edit_distance"] + res["repetition"], rel_tol=1e-6)
    with pytest.raises(TypeError):
        evaluate_completions(m, (pre, refs), task)


# ------------------------------------------------------------------------------------------- data glue
@pytest.fixture(scope="module")
def wiki_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wikitext")
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rng = np.random.default_rng(0)
    for split in ("train", "valid", "test"):
        lines = []
        for d in range(4):
            lines += ["", f" = {split} doc {d} = ", ""]
            for _ in range(3):
                lines.append(" " + " ".join(rng.choice(words, size=int(rng.integers(3, 30)))) + " . ")
        (folder / f"wiki.{split}.raw").write_text("\n".join(lines) + "\n")
    return folder


class _DuckTokenizer:
    """A taskloss Tokenizer seen through the generic interface (forces the glue path)."""

    def __init__(self, tok):
        self.tok, self.eos_id, self.pad_id = tok, tok.eos_id, tok.pad_id

    def encode_batch(self, texts):
        return self.tok.encode_batch(texts)


@pytest.mark.parametrize("with_eos", [False, True])
def test_completion_pairs_glue_matches_text_module(wiki_folder, with_eos):
    from taskloss.datasets import corpus

    tok = corpus.get_tokenizer(path=wiki_folder, cache=False)
    a = st_.completion_pairs("train", tok, 4, 6, max_items=7, path=wiki_folder, with_eos=with_eos)
    pre, conts = corpus.prefix_continuations("train", 4, 6, tok, max_items=7, path=wiki_folder, with_eos=with_eos)
    assert torch.equal(a.prefixes, pre)
    assert torch.equal(a.refs, pad_sequences(conts, tok.pad_id))
    b = st_.completion_pairs("train", _DuckTokenizer(tok), 4, 6, max_items=7, path=wiki_folder, with_eos=with_eos)
    assert torch.equal(a.prefixes, b.prefixes) and torch.equal(a.refs, b.refs)
    blocks = st_.heldout_blocks("valid", tok, 8, path=wiki_folder, max_blocks=3)
    assert torch.equal(blocks, corpus.lm_blocks("valid", 8, tok, path=wiki_folder)[:3])
    assert torch.equal(st_.heldout_blocks("valid", _DuckTokenizer(tok), 8, path=wiki_folder, max_blocks=3), blocks)


def test_completion_pairs_with_hf_tokenizer(wiki_folder, hf_folder):
    _, tok = load_causal_lm(str(hf_folder))
    batch = st_.completion_pairs("valid", tok, 3, 4, path=wiki_folder)
    assert batch.prefixes.shape[1] == 3 and batch.refs.shape[1] == 4
    from taskloss.datasets import load_corpus

    first = next(ids for ids in tok.encode_batch(load_corpus("valid", wiki_folder)) if len(ids) >= 7)
    assert batch.prefixes[0].tolist() == first[:3] and batch.refs[0].tolist() == first[3:7]


def test_data_bad_input(wiki_folder):
    from taskloss.datasets import corpus

    tok = corpus.get_tokenizer(path=wiki_folder, cache=False)
    with pytest.raises(ValueError):
        st_.completion_pairs("train", tok, 0, 4, path=wiki_folder)
    with pytest.raises(ValueError):
        st_.completion_pairs("train", _DuckTokenizer(tok), 500, 500, path=wiki_folder)
    with pytest.raises(TypeError):
        st_.completion_pairs("train", object(), 4, 4, path=wiki_folder)
    with pytest.raises(ValueError):
        st_.heldout_blocks("train", tok, 0, path=wiki_folder)
    with pytest.raises(ValueError):
        st_.heldout_blocks("train", _DuckTokenizer(tok), 10 ** 7, path=wiki_folder)


# ----------------------------------------------------------------------------------------- optimizers
def test_mgs_step_on_completion_task_vmap_equals_loop():
    task = CompletionTask("edit_distance+repetition", 6, EOS, PAD)
    batch = CompletionBatch(prefixes(B=8), torch.randint(4, V, (8, 6), generator=torch.Generator().manual_seed(5)))
    stats = []
    for parallel in (True, False):
        m = tiny_lm()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        mgs = with_surrogate(MGS(m, opt, task.batch_task_loss, forward_fn=task.decode, n_samples=4, alpha=0.05,
                                 sigma=1.0, parallel=parallel, vmap_task_loss=False, seed=0), task.surrogate_loss)
        stats.append((mgs_step(mgs, batch), [p.detach().clone() for p in m.parameters()]))
    (s_v, p_v), (s_l, p_l) = stats
    assert s_v.evaluation == "vmap_forward" and s_l.evaluation == "loop"
    torch.testing.assert_close(s_v.task_losses, s_l.task_losses)
    assert math.isclose(s_v.base_loss, float(task.batch_task_loss(greedy_decode(tiny_lm(), batch.prefixes, 6, EOS,
                                                                                PAD), batch)), rel_tol=1e-6)
    for a, b in zip(p_v, p_l):
        torch.testing.assert_close(a, b)


def test_sequence_reinforce_with_adapter_and_task():
    m = tiny_lm()
    task = CompletionTask("repetition+edit_distance", 6, EOS, PAD)
    pre = prefixes(B=4)
    refs = torch.randint(4, V, (4, 6))
    res = sequence_reinforce(m, pre, refs, task.per_sequence, n_samples=3, max_new_tokens=6, eos_id=EOS,
                             pad_id=PAD, baseline="loo", generator=torch.Generator().manual_seed(0))
    assert res.samples.shape == (3, 4, 6)
    want = -task.per_sequence(res.samples.reshape(12, 6), refs.repeat(3, 1)).reshape(3, 4)
    torch.testing.assert_close(res.rewards, want.to(res.rewards.dtype))
    res.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
