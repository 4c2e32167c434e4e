"""SOAP against pytorch_optimizer's SOAP (which follows the reference code of Vyas et al.), against Adam in a fixed
basis, and the torch.optim conventions.

Where the definitions coincide: both gather statistics and the first eigenbasis (``eigh``) on the first call without
moving, keep the first moment in the original basis and the second in the eigenbasis, and refresh the basis by one
power iteration + QR with the second moment re-ordered. With the basis never refreshed the steps agree to float64
round-off; with refreshes they agree to float32 round-off only, because pytorch_optimizer runs the QR in float32
(ours in the parameter's dtype). heavyball's SOAP is not a reference here: it keeps the first moment in the
eigenbasis too (rotated with it), stores its states in float32 and schedules refreshes stochastically by default."""
from __future__ import annotations

import copy

import pytest
import torch
from curvature.test_shampoo import _data, _flat, _loss, _mlp, _run
from torch import nn

from taskloss.curvature import SOAP

po = pytest.importorskip("pytorch_optimizer")
D = torch.float64


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_fixed_eigenbasis_equals_pytorch_optimizer_soap_to_float64_roundoff(wd):
    a, b = _mlp(bias=True), _mlp(bias=True)
    ours = _run(a, SOAP(a.parameters(), lr=0.05, weight_decay=wd, precondition_frequency=100))
    theirs = _run(b, po.SOAP(b.parameters(), lr=0.05, weight_decay=wd, precondition_frequency=100))
    assert (ours - _flat(_mlp(bias=True))).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-13)


@pytest.mark.parametrize("freq", [1, 2])
def test_qr_refreshes_equal_pytorch_optimizer_soap_to_float32_roundoff(freq):
    a, b = _mlp(), _mlp()
    ours = _run(a, SOAP(a.parameters(), lr=0.05, precondition_frequency=freq))
    theirs = _run(b, po.SOAP(b.parameters(), lr=0.05, precondition_frequency=freq))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    assert (ours - theirs).abs().max() > 0     # not identical: their QR is in float32


def test_first_call_moves_nothing_and_identity_basis_is_adamw():
    # a 1-D tensor is never rotated: SOAP on it is Adam with the first gradient dropped from the moments (ε enters
    # as ε√(1 − β₂ᵗ) in torch's Adam and as ε here, and AdamW decays before its step, SOAP after: both switched off)
    b = nn.Parameter(torch.zeros(4, dtype=D))
    c = nn.Parameter(torch.zeros(4, dtype=D))
    opt = SOAP([b], lr=0.1, betas=(0.9, 0.95), weight_decay=0.0, eps=1e-30)
    ref = torch.optim.Adam([c], lr=0.1, betas=(0.9, 0.95), eps=1e-30)
    gen = torch.Generator().manual_seed(0)
    b.grad = torch.randn(4, generator=gen, dtype=D)
    opt.step()
    assert torch.equal(b.detach(), torch.zeros(4, dtype=D))
    for _ in range(4):
        g = torch.randn(4, generator=gen, dtype=D)
        b.grad, c.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    torch.testing.assert_close(b.detach(), c.detach(), rtol=1e-12, atol=1e-14)


def test_eigh_refresh_uses_the_exact_eigenbasis():
    a = _mlp()
    opt = SOAP(a.parameters(), lr=0.01, precondition_frequency=1, eigenbasis="eigh")
    x, y = _data()
    for _ in range(3):
        opt.step(lambda: _loss(a, x, y))
    st = opt.state[a[0].weight]
    for f, q in zip(st["factors"], st["Q"]):
        rot = q.T @ f @ q
        off = rot - torch.diag(torch.diagonal(rot))
        assert off.abs().max() < 1e-12 * f.abs().max()


def test_conventions_frozen_shared_scheduler_and_resume():
    x, y = _data()
    a = _mlp(bias=True)
    a[2].bias.requires_grad_(False)
    a[2].bias.grad = torch.ones_like(a[2].bias)
    frozen = a[2].bias.detach().clone()
    opt = SOAP(list(a.parameters()) + [a[0].weight], lr=0.02, precondition_frequency=2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))
    ref_model = copy.deepcopy(a)
    ref = SOAP(ref_model.parameters(), lr=0.02, precondition_frequency=2)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref, lambda k: 1.0 / (1 + k))
    for _ in range(6):
        ref.step(lambda: _loss(ref_model, x, y))
        ref_sched.step()
    for _ in range(3):
        assert torch.is_tensor(opt.step(lambda: _loss(a, x, y)))
        sched.step()
    assert torch.equal(a[2].bias, frozen)
    saved, model_saved, sched_saved = copy.deepcopy(opt.state_dict()), copy.deepcopy(a.state_dict()), \
        copy.deepcopy(sched.state_dict())
    b = _mlp(bias=True)
    b.load_state_dict(model_saved)
    b[2].bias.requires_grad_(False)
    ob = SOAP(b.parameters(), lr=0.02, precondition_frequency=2)
    sb = torch.optim.lr_scheduler.LambdaLR(ob, lambda k: 1.0 / (1 + k))
    ob.load_state_dict(saved)
    sb.load_state_dict(sched_saved)
    for _ in range(3):
        ob.step(lambda: _loss(b, x, y))
        sb.step()
    assert torch.equal(_flat(b), _flat(ref_model))


@pytest.mark.parametrize("kw, err", [
    ({"lr": float("nan")}, ValueError), ({"betas": (0.9, 1.0)}, ValueError), ({"shampoo_beta": 1.5}, ValueError),
    ({"shampoo_beta": float("nan")}, ValueError), ({"eps": 0.0}, ValueError),
    ({"precondition_frequency": 0}, ValueError), ({"eigenbasis": "svd"}, ValueError),
    ({"max_preconditioner_dim": 2.0}, TypeError), ({"weight_decay": float("nan")}, ValueError),
])
def test_bad_arguments_are_refused(kw, err):
    with pytest.raises(err):
        SOAP(_mlp().parameters(), **kw)


@pytest.mark.parametrize("shape", [(6, 6), (4, 9)])
def test_first_update_is_the_polar_factor(shape):
    # in the eigenbases U, V of GGᵀ and GᵀG the gradient is diag(σ); Adam's m̂/√v̂ of it is ≈ I, so the step is U Vᵀ
    # (ε above round-off: the rotated G's off-diagonal round-off would otherwise be normalized to ±1)
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(9), dtype=D)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    w = nn.Parameter(torch.zeros_like(g))
    opt = SOAP([w], lr=1.0, weight_decay=0.0, eps=1e-9 * float(s.max()))
    for _ in range(2):
        w.grad = g.clone()
        opt.step()
    torch.testing.assert_close(-w.detach(), u @ vh, rtol=0, atol=1e-6)
