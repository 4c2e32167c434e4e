"""Exact accumulation (taskloss.contrastive.accumulation) against the full-batch gradient in float64: dropout on,
micro-batches that do and do not divide the batch, one shared encoder or two towers, hard negatives, dict
inputs, autocast, a gradient scaler; the naive accumulation's gradient as the block-diagonal loss's."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from taskloss.contrastive import (
    RNGState,
    accumulated_backward,
    batch_size,
    info_nce,
    naive_accumulated_backward,
    split_micro_batches,
)

D = torch.float64


def _encoder(seed=0, p=0.3, d_in=6, dtype=D):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 16), nn.Tanh(), nn.Dropout(p), nn.Linear(16, 5)).to(dtype)


def _data(B=11, d_in=6, seed=1, dtype=D):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, d_in, generator=g, dtype=dtype) for _ in range(3)]


def _grads(*modules):
    out = [p.grad.clone() for m in modules for p in m.parameters()]
    for m in modules:
        m.zero_grad(set_to_none=True)
    return out


def _assert_grads_close(a, b, **tol):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **tol)


def _chunked_full_graph(encs, inputs, loss_fn, sizes):
    """The full-batch loss with one graph over the whole batch, its forward run micro-batch by micro-batch so the
    dropout masks are drawn in the same order as in accumulated_backward's first pass."""
    embs = [torch.cat([e(c) for c in split_micro_batches(x, m)]) for e, x, m in zip(encs, inputs, sizes)]
    loss = loss_fn(*embs)
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("m", [11, 4, 3, 1])          # whole batch, non-divisors (4, 3) and single samples
@pytest.mark.parametrize("symmetric", [False, True])
def test_shared_encoder_with_dropout_equals_full_batch(m, symmetric):
    enc = _encoder()
    q, p, _ = _data()
    loss_fn = functools.partial(info_nce, temperature=0.5, symmetric=symmetric)
    torch.manual_seed(7)
    ref_loss = _chunked_full_graph([enc, enc], [q, p], loss_fn, [m, m])
    ref = _grads(enc)
    torch.manual_seed(7)
    res = accumulated_backward(enc, (q, p), loss_fn, m)
    _assert_grads_close(_grads(enc), ref, rtol=1e-10, atol=1e-12)   # summation order differs: not bit-identical
    torch.testing.assert_close(res.loss, ref_loss)


@pytest.mark.parametrize("sizes", [(4, 4, 3), (5, 2, 7), (11, 11, 9)])
def test_two_towers_with_hard_negatives_and_per_input_micro_batches(sizes):
    q_enc, d_enc = _encoder(0), _encoder(1)
    q, p, h = _data()
    h = h[:9]
    loss_fn = lambda a, b, c: info_nce(a, b, hard_negatives=c, temperature=0.2)      # noqa: E731
    torch.manual_seed(3)
    _chunked_full_graph([q_enc, d_enc, d_enc], [q, p, h], loss_fn, sizes)
    ref = _grads(q_enc, d_enc)
    torch.manual_seed(3)
    accumulated_backward((q_enc, d_enc, d_enc), (q, p, h), loss_fn, sizes)
    _assert_grads_close(_grads(q_enc, d_enc), ref, rtol=1e-10, atol=1e-12)


def test_without_dropout_equals_one_forward_of_the_whole_batch():
    enc = _encoder(p=0.0)
    q, p, _ = _data(B=10)
    info_nce(enc(q), enc(p), temperature=0.1).backward()
    ref = _grads(enc)
    for m in (10, 3, 7):
        accumulated_backward(enc, [q, p], functools.partial(info_nce, temperature=0.1), m)
        _assert_grads_close(_grads(enc), ref, rtol=1e-10, atol=1e-12)


def test_mapping_inputs_and_a_loss_that_ignores_one_input():
    class DictEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _encoder()

        def forward(self, batch):
            return self.net(batch["x"]) * batch["scale"]

    enc = DictEncoder()
    q, p, h = _data()
    inputs = ({"x": q, "scale": 2.0}, {"x": p, "scale": 2.0}, {"x": h, "scale": 2.0})
    loss_fn = lambda a, b, c: info_nce(a, b, temperature=1.0)                         # noqa: E731 (c unused)
    torch.manual_seed(0)
    _chunked_full_graph([enc] * 2, inputs[:2], lambda a, b: info_nce(a, b, temperature=1.0), [4, 4])
    ref = _grads(enc)
    torch.manual_seed(0)
    res = accumulated_backward(enc, inputs, loss_fn, 4)
    assert res.embedding_grads[2] is None and res.embeddings[2].shape == (11, 5)
    _assert_grads_close(_grads(enc), ref, rtol=1e-10, atol=1e-12)


def test_replay_leaves_the_global_generator_where_the_first_pass_left_it():
    enc = _encoder()
    q, p, _ = _data()
    torch.manual_seed(5)
    with torch.no_grad():
        for x in (q, p):
            for c in x.split(4):
                enc(c)
    after_first_pass = torch.get_rng_state()
    torch.manual_seed(5)
    accumulated_backward(enc, (q, p), functools.partial(info_nce, temperature=1.0), 4)
    assert torch.equal(torch.get_rng_state(), after_first_pass)


def test_rng_state_replays_and_restores():
    torch.manual_seed(0)
    state = RNGState.capture(torch.zeros(1), nn.Linear(2, 2))
    a = torch.rand(3)
    after = torch.get_rng_state()
    expected_next = torch.rand(3)
    torch.set_rng_state(after)
    with state.replay():
        torch.testing.assert_close(torch.rand(3), a, rtol=0, atol=0)       # the same draws again
    torch.testing.assert_close(torch.rand(3), expected_next, rtol=0, atol=0)  # and the generator is put back
    assert state.cuda == ()                                                  # CPU tensors only: no CUDA state


def test_unreplayed_randomness_is_detected_and_would_give_a_wrong_gradient():
    """An encoder drawing from its own generator is not covered by the replay: the check raises; without the
    check the gradient is silently not the full-batch gradient."""
    class OwnNoise(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 5).to(D)
            self.gen = torch.Generator().manual_seed(0)

        def forward(self, x):
            keep = torch.rand(x.shape, generator=self.gen, dtype=D) > 0.3         # dropout from a private generator
            return self.lin(x * keep / 0.7)

    enc = OwnNoise()
    q, p, _ = _data()
    loss_fn = functools.partial(info_nce, temperature=1.0)
    with pytest.raises(RuntimeError, match="second pass differs from the first"):
        accumulated_backward(enc, (q, p), loss_fn, 4)
    enc.zero_grad()
    enc.gen.manual_seed(0)
    _chunked_full_graph([enc, enc], [q, p], loss_fn, [4, 4])
    ref = _grads(enc)
    enc.gen.manual_seed(0)
    accumulated_backward(enc, (q, p), loss_fn, 4, check_replay=False)
    assert max((a - b).abs().max().item() for a, b in zip(_grads(enc), ref)) > 1e-3


def test_naive_accumulation_is_the_block_diagonal_loss():
    """Naive accumulation = the full-batch loss with the scores outside the micro-batch blocks set to −∞."""
    enc = _encoder(p=0.0)
    q, p, _ = _data(B=10)
    m, tau = 4, 0.3
    loss_fn = functools.partial(info_nce, temperature=tau)
    naive = naive_accumulated_backward(enc, (q, p), loss_fn, m)
    got = _grads(enc)
    blocks = torch.arange(10) // m
    s = enc(q) @ enc(p).T / tau
    s = s.masked_fill(blocks[:, None] != blocks[None, :], float("-inf"))
    masked = torch.nn.functional.cross_entropy(s, torch.arange(10))
    masked.backward()
    _assert_grads_close(got, _grads(enc), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(naive, masked.detach())
    accumulated_backward(enc, (q, p), loss_fn, m)
    exact = _grads(enc)
    assert max((a - b).abs().max().item() for a, b in zip(got, exact)) > 1e-3        # and it is not the full gradient


def test_under_bf16_autocast_matches_the_full_batch_autocast_step():
    enc = _encoder(p=0.0, dtype=torch.float32)
    q, p, _ = _data(B=12, dtype=torch.float32)
    loss_fn = functools.partial(info_nce, temperature=0.1)
    info_nce(enc(q), enc(p), temperature=0.1).backward()                               # float32, no autocast
    f32 = _grads(enc)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        emb = [enc(q), enc(p)]
        ref_loss = loss_fn(*emb)
        ref_loss.backward()
        ref = _grads(enc)
        res = accumulated_backward(enc, (q, p), loss_fn, 5)
        got = _grads(enc)
    assert res.embeddings[0].dtype == torch.bfloat16 and res.embedding_grads[0].dtype == torch.float32
    # the first pass under autocast computes the same bf16 embeddings, hence the same loss
    torch.testing.assert_close(res.embeddings[0], emb[0].detach(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(res.loss, ref_loss.detach(), rtol=1e-3, atol=1e-3)
    # Gradients are not compared elementwise with the autocast full-batch step: there the bf16 copy of each weight
    # is cached by autocast and its gradient summed in bf16 over the batch, here each micro-batch's share is added
    # to the float32 .grad. Both are within bf16 accuracy of the float32 gradient.
    for a, b, c in zip(got, ref, f32):
        assert (a - c).norm() <= 0.03 * c.norm() + 1e-6
        assert (b - c).norm() <= 0.03 * c.norm() + 1e-6


def test_grad_scaler_scales_the_cache():
    enc = _encoder(p=0.0)
    q, p, _ = _data()
    loss_fn = functools.partial(info_nce, temperature=0.5)
    accumulated_backward(enc, (q, p), loss_fn, 3)
    ref = _grads(enc)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    accumulated_backward(enc, (q, p), loss_fn, 3, scaler=scaler)
    _assert_grads_close(_grads(enc), [64.0 * g for g in ref], rtol=1e-10, atol=1e-12)


def test_split_and_batch_size_of_supported_batch_types():
    x = torch.arange(10).reshape(5, 2)
    assert [c.tolist() for c in split_micro_batches(x, 2)] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]
    d = {"ids": x, "mask": torch.ones(5, 2), "name": "batch"}
    chunks = split_micro_batches(d, 3)
    assert [batch_size(c) for c in chunks] == [3, 2] and chunks[1]["name"] == "batch"
    assert [len(c) for c in split_micro_batches(["a", "b", "c"], 2)] == [2, 1]
    t = split_micro_batches((x, ["a"] * 5), 4)
    assert batch_size(t[0]) == 4 and t[1][1] == ["a"]
    with pytest.raises(ValueError, match="share one batch size"):
        batch_size({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(TypeError, match="a batch must be"):
        batch_size(3.0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_dropout_replay_and_fp16_autocast_with_grad_scaler():
    dev = torch.device("cuda")
    enc = _encoder(dtype=torch.float32).to(dev)                                       # dropout 0.3, on the GPU
    q, p, _ = (x.float().to(dev) for x in _data())
    loss_fn = functools.partial(info_nce, temperature=0.5)
    assert RNGState.capture(q).cuda and RNGState.capture(enc).cuda                   # CUDA generator recorded
    torch.manual_seed(7)                                                              # seeds the CUDA generator too
    _chunked_full_graph([enc, enc], [q, p], loss_fn, [4, 4])
    ref = _grads(enc)
    torch.manual_seed(7)
    accumulated_backward(enc, (q, p), loss_fn, 4)
    # float32 kernels on the GPU may reduce in another order: close, not identical
    _assert_grads_close(_grads(enc), ref, rtol=1e-4, atol=1e-6)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    torch.manual_seed(7)
    with torch.autocast("cuda", dtype=torch.float16):
        res = accumulated_backward(enc, (q, p), loss_fn, 4, scaler=scaler)
    assert res.embeddings[0].dtype == torch.float16 and res.embedding_grads[0].dtype == torch.float32
    for a, b in zip(_grads(enc), ref):                                                # same masks, fp16 forward
        assert (a / 1024.0 - b).norm() <= 0.02 * b.norm() + 1e-6
