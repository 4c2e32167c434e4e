"""Bad input across ``taskloss.datasets``' public API: every name in ``__all__`` is walked with NaN, empty,
wrong-shape, wrong-dtype and out-of-range inputs and must raise a clear exception (type and message); corrupt
files name themselves; text that the tokenizer cannot represent is reported, not silently turned into
``[UNK]``."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import taskloss.datasets as D

NAN = float("nan")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "corrupt.json").write_text("{not json", encoding="utf-8")
    (tmp / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp / "list.json").write_text("[1, 2]", encoding="utf-8")
    (tmp / "ids.json").write_text(json.dumps({"bert_ids": "abc", "tokens": [], "sha256": ""}), encoding="utf-8")
    (tmp / "latin1").mkdir()
    (tmp / "latin1" / "wiki.train.raw").write_bytes(" = Caf\xe9 = \n A caf\xe9 text . \n".encode("latin-1"))
    return tmp


def cases(tok, files):
    """name -> [(category, thunk, exception type, message regex)]"""
    return {
        "Tokenizer": [
            ("wrong-dtype decode ids", lambda: tok.decode([1.5, 2]), TypeError, "token ids must be ints"),
            ("wrong-dtype bool ids", lambda: tok.decode([True, 2]), TypeError, "token ids must be ints"),
            ("wrong-dtype float tensor", lambda: tok.decode(torch.tensor([1.0, 2.0])), TypeError, "integer tensor"),
            ("wrong-dtype bool tensor", lambda: tok.decode(torch.tensor([True])), TypeError, "integer tensor"),
            ("wrong-type str ids", lambda: tok.decode("123"), TypeError, "sequence of int"),
            ("wrong-shape ids", lambda: tok.decode(torch.zeros(2, 2, dtype=torch.long)), ValueError, "1-D"),
            ("out-of-range ids", lambda: tok.decode([tok.vocab_size]), ValueError, r"must lie in \[0, "),
            ("out-of-range negative ids", lambda: tok.decode([-1]), ValueError, r"must lie in \[0, "),
            ("wrong-type build lines", lambda: D.Tokenizer.build("abc"), TypeError, "not a single str"),
            ("wrong-dtype build lines", lambda: D.Tokenizer.build([1, 2]), TypeError, "only str"),
            ("empty build", lambda: D.Tokenizer.build([]), ValueError, "empty"),
            ("out-of-range min_count", lambda: D.Tokenizer.build(["a"], 0), ValueError, "min_count must be >= 1"),
            ("wrong-dtype bert_ids", lambda: D.Tokenizer([0.0, 100, 101, 102]), TypeError, "int WordPiece ids"),
            ("empty bert_ids", lambda: D.Tokenizer([0]), ValueError, "special tokens"),
            ("out-of-order bert_ids", lambda: D.Tokenizer([0, 100, 101, 102, 2000, 1999]), ValueError,
             "strictly increasing"),
            ("wrong-type encode", lambda: tok.encode(["x"]), TypeError, "text must be a str"),
            ("wrong-type encode_batch", lambda: tok.encode_batch("x"), TypeError, "sequence of str"),
            ("corrupt JSON", lambda: D.Tokenizer.load(files / "corrupt.json"), ValueError,
             r"corrupt\.json: not a tokenizer JSON file"),
            ("non-UTF-8 JSON", lambda: D.Tokenizer.load(files / "binary.json"), ValueError,
             r"binary\.json: not a tokenizer JSON file \(UnicodeDecodeError"),
            ("wrong-shape JSON", lambda: D.Tokenizer.load(files / "list.json"), ValueError,
             r"list\.json: not a taskloss tokenizer file"),
            ("wrong-dtype JSON ids", lambda: D.Tokenizer.load(files / "ids.json"), ValueError,
             r"ids\.json: invalid tokenizer"),
            ("missing file", lambda: D.Tokenizer.load(files / "nope.json"), FileNotFoundError, "does not exist"),
        ],
        "load_corpus": [
            ("out-of-range split", lambda: D.load_corpus("dev"), ValueError, "unknown split"),
            ("wrong-type path", lambda: D.load_corpus("train", 3), TypeError, "path must be None"),
            ("non-UTF-8 WikiText", lambda: D.load_corpus("train", files / "latin1"), ValueError,
             r"latin1/wiki\.train\.raw is not UTF-8"),
            ("missing path", lambda: D.load_corpus("train", files / "nope"), FileNotFoundError, "does not exist"),
            ("empty folder", lambda: D.load_corpus("valid", files), FileNotFoundError, r"no wiki\.valid\.raw"),
        ],
        "load_documents": [
            ("out-of-range split", lambda: D.load_documents("dev"), ValueError, "unknown split"),
            ("wrong-type path", lambda: D.load_documents("train", 1.5), TypeError, "path must be None"),
        ],
        "corpus_hash": [("wrong-type path", lambda: D.corpus_hash(5), TypeError, "path must be None")],
        "corpus_stats": [("missing path", lambda: D.corpus_stats(files / "nope"), FileNotFoundError,
                          "does not exist")],
        "get_tokenizer": [
            ("out-of-range min_count", lambda: D.get_tokenizer(min_count=0), ValueError, "min_count must be >= 1"),
            ("wrong-dtype cache", lambda: D.get_tokenizer(cache="no"), TypeError, "cache must be a bool"),
        ],
        "lm_blocks": [
            ("out-of-range block_size", lambda: D.lm_blocks("train", 0, tok), ValueError, "block_size must be >= 1"),
            ("wrong-dtype block_size", lambda: D.lm_blocks("train", 2.0, tok), TypeError, "block_size must be an int"),
            ("wrong-type tokenizer", lambda: D.lm_blocks("train", 4, "tok"), TypeError, "Tokenizer"),
            ("out-of-range split", lambda: D.lm_blocks("dev", 4, tok), ValueError, "unknown split"),
            ("out-of-range size", lambda: D.lm_blocks("valid", 10 ** 8, tok), ValueError, "too few"),
        ],
        "prefix_continuations": [
            ("out-of-range prefix_len", lambda: D.prefix_continuations("valid", 0, 2, tok), ValueError,
             "prefix_len must be >= 1"),
            ("out-of-range max_items", lambda: D.prefix_continuations("valid", 2, 2, tok, max_items=0), ValueError,
             "max_items must be >= 1"),
            ("wrong-dtype with_eos", lambda: D.prefix_continuations("valid", 2, 2, tok, with_eos="yes"), TypeError,
             "with_eos must be a bool"),
            ("empty result", lambda: D.prefix_continuations("valid", 10 ** 6, 2, tok), ValueError, "no line"),
        ],
        "unigram_perplexity": [
            ("out-of-range split", lambda: D.unigram_perplexity("dev", tok), ValueError, "unknown split"),
            ("wrong-type tokenizer", lambda: D.unigram_perplexity("valid", None), TypeError, "Tokenizer"),
        ],
        "Document": [
            ("wrong-type title", lambda: D.Document(3, ("a",)), TypeError, "title must be a str"),
            ("wrong-type lines", lambda: D.Document("t", "a line"), TypeError, "lines must be a tuple of str"),
        ],
        "load_digits_splits": [
            ("out-of-range seed", lambda: D.load_digits_splits(-1), ValueError, "seed must be >= 0"),
            ("wrong-dtype seed", lambda: D.load_digits_splits(0.5), TypeError, "seed must be an int"),
        ],
        "digits_images": [
            ("wrong-shape features", lambda: D.digits_images(torch.zeros(3, 63)), ValueError, "64 features"),
            ("wrong-shape ndim", lambda: D.digits_images(torch.zeros(3, 1, 64)), ValueError, "ndim"),
            ("wrong-type", lambda: D.digits_images([[0.0] * 64]), TypeError, "torch.Tensor"),
            ("NaN", lambda: D.digits_images(torch.full((2, 64), NAN)), ValueError, "NaN"),
        ],
        "split_indices": [
            ("empty", lambda: D.split_indices(np.zeros(0, dtype=np.int64)), ValueError, "non-empty 1-D"),
            ("wrong-shape", lambda: D.split_indices(np.zeros((2, 2), dtype=np.int64)), ValueError, "non-empty 1-D"),
            ("wrong-dtype labels", lambda: D.split_indices(np.array([0.5, 1.5])), TypeError, "integer class labels"),
            ("out-of-range fractions", lambda: D.split_indices(np.zeros(5, dtype=np.int64), fractions=(0.5,) * 3),
             ValueError, "summing to 1"),
            ("NaN fractions", lambda: D.split_indices(np.zeros(5, dtype=np.int64), fractions=(NAN, 0.5, 0.5)),
             ValueError, "summing to 1"),
        ],
        "indices_checksum": [
            ("empty", lambda: D.indices_checksum({"train": np.zeros(2, dtype=np.int64)}), ValueError,
             "exactly the keys"),
            ("wrong-dtype", lambda: D.indices_checksum({"train": np.array([0.5]), "valid": np.zeros(1, np.int64),
                                                         "test": np.zeros(1, np.int64)}), TypeError, "integers"),
        ],
        "minilm_token_embeddings": [("wrong-type tokenizer", lambda: D.minilm_token_embeddings("x"), TypeError,
                                     "Tokenizer")],
        "sentence_embeddings": [
            ("wrong-type texts", lambda: D.sentence_embeddings("abc"), TypeError, "sequence of str"),
            ("empty", lambda: D.sentence_embeddings([]), ValueError, "empty"),
            ("out-of-range batch_size", lambda: D.sentence_embeddings(["a"], 0), ValueError, "batch_size must be >= 1"),
        ],
        "load_minilm": [("wrong-type device", lambda: D.load_minilm(3), TypeError, "device must be a str")],
    }


EXEMPT = {   # constants, a result record and a warning class: nothing to validate
    "N_DIGITS": "constant", "N_FEATURES": "constant", "N_CLASSES": "constant", "SPLIT_FRACTIONS": "constant",
    "SPLITS": "constant", "CACHE_DIR": "constant", "MAX_UNK_RATE": "constant", "SPECIAL_TOKENS": "constant",
    "DEFAULT_MIN_COUNT": "constant", "DigitsSplits": "result record of load_digits_splits",
    "UnknownTokenWarning": "warning class", "minilm_path": "takes no argument",
}


def test_every_public_name_is_walked(tok, files):
    walked = set(cases(tok, files))
    assert set(D.__all__) == walked | set(EXEMPT), set(D.__all__) ^ (walked | set(EXEMPT))


def test_bad_input_raises_clearly(tok, files):
    failures = []
    for name, items in cases(tok, files).items():
        for category, thunk, exc, match in items:
            try:
                with pytest.raises(exc, match=match):
                    thunk()
            except BaseException as e:  # noqa: BLE001 — collect every miss, report them together
                failures.append(f"{name} [{category}]: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------------- WikiText text
def _wikitext(folder, body):
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"wiki.{split}.tokens").write_text(f" = {split.title()} Page = \n \n{body}\n", encoding="utf-8")
    return folder


def test_wikitext_unk_becomes_the_unknown_token(tmp_path, tok):
    folder = _wikitext(tmp_path / "wt", " the <unk> function returns a <unk> value . ")
    assert D.load_corpus("train", folder) == ["the [UNK] function returns a [UNK] value ."]
    ids = tok.encode(D.load_corpus("train", folder)[0])
    pieces = [tok.tokens[i] for i in ids]
    assert ids.count(tok.unk_id) == 2 and not {"<", "un", "##k", ">"} & set(pieces)   # one token, not four
    own = D.get_tokenizer(path=folder, cache=False)
    assert own.decode(own.encode(D.load_corpus("valid", folder)[0])) == "the [UNK] function returns a [UNK] value."


def test_many_unknown_tokens_warn_with_the_rate(tmp_path, tok):
    """Text the tokenizer was not built for (here Cyrillic, absent from Python's prose) warns with the [UNK] rate
    wherever LM data are built; a tokenizer built from that corpus does not; the warning can be made an error."""
    folder = _wikitext(tmp_path / "cyrillic", " москва город на реке . the value is returned . ")
    with pytest.warns(D.UnknownTokenWarning, match=r"\d+\.\d% of the \d+ tokens of split 'train'.*\[UNK\]"):
        D.lm_blocks("train", 4, tok, path=folder)
    with pytest.warns(D.UnknownTokenWarning, match="split 'valid'"):
        D.prefix_continuations("valid", 2, 2, tok, path=folder)
    with pytest.warns(D.UnknownTokenWarning, match="split 'test'"):
        D.unigram_perplexity("test", tok, path=folder, train_split="test")
    own = D.get_tokenizer(path=folder, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", D.UnknownTokenWarning)
        D.lm_blocks("train", 4, own, path=folder)            # its own tokenizer: no [UNK] on train
        with pytest.raises(D.UnknownTokenWarning):
            D.lm_blocks("valid", 4, tok, path=folder)
    with warnings.catch_warnings():                           # the default corpus with its tokenizer: silent
        warnings.simplefilter("error", D.UnknownTokenWarning)
        for split in D.SPLITS:
            D.lm_blocks(split, 64, tok)
