"""Every method on ten tiny causal-LM families of the installed ``transformers`` (GPT-2, GPT-NeoX, OPT, Llama,
Mistral, Qwen2, Gemma, Phi, BLOOM, Falcon; 2 layers, width 32, float64, built offline from configs) and a BERT
encoder, each checked against a reference written here or a peer library (issue 41):

* EMO: the fused loss equals the paper's formula written plainly, and ``combine="mle"`` equals the loss the model
  computes from ``labels=`` (padding and ``-100`` labels inside the tokens);
* MGS: the loop and ``vmap`` scoring give the same candidates' losses, weights and parameters;
* MeZO: the step moves the parameters along one direction ``z``, and the projected gradient equals the central
  difference ``(L(θ+σz) − L(θ−σz)) / 2σ`` recomputed here from that ``z``;
* K-FAC: what it covers (everything but embeddings, norms and a tied output layer), and its step equals the plain
  dense Kronecker solve (``kfac_precondition_reference``) of the layers' gradient matrices;
* the GGN (dense and matrix-free) equals ``(1/n) Σ Jᵀ(diag p − ppᵀ)J`` from ``torch.func.jacrev`` Jacobians, and the
  Hessian-free direction solves ``(G + λI) d = g`` with it;
* integrated gradients through the embedding equal Captum's ``LayerIntegratedGradients``.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hf_models import FAMILIES, VOCAB, tiny_bert, tiny_causal_lm, token_batch
from torch.nn.attention import SDPBackend, sdpa_kernel

import taskloss.curvature as C
from taskloss.attribution import EmbeddingIntegratedGradients
from taskloss.curvature.kfac_math import kfac_precondition_reference
from taskloss.losses import emo_loss, emo_loss_reference
from taskloss.search import MGS, MeZO

D = torch.float64


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """``(name, model)``: a fresh float64 model of the family (shared by this module's tests of it)."""
    return request.param, tiny_causal_lm(request.param).double()


def _batch():
    ids, mask, labels = token_batch(2, 6, lengths=[6, 4])
    labels[0, 2] = -100                                   # a label masked inside the real tokens
    return ids, mask, labels


def _small_params(model, k=2):
    """``k`` small vector parameters (biases, norm scales): the subset the dense references differentiate."""
    vec = [(n, p) for n, p in model.named_parameters() if p.ndim == 1 and p.numel() <= 64]
    return dict([vec[0], vec[-1]][:k])


def _logits(model, ids, mask):
    with sdpa_kernel(SDPBackend.MATH):
        return model(input_ids=ids, attention_mask=mask).logits


# ------------------------------------------------------------------------------------------------------- EMO
def test_emo_fused_equals_the_formula_and_mle_equals_the_models_own_loss(family):
    _, model = family
    ids, mask, labels = _batch()
    logits = _logits(model, ids, mask)
    cost = model.get_output_embeddings().weight.detach()
    x, y = logits[:, :-1], labels[:, 1:]
    torch.testing.assert_close(emo_loss(x, y, cost), emo_loss_reference(x, y, cost), rtol=1e-10, atol=1e-12)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        own = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    # (transformers' loss casts the logits to float32)
    torch.testing.assert_close(emo_loss(x, y, cost, combine="mle"), own.to(D), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------------- MGS
def _mgs_step(model, parallel):
    import copy

    m = copy.deepcopy(model)
    ids, _, labels = _batch()
    batch = (ids, labels)
    task = lambda out, b: F.cross_entropy(out[:, :-1].reshape(-1, VOCAB), b[1][:, 1:].reshape(-1))  # noqa: E731
    mgs = MGS(m, torch.optim.SGD(m.parameters(), lr=1.0), task, n_samples=3, sigma=0.1, seed=3, parallel=parallel,
              forward_fn=lambda mod, b: mod(input_ids=b[0]).logits)

    def closure():
        mgs.zero_grad()
        loss = m(input_ids=ids, labels=labels).loss
        loss.backward()
        return loss, batch
    mgs.step(closure)
    return mgs.last_stats, torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def test_mgs_loop_and_vmap_agree(family):
    name, model = family
    if name == "bloom":       # vmap cannot trace BLOOM's GeLU autograd.Function: MGS falls back to the loop
        model = _without_bloom_gelu(model)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # a fallback to the loop would make the check empty
        vec, p_vec = _mgs_step(model, True)
    loop, p_loop = _mgs_step(model, False)
    torch.testing.assert_close(vec.task_losses, loop.task_losses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(vec.weights, loop.weights, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(p_vec, p_loop, rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------------------------------------------ MeZO
def test_mezo_step_is_the_central_difference_along_its_direction(family):
    import copy

    _, model = family
    m = copy.deepcopy(model)
    ids, mask, labels = _batch()
    params = list(m.parameters())
    before = [p.detach().clone() for p in params]
    lr, sigma = 1e-2, 1e-4
    opt = MeZO(params, lr=lr, sigma=sigma, seed=5)

    def loss_at():
        return m(input_ids=ids, attention_mask=mask, labels=labels).loss
    with torch.no_grad():
        opt.step(loss_at)
    g = opt.last_projected_grads[0]
    assert g != 0
    z = [(b - p.detach()) / (lr * g) for b, p in zip(before, params)]     # θ_new = θ − lr·g·z
    with torch.no_grad():
        for p, b, zi in zip(params, before, z):
            p.copy_(b + sigma * zi)
        plus = float(loss_at())
        for p, b, zi in zip(params, before, z):
            p.copy_(b - sigma * zi)
        minus = float(loss_at())
    assert abs((plus - minus) / (2 * sigma) - g) <= 1e-6 * max(1.0, abs(g))


# ----------------------------------------------------------------------------------------------------- K-FAC
def _matrix(layer):
    w, b = layer.weight, layer.bias
    cols = [] if w is None else [layer.weight_matrix(w.grad)]
    if b is not None:
        cols.append(b.grad[:, None])
    return torch.cat(cols, 1)


def test_kfac_covers_the_linear_layers_and_its_step_is_the_dense_solve(family):
    name, model = family
    import copy

    m = copy.deepcopy(model)
    ids, mask, labels = _batch()
    k = C.KFAC(m, fisher_type="empirical", decay=0.0, damping=1e-2, trust_region=None)
    assert 0.7 < k.coverage.fraction < 1 and set(k.coverage.unable) <= {"lm_head"}
    out = m(input_ids=ids, attention_mask=mask)
    k.update_statistics({"input_ids": ids, "attention_mask": mask}, labels, outputs=out)
    C.nll_loss(out.logits, labels).backward()                # padding is labelled -100 too
    grads = {layer.name: _matrix(layer) for layer in k.layers}
    want = kfac_precondition_reference(k.factors.A, k.factors.G, grads, 1e-2)
    k.precondition_()
    for layer in k.layers:
        torch.testing.assert_close(_matrix(layer), want[layer.name], rtol=1e-7, atol=1e-10, msg=layer.name)


# ----------------------------------------------------------------------------------------------- GGN and HF
def _ggn_reference(model, params, ids, mask, labels):
    sd = {k: v.detach() for k, v in params.items()}

    def f(p):
        return torch.func.functional_call(model, p, (ids,), {"attention_mask": mask}).logits
    with sdpa_kernel(SDPBackend.MATH):
        J = torch.func.jacrev(f)(sd)
        out = f(sd).detach()
    n, t, v = out.shape
    J = torch.cat([J[k].reshape(n, t, v, -1) for k in sd], -1)[(labels != -100) & mask.bool()]     # [R, V, P]
    p = out.softmax(-1)[(labels != -100) & mask.bool()]
    H = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("rvp,rvw,rwq->pq", J, H, J) / J.shape[0]


def _without_bloom_gelu(model):
    """A copy of a BLOOM whose ``BloomGelu`` modules (an ``autograd.Function`` torch.func cannot transform) are
    ``nn.GELU(approximate="tanh")``, the fix the refusal names."""
    import copy

    m = copy.deepcopy(model)
    for name, mod in list(m.named_modules()):
        if type(mod).__name__ == "BloomGelu":
            parent, _, child = name.rpartition(".")
            setattr(m.get_submodule(parent), child, torch.nn.GELU(approximate="tanh"))
    return m


def test_ggn_products_and_the_hessian_free_direction_equal_the_jacobian_reference(family):
    name, model = family
    ids, mask, labels = _batch()
    if name == "bloom":      # refused with the fix, then checked with the fix applied
        with pytest.raises(ValueError, match=r"cannot transform.*BloomGelu by nn\.GELU"):
            C.ggn_matrix(model, _small_params(model), {"input_ids": ids, "attention_mask": mask})
        model = _without_bloom_gelu(model)
    params = _small_params(model)
    want = _ggn_reference(model, params, ids, mask, labels)
    terms = (labels != -100) & mask.bool()
    inputs = {"input_ids": ids, "attention_mask": mask}
    G = C.ggn_matrix(model, params, inputs, mask=terms)
    torch.testing.assert_close(G, want, rtol=1e-7, atol=1e-9)
    v = torch.randn(want.shape[0], dtype=D, generator=torch.Generator().manual_seed(0))
    vs, i = {}, 0
    for k, p in params.items():
        vs[k], i = v[i:i + p.numel()].view_as(p), i + p.numel()
    Gv = torch.cat([t.reshape(-1) for t in C.ggn_vector_product(model, params, inputs, vs, mask=terms).values()])
    torch.testing.assert_close(Gv, want @ v, rtol=1e-7, atol=1e-9)
    d = C.hessian_free_direction(model, params, inputs, vs, damping=1e-1, mask=terms)
    d = torch.cat([t.reshape(-1) for t in d.values()])
    torch.testing.assert_close(d, torch.linalg.solve(want + 1e-1 * torch.eye(len(v), dtype=D), v),
                               rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------------------------------------- IG
def _ig_against_captum(model, forward, ids, extra=()):
    from captum.attr import LayerIntegratedGradients

    emb = model.get_input_embeddings()
    target = forward(ids, *extra).argmax(-1)
    ours = EmbeddingIntegratedGradients(forward, emb).attribute(ids, baselines=0, target=target, n_steps=16,
                                                               additional_forward_args=extra or None)
    theirs = LayerIntegratedGradients(forward, emb).attribute(ids, baselines=torch.zeros_like(ids), target=target,
                                                             n_steps=16, method="gausslegendre",
                                                             additional_forward_args=extra or None)
    torch.testing.assert_close(ours.attributions, theirs.sum(-1), rtol=1e-6, atol=1e-8)


def test_integrated_gradients_equal_captum(family):
    _, model = family
    ids, _, _ = token_batch(2, 6)
    with sdpa_kernel(SDPBackend.MATH):
        _ig_against_captum(model, lambda i: model(input_ids=i).logits[:, -1].log_softmax(-1), ids)


def test_an_encoder_bert_runs_kfac_ggn_and_ig():
    """The encoder of the set: a BERT classifier (K-FAC's step, the GGN against the Jacobians, IG against Captum)."""
    model = tiny_bert().double()
    ids, mask, _ = token_batch(3, 6, lengths=[6, 5, 3])
    y = torch.tensor([0, 2, 1])
    k = C.KFAC(model, fisher_type="empirical", decay=0.0, damping=1e-2, trust_region=None)
    out = model(input_ids=ids, attention_mask=mask)
    k.update_statistics({"input_ids": ids, "attention_mask": mask}, y, outputs=out)
    C.nll_loss(out.logits, y).backward()
    grads = {layer.name: _matrix(layer) for layer in k.layers}
    want = kfac_precondition_reference(k.factors.A, k.factors.G, grads, 1e-2)
    k.precondition_()
    for layer in k.layers:
        torch.testing.assert_close(_matrix(layer), want[layer.name], rtol=1e-7, atol=1e-10, msg=layer.name)
    with sdpa_kernel(SDPBackend.MATH):
        _ig_against_captum(model, lambda i, a: model(input_ids=i, attention_mask=a).logits.log_softmax(-1), ids,
                           (mask,))


# --------------------------------------------------------------------------------------------- LoRA adapters
def _lora_gpt2():
    """A tiny GPT-2 with PEFT LoRA adapters (rank 2) on its attention and MLP input projections; ``lora_B`` drawn
    at random (PEFT starts it at zero) so that both adapter matrices carry gradient."""
    peft = pytest.importorskip("peft")
    from hf_models import tiny_gpt2

    model = peft.get_peft_model(tiny_gpt2().double(), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_dropout=0.0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=D))
    return model


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _only_adapters_moved(model, before):
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("lora_" not in n for n in frozen)
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, before[n]), n                      # the base, bit-identical
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n not in frozen)


def _lm_loss(model, ids, labels):
    return model(input_ids=ids, labels=labels).loss


def test_lora_emo_fine_tune_moves_only_the_adapters():
    model, (ids, _, labels) = _lora_gpt2(), _batch()
    before = _snapshot(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cost = model.get_output_embeddings().weight.detach()
    emo_loss(model(input_ids=ids).logits[:, :-1], labels[:, 1:], cost).backward()
    opt.step()
    _only_adapters_moved(model, before)


def test_lora_mgs_and_mezo_move_only_the_adapters():
    model, (ids, _, labels) = _lora_gpt2(), _batch()
    before = _snapshot(model)
    task = lambda out, b: F.cross_entropy(out[:, :-1].reshape(-1, VOCAB), b[1][:, 1:].reshape(-1))  # noqa: E731
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=3, sigma=0.5, seed=0,
              forward_fn=lambda mod, b: mod(input_ids=b[0]).logits, parallel=False)
    n_searched = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def closure():
        mgs.zero_grad()
        loss = _lm_loss(model, ids, labels)
        loss.backward()
        return loss, (ids, labels)
    mgs.step(closure)
    assert sum(p.numel() for p in mgs.params) == n_searched                     # the adapters, nothing else
    _only_adapters_moved(model, before)
    before = _snapshot(model)
    opt = MeZO(model.parameters(), lr=1e-2, sigma=1e-3, seed=0)
    with torch.no_grad():
        opt.step(lambda: _lm_loss(model, ids, labels))
    _only_adapters_moved(model, before)


def test_lora_kfac_preconditions_both_adapter_matrices():
    model, (ids, mask, labels) = _lora_gpt2(), _batch()
    k = C.KFAC(model, fisher_type="empirical", decay=0.0, damping=1e-2, trust_region=None)
    adapters = {n.rsplit(".", 1)[0] for n, p in model.named_parameters() if p.requires_grad}
    assert set(k.coverage.preconditioned) == adapters and k.coverage.fraction == 1.0
    assert {n.split(".")[-2] for n in adapters} == {"lora_A", "lora_B"}
    out = model(input_ids=ids, attention_mask=mask)
    k.update_statistics({"input_ids": ids, "attention_mask": mask}, labels, outputs=out)
    C.nll_loss(out.logits, labels).backward()
    grads = {layer.name: _matrix(layer) for layer in k.layers}
    want = kfac_precondition_reference(k.factors.A, k.factors.G, grads, 1e-2)
    before = _snapshot(model)
    k.precondition_()
    for layer in k.layers:
        torch.testing.assert_close(_matrix(layer), want[layer.name], rtol=1e-7, atol=1e-10, msg=layer.name)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    _only_adapters_moved(model, before)


def test_lora_integrated_gradients_equal_captum():
    model = _lora_gpt2()
    ids, _, _ = token_batch(2, 6)
    with sdpa_kernel(SDPBackend.MATH):
        _ig_against_captum(model, lambda i: model(input_ids=i).logits[:, -1].log_softmax(-1), ids)
