"""The committed pretrained small LM (taskloss.lm.pretrained): its metadata matches the declared build recipe,
its perplexity is reproduced, a missing copy is rebuilt, and it runs on CUDA like on the CPU."""
import importlib.util
import json
import math
import platform
import shutil

import pytest
import torch

from taskloss import utils
from taskloss.datasets import Tokenizer, corpus, corpus_hash, get_tokenizer, lm_blocks, minilm, prefix_continuations
from taskloss.lm import pretrained


def _build_module():
    spec = importlib.util.spec_from_file_location("build_pretrained_lm", utils.DATA_DIR / "build_pretrained_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def meta():
    return json.loads((pretrained.PRETRAINED_DIR / "meta.json").read_text())


def _same_python(meta):
    # the default corpus is the standard library's own text: other Python patch releases give another corpus
    return platform.python_version() == meta["versions"]["python"]


def test_pretrained_meta_matches_declared_recipe(meta, tok):
    build = _build_module()
    assert meta["config"] == json.loads(json.dumps(build.CONFIG))
    assert meta["config"]["train"]["steps"] == meta["declared_steps"]
    saved = Tokenizer.load(pretrained.PRETRAINED_DIR / "tokenizer.json")  # the LM's own copy always loads and matches
    assert meta["tokenizer_sha256"] == saved.hash and meta["vocab_size"] == saved.vocab_size
    assert (pretrained.PRETRAINED_DIR / "model.pt").stat().st_size == meta["model_file_bytes"] <= 6_000_000
    if not _same_python(meta):
        pytest.skip(f"corpus recorded under Python {meta['versions']['python']}, running {platform.python_version()}")
    assert meta["corpus_sha256"] == corpus_hash()
    assert meta["corpus_stats"] == corpus.corpus_stats()
    assert meta["tokenizer_sha256"] == get_tokenizer(meta["config"]["train"]["min_count"]).hash


def test_pretrained_lm_perplexity_and_generation(meta):
    from taskloss.lm import generate
    from taskloss.models import TransformerLM

    model, tk = pretrained.load_pretrained_lm()
    assert isinstance(model, TransformerLM) and not model.training
    assert sum(p.numel() for p in model.parameters()) == meta["n_params"]
    bs = meta["config"]["train"]["block_size"]
    blocks = lm_blocks("valid", bs, tk)[: meta["check"]["blocks"]]
    with torch.no_grad():
        logits = model(blocks[:, :-1]).double()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))
    assert math.exp(nll.item()) < 0.5 * corpus.unigram_perplexity("valid", tk)  # far below the unigram baseline
    assert meta["valid_ppl"] < 0.5 * meta["unigram_valid_ppl"]
    if _same_python(meta):  # the same blocks as at build time: the recorded perplexity is reproduced
        assert math.exp(nll.item()) == pytest.approx(meta["check"]["valid_ppl"], rel=1e-3)
        assert meta["unigram_valid_ppl"] == pytest.approx(corpus.unigram_perplexity("valid", tk), rel=1e-9)
    prefixes, _ = prefix_continuations("valid", 10, 10, tk, max_items=8)
    out = generate(model, prefixes, 12, eos_id=tk.eos_id, pad_id=tk.pad_id)
    assert out.shape == (8, 12) and not (out[:, 0] == tk.eos_id).all()
    assert len(set(tk.decode(o) for o in out)) > 1


def test_load_pretrained_lm_missing_and_rebuild(tmp_path, monkeypatch, capsys):
    with pytest.raises(FileNotFoundError, match="make pretrained"):
        pretrained.load_pretrained_lm(folder=tmp_path / "none", rebuild_if_missing=False)

    class FakeBuild:  # stands in for the minutes-long training: copies the committed artifact
        @staticmethod
        def build(out_dir, force):
            shutil.copytree(pretrained.PRETRAINED_DIR, out_dir)

    monkeypatch.setattr(pretrained, "_build_script", lambda: FakeBuild)
    model, tk = pretrained.load_pretrained_lm(folder=tmp_path / "rebuilt")
    assert "rebuilding" in capsys.readouterr().out and tk.vocab_size == model.vocab_size


def test_build_lr_schedule():
    build = _build_module()
    cfg = build.CONFIG["train"]
    lrs = [build.lr_at(s, cfg) for s in range(cfg["steps"])]
    assert lrs[cfg["warmup"] - 1] == pytest.approx(cfg["lr"])
    assert lrs[0] == pytest.approx(cfg["lr"] / cfg["warmup"])
    after = lrs[cfg["warmup"]:]
    assert all(a >= b for a, b in zip(after, after[1:]))  # cosine decay is monotone
    assert min(after) >= cfg["lr"] * cfg["min_lr_ratio"] - 1e-12 and after[-1] < 0.15 * cfg["lr"]


def test_minilm_and_lm_bad_devices():
    with pytest.raises(TypeError):
        minilm.load_minilm(device=3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            pretrained.load_pretrained_lm(device="cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    model, tk = pretrained.load_pretrained_lm(device="cuda")
    cpu_model, _ = pretrained.load_pretrained_lm(device="cpu")
    blocks = lm_blocks("valid", 64, tk)[:4]
    with torch.no_grad():
        torch.testing.assert_close(model(blocks.cuda()).cpu(), cpu_model(blocks), atol=1e-3, rtol=1e-3)
    sents = ["A function returns a value.", "Cats sleep in the sun."]
    torch.testing.assert_close(minilm.sentence_embeddings(sents, device="cuda").cpu(),
                               minilm.sentence_embeddings(sents), atol=1e-4, rtol=1e-4)
