"""The shared validators of taskloss.utils for the families that used to end in obscure errors — generators,
dtypes (with the accepted list), step counts with a memory estimate, devices — and their use across the package:
a seed where a generator belongs, device='cuda' without CUDA, mixed float32/float64 into a solve, int32 token ids."""
from __future__ import annotations

import math

import pytest
import torch

from taskloss.utils import resolve_device
from taskloss.validation import (INDEX_DTYPES, LINALG_DTYPES, check_allocation, check_device, check_dtype, check_generator, check_same_dtype, check_steps, format_bytes)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


# ------------------------------------------------------------------------------------------------ validators
def test_check_generator():
    g = torch.Generator().manual_seed(0)
    assert check_generator("generator", g) is g
    assert check_generator("generator", None) is None
    assert check_generator("generator", g, torch.device("cpu")) is g
    with pytest.raises(TypeError, match=r"generator must be a torch.Generator or None, got int \(a seed\? pass "
                                        r"torch.Generator\(\).manual_seed\(3\)\)"):
        check_generator("generator", 3)
    with pytest.raises(TypeError, match="got str"):
        check_generator("gen", "0")
    with pytest.raises(ValueError, match="cpu generator but the draws are on meta"):
        check_generator("generator", g, torch.device("meta"))


def test_check_dtype_lists_the_accepted_dtypes():
    x = torch.zeros(2)
    assert check_dtype("x", x) is x
    with pytest.raises(TypeError, match="x has dtype torch.float16; accepted: float32, float64"):
        check_dtype("x", x.half())
    with pytest.raises(TypeError, match=r"ids must hold integer token ids \(int64 or int32\), got dtype torch.int16"):
        check_dtype("ids", torch.zeros(2, dtype=torch.int16), INDEX_DTYPES, "integer token ids")
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        check_dtype("x", [1.0])
    assert check_dtype("x", x.double(), (torch.float64,)).dtype == torch.float64      # torch.dtype objects too


def test_check_same_dtype_refuses_mixed_precision():
    a = torch.zeros(2)
    assert check_same_dtype(LINALG_DTYPES, a=a, b=a.clone(), c=None) == torch.float32
    with pytest.raises(TypeError, match=r"mixed dtypes \(a: float32, b: float64\): cast them to one dtype first "
                                        r"\(accepted: float32, float64\)"):
        check_same_dtype(a=a, b=a.double())
    with pytest.raises(TypeError, match="accepted: float32, float64"):
        check_same_dtype(a=a.bfloat16())


def test_check_steps_estimates_memory_before_allocating():
    assert check_steps("n_steps", 50, bytes_per_step=1e6) == 50
    with pytest.raises(ValueError, match=r"IntegratedGradients\(n_steps=1000000\) would allocate about 7.28 TiB, "
                                         r"more than this machine's memory"):
        check_steps("n_steps", 10**6, bytes_per_step=8e6, what="IntegratedGradients(n_steps=1000000)")
    with pytest.raises(ValueError, match=r"n_steps=11 would allocate about 11.00 KiB, more than the limit "
                                         r"\(10.00 KiB\)"):
        check_steps("n_steps", 11, bytes_per_step=1024, limit=10 * 1024)
    with pytest.raises(ValueError, match="n_steps must be >= 1"):
        check_steps("n_steps", 0, bytes_per_step=1)
    with pytest.raises(TypeError, match="n_steps must be an int"):
        check_steps("n_steps", 2.0, bytes_per_step=1)
    check_allocation("x", 1024, limit=1024)                    # at the limit: fine
    assert format_bytes(512) == "512 B" and format_bytes(1.5 * 2**30) == "1.50 GiB"


def test_check_device():
    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_device("device", torch.device("cpu")) == torch.device("cpu")
    assert check_device("device", None, allow_none=True) is None
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ValueError, match=r"device='gpu' is not a device: use 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        check_device("device", "gpu")
    with pytest.raises(TypeError, match="device must be a str or torch.device, got int"):
        check_device("device", 0)
    with pytest.raises(TypeError, match="got NoneType"):
        check_device("device", None)


@no_cuda
def test_check_device_without_cuda():
    for d in ("cuda", "cuda:1", torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"requested but torch.cuda.is_available\(\) is False"):
            check_device("device", d)


# ------------------------------------------------------------------------------------------------ applied
def _lm(vocab=13):
    from taskloss.models import TransformerLM
    torch.manual_seed(0)
    return TransformerLM(vocab_size=vocab, d_model=16, n_layers=1, n_heads=2, max_len=16)


def _generator_calls():
    from taskloss.dynamics import top_hessian_eigenvalue
    from taskloss.gradflow import init_recurrent_, xavier_init_
    from taskloss.lm import generate
    from taskloss.models import RNNLM, TransformerLM
    from taskloss.sampling import GaussianMixtureProposal, GaussianProposal, UniformBallProposal, expected_update
    from taskloss.search import classification_reinforce, gaussian_smoothing_grad, spsa_grad
    theta = {"w": torch.ones(3)}
    f = lambda t: (t["w"] ** 2).sum()            # noqa: E731
    lm = _lm()
    untied = TransformerLM(vocab_size=13, d_model=16, n_layers=1, n_heads=2, max_len=16, tie_weights=False)
    gauss = GaussianProposal(torch.zeros(2), scale=1.0)
    return {
        "gaussian_smoothing_grad": lambda g: gaussian_smoothing_grad(f, theta, 0.1, 2, generator=g),
        "spsa_grad": lambda g: spsa_grad(f, theta, 0.1, 2, generator=g),
        "classification_reinforce": lambda g: classification_reinforce(torch.zeros(3, 2), torch.tensor([0, 1, 0]),
                                                                       generator=g),
        "generate": lambda g: generate(lm, torch.tensor([[1, 2]]), 3, None, 0, greedy=False, generator=g),
        "GaussianProposal.sample": lambda g: gauss.sample(2, g),
        "UniformBallProposal.sample": lambda g: UniformBallProposal(torch.zeros(2), 1.0).sample(2, g),
        "GaussianMixtureProposal.sample": lambda g: GaussianMixtureProposal([gauss, gauss], [0.5, 0.5]).sample(2, g),
        "expected_update": lambda g: expected_update(lambda d: (d ** 2).sum(-1), torch.zeros(2), 1.0, gauss, 4, g),
        "top_hessian_eigenvalue": lambda g: top_hessian_eigenvalue(lambda p: (p["w"] ** 2).sum(), theta,
                                                                   generator=g),
        "xavier_init_": lambda g: xavier_init_(untied, generator=g),
        "init_recurrent_": lambda g: init_recurrent_(RNNLM(vocab_size=5, d_model=4, hidden=4), generator=g),
    }


@pytest.mark.parametrize("name", sorted(_generator_calls()))
def test_a_seed_where_a_generator_belongs_is_a_clear_type_error(name):
    call = _generator_calls()[name]
    with pytest.raises(TypeError, match=r"generator must be a torch.Generator or None, got int \(a seed\?"):
        call(0)
    call(torch.Generator().manual_seed(0))          # and a generator works


def test_generator_draws_reproducible_through_init_functions():
    from taskloss.gradflow import xavier_init_
    from taskloss.models import TransformerLM

    def init(seed):
        m = TransformerLM(vocab_size=13, d_model=16, n_layers=1, n_heads=2, max_len=16, tie_weights=False)
        return xavier_init_(m, generator=torch.Generator().manual_seed(seed)).state_dict()

    a, b, c = init(1), init(1), init(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@no_cuda
def test_cuda_without_cuda_is_a_value_error_everywhere():
    from taskloss.lm import load_pretrained_lm, pad_sequences
    from taskloss.losses import cut_at_eos
    from taskloss.utils import resolve_device
    calls = {
        "pad_sequences": lambda: pad_sequences([[1, 2]], 0, device="cuda"),
        "cut_at_eos": lambda: cut_at_eos([[1, 2]], device="cuda"),
        "load_pretrained_lm": lambda: load_pretrained_lm("cuda"),
        "resolve_device": lambda: resolve_device("cuda:0"),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
            call()
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        pad_sequences([[1, 2]], 0, device="gpu")


def test_mixed_precision_into_solves_refused_with_the_accepted_list():
    from taskloss.sampling import GaussianProposal, gaussian_update_distribution, newton_direction
    H, g = 2 * torch.eye(3), torch.ones(3)
    with pytest.raises(TypeError, match=r"mixed dtypes \(hessian: float32, grad: float64\)"):
        newton_direction(H, g.double())
    with pytest.raises(TypeError, match=r"mixed dtypes \(hessian: float64, grad: float32\)"):
        gaussian_update_distribution(H.double(), g, 1.0)
    with pytest.raises(TypeError, match="hessian has dtype torch.float16; accepted: float32, float64"):
        newton_direction(H.half(), g.half())
    with pytest.raises(TypeError, match=r"mixed dtypes \(mean: float32, cov: float64\)"):
        GaussianProposal(g, cov=H.double())
    torch.testing.assert_close(newton_direction(H.double(), g.double()), torch.full((3,), 0.5, dtype=torch.float64))


def test_int32_token_ids_give_the_int64_results():
    from taskloss.gradflow import layer_gradient_norms
    from taskloss.lm import block_nll, perplexity
    from taskloss.losses import accuracy, macro_f1
    lm = _lm()
    blocks = torch.randint(0, 13, (3, 7), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(block_nll(lm, blocks.int()), block_nll(lm, blocks))
    assert math.isclose(perplexity(lm, blocks.int()), perplexity(lm, blocks), rel_tol=1e-6)
    a, b = layer_gradient_norms(lm, blocks.int()), layer_gradient_norms(lm, blocks)
    torch.testing.assert_close(a.block, b.block)
    pred, target = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])
    torch.testing.assert_close(macro_f1(pred.int(), target.int(), 3), macro_f1(pred, target, 3))
    torch.testing.assert_close(accuracy(pred.int(), target), accuracy(pred, target))
    with pytest.raises(TypeError, match=r"blocks must hold integer token ids \(int64 or int32\), got dtype "
                                        r"torch.float32"):
        block_nll(lm, blocks.float())


def test_out_of_range_target_in_the_last_column_is_a_clear_error():
    """The last column of a block is a target only: the model's id check never sees it (was an IndexError from
    cross_entropy)."""
    from taskloss.lm import block_nll, perplexity
    lm = _lm()
    blocks = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(0))
    for bad in (13, -1):
        b = blocks.clone()
        b[0, -1] = bad
        with pytest.raises(ValueError, match=r"blocks hold target ids in \[.*\], outside the model's \[0, 13\)"):
            block_nll(lm, b)
        with pytest.raises(ValueError, match="outside the model's"):
            perplexity(lm, b)


def test_half_precision_gaussian_proposal_refused_at_construction():
    """log_prob's triangular solve has no float16 / bfloat16 kernel: refused when built, not when first used."""
    from taskloss.sampling import GaussianProposal
    for dt in (torch.float16, torch.bfloat16):
        with pytest.raises(TypeError, match=f"mean has dtype {dt}; accepted: float32, float64"):
            GaussianProposal(torch.zeros(2, dtype=dt), scale=1.0)
