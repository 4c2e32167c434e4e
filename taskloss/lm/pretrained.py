"""The small causal Transformer LM pretrained by MLE on the no-download corpus, committed in
``data/pretrained/small_lm`` with its tokenizer and the metadata that pins how it was built.

The deterministic build script is ``data/build_pretrained_lm.py`` (``make pretrained``); a missing copy is rebuilt
on first use. Used by the text-completion tasks (notebook 04_sequence_task_losses) and 09_emo_loss.

Where it is found: a clone's ``data/pretrained/small_lm``; outside a clone (``pip install <clone>``, not editable)
the copy the wheel carries as package data, ``taskloss/lm/small_lm`` (``setup.py`` puts it there). Nothing is
downloaded.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from taskloss.datasets.tokenizer import Tokenizer
from taskloss.models.transformer import TransformerLM
from taskloss.utils import DATA_DIR, resolve_device
from taskloss.validation import check_bool

__all__ = ["PRETRAINED_DIR", "load_pretrained_lm"]

_CLONE_DIR = DATA_DIR / "pretrained" / "small_lm"                 # a clone (or an editable install)
_PACKAGED_DIR = Path(__file__).resolve().parent / "small_lm"      # a wheel's package data
PRETRAINED_DIR = _CLONE_DIR if _CLONE_DIR.is_dir() or not _PACKAGED_DIR.is_dir() else _PACKAGED_DIR


def _build_script():
    import importlib.util

    file = DATA_DIR / "build_pretrained_lm.py"
    spec = importlib.util.spec_from_file_location("taskloss_build_pretrained_lm", file)
    if spec is None or not file.is_file():
        raise FileNotFoundError(f"{file} is missing; cannot rebuild the pretrained LM")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_pretrained_lm(device: str | torch.device = "cpu", folder: str | os.PathLike | None = None,
                       rebuild_if_missing: bool = True):
    """(TransformerLM in eval mode on ``device``, its :class:`Tokenizer`): the small LM pretrained by MLE on
    the default corpus, committed in ``data/pretrained/small_lm`` (``model.pt`` fp16 state_dict,
    ``tokenizer.json``, ``meta.json``). When missing it is rebuilt by ``data/build_pretrained_lm.py``
    (minutes on a CPU). Used by the text-completion tasks and 09_emo_loss."""
    rebuild_if_missing = check_bool("rebuild_if_missing", rebuild_if_missing)
    folder = PRETRAINED_DIR if folder is None else Path(folder)
    files = [folder / n for n in ("model.pt", "tokenizer.json", "meta.json")]
    if not all(f.is_file() for f in files):
        if not rebuild_if_missing:
            raise FileNotFoundError(f"pretrained LM missing in {folder} (run `make pretrained`)")
        if not (DATA_DIR / "build_pretrained_lm.py").is_file():
            raise FileNotFoundError(
                f"pretrained LM missing in {folder}, and this install has no data/build_pretrained_lm.py to rebuild "
                f"it: install from a clone with `pip install <clone>` (the wheel carries the LM as "
                f"{_PACKAGED_DIR.relative_to(_PACKAGED_DIR.parents[2])}), or pass folder= a copy of a clone's "
                "data/pretrained/small_lm")
        print(f"[taskloss] pretrained LM not found in {folder}; rebuilding with data/build_pretrained_lm.py "
              "(deterministic, a few minutes on a CPU) ...", flush=True)
        _build_script().build(out_dir=folder, force=True)
    meta = json.loads(files[2].read_text("utf-8"))
    tok = Tokenizer.load(files[1])
    if tok.hash != meta["tokenizer_sha256"]:
        raise ValueError(f"{files[1]} does not match the tokenizer hash recorded in {files[2]}")
    model = TransformerLM(vocab_size=tok.vocab_size, **meta["config"]["model"])
    state = torch.load(files[0], map_location="cpu", weights_only=True)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(resolve_device(device)).eval(), tok
