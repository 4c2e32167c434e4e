"""Task losses against their references: scikit-learn, rapidfuzz, sacrebleu, and direct Python definitions."""
from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import sacrebleu
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein
from sklearn.metrics import accuracy_score, f1_score

from taskloss.losses import metrics as M

token_lists = st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=1, max_size=6)


# ----------------------------------------------------------------------------------------- references
def ref_seq_rep(seq, n):
    grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
    return 0.0 if not grams else 1.0 - len(set(grams)) / len(grams)


def ref_token_rep(seq, window):
    if not seq:
        return 0.0
    hits = sum(seq[t] in (seq[:t] if window is None else seq[max(0, t - window):t]) for t in range(len(seq)))
    return hits / len(seq)


def cut(seq, eos):
    return seq[: seq.index(eos)] if eos in seq else seq


def random_pairs(n, rng, vocab=5, max_len=14):
    hs = [[rng.randrange(vocab) for _ in range(rng.randrange(0, max_len))] for _ in range(n)]
    rs = [[rng.randrange(vocab) for _ in range(rng.randrange(0, max_len))] for _ in range(n)]
    return hs, rs


def pad(seqs, value):
    T = max(1, max(len(s) for s in seqs))
    return torch.tensor([s + [value] * (T - len(s)) for s in seqs], dtype=torch.long)


# ------------------------------------------------------------------------------------- classification
def test_accuracy_matches_sklearn_and_batches():
    g = torch.Generator().manual_seed(0)
    pred = torch.randint(0, 4, (7, 50), generator=g)
    target = torch.randint(0, 4, (50,), generator=g)
    acc = M.accuracy(pred, target)
    assert acc.shape == (7,)
    for s in range(7):
        assert acc[s].item() == pytest.approx(accuracy_score(target.numpy(), pred[s].numpy()))
    torch.testing.assert_close(M.zero_one_loss(pred, target), 1 - acc)
    per = M.accuracy(pred, target, reduction="none")
    assert per.shape == (7, 50) and set(per.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("zero_division", [0.0, 1.0])
def test_macro_f1_matches_sklearn_including_absent_classes(zero_division):
    rng = np.random.default_rng(1)
    warnings.simplefilter("ignore")  # sklearn warns about ill-defined classes
    for _ in range(150):
        C, N = int(rng.integers(1, 7)), int(rng.integers(1, 9))  # small N: classes often absent
        t, p = rng.integers(0, C, N), rng.integers(0, C, N)
        ours = M.macro_f1(torch.tensor(p), torch.tensor(t), C, zero_division=zero_division).item()
        ref = f1_score(t, p, labels=list(range(C)), average="macro", zero_division=zero_division)
        assert ours == pytest.approx(ref, abs=1e-6)
        ours_p = M.macro_f1(torch.tensor(p), torch.tensor(t), C, labels="present",
                            zero_division=zero_division).item()
        assert ours_p == pytest.approx(f1_score(t, p, average="macro", zero_division=zero_division), abs=1e-6)


def test_macro_f1_batched_over_samples_and_loss():
    g = torch.Generator().manual_seed(2)
    pred = torch.randint(0, 5, (4, 3, 20), generator=g)
    target = torch.randint(0, 5, (20,), generator=g)
    f = M.macro_f1(pred, target, 5)
    assert f.shape == (4, 3)
    assert f[2, 1].item() == pytest.approx(M.macro_f1(pred[2, 1], target, 5).item())
    torch.testing.assert_close(M.macro_f1_loss(pred, target, 5), 1 - f)


def test_classification_bad_inputs():
    y = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError):
        M.accuracy(torch.tensor([0.0, 1.0, 2.0]), y)
    with pytest.raises(TypeError):
        M.accuracy([0, 1, 2], y)
    with pytest.raises(ValueError, match="batch sizes differ"):
        M.accuracy(torch.tensor([0, 1]), y)
    with pytest.raises(ValueError, match="empty"):
        M.accuracy(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="reduction"):
        M.accuracy(y, y, reduction="sum")
    with pytest.raises(ValueError, match="class ids"):
        M.macro_f1(torch.tensor([0, 1, 3]), y, 3)
    with pytest.raises(ValueError):
        M.macro_f1(y, y, 0)
    with pytest.raises(ValueError, match="labels"):
        M.macro_f1(y, y, 3, labels="weird")
    with pytest.raises(TypeError):
        M.macro_f1(y.float(), y, 3)


# ------------------------------------------------------------------------------------------ edit distance
def test_edit_distance_matches_rapidfuzz_on_random_lists():
    rng = random.Random(0)
    hs, rs = random_pairs(3000, rng)
    hs[:3], rs[:3] = [[], [1], []], [[], [], [2, 3]]           # empty cases
    raw = M.edit_distance(hs, rs, normalize=False)
    ref = torch.tensor([Levenshtein.distance(h, r) for h, r in zip(hs, rs)])
    assert raw.dtype == torch.long
    assert torch.equal(raw, ref)
    norm = M.edit_distance(hs, rs)
    expected = torch.tensor([min(d / len(r), 1.0) if r else float(len(h) > 0)
                             for d, h, r in zip(ref.tolist(), hs, rs)])
    torch.testing.assert_close(norm, expected.to(norm.dtype))
    assert norm[:3].tolist() == [0.0, 1.0, 1.0]


def test_edit_distance_padded_tensors_eos_and_pad():
    rng = random.Random(1)
    eos, padv = 6, 7
    hs, rs = random_pairs(500, rng, vocab=7)                     # includes EOS tokens inside
    ref = torch.tensor([Levenshtein.distance(cut(h, eos), cut(r, eos)) for h, r in zip(hs, rs)])
    # lists cut at eos
    assert torch.equal(M.edit_distance(hs, rs, eos_id=eos, normalize=False), ref)
    # padded tensors with explicit lengths (pad value collides with a real token id on purpose)
    H, R = pad(hs, 3), pad(rs, 3)
    lh = torch.tensor([len(h) for h in hs])
    lr = torch.tensor([len(r) for r in rs])
    got = M.edit_distance(H, R, eos_id=eos, normalize=False, hyp_lengths=lh, ref_lengths=lr)
    assert torch.equal(got, ref)
    # padded tensors whose length is given by the first pad_id
    hs2 = [[t for t in h if t != padv] for h in hs]
    rs2 = [[t for t in r if t != padv] for r in rs]
    ref2 = torch.tensor([Levenshtein.distance(cut(h, eos), cut(r, eos)) for h, r in zip(hs2, rs2)])
    got2 = M.edit_distance(pad(hs2, padv), pad(rs2, padv), eos_id=eos, pad_id=padv, normalize=False)
    assert torch.equal(got2, ref2)


def test_edit_distance_mixed_inputs_follow_tensor_device():
    h = torch.tensor([[1, 2, 3], [4, 5, 0]])
    out = M.edit_distance(h, [[1, 3], []])
    assert out.device == h.device
    torch.testing.assert_close(out, torch.tensor([0.5, 1.0]))


def test_edit_distance_bad_inputs():
    with pytest.raises(ValueError, match="batch sizes differ"):
        M.edit_distance([[1]], [[1], [2]])
    with pytest.raises(ValueError, match="empty"):
        M.edit_distance([], [])
    with pytest.raises(ValueError, match="empty"):
        M.edit_distance(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        M.edit_distance(torch.rand(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="ints"):
        M.edit_distance([[1.0, 2.0]], [[1]])
    with pytest.raises(ValueError, match="lengths"):
        M.edit_distance(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long),
                        hyp_lengths=torch.tensor([4, 1]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        M.edit_distance(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError):
        M.edit_distance("abc", "abd")
    with pytest.raises(ValueError, match="backend"):
        M.edit_distance([[1]], [[1]], backend="numba")
    with pytest.raises(TypeError, match="normalize"):
        M.edit_distance([[1]], [[1]], normalize="yes")


@pytest.mark.parametrize("eos,padv", [(None, None), (6, None), (6, 7)])
def test_edit_distance_backends_agree(eos, padv):
    """rapidfuzz (CPU default) and the batched torch kernel (forced here on CPU; the GPU default) give the same
    integers and normalized values as rapidfuzz pair by pair, with EOS/pad cutting and empty rows."""
    rng = random.Random(2)
    hs, rs = random_pairs(400, rng, vocab=8, max_len=20)
    hs[:4], rs[:4] = [[], [1], [], [6, 1]], [[], [], [2, 3], [6]]
    H, R = pad(hs, 7), pad(rs, 7)

    def row(x):             # what the metric scores: up to the first pad id, then up to the first EOS
        x = x[: x.index(padv)] if padv is not None and padv in x else x
        return cut(x, eos) if eos is not None else x

    want = torch.tensor([Levenshtein.distance(row(h), row(r)) for h, r in zip(H.tolist(), R.tolist())])
    ref_len = torch.tensor([len(row(r)) for r in R.tolist()])
    want_norm = torch.where(ref_len > 0, want / ref_len.clamp_min(1), (want > 0).double()).clamp_max(1)
    for backend in M.EDIT_DISTANCE_BACKENDS:
        raw = M.edit_distance(H, R, eos_id=eos, pad_id=padv, normalize=False, backend=backend)
        assert raw.dtype == torch.long and torch.equal(raw, want), backend
        norm = M.edit_distance(H, R, eos_id=eos, pad_id=padv, backend=backend)
        torch.testing.assert_close(norm, want_norm.to(norm.dtype))


def test_edit_distance_any_integer_ids():
    """Ids beyond Unicode's range (or negative) are renumbered for the string path: same distances as lists."""
    rng = random.Random(3)
    hs, rs = random_pairs(200, rng, vocab=6)
    big = [[-5, 2**40, 3], [2**40]] + [[x * 10**9 - 3 for x in h] for h in hs]
    ref = [[2**40, 3], [-5]] + [[x * 10**9 - 3 for x in r] for r in rs]
    want = torch.tensor([Levenshtein.distance(h, r) for h, r in zip(big, ref)])
    for backend in ("rapidfuzz", "torch"):
        assert torch.equal(M.edit_distance(big, ref, normalize=False, backend=backend), want)


@pytest.mark.parametrize("bad", [0.5, "2", True, 2.0, None])
def test_token_ids_must_be_ints(bad):
    seqs = torch.tensor([[1, 2, 3]])
    if bad is not None:
        with pytest.raises(TypeError, match="eos_id must be an int"):
            M.edit_distance(seqs, seqs, eos_id=bad)
        with pytest.raises(TypeError, match="pad_id must be an int"):
            M.repetition(seqs, 2, pad_id=bad)
        with pytest.raises(TypeError, match="eos_id must be an int"):
            M.non_termination(seqs, bad)
    else:
        with pytest.raises(TypeError, match="eos_id must be an int"):
            M.non_termination(seqs, None)
    assert M.edit_distance(seqs, seqs, eos_id=np.int64(2), normalize=False).tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(token_lists, token_lists)
def test_edit_distance_properties(hs, rs):
    n = min(len(hs), len(rs))
    hs, rs = hs[:n], rs[:n]
    d = M.edit_distance(hs, rs)
    assert not torch.isnan(d).any() and bool(((d >= 0) & (d <= 1)).all())
    raw = M.edit_distance(hs, rs, normalize=False)
    assert torch.equal(raw, M.edit_distance(rs, hs, normalize=False))            # symmetric (raw)
    assert torch.equal(M.edit_distance(hs, hs), torch.zeros(n, dtype=d.dtype))   # identity → 0
    lens = torch.tensor([abs(len(h) - len(r)) for h, r in zip(hs, rs)])
    assert bool((raw >= lens).all()) and bool((raw <= torch.tensor([max(len(h), len(r))
                                                                     for h, r in zip(hs, rs)])).all())


# ------------------------------------------------------------------------------------------------- repetition
def test_repetition_and_token_repeat_rate_match_definitions():
    rng = random.Random(3)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(0, 20))] for _ in range(300)]
    for n in (1, 2, 4):
        torch.testing.assert_close(M.repetition(seqs, n=n),
                                   torch.tensor([ref_seq_rep(s, n) for s in seqs]))
    for w in (None, 1, 3, 8):
        torch.testing.assert_close(M.token_repeat_rate(seqs, window=w),
                                   torch.tensor([ref_token_rep(s, w) for s in seqs]))


def test_repetition_cuts_at_eos_and_pad():
    x = torch.tensor([[1, 2, 1, 2, 9, 1, 2, 1, 2], [3, 3, 3, 0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(M.repetition(x, n=2, eos_id=9, pad_id=0),
                               torch.tensor([ref_seq_rep([1, 2, 1, 2], 2), ref_seq_rep([3, 3, 3], 2)]))
    torch.testing.assert_close(M.token_repeat_rate(x, eos_id=9, pad_id=0), torch.tensor([0.5, 2 / 3]))
    assert M.repetition([[1, 2]], n=4).item() == 0.0          # shorter than n → 0 by definition
    assert M.token_repeat_rate([[]]).item() == 0.0


def test_repetition_bad_inputs():
    with pytest.raises(ValueError):
        M.repetition([[1, 2]], n=0)
    with pytest.raises(ValueError):
        M.token_repeat_rate([[1, 2]], window=0)
    with pytest.raises(ValueError, match="empty"):
        M.repetition([])
    with pytest.raises(TypeError):
        M.token_repeat_rate(torch.rand(2, 4))


@settings(max_examples=60, deadline=None)
@given(token_lists, st.integers(1, 5))
def test_repetition_properties(seqs, n):
    for v in (M.repetition(seqs, n=n), M.token_repeat_rate(seqs), M.token_repeat_rate(seqs, window=n)):
        assert not torch.isnan(v).any() and bool(((v >= 0) & (v < 1)).all())
    distinct = [list(range(len(s))) for s in seqs]                       # no repeats → 0
    assert M.repetition(distinct, n=n).sum().item() == 0.0
    assert M.token_repeat_rate(distinct).sum().item() == 0.0
    # a larger window can only find more repeats
    assert bool((M.token_repeat_rate(seqs, window=n) <= M.token_repeat_rate(seqs) + 1e-7).all())


# ---------------------------------------------------------------------------------------- non-termination
def test_non_termination():
    x = torch.tensor([[1, 2, 0, 5], [1, 2, 3, 4], [0, 7, 7, 7], [3, 3, 3, 0]])
    assert M.non_termination(x, eos_id=0).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert M.non_termination(x, eos_id=0, max_len=3).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert M.non_termination([[1, 0], [2], []], eos_id=0).tolist() == [0.0, 1.0, 1.0]
    assert M.non_termination(x, eos_id=0, lengths=torch.tensor([2, 4, 1, 4])).tolist() == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        M.non_termination(x, eos_id=0, max_len=0)
    with pytest.raises(TypeError):
        M.non_termination(x.float(), eos_id=0)
    with pytest.raises(ValueError, match="empty"):
        M.non_termination([], eos_id=0)


# ------------------------------------------------------------------------------------------------------ BLEU
HYPS = ["the cat sat on the mat", "a quick brown fox jumps", "", "hello there general kenobi"]
REFS = ["the cat sat on a mat", "the quick brown fox jumped over", "nothing here", "hello there general kenobi"]


def test_bleu_matches_sacrebleu():
    assert M.bleu(HYPS, REFS) == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score / 100)
    sb = M.sentence_bleu(HYPS, REFS)
    ref = torch.tensor([sacrebleu.sentence_bleu(h, [r]).score / 100 for h, r in zip(HYPS, REFS)])
    torch.testing.assert_close(sb, ref.to(sb.dtype))
    assert sb[3].item() == pytest.approx(1.0) and sb[2].item() == 0.0
    torch.testing.assert_close(M.bleu_loss(HYPS, REFS), 1 - sb)


def test_bleu_from_ids_decodes_after_cutting():
    vocab = sorted({w for s in HYPS + REFS for w in s.split()})
    eos, padv = len(vocab), len(vocab) + 1
    enc = lambda s: [vocab.index(w) for w in s.split()]
    decode = lambda ids: " ".join(vocab[i] for i in ids)
    H = pad([enc(h) + [eos] + [3] for h in HYPS], padv)                # junk after EOS must be ignored
    R = [enc(r) for r in REFS]
    got = M.bleu_from_ids(H, R, decode, eos_id=eos, pad_id=padv, sentence=True)
    torch.testing.assert_close(got, M.sentence_bleu(HYPS, REFS))
    assert M.bleu_from_ids(H, R, decode, eos_id=eos, pad_id=padv) == pytest.approx(M.bleu(HYPS, REFS))


def test_bleu_bad_inputs():
    with pytest.raises(ValueError, match="batch sizes differ"):
        M.bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        M.sentence_bleu([], [])
    with pytest.raises(TypeError):
        M.bleu("a b", "a b")
    with pytest.raises(TypeError):
        M.sentence_bleu([1, 2], ["a", "b"])
    with pytest.raises(TypeError, match="callable"):
        M.bleu_from_ids([[1]], [[1]], decode=None)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(alphabet="abc ", max_size=15), min_size=1, max_size=4))
def test_sentence_bleu_properties(texts):
    s = M.sentence_bleu(texts, texts[::-1])
    assert not torch.isnan(s).any() and bool(((s >= 0) & (s <= 1 + 1e-9)).all())
    same = M.sentence_bleu([t for t in texts if t.strip()] or ["a"], [t for t in texts if t.strip()] or ["a"])
    torch.testing.assert_close(same, torch.ones_like(same))                # identity → BLEU 1 (loss 0)


# ------------------------------------------------------------------------------------------------ cut_at_eos
def test_cut_at_eos_and_to_lists():
    x = torch.tensor([[5, 1, 2, 0, 0], [3, 2, 2, 2, 2], [2, 1, 1, 1, 1]])
    tok, L = M.cut_at_eos(x, eos_id=2, pad_id=0)
    assert L.tolist() == [2, 1, 0]
    assert M.to_lists(tok, L) == [[5, 1], [3], []]
    tok, L = M.cut_at_eos([[1, 2, 3], [], [2]], eos_id=3)
    assert M.to_lists(tok, L) == [[1, 2], [], [2]]
    # EOS beyond the given length is not seen
    _, L = M.cut_at_eos(x, eos_id=0, lengths=torch.tensor([3, 5, 5]))
    assert L.tolist() == [3, 5, 5]
    with pytest.raises(ValueError, match="shape"):
        M.cut_at_eos(x, lengths=torch.tensor([1, 2]))
    with pytest.raises(TypeError):
        M.cut_at_eos(x, lengths=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError):
        M.cut_at_eos(x.bool())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_metrics_on_cuda_match_cpu():
    rng = random.Random(5)
    hs, rs = random_pairs(200, rng)
    H, R = pad(hs, 0), pad(rs, 0)
    lh, lr = torch.tensor([len(h) for h in hs]), torch.tensor([len(r) for r in rs])
    cpu = M.edit_distance(H, R, hyp_lengths=lh, ref_lengths=lr)
    gpu = M.edit_distance(H.cuda(), R.cuda(), hyp_lengths=lh.cuda(), ref_lengths=lr.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu)
    torch.testing.assert_close(M.repetition(H.cuda(), n=2, lengths=lr.cuda() * 0 + lh.cuda()).cpu(),
                               M.repetition(H, n=2, lengths=lh))
    pred = torch.randint(0, 5, (3, 40))
    torch.testing.assert_close(M.macro_f1(pred.cuda(), pred[0].cuda(), 5).cpu(), M.macro_f1(pred, pred[0], 5))
