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


# ------------------------------------------------------------------------------- EMO references (tests/losses)
def emo_official_reference(logits, targets, cost, *, combine="emo", variant="plain", reduction="mean",
                           ratio_max=None, eps=1e-10, ignore_index=-100):
    """The EMO loss as the authors' code (github.com/DRSY/EMO, language_modeling/gpt2.py and emo_patch.py at
    14da9d5) computes it, in float64 and dense: one-hot matrices, a target distribution smoothed by 1e-15 and
    L1-normalized, ``q = softmax`` (``"patch"``: ``q − sg(q ⊙ onehot)``), ``EMO = 1 − <onehot_s @ ê, q @ ê>``
    masked, ``MLE`` by cross-entropy, the combination, then the masked mean with ``1e-15`` in its denominator.
    Zero-norm rows get ``ê = 0`` (the package's convention; the authors' code would divide by zero)."""
    import torch.nn.functional as F

    x = logits.double().reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    v = x.shape[-1]
    mask = t != ignore_index
    lab = t.masked_fill(~mask, 0)
    one_hot = F.one_hot(lab, v).double()
    target = (one_hot + 1e-15) / (one_hot + 1e-15).sum(-1, keepdim=True)
    e = cost.double()
    norm = e.norm(dim=1, keepdim=True)
    e_hat = torch.where(norm > 0, e / norm.clamp_min(1e-300), torch.zeros_like(e))
    q = x.softmax(-1)
    if variant == "patch":
        q = q - (q * one_hot).detach()
    emo = (1 - ((target @ e_hat) * (q @ e_hat)).sum(-1)) * mask
    mle = F.cross_entropy(x, t, reduction="none", ignore_index=ignore_index)
    if combine == "emo":
        per = emo
    elif combine == "mle":
        per = mle
    elif combine == "emo_mle_ratio":
        ratio = (mle / (emo + eps)).detach()
        if ratio_max is not None:
            ratio = torch.minimum(ratio, torch.full_like(ratio, ratio_max))
        per = (ratio * emo + mle) * 0.5
    else:  # "mle_scaled_by_emo"
        per = (emo / (mle + eps)).detach() * mle + emo
    per = per * mask
    if reduction == "none":
        return per.reshape(targets.shape)
    if reduction == "sum":
        return per.sum()
    return per.sum() / (1e-15 + mask.sum())


# ------------------------------------------------------------------------------- MGS (tests/search, tests/lm)
def mgs_closure(model: nn.Module, surrogate, batch):
    """The closure ``MGS.step`` takes: ``surrogate(model, batch)``, ``backward()``, ``(loss, batch)``."""
    def closure():
        loss = surrogate(model, batch)
        loss.backward()
        return loss, batch
    return closure


def mgs_step(mgs, batch, surrogate=None, *, return_deltas: bool = False):
    """One ``mgs.step`` on ``batch`` with the closure of ``surrogate`` (default: ``mgs.test_surrogate``, set by the
    test modules' builders); returns the step's ``MGSStats`` (with every Δθ_k when ``return_deltas``)."""
    mgs.keep_deltas = return_deltas
    mgs.step(mgs_closure(mgs.model, surrogate or mgs.test_surrogate, batch))
    return mgs.last_stats


def with_surrogate(mgs, surrogate):
    """``mgs`` with the surrogate loss ``(model, batch) → l̃`` that :func:`mgs_step` builds its closure from."""
    mgs.test_surrogate = surrogate
    return mgs
