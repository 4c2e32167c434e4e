"""Bad input to every public name of taskloss.attribution gives a clear exception (type and message).

The test walks ``taskloss.attribution.__all__``: every name must have cases here or be listed as having no inputs
to validate, so a new public function without bad-input cases fails this module.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import taskloss.attribution as A
from taskloss.models import MLP, TransformerLM

NO_INPUTS = {"METHODS": "a tuple of names", "Attribution": "a NamedTuple of results"}

torch.manual_seed(0)
_MLP = MLP(4, (5,), 3).double().eval()
_X = torch.rand(2, 4, dtype=torch.float64)
_LM = TransformerLM(11, d_model=8, n_layers=1, n_heads=2, max_len=6).eval()
_IDS = torch.randint(0, 11, (2, 4))
_NAN = torch.tensor([[float("nan"), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def ig(**kw):
    return A.IntegratedGradients(_MLP).attribute(**{"inputs": _X, "target": 0, **kw})


def tig(**kw):
    """A function of two inputs: the MLP on the first, plus the sum of the second."""
    fwd = lambda a, b: _MLP(a) + b.sum(1, keepdim=True)                           # noqa: E731
    return A.IntegratedGradients(fwd).attribute(**{"inputs": (_X, _X[:, :2]), "target": 0, **kw})


def eig(fwd=lambda i: _LM(i)[:, -1], **kw):
    return A.EmbeddingIntegratedGradients(fwd, _LM.tok_emb).attribute(**{"input_ids": _IDS, "target": 0, **kw})


def _no_graph(z):
    with torch.no_grad():
        return _MLP(z)


CASES = {
    "IntegratedGradients": [
        (lambda: A.IntegratedGradients("model"), TypeError, "forward_fn must be callable"),
        (lambda: ig(inputs=[[1.0, 2.0]]), TypeError, "inputs must be a torch.Tensor"),
        (lambda: ig(inputs=torch.ones(2, 4, dtype=torch.long)), TypeError, "floating-point"),
        (lambda: ig(inputs=torch.ones(0, 4, dtype=torch.float64)), ValueError, "non-empty leading batch"),
        (lambda: ig(inputs=_NAN), ValueError, "inputs contains NaN"),
        (lambda: ig(baselines=_NAN), ValueError, "baselines contains NaN"),
        (lambda: ig(baselines=torch.zeros(2, 5, dtype=torch.float64)), ValueError, "baselines shape"),
        (lambda: ig(baselines=torch.zeros(3, 4, dtype=torch.float64)), ValueError, "baselines shape"),
        (lambda: ig(baselines=torch.zeros(2, 3, 4, dtype=torch.float64)), ValueError, "baselines shape"),
        (lambda: ig(baselines="zeros"), TypeError, "baselines must be None, a number or a tensor"),
        (lambda: ig(baselines=torch.zeros(2, 4, dtype=torch.long)), TypeError, "baselines must be a floating"),
        (lambda: ig(n_steps=0), ValueError, "n_steps must be >= 1"),
        (lambda: ig(n_steps=-3), ValueError, "n_steps must be >= 1"),
        (lambda: ig(n_steps=1, method="riemann_trapezoid"), ValueError, "n_steps must be >= 2"),
        (lambda: ig(n_steps=2.5), TypeError, "n_steps must be an int"),
        (lambda: ig(method="simpson"), ValueError, "method must be one of"),
        (lambda: ig(internal_batch_size=0), ValueError, "internal_batch_size must be >= 1"),
        (lambda: ig(target=None), ValueError, "target is None but forward_fn returns"),
        (lambda: ig(target=lambda out: out[:, :2]), ValueError, "one scalar per example"),
        (lambda: ig(target=lambda out: out.sum()), ValueError, "one scalar per example"),
        (lambda: ig(target=(0, 1)), ValueError, "indexes 2 output dimension"),
        (lambda: ig(target=3), ValueError, "out of range"),
        (lambda: ig(target=-1), ValueError, "non-negative"),
        (lambda: ig(target=torch.tensor([0, 1, 2])), ValueError, "one index per example"),
        (lambda: ig(target=torch.tensor([0.0, 1.0])), TypeError, "integer class indices"),
        (lambda: ig(target="cat"), TypeError, "target must be None"),
        (lambda: A.IntegratedGradients(lambda z: (_MLP(z) - 100).log()).attribute(_X, target=0), ValueError, "NaN or inf"),
        (lambda: A.IntegratedGradients(_no_graph).attribute(_X, target=0), ValueError, "does not depend"),
        (lambda: tig(inputs=()), ValueError, "empty tuple"),
        (lambda: tig(inputs=(_X, torch.rand(3, 2, dtype=torch.float64))), ValueError, "same batch size"),
        (lambda: tig(inputs=(_X, torch.rand(2, 2))), ValueError, "one dtype and device"),
        (lambda: tig(inputs=(_X, [1.0, 2.0])), TypeError, "inputs[1] must be a torch.Tensor"),
        (lambda: tig(inputs=(_X, _NAN[:, :2])), ValueError, "inputs[1] contains NaN"),
        (lambda: tig(baselines=(0.0,)), ValueError, "baselines has 1 entries but inputs has 2"),
        (lambda: tig(baselines=(0.0, 0.0, 0.0)), ValueError, "baselines has 3 entries"),
        (lambda: tig(baselines=torch.zeros(2, 4, dtype=torch.float64)), TypeError, "one entry per input"),
        (lambda: tig(baselines=(0.0, torch.zeros(2, 3, dtype=torch.float64))), ValueError,
         "baselines[1]: baselines shape"),
        (lambda: tig(baselines=(torch.zeros(2, 2, 4, dtype=torch.float64),
                                torch.zeros(3, 2, 2, dtype=torch.float64))), ValueError, "different numbers of baselines"),
        (lambda: ig(n_steps=10**6), ValueError,
         "IntegratedGradients.attribute(n_steps=1000000, method='gausslegendre') would allocate about 7.28 TiB"),
        (lambda: ig(n_steps=10**10, method="riemann_left"), ValueError, "method='riemann_left') would allocate about"),
        (lambda: tig(n_steps=10**6), ValueError, "would allocate about 7.28 TiB"),
    ],
    "EmbeddingIntegratedGradients": [
        (lambda: A.EmbeddingIntegratedGradients(lambda i: i, "emb"), TypeError, "embedding must be an nn.Module"),
        (lambda: A.EmbeddingIntegratedGradients(None, _LM.tok_emb), TypeError, "forward_fn must be callable"),
        (lambda: eig(input_ids=_IDS.float()), TypeError, "integer tensor of token ids"),
        (lambda: eig(input_ids=_IDS[0]), ValueError, "shape [B, T]"),
        (lambda: eig(input_ids=_IDS[:0]), ValueError, "shape [B, T]"),
        (lambda: eig(input_ids=_IDS + 20), ValueError, "outside [0, 11)"),
        (lambda: eig(baselines=torch.zeros(2, 3, dtype=torch.long)), ValueError, "baseline token ids must have"),
        (lambda: eig(baselines=torch.zeros(2, 4, 3)), ValueError, "baselines shape"),
        (lambda: eig(baselines=-1), ValueError, "baselines (token id) must be >= 0"),
        (lambda: eig(n_steps=0), ValueError, "n_steps must be >= 1"),
        (lambda: eig(n_steps=10**6), ValueError, "EmbeddingIntegratedGradients.attribute(n_steps=1000000"),
        (lambda: eig(target=None), ValueError, "target is None"),
        (lambda: eig(fwd=lambda i: _LM(i)), ValueError, "must select a single scalar"),
        (lambda: eig(fwd=lambda i: torch.zeros(i.shape[0], 3, requires_grad=True)), ValueError, "did not call"),
        (lambda: eig(fwd=lambda i: _LM(i)[:, -1] + _LM.tok_emb(i).sum((1, 2))[:, None]), ValueError, "more than once"),
    ],
    "integrate_gradients": [
        (lambda: A.integrate_gradients(lambda p, i: p.sum(), _X, _X, *A.quadrature_rule("gausslegendre", 2)),
         ValueError, "one value per point"),
        (lambda: A.integrate_gradients(lambda p, i: p.sum(1), _X, _X, *[torch.zeros(1).expand(10**9)] * 2),
         ValueError, "integrate_gradients over 1000000000 nodes x 2 paths of 4 features"),
    ],
    "select_target": [
        (lambda: A.select_target(torch.tensor(1.0), None, torch.zeros(1, dtype=torch.long)), ValueError,
         "leading batch dimension"),
        (lambda: A.select_target(torch.zeros(2, 3), None, torch.arange(2)), ValueError, "target is None"),
    ],
    "quadrature_rule": [
        (lambda: A.quadrature_rule("left", 4), ValueError, "method must be one of"),
        (lambda: A.quadrature_rule(3, 4), TypeError, "method must be a str"),
        (lambda: A.quadrature_rule("gausslegendre", 0), ValueError, "n_steps must be >= 1"),
        (lambda: A.quadrature_rule("gausslegendre", 4, dtype=torch.int64), TypeError, "floating torch.dtype"),
        (lambda: A.quadrature_rule("gausslegendre", 4, device="gpu"), ValueError, "device='gpu' is not a device"),
        (lambda: A.quadrature_rule("gausslegendre", 4, device=3), TypeError, "device must be a str or torch.device"),
        (lambda: A.quadrature_rule("gausslegendre", 10**6), ValueError, "would allocate about 7.28 TiB"),
        (lambda: A.quadrature_rule("riemann_middle", 10**12), ValueError, "would allocate about"),
    ],
    "captum_trapezoid_factor": [(lambda: A.captum_trapezoid_factor(1), ValueError, "n_steps must be >= 2")],
    "convergence_order": [(lambda: A.convergence_order("simpson"), ValueError, "method must be one of")],
    "blurred_baseline": [
        (lambda: A.blurred_baseline(torch.rand(2, 8, 8), 1.0), ValueError, "[B, C, H, W]"),
        (lambda: A.blurred_baseline(torch.rand(1, 1, 8, 8), 0.0), ValueError, "sigma must be > 0"),
        (lambda: A.blurred_baseline(torch.full((1, 1, 4, 4), float("nan")), 1.0), ValueError, "NaN"),
        (lambda: A.blurred_baseline(torch.ones(1, 1, 4, 4, dtype=torch.long), 1.0), TypeError, "floating-point"),
    ],
    "gaussian_noise_baseline": [
        (lambda: A.gaussian_noise_baseline(_X, -1.0), ValueError, "std must be > 0"),
        (lambda: A.gaussian_noise_baseline(_NAN, 0.1), ValueError, "NaN"),
        (lambda: A.gaussian_noise_baseline(torch.ones(2, dtype=torch.long), 0.1), TypeError, "floating-point"),
        (lambda: A.gaussian_noise_baseline(_X, 0.1, generator=0), TypeError, "generator must be a torch.Generator"),
    ],
    "uniform_noise_baseline": [
        (lambda: A.uniform_noise_baseline(_X, 1.0, 1.0), ValueError, "low < high"),
        (lambda: A.uniform_noise_baseline(_X, 0.0, float("inf")), ValueError, "low < high"),
        (lambda: A.uniform_noise_baseline([1.0], 0.0, 1.0), TypeError, "floating-point"),
        (lambda: A.uniform_noise_baseline(_X, generator="g"), TypeError, "generator must be a torch.Generator"),
    ],
    "baseline_set": [
        (lambda: A.baseline_set(_X, 0), ValueError, "k must be >= 1"),
        (lambda: A.baseline_set(_X, 3), ValueError, "k must be <= 2"),
        (lambda: A.baseline_set(_NAN, 1), ValueError, "NaN"),
        (lambda: A.baseline_set(_X[:0], 1), ValueError, "at least one row"),
        (lambda: A.baseline_set(_X, 1, generator=7), TypeError, "a seed? pass torch.Generator().manual_seed(7)"),
    ],
    "average_ranks": [
        (lambda: A.average_ranks(torch.tensor([1.0, float("nan")])), ValueError, "NaN"),
        (lambda: A.average_ranks(torch.zeros(2, 0)), ValueError, "non-empty last dimension"),
    ],
    "spearman_correlation": [
        (lambda: A.spearman_correlation(torch.rand(3), torch.rand(4)), ValueError, "same shape"),
        (lambda: A.spearman_correlation(torch.rand(1), torch.rand(1)), ValueError, "at least 2 values"),
        (lambda: A.spearman_correlation(torch.ones(4), torch.rand(4)), ValueError, "constant"),
        (lambda: A.spearman_correlation([1, 2], [2, 1]), TypeError, "must be tensors"),
    ],
    "randomized_copy": [
        (lambda: A.randomized_copy(_MLP, ["head"]), ValueError, "is not a module of the model"),
        (lambda: A.randomized_copy("model"), TypeError, "model must be an nn.Module"),
        (lambda: A.randomized_copy(_MLP, seed=-1), ValueError, "seed must be >= 0"),
    ],
    "cascading_randomization": [
        (lambda: A.cascading_randomization(nn.ReLU()), ValueError, "no module with parameters"),
    ],
    "tokens_html": [
        (lambda: A.tokens_html(["a", "b"], [1.0]), ValueError, "2 tokens but 1 scores"),
        (lambda: A.tokens_html("ab", [1.0, 2.0]), TypeError, "sequence of strings"),
        (lambda: A.tokens_html(["a"], [float("nan")]), ValueError, "NaN"),
    ],
    "token_colors": [(lambda: A.token_colors([]), ValueError, "empty")],
    "plot_tokens": [
        (lambda: A.plot_tokens(None, ["a"], [1.0, 2.0]), ValueError, "1 tokens but 2 scores"),
        (lambda: A.plot_tokens(None, ["a"], [1.0], chars_per_line=0), ValueError, "chars_per_line"),
    ],
}


def test_every_public_name_is_covered():
    assert set(CASES) | set(NO_INPUTS) == set(A.__all__)


@pytest.mark.parametrize("name,i", [(n, i) for n, cases in CASES.items() for i in range(len(cases))],
                         ids=lambda v: str(v))
def test_bad_input_raises_a_clear_error(name, i):
    call, exc, message = CASES[name][i]
    with pytest.raises(exc) as info:
        call()
    assert message in str(info.value), f"{name} case {i}: {info.value!r}"


def test_a_model_output_is_refused_with_the_one_line_fix():
    """Issue 41 item 6: a Hugging Face forward that returns a ModelOutput is refused naming the fix (it read 'must
    return a non-empty tensor', with no word on what to return)."""
    from hf_models import tiny_gpt2

    from taskloss.attribution import EmbeddingIntegratedGradients, IntegratedGradients

    model = tiny_gpt2().eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"ModelOutput.*\.logits"):
        EmbeddingIntegratedGradients(model, model.get_input_embeddings()).attribute(ids, target=3)
    emb = model.get_input_embeddings()(ids).detach()
    with pytest.raises(TypeError, match=r"ModelOutput.*\.logits"):
        IntegratedGradients(lambda x: model(inputs_embeds=x)).attribute(emb, target=3)
