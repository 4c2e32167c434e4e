"""Embedding attributions of a Hugging Face GPT-2 (built offline from a tiny config) against Captum, and the chunk
bound that makes long contexts fit: with ``internal_batch_size=c`` no forward pass holds more than ``c`` path
points, whatever the number of steps, and no pass's activations outlive it.

Captum's ``LayerIntegratedGradients`` on ``transformer.wte`` (token-id baselines) and its ``IntegratedGradients`` on
an ``inputs_embeds`` wrapper (embedding baselines) are the references; float64, so the sums agree to ~1e-12 and the
tolerance is the suite's 1e-5 (Captum casts its quadrature weights to float32).
"""
from __future__ import annotations

import weakref

import pytest
import torch
import transformers
from captum.attr import IntegratedGradients as CaptumIG
from captum.attr import LayerIntegratedGradients

from taskloss.attribution import EmbeddingIntegratedGradients

TOL = dict(rtol=1e-5, atol=1e-5)
B, T, V = 3, 10, 61


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                   bos_token_id=V - 1, eos_token_id=V - 1)
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    ids = torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(1))
    return model, ids


def _next_token_logp(model):
    """log p(next token) at the last position; only the last position's logits are computed (a long context's
    [T, V] logits would otherwise dominate the memory of each pass)."""
    return lambda ids: model(ids, logits_to_keep=1).logits[:, -1].log_softmax(-1)


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle", "riemann_right"])
def test_gpt2_token_baseline_equals_captum_layer_ig(gpt2, method):
    model, ids = gpt2
    fwd, target = _next_token_logp(model), torch.tensor([3, 17, 40])
    base = torch.zeros_like(ids)
    ours = EmbeddingIntegratedGradients(fwd, model.transformer.wte).attribute(
        ids, baselines=base, target=target, n_steps=8, method=method, internal_batch_size=5)
    attr, delta = LayerIntegratedGradients(fwd, model.transformer.wte).attribute(
        ids, baselines=base, target=target, n_steps=8, method=method, internal_batch_size=6,
        return_convergence_delta=True)
    assert ours.attributions.shape == (B, T)
    torch.testing.assert_close(ours.attributions, attr.sum(-1), **TOL)
    torch.testing.assert_close(ours.completeness_error, delta, **TOL)


def test_gpt2_zero_embedding_baseline_equals_captum_ig(gpt2):
    model, ids = gpt2
    target = 7
    ours = EmbeddingIntegratedGradients(_next_token_logp(model), model.transformer.wte).attribute(
        ids, target=target, n_steps=16, internal_batch_size=2, sum_embedding=False)
    wrapper = lambda e: model(inputs_embeds=e, logits_to_keep=1).logits[:, -1].log_softmax(-1)   # noqa: E731
    with torch.no_grad():
        emb = model.transformer.wte(ids)
    ref = CaptumIG(wrapper).attribute(emb, baselines=torch.zeros_like(emb), target=target, n_steps=16)
    torch.testing.assert_close(ours.attributions, ref, **TOL)
    # a smooth model and 16 Gauss–Legendre nodes: the path integral is nearly complete
    assert ours.completeness_error.abs().max() < 1e-6 * ours.output_difference.abs().max() + 1e-9


def _passes(model, ids, n_steps, chunk):
    """Rows of every forward pass of one attribution, and how many earlier passes' hidden states were still alive
    when each pass started (the activations of a finished chunk must be freed before the next one runs)."""
    rows, alive, earlier = [], [], []

    def watch(module, inputs, output):
        rows.append(output.shape[0])
        alive.append(sum(r() is not None for r in earlier))
        earlier.append(weakref.ref(output))

    handle = model.transformer.drop.register_forward_hook(watch)   # the hidden states: path points + positions
    try:
        EmbeddingIntegratedGradients(_next_token_logp(model), model.transformer.wte).attribute(
            ids, baselines=0, target=5, n_steps=n_steps, internal_batch_size=chunk)
    finally:
        handle.remove()
    return rows, alive


@pytest.mark.parametrize("chunk", [1, 2, 4, 7])
def test_chunk_bounds_the_path_points_alive_for_any_number_of_steps(gpt2, chunk):
    model, ids = gpt2
    for n_steps in (4, 32):
        rows, alive = _passes(model, ids, n_steps, chunk)
        n_end = -(-2 * B // chunk)              # the last passes: F(x) and F(x′), 2B rows in chunks
        path, ends = rows[:-n_end], rows[-n_end:]
        assert max(rows) <= chunk, (n_steps, rows)
        assert sum(path) == n_steps * B and sum(ends) == 2 * B
        assert max(alive) == 0, f"activations of an earlier chunk alive during a later pass: {alive}"


def test_chunk_smaller_than_the_batch_splits_a_step(gpt2):
    """Captum's chunks are whole steps (at least B rows); one sequence per pass here, with the result unchanged."""
    model, ids = gpt2
    eig = EmbeddingIntegratedGradients(_next_token_logp(model), model.transformer.wte)
    one = eig.attribute(ids, baselines=0, target=5, n_steps=6, internal_batch_size=1)
    full = eig.attribute(ids, baselines=0, target=5, n_steps=6)
    rows, _ = _passes(model, ids, 6, 1)
    assert set(rows) == {1}
    for a, b in zip(one, full):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
