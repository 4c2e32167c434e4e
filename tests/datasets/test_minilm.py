"""MiniLM token and sentence embeddings, offline (taskloss.datasets.minilm), against transformers and
sentence-transformers."""
import pytest
import torch

from taskloss.datasets import load_corpus, minilm
from taskloss.datasets import tokenizer as tokenizer_module


def test_minilm_token_embeddings(tok):
    full = minilm.minilm_token_embeddings()
    assert full.shape == (30522, 384) and full.dtype == torch.float32 and torch.isfinite(full).all()
    rows = minilm.minilm_token_embeddings(tok)
    assert torch.equal(rows, full[tok.bert_ids])
    with pytest.raises(TypeError):
        minilm.minilm_token_embeddings("vocab")


@pytest.mark.slow
def test_minilm_model_and_embeddings_match_hf(tok):
    hf_tok, model = minilm.load_minilm()
    assert not model.training
    torch.testing.assert_close(minilm.minilm_token_embeddings(), model.embeddings.word_embeddings.weight.detach())
    s = load_corpus("valid")[3]
    assert hf_tok(s, add_special_tokens=False)["input_ids"] == tokenizer_module._wordpiece().encode(s, add_special_tokens=False).ids


@pytest.mark.slow
def test_sentence_embeddings_match_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    sents = ["A function returns a value.", "The return statement leaves the current function call.",
             "Mean pooling averages the token vectors of a sentence.", "Cats sleep in the sun."]
    ours = minilm.sentence_embeddings(sents, batch_size=3)
    ref = st.SentenceTransformer(str(tokenizer_module.minilm_path()), device="cpu").encode(sents, convert_to_tensor=True)
    assert ours.shape == (4, 384)
    torch.testing.assert_close(ours, ref.float(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(4))
    sim = ours @ ours.T
    assert sim[0, 1] > sim[0, 3] + 0.2  # related sentences are closer than unrelated ones


def test_sentence_embeddings_bad_inputs():
    with pytest.raises(TypeError):
        minilm.sentence_embeddings("one string")
    with pytest.raises(ValueError, match="empty"):
        minilm.sentence_embeddings([])
    with pytest.raises(ValueError):
        minilm.sentence_embeddings(["a"], batch_size=0)
