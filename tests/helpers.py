"""Small builders shared by test modules of several subpackages (importable because pyproject puts ``tests/`` on
``sys.path`` for pytest)."""
from __future__ import annotations

import torch
from torch import nn

from taskloss.models import RNNLM, TransformerLM

V = 37


MODES = ("pre", "post", "realformer")


def make_lm(kind: str, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    if kind in MODES:
        kw = {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_len": 24, **kw}
        return TransformerLM(V, residual=kind, **kw)
    kw = {"d_model": 16, "hidden": 24, "n_layers": 2, **kw}
    return RNNLM(V, cell=kind, **kw)


def tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
