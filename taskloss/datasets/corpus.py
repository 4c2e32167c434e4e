"""Text data: a no-download English corpus, LM blocks and prefix/continuation pairs. The compact MiniLM tokenizer
lives in :mod:`taskloss.datasets.tokenizer`, MiniLM's embeddings in :mod:`taskloss.datasets.minilm`, and the
small LM pretrained on this corpus in :mod:`taskloss.lm.pretrained`.

**Default corpus.** Prose installed with Python itself, so nothing is downloaded: the language-reference
topics of ``pydoc_data.topics`` and the docstrings of a fixed, sorted list of standard-library modules,
cleaned into one-paragraph lines (code, grammar and tables dropped) and split 80/10/10 into
train/valid/test by the SHA-256 of each document's title. :mod:`taskloss.datasets.stdlib_corpus` builds it in an
isolated interpreter, so it does not depend on what the calling process imported. The text, hence
:func:`corpus_hash`, depends on the exact Python version's standard library (3.11.7 for the committed
pretrained LM; other 3.11 patch releases give a slightly different corpus), never on the machine.

**WikiText.** ``load_corpus(split, path=...)`` reads user-downloaded WikiText-2/103 raw files instead (the
``<unk>`` placeholder of the ``.tokens`` files becomes the tokenizer's ``[UNK]``).

**Unknown tokens.** LM data built here (:func:`lm_blocks`, :func:`prefix_continuations`,
:func:`unigram_perplexity`) warn with an :class:`UnknownTokenWarning` naming the rate when more than
:data:`MAX_UNK_RATE` of a split's tokens map to ``[UNK]`` under the given tokenizer — e.g. WikiText read with
the default corpus' tokenizer (22 % reported). Make it an error with ``warnings.simplefilter("error",
UnknownTokenWarning)``.

**Tokenizer.** :func:`get_tokenizer` builds (and caches) the compact :class:`~taskloss.datasets.tokenizer.Tokenizer` of a
corpus' train split: all-MiniLM-L6-v2's uncased WordPiece tokenizer restricted to the ids that occur there, so
MiniLM's pretrained embeddings give a semantic cost between tokens (the EMO loss, notebook 09_emo_loss). LM data
and the pretrained LM serve the text experiments: MGS on text completion (via :mod:`taskloss.lm.completion`)
and 09_emo_loss.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from taskloss.datasets import stdlib_corpus
from taskloss.datasets.stdlib_corpus import split_of
from taskloss.datasets.tokenizer import DEFAULT_MIN_COUNT, SPECIAL_TOKENS, Tokenizer
from taskloss.utils import DATA_DIR, atomic_write_text
from taskloss.validation import check_bool, check_int

__all__ = [
    "SPLITS", "CACHE_DIR", "MAX_UNK_RATE", "UnknownTokenWarning", "Document", "load_documents", "load_corpus",
    "corpus_hash", "corpus_stats", "get_tokenizer", "lm_blocks", "prefix_continuations", "unigram_perplexity",
]

SPLITS = ("train", "valid", "test")
CACHE_DIR = DATA_DIR / "cache"
#: Fraction of a split's tokens (EOS excluded) that may map to ``[UNK]`` before LM data built here warn. The
#: default corpus' own tokenizer leaves under 3 % on its valid and test splits (none on train).
MAX_UNK_RATE = 0.05


class UnknownTokenWarning(UserWarning):
    """A split's text maps to many ``[UNK]`` under the tokenizer in use: the model would mostly learn and be
    scored on the unknown token. Build the tokenizer from the same corpus (``get_tokenizer(path=...)``)."""


def _check_split(split: str) -> str:
    if not isinstance(split, str) or split not in SPLITS:     # an array or other non-string is unknown too
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split


@dataclass(frozen=True)
class Document:
    """A titled document: ``lines`` are its paragraphs, one string each."""

    title: str
    lines: tuple[str, ...]

    def __post_init__(self):
        if not isinstance(self.title, str):
            raise TypeError(f"title must be a str, got {type(self.title).__name__}")
        if isinstance(self.lines, str) or not isinstance(self.lines, (tuple, list)) or \
                not all(isinstance(x, str) for x in self.lines):
            raise TypeError("lines must be a tuple of str (one paragraph each)")
        object.__setattr__(self, "lines", tuple(self.lines))


def _default_cache_key() -> str:
    h = hashlib.sha256(sys.version.encode())
    h.update(Path(stdlib_corpus.__file__).read_bytes())  # any change to the builder invalidates the cache
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _default_documents() -> tuple[Document, ...]:
    """All documents of the default corpus, built by :mod:`taskloss.datasets.stdlib_corpus` in an isolated
    interpreter (``python -I -S``: no site-packages, nothing imported that could patch the standard
    library). Cached in memory and in ``data/cache/corpus-<key>.json`` (key: Python version + builder bytes)."""
    cache = CACHE_DIR / f"corpus-{_default_cache_key()}.json"
    if not cache.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "corpus.json"
            proc = subprocess.run([sys.executable, "-I", "-S", "-X", "utf8", stdlib_corpus.__file__, str(out)],
                                  capture_output=True, text=True, cwd=tmp)
            if proc.returncode != 0 or not out.is_file():
                raise RuntimeError(f"building the default corpus failed:\n{proc.stderr[-2000:]}")
            payload = out.read_text("utf-8")
        try:
            atomic_write_text(cache, payload)
        except OSError:  # read-only checkout: keep it in memory only
            return tuple(Document(t, tuple(ls)) for t, ls in json.loads(payload)["documents"])
    return tuple(Document(t, tuple(ls)) for t, ls in json.loads(cache.read_text("utf-8"))["documents"])


# --------------------------------------------------------------------------------------------- WikiText
_WIKI_TITLE = re.compile(r"^ ?= ([^=].*?) = ?$")
_WIKI_HEADING = re.compile(r"^ ?(=\s?)+.*?(\s?=)+ ?$")
_WIKI_DETOK = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_WIKI_UNK = "<unk>"   # WikiText's rare-word placeholder; WordPiece would split it into "<", "un", "##k", ">"


def _wikitext_documents(file: Path) -> list[Document]:
    st = file.stat()
    return list(_parse_wikitext(str(file.resolve()), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=6)
def _parse_wikitext(file: str, mtime_ns: int, size: int) -> tuple[Document, ...]:
    """Parse a WikiText raw file: `` = Title = `` opens a document, `` = = Sub = = `` headings and empty lines
    are dropped, every other line is a paragraph (``@-@``, ``@,@``, ``@.@`` joined back, ``<unk>`` written as
    ``[UNK]``, which the WordPiece tokenizer keeps as its unknown token). ``ValueError`` naming the file when it
    is not UTF-8."""
    docs: list[Document] = []
    title, lines = None, []
    try:
        with open(file, encoding="utf-8") as f:
            for raw in f:
                line = raw.rstrip("\n")
                m = _WIKI_TITLE.match(line)
                if m:
                    if title is not None or lines:
                        docs.append(Document(title or "(preamble)", tuple(lines)))
                    title, lines = m.group(1).strip(), []
                elif line.strip() and not _WIKI_HEADING.match(line):
                    for a, b in _WIKI_DETOK:
                        line = line.replace(a, b)
                    lines.append(" ".join(line.replace(_WIKI_UNK, SPECIAL_TOKENS[1]).split()))
    except UnicodeDecodeError as e:
        raise ValueError(f"WikiText file {file} is not UTF-8 text ({e}); WikiText-2/103 ship as UTF-8") from e
    if title is not None or lines:
        docs.append(Document(title or "(preamble)", tuple(lines)))
    return tuple(d for d in docs if d.lines)


def _wikitext_split(path: Path, split: str) -> list[Document]:
    if path.is_dir():
        for name in (f"wiki.{split}.raw", f"wiki.{split}.tokens"):
            if (path / name).is_file():
                return _wikitext_documents(path / name)
        raise FileNotFoundError(f"no wiki.{split}.raw (or wiki.{split}.tokens) in {path}; download WikiText-2/103 "
                                "raw and pass the folder holding wiki.train.raw, wiki.valid.raw, wiki.test.raw")
    if path.is_file():  # one file: its documents are assigned to splits by title hash, like the default corpus
        return [d for d in _wikitext_documents(path) if split_of(d.title) == split]
    raise FileNotFoundError(f"WikiText path {path} does not exist (pass a folder with wiki.*.raw files, or a file)")


# ------------------------------------------------------------------------------------------- public API
def _check_path(path) -> None:
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be None (the default corpus), a str or an os.PathLike, got {type(path).__name__}")


def load_documents(split: str, path: str | os.PathLike | None = None) -> list[Document]:
    """Documents of one split: the default corpus (``path=None``) or WikiText raw files at ``path``."""
    _check_split(split)
    _check_path(path)
    if path is None:
        return [d for d in _default_documents() if split_of(d.title) == split]
    return _wikitext_split(Path(path), split)


def load_corpus(split: str, path: str | os.PathLike | None = None) -> list[str]:
    """The lines (paragraphs) of one split, in document order; see :func:`load_documents`."""
    lines = [line for d in load_documents(split, path) for line in d.lines]
    if not lines:
        raise ValueError(f"split {split!r} of corpus {path or 'default'} is empty")
    return lines


def corpus_hash(path: str | os.PathLike | None = None) -> str:
    """sha256 (hex) of every split's titles and lines, in order. For the default corpus it depends only on
    the exact Python version's standard-library text (the value for 3.11.7 is recorded in
    ``data/pretrained/small_lm/meta.json``)."""
    h = hashlib.sha256()
    for split in SPLITS:
        for d in load_documents(split, path):
            h.update(f"{split}\t{d.title}\n".encode())
            for line in d.lines:
                h.update((line + "\n").encode())
    return h.hexdigest()


def corpus_stats(path: str | os.PathLike | None = None) -> dict[str, dict[str, int]]:
    """``{split: {"docs", "lines", "words"}}`` (words = whitespace-separated)."""
    out = {}
    for split in SPLITS:
        docs = load_documents(split, path)
        out[split] = {"docs": len(docs), "lines": sum(len(d.lines) for d in docs),
                      "words": sum(len(line.split()) for d in docs for line in d.lines)}
    return out


# ------------------------------------------------------------------------------------- corpus tokenizer
def get_tokenizer(min_count: int = DEFAULT_MIN_COUNT, path: str | os.PathLike | None = None,
                  cache: bool = True) -> Tokenizer:
    """The compact tokenizer of a corpus' train split (default corpus, or WikiText at ``path``), built
    deterministically and cached in ``data/cache/tokenizer-<corpus hash>-m<min_count>.json``."""
    cache = check_bool("cache", cache)
    check_int("min_count", min_count, minimum=1)
    if not isinstance(cache, bool):
        raise TypeError(f"cache must be a bool, got {type(cache).__name__}")
    chash = corpus_hash(path)
    file = CACHE_DIR / f"tokenizer-{chash[:16]}-m{min_count}.json"
    if cache and file.is_file():
        try:
            return Tokenizer.load(file)
        except (ValueError, KeyError):
            pass
    tok = Tokenizer.build(load_corpus("train", path), min_count, {"corpus_sha256": chash})
    if cache:
        try:
            tok.save(file)
        except OSError:
            pass
    return tok


# ------------------------------------------------------------------------------------- LM data
@functools.lru_cache(maxsize=8)
def _encoded_split(split: str, path: str | None, tok_hash: str, tokenizer: Tokenizer):
    """(stream int64 [n], starts int64 [L], lengths int64 [L], number of [UNK]): every line's ids followed by
    EOS, where each line starts in the stream and how many tokens it has (without its EOS)."""
    lines = tokenizer.encode_batch(load_corpus(split, path), add_eos=True)
    lengths = np.fromiter((len(ids) - 1 for ids in lines), dtype=np.int64, count=len(lines))
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
    stream = np.fromiter((t for ids in lines for t in ids), dtype=np.int64, count=int((lengths + 1).sum()))
    n_unk = int((stream == tokenizer.unk_id).sum())
    for a in (stream, starts, lengths):
        a.setflags(write=False)
    return stream, starts, lengths, n_unk


def _encoded(split: str, tokenizer: Tokenizer, path):
    """(stream, starts, lengths) of :func:`_encoded_split`, with an :class:`UnknownTokenWarning` (at the caller of
    the public function) when more than :data:`MAX_UNK_RATE` of the split's text tokens are ``[UNK]``."""
    _check_split(split)
    _check_path(path)
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a taskloss.datasets.tokenizer.Tokenizer, got {type(tokenizer).__name__}")
    stream, starts, lengths, n_unk = _encoded_split(split, None if path is None else str(path), tokenizer.hash,
                                                    tokenizer)
    n_text = int(lengths.sum())
    rate = n_unk / max(n_text, 1)
    if rate > MAX_UNK_RATE:
        built = tokenizer.meta.get("corpus_sha256")
        warnings.warn(f"{rate:.1%} of the {n_text:,} tokens of split {split!r} of corpus {path or 'default'} map to "
                      f"[UNK] under this tokenizer (vocabulary {tokenizer.vocab_size}"
                      f"{f', built from corpus {built[:12]}' if built else ''}; limit {MAX_UNK_RATE:.0%}): build "
                      "the tokenizer from this corpus (get_tokenizer(path=...)) or use a model whose tokenizer "
                      "covers it", UnknownTokenWarning, stacklevel=3)
    return stream, starts, lengths


def lm_blocks(split: str, block_size: int, tokenizer: Tokenizer, path: str | os.PathLike | None = None) -> torch.Tensor:
    """LongTensor ``[N, block_size + 1]``: the split's token stream (every line followed by EOS, as fairseq
    does for WikiText) cut into consecutive blocks; block ``n`` is ``stream[n·B : n·B + B + 1]`` so inputs
    ``x = blocks[:, :-1]`` and targets ``y = blocks[:, 1:]`` cover every token once. Used by 09_emo_loss and the text-completion tasks."""
    check_int("block_size", block_size, minimum=1)
    stream = _encoded(split, tokenizer, path)[0]
    n = (len(stream) - 1) // block_size
    if n < 1:
        raise ValueError(f"split {split!r} has {len(stream)} tokens, too few for one block of {block_size}")
    s = torch.from_numpy(stream[: n * block_size + 1].copy())
    return s.unfold(0, block_size + 1, block_size).contiguous()


def prefix_continuations(split: str, prefix_len: int, cont_len: int, tokenizer: Tokenizer,
                         max_items: int | None = None, path: str | os.PathLike | None = None,
                         with_eos: bool = False) -> tuple[torch.Tensor, list[list[int]]]:
    """Text-completion pairs (as in "MLE-guided parameter search for task loss minimization in neural
    sequence modeling"): from each line with at least ``prefix_len + cont_len`` tokens, the first
    ``prefix_len`` tokens are the prefix and the next ``cont_len`` the reference continuation.

    ``with_eos=True`` also takes lines with at least ``prefix_len + 1`` tokens and ends the reference with
    EOS when the line ends within ``cont_len`` tokens (continuations then have varying length ≤ cont_len + 1).
    Returns (prefixes LongTensor ``[N, prefix_len]``, continuations list of N lists), the first
    ``max_items`` in corpus order. Used by the text-completion tasks (MGS) and 09_emo_loss.
    """
    with_eos = check_bool("with_eos", with_eos)
    check_int("prefix_len", prefix_len, minimum=1)
    check_int("cont_len", cont_len, minimum=1)
    if max_items is not None:
        check_int("max_items", max_items, minimum=1)
    if not isinstance(with_eos, bool):
        raise TypeError(f"with_eos must be a bool, got {type(with_eos).__name__}")
    stream, starts, lengths = _encoded(split, tokenizer, path)
    need = prefix_len + (1 if with_eos else cont_len)
    rows = np.flatnonzero(lengths >= need)[:max_items]
    if len(rows) == 0:
        raise ValueError(f"no line of split {split!r} has {need} tokens (prefix_len={prefix_len}, cont_len={cont_len})")
    prefixes = torch.from_numpy(stream[starts[rows, None] + np.arange(prefix_len)])
    L = lengths[rows]  # the EOS that follows each line in the stream is included when the line ends early
    ends = starts[rows] + np.minimum(L, prefix_len + cont_len) + (with_eos & (L <= prefix_len + cont_len))
    conts = [stream[a + prefix_len: e].tolist() for a, e in zip(starts[rows].tolist(), ends.tolist())]
    return prefixes, conts


def unigram_perplexity(split: str, tokenizer: Tokenizer, path: str | os.PathLike | None = None,
                       train_split: str = "train") -> float:
    """Perplexity on ``split`` (the same stream as :func:`lm_blocks`, EOS included) of the add-one-smoothed
    unigram model of ``train_split`` — the baseline an LM must beat."""
    _check_split(train_split)
    counts = np.bincount(_encoded(train_split, tokenizer, path)[0], minlength=tokenizer.vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[_encoded(split, tokenizer, path)[0]].mean()))
