"""K-FAC on Hugging Face models (tiny GPT-2, Llama and BERT built offline from configs): transformers' ``Conv1D``
against curvlinops on the equivalent ``nn.Linear`` model, tied embeddings (never rewritten with one use's
factors), the coverage report, embeddings and norms left alone by default, ``ignore_index`` labels and padding in
both factors and every Fisher type, one dropout policy with the Fisher functions, ``torch.compile``, half
precision and meta tensors."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers
from hf_models import tiny_bert, tiny_gpt2, tiny_llama, token_batch
from torch import nn

import taskloss.curvature as C
from taskloss.curvature import KFAC

curvlinops = pytest.importorskip("curvlinops")
Conv1D = transformers.pytorch_utils.Conv1D
D = torch.float64


def linearized(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``Conv1D`` (``y = x W + b``, ``W [in, out]``) replaced by the equivalent
    ``nn.Linear`` (weight ``Wᵀ``)."""
    twin = copy.deepcopy(model)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, Conv1D):
            lin = nn.Linear(*mod.weight.shape).to(mod.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(mod.weight.T)
                lin.bias.copy_(mod.bias)
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, child, lin)
    return twin


class _Logits(nn.Module):
    """``input_ids → logits [N, V, T]``: the layout ``nn.CrossEntropyLoss`` (and curvlinops) takes."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m(input_ids=x).logits.transpose(1, 2)


def _factors(k: KFAC) -> tuple[dict, dict]:
    return ({n: a.clone() for n, a in k.factors.A.items()}, {n: g.clone() for n, g in k.factors.G.items()})


def _kfac(model, inputs, targets=None, mask=None, **kw):
    k = KFAC(model, decay=0.0, **kw)
    k.update_statistics(inputs, targets, mask=mask)
    A, G = _factors(k)
    k.remove()
    return A, G


def _assert_factors_close(got, want, names, rtol=1e-10, atol=1e-13):
    for n in names:
        torch.testing.assert_close(got[0][n], want[0][n], rtol=rtol, atol=atol, msg=f"A of {n}")
        torch.testing.assert_close(got[1][n], want[1][n], rtol=rtol, atol=atol, msg=f"G of {n}")


# ------------------------------------------------------------------------------------------------ Conv1D
@pytest.mark.parametrize("fisher_type,clv", [("empirical", "empirical"), ("exact", "type-2")])
def test_conv1d_factors_equal_curvlinops_on_the_equivalent_linear_model(fisher_type, clv):
    """GPT-2's attention and MLP projections: A and G of every Conv1D equal curvlinops' K-FAC (expand, cross-entropy
    with mean reduction: the scale of ``curvature_scale(…) = 1``) of the ``nn.Linear`` with the transposed weight."""
    model = tiny_gpt2().double()
    ids, _, labels = token_batch(3, 7)
    k = KFAC(model, fisher_type=fisher_type, decay=0.0)
    k.update_statistics(ids, labels)
    assert all(isinstance(m, Conv1D) for m in k.modules.values()) and len(k.modules) == 8
    twin = _Logits(linearized(model))
    params = [p for n in k.modules for p in twin.m.get_submodule(n).parameters()]
    op = curvlinops.KFACLinearOperator(twin, nn.CrossEntropyLoss(), params, [(ids, labels)], fisher_type=clv,
                                       separate_weight_and_bias=False, check_deterministic=False)
    op.compute_kronecker_factors()
    ref = op.state_dict()
    assert C.curvature_scale(fisher_type, "cross_entropy", "mean", ids.numel(), 97) == 1.0
    for n in k.modules:
        torch.testing.assert_close(k.factors.A[n], ref["input_covariances"][f"m.{n}"], rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(k.factors.G[n], ref["gradient_covariances"][f"m.{n}"], rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("flat", [True, False])
def test_conv1d_step_and_dense_matrix_equal_the_linear_twin(flat):
    """The preconditioned Conv1D gradient is the Linear twin's, transposed (flat-buffer and per-layer paths), and
    ``to_dense`` orders the weight as stored (``[in, out]`` row-major): the twin's dense K-FAC, permuted."""
    torch.manual_seed(0)
    net = nn.Sequential(Conv1D(5, 3), nn.Tanh(), Conv1D(4, 5), nn.Tanh(), nn.Linear(4, 3)).double()
    twin = linearized(net)
    X, y = torch.randn(6, 2, 3, dtype=D), torch.randint(0, 3, (6, 2))
    grads = []
    for m in (net, twin):
        k = KFAC(m, damping=0.05, fisher_type="empirical", decay=0.0)
        k.use_flat_buffers = flat
        out = m(X)
        k.update_statistics(X, y, outputs=out)
        m.zero_grad()
        C.nll_loss(out, y).backward()
        k.precondition_()
        grads.append([p.grad.clone() for p in m.parameters()])
        dense = k.to_dense()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b.T if a.shape != b.shape else b)
    k_net = KFAC(net, fisher_type="empirical", decay=0.0)
    k_net.update_statistics(X, y)
    # the twin's parameter order, as curvlinops and the twin's to_dense lay it out, mapped onto net's storage order
    idx, offset = [], 0
    for (_, p), (_, q) in zip(net.named_parameters(), twin.named_parameters()):
        local = torch.arange(q.numel()).view(q.shape)
        idx.append(offset + (local.T if p.shape != q.shape else local).reshape(-1))
        offset += q.numel()
    perm = torch.cat(idx)
    torch.testing.assert_close(k_net.to_dense(), dense[perm][:, perm])


# ---------------------------------------------------------------------------------------- tied, coverage
@pytest.mark.parametrize("build,embedding", [(tiny_gpt2, "transformer.wte"), (tiny_llama, "model.embed_tokens")],
                         ids=["gpt2", "llama"])
def test_a_tied_embedding_keeps_its_plain_gradient(build, embedding):
    """Regression: the embedding was listed as skipped, yet its whole gradient (the lookup's part included) was
    rewritten with the output layer's factors. Rule: a parameter held by two modules is never preconditioned."""
    model = build()
    assert model.lm_head.weight is model.get_submodule(embedding).weight
    ids, _, labels = token_batch(2, 6)
    k = KFAC(model, fisher_type="empirical", decay=0.0, inverse_update_interval=1)
    assert "lm_head" not in k.modules and {"lm_head", embedding} <= set(k.skipped)
    assert "tied" in k.coverage.skipped["lm_head"] and "tied" in k.coverage.skipped[embedding]
    out = model(input_ids=ids)
    k.update_statistics(ids, labels, outputs=out)
    model.zero_grad()
    C.nll_loss(out, labels).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    k.precondition_()
    w = model.lm_head.weight
    assert torch.equal(w.grad, plain[f"{embedding}.weight"])
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.grad, plain[n])]
    preconditioned = {f"{n}.{s}" for n in k.modules for s in ("weight", "bias")}
    assert changed and set(changed) <= preconditioned


def test_untied_llama_preconditions_its_output_layer():
    model = tiny_llama(tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    k = KFAC(model)
    assert "lm_head" in k.modules and "model.embed_tokens" in k.skipped


def test_weights_shared_between_layers_are_left_alone_and_their_biases_get_bias_blocks():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.head = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))

    torch.manual_seed(0)
    net = Shared().double()
    X, y = torch.randn(7, 3, dtype=D), torch.randint(0, 2, (7,))
    k = KFAC(net, fisher_type="empirical", damping=0.1, decay=0.0)
    assert [layer.weight is None for layer in k.layers] == [True, True, False]
    assert k.coverage.preconditioned == ["a", "b", "head"]
    assert "bias only" in {r.name: r.reason for r in k.coverage.rows}["b"]
    out = net(X)
    k.update_statistics(X, y, outputs=out)
    net.zero_grad()
    C.nll_loss(out, y).backward()
    plain_w, plain_b = net.a.weight.grad.clone(), net.b.bias.grad.clone()
    k.precondition_()
    assert torch.equal(net.a.weight.grad, plain_w)
    G = k.factors.G["b"]
    torch.testing.assert_close(net.b.bias.grad, torch.linalg.solve(G + 0.1 * torch.eye(3, dtype=D), plain_b))


@pytest.mark.parametrize("build,want", [(tiny_gpt2, (25152, 29600)), (tiny_llama, (20480, 23744)),
                                        (tiny_bert, (17987, 22499))], ids=["gpt2", "llama", "bert"])
def test_coverage_report(build, want):
    """The fraction of trainable parameters K-FAC preconditions: every Linear / Conv1D parameter that no other
    module holds, over all trainable parameters (a tied one once). Embeddings and norms do not raise by default."""
    model = build()
    k = KFAC(model)
    cov = k.coverage
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, Conv1D))]
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = {id(emb.weight)} if head is not None and head.weight is emb.weight else set()
    covered = sum(p.numel() for m in layers for p in m.parameters(recurse=False) if id(p) not in tied)
    total = sum(p.numel() for p in model.parameters())
    assert (cov.covered, cov.total) == (covered, total) == want
    assert cov.fraction == pytest.approx(covered / total)
    assert set(cov.preconditioned) == set(k.modules)
    assert all(r.reason for r in cov.rows)
    text = str(cov)
    assert f"{100 * covered / total:.1f} %" in text and all(r.name in text for r in cov.rows)
    assert any(isinstance(model.get_submodule(n), nn.Embedding) for n in cov.skipped)


def test_embeddings_and_norms_keep_their_plain_gradients():
    bert = tiny_bert()
    ids, am, _ = token_batch(3, 6, lengths=[6, 3, 5])
    y = torch.tensor([0, 2, 1])
    batch = {"input_ids": ids, "attention_mask": am}
    k = KFAC(bert, fisher_type="empirical")
    out = bert(**batch)
    k.update_statistics(batch, y, outputs=out)
    bert.zero_grad()
    C.nll_loss(out, y).backward()
    untouched = {n: p.grad.clone() for n, p in bert.named_parameters()
                 if n.rsplit(".", 1)[0] in k.coverage.skipped}
    assert any("embeddings" in n for n in untouched) and any("LayerNorm" in n for n in untouched)
    k.precondition_()
    assert all(torch.equal(bert.get_parameter(n).grad, g) for n, g in untouched.items())


# ------------------------------------------------------------------------------------- ignore_index, padding
@pytest.mark.parametrize("fisher_type,clv", [("empirical", "empirical"), ("exact", "type-2")])
def test_minus_100_labels_leave_both_factors(position_wise, fisher_type, clv):
    """A position-wise model on ``[N, T, D]`` with ``-100`` labels: the factors equal curvlinops' K-FAC of the valid
    rows stacked as examples (the ignored rows enter neither A nor G)."""
    net, X, y = position_wise
    valid = y != -100
    got = _kfac(net, X, y, fisher_type=fisher_type)
    params = list(net.parameters())
    op = curvlinops.KFACLinearOperator(net, nn.CrossEntropyLoss(), params, [(X[valid], y[valid])], fisher_type=clv,
                                       separate_weight_and_bias=False, check_deterministic=False)
    op.compute_kronecker_factors()
    ref = op.state_dict()
    for n in ("net.0", "net.2"):
        torch.testing.assert_close(got[0][n], ref["input_covariances"][n], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got[1][n], ref["gradient_covariances"][n], rtol=1e-12, atol=1e-14)


def test_the_mc_fisher_draws_no_label_for_an_ignored_term(position_wise):
    net, X, y = position_wise
    valid = y != -100
    gen = torch.Generator().manual_seed(4)
    got = _kfac(net, X, y, fisher_type="mc", n_samples=3, generator=gen)
    state = gen.get_state()
    ref_gen = torch.Generator().manual_seed(4)
    want = _kfac(net, X[valid], y[valid], fisher_type="mc", n_samples=3, generator=ref_gen)
    _assert_factors_close(got, want, ("net.0", "net.2"))
    assert torch.equal(state, ref_gen.get_state())          # as many uniforms as valid terms × samples
    masked = _kfac(net, X, None, fisher_type="mc", generator=torch.Generator().manual_seed(4), mask=valid)
    plain = _kfac(net, X[valid], None, fisher_type="mc", generator=torch.Generator().manual_seed(4))
    _assert_factors_close(masked, plain, ("net.0", "net.2"))


def _sequences_alone(model, ids, lengths, fisher_type):
    """Factors from every sequence run alone, unpadded, combined as one batch would: A by rows, G by terms."""
    parts = []
    for b, n in enumerate(lengths):
        one = ids[b:b + 1, :n]
        parts.append((n, _kfac(model, one, one.clone() if fisher_type == "empirical" else None,
                               fisher_type=fisher_type)))
    names = parts[0][1][0].keys()
    total = sum(n for n, _ in parts)
    A = {k: sum(n * f[0][k] for n, f in parts) / total for k in names}
    G = {k: sum(n * f[1][k] for n, f in parts) / total for k in names}
    return A, G


@pytest.mark.parametrize("fisher_type", ["empirical", "exact"])
@pytest.mark.parametrize("signal", ["attention_mask", "mask", "labels"])
def test_padding_enters_neither_factor_of_gpt2(fisher_type, signal):
    """Right-padded GPT-2 batches: the factors equal those of the sequences run alone, unpadded, whether the padding
    comes as the inputs' attention mask, as ``mask=``, or only as ``-100`` labels (in a causal model no gradient
    flows through a padded position, so its rows leave A too)."""
    model = tiny_gpt2().double()
    lengths = [7, 4, 5]
    ids, am, labels = token_batch(3, 7, lengths=lengths)
    k = KFAC(model, fisher_type=fisher_type, decay=0.0)
    targets = labels if fisher_type == "empirical" or signal == "labels" else None
    if signal == "attention_mask":
        k.update_statistics({"input_ids": ids, "attention_mask": am}, targets)
    elif signal == "mask":
        k.update_statistics(ids, targets, mask=am)
    else:
        k.update_statistics(ids, labels)
    want = _sequences_alone(model, ids, lengths, fisher_type)
    _assert_factors_close(_factors(k), want, k.modules, rtol=1e-9, atol=1e-12)


def test_padding_enters_neither_factor_of_a_bert_classifier():
    """Encoder layers (inputs ``[N, T, D]``) drop the padded rows; the pooler and the head (``[N, D]``) see one row
    per example; G counts one loss term per example."""
    model = tiny_bert().double()
    lengths = [6, 3, 5]
    ids, am, _ = token_batch(3, 6, lengths=lengths)
    y = torch.tensor([2, 0, 1])
    k = KFAC(model, fisher_type="empirical", decay=0.0)
    k.update_statistics({"input_ids": ids, "attention_mask": am}, y)
    alone = [_kfac(model, ids[b:b + 1, :n], y[b:b + 1], fisher_type="empirical") for b, n in enumerate(lengths)]
    for name in k.modules:
        rows = lengths if "encoder" in name else [1, 1, 1]
        A = sum(r * a[0][name] for r, a in zip(rows, alone)) / sum(rows)
        G = sum(a[1][name] for a in alone) / 3
        torch.testing.assert_close(k.factors.A[name], A, rtol=1e-9, atol=1e-12, msg=name)
        torch.testing.assert_close(k.factors.G[name], G, rtol=1e-9, atol=1e-12, msg=name)


def test_a_prompt_without_labels_stays_where_gradient_flows_through_it():
    """``-100`` on real tokens (a prompt): the output layer's A leaves those rows out (no gradient reaches them
    there), a lower layer keeps them (later tokens' losses flow through them)."""
    model = tiny_llama(tie_word_embeddings=False).double()
    ids, _, labels = token_batch(2, 6)
    labels[:, :2] = -100
    seen = {}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, i[0].detach()))
             for n in ("lm_head", "model.layers.0.mlp.down_proj")]
    k = KFAC(model, fisher_type="exact", decay=0.0)
    k.update_statistics(ids, labels)
    for h in hooks:
        h.remove()
    h_out = seen["lm_head"][labels != -100]
    torch.testing.assert_close(k.factors.A["lm_head"], h_out.T @ h_out / h_out.shape[0])
    h_low = seen["model.layers.0.mlp.down_proj"].reshape(-1, 64)
    torch.testing.assert_close(k.factors.A["model.layers.0.mlp.down_proj"], h_low.T @ h_low / h_low.shape[0])


def test_masks_and_labels_are_checked(position_wise):
    net, X, y = position_wise
    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(ValueError, match="no loss term"):
        k.update_statistics(X, torch.full_like(y, -100))
    with pytest.raises(ValueError, match="lie in"):
        k.update_statistics(X, torch.full_like(y, -3))
    with pytest.raises(ValueError, match="padding mask"):
        k.update_statistics(X, y, mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool or 0/1"):
        k.update_statistics(X, y, mask=torch.ones(3, 5))
    ok = KFAC(net, fisher_type="empirical", ignore_index=-1)
    ok.update_statistics(X, y.masked_fill(y == -100, -1))
    with pytest.raises(TypeError, match="ignore_index"):
        KFAC(net, ignore_index=-1.0)


# ---------------------------------------------------------------------------------------------- dropout
def test_kfac_refuses_train_mode_dropout_as_the_fisher_functions_do():
    """One policy: the check and the message of the Fisher functions (no opt-out there, none here)."""
    bert = tiny_bert().train()
    ids, am, _ = token_batch(2, 5)
    batch = {"input_ids": ids, "attention_mask": am}
    with pytest.raises(ValueError) as fisher_error:
        C.ggn_diagonal(bert, None, batch)
    k = KFAC(bert, fisher_type="exact")
    with pytest.raises(ValueError) as kfac_error:
        k.update_statistics(batch)
    assert str(kfac_error.value) == str(fisher_error.value) and "model.eval()" in str(kfac_error.value)
    out = bert(**batch)                       # a train-mode forward, then eval mode before the update: still refused
    bert.eval()
    with pytest.raises(ValueError, match="training mode"):
        k.update_statistics(batch, outputs=out)
    k.update_statistics(batch, outputs=bert(**batch))
    assert k.factors.A


# ---------------------------------------------------------------------------------------------- compile
@pytest.mark.slow
def test_torch_compile_aot_eager_gives_the_eager_factors():
    """Regression: under torch.compile the factor update raised 'outputs do not depend on layers'. The hooks run
    eagerly between the compiled graphs, so the factors equal the uncompiled model's; a compiled model can also be
    handed to KFAC itself."""
    model = tiny_gpt2()
    ids, _, labels = token_batch(2, 6)
    want = _kfac(model, ids, labels, fisher_type="empirical")
    compiled = torch.compile(model, backend="aot_eager")
    k = KFAC(model, fisher_type="empirical", decay=0.0, factor_update_interval=2)
    for step in range(3):                  # hooks on, off, on: both graphs stay correct
        out = compiled(input_ids=ids)
        k.update_statistics(ids, labels, outputs=out)
        model.zero_grad()
        C.nll_loss(out, labels).backward()
        k.precondition_()
        _assert_factors_close(_factors(k), want, k.modules, rtol=1e-5, atol=1e-7)
    k.remove()
    k2 = KFAC(compiled, fisher_type="empirical", decay=0.0)
    assert list(k2.modules) == list(want[0])
    k2.update_statistics(ids, labels)
    _assert_factors_close(_factors(k2), want, k2.modules, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_torch_compile_inductor_gives_the_eager_factors():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    X, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    want = _kfac(net, X, y, fisher_type="empirical")
    compiled = torch.compile(net)
    k = KFAC(net, fisher_type="empirical", decay=0.0)
    k.update_statistics(X, y, outputs=compiled(X))
    _assert_factors_close(_factors(k), want, k.modules, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ half precision
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_get_float32_factors_and_preconditioning(dtype):
    model = tiny_gpt2()
    half = copy.deepcopy(model).to(dtype)
    ids, _, labels = token_batch(2, 6)
    grads = []
    for m in (model, half):
        k = KFAC(m, fisher_type="empirical", decay=0.0, damping=0.1)
        out = m(input_ids=ids)
        k.update_statistics(ids, labels, outputs=out)
        assert all(a.dtype == torch.float32 for a in k.factors.A.values())
        m.zero_grad()
        C.nll_loss(out, labels).backward()
        k.precondition_()
        grads.append({n: p.grad for n, p in m.named_parameters()})
        factors = _factors(k)
        if m is model:
            ref = factors
    tol = 5e-2 if dtype == torch.bfloat16 else 5e-3
    _assert_factors_close(factors, ref, k.modules, rtol=tol, atol=tol)
    for n, g in grads[1].items():
        assert g.dtype == dtype and bool(torch.isfinite(g).all())
    c_attn = "transformer.h.1.attn.c_attn.weight"
    rel = (grads[1][c_attn].float() - grads[0][c_attn]).norm() / grads[0][c_attn].norm()
    assert rel < 10 * tol


def test_float16_factors_do_not_overflow():
    """Activations of size 300: ``Σ a²`` over a batch exceeds float16's 65504; the float32 factors are exact."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2).half()
    X = (300 * torch.randn(256, 3)).half()
    k = KFAC(net, fisher_type="exact", decay=0.0)
    k.update_statistics(X)
    rows = torch.cat([X.double(), torch.ones(256, 1, dtype=D)], 1)
    torch.testing.assert_close(k.factors.A[""], (rows.T @ rows / 256).float(), rtol=1e-5, atol=1e-3)


def test_meta_device_model():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="meta device"):
        KFAC(net)


# ------------------------------------------------------------------------------- the -100 convention
def _gpt2_with_labels_masked_inside():
    model = tiny_gpt2().double()
    ids, _, labels = token_batch(3, 7)
    labels[0, 2] = -100
    labels[1, 4:6] = -100
    labels[2, 0] = -100
    return model, ids, labels


def _curvlinops_empirical(model, names, ids, labels):
    """curvlinops' empirical K-FAC of the ``nn.Linear`` twin; its ``G`` rescaled from its normalization (every
    position, ignored ones included, counts as a term of the mean) to the terms that count."""
    twin = _Logits(linearized(model))
    params = [p for n in names for p in twin.m.get_submodule(n).parameters()]
    op = curvlinops.KFACLinearOperator(twin, nn.CrossEntropyLoss(), params, [(ids, labels)], fisher_type="empirical",
                                       separate_weight_and_bias=False, check_deterministic=False)
    op.compute_kronecker_factors()
    ref, share = op.state_dict(), int((labels != -100).sum()) / labels.numel()
    return ({n: ref["input_covariances"][f"m.{n}"] for n in names},
            {n: ref["gradient_covariances"][f"m.{n}"] * share for n in names})


def test_keep_convention_equals_curvlinops_with_labels_masked_inside_the_tokens():
    """``masked_rows="keep"``: every computed position is a row of A, as in curvlinops, in every layer."""
    model, ids, labels = _gpt2_with_labels_masked_inside()
    k = KFAC(model, fisher_type="empirical", decay=0.0, masked_rows="keep")
    k.update_statistics(ids, labels)
    _assert_factors_close(_factors(k), _curvlinops_empirical(model, list(k.modules), ids, labels), k.modules)


def test_drop_convention_leaves_rows_without_gradient_out_of_a():
    """``masked_rows="drop"`` (default): where gradient flows through every position (the first block) the factors
    equal curvlinops'; in the last block's MLP, whose masked positions carry no gradient, A is the mean of ``a aᵀ``
    over the labelled positions alone (recorded by a hook of our own) and differs from curvlinops'."""
    model, ids, labels = _gpt2_with_labels_masked_inside()
    seen = {}
    fc = model.transformer.h[1].mlp.c_fc

    def record(mod, inputs, output):
        seen["a"] = inputs[0].detach()

    handle = fc.register_forward_hook(record)
    k = KFAC(model, fisher_type="empirical", decay=0.0)
    assert k.masked_rows == "drop"
    k.update_statistics(ids, labels)
    handle.remove()
    ref = _curvlinops_empirical(model, list(k.modules), ids, labels)
    first = [n for n in k.modules if n.startswith("transformer.h.0.")]
    _assert_factors_close(_factors(k), ref, first)
    for n in k.modules:  # G: the zero rows add nothing to the sum, and both divide by the terms that count
        torch.testing.assert_close(k.factors.G[n], ref[1][n], rtol=1e-10, atol=1e-13)
    name = "transformer.h.1.mlp.c_fc"
    rows = seen["a"][labels != -100]
    rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], 1)
    torch.testing.assert_close(k.factors.A[name], rows.T @ rows / rows.shape[0], rtol=1e-10, atol=1e-13)
    assert not torch.allclose(k.factors.A[name], ref[0][name], rtol=1e-3)


def test_masked_rows_is_checked_and_checkpointed():
    model = tiny_gpt2()
    with pytest.raises(ValueError, match="masked_rows"):
        KFAC(model, masked_rows="curvlinops")
    state = KFAC(model, masked_rows="keep").state_dict()
    with pytest.raises(ValueError, match="masked_rows"):
        KFAC(model).load_state_dict(state)


# ------------------------------------------------------------------------- layers that flatten the tokens
def _recorded_rows(model, names, ids, labels):
    """Every named layer's input rows ``a`` and output gradients ``g = ∂(Σ_terms ℓ)/∂s`` from one plain backward of
    the summed loss (hooks of our own), both ``[N·T, ·]``: the expand-convention empirical factors are
    ``A = mean a aᵀ`` and ``G = Σ g gᵀ / n_terms``."""
    rows, handles = {}, []

    def hook(name):
        def record(mod, inputs, output):
            rows[name] = [inputs[0].detach().reshape(-1, inputs[0].shape[-1])]
            output.register_hook(lambda g: rows[name].append(g.reshape(-1, g.shape[-1])))
        return record

    for n in names:
        handles.append(model.get_submodule(n).register_forward_hook(hook(n)))
    logits = model(input_ids=ids).logits
    nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum").backward()
    for h in handles:
        h.remove()
    model.zero_grad()
    return rows


def test_opt_layers_that_see_flattened_tokens_get_the_factors_of_their_rows():
    """OPT's decoder flattens the tokens to ``[N·T, D]`` before ``fc1`` / ``fc2`` (issue 41: K-FAC raised there):
    K-FAC reads the rows back in the outputs' layout ``[N, T, D]``. Every layer's factors equal the expand-convention
    formula on rows recorded by hooks of our own (curvlinops is no reference here: it reads the leading dimension of
    ``[N·T, D]`` as the batch and normalizes by the ``N`` sequences, giving ``T·A`` and ``T²·G`` for those layers)."""
    from hf_models import tiny_causal_lm

    model = tiny_causal_lm("opt").double()
    ids, _, labels = token_batch(3, 7)
    k = KFAC(model, fisher_type="empirical", decay=0.0)
    k.update_statistics(ids, labels)
    assert {"model.decoder.layers.0.fc1", "model.decoder.layers.1.fc2"} <= set(k.modules)
    rows = _recorded_rows(model, list(k.modules), ids, labels)
    for n, (a, g) in rows.items():
        a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
        torch.testing.assert_close(k.factors.A[n], a.T @ a / a.shape[0], rtol=1e-10, atol=1e-13, msg=n)
        torch.testing.assert_close(k.factors.G[n], g.T @ g / labels.numel(), rtol=1e-10, atol=1e-13, msg=n)
    # -100 labels: the flattened layers' rows at masked positions of the last layer leave A (drop), as for any
    # [N, T, D] layer, and stay with masked_rows="keep"
    labels[1, 3:] = -100
    factors = {}
    for mode in KFAC.MASKED_ROWS:
        km = KFAC(model, fisher_type="empirical", decay=0.0, masked_rows=mode)
        km.update_statistics(ids, labels)
        factors[mode] = km.factors.A["model.decoder.layers.1.fc2"]
    a = _recorded_rows(model, ["model.decoder.layers.1.fc2"], ids, labels)["model.decoder.layers.1.fc2"][0]
    a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
    kept = a[(labels != -100).reshape(-1)]
    torch.testing.assert_close(factors["keep"], a.T @ a / a.shape[0], rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(factors["drop"], kept.T @ kept / kept.shape[0], rtol=1e-10, atol=1e-13)


def test_a_layer_whose_rows_match_no_batch_layout_is_refused_with_the_reason():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(12, 3)

        def forward(self, x):                                  # [N, 4] → pairs of examples glued: [N/2, 12]
            h = self.a(x).reshape(x.shape[0] // 2, 12)
            return self.b(h).repeat_interleave(2, 0)

    net = Odd().double()
    X, y = torch.randn(6, 4, dtype=D), torch.randint(0, 3, (6,))
    k = KFAC(net, fisher_type="empirical")
    with pytest.raises(ValueError, match="'b' saw outputs of shape"):
        k.update_statistics(X, y)


def test_kfac_warns_about_every_layer_it_cannot_precondition():
    """A tied output layer and an unsupported module are named, with the reason, when K-FAC is built; what is left
    alone by design (embeddings, norms) is only listed in the coverage table."""
    with pytest.warns(UserWarning, match=r"cannot precondition 'lm_head' \(weight shared with") as record:
        k = KFAC(tiny_gpt2())
    assert len(record) == 1 and set(k.coverage.unable) == {"lm_head"}
    lstm = nn.Sequential(nn.Linear(3, 4), nn.LSTM(4, 4))
    with pytest.warns(UserWarning, match=r"'1' \(unsupported module"):
        KFAC(lstm, skip_unsupported=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KFAC(tiny_llama(tie_word_embeddings=False))          # nothing it cannot precondition: no warning
