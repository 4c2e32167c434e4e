"""Bad input across the public API of ``taskloss.losses.metrics`` and ``taskloss.losses.text_quality`` (every name
in their ``__all__``; the EMO loss has its own tests): NaN, empty, wrong-shape, wrong-dtype and out-of-range
inputs raise a clear exception (type and message); ids go through no silent ``int()``; extreme but valid
inputs give finite results."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from taskloss.losses import metrics as M
from taskloss.losses import text_quality as Q

NAN = float("nan")
L = torch.tensor
IDS = L([[1, 2, 3], [4, 5, 6]])
X, Y = torch.randn(20, 5, generator=torch.Generator().manual_seed(0)), torch.randn(20, 5)

CASES = {
    "cut_at_eos": [
        ("wrong-dtype eos_id", lambda: M.cut_at_eos(IDS, 0.5), TypeError, "eos_id must be an int, got float"),
        ("wrong-dtype pad_id str", lambda: M.cut_at_eos(IDS, pad_id="2"), TypeError, "pad_id must be an int, got str"),
        ("wrong-dtype pad_id bool", lambda: M.cut_at_eos(IDS, pad_id=True), TypeError, "pad_id must be an int"),
        ("wrong-dtype lengths", lambda: M.cut_at_eos(IDS, lengths=L([1.5, 1.0])), TypeError, "integer"),
        ("wrong-shape lengths", lambda: M.cut_at_eos(IDS, lengths=L([1])), ValueError, r"shape \(2,\)"),
        ("out-of-range lengths", lambda: M.cut_at_eos(IDS, lengths=L([4, 1])), ValueError, r"lie in \[0, 3\]"),
        ("wrong-shape tokens", lambda: M.cut_at_eos(torch.zeros(1, 2, 2, dtype=torch.long)), ValueError,
         r"padded \[B, T\]"),
        ("wrong-dtype tokens", lambda: M.cut_at_eos(torch.zeros(2, 2, dtype=torch.bool)), TypeError, "integer"),
        ("wrong-dtype list", lambda: M.cut_at_eos([[True]]), TypeError, "must contain ints"),
        ("wrong-shape list", lambda: M.cut_at_eos([[[1]]]), TypeError, "must contain ints"),
        ("wrong-type", lambda: M.cut_at_eos({"a": 1}), TypeError, "list of token lists"),
        ("empty", lambda: M.cut_at_eos(torch.zeros(0, 3, dtype=torch.long)), ValueError, "empty"),
    ],
    "to_lists": [
        ("out-of-range lengths", lambda: M.to_lists(IDS, L([4, 1])), ValueError, r"lie in \[0, 3\]"),
        ("wrong-dtype tokens", lambda: M.to_lists(torch.zeros(1, 2), L([1])), TypeError, "integer"),
        ("wrong-shape lengths", lambda: M.to_lists(IDS, L([1])), ValueError, "batch sizes differ"),
        ("wrong-type", lambda: M.to_lists([[1]], L([1])), TypeError, "torch.Tensor"),
    ],
    "accuracy": [
        ("wrong-dtype", lambda: M.accuracy(torch.zeros(3), L([0, 1, 2])), TypeError, "integer"),
        ("empty", lambda: M.accuracy(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)),
         ValueError, "empty batch"),
        ("wrong-shape", lambda: M.accuracy(L([0, 1]), L([0, 1, 2])), ValueError, "batch sizes differ"),
        ("wrong-shape scalar", lambda: M.accuracy(L(0), L(1)), ValueError, "batch dimension"),
        ("out-of-range reduction", lambda: M.accuracy(L([0]), L([0]), reduction="sum"), ValueError, "reduction"),
        ("wrong-type", lambda: M.accuracy([0], [0]), TypeError, "torch.Tensor"),
    ],
    "zero_one_loss": [("wrong-dtype", lambda: M.zero_one_loss(L([0.0]), L([0])), TypeError, "integer")],
    "macro_f1": [
        ("out-of-range ids", lambda: M.macro_f1(L([0, 3]), L([0, 1]), 3), ValueError, r"lie in \[0, 2\]"),
        ("out-of-range negative", lambda: M.macro_f1(L([0, -1]), L([0, 1]), 3), ValueError, r"lie in \[0, 2\]"),
        ("out-of-range classes", lambda: M.macro_f1(L([0]), L([0]), 0), ValueError, "num_classes must be >= 1"),
        ("wrong-dtype classes", lambda: M.macro_f1(L([0]), L([0]), 2.0), TypeError, "num_classes must be an int"),
        ("NaN zero_division", lambda: M.macro_f1(L([0]), L([0]), 2, zero_division=NAN), ValueError,
         "zero_division must be 0 or 1"),
        ("out-of-range labels", lambda: M.macro_f1(L([0]), L([0]), 2, labels="some"), ValueError, "labels must be"),
        ("empty", lambda: M.macro_f1(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 2),
         ValueError, "empty batch"),
        ("wrong-dtype", lambda: M.macro_f1(L([0.0]), L([0]), 2), TypeError, "integer"),
    ],
    "macro_f1_loss": [("empty", lambda: M.macro_f1_loss(torch.zeros(0, dtype=torch.long),
                                                        torch.zeros(0, dtype=torch.long), 2), ValueError, "empty")],
    "edit_distance": [
        ("wrong-dtype pad_id", lambda: M.edit_distance([[1]], [[1]], pad_id=0.5), TypeError,
         "pad_id must be an int, got float"),
        ("wrong-dtype eos_id", lambda: M.edit_distance([[1]], [[1]], eos_id="2"), TypeError,
         "eos_id must be an int, got str"),
        ("wrong-dtype lengths", lambda: M.edit_distance(L([[1]]), L([[1]]), hyp_lengths=L([0.5])), TypeError,
         "integer"),
        ("wrong-dtype normalize", lambda: M.edit_distance([[1]], [[1]], normalize=1), TypeError,
         "normalize must be a bool"),
        ("out-of-range backend", lambda: M.edit_distance([[1]], [[1]], backend="numba"), ValueError, "backend"),
        ("empty", lambda: M.edit_distance([], []), ValueError, "empty"),
        ("wrong-shape batch", lambda: M.edit_distance([[1]], [[1], [2]]), ValueError, "batch sizes differ"),
        ("wrong-dtype tokens", lambda: M.edit_distance(torch.rand(2, 3), IDS), TypeError, "integer"),
    ],
    "repetition": [
        ("out-of-range n", lambda: M.repetition([[1, 2]], 0), ValueError, "n must be >= 1"),
        ("wrong-dtype n", lambda: M.repetition([[1, 2]], 2.0), TypeError, "n must be an int"),
        ("wrong-dtype seqs", lambda: M.repetition(torch.zeros(1, 3)), TypeError, "integer"),
        ("empty", lambda: M.repetition([]), ValueError, "empty"),
        ("wrong-shape", lambda: M.repetition(L([1, 2, 3])), ValueError, r"\[B, T\]"),
        ("wrong-dtype pad_id", lambda: M.repetition(IDS, pad_id=0.5), TypeError, "pad_id must be an int"),
    ],
    "token_repeat_rate": [
        ("out-of-range window", lambda: M.token_repeat_rate([[1, 2]], 0), ValueError, "window must be >= 1"),
        ("empty", lambda: M.token_repeat_rate([]), ValueError, "empty"),
        ("wrong-dtype eos_id", lambda: M.token_repeat_rate(IDS, eos_id="3"), TypeError, "eos_id must be an int"),
    ],
    "non_termination": [
        ("wrong-dtype eos_id", lambda: M.non_termination([[1]], None), TypeError, "eos_id must be an int"),
        ("wrong-dtype eos_id float", lambda: M.non_termination([[1]], 1.0), TypeError, "eos_id must be an int"),
        ("out-of-range max_len", lambda: M.non_termination([[1]], 1, max_len=0), ValueError, "max_len must be >= 1"),
        ("empty", lambda: M.non_termination([], 1), ValueError, "empty"),
    ],
    "bleu": [
        ("empty", lambda: M.bleu([], []), ValueError, "empty"),
        ("wrong-type", lambda: M.bleu("a", "a"), TypeError, "list of strings"),
        ("wrong-dtype", lambda: M.bleu(["a", 1], ["a", "b"]), TypeError, "only strings"),
        ("wrong-shape", lambda: M.bleu(["a"], ["a", "b"]), ValueError, "batch sizes differ"),
    ],
    "sentence_bleu": [("empty", lambda: M.sentence_bleu([], []), ValueError, "empty")],
    "bleu_loss": [("wrong-dtype", lambda: M.bleu_loss([1], [2]), TypeError, "only strings")],
    "bleu_from_ids": [
        ("wrong-type decode", lambda: M.bleu_from_ids([[1]], [[1]], "tok.decode"), TypeError, "decode must be"),
        ("wrong-dtype decoded", lambda: M.bleu_from_ids([[1]], [[1]], lambda ids: 3), TypeError, "only strings"),
        ("wrong-dtype eos_id", lambda: M.bleu_from_ids([[1]], [[1]], str, eos_id=1.0), TypeError,
         "eos_id must be an int"),
    ],
    "frontier_score": [
        ("NaN", lambda: Q.frontier_score(torch.full((20, 5), NAN), Y), ValueError, "NaN"),
        ("empty", lambda: Q.frontier_score(torch.zeros(0, 5), Y), ValueError, "empty"),
        ("wrong-shape", lambda: Q.frontier_score(torch.zeros(20), Y), ValueError, "2-D"),
        ("wrong-shape dims", lambda: Q.frontier_score(X, torch.zeros(20, 4)), ValueError, "dimensions differ"),
        ("wrong-dtype", lambda: Q.frontier_score(X.bool(), Y), TypeError, "real numbers"),
        ("out-of-range clusters", lambda: Q.frontier_score(X, Y, n_clusters=100), ValueError, "exceeds"),
        ("out-of-range scale", lambda: Q.frontier_score(X, Y, scale=0), ValueError, "scale must be > 0"),
        ("out-of-range seed", lambda: Q.frontier_score(X, Y, seed=-1), ValueError, "seed must be >= 0"),
        ("out-of-range n_lambda", lambda: Q.frontier_score(X, Y, n_lambda=1), ValueError, "n_lambda must be >= 2"),
    ],
    "cluster_histograms": [
        ("out-of-range variance", lambda: Q.cluster_histograms(X, Y, explained_variance=1.0), ValueError,
         r"\(0, 1\)"),
        ("NaN variance", lambda: Q.cluster_histograms(X, Y, explained_variance=NAN), ValueError, "finite"),
        ("wrong-dtype clusters", lambda: Q.cluster_histograms(X, Y, n_clusters=2.5), TypeError, "must be an int"),
        ("wrong-type", lambda: Q.cluster_histograms(X.tolist(), Y), TypeError, "numpy array or torch.Tensor"),
    ],
    "divergence_frontier": [
        ("NaN", lambda: Q.divergence_frontier([NAN, 1], [1, 1]), ValueError, "NaN"),
        ("out-of-range negative", lambda: Q.divergence_frontier([-1, 2], [1, 1]), ValueError, "negative"),
        ("out-of-range zero mass", lambda: Q.divergence_frontier([0, 0], [1, 1]), ValueError, "sums to 0"),
        ("wrong-shape", lambda: Q.divergence_frontier([1, 1, 1], [1, 1]), ValueError, "numbers of bins"),
        ("empty", lambda: Q.divergence_frontier([], []), ValueError, "non-empty 1-D"),
        ("wrong-type", lambda: Q.divergence_frontier("ab", [1, 1]), TypeError, "numpy array"),
        ("wrong-shape 2-D", lambda: Q.divergence_frontier([[1, 1]], [[1, 1]]), ValueError, "1-D"),
    ],
    "frontier_area": [("NaN scale", lambda: Q.frontier_area([1, 1], [1, 1], scale=NAN), ValueError,
                       "scale must be > 0")],
    "mmd2": [
        ("NaN", lambda: Q.mmd2(torch.full((3, 2), NAN), Y[:3, :2]), ValueError, "NaN"),
        ("empty", lambda: Q.mmd2(X[:1], Y), ValueError, "at least 2 rows"),
        ("wrong-shape", lambda: Q.mmd2(X, Y[:, :3]), ValueError, "dimensions differ"),
        ("wrong-type", lambda: Q.mmd2(X.numpy(), Y), TypeError, "torch.Tensor"),
        ("wrong-dtype", lambda: Q.mmd2(X.bool(), Y), TypeError, "real numbers"),
        ("out-of-range bandwidth", lambda: Q.mmd2(X, Y, bandwidth=0), ValueError, "bandwidth must be > 0"),
        ("NaN bandwidth", lambda: Q.mmd2(X, Y, bandwidth=NAN), ValueError, "bandwidth must be > 0"),
    ],
    "embed_texts": [
        ("wrong-type", lambda: Q.embed_texts("abc"), TypeError, "sequence of str"),
        ("empty", lambda: Q.embed_texts([]), ValueError, "empty"),
        ("out-of-range batch_size", lambda: Q.embed_texts(["a"], batch_size=0), ValueError, "batch_size"),
    ],
}
EXEMPT = {"EDIT_DISTANCE_BACKENDS": "constant"}


def test_every_public_name_is_walked():
    public = set(M.__all__) | set(Q.__all__)
    assert public == set(CASES) | set(EXEMPT), public ^ (set(CASES) | set(EXEMPT))


@pytest.mark.parametrize("name,category,thunk,exc,match",
                         [(n, *c) for n, cases in CASES.items() for c in cases],
                         ids=[f"{n}-{c[0]}" for n, cases in CASES.items() for c in cases])
def test_bad_input_raises_clearly(name, category, thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_ids_accept_numpy_integers_and_negative_sentinels():
    seqs = L([[5, 7, -100, -100], [5, 3, 9, -100]])
    assert M.cut_at_eos(seqs, np.int32(3), pad_id=-100)[1].tolist() == [2, 1]
    assert M.non_termination(seqs, np.int64(3)).tolist() == [1.0, 0.0]


def test_extreme_valid_inputs_stay_finite():
    far = torch.cat([torch.zeros(10, 3, dtype=torch.float64), torch.full((10, 3), 1e150, dtype=torch.float64)])
    assert math.isfinite(Q.mmd2(far[:10], far[10:]))
    assert math.isfinite(Q.mmd2(torch.ones(4, 3), torch.ones(4, 3)))              # identical rows: 0
    assert 0.0 <= Q.frontier_area([1, 0], [0, 1], scale=1e6) <= 1.0               # exp underflow, no NaN
    d = M.edit_distance([[]] * 3, [[], [1], [2, 3]])
    assert bool(torch.isfinite(d).all()) and d.tolist() == [0.0, 1.0, 1.0]     # empty hypothesis: all deleted
    assert M.repetition([[]], 4).tolist() == [0.0] and M.token_repeat_rate([[]]).tolist() == [0.0]
