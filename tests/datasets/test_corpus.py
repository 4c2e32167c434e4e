"""Text data: default corpus, WikiText reader, compact MiniLM tokenizer, LM blocks, prefix/continuation
pairs, MiniLM embeddings (against transformers / sentence-transformers) and the committed pretrained LM."""
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from taskloss.datasets import (
    SPLITS,
    Tokenizer,
    corpus,
    corpus_hash,
    get_tokenizer,
    lm_blocks,
    load_corpus,
    load_documents,
    prefix_continuations,
)
from taskloss.datasets import tokenizer as tokenizer_module
from taskloss.datasets.stdlib_corpus import clean_paragraphs, split_of


# ------------------------------------------------------------------------------------------------ corpus
def test_default_corpus_splits_are_disjoint_prose():
    titles = {s: {d.title for d in load_documents(s)} for s in SPLITS}
    assert all(titles.values())
    assert not (titles["train"] & titles["valid"] or titles["train"] & titles["test"] or titles["valid"] & titles["test"])
    for s in SPLITS:
        assert all(split_of(t) == s for t in titles[s])
    lines = load_corpus("train")
    assert len(lines) > 3000 and sum(len(x.split()) for x in lines) > 80_000
    assert len(load_corpus("valid")) > 300 and len(load_corpus("test")) > 300
    for line in lines:
        assert "\n" not in line and line == " ".join(line.split())
        assert ">>>" not in line and "::=" not in line and "+--" not in line
    # both sources are present: language-reference topics and stdlib docstrings
    assert any(t.startswith("topics/") for t in titles["train"]) and any(t.startswith("stdlib/") for t in titles["train"])


def test_corpus_is_deterministic_when_rebuilt(monkeypatch, tmp_path):
    import inspect

    assert inspect.getfile.__module__ != "inspect"  # torch (imported here) patches the standard library ...
    assert "stdlib/inspect.getfile" in {d.title for s in SPLITS for d in load_documents(s)}  # ... not the corpus
    h = corpus_hash()
    corpus._default_documents.cache_clear()
    monkeypatch.setattr(corpus, "CACHE_DIR", tmp_path)  # no disk cache: rebuilt from the stdlib
    try:
        assert corpus_hash() == h
        assert list(tmp_path.glob("corpus-*.json"))  # and the rebuilt corpus was cached
    finally:
        corpus._default_documents.cache_clear()


def test_split_assignment_is_a_fixed_hash():
    # sha256-based, so independent of PYTHONHASHSEED and of iteration order
    assert [split_of(t) for t in ("topics/assert/assert", "stdlib/json.dumps", "x", "y", "z")] == \
        [split_of(t) for t in ("topics/assert/assert", "stdlib/json.dumps", "x", "y", "z")]
    counts = Counter(split_of(f"doc{i}") for i in range(5000))
    assert abs(counts["train"] / 5000 - 0.8) < 0.03 and abs(counts["valid"] / 5000 - 0.1) < 0.02


def test_clean_paragraphs_drops_code_tables_grammar():
    src = """Title
*****

The first paragraph is plain prose and it
spans two lines with *emphasis* here.[1]

   >>> x = 1
   >>> print(x)

   assert_stmt ::= "assert" expression

+------+------+
| a    | b    |
+------+------+

1. A list item that is written in plain words
   and continues on the next line.

      def f(x):
          return x + 1

   A second paragraph inside the list item is also kept.

Short one.
"""
    assert clean_paragraphs(src) == [
        "The first paragraph is plain prose and it spans two lines with emphasis here.",
        "A list item that is written in plain words and continues on the next line.",
        "A second paragraph inside the list item is also kept.",
    ]


WIKI = """ 
 = Alpha Page = 
 
 The alpha page starts here , with a 1 @,@ 000 @-@ word intro . 
 
 = = Section = = 
 
 Second paragraph of alpha . 
 
 = Beta Page = 
 
 Beta has one line only . 
 
 = = = Deep = = = 
 
"""


def _write_wikitext(folder):
    folder.mkdir()
    (folder / "wiki.train.raw").write_text(WIKI, encoding="utf-8")
    (folder / "wiki.valid.raw").write_text(" = Gamma = \n \n Gamma text line . \n", encoding="utf-8")
    (folder / "wiki.test.raw").write_text(" = Delta = \n \n Delta text line . \n", encoding="utf-8")
    return folder


def test_wikitext_folder(tmp_path):
    folder = _write_wikitext(tmp_path / "wt")
    docs = load_documents("train", folder)
    assert [d.title for d in docs] == ["Alpha Page", "Beta Page"]
    assert docs[0].lines == ("The alpha page starts here , with a 1,000-word intro .", "Second paragraph of alpha .")
    assert load_corpus("valid", folder) == ["Gamma text line ."]
    assert load_corpus("test", str(folder)) == ["Delta text line ."]
    stats = corpus.corpus_stats(folder)
    assert stats["train"] == {"docs": 2, "lines": 3, "words": 11 + 5 + 6}
    tk = get_tokenizer(path=folder, cache=False)
    assert tk.decode(tk.encode("beta has one line only.")) == "beta has one line only."
    assert tk.encode("zebra") == [tk.unk_id]
    blocks = lm_blocks("train", 4, tk, path=folder)
    assert blocks.shape[1] == 5 and (blocks == tk.eos_id).any()


def test_wikitext_single_file_is_split_by_title_hash(tmp_path):
    f = tmp_path / "wiki.raw"
    f.write_text(WIKI, encoding="utf-8")
    got = {s: [d.title for d in load_documents(s, f)] for s in SPLITS}
    assert sorted(sum(got.values(), [])) == ["Alpha Page", "Beta Page"]
    assert all(split_of(t) == s for s, ts in got.items() for t in ts)
    empty = next(s for s, ts in got.items() if not ts)  # two documents cannot fill three splits
    with pytest.raises(ValueError, match="empty"):
        load_corpus(empty, f)


def test_wikitext_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus("train", tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="wiki.train.raw"):
        load_corpus("train", tmp_path / "empty")


def test_unknown_split():
    for fn in (load_corpus, load_documents):
        with pytest.raises(ValueError, match="unknown split"):
            fn("dev")


# --------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_vocab_and_specials(tok):
    assert 3000 < tok.vocab_size < 12000
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.tokens[:4] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    bert = tok.bert_ids
    assert bert.dtype == torch.long and bert.shape == (tok.vocab_size,)
    assert bert[:4].tolist() == [0, 100, 101, 102] and bool((bert[1:] > bert[:-1]).all())
    vocab = (tokenizer_module.minilm_path() / "vocab.txt").read_text("utf-8").splitlines()
    assert [vocab[i] for i in bert.tolist()] == tok.tokens  # row i of our vocab is MiniLM's token bert_ids[i]


def test_tokenizer_covers_train_and_roundtrips(tok):
    enc = tok.encode_batch(load_corpus("train")[:500])
    assert all(tok.unk_id not in ids for ids in enc)  # min_count=1: every training token is in the vocab
    valid = [i for ids in tok.encode_batch(load_corpus("valid")) for i in ids]
    assert np.mean(np.array(valid) == tok.unk_id) < 0.03
    s = "the return value of a function is the value of its return statement."
    ids = tok.encode(s, add_eos=True, add_bos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == s
    assert tok.decode(torch.tensor(ids), skip_special_tokens=False).startswith("[CLS] the return")
    assert tok.encode("The RETURN Value") == tok.encode("the return value")  # lowercased


def test_tokenizer_matches_wordpiece_ids(tok):
    wp = tokenizer_module._wordpiece()
    s = max(load_corpus("valid"), key=len)
    ref = wp.encode(s, add_special_tokens=False).ids
    assert tok.bert_ids[torch.tensor(tok.encode(s))].tolist() == [i if i in set(tok.bert_ids.tolist()) else 100
                                                                  for i in ref]
    assert len(ref) > 128  # no hidden truncation at MiniLM's 128 tokens (the longest valid line)


def test_tokenizer_save_load_and_cache(tok, tmp_path):
    p = tok.save(tmp_path / "t.json")
    t2 = Tokenizer.load(p)
    assert t2.hash == tok.hash and t2.tokens == tok.tokens
    d = json.loads(p.read_text())
    d["tokens"][5] = "notatoken"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="do not match"):
        Tokenizer.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing.json")
    assert get_tokenizer(cache=False).hash == tok.hash  # rebuilt from scratch: same vocabulary


def test_tokenizer_bad_inputs(tok):
    with pytest.raises(TypeError):
        tok.encode(["a list"])
    with pytest.raises(TypeError):
        tok.encode_batch("a str")
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([0, tok.vocab_size])
    with pytest.raises(ValueError):
        tok.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="strictly increasing"):
        Tokenizer([0, 100, 101, 102, 2000, 1999])
    with pytest.raises(ValueError, match="min_count"):
        get_tokenizer(min_count=0)
    with pytest.raises(ValueError, match="empty"):
        Tokenizer.build([])


# ---------------------------------------------------------------------------------------------- LM data
def test_lm_blocks_are_the_eos_joined_stream(tok):
    blocks = lm_blocks("valid", 32, tok)
    stream = [t for ids in tok.encode_batch(load_corpus("valid")) for t in (*ids, tok.eos_id)]
    assert blocks.dtype == torch.long and blocks.shape == ((len(stream) - 1) // 32, 33)
    assert torch.equal(blocks[:, -1][:-1], blocks[1:, 0])  # consecutive blocks share one boundary token
    flat = torch.cat([blocks[:, :-1].reshape(-1), blocks[-1, -1:]])
    assert flat.tolist() == stream[: len(flat)]
    assert int(blocks.max()) < tok.vocab_size and (blocks == tok.eos_id).any()


def test_lm_blocks_bad_inputs(tok):
    with pytest.raises(ValueError, match="block_size"):
        lm_blocks("train", 0, tok)
    with pytest.raises(ValueError, match="unknown split"):
        lm_blocks("dev", 8, tok)
    with pytest.raises(ValueError, match="too few"):
        lm_blocks("valid", 10**7, tok)
    with pytest.raises(TypeError, match="Tokenizer"):
        lm_blocks("valid", 8, object())


def test_prefix_continuations(tok):
    P, C = 12, 10
    prefixes, conts = prefix_continuations("valid", P, C, tok)
    encoded = [tuple(ids) for ids in tok.encode_batch(load_corpus("valid")) if len(ids) >= P + C]
    assert prefixes.shape == (len(encoded), P) and len(conts) == len(encoded) > 50
    for p, c, ids in zip(prefixes.tolist(), conts, encoded):
        assert len(c) == C and tuple(p + c) == ids[: P + C]
    p5, c5 = prefix_continuations("valid", P, C, tok, max_items=5)
    assert torch.equal(p5, prefixes[:5]) and c5 == conts[:5]
    pe, ce = prefix_continuations("valid", P, C, tok, with_eos=True)
    assert len(ce) > len(conts) and any(c[-1] == tok.eos_id for c in ce)
    assert all(len(c) <= C + 1 and (len(c) <= C or c[-1] == tok.eos_id) for c in ce)


def test_prefix_continuations_bad_inputs(tok):
    with pytest.raises(ValueError):
        prefix_continuations("valid", 0, 5, tok)
    with pytest.raises(ValueError):
        prefix_continuations("valid", 5, 0, tok)
    with pytest.raises(ValueError):
        prefix_continuations("valid", 5, 5, tok, max_items=0)
    with pytest.raises(ValueError, match="no line"):
        prefix_continuations("valid", 10**6, 5, tok)
    with pytest.raises(ValueError, match="unknown split"):
        prefix_continuations("nope", 5, 5, tok)


def test_unigram_perplexity_matches_direct_float64(tok):
    train = [t for ids in tok.encode_batch(load_corpus("train")) for t in (*ids, tok.eos_id)]
    valid = [t for ids in tok.encode_batch(load_corpus("valid")) for t in (*ids, tok.eos_id)]
    counts = np.bincount(train, minlength=tok.vocab_size).astype(np.float64) + 1.0
    ref = math.exp(-np.log(counts / counts.sum())[valid].mean())
    assert corpus.unigram_perplexity("valid", tok) == pytest.approx(ref, rel=1e-10)


# ------------------------------------------------------------------------------------------------ MiniLM


# ------------------------------------------------------------------------------------- pretrained LM


