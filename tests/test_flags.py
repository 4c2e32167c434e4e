"""Flags are never coerced: every public boolean argument of the package refuses a string, an int or None with a
``TypeError`` naming it (``'no'`` is truthy, so ``bool('no')`` silently switched features on), and accepts
``True``/``False`` and numpy bools. The cases the bad-input walk of issue 31 found are among them."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.contrastive import accumulated_backward, info_nce
from taskloss.curvature import HessianFree, conjugate_gradient
from taskloss.dynamics import ClippedSGD, clip_grad_, gradient_norm_penalty
from taskloss.lm import load_pretrained_lm
from taskloss.losses import edit_distance, emo_and_mle_per_token
from taskloss.models import MLP, RNNLM, TransformerLM
from taskloss.search import MGS, gaussian_smoothing_grad, mgs_weights, spsa_grad
from taskloss.parameter_vectors import count_parameters
from taskloss.validation import eval_mode


def _param():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    return p


def _lin():
    return nn.Linear(2, 2)


def _mgs(flag):
    m = _lin()
    return MGS(m, torch.optim.SGD(m.parameters(), lr=1), F.mse_loss, include_mle=flag)


def _hf(flag):
    m = _lin()
    return HessianFree(m.parameters(), m, adapt_damping=flag)


def _penalty(flag):
    p = _param()
    return gradient_norm_penalty((p ** 2).sum(), [p], create_graph=flag)


QUAD = lambda t: (t ** 2).sum()  # noqa: E731
E = torch.randn(8, 16)

CASES = {   # flag name -> a call taking the flag's value
    "MLP(bias)": ("bias", lambda v: MLP(3, (4,), 2, bias=v)),
    "TransformerLM(tie_weights)": ("tie_weights", lambda v: TransformerLM(11, d_model=8, n_heads=2, tie_weights=v)),
    "RNNLM(tie_weights)": ("tie_weights", lambda v: RNNLM(11, d_model=8, hidden=8, tie_weights=v)),
    "MGS(include_mle)": ("include_mle", _mgs),
    "HessianFree(adapt_damping)": ("adapt_damping", _hf),
    "clip_grad_(per_tensor)": ("per_tensor", lambda v: clip_grad_([_param()], 1.0, per_tensor=v)),
    "ClippedSGD(per_tensor)": ("per_tensor", lambda v: ClippedSGD([_param()], lr=0.1, per_tensor=v)),
    "accumulated_backward(check_replay)": ("check_replay", lambda v: accumulated_backward(
        _lin(), [torch.randn(4, 2)], lambda e: e.sum(), 2, check_replay=v)),
    "load_pretrained_lm(rebuild_if_missing)": ("rebuild_if_missing", lambda v: load_pretrained_lm(
        folder="/nonexistent/small_lm", rebuild_if_missing=v)),
    "conjugate_gradient(truncated)": ("truncated", lambda v: conjugate_gradient(lambda x: x, torch.ones(2),
                                                                                truncated=v)),
    "gradient_norm_penalty(create_graph)": ("create_graph", _penalty),
    "gaussian_smoothing_grad(vectorize)": ("vectorize", lambda v: gaussian_smoothing_grad(QUAD, torch.ones(2), 0.1, 2,
                                                                                          vectorize=v)),
    "spsa_grad(vectorize)": ("vectorize", lambda v: spsa_grad(QUAD, torch.ones(2), 0.1, vectorize=v)),
    "mgs_weights(log)": ("log", lambda v: mgs_weights(torch.zeros(2), 0.0, torch.zeros(2), 1.0, log=v)),
    "info_nce(symmetric)": ("symmetric", lambda v: info_nce(torch.randn(3, 4), torch.randn(3, 4), symmetric=v)),
    "edit_distance(normalize)": ("normalize", lambda v: edit_distance([[1, 2]], [[1, 3]], normalize=v)),
    "emo_and_mle_per_token(need_mle)": ("need_mle", lambda v: emo_and_mle_per_token(
        torch.randn(4, 8), torch.tensor([0, 1, 2, 3]), E, need_mle=v)),
    "eval_mode(enabled)": ("enabled", lambda v: eval_mode(_lin(), v).__enter__()),
    "count_parameters(trainable_only)": ("trainable_only", lambda v: count_parameters(_lin(), trainable_only=v)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("bad", ["no", 0, None], ids=["str", "int", "None"])
def test_a_flag_that_is_not_a_bool_is_refused(case, bad):
    name, call = CASES[case]
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        call(bad)


@pytest.mark.parametrize("case", [c for c in CASES if c != "load_pretrained_lm(rebuild_if_missing)"])
def test_a_numpy_bool_is_a_bool(case):
    _, call = CASES[case]
    call(np.bool_(False))


def test_rebuild_if_missing_no_does_not_start_a_rebuild():
    """Issue case: load_pretrained_lm(rebuild_if_missing='no') started retraining; now a TypeError, and False
    raises FileNotFoundError for a missing folder without building anything."""
    with pytest.raises(TypeError, match="rebuild_if_missing must be a bool"):
        load_pretrained_lm(folder="/nonexistent/small_lm", rebuild_if_missing="no")
    with pytest.raises(FileNotFoundError):
        load_pretrained_lm(folder="/nonexistent/small_lm", rebuild_if_missing=False)
