"""Guards of the exact accumulation that no argument can switch off: the replay tolerance is a finite positive
number, an encoder normalizing with batch statistics (BatchNorm in training mode, or without running statistics)
is refused before anything runs, and replay_backward refuses mismatched or non-finite inputs instead of doing
nothing or writing NaN into the gradients."""
from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from taskloss.contrastive import (
    accumulated_backward,
    check_batch_independent,
    embed_micro_batches,
    embedding_gradients,
    info_nce,
    replay_backward,
    split_micro_batches,
)

D = torch.float64
LOSS = functools.partial(info_nce, temperature=0.5)


def _encoder(norm: nn.Module | None = None, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 8)] + ([norm] if norm is not None else []) + [nn.Tanh(), nn.Linear(8, 4)]
    return nn.Sequential(*layers).to(D)


def _data(B: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 6, generator=g, dtype=D), torch.randn(B, 6, generator=g, dtype=D)


class _Unreplayed(nn.Module):
    """Noise from a generator of its own, which the RNG replay does not restore: pass 2 differs from pass 1."""

    def __init__(self):
        super().__init__()
        self.lin, self.gen = nn.Linear(6, 4).to(D), torch.Generator().manual_seed(0)

    def forward(self, x):
        return self.lin(x) + 0.1 * torch.randn(x.shape[0], 4, generator=self.gen, dtype=D)


def _passes(enc, x, m=3):
    chunks = split_micro_batches(x, m)
    embs, states = embed_micro_batches(enc, chunks)
    _, grads = embedding_gradients(lambda e: (e ** 2).sum(), [torch.cat(embs)])
    return chunks, list(grads[0].split([e.shape[0] for e in embs])), states, embs


# ------------------------------------------------------------------------------------------------ replay_tol
@pytest.mark.parametrize("tol", [math.nan, math.inf, -1e-3, 0.0])
def test_replay_tol_must_be_finite_and_positive(tol):
    enc, (q, p) = _encoder(), _data()
    with pytest.raises(ValueError, match="replay_tol must be > 0 and finite"):
        accumulated_backward(enc, [q, p], LOSS, 3, replay_tol=tol)
    assert all(w.grad is None for w in enc.parameters())          # refused before any pass
    chunks, grads, states, embs = _passes(enc, q)
    with pytest.raises(ValueError, match="replay_tol"):
        replay_backward(enc, chunks, grads, states, embs, replay_tol=tol)


def test_replay_tol_type_checked():
    enc, (q, p) = _encoder(), _data()
    with pytest.raises(TypeError, match="replay_tol must be a number"):
        accumulated_backward(enc, [q, p], LOSS, 3, replay_tol="1e-3")


def test_a_replay_that_drifts_still_fails_at_a_loose_finite_tolerance():
    """What replay_tol=nan used to hide (NaN > tol is False): an encoder whose randomness is not replayed."""
    enc, (q, p) = _Unreplayed(), _data()
    with pytest.raises(RuntimeError, match="second pass differs from the first"):
        accumulated_backward(enc, [q, p], LOSS, 3, replay_tol=1e-6)
    enc.zero_grad(set_to_none=True)
    accumulated_backward(enc, [q, p], LOSS, 3, replay_tol=10.0)   # a loose tolerance is the caller's choice


# ------------------------------------------------------------------------------------------------ BatchNorm
def test_train_mode_batchnorm_refused_before_anything_runs():
    bn = nn.BatchNorm1d(8).to(D)
    enc, (q, p) = _encoder(bn), _data()
    stats = bn.running_mean.clone(), int(bn.num_batches_tracked)
    with pytest.raises(ValueError, match=r"BatchNorm1d '1', which is in training mode.*eval mode"):
        accumulated_backward(enc, [q, p], LOSS, 3)
    torch.testing.assert_close(bn.running_mean, stats[0])        # no forward ran: statistics untouched
    assert int(bn.num_batches_tracked) == stats[1]
    assert all(w.grad is None for w in enc.parameters())


def test_batchnorm_without_running_stats_refused_even_in_eval_mode():
    enc, (q, p) = _encoder(nn.BatchNorm1d(8, track_running_stats=False)), _data()
    enc.eval()
    with pytest.raises(ValueError, match="track_running_stats=False"):
        accumulated_backward(enc, [q, p], LOSS, 3)


def test_second_tower_named_and_public_passes_refuse_too():
    q_enc, d_enc, (q, p) = _encoder(), _encoder(nn.BatchNorm1d(8), seed=1), _data()
    with pytest.raises(ValueError, match="encoder 1 holds BatchNorm1d"):
        accumulated_backward([q_enc, d_enc], [q, p], LOSS, 3)
    with pytest.raises(ValueError, match="BatchNorm1d"):
        embed_micro_batches(d_enc, split_micro_batches(p, 3))
    with pytest.raises(ValueError, match="SyncBatchNorm"):
        check_batch_independent(nn.Sequential(nn.SyncBatchNorm(4)))
    check_batch_independent(lambda x: x)                          # a plain callable cannot be inspected


def test_eval_mode_batchnorm_accepted_and_exact():
    """BatchNorm with running statistics in eval mode is a per-sample affine map: the accumulated gradient is the
    full-batch one."""
    bn = nn.BatchNorm1d(8).to(D)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    enc, (q, p) = _encoder(bn), _data()
    enc.eval()
    LOSS(enc(q), enc(p)).backward()
    full = [w.grad.clone() for w in enc.parameters()]
    enc.zero_grad(set_to_none=True)
    accumulated_backward(enc, [q, p], LOSS, 3)
    for a, b in zip(full, [w.grad for w in enc.parameters()]):
        torch.testing.assert_close(a, b)
    assert bn.training is False


# ------------------------------------------------------------------------------------------------ replay_backward
def _no_grad_written(enc):
    return all(w.grad is None for w in enc.parameters())


@pytest.mark.parametrize("drop", ["grads", "states", "chunks", "reference"])
def test_replay_backward_lengths_must_agree(drop):
    enc, (q, _) = _encoder(), _data()
    chunks, grads, states, embs = _passes(enc, q)
    args = {"chunks": chunks, "grads": grads, "states": states, "reference": embs}
    args[drop] = args[drop][:-1]
    with pytest.raises(ValueError, match="one grad, state .* per micro-batch"):
        replay_backward(enc, args["chunks"], args["grads"], args["states"], args["reference"])
    assert _no_grad_written(enc)


def test_replay_backward_refuses_nan_cache_without_touching_grads():
    enc, (q, _) = _encoder(), _data()
    chunks, grads, states, embs = _passes(enc, q)
    grads[1] = grads[1].clone()
    grads[1][0, 0] = math.nan
    with pytest.raises(ValueError, match=r"grads\[1\] contains NaN or inf"):
        replay_backward(enc, chunks, grads, states, embs)
    assert _no_grad_written(enc)


def test_replay_backward_refuses_empty_wrong_rows_and_wrong_states():
    enc, (q, _) = _encoder(), _data()
    chunks, grads, states, embs = _passes(enc, q)
    with pytest.raises(ValueError, match="no micro-batch"):
        replay_backward(enc, [], [], [])
    with pytest.raises(ValueError, match=r"grads\[0\] has 2 rows but micro-batch 0 has 3 samples"):
        replay_backward(enc, chunks, [grads[0][:2]] + grads[1:], states)
    with pytest.raises(ValueError, match=r"reference\[2\] must have the shape"):
        replay_backward(enc, chunks, grads, states, embs[:2] + [embs[2][:, :2]])
    with pytest.raises(TypeError, match=r"states\[0\] must be an RNGState"):
        replay_backward(enc, chunks, grads, [None] + states[1:])
    with pytest.raises(ValueError, match=r"grads\[0\] must be a floating \[n, d\] tensor"):
        replay_backward(enc, chunks, [grads[0].long()] + grads[1:], states)
    assert _no_grad_written(enc)


def test_replay_backward_valid_inputs_give_the_full_batch_gradient():
    enc, (q, _) = _encoder(), _data()
    chunks, grads, states, embs = _passes(enc, q)
    replay_backward(enc, chunks, grads, states, embs)
    got = [w.grad.clone() for w in enc.parameters()]
    enc.zero_grad(set_to_none=True)
    (enc(q) ** 2).sum().backward()
    for a, b in zip(got, [w.grad for w in enc.parameters()]):
        torch.testing.assert_close(a, b)
