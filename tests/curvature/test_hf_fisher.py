"""The Fisher / GGN family, Hessian-free, the diagonal preconditioner and natural gradient on Hugging Face models
(tiny GPT-2, Llama and BERT built offline from configs): ``ModelOutput`` outputs, keyword inputs, per-token outputs
``[N, T, V]`` with ``-100`` labels and padding masks, SDPA attention under forward-mode AD, every parameter group
stepped, half precision, unknown parameter names and meta tensors.

References: ``torch.func.jacrev`` Jacobians (dense ``Σ JᵀHJ`` over the terms that count), and a position-wise model
whose per-token curvature must equal the ``[N, C]`` curvature of its valid rows stacked as examples (the path
tested against curvlinops in ``test_fisher.py``)."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hf_models import VOCAB, tiny_bert, tiny_gpt2, tiny_llama, token_batch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import taskloss.curvature as C
import taskloss.curvature.fisher as fisher_module
import taskloss.curvature.per_term as per_term_module

D = torch.float64


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2().double()


@pytest.fixture(scope="module")
def padded():
    return token_batch(2, 6, lengths=[6, 4])


def _subset(model, names):
    return {k: p for k, p in model.named_parameters() if k in names}


GPT2_SUB = ("transformer.h.0.attn.c_attn.bias", "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.weight")


def _jacobian_terms(model, params, ids, am):
    """Per-term Jacobians ``[N, T, V, P]`` of the logits (math attention) and the logits themselves."""
    sd = {k: v.detach() for k, v in params.items()}

    def f(p):
        return torch.func.functional_call(model, p, (ids,), {"attention_mask": am}).logits

    with sdpa_kernel(SDPBackend.MATH):
        J = torch.func.jacrev(f)(sd)
        out = f(sd).detach()
    n, t, v = out.shape
    return torch.cat([J[k].reshape(n, t, v, -1) for k in sd], -1), out


# ---------------------------------------------------------------------------------------- per-token, masks
def test_per_token_ggn_of_gpt2_with_padding_equals_the_jacobian_reference(gpt2, padded):
    """``ModelOutput`` (``.logits``), keyword inputs with an attention mask (the mask of the loss terms by default),
    per-token outputs: dense, diagonal and matrix-free GGN equal ``(1/n) Σ_valid Jᵀ(diag p − ppᵀ)J``."""
    ids, am, _ = padded
    sub = _subset(gpt2, GPT2_SUB)
    J, out = _jacobian_terms(gpt2, sub, ids, am)
    valid = am.bool()
    p = out.softmax(-1)[valid]
    H = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    ref = torch.einsum("icp,icd,idq->pq", J[valid], H, J[valid]) / valid.sum()
    batch = {"input_ids": ids, "attention_mask": am}
    G = C.ggn_matrix(gpt2, sub, batch)
    torch.testing.assert_close(G, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(C.ggn_matrix(gpt2, sub, ids, mask=am), C.ggn_matrix(gpt2, sub, ids, mask=valid))
    # a tensor input with the loss-term mask: causal right padding leaves the valid tokens' logits unchanged
    torch.testing.assert_close(C.ggn_matrix(gpt2, sub, ids, mask=valid), ref, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(C.ggn_diagonal(gpt2, sub, batch), torch.diagonal(ref), rtol=1e-9, atol=1e-12)
    v = torch.randn(ref.shape[0], dtype=D, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(C.ggn_vector_product(gpt2, sub, batch, v), ref @ v, rtol=1e-9, atol=1e-12)
    # without a mask every position (padding included) is a term: a different matrix
    assert not torch.allclose(C.ggn_matrix(gpt2, sub, ids), ref, rtol=1e-3)


def test_empirical_fisher_of_gpt2_ignores_minus_100_labels(gpt2, padded):
    ids, am, labels = padded
    labels = labels.clone()
    labels[0, :2] = -100                         # a prompt: real tokens without a loss term
    sub = _subset(gpt2, GPT2_SUB)
    J, out = _jacobian_terms(gpt2, sub, ids, am)
    valid = labels != -100
    r = out.softmax(-1)[valid] - nn.functional.one_hot(labels[valid], VOCAB).to(D)
    grads = torch.einsum("icp,ic->ip", J[valid], r)
    ref = grads.T @ grads / valid.sum()
    batch = {"input_ids": ids, "attention_mask": am}
    torch.testing.assert_close(C.empirical_fisher(gpt2, sub, batch, labels), ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(C.empirical_fisher_diagonal(gpt2, sub, batch, labels), torch.diagonal(ref),
                               rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="no loss term"):
        C.empirical_fisher(gpt2, sub, batch, torch.full_like(labels, -100))


@pytest.mark.parametrize("kind", ["ggn", "ggn_diagonal", "mc", "mc_diagonal", "ef", "ef_diagonal", "gvp"])
def test_per_token_curvature_equals_the_valid_rows_as_examples(position_wise, kind):
    """Masked terms count nowhere: not in the sum, not in the normalizer, and the MC Fisher draws no label for them
    (the same generator gives the same draws as on the valid rows alone)."""
    model, X, y = position_wise
    valid = y != -100
    Xv, yv = X[valid], y[valid]
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    v = torch.ones(sum(p.numel() for p in model.parameters()), dtype=D)
    calls = {
        "ggn": (lambda: C.ggn_matrix(model, None, X, mask=valid), lambda: C.ggn_matrix(model, None, Xv)),
        "ggn_diagonal": (lambda: C.ggn_diagonal(model, None, X, mask=valid), lambda: C.ggn_diagonal(model, None, Xv)),
        "mc": (lambda: C.mc_fisher(model, None, X, n_samples=3, generator=gen(), mask=valid),
               lambda: C.mc_fisher(model, None, Xv, n_samples=3, generator=gen())),
        "mc_diagonal": (lambda: C.mc_fisher_diagonal(model, None, X, n_samples=2, generator=gen(), mask=valid),
                        lambda: C.mc_fisher_diagonal(model, None, Xv, n_samples=2, generator=gen())),
        "ef": (lambda: C.empirical_fisher(model, None, X, y), lambda: C.empirical_fisher(model, None, Xv, yv)),
        "ef_diagonal": (lambda: C.empirical_fisher_diagonal(model, None, X, y),
                        lambda: C.empirical_fisher_diagonal(model, None, Xv, yv)),
        "gvp": (lambda: C.ggn_vector_product(model, None, X, v, mask=valid),
                lambda: C.ggn_vector_product(model, None, Xv, v)),
    }
    got, want = calls[kind]
    torch.testing.assert_close(got(), want(), rtol=1e-12, atol=1e-14)


def test_keyword_inputs_and_the_loss_term_mask_are_checked(position_wise, gpt2, padded):
    model, X, y = position_wise
    with pytest.raises(ValueError, match="shape of the loss terms"):
        C.ggn_matrix(model, None, X, mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no loss term"):
        C.ggn_matrix(model, None, X, mask=torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool or 0/1"):
        C.ggn_matrix(model, None, X, mask=torch.ones(3, 5))
    with pytest.raises(ValueError, match="0 and 1"):
        C.ggn_matrix(model, None, X, mask=torch.full((3, 5), 2))
    with pytest.raises(ValueError, match="ignore_index"):
        C.empirical_fisher(model, None, X, torch.full_like(y, -7))
    ids, am, _ = padded
    with pytest.raises(ValueError, match="different batch sizes"):
        C.ggn_matrix(gpt2, _subset(gpt2, GPT2_SUB), {"input_ids": ids, "attention_mask": am[:1]})
    with pytest.raises(TypeError, match="mapping without a tensor"):
        C.ggn_matrix(gpt2, _subset(gpt2, GPT2_SUB), {"use_cache": False})
    with pytest.raises(TypeError, match="return_dict=True"):
        C.ggn_matrix(lambda p, x: (x.double(),), {"w": torch.zeros(1, dtype=D)}, X)


def test_a_classifier_returning_a_model_output_with_keyword_inputs():
    """BERT for sequence classification (outputs ``[N, C]``, padding only inside the model): the GGN of the
    classifier head equals the closed form of a linear softmax layer on the pooled features."""
    bert = tiny_bert().double()
    ids, am, _ = token_batch(3, 6, lengths=[6, 3, 5])
    batch = {"input_ids": ids, "attention_mask": am}
    head = _subset(bert, ("classifier.weight", "classifier.bias"))
    with torch.no_grad():
        pooled = bert.bert(**batch).pooler_output                                     # [N, D]
        p = bert(**batch).logits.softmax(-1)
    H = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    feats = torch.cat([pooled, torch.ones(3, 1, dtype=D)], 1)                          # [N, D+1]
    # d logits_c / d W[c', j] = δ_cc' x_j ; the head's parameters in order: weight (row-major), bias
    Jw = torch.einsum("cd,nj->ncdj", torch.eye(3, dtype=D), feats[:, :-1]).reshape(3, 3, -1)
    Jb = torch.eye(3, dtype=D).expand(3, 3, 3)
    J = torch.cat([Jw, Jb], -1)
    ref = torch.einsum("ncp,ncd,ndq->pq", J, H, J) / 3
    torch.testing.assert_close(C.ggn_matrix(bert, head, batch), ref, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------- SDPA
@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama, tiny_bert], ids=["gpt2", "llama", "bert"])
def test_forward_mode_ad_through_sdpa_runs_under_the_math_kernel(build):
    """jvp (the GGN-vector product) through the default SDPA attention: equal to the eager-attention twin."""
    sdpa, eager = build().double(), build(attn_implementation="eager").double()
    assert sdpa.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    ids, am, _ = token_batch(2, 5, lengths=[5, 3])
    batch = {"input_ids": ids, "attention_mask": am}
    names = [k for k, _ in sdpa.named_parameters() if ".0." in k and "weight" in k][:2]
    v = {k: torch.randn_like(p) for k, p in sdpa.named_parameters() if k in names}
    got = C.ggn_vector_product(sdpa, _subset(sdpa, names), batch, v)
    want = C.ggn_vector_product(eager, _subset(eager, names), batch, v)
    for k in names:
        torch.testing.assert_close(got[k], want[k], rtol=1e-8, atol=1e-11)


def test_without_the_math_kernel_the_message_names_the_fix(gpt2, padded, monkeypatch):
    """Regression: the fused kernel's missing forward AD used to surface as 'do they match the model?'."""
    monkeypatch.setattr(fisher_module, "math_attention", contextlib.nullcontext)
    ids, _, _ = padded
    model = tiny_gpt2()
    with pytest.raises(ValueError, match='attn_implementation="eager"') as e:
        C.ggn_vector_product(model, _subset(model, GPT2_SUB), ids, torch.ones(96 + 32 + 32))
    assert "match the model" not in str(e.value)

    class NoJvp(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return 2 * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="without forward-mode AD"):
        C.ggn_vector_product(lambda p, x: NoJvp.apply(torch.func.functional_call(lin, p, (x,))),
                             dict(lin.named_parameters()), torch.randn(4, 3), torch.ones(8))
    monkeypatch.setattr(per_term_module, "math_attention", contextlib.nullcontext)
    assert C.ggn_diagonal(model, _subset(model, GPT2_SUB), ids).shape == (160,)   # vjps need no forward AD


# ------------------------------------------------------------------------------------------- Hessian-free
def _head_problem():
    bert = tiny_bert().double()
    for p in bert.parameters():
        p.requires_grad_(False)
    head = [bert.classifier.weight, bert.classifier.bias]
    for p in head:
        p.requires_grad_(True)
    ids, am, _ = token_batch(4, 6, lengths=[6, 3, 5, 6])
    y = torch.tensor([0, 2, 1, 2])
    return bert, head, {"input_ids": ids, "attention_mask": am}, y


def test_hessian_free_on_a_model_output_solves_the_damped_ggn_system():
    """Regression: ``HessianFree`` on a model returning a ``ModelOutput`` failed with ``AttributeError: … no
    attribute 'detach'``; now its direction is ``(G + λI)⁻¹ g`` of the dense GGN."""
    bert, head, batch, y = _head_problem()
    before = [p.detach().clone() for p in head]
    G = C.ggn_matrix(bert, _subset(bert, ("classifier.weight", "classifier.bias")), batch)
    bert.zero_grad()
    C.nll_loss(bert(**batch), y).backward()
    g = torch.cat([p.grad.reshape(-1) for p in head])
    d = torch.linalg.solve(G + 0.1 * torch.eye(G.shape[0], dtype=D), g)
    opt = C.HessianFree(head, bert, lr=1.0, damping=0.1, cg_iters=200, cg_tol=1e-12, adapt_damping=False)

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(bert(**batch), y)
        loss.backward()
        return loss, batch

    opt.step(closure)
    moved = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, head)])
    torch.testing.assert_close(moved, d, rtol=1e-7, atol=1e-10)


def test_hessian_free_with_a_causal_lm_and_a_loss_term_mask():
    """Keyword inputs, per-token outputs, ``(inputs, mask)`` from the closure: the step equals CG on the masked GGN."""
    model = tiny_gpt2().double()
    names = ("transformer.ln_f.weight", "transformer.ln_f.bias")
    for k, p in model.named_parameters():
        p.requires_grad_(k in names)
    ids, am, labels = token_batch(2, 6, lengths=[6, 4])
    labels[0, :2] = -100
    batch = {"input_ids": ids, "attention_mask": am}
    params = [p for k, p in model.named_parameters() if k in names]
    before = [p.detach().clone() for p in params]
    opt = C.HessianFree(params, model, lr=1.0, damping=0.5, cg_iters=100, cg_tol=1e-12, adapt_damping=False)

    def closure():
        opt.zero_grad()
        loss = C.nll_loss(model(**batch), labels)
        loss.backward()
        return loss, (batch, labels != -100)

    closure()
    g = torch.cat([p.grad.reshape(-1) for p in params])
    G = C.ggn_matrix(model, _subset(model, names), batch, mask=labels != -100)
    d = torch.linalg.solve(G + 0.5 * torch.eye(G.shape[0], dtype=D), g)
    opt.step(closure)
    torch.testing.assert_close(torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, params)]), d,
                               rtol=1e-7, atol=1e-10)


def test_hessian_free_steps_every_parameter_group():
    """Regression: a group added with ``add_param_group`` was accepted and never stepped. Two groups give the step
    of one group holding both."""
    torch.manual_seed(0)
    X, y = torch.randn(8, 3, dtype=D), torch.randint(0, 2, (8,))

    def run(split: bool):
        torch.manual_seed(1)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
        first, second = list(net[0].parameters()), list(net[2].parameters())
        opt = C.HessianFree(first if split else first + second, net, lr=0.5, damping=1.0, adapt_damping=False)
        if split:
            opt.add_param_group({"params": second})

        def closure():
            opt.zero_grad()
            loss = C.nll_loss(net(X), y)
            loss.backward()
            return loss, X

        before = [p.detach().clone() for p in net.parameters()]
        opt.step(closure)
        return [p.detach() - b for p, b in zip(net.parameters(), before)]

    split, joint = run(True), run(False)
    for a, b in zip(split, joint):
        assert a.abs().sum() > 0                              # every group moved, the added one included
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------ diagonal and natural gradient
def test_diagonal_preconditioner_on_a_causal_lm_batch():
    model = tiny_llama().double()
    ids, am, labels = token_batch(2, 6, lengths=[6, 4])
    batch = {"input_ids": ids, "attention_mask": am}
    pre = C.FisherDiagonalPreconditioner(model, "empirical", decay=0.0)
    d = pre.update_statistics(batch, labels)
    torch.testing.assert_close(d, C.empirical_fisher_diagonal(model, None, batch, labels))
    exact = C.FisherDiagonalPreconditioner(model, "exact", decay=0.0).update_statistics(batch)
    assert exact.shape == d.shape and bool((exact >= 0).all())
    model.zero_grad()
    C.nll_loss(model(**batch), labels).backward()
    g = {k: p.grad.clone() for k, p in model.named_parameters()}
    pre.precondition_()
    flat = torch.cat([g[k].reshape(-1) for k in pre.params]) / (d + pre.damping)
    torch.testing.assert_close(torch.cat([p.grad.reshape(-1) for p in pre.params.values()]), flat)


def test_natural_gradient_descent_with_the_ggn_of_a_model_output():
    bert, head, batch, y = _head_problem()
    before = [p.detach().clone() for p in head]
    names = ("classifier.weight", "classifier.bias")
    opt = C.NaturalGradientDescent(head, fisher=lambda: C.ggn_matrix(bert, _subset(bert, names), batch), lr=1.0,
                                   damping=1e-2)
    opt.zero_grad()
    C.nll_loss(bert(**batch), y).backward()
    g = torch.cat([p.grad.reshape(-1) for p in head])
    F = C.ggn_matrix(bert, _subset(bert, names), batch)
    opt.step()
    step = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, head)])
    torch.testing.assert_close(step, torch.linalg.solve(F + 1e-2 * torch.eye(F.shape[0], dtype=D), g))


# ------------------------------------------------------------------------------------------- half precision
HALVES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALVES)
def test_fisher_functions_refuse_half_precision(dtype):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)
    X, y = torch.randn(5, 3, dtype=dtype), torch.randint(0, 2, (5,))
    P = sum(p.numel() for p in net.parameters())
    calls = [lambda: C.ggn_matrix(net, None, X), lambda: C.mc_fisher(net, None, X),
             lambda: C.empirical_fisher(net, None, X, y), lambda: C.ggn_diagonal(net, None, X),
             lambda: C.mc_fisher_diagonal(net, None, X), lambda: C.empirical_fisher_diagonal(net, None, X, y),
             lambda: C.ggn_operator(net, None, X), lambda: C.ggn_vector_product(net, None, X, torch.ones(P)),
             lambda: C.hessian_free_direction(net, None, X, torch.ones(P)),
             lambda: C.FisherDiagonalPreconditioner(net),
             lambda: C.HessianFree(net.parameters(), net),
             lambda: C.sample_targets(torch.zeros(2, 3, dtype=dtype)),
             lambda: C.output_hessian_sqrt(torch.zeros(2, 3, dtype=dtype)),
             lambda: C.conjugate_gradient(lambda v: v, torch.ones(3, dtype=dtype)),
             lambda: C.gaussian_kl(torch.zeros(2, dtype=dtype), torch.eye(2, dtype=dtype),
                                   torch.zeros(2, dtype=dtype), torch.eye(2, dtype=dtype)),
             lambda: C.gaussian_fisher(lambda t: (t, torch.eye(2, dtype=dtype)), torch.zeros(2, dtype=dtype)),
             lambda: C.gaussian_to_natural(torch.zeros(2, dtype=dtype), torch.eye(2, dtype=dtype)),
             lambda: C.NaturalGaussianVI(lambda z: -z.square().sum(), torch.zeros(2, dtype=dtype),
                                         torch.eye(2, dtype=dtype)),
             lambda: C.CoupledGaussian(dtype=dtype)]
    for call in calls:
        with pytest.raises(TypeError, match=f"{dtype}".replace("torch.", "torch\\.")):
            call()
    # float32 parameters with float32 inputs work (the advice of the message)
    C.ggn_diagonal(net.float(), None, X.float())


@pytest.mark.parametrize("dtype", HALVES)
def test_losses_and_solves_compute_half_precision_in_float32(dtype):
    logits = torch.tensor([[200.0, -200.0, 0.0], [3.0, 1.0, -1.0]])
    y = torch.tensor([1, 0])
    loss = C.nll_loss(logits.to(dtype), y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss, C.nll_loss(logits.to(dtype).float(), y))
    F = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
    g = torch.tensor([300.0, -200.0])
    for fn, args in ((C.natural_gradient, (1e-3,)), (C.trust_region_step, (0.1,))):
        got = fn(F.to(dtype), g.to(dtype), *args)
        assert got.dtype == dtype
        torch.testing.assert_close(got, fn(F.to(dtype).float(), g.to(dtype).float(), *args).to(dtype))
    torch.manual_seed(0)
    net = nn.Linear(3, 2).to(dtype)
    X, t = torch.randn(6, 3).to(dtype), torch.randint(0, 2, (6,))
    twin = nn.Linear(3, 2)
    twin.load_state_dict({k: v.float() for k, v in net.state_dict().items()})
    steps = []
    for m, x in ((net, X), (twin, X.float())):
        opt = C.NaturalGradientDescent(m.parameters(), fisher=lambda m=m, x=x: C.ggn_matrix(twin, None, X.float()),
                                       lr=0.5, damping=0.1)
        before = [p.detach().float().clone() for p in m.parameters()]
        opt.zero_grad()
        C.nll_loss(m(x), t).backward()
        opt.step()
        steps.append(torch.cat([(p.detach().float() - b).reshape(-1) for p, b in zip(m.parameters(), before)]))
    assert net.weight.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(steps[0], steps[1], rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------ names, meta tensors
SIBLINGS = ["ggn_matrix", "mc_fisher", "ggn_diagonal", "mc_fisher_diagonal", "ggn_operator"]


@pytest.mark.parametrize("name", SIBLINGS + ["empirical_fisher", "empirical_fisher_diagonal"])
def test_unknown_parameter_names_are_errors(name):
    """Regression: an unknown name used to add a phantom all-zero row and column."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    X, y = torch.randn(5, 3, dtype=D), torch.randint(0, 2, (5,))
    call = getattr(C, name)
    extra = (y,) if name.startswith("empirical") else ()
    good = {"2.bias": net[2].bias}
    call(net, good, X, *extra)
    with pytest.raises(ValueError, match="not parameters of the model"):
        call(net, {**good, "2.bais": torch.zeros(2, dtype=D)}, X, *extra)
    with pytest.raises(ValueError, match="shape"):
        call(net, {"2.bias": torch.zeros(3, dtype=D)}, X, *extra)


def test_a_tied_weight_counts_once():
    model = tiny_gpt2().double()
    ids, _, _ = token_batch(1, 3)
    w = model.transformer.wte.weight
    with pytest.raises(ValueError, match="one tensor under two names"):
        C.ggn_diagonal(model, {"transformer.wte.weight": w, "lm_head.weight": w}, ids)
    d_tied = C.ggn_diagonal(model, {"lm_head.weight": w}, ids)   # either name reaches both uses
    torch.testing.assert_close(d_tied, C.ggn_diagonal(model, {"transformer.wte.weight": w}, ids))
    assert C.ggn_diagonal(model, None, ids).numel() == sum(p.numel() for p in model.parameters())


def test_meta_device_models_get_a_clear_error():
    """Regression: these ended in ``Tensor.item() cannot be called on meta tensors``."""
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    X = torch.randn(5, 3)
    for call in (lambda: C.ggn_matrix(net, None, X), lambda: C.ggn_operator(net, None, X),
                 lambda: C.empirical_fisher(net, None, X, torch.zeros(5, dtype=torch.long)),
                 lambda: C.FisherDiagonalPreconditioner(net), lambda: C.HessianFree(net.parameters(), net),
                 lambda: C.NaturalGradientDescent(net.parameters(), fisher=lambda: None),
                 lambda: C.ggn_matrix(nn.Linear(3, 2), None, torch.empty(5, 3, device="meta")),
                 lambda: C.conjugate_gradient(lambda v: v, torch.empty(3, device="meta")),
                 lambda: C.nll_loss(torch.empty(2, 3, device="meta"), torch.zeros(2, dtype=torch.long))):
        with pytest.raises(ValueError, match="meta device"):
            call()
