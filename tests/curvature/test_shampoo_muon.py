"""Muon as the harness uses it: ``torch.optim.Muon``'s Newton–Schulz output against the exact polar factor from
``torch.linalg.svd`` (its documented error), its first step against Shampoo's closed form (the polar factor), and
the Muon / AdamW split of :func:`muon_with_adamw`."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _zeropower_via_newtonschulz

from taskloss.curvature import Shampoo, muon_with_adamw

NS = (DEFAULT_A, DEFAULT_B, DEFAULT_C)


def _polar(g):
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    return u @ vh


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (48, 48)])
def test_newton_schulz_is_the_polar_factor_within_its_documented_error(shape):
    # torch's docstring: NS returns U S' Vᵀ with S'ᵢᵢ roughly in (0.5, 1.5) instead of U Vᵀ (bfloat16, 5 steps of
    # the quintic a, b, c of Jordan et al.). The polynomial is odd, so the singular vectors are G's own: UᵀOV is
    # diagonal up to bfloat16 round-off.
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    o = _zeropower_via_newtonschulz(g, NS, 5, EPS).double()
    u, s, vh = torch.linalg.svd(g.double(), full_matrices=False)
    core = u.T @ o @ vh.T
    diag = torch.diagonal(core)
    assert diag.min() > 0.5 and diag.max() < 1.5, (diag.min(), diag.max())
    off = core - torch.diag(diag)
    assert off.norm() / core.norm() < 0.03
    cos = (o * _polar(g)).sum() / (o.norm() * _polar(g).norm())
    assert cos > 0.98
    # the error is the iteration's, not round-off: the singular values stay spread (S' is not I)
    assert (diag.max() - diag.min()) > 0.05


def test_torch_muon_first_step_is_shampoo_without_accumulation_up_to_ns_error():
    # Muon's first step (nesterov, momentum μ): −lr·√max(1, m/n)·NS((1 + μ) G); Shampoo's one-step closed form with
    # e = −1/4 is the exact polar factor U Vᵀ (tests/curvature/test_shampoo.py); the two agree to NS's error
    g = torch.randn(16, 24, generator=torch.Generator().manual_seed(1))
    w1, w2 = nn.Parameter(torch.zeros(16, 24)), nn.Parameter(torch.zeros(16, 24, dtype=torch.float64))
    w1.grad, w2.grad = g.clone(), g.double()
    torch.optim.Muon([w1], lr=1.0, weight_decay=0.0).step()
    Shampoo([w2], lr=1.0, grafting="none", epsilon=1e-20).step()
    muon, shampoo = -w1.detach().double(), -w2.detach()
    torch.testing.assert_close(shampoo, _polar(g), rtol=0, atol=1e-7)
    cos = (muon * shampoo).sum() / (muon.norm() * shampoo.norm())
    assert cos > 0.98


def test_split_gives_hidden_matrices_to_muon_and_the_rest_to_adamw():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 10))
    model[1].bias.requires_grad_(False)
    muon, adamw = muon_with_adamw(model, exclude=["4.weight"])
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    in_adamw = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {id(model[1].weight)}
    assert in_adamw == {id(p) for n, p in model.named_parameters() if p.requires_grad and n != "1.weight"}
    assert id(model[1].bias) not in in_adamw | in_muon


def test_split_refuses_bad_arguments():
    with pytest.raises(TypeError):
        muon_with_adamw([nn.Parameter(torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="exclude"):
        muon_with_adamw(nn.Linear(2, 2), exclude=["nope"])
    with pytest.raises(ValueError, match="lr"):
        muon_with_adamw(nn.Linear(2, 2), lr=float("nan"))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        muon_with_adamw(frozen)
