"""Exact accumulation against its peers, gradient for gradient, where conventions match:

* GradCache (Gao et al., 2021; PyPI ``gradcache`` 0.0.1, github.com/luyug/GradCache): ``SimpleContrastiveLoss`` is
  cross-entropy of raw dot products, mean over queries, so ``info_nce(temperature=1)``; its hard negatives are
  interleaved per query (y = [p_1, h_1…, p_2, h_2…]), ours are appended columns — the same softmax, reordered.
  The functional API (``cached``) is used as published; the ``GradCache`` class is imported after aliasing the
  module name its file imports (``grad_cache``, the repository's name, absent from the 0.0.1 wheel).
* sentence-transformers' ``CachedMultipleNegativesRankingLoss`` on a SentenceTransformer of all-MiniLM-L6-v2's
  layout (a small BERT from a config with MiniLM's tokenizer): cosine similarity × scale
  (20) = unit embeddings with ``temperature = 1/scale``; its ``directions=("query_to_doc", "doc_to_query"),
  partition_mode="per_direction"`` is our ``symmetric=True``; triplets' negatives are our hard negatives.

Both replay the CPU RNG state per micro-batch and embed input by input, so with dropout on they draw the same
masks as we do when sequences have equal lengths (sentence-transformers trims padding per mini-batch).
"""
from __future__ import annotations

import functools
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskloss.contrastive import accumulated_backward, info_nce

D = torch.float64


def _encoder():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 5)).to(D)


def _grads(m):
    """Gradients by parameter name (parameters the loss does not reach, e.g. MiniLM's unused pooler, have none)."""
    out = {name: p.grad.clone() for name, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return list(out.items())


def _close(a, b, **tol):
    assert [k for k, _ in a] == [k for k, _ in b] and a
    for (_, x), (_, y) in zip(a, b):
        torch.testing.assert_close(x, y, **tol)


def test_gradcache_functional_api_with_dropout():
    gc = pytest.importorskip("gradcache.functional")
    from gradcache.loss import SimpleContrastiveLoss

    enc = _encoder()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 6, generator=g, dtype=D), torch.randn(10, 6, generator=g, dtype=D)
    call = gc.cached(lambda m, inp: m(inp))
    loss_fn = gc.cat_input_tensor(SimpleContrastiveLoss())
    torch.manual_seed(4)
    cx, fx = zip(*[call(enc, c) for c in x.split(4)])           # input by input, as accumulated_backward does
    cy, fy = zip(*[call(enc, c) for c in y.split(4)])
    ref_loss = loss_fn(list(cx), list(cy))
    ref_loss.backward()
    for f, r in zip(fx + fy, cx + cy):
        f(r)
    ref = _grads(enc)
    torch.manual_seed(4)
    res = accumulated_backward(enc, (x, y), functools.partial(info_nce, temperature=1.0), 4)
    torch.testing.assert_close(res.loss, ref_loss.detach())
    _close(_grads(enc), ref, rtol=1e-10, atol=1e-12)


@pytest.fixture
def gradcache_class(monkeypatch):
    pkg = pytest.importorskip("gradcache")
    ctx = importlib.import_module("gradcache.context_managers")
    monkeypatch.setitem(sys.modules, "grad_cache", pkg)
    monkeypatch.setitem(sys.modules, "grad_cache.context_managers", ctx)
    monkeypatch.delitem(sys.modules, "gradcache.grad_cache", raising=False)
    return importlib.import_module("gradcache.grad_cache").GradCache


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("hard", [0, 2])
def test_gradcache_class_two_towers_with_dropout(gradcache_class, hard):
    from gradcache.loss import SimpleContrastiveLoss

    q_enc, d_enc = _encoder(), _encoder()
    with torch.no_grad():
        d_enc[0].weight.mul_(-1.0)                               # different towers
    g = torch.Generator().manual_seed(2)
    B = 9
    x, p = torch.randn(B, 6, generator=g, dtype=D), torch.randn(B, 6, generator=g, dtype=D)
    h = torch.randn(B * hard, 6, generator=g, dtype=D)
    # GradCache's layout: each query's positive followed by its own hard negatives
    y = torch.cat([p[:, None], h.view(B, hard, 6)], 1).reshape(-1, 6) if hard else p
    cache = gradcache_class(models=[q_enc, d_enc], chunk_sizes=[4, 5], loss_fn=SimpleContrastiveLoss(hard))
    torch.manual_seed(5)
    ref_loss = cache(x, y)
    ref = _grads(q_enc) + _grads(d_enc)
    # ours: hard negatives appended as shared columns (the same candidate set for every query)
    cand = (lambda a, b, c: info_nce(a, b, hard_negatives=c, temperature=1.0)) if hard else \
        functools.partial(info_nce, temperature=1.0)
    # y is embedded as one input by GradCache: embed it as one input too (split after), so the RNG draws match
    def loss_fn(a, yy):
        yy = yy.view(B, hard + 1, -1)
        return cand(a, yy[:, 0], yy[:, 1:].reshape(-1, yy.shape[-1])) if hard else cand(a, yy[:, 0])
    torch.manual_seed(5)
    res = accumulated_backward((q_enc, d_enc), (x, y), loss_fn, [4, 5])
    torch.testing.assert_close(res.loss, ref_loss)
    _close(_grads(q_enc) + _grads(d_enc), ref, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------ sentence-transformers
WORDS = "the a cat dog red blue big small house car tree sun moon water fire book".split()


def _sentences(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (7,), generator=g).tolist()) for _ in range(n)]


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    """A SentenceTransformer of all-MiniLM-L6-v2's layout (BERT → mean pooling → normalization, MiniLM's tokenizer,
    dropout 0.1) around a 2-layer, width-32 BERT built from a config: the peer's conventions and RNG replay are
    what is compared, and they do not depend on the encoder's size (the full MiniLM took 2 s a case)."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer import modules
    from transformers import AutoTokenizer, BertConfig, BertModel

    from taskloss.datasets.tokenizer import minilm_path

    folder = str(tmp_path_factory.mktemp("tiny_bert"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True).save_pretrained(folder)
    tr = modules.Transformer(folder, max_seq_length=32)
    return st.SentenceTransformer(modules=[tr, modules.Pooling(tr.get_embedding_dimension(), "mean"),
                                           modules.Normalize()], device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["plain_dropout", "symmetric", "hard_negatives"])
def test_sentence_transformers_cached_mnrl(st_model, variant):
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    n, mini = 7, 3                                                   # 3 does not divide 7
    cols = [_sentences(n, 0), _sentences(n, 1)] + ([_sentences(n, 2)] if variant == "hard_negatives" else [])
    feats = [st_model.tokenize(c) for c in cols]
    assert all(bool(f["attention_mask"].all()) for f in feats)      # equal lengths: no per-mini-batch trimming
    kw = dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction") \
        if variant == "symmetric" else {}
    loss_st = CachedMultipleNegativesRankingLoss(st_model, scale=20.0, mini_batch_size=mini, **kw)
    st_model.train(variant == "plain_dropout")
    try:
        torch.manual_seed(11)
        ref_loss = loss_st([dict(f) for f in feats], None)
        ref_loss.backward()
        ref = _grads(st_model)
        encoder = lambda f: F.normalize(st_model(dict(f))["sentence_embedding"], dim=-1)   # noqa: E731
        if variant == "hard_negatives":
            loss_fn = lambda a, b, c: info_nce(a, b, hard_negatives=c, temperature=1 / 20)   # noqa: E731
        else:
            loss_fn = functools.partial(info_nce, temperature=1 / 20, symmetric=variant == "symmetric")
        torch.manual_seed(11)
        res = accumulated_backward(encoder, feats, loss_fn, mini)
    finally:
        st_model.eval()
    torch.testing.assert_close(res.loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    # float32, and the two compute the loss in different chunks and orders: close, not identical
    _close(_grads(st_model), ref, rtol=1e-4, atol=2e-6)
