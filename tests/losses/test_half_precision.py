"""Half precision in taskloss.losses: every public loss computes its scalars in float32 (for float16 and bfloat16
inputs, equal to the float64 computation on the same values) or refuses the dtype with a clear error; and EMO's
per-token path keeps MLE on confident tokens, where ``(max + log z) − x_t`` rounded to 0 in float32 and the detached
weight of ``mle_scaled_by_emo`` reached 1e10."""
from __future__ import annotations

import pytest
import torch

import taskloss.losses as L

HALF = (torch.float16, torch.bfloat16)

# ------------------------------------------------------------------------------------------- confident tokens
ROW = torch.tensor([[17.0, 0.0, -1.0, 2.0, 0.5, 1.0, -2.0]])   # target 0: p_t = 1 − 5.5e-7
COST = torch.eye(7) + 0.3


def _loss_and_grad(x, reduction, combine, variant):
    x = x.clone().requires_grad_(True)
    loss = L.emo_loss(x, torch.tensor([0]), COST.to(x.dtype), reduction=reduction, combine=combine, variant=variant)
    loss.sum().backward()
    return loss.detach().sum(), x.grad


# The plain variant's EMO on this row is ≈ 2.5e-7, computed as 1 − <q, ê_t>: float32 resolves it to ~1e-7 only (in
# any implementation), so the ratios of a plain EMO are not compared; the patch variant's EMO is ≈ 1.
@pytest.mark.parametrize("variant,combine", [("patch", "mle_scaled_by_emo"), ("patch", "emo_mle_ratio"),
                                             ("patch", "mle"), ("plain", "mle"), ("plain", "emo")])
def test_confident_token_per_token_path_equals_fused_path_and_float64(combine, variant):
    want, want_grad = _loss_and_grad(ROW.double(), "none", combine, variant)
    for reduction in ("none", "mean"):                # the per-token kernel and the fused reduced kernel
        got, grad = _loss_and_grad(ROW, reduction, combine, variant)
        torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6 if variant == "plain" else 1e-7)
        torch.testing.assert_close(grad.double(), want_grad, rtol=1e-4, atol=1e-6)
    emo, mle, _ = L.emo_and_mle_per_token(ROW, torch.tensor([0]), COST, variant=variant)
    emo64, mle64, _ = L.emo_and_mle_per_token(ROW.double(), torch.tensor([0]), COST.double(), variant=variant)
    assert float(mle64) == pytest.approx(5.4893e-07, rel=1e-4)
    torch.testing.assert_close(mle.double(), mle64, rtol=1e-5, atol=0)     # was exactly 0
    torch.testing.assert_close(emo.double(), emo64, rtol=1e-6, atol=1e-6)


def test_the_issue_value():
    """Row [17, 0, −1, 2, 0.5, 1, −2], target 0, E = eye(7) + 0.3: 1.99982, not 1.0000002."""
    value = L.emo_loss(ROW, torch.tensor([0]), COST, reduction="none", combine="mle_scaled_by_emo", variant="patch")
    assert float(value) == pytest.approx(1.99982, abs=1e-5)


# ---------------------------------------------------------------------------------- every public loss, half
def _f(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X, T, E = _f((5, 7)), torch.tensor([0, 1, 2, 3, -100]), _f((7, 4), 1)
IDS = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 0]])

#: name → function of ``c``, the cast applied to every floating input (to a half dtype; or to it and then to float64,
#: the reference: the same values computed in float64)
COMPUTES = {
    "emo_loss": lambda c: L.emo_loss(c(X), T, c(E), combine="emo_mle_ratio"),
    "emo_loss_reference": lambda c: L.emo_loss_reference(c(X), T, c(E)),
    "emo_and_mle_per_token": lambda c: torch.stack(L.emo_and_mle_per_token(c(X), T, c(E))[:2]),
    "combine_emo_mle": lambda c: L.combine_emo_mle(c(X[:, 0].abs()), c(torch.tensor([0.0, 1e-8, 1.0, 3.0, 5.0])),
                                                   "mle_scaled_by_emo"),
    "emo_soft_upper_bound": lambda c: L.emo_soft_upper_bound(c(X), c(X.softmax(-1)), c(E), atol=1e-2),
    "EMOLoss": lambda c: L.EMOLoss(c(E), reduction="sum")(c(X), T),
    "normalize_cost_embeddings": lambda c: L.normalize_cost_embeddings(c(E)),
    "emo_cost_matrix": lambda c: L.emo_cost_matrix(c(E)),
    "mmd2": lambda c: torch.tensor(L.mmd2(c(_f((6, 3))), c(_f((5, 3), 2)), bandwidth=2.0)),
    "frontier_area": lambda c: torch.tensor(L.frontier_area(c(torch.tensor([0.25, 0.75])), c(torch.tensor([0.5, 0.5])))),
    "divergence_frontier": lambda c: torch.tensor(L.divergence_frontier(c(torch.tensor([0.25, 0.75])),
                                                                        c(torch.tensor([0.5, 0.5])))[1]),
    "cluster_histograms": lambda c: torch.tensor(L.cluster_histograms(c(_f((20, 3))), c(_f((20, 3), 3)),
                                                                      n_clusters=2)[0]),
    "frontier_score": lambda c: torch.tensor(L.frontier_score(c(_f((20, 3))), c(_f((20, 3), 3)), n_clusters=2)),
}
#: name → function of a floating dtype that must be refused (these take integer ids)
REFUSES = {
    "accuracy": lambda dt: L.accuracy(T.clamp_min(0).to(dt), T.clamp_min(0)),
    "zero_one_loss": lambda dt: L.zero_one_loss(T.clamp_min(0).to(dt), T.clamp_min(0)),
    "macro_f1": lambda dt: L.macro_f1(T.clamp_min(0).to(dt), T.clamp_min(0), 4),
    "macro_f1_loss": lambda dt: L.macro_f1_loss(T.clamp_min(0).to(dt), T.clamp_min(0), 4),
    "edit_distance": lambda dt: L.edit_distance(IDS.to(dt), IDS),
    "repetition": lambda dt: L.repetition(IDS.to(dt), n=1),
    "token_repeat_rate": lambda dt: L.token_repeat_rate(IDS.to(dt)),
    "non_termination": lambda dt: L.non_termination(IDS.to(dt), 0),
    "cut_at_eos": lambda dt: L.cut_at_eos(IDS.to(dt), 0),
    "to_lists": lambda dt: L.to_lists(IDS.to(dt), torch.tensor([2, 3])),
    "bleu_from_ids": lambda dt: L.bleu_from_ids(IDS.to(dt), IDS, lambda s: " ".join(map(str, s))),
}
NOT_TENSORS = {"bleu", "sentence_bleu", "bleu_loss", "embed_texts",          # strings in
               "COMBINES", "VARIANTS", "REDUCTIONS", "EDIT_DISTANCE_BACKENDS"}  # constants


def test_every_public_name_has_a_half_precision_policy():
    assert set(L.__all__) == set(COMPUTES) | set(REFUSES) | NOT_TENSORS


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(COMPUTES))
def test_half_inputs_are_computed_in_float32(name, dtype):
    got = COMPUTES[name](lambda t: t.to(dtype))
    want = COMPUTES[name](lambda t: t.to(dtype).double())      # the same half values, in float64
    assert got.dtype in (torch.float32, torch.float64), got.dtype
    torch.testing.assert_close(got.double(), want.double(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(REFUSES))
def test_id_inputs_in_half_precision_are_refused(name, dtype):
    with pytest.raises(TypeError, match=str(dtype)):
        REFUSES[name](dtype)
