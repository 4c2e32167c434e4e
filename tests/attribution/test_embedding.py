"""EmbeddingIntegratedGradients against Captum on token models: ``LayerIntegratedGradients`` on the embedding layer
(baseline token ids) and ``IntegratedGradients`` on an embedding-input wrapper (zero and arbitrary baseline
embeddings), for a random TransformerLM and the committed pretrained small LM."""
from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients as CaptumIG
from captum.attr import LayerIntegratedGradients
from helpers import make_lm, tokens

from taskloss.attribution import EmbeddingIntegratedGradients
from taskloss.lm import load_pretrained_lm
from taskloss.models import TransformerLM

TOL = dict(rtol=1e-5, atol=1e-5)


def _from_embeddings(model: TransformerLM):
    """The LM's next-token logits as a function of its token embeddings (positions added inside)."""
    def f(emb):
        x = emb + model.pos_emb(torch.arange(emb.shape[1]))
        for block in model.blocks:
            x, _ = block(x)
        return model.head(model.ln_f(x))[:, -1]
    return f


@pytest.fixture(scope="module")
def small_lm():
    model, tok = load_pretrained_lm()
    seqs = [tok.encode("the function returns a list of the values in"),
            tok.encode("if the argument is not a string, a type error")]
    ids = torch.tensor([s[:9] for s in seqs])
    return model, tok, ids


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_middle", "riemann_left"])
def test_random_lm_equals_captum_layer_ig(method):
    model = make_lm("pre").double().eval()
    ids, base = tokens(3, 7), torch.zeros(3, 7, dtype=torch.long)
    fwd = lambda i: model(i)[:, -1]                                               # noqa: E731
    ours = EmbeddingIntegratedGradients(fwd, model.tok_emb).attribute(ids, baselines=base, target=[1, 5, 9],
                                                                       n_steps=12, method=method)
    attr, delta = LayerIntegratedGradients(fwd, model.tok_emb).attribute(
        ids, baselines=base, target=[1, 5, 9], n_steps=12, method=method, return_convergence_delta=True)
    assert ours.attributions.shape == (3, 7)
    torch.testing.assert_close(ours.attributions, attr.sum(-1), **TOL)
    torch.testing.assert_close(ours.completeness_error, delta, **TOL)


def test_small_lm_equals_captum_layer_ig_and_embedding_wrapper(small_lm):
    model, tok, ids = small_lm
    fwd = lambda i: model(i)[:, -1].log_softmax(-1)                                # noqa: E731
    with torch.no_grad():
        nxt = fwd(ids).argmax(-1)
    eig = EmbeddingIntegratedGradients(fwd, model.tok_emb)
    # baseline: the [PAD] token at every position, through Captum's layer method
    ours = eig.attribute(ids, baselines=tok.pad_id, target=nxt, n_steps=24, internal_batch_size=10)
    attr = LayerIntegratedGradients(fwd, model.tok_emb).attribute(ids, baselines=torch.full_like(ids, tok.pad_id),
                                                                  target=nxt, n_steps=24)
    # float32 LM: sums over 128 embedding dimensions and two transformer layers in another order
    torch.testing.assert_close(ours.attributions, attr.sum(-1), **TOL)
    # baseline: zero embeddings, through Captum's IntegratedGradients on an embedding-input wrapper
    ours0 = eig.attribute(ids, target=nxt, n_steps=24, sum_embedding=False)
    wrapper = lambda e: _from_embeddings(model)(e).log_softmax(-1)                 # noqa: E731
    with torch.no_grad():
        emb = model.tok_emb(ids)
    ref0 = CaptumIG(wrapper).attribute(emb, baselines=torch.zeros_like(emb), target=nxt, n_steps=24)
    assert ours0.attributions.shape == emb.shape
    torch.testing.assert_close(ours0.attributions, ref0, **TOL)
    assert ours0.completeness_error.abs().max() < 1e-3 * ours0.output_difference.abs().max()


def test_baseline_embeddings_and_sets(small_lm):
    model, _, ids = small_lm
    fwd = lambda i: model(i)[:, -1]                                               # noqa: E731
    eig = EmbeddingIntegratedGradients(fwd, model.tok_emb)
    with torch.no_grad():
        emb = model.tok_emb(ids)
    gen = torch.Generator().manual_seed(0)
    set_ = 0.02 * torch.randn(3, 1, *emb.shape[1:], generator=gen)                # K=3 baseline embeddings
    got = eig.attribute(ids, baselines=set_, target=7, n_steps=8)
    wrapper = _from_embeddings(model)
    refs = [CaptumIG(wrapper).attribute(emb, baselines=set_[k], target=7, n_steps=8).sum(-1) for k in range(3)]
    torch.testing.assert_close(got.attributions, torch.stack(refs).mean(0), **TOL)


def test_sum_embedding_false_sums_to_the_token_scores():
    model = make_lm("post").double().eval()
    ids = tokens(2, 5)
    eig = EmbeddingIntegratedGradients(lambda i: model(i)[:, -1], model.tok_emb)
    full = eig.attribute(ids, target=3, n_steps=6, sum_embedding=False)
    summed = eig.attribute(ids, target=3, n_steps=6)
    torch.testing.assert_close(full.attributions.sum(-1), summed.attributions, rtol=1e-12, atol=1e-12)
    assert not model.tok_emb._forward_hooks, "the hook must be removed after attribution"
