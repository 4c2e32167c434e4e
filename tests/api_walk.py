"""A property-based walk over the public API: hypothesis draws shapes, dtypes, flags, NaN, frozen and shared
parameters for one call, and :func:`classify` sorts the outcome into four kinds.

- ``clear``: a ``ValueError`` / ``TypeError`` (or a documented ``RuntimeError``) with a message, raised by the
  package's own code — the validators — not deep inside torch or numpy;
- ``obscure``: any other exception, or one raised from inside a library (``AttributeError: 'int' object has no
  attribute 'device'``, torch's ``AssertionError``, numpy's ``MemoryError``);
- ``silent``: a result for an input the documentation refuses, or a result that fails its reference check;
- ``valid``: a result for a valid input that passes the check (a reference computation or an invariant).

Each *family* is a hypothesis strategy that returns a :class:`Case`: the call, whether the drawn input is invalid
by the documented contract, and the check of a result. ``tests/test_api_walk.py`` asserts that every case is
``clear`` or ``valid`` (a bounded, derandomized walk in ``make test``); ``tests/walk_counts.py`` runs a wider walk
and prints the counts per subpackage, including any families in ``PENDING`` (rooms whose validators are still
to come; none at present).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import math
import os
import pkgutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import sklearn.metrics  # noqa: F401 — imported here, not inside a strategy (its import touches `random`)
import torch
from hypothesis import strategies as st
from torch import nn

PACKAGE = str(Path(__import__("taskloss").__file__).resolve().parent)
CLEAR_TYPES = (ValueError, TypeError, LookupError)
KINDS = ("clear", "obscure", "silent", "valid")
_TMP = tempfile.TemporaryDirectory(prefix="api-walk-")      # run folders of the results family, removed at exit


@dataclass
class Case:
    """One drawn call: ``call()`` runs it, ``invalid`` says whether the contract refuses the input, and
    ``check(result)`` asserts a valid result against its reference (raising ``AssertionError`` otherwise)."""

    subpackage: str
    name: str
    call: Callable[[], Any]
    invalid: bool
    check: Callable[[Any], None] = lambda r: None
    note: str = ""
    documented: tuple[type[BaseException], ...] = ()     # further exception types the docstring names


def _raised_by_package(err: BaseException) -> bool:
    """Whether a ``raise`` statement of the package raised ``err`` (not a torch / numpy function it called: a
    C function adds no frame, so the innermost frame must also be a ``raise`` line)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames or not str(Path(frames[-1].filename).resolve()).startswith(PACKAGE):
        return False
    return (frames[-1].line or "").lstrip().startswith("raise")


def classify(case: Case) -> tuple[str, str]:
    """``(kind, detail)`` of running ``case`` (see the module docstring for the kinds)."""
    try:
        result = case.call()
    except (*CLEAR_TYPES, *case.documented) as err:
        if str(err).strip() and _raised_by_package(err):
            return "clear", f"{type(err).__name__}: {str(err)[:160]}"
        return "obscure", f"{type(err).__name__} from {traceback.extract_tb(err.__traceback__)[-1].filename}: " \
                          f"{str(err)[:160]}"
    except Exception as err:  # noqa: BLE001 — every other exception is the finding
        return "obscure", f"{type(err).__name__}: {str(err)[:160]}"
    if case.invalid:
        return "silent", f"accepted an invalid input ({case.note}) and returned {str(result)[:80]}"
    try:
        case.check(result)
    except AssertionError as err:
        return "silent", f"wrong result ({case.note}): {str(err)[:200]}"
    return "valid", ""


def pick(draw, valid: list, invalid: list) -> tuple[Any, bool]:
    """A value from ``valid`` (most draws) or from ``invalid``; and whether it is invalid. (Hypothesis leans
    towards the low end of a range, hence the top value as the rarer branch.)"""
    if invalid and draw(st.integers(0, 4)) == 4:
        return draw(st.sampled_from(invalid)), True
    return draw(st.sampled_from(valid)), False


def _close(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               rtol=rtol, atol=atol)


FLAGS_VALID = [True, False, np.bool_(True), np.bool_(False)]
FLAGS_INVALID = ["no", "False", 0, 1, None, 1.0]
BAD_REALS = [math.nan, math.inf, -math.inf, -1.0, 0.0, "0.1", None, True]


# ------------------------------------------------------------------------------------------------ losses
@st.composite
def losses_macro_f1(draw) -> Case:
    """macro_f1 / accuracy against scikit-learn, over label dtypes, sizes, out-of-range ids and zero_division."""
    from sklearn.metrics import accuracy_score, f1_score

    from taskloss.losses import accuracy, macro_f1
    C = draw(st.integers(1, 4))
    n, bad_n = pick(draw, [1, 2, 5, 8], [0])
    dtype, bad_dtype = pick(draw, [torch.int64, torch.int32, torch.int16, torch.uint8], [torch.float32, torch.bool])
    pred = draw(st.lists(st.integers(0, C - 1), min_size=n, max_size=n))
    target = draw(st.lists(st.integers(0, C - 1), min_size=n, max_size=n))
    bad_ids = False
    if n and draw(st.integers(0, 4)) == 4:
        pred[0], bad_ids = draw(st.sampled_from([C, C + 3])), True
    zd, bad_zd = pick(draw, [0.0, 1.0], [math.nan, 2.0, -0.5])
    which = draw(st.sampled_from(["macro_f1", "accuracy"]))
    p, t = torch.tensor(pred, dtype=torch.int64).to(dtype), torch.tensor(target, dtype=torch.int64).to(dtype)
    if which == "accuracy":
        call = functools.partial(accuracy, p, t)

        def check(r):
            _close(r, accuracy_score(target, pred))
        invalid = bad_n or bad_dtype           # accuracy has no class count: any integer id is a class
    else:
        call = functools.partial(macro_f1, p, t, C, zero_division=zd)

        def check(r):
            _close(r, f1_score(target, pred, labels=list(range(C)), average="macro", zero_division=zd))
        invalid = bad_n or bad_dtype or bad_ids or bad_zd
    return Case("losses", which, call, invalid, check, f"n={n} {dtype} ids_bad={bad_ids} zero_division={zd}")


# ------------------------------------------------------------------------------------------------ sampling
@st.composite
def sampling_newton(draw) -> Case:
    """newton_direction against a float64 solve, over dtypes (mixed, half, integer), shapes, NaN and singular H."""
    from taskloss.sampling import newton_direction
    d = draw(st.integers(1, 4))
    dt_h, bad_h = pick(draw, [torch.float32, torch.float64], [torch.float16, torch.bfloat16, torch.int64])
    dt_g, bad_g = dt_h, False
    if draw(st.integers(0, 3)) == 3:
        dt_g = torch.float64 if dt_h != torch.float64 else torch.float32
        bad_g = True
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(d, d, generator=gen, dtype=torch.float64)
    H64, g64 = A @ A.T + torch.eye(d, dtype=torch.float64), torch.randn(d, generator=gen, dtype=torch.float64)
    fault = draw(st.sampled_from(["none", "none", "nan", "singular", "shape"]))
    H, g = H64.clone(), g64.clone()
    if fault == "nan":
        H[0, 0] = math.nan
    elif fault == "singular":
        H = torch.zeros(d, d, dtype=torch.float64)
    elif fault == "shape":
        g = torch.randn(d + 1, generator=gen, dtype=torch.float64)
    H, g = H.to(dt_h), g.to(dt_g)

    def check(r):
        assert r.dtype == dt_h, f"dtype {r.dtype}"
        ref = torch.linalg.solve(H.double(), g.double())
        tol = 1e-3 * max(1.0, float(torch.linalg.cond(H.double())))
        _close(r, ref, rtol=tol, atol=tol)
    return Case("sampling", "newton_direction", lambda: newton_direction(H, g), bad_h or bad_g or fault != "none",
                check, f"d={d} {dt_h}/{dt_g} fault={fault}")


@st.composite
def sampling_weights(draw) -> Case:
    """normalized_log_weights (log-weights that sum to one, the reference softmax) and effective_sample_size
    (Kish's 1/Σw², in [1, n]) over sizes, -inf entries and NaN."""
    from taskloss.sampling import effective_sample_size, normalized_log_weights
    n, bad_n = pick(draw, [1, 2, 5], [0])
    vals = draw(st.lists(st.sampled_from([0.0, -1.5, 2.0, 30.0, -math.inf]), min_size=n, max_size=n))
    bad = False
    if n and draw(st.integers(0, 4)) == 4:
        vals[0], bad = math.nan, True
    all_inf = n > 0 and all(v == -math.inf for v in vals)
    lt = torch.tensor(vals, dtype=torch.float64)
    ref = torch.softmax(lt, 0) if n else lt
    if draw(st.booleans()):
        def check(r):
            _close(r.exp(), ref)
        return Case("sampling", "normalized_log_weights",
                    lambda: normalized_log_weights(lt, torch.zeros(n, dtype=torch.float64)),
                    bad or bad_n or all_inf, check, f"log targets {vals}")
    w = ref if not bad else lt

    def check_ess(r):
        _close(r, 1.0 / float((ref ** 2).sum()))
        assert 1.0 - 1e-9 <= r <= n + 1e-9
    return Case("sampling", "effective_sample_size", lambda: effective_sample_size(w), bad or bad_n or all_inf,
                check_ess, f"weights from {vals}")


# ------------------------------------------------------------------------------------------------ contrastive
def _contrastive_encoder(kind: str) -> nn.Module:
    torch.manual_seed(0)
    mid = {"plain": [], "bn-train": [nn.BatchNorm1d(6)], "bn-eval": [nn.BatchNorm1d(6)]}[kind]
    enc = nn.Sequential(nn.Linear(4, 6), *mid, nn.Tanh(), nn.Linear(6, 3)).double()
    if kind == "bn-eval":
        enc.eval()
    return enc


@st.composite
def contrastive_accumulation(draw) -> Case:
    """accumulated_backward against the full-batch gradient, over micro-batch sizes, replay_tol, check_replay and
    BatchNorm encoders."""
    from taskloss.contrastive import accumulated_backward, info_nce
    B = draw(st.integers(1, 6))
    m, bad_m = pick(draw, [1, 2, 3, 7], [0, -1, 2.0, True])
    tol, bad_tol = pick(draw, [None, 1e-6, 0.5], [v for v in BAD_REALS if v is not None])     # None: the default
    flag, bad_flag = pick(draw, FLAGS_VALID, FLAGS_INVALID)
    kind = draw(st.sampled_from(["plain", "plain", "bn-train", "bn-eval"]))
    enc = _contrastive_encoder(kind)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    q, p = torch.randn(B, 4, generator=gen, dtype=torch.float64), torch.randn(B, 4, generator=gen, dtype=torch.float64)
    loss = functools.partial(info_nce, temperature=0.5)

    def call():
        enc.zero_grad(set_to_none=True)
        accumulated_backward(enc, [q, p], loss, m, replay_tol=tol, check_replay=flag)
        return [w.grad.clone() for w in enc.parameters()]

    def check(got):
        enc.zero_grad(set_to_none=True)
        loss(enc(q), enc(p)).backward()
        for a, b in zip(got, [w.grad for w in enc.parameters()]):
            _close(a, b, rtol=1e-7, atol=1e-9)
    return Case("contrastive", "accumulated_backward", call, bad_m or bad_tol or bad_flag or kind == "bn-train",
                check, f"B={B} m={m!r} replay_tol={tol!r} check_replay={flag!r} encoder={kind}",
                documented=(RuntimeError,))


# ------------------------------------------------------------------------------------------------ dynamics
@st.composite
def dynamics_clip(draw) -> Case:
    """clip_grad_ with frozen, shared and repeated parameters against a reference over the distinct trainable
    gradients; NaN gradients and bad thresholds refused."""
    from taskloss.dynamics import clip_grad_
    gen = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    n = draw(st.integers(1, 3))
    params = [nn.Parameter(torch.randn(draw(st.integers(1, 4)), generator=gen, dtype=torch.float64)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 3
    frozen = draw(st.booleans())
    if frozen:
        params[0].requires_grad_(False)
    listed = params + ([params[-1]] if draw(st.booleans()) else [])           # a parameter listed twice
    bad_nan = draw(st.integers(0, 5)) == 5
    if bad_nan:
        params[-1].grad[0] = math.nan
    gamma, bad_gamma = pick(draw, [0.5, 1.0, 100.0, math.inf], [math.nan, 0.0, -1.0, "1"])
    norm_type = draw(st.sampled_from([2.0, 1.0, math.inf]))
    mode = draw(st.sampled_from(["hard", "soft"]))
    per_tensor, bad_flag = pick(draw, FLAGS_VALID, FLAGS_INVALID)
    before = [p.grad.clone() for p in params]
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    nan_counts = bad_nan and params[-1].requires_grad           # a frozen parameter's gradient is not read

    def check(norm):
        for i, p in enumerate(params):
            if i not in trainable:
                assert torch.equal(p.grad, before[i]), "a frozen parameter's gradient changed"
        gs = [before[i] for i in trainable]
        norms = [torch.linalg.vector_norm(g, norm_type) for g in gs]
        if per_tensor:
            coef = [_coef(float(x), gamma, mode) for x in norms]
        else:
            total = float(torch.linalg.vector_norm(torch.stack(norms), norm_type))
            coef = [_coef(total, gamma, mode)] * len(gs)
            _close(norm, total)
        for i, c in zip(trainable, coef):
            _close(params[i].grad, before[i] * c)
    return Case("dynamics", "clip_grad_", lambda: clip_grad_(listed, gamma, mode, per_tensor, norm_type),
                nan_counts or bad_gamma or bad_flag or not trainable, check,
                f"n={n} frozen={frozen} twice={len(listed) > n} nan={bad_nan} gamma={gamma!r} {mode} "
                f"p={norm_type} per_tensor={per_tensor!r}")


def _coef(norm: float, gamma: float, mode: str) -> float:
    if math.isinf(gamma):
        return 1.0
    return min(1.0, gamma / norm) if mode == "hard" else gamma / (norm + gamma)


@st.composite
def dynamics_shared(draw) -> Case:
    """ClippedSGD and gradient_norm_penalty on a model whose two layers share a weight, with a frozen bias and a
    tensor listed twice: each tensor counted once (torch.optim.SGD on the distinct trainable tensors, clipped by
    the reference coefficient; Σ g² over them), the frozen one untouched."""
    from taskloss.dynamics import ClippedSGD, gradient_norm_penalty
    frozen, twice = draw(st.booleans()), draw(st.booleans())
    lr, bad_lr = pick(draw, [0.1, 0.5], [math.nan, -1.0, math.inf, 0.0, "0.1"])
    gamma, bad_gamma = pick(draw, [0.3, 2.0, math.inf], [math.nan, 0.0, -1.0])
    mom, bad_mom = pick(draw, [0.0, 0.9], [math.nan, -0.1, "0.9"])
    which = draw(st.sampled_from(["ClippedSGD", "gradient_norm_penalty"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    x = torch.randn(4, 3, generator=gen, dtype=torch.float64)

    def build():
        torch.manual_seed(1)
        a, b = nn.Linear(3, 3).double(), nn.Linear(3, 3).double()
        b.weight = a.weight                                            # shared between the two layers
        a.bias.requires_grad_(not frozen)
        return a, b

    def loss_of(a, b):
        return (b(torch.tanh(a(x))) ** 2).mean()

    a, b = build()
    listed = [a.weight, a.bias, b.weight, b.bias] + ([b.bias] if twice else [])
    distinct = [t for t in (a.weight, a.bias, b.bias) if t.requires_grad]
    if which == "gradient_norm_penalty":
        def check(r):
            grads = torch.autograd.grad(loss_of(a, b), distinct)
            _close(r, sum(float((g ** 2).sum()) for g in grads), rtol=1e-10, atol=1e-12)
        return Case("dynamics", which, lambda: gradient_norm_penalty(loss_of(a, b), listed, create_graph=False),
                    False, check, f"frozen={frozen} twice={twice}")

    def call():
        opt = ClippedSGD(listed, lr=lr, gamma=gamma, momentum=mom)
        loss_of(a, b).backward()
        opt.step()
        return a, b

    def check(_):
        ra, rb = build()
        ref = [t for t in (ra.weight, ra.bias, rb.bias) if t.requires_grad]
        loss_of(ra, rb).backward()
        total = float(torch.linalg.vector_norm(torch.stack([t.grad.norm() for t in ref])))
        c = _coef(total, gamma, "hard")
        for t in ref:
            t.grad.mul_(c)
        torch.optim.SGD(ref, lr=lr, momentum=mom).step()
        for got, want in zip((a.weight, a.bias, b.bias), (ra.weight, ra.bias, rb.bias)):
            _close(got, want, rtol=1e-12, atol=1e-12)
        if frozen:
            _close(a.bias, build()[0].bias, rtol=0, atol=0)
    return Case("dynamics", which, call, bad_lr or bad_gamma or bad_mom, check,
                f"frozen={frozen} twice={twice} lr={lr!r} gamma={gamma!r} momentum={mom!r}")


# ------------------------------------------------------------------------------------------------ search
@st.composite
def search_zeroth_order(draw) -> Case:
    """gaussian_smoothing_grad / spsa_grad: generators (seeds, strings), sigma, sample counts; a constant loss has
    an estimate of exactly zero, shaped like theta."""
    from taskloss.search import gaussian_smoothing_grad, spsa_grad
    theta = {"w": torch.zeros(draw(st.integers(1, 3)), dtype=torch.float64),
             "b": torch.zeros(2, 2, dtype=torch.float64)}
    sigma, bad_sigma = pick(draw, [1e-3, 0.1, 1.0], BAD_REALS)
    n, bad_n = pick(draw, [1, 2, 4], [0, -1, 2.5, True])
    gen, bad_gen = pick(draw, [None, torch.Generator().manual_seed(1)], [0, "seed", np.random.default_rng(0)])
    c = draw(st.sampled_from([0.0, 3.5]))
    fn = draw(st.sampled_from([gaussian_smoothing_grad, spsa_grad]))

    def check(r):
        est = r[0] if isinstance(r, tuple) else r
        est = getattr(est, "grad", est)
        assert set(est) == set(theta), f"keys {set(est)}"
        for k in theta:
            assert est[k].shape == theta[k].shape
            assert torch.equal(est[k], torch.zeros_like(theta[k])), f"{k}: {est[k]} for a constant loss"
    return Case("search", fn.__name__, lambda: fn(lambda t: torch.tensor(c, dtype=torch.float64) + 0 * t["w"].sum(),
                                                  theta, sigma, n, generator=gen),
                bad_sigma or bad_n or bad_gen, check, f"sigma={sigma!r} n={n!r} generator={gen!r}")


@st.composite
def search_mezo(draw) -> Case:
    """MeZO with a frozen bias and a weight listed twice: the step equals the one over the distinct trainable
    parameters (same seed), the frozen bias does not move; bad lr / sigma / n_samples refused."""
    from taskloss.search import MeZO
    frozen, twice = draw(st.booleans()), draw(st.booleans())
    lr, bad_lr = pick(draw, [1e-2, 0.1, 0.0], [math.nan, math.inf, -1.0, "0.1", None, True])
    sigma, bad_sigma = pick(draw, [1e-3, 1e-2], BAD_REALS)
    n, bad_n = pick(draw, [1, 2], [0, 1.5, True])
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    x, y = torch.randn(5, 3, generator=gen, dtype=torch.float64), torch.randn(5, 1, generator=gen, dtype=torch.float64)

    def build():
        torch.manual_seed(0)
        m = nn.Linear(3, 1).double()
        m.bias.requires_grad_(not frozen)
        return m

    def step(m, params):
        MeZO(params, lr=lr, sigma=sigma, n_samples=n, seed=3).step(lambda: ((m(x) - y) ** 2).mean())
        return m

    model = build()
    listed = list(model.parameters()) + ([model.weight] if twice else [])

    def check(m):
        ref = build()
        step(ref, [p for p in ref.parameters() if p.requires_grad])     # the distinct trainable parameters
        for a, b in zip(m.parameters(), ref.parameters()):
            _close(a, b, rtol=1e-12, atol=1e-12)
        if frozen:
            _close(m.bias, build().bias, rtol=0, atol=0)
    return Case("search", "MeZO", lambda: step(model, listed), bad_lr or bad_sigma or bad_n, check,
                f"frozen={frozen} twice={twice} lr={lr!r} sigma={sigma!r} n={n!r}")


# ------------------------------------------------------------------------------------------------ gradflow
@st.composite
def gradflow_init_recurrent(draw) -> Case:
    """init_recurrent_: recurrent blocks N(0, gain²/H) reshaped in place, recurrent biases zero, the LSTM forget bias
    set, input weights kept; bad gains, forget biases, modules and generators refused."""
    from taskloss.gradflow import init_recurrent_
    kind, bad_kind = pick(draw, ["LSTM", "GRU", "RNN"], ["Linear"])
    torch.manual_seed(draw(st.integers(0, 99)))
    module = nn.Linear(3, 3) if kind == "Linear" else getattr(nn, kind)(3, 4)
    gain, bad_gain = pick(draw, [0.5, 1.0, 2.0], BAD_REALS)
    fb, bad_fb = pick(draw, [None, 1.0, -2.0], [math.nan, math.inf])
    bad_fb = bad_fb or (fb is not None and kind != "LSTM")
    gen, bad_gen = pick(draw, [None, torch.Generator().manual_seed(0)], [0, "g"])
    before = {k: v.detach().clone() for k, v in module.named_parameters()}

    def check(m):
        H = 4
        for k, v in m.named_parameters():
            assert v.shape == before[k].shape
            assert bool(torch.isfinite(v).all())
            if k.startswith("weight_ih"):
                assert torch.equal(v, before[k]), "input weights changed"
            if k.startswith("bias_hh"):
                assert bool((v == 0).all()), "recurrent bias not zeroed"
        if kind == "LSTM" and fb is not None:
            _close(m.bias_ih_l0[H:2 * H], torch.full((H,), fb))
        w = m.weight_hh_l0
        assert not torch.equal(w, before["weight_hh_l0"]), "recurrent weights not redrawn"
    return Case("gradflow", "init_recurrent_",
                lambda: init_recurrent_(module, gain=gain, forget_bias=fb, generator=gen),
                bad_kind or bad_gain or bad_fb or bad_gen, check,
                f"{kind} gain={gain!r} forget_bias={fb!r} generator={gen!r}")


# ------------------------------------------------------------------------------------------------ lm
@functools.lru_cache(maxsize=1)
def _lm():
    from taskloss.models import TransformerLM
    torch.manual_seed(0)
    return TransformerLM(vocab_size=11, d_model=16, n_layers=1, n_heads=2, max_len=8).eval()


@st.composite
def lm_block_nll(draw) -> Case:
    """block_nll against log_softmax in float64, over id dtypes, block shapes and out-of-range ids."""
    from taskloss.lm import block_nll
    M, bad_m = pick(draw, [1, 3], [0])
    T1, bad_t = pick(draw, [2, 5, 9], [1])
    dtype, bad_dtype = pick(draw, [torch.int64, torch.int32], [torch.int16, torch.float32, torch.bool])
    ids = torch.randint(0, 11, (M, T1), generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    bad_ids = False
    if M and draw(st.integers(0, 4)) == 4:
        ids[0, -1], bad_ids = draw(st.sampled_from([11, -1])), True
    blocks = ids.to(dtype)
    model = _lm()

    def check(r):
        with torch.no_grad():
            logp = model(ids[:, :-1]).double().log_softmax(-1)
        _close(r, -logp.gather(-1, ids[:, 1:, None]).mean(), rtol=1e-5, atol=1e-6)
    return Case("lm", "block_nll", lambda: block_nll(model, blocks),
                bad_m or bad_t or bad_dtype or bad_ids, check,
                f"blocks [{M}, {T1}] {dtype} ids_bad={bad_ids}")


# ------------------------------------------------------------------------------------------------ models
@st.composite
def models_mlp(draw) -> Case:
    """MLP(bias=…) flags: a bias exactly when asked, never a flag coerced from 'no', 0 or None."""
    from taskloss.models import MLP
    bias, bad = pick(draw, FLAGS_VALID, FLAGS_INVALID)
    width, bad_w = pick(draw, [3, 8], [0, -2, 2.5])

    def check(m):
        has = any(name.endswith("bias") for name, _ in m.named_parameters())
        assert has == bool(bias), f"bias={bias!r} but bias parameters present: {has}"
    sig = __import__("inspect").signature(MLP)
    kw = {"bias": bias}
    args = [4, [width], 2] if "hidden" in sig.parameters else [4, width, 2]
    return Case("models", "MLP", lambda: MLP(*args, **kw), bad or bad_w, check, f"bias={bias!r} width={width!r}")


# ------------------------------------------------------------------------------------------------ results
class _Opaque:
    pass


JSON_LEAVES = st.one_of(st.integers(-10, 10), st.floats(allow_nan=True, allow_infinity=True, width=32),
                        st.text(max_size=3), st.booleans(), st.none())
BAD_LEAVES = st.sampled_from([{1, 2}, _Opaque(), b"x", complex(1, 2), object])


@st.composite
def results_record(draw) -> Case:
    """Run.record: a JSON-able value is stored and reads back from results.json; any other is a TypeError that
    leaves the run usable (a later valid record succeeds)."""
    from taskloss.results import Run
    bad = draw(st.integers(0, 3)) == 3
    leaf = BAD_LEAVES if bad else JSON_LEAVES
    value = draw(st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(min_size=1, max_size=3), inner,
                                                                            max_size=3)), max_leaves=4))
    value = [value, draw(BAD_LEAVES)] if bad and not _holds_bad(value) else value
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=_TMP.name))
    run = Run(name="walk", dir=folder, device=torch.device("cpu"), seed=0)

    def call():
        try:
            return run.record("v", value)
        finally:
            run.record("after", 1.0)          # a failed record leaves the run usable
            assert json.loads((folder / "results.json").read_text())["results"]["after"] == 1.0

    def check(_):
        stored = json.loads((folder / "results.json").read_text())["results"]["v"]
        assert stored == _expected_json(value), f"stored {stored!r} for {value!r}"
    return Case("results", "Run.record", call, bad, check, f"value={value!r}")


def _holds_bad(v) -> bool:
    if isinstance(v, list):
        return any(_holds_bad(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_bad(x) for x in v.values())
    return not (v is None or isinstance(v, (bool, int, float, str)))


def _expected_json(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list):
        return [_expected_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _expected_json(x) for k, x in v.items()}
    return v


# ------------------------------------------------------------------------------------------------ utils
@st.composite
def utils_parameters(draw) -> Case:
    """flatten / unflatten round trip and unique_tensors over shared, repeated and frozen tensors."""
    from taskloss.parameter_vectors import flatten, unflatten, unique_tensors
    shapes = draw(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=2), min_size=1, max_size=3))
    ts = [torch.randn(tuple(s), dtype=torch.float64) for s in shapes]
    listed = ts + ([ts[0]] if draw(st.booleans()) else [])
    trainable_only, bad_flag = pick(draw, FLAGS_VALID, FLAGS_INVALID)

    def call():
        distinct = unique_tensors(listed, trainable_only=trainable_only)
        return distinct, unflatten(flatten(distinct), distinct)

    def check(r):
        distinct, back = r
        want = [] if trainable_only else ts
        assert [id(t) for t in distinct] == [id(t) for t in want], "not each tensor once, in order"
        for a, b in zip(back, distinct):
            assert torch.equal(a, b)
    empty = bool(trainable_only)                 # no tensor requires grad: flatten refuses an empty list
    return Case("utils", "unique_tensors+flatten", call, bad_flag or empty, check,
                f"shapes={shapes} twice={len(listed) > len(ts)} trainable_only={trainable_only!r}")


# ------------------------------------------------------------------------------------------------ more rooms
@st.composite
def losses_edit_distance(draw) -> Case:
    """edit_distance against rapidfuzz's Levenshtein distance, over list and padded-tensor inputs, id dtypes, an
    EOS cut and the normalize flag."""
    from rapidfuzz.distance import Levenshtein

    from taskloss.losses import edit_distance
    B, bad_b = pick(draw, [1, 2, 3], [0])
    row = st.lists(st.integers(1, 4), min_size=0, max_size=5)
    hyp, ref = draw(st.lists(row, min_size=B, max_size=B)), draw(st.lists(row, min_size=B, max_size=B))
    normalize, bad_flag = pick(draw, FLAGS_VALID, FLAGS_INVALID)
    eos = draw(st.sampled_from([None, 4]))
    as_tensor = draw(st.booleans())
    dtype, bad_dtype = pick(draw, [torch.int64, torch.int32], [torch.float32]) if as_tensor else (None, False)

    def padded(rows):
        w = max([len(r) for r in rows] + [1])
        return torch.tensor([r + [0] * (w - len(r)) for r in rows], dtype=torch.int64).to(dtype)
    h_in, r_in = (padded(hyp), padded(ref)) if as_tensor and B else (hyp, ref)
    pad = 0 if as_tensor else None

    def cut(r):
        return r[:r.index(eos)] if eos is not None and eos in r else r

    def check(d):
        want = []
        for h, r in zip(hyp, ref):
            h, r = cut(h), cut(r)
            dist = Levenshtein.distance(h, r)
            want.append(min(dist / max(len(r), 1), 1.0) if normalize else dist)
        _close(d, want)
    return Case("losses", "edit_distance", lambda: edit_distance(h_in, r_in, eos_id=eos, pad_id=pad,
                                                                 normalize=normalize),
                bad_b or bad_flag or bad_dtype, check,
                f"B={B} tensor={as_tensor} {dtype} eos={eos} normalize={normalize!r}")


@st.composite
def results_paired_comparison(draw) -> Case:
    """paired_comparison: the effect is the mean difference, the interval holds it, and a verdict is given only
    from three seeds on with the interval on one side of 0; NaN values, bad levels and methods refused."""
    from taskloss.results import paired_comparison
    n, bad_n = pick(draw, [2, 3, 5, 8], [0, 1])
    val = st.floats(-5, 5, allow_nan=False, width=32)
    a, b = draw(st.lists(val, min_size=n, max_size=n)), draw(st.lists(val, min_size=n, max_size=n))
    bad_val = False
    if n and draw(st.integers(0, 5)) == 5:
        a[0], bad_val = draw(st.sampled_from([math.nan, math.inf])), True
    if n > 1 and draw(st.integers(0, 5)) == 5:
        b, bad_val = b[:-1], True                                   # different lengths
    conf, bad_conf = pick(draw, [0.9, 0.95], [0.0, 1.0, math.nan, 1.5])
    method, bad_method = pick(draw, ["t", "sign-flip"], ["wilcoxon", ""])
    lower, bad_flag = pick(draw, FLAGS_VALID, FLAGS_INVALID)

    def check(c):
        d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
        _close(c.effect, d.mean(), rtol=1e-9, atol=1e-9)
        assert c.ci_low <= c.effect + 1e-9 and c.effect - 1e-9 <= c.ci_high, (c.ci_low, c.effect, c.ci_high)
        if c.verdict != "inconclusive":
            assert c.n >= 3 and (c.ci_low > 0 or c.ci_high < 0), c
            good = (c.effect < 0) if lower else (c.effect > 0)
            assert c.verdict == ("better" if good else "worse"), c
    return Case("results", "paired_comparison",
                lambda: paired_comparison(a, b, confidence=conf, method=method, lower_is_better=lower),
                bad_n or bad_val or bad_conf or bad_method or bad_flag, check,
                f"n={n} conf={conf!r} method={method!r} lower={lower!r} a={a} b={b}")


@st.composite
def datasets_split(draw) -> Case:
    """split_indices: a partition of range(n), sorted, with round(n_c·f) members of each class in train and valid;
    bad fractions, seeds and label dtypes refused."""
    from taskloss.datasets import split_indices
    n, bad_n = pick(draw, [3, 10, 25], [0])
    y = np.asarray(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    if draw(st.integers(0, 5)) == 5:
        y, bad_y = y.astype(np.float64), True
    else:
        bad_y = False
    fr, bad_fr = pick(draw, [(0.6, 0.2, 0.2), (0.5, 0.5, 0.0), (1.0, 0.0, 0.0)],
                      [(0.6, 0.2, 0.3), (-0.2, 0.6, 0.6), (math.nan, 0.5, 0.5), (0.5, 0.5)])
    seed, bad_seed = pick(draw, [0, 7], [-1, 1.5, "0"])

    def check(parts):
        assert set(parts) == {"train", "valid", "test"}
        allidx = np.concatenate([parts[k] for k in ("train", "valid", "test")])
        assert sorted(allidx.tolist()) == list(range(n)), "not a partition of range(n)"
        for k in parts:
            assert (np.diff(parts[k]) > 0).all(), f"{k} not sorted"
        for c in np.unique(y):
            n_c = int((y == c).sum())
            assert int((y[parts["train"]] == c).sum()) == round(n_c * fr[0]), f"class {c} train count"
            n_va = min(round(n_c * fr[1]), n_c - round(n_c * fr[0]))      # both may round up: the rest
            assert int((y[parts["valid"]] == c).sum()) == n_va, f"class {c} valid count"
    return Case("datasets", "split_indices", lambda: split_indices(y, seed=seed, fractions=fr),
                bad_n or bad_y or bad_fr or bad_seed, check, f"n={n} {y.dtype} fractions={fr} seed={seed!r}")




# ------------------------------------------------------------------------------------------------ curvature
BAD_GENERATORS = [0, "seed", np.int64(3), 1.5]


@functools.lru_cache(maxsize=1)
def _curvature_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double().eval()


@st.composite
def curvature_generators(draw) -> Case:
    """The samplers of taskloss.curvature with a generator, a seed or any other object as ``generator=``: the MC
    Fisher symmetric PSD with its diagonal equal to mc_fisher_diagonal's for the same seed, draws reproducible."""
    from taskloss import curvature as C
    gen_seed = draw(st.integers(0, 99))
    gen, bad_gen = pick(draw, ["none", "generator"], BAD_GENERATORS)

    def g():
        return None if gen == "none" else torch.Generator().manual_seed(gen_seed) if gen == "generator" else gen
    m, x = _curvature_net(), torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(gen_seed))
    S = draw(st.integers(1, 3))
    lik = draw(st.sampled_from(["categorical", "gaussian"]))
    which = draw(st.sampled_from(["mc_fisher", "sample_targets", "gaussian_samples", "NaturalGaussianVI", "KFAC",
                                  "FisherDiagonalPreconditioner"]))
    note = f"{which} generator={gen!r} n_samples={S} {lik}"
    if which == "mc_fisher":
        def check_fisher(F):
            _close(F, F.mT, rtol=1e-10, atol=1e-12)
            assert float(torch.linalg.eigvalsh(F).min()) > -1e-10, "not PSD"
            if gen == "generator":
                _close(torch.diagonal(F), C.mc_fisher_diagonal(m, None, x, lik, S, g()), rtol=1e-8, atol=1e-12)
        return Case("curvature", which, lambda: C.mc_fisher(m, None, x, lik, S, g()), bad_gen, check_fisher, note)
    if which == "sample_targets":
        logits = m(x).detach()

        def check_targets(r):
            assert r.shape == ((S, 5) if lik == "categorical" else (S, 5, 3)), tuple(r.shape)
            if gen == "generator":
                assert torch.equal(r, C.sample_targets(logits, lik, S, g())), "not reproducible"
        return Case("curvature", which, lambda: C.sample_targets(logits, lik, S, g()), bad_gen, check_targets, note)
    if which == "gaussian_samples":
        mean, cov = torch.zeros(2, dtype=torch.float64), torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)

        def check_samples(z):
            assert z.shape == (S, 2) and z.dtype == torch.float64 and bool(torch.isfinite(z).all())
            if gen == "generator":
                assert torch.equal(z, C.gaussian_samples(mean, cov, S, g())), "not reproducible"
        return Case("curvature", which, lambda: C.gaussian_samples(mean, cov, S, g()), bad_gen, check_samples, note)
    if which == "NaturalGaussianVI":
        def build_vi():
            return C.NaturalGaussianVI(lambda z: -(z ** 2).sum(), torch.zeros(2, dtype=torch.float64),
                                       torch.eye(2, dtype=torch.float64), lr=1.0, n_samples=S, generator=g())

        def check_vi(vi):
            vi.step()            # a quadratic log-likelihood, lr=1: the posterior precision P₀ + 2I after one step
            _close(vi.precision, 3 * torch.eye(2), rtol=1e-6, atol=1e-6)
        return Case("curvature", which, build_vi, bad_gen, check_vi, note)
    cls = getattr(C, which)
    return Case("curvature", which, lambda: cls(_curvature_net(), generator=g()), bad_gen,
                lambda r: None, note)


LINALG = [torch.float32, torch.float64]


@st.composite
def curvature_dtypes(draw) -> Case:
    """The solves and Gaussian maps of taskloss.curvature over float32 / float64 / mixed inputs, against float64
    references (torch.linalg, torch.distributions' KL); mixed dtypes refused, never promoted."""
    from taskloss import curvature as C
    d = draw(st.integers(1, 3))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    A = torch.randn(d, d, generator=gen, dtype=torch.float64)
    V = A @ A.T + torch.eye(d, dtype=torch.float64)
    v = torch.randn(d, generator=gen, dtype=torch.float64)
    dt_a = draw(st.sampled_from(LINALG))
    dt_b, mixed = dt_a, False
    if draw(st.integers(0, 3)) == 3:
        dt_b, mixed = (torch.float64 if dt_a == torch.float32 else torch.float32), True
    tol = 1e-3 if torch.float32 in (dt_a, dt_b) else 1e-8
    which = draw(st.sampled_from(["natural_gradient", "trust_region_step", "gaussian_kl", "gaussian_to_natural",
                                  "gaussian_log_partition", "gaussian_natural_fisher"]))
    note = f"{which} d={d} {dt_a}/{dt_b}"
    P = torch.linalg.inv(V)
    if which == "natural_gradient":
        def check(r):
            assert r.dtype == dt_b
            _close(r, P @ v, rtol=tol, atol=tol)
        return Case("curvature", which, lambda: C.natural_gradient(V.to(dt_a), v.to(dt_b)), mixed, check, note)
    if which == "trust_region_step":
        def check(r):
            nat = P @ v
            _close(r, -math.sqrt(2 * 0.1 / float(v @ nat)) * nat, rtol=tol, atol=tol)
        return Case("curvature", which, lambda: C.trust_region_step(V.to(dt_a), v.to(dt_b), 0.1), mixed, check, note)
    if which == "gaussian_kl":
        from torch.distributions import MultivariateNormal, kl_divergence

        def check(r):
            ref = kl_divergence(MultivariateNormal(v, V), MultivariateNormal(torch.zeros_like(v), V + 0.5 * P))
            _close(r, ref, rtol=tol, atol=tol)
        return Case("curvature", which, lambda: C.gaussian_kl(v.to(dt_a), V.to(dt_a), torch.zeros(d, dtype=dt_b),
                                                              (V + 0.5 * P).to(dt_b)), mixed, check, note)
    if which == "gaussian_to_natural":
        def check(r):
            _close(r[0], P @ v, rtol=tol, atol=tol)
            _close(r[1], -0.5 * P, rtol=tol, atol=tol)
        return Case("curvature", which, lambda: C.gaussian_to_natural(v.to(dt_a), V.to(dt_b)), mixed, check, note)
    l1, l2 = P @ v, -0.5 * P                                                  # the natural parameters of N(v, V)
    if which == "gaussian_log_partition":
        def check(r):
            ref = 0.5 * v @ P @ v + 0.5 * torch.logdet(V) + 0.5 * d * math.log(2 * math.pi)
            _close(r, ref, rtol=tol, atol=tol)
        return Case("curvature", which, lambda: C.gaussian_log_partition(l1.to(dt_a), l2.to(dt_b)), mixed, check,
                    note)

    def check(F):
        _close(F, F.mT, rtol=tol, atol=tol)
        _close(F[:d, :d], V, rtol=tol, atol=tol)             # ∂²A/∂λ₁² = Cov[z] = V
        assert float(torch.linalg.eigvalsh(F.double()).min()) > 0, "not positive definite"
    return Case("curvature", which, lambda: C.gaussian_natural_fisher(l1.to(dt_a), l2.to(dt_b)), mixed, check, note)


@st.composite
def curvature_cg(draw) -> Case:
    """conjugate_gradient's tol (0 runs every iteration), max_iter and damping: the truncated iterate solves an SPD
    system to the tolerance it reports; bad values refused."""
    from taskloss import curvature as C
    n = draw(st.integers(1, 6))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    A = torch.randn(n, n, generator=gen, dtype=torch.float64)
    A = A @ A.T / n + 0.5 * torch.eye(n, dtype=torch.float64)
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    tol, bad_tol = pick(draw, [0.0, 1e-12, 1e-6], [-1.0, math.nan, math.inf, "1e-6", None])
    it, bad_it = pick(draw, [n, 3 * n, 50], [0, -1, 2.5])
    lam, bad_lam = pick(draw, [0.0, 0.1], [-0.1, math.nan])

    def check(r):
        x, info = r
        rel = float((b - (A @ x + lam * x)).norm() / b.norm())
        if tol == 0.0:                                       # no early stop but an exactly zero residual
            assert info["iterations"] == it or info["stop"] == "nonpositive_curvature" or info["residual_norm"] == 0, \
                info
        if info["stop"] == "converged":
            assert rel <= max(100 * tol, 1e-12), (rel, info)
        if it >= 3 * n:                                      # enough iterations for CG in floating point
            assert rel <= max(100 * tol, 1e-8), (rel, info)
    return Case("curvature", "conjugate_gradient",
                lambda: C.conjugate_gradient(lambda u: A @ u, b, damping=lam, max_iter=it, tol=tol, truncated=True),
                bad_tol or bad_it or bad_lam, check, f"n={n} tol={tol!r} max_iter={it!r} damping={lam!r}")


# ------------------------------------------------------------------------------------------------ attribution
BAD_DEVICES = ["gpu", 3, None] + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"])


@st.composite
def attribution_quadrature(draw) -> Case:
    """quadrature_rule over methods, node counts (a Gauss–Legendre rule beyond memory refused), dtypes and devices:
    Captum's nodes, weights that sum to one, Gauss–Legendre exact for x^(2m-1)."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    from taskloss import attribution as A
    method, bad_method = pick(draw, list(A.METHODS), ["simpson", 3])
    n, bad_n = pick(draw, [1, 2, 5, 16], [0, -1, 2.5, 10**6, 10**13])
    device, bad_dev = pick(draw, ["cpu", torch.device("cpu")], BAD_DEVICES)
    dtype, bad_dtype = pick(draw, [torch.float64, torch.float32], [torch.int64])
    if n == 10**6 and not bad_method:
        method = "gausslegendre"                    # its 8n² companion matrix: other rules are valid here
    too_small = method == "riemann_trapezoid" and n == 1
    tol = 1e-6 if dtype == torch.float32 else 1e-10

    def check(r):
        alphas, weights = r
        assert alphas.dtype == weights.dtype == dtype and alphas.shape == weights.shape == (n,)
        _close(weights.sum(), 1.0, rtol=tol, atol=tol)
        assert bool((alphas >= 0).all() & (alphas <= 1).all() & (alphas.diff() > 0).all())
        if 2 <= n <= 16:                                     # Captum's Riemann rules need two nodes
            _close(alphas, approximation_parameters(method)[1](n), rtol=1e-6, atol=1e-7)
        if method == "gausslegendre" and n <= 16:
            _close((weights.double() * alphas.double() ** (2 * n - 1)).sum(), 1 / (2 * n), rtol=1e-5, atol=tol)
    return Case("attribution", "quadrature_rule", lambda: A.quadrature_rule(method, n, dtype=dtype, device=device),
                bad_method or bad_n or bad_dev or bad_dtype or too_small, check,
                f"{method!r} n_steps={n!r} device={device!r} {dtype}")


@st.composite
def attribution_ig(draw) -> Case:
    """IntegratedGradients on a linear model, where every rule is exact: attributions w·(x − x′), completeness
    error 0; step counts beyond memory, bad methods and batch sizes refused before anything is allocated."""
    from taskloss import attribution as A
    B, F = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    w = torch.randn(F, generator=gen, dtype=torch.float64)
    x, base = (torch.randn(B, F, generator=gen, dtype=torch.float64) for _ in range(2))
    method, bad_method = pick(draw, list(A.METHODS), ["trapezoid"])
    n, bad_n = pick(draw, [1, 2, 7], [0, 1.5, 10**6, 10**12])
    ibs, bad_ibs = pick(draw, [None, 1, 4], [0, -2, 1.5])
    if n == 10**6 and not bad_method:
        method = "gausslegendre"                    # its 8n² companion matrix: other rules are valid (and slow) here
    too_small = method == "riemann_trapezoid" and n == 1

    def check(r):
        _close(r.attributions, w * (x - base), rtol=1e-9, atol=1e-10)
        _close(r.completeness_error, torch.zeros(B), rtol=0, atol=1e-9)
    return Case("attribution", "IntegratedGradients.attribute",
                lambda: A.IntegratedGradients(lambda z: z @ w).attribute(x, base, n_steps=n, method=method,
                                                                         internal_batch_size=ibs),
                bad_method or bad_n or bad_ibs or too_small, check,
                f"B={B} F={F} {method!r} n_steps={n!r} internal_batch_size={ibs!r}")


@st.composite
def attribution_baselines(draw) -> Case:
    """The noise and sampled baselines with a generator, a seed or any other object as ``generator=``: shapes,
    ranges, reproducibility, rows of the data drawn without replacement."""
    from taskloss import attribution as A
    seed = draw(st.integers(0, 99))
    gen, bad_gen = pick(draw, ["none", "generator"], BAD_GENERATORS)

    def g():
        return None if gen == "none" else torch.Generator().manual_seed(seed) if gen == "generator" else gen
    x = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    which = draw(st.sampled_from(["gaussian_noise_baseline", "uniform_noise_baseline", "baseline_set"]))
    k = draw(st.integers(1, 3))
    call = {"gaussian_noise_baseline": lambda: A.gaussian_noise_baseline(x, 0.1, g()),
            "uniform_noise_baseline": lambda: A.uniform_noise_baseline(x, -1.0, 2.0, g()),
            "baseline_set": lambda: A.baseline_set(x, k, g())}[which]

    def check(r):
        if which == "baseline_set":
            assert r.shape == (k, 1, 4)
            rows = [int(torch.nonzero((x == row).all(1))[0]) for row in r[:, 0]]
            assert len(set(rows)) == k, f"rows {rows} not distinct"
        else:
            assert r.shape == x.shape and r.dtype == x.dtype
        if which == "uniform_noise_baseline":
            assert bool((r >= -1).all() & (r < 2).all())
        if gen == "generator":
            assert torch.equal(r, call()), "not reproducible"
    return Case("attribution", which, call, bad_gen, check, f"{which} generator={gen!r} k={k}")




# ------------------------------------------------------------------------------------------------ every public name
# Issue 42: the families are derived from every subpackage's __all__. The hand-written families above check results
# against references; the *entry* families below reach every public callable of a subpackage with the inputs the
# issue lists, where a clear refusal is the only right answer: every required argument gets the same poison (an
# opaque object, a meta / complex / empty / NaN / non-contiguous / half tensor, a string or None for a number, a
# numpy array of objects, a ModelOutput, a size of 10**12, a train-mode Dropout model), or — for a callable without
# required arguments — its first optional argument does. ``ACCEPTS`` names the poisons a callable may take (a
# documented valid input), with the check its result must pass.

SUBPACKAGES = tuple(m.name for m in pkgutil.iter_modules([PACKAGE]) if m.ispkg) + ("utils",)
HELPER_MODULES = ("taskloss.utils", "taskloss.validation", "taskloss.parameter_vectors")


@functools.lru_cache(maxsize=1)
def public_callables() -> dict[tuple[str, str], Any]:
    """``(subpackage, name) → object`` for every callable named in a subpackage's (and utils') ``__all__``."""
    out = {}
    for sub in SUBPACKAGES:
        # "utils" is the shared helpers' room: utils itself, validation (how inputs are checked) and
        # parameter_vectors (parameters as flat vectors), walked as one family as before they were split
        modules = (["utils", "validation", "parameter_vectors"] if sub == "utils" else [sub])
        for m in modules:
            mod = importlib.import_module(f"taskloss.{m}")
            for name in mod.__all__:
                obj = getattr(mod, name)
                if callable(obj):
                    out[sub, name] = obj
    return out


# Records and signals: a call builds a container (a NamedTuple, a dataclass without validation, an exception or a
# warning class), no computation to walk. Each is built and read by a function that is walked.
EXEMPT = {
    ("attribution", "Attribution"): "NamedTuple returned by IntegratedGradients.attribute",
    ("contrastive", "RNGState"): "dataclass snapshot of generator states, built by RNGState.capture",
    ("contrastive", "AccumulationResult"): "NamedTuple returned by accumulated_backward",
    ("curvature", "MCEstimate"): "NamedTuple returned by bonnet_gradient / price_gradient",
    ("datasets", "DigitsSplits"): "dataclass returned by load_digits_splits",
    ("datasets", "Document"): "dataclass returned by load_documents",
    ("datasets", "UnknownTokenWarning"): "a warning category",
    ("dynamics", "SmoothnessSample"): "NamedTuple returned by local_smoothness",
    ("dynamics", "EigenResult"): "NamedTuple returned by top_hessian_eigenvalue",
    ("dynamics", "SmoothnessFit"): "NamedTuple returned by fit_l0_l1",
    ("dynamics", "FlowResult"): "NamedTuple returned by integrate_flow",
    ("gradflow", "LagJacobians"): "NamedTuple returned by lag_jacobians",
    ("gradflow", "LayerGradients"): "NamedTuple returned by layer_gradient_norms",
    ("gradflow", "TrainResult"): "NamedTuple returned by train_lm",
    ("harness", "PassCount"): "dataclass of counters filled by PassCounter",
    ("harness", "RuleSpec"): "dataclass built and validated by register",
    ("harness", "IdealUpdate"): "dataclass returned by ideal_update",
    ("harness", "StepRecord"): "dataclass returned by propose",
    ("harness", "TrainRecord"): "dataclass returned by train",
    ("results", "Comparison"): "dataclass returned by paired_comparison",
    ("sampling", "SNISResult"): "NamedTuple returned by self_normalized_is",
    ("search", "MGSStats"): "dataclass returned by MGS.step",
    ("search", "PGResult"): "NamedTuple returned by the REINFORCE functions",
    ("search", "GroupMoments"): "record returned by exact_group_moments / sampled_group_moments",
    ("curvature", "RankFailure"): "an exception class, raised on every rank when one cannot form its statistics",
    ("runner", "main"): "the command line (reads sys.argv, starts kernels); walked by tests/runner",
    ("results", "Run"): "dataclass of one run's state, built (and its folder made) by start, which is walked",
}


class _ModelOutput(dict):
    """A ``transformers.ModelOutput`` stand-in (a dict with attribute access) where a tensor goes."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError as err:
            raise AttributeError(k) from err


def _train_mode_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Linear(3, 2)).train()


POISONS: dict[str, Callable[[], Any]] = {
    "opaque object": _Opaque,
    "meta tensor": lambda: torch.ones(3, 4, device="meta"),
    "complex tensor": lambda: torch.ones(3, 4, dtype=torch.complex64),
    "empty tensor": lambda: torch.empty(0, 4),
    "0-d NaN tensor": lambda: torch.tensor(math.nan),
    "non-contiguous NaN tensor": lambda: torch.full((4, 3), math.nan).T,
    "float16 inf tensor": lambda: torch.full((3, 4), math.inf, dtype=torch.float16),
    "string": lambda: "no",
    "None": lambda: None,
    "numpy object array": lambda: np.array([object(), object()], dtype=object),
    "list with NaN": lambda: [[math.nan, 1.0]],
    "ModelOutput": lambda: _ModelOutput(logits=torch.ones(3, 4, device="meta")),
    "huge size": lambda: 10**12,
    "negative size": lambda: -3,
    "NaN number": lambda: math.nan,
    "train-mode Dropout model": _train_mode_model,
}

# Further exception types a docstring names: a path that does not exist, a partition function beyond float64.
DOCUMENTED = {("datasets", "corpus_hash"): (FileNotFoundError,), ("datasets", "corpus_stats"): (FileNotFoundError,),
              ("datasets", "load_documents"): (FileNotFoundError,), ("datasets", "load_corpus"): (FileNotFoundError,),
              ("lm", "load_causal_lm"): (FileNotFoundError,), ("lm", "load_pretrained_lm"): (FileNotFoundError,),
              ("sampling", "ball_partition"): (OverflowError,)}

# (subpackage, name) → {poison: check of the result}: a documented valid input among the poisons, and what its
# result must be. Validators and helpers take the kinds their contract admits (check_dtype looks at the dtype only,
# check_int has no bounds unless given); a callable without arguments takes no poison at all.
TENSORS = ("0-d NaN tensor", "non-contiguous NaN tensor", "float16 inf tensor", "empty tensor", "complex tensor")
EVERY = tuple(POISONS)


def _is(kind_type):
    def check(r):
        assert isinstance(r, kind_type), f"returned {type(r).__name__}"
    return check


def _refuses_on_use(r):
    """An object built around a train-mode model refuses when it computes (the constructor only stores it)."""
    try:
        r.attribute(torch.randn(3, 3), target=0)
    except ValueError as err:
        assert "training mode" in str(err), str(err)
    else:
        raise AssertionError("attribute() accepted a train-mode Dropout model")


def _same_as_input(kind):
    def check(r):
        want = POISONS[kind]()
        assert isinstance(r, torch.Tensor) and r.shape == want.shape and r.dtype == want.dtype
    return check


_ACCEPT_SPECS: list[tuple[str, str, tuple[str, ...], Callable[[str], Callable[[Any], None]]]] = [
    # no arguments, or an optional one the function documents as ignored
    ("datasets", "minilm_path", EVERY, lambda k: _is(Path)),
    ("dynamics", "native_kernels", EVERY, lambda k: lambda r: None),
    ("contrastive", "world", ("None",), lambda k: _is(tuple)),     # None: the default group
    ("contrastive", "check_batch_independent", ("train-mode Dropout model",),
     lambda k: lambda r: None),                                      # only BatchNorm couples rows, not Dropout
    ("utils", "check_eval_mode", tuple(k for k in EVERY if k != "train-mode Dropout model"),
     lambda k: lambda r: None),                                                   # a non-module has no mode
    # defaults: None is the documented default, a count without an upper bound
    ("datasets", "corpus_hash", ("None",), lambda k: _is(str)),
    ("datasets", "corpus_stats", ("None",), lambda k: _is(dict)),
    ("datasets", "minilm_token_embeddings", ("None",), lambda k: _is(torch.Tensor)),
    ("datasets", "get_tokenizer", ("huge size",), lambda k: lambda r: None),     # min_count above every count
    ("datasets", "load_digits_splits", ("huge size",), lambda k: lambda r: None),  # a seed
    ("utils", "seed_everything", ("huge size",), lambda k: _is(torch.Generator)),
    ("utils", "check_generator", ("None",), lambda k: lambda r: None),
    ("utils", "check_int", ("huge size", "negative size"), lambda k: lambda r: None),
    ("utils", "check_positive", ("huge size",), lambda k: lambda r: None),
    ("utils", "check_nonnegative", ("huge size",), lambda k: lambda r: None),
    ("utils", "check_allocation", ("negative size",), lambda k: lambda r: None),
    ("utils", "format_bytes", ("huge size", "negative size"), lambda k: _is(str)),
    ("utils", "atomic_write_text", ("string",), lambda k: lambda r: None),          # a relative path, a text
    ("attribution", "captum_trapezoid_factor", ("huge size",), lambda k: lambda r: None),
    ("dynamics", "clip_coefficient", ("huge size",), lambda k: lambda r: None),
    ("sampling", "log_ball_volume", ("huge size",), lambda k: lambda r: None),
    ("sampling", "ball_log_partition", ("huge size",), lambda k: lambda r: None),
    ("sampling", "ball_log_partition_derivative", ("huge size",), lambda k: lambda r: None),
    # a train-mode model is stored, copied or counted; the computation that needs eval mode refuses it
    ("attribution", "IntegratedGradients", ("train-mode Dropout model",), lambda k: _refuses_on_use),
    ("attribution", "randomized_copy", ("train-mode Dropout model",), lambda k: _is(nn.Module)),
    ("attribution", "EmbeddingIntegratedGradients", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("utils", "eval_mode", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("results", "start", ("string",), lambda k: lambda r: None),             # "no" is a valid notebook name
    ("attribution", "cascading_randomization", ("train-mode Dropout model",), lambda k: _is(list)),
    ("curvature", "KFAC", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("curvature", "FisherDiagonalPreconditioner", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("harness", "PassCounter", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("sampling", "vmap_loss", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("utils", "count_parameters", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("curvature", "muon_with_adamw", ("train-mode Dropout model",), lambda k: lambda r: None),   # an optimizer: any mode
    ("utils", "functional_loss", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("utils", "random_modules", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("utils", "check_module", ("train-mode Dropout model",), lambda k: lambda r: None),
    ("utils", "check_param_list", ("list with NaN", "train-mode Dropout model"), lambda k: lambda r: None),
    ("utils", "check_iterable", TENSORS[1:] + ("meta tensor", "ModelOutput", "list with NaN",
                                               "train-mode Dropout model"), lambda k: lambda r: None),
    ("utils", "check_nonempty", TENSORS[1:] + ("meta tensor", "ModelOutput", "list with NaN", "string",
                                                "numpy object array", "train-mode Dropout model"),
     lambda k: lambda r: None),
    # shape-only functions and helpers whose contract is one property of a tensor
    ("attribution", "average_ranks", ("empty tensor",), lambda k: lambda r: None),
    ("attribution", "spearman_correlation", ("empty tensor",), lambda k: lambda r: None),
    ("attribution", "uniform_noise_baseline", ("0-d NaN tensor", "non-contiguous NaN tensor", "float16 inf tensor"),
     _same_as_input),
    ("contrastive", "batch_size", TENSORS[1:] + ("meta tensor", "ModelOutput", "list with NaN"),
     lambda k: _is(int)),
    ("contrastive", "gather_with_grad", TENSORS, _same_as_input),      # one process: x itself
    ("utils", "all_finite", TENSORS, lambda k: lambda r: None if r == bool(torch.isfinite(POISONS[k]()).all())
     else (_ for _ in ()).throw(AssertionError(f"all_finite returned {r}"))),
    ("utils", "check_dtype", ("0-d NaN tensor", "empty tensor", "non-contiguous NaN tensor"), _same_as_input),
    ("utils", "check_finite", ("complex tensor", "empty tensor"), _same_as_input),
    ("utils", "check_floating", ("0-d NaN tensor", "empty tensor", "float16 inf tensor",
                                 "non-contiguous NaN tensor"), _same_as_input),
    ("utils", "check_no_nan", ("complex tensor", "empty tensor", "float16 inf tensor"), lambda k: lambda r: None),
    ("utils", "check_not_meta", TENSORS + ("list with NaN", "train-mode Dropout model"), lambda k: lambda r: None),
    ("utils", "check_tensors", TENSORS[1:] + ("meta tensor", "ModelOutput"), lambda k: _is(list)),
    ("utils", "unique_tensors", TENSORS + ("meta tensor",), lambda k: _is(list)),
    ("utils", "distinct_param_group", TENSORS + ("meta tensor", "ModelOutput"), lambda k: _is(dict)),
    ("utils", "flat_gradient", TENSORS[1:] + ("meta tensor", "ModelOutput"), lambda k: _is(torch.Tensor)),
    ("utils", "flatten", TENSORS, lambda k: _is(torch.Tensor)),
    ("utils", "is_transformed", TENSORS + ("meta tensor",), lambda k: lambda r: None if r is False
     else (_ for _ in ()).throw(AssertionError("a plain tensor reported as transformed"))),
    ("utils", "named_tensors", TENSORS[1:] + ("meta tensor", "ModelOutput", "list with NaN"),
     lambda k: _is(tuple)),
    ("utils", "train_mode_error", ("empty tensor",), lambda k: lambda r: None),   # no modules: no refusal
]
ACCEPTS: dict[tuple[str, str], dict[str, Callable[[Any], None]]] = {}
for _sub, _name, _kinds, _check in _ACCEPT_SPECS:
    ACCEPTS.setdefault((_sub, _name), {}).update({k: _check(k) for k in _kinds})


@contextlib.contextmanager
def _sandbox():
    """Run a poisoned call in a scratch working directory (a string poison may name a file to write)."""
    old, env = os.getcwd(), os.environ.get("TASKLOSS_OUTPUT_DIR")
    os.chdir(tempfile.mkdtemp(prefix="entry-", dir=_TMP.name))
    os.environ["TASKLOSS_OUTPUT_DIR"] = os.getcwd()          # results.start writes here, never into runs/
    try:
        yield
    finally:
        os.chdir(old)
        if env is None:
            os.environ.pop("TASKLOSS_OUTPUT_DIR", None)
        else:
            os.environ["TASKLOSS_OUTPUT_DIR"] = env


LABELS = ("name", "what")      # a validator's label for its message, not data: given a plain string


def _poison_call(obj, kind: str):
    """A call of ``obj`` with every required argument poisoned by ``kind`` (or its first optional one)."""
    sig = inspect.signature(obj)
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in params if p.default is p.empty]
    targets = required or params[:1]
    make = POISONS[kind]

    def call():
        with _sandbox():
            return _call()

    def _call():
        args, kwargs = [], {}
        for p in targets:
            value = "x" if p.name in LABELS and getattr(obj, "__module__", "") in HELPER_MODULES else make()
            if p.kind is p.KEYWORD_ONLY:
                kwargs[p.name] = value
            elif p.kind is p.POSITIONAL_ONLY or not kwargs:
                args.append(value)
            else:
                kwargs[p.name] = value
        return obj(*args, **kwargs)
    return call, [p.name for p in targets]


# Names whose entry checks are owned by another room (search/mgs_*, results/compare.py): walked and counted by
# walk_counts.py as PENDING, not asserted in make test until their owners add the checks (issue 42's report).
OWNED_ELSEWHERE: set = set()       # every room now validates its own names (issue 42's last four: fixed)


def _entry_family(sub: str, pending: bool = False):
    names = sorted(n for (s, n) in public_callables() if s == sub and (s, n) not in EXEMPT
                   and ((s, n) in OWNED_ELSEWHERE) == pending)

    @st.composite
    def family(draw) -> Case:
        name = draw(st.sampled_from(names))
        kind = draw(st.sampled_from(sorted(POISONS)))
        obj = public_callables()[sub, name]
        call, poisoned = _poison_call(obj, kind)
        accepted = ACCEPTS.get((sub, name), {})
        return Case(sub, name, call, kind not in accepted, accepted.get(kind, lambda r: None),
                    f"{kind} for {', '.join(poisoned) or 'no argument'}", DOCUMENTED.get((sub, name), ()))
    family.__name__ = f"{sub}_entry{'_pending' if pending else ''}"
    family.covers = {(sub, n) for n in names}
    return family


ENTRY_FAMILIES = {sub: _entry_family(sub) for sub in SUBPACKAGES
                  if any(s == sub and (s, n) not in set(EXEMPT) | OWNED_ELSEWHERE for s, n in public_callables())}
PENDING_ENTRY = {sub: _entry_family(sub, pending=True) for sub in sorted({s for s, _ in OWNED_ELSEWHERE})}


FAMILIES = {
    "losses": [losses_macro_f1, losses_edit_distance], "sampling": [sampling_newton, sampling_weights],
    "contrastive": [contrastive_accumulation], "dynamics": [dynamics_clip, dynamics_shared],
    "search": [search_zeroth_order, search_mezo], "gradflow": [gradflow_init_recurrent],
    "lm": [lm_block_nll], "models": [models_mlp],
    "results": [results_record, results_paired_comparison], "datasets": [datasets_split], "utils": [utils_parameters],
    "curvature": [curvature_generators, curvature_dtypes, curvature_cg],
    "attribution": [attribution_quadrature, attribution_ig, attribution_baselines],
}
for _sub, _fam in ENTRY_FAMILIES.items():       # every public callable of every subpackage (and utils) reached
    FAMILIES.setdefault(_sub, []).append(_fam)
PENDING: dict = {_sub: [_fam] for _sub, _fam in PENDING_ENTRY.items()}   # walk_counts.py counts them as well


def covered() -> set[tuple[str, str]]:
    """The public callables some family reaches: the entry families' names and the hand-written families' ones."""
    out = set()
    for fams in list(FAMILIES.values()) + list(PENDING.values()):
        for fam in fams:
            out |= getattr(fam, "covers", set())
    return out


# ------------------------------------------------------------------------------------------------ issue 42's findings
def _covers(*names):
    def mark(fam):
        fam.covers = set(names)
        return fam
    return mark


@_covers(("attribution", "IntegratedGradients"), ("attribution", "integrate_gradients"))
@st.composite
def attribution_deterministic(draw) -> Case:
    """IntegratedGradients over models with Dropout / BatchNorm in train or eval mode (train refused, as K-FAC
    refuses it), and integrate_gradients with internal_batch_size and NaN weights: a linear path integral equals
    w·Σ weights, the path values (x0 + α(x1 − x0))·w."""
    from taskloss import attribution as A
    which = draw(st.sampled_from(["IntegratedGradients", "integrate_gradients"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    if which == "IntegratedGradients":
        mid = draw(st.sampled_from(["none", "dropout", "batchnorm"]))
        train = draw(st.booleans())
        torch.manual_seed(0)
        layers = {"none": [], "dropout": [nn.Dropout(0.5)], "batchnorm": [nn.BatchNorm1d(4)]}[mid]
        model = nn.Sequential(nn.Linear(3, 4), *layers, nn.Linear(4, 2)).double().train(train)
        if mid == "batchnorm":
            model(torch.randn(8, 3, dtype=torch.float64, generator=gen))          # running statistics
            model.train(train)
        x = torch.randn(2, 3, dtype=torch.float64, generator=gen)
        invalid = train and mid != "none"

        def check(r):                       # a piecewise-affine network: completeness to the rule's accuracy
            _close(r.completeness_error, torch.zeros(2), rtol=0, atol=0.05)
        return Case("attribution", which, lambda: A.IntegratedGradients(model).attribute(x, target=1, n_steps=32),
                    invalid, check, f"{mid} train={train}")
    w = torch.randn(4, generator=gen, dtype=torch.float64)
    x0, x1 = (torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    a, wt = A.quadrature_rule("gausslegendre", draw(st.integers(1, 6)), dtype=torch.float64)
    ibs, bad_ibs = pick(draw, [None, 1, 2, 50], [0, -1, 2.5, "4"])
    bad_w = draw(st.integers(0, 4)) == 4
    if bad_w:
        wt = wt.clone()
        wt[0] = math.nan

    def check(r):
        total, values = r
        _close(total, w.expand(3, 4) * wt.sum(), rtol=1e-12, atol=1e-12)
        _close(values, (x0 + a[:, None, None] * (x1 - x0)) @ w, rtol=1e-12, atol=1e-12)
    return Case("attribution", which, lambda: A.integrate_gradients(lambda p, i: p @ w, x0, x1, a, wt,
                                                                    internal_batch_size=ibs),
                bad_ibs or bad_w, check, f"internal_batch_size={ibs!r} nan_weight={bad_w}")


@_covers(("contrastive", "info_nce_rows"))
@st.composite
def contrastive_rows(draw) -> Case:
    """info_nce_rows against a float64 cross-entropy of the scores q·pᵀ/τ; τ = 0, NaN, inf, strings refused."""
    from taskloss.contrastive import info_nce_rows
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    n = draw(st.integers(1, 4))
    q, p = (torch.randn(n, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    tau, bad = pick(draw, [0.05, 0.5, 2.0], [0, 0.0, -0.1, math.nan, math.inf, "0.1", None])

    def check(r):
        _close(r, torch.nn.functional.cross_entropy(q @ p.T / tau, torch.arange(n), reduction="none"),
               rtol=1e-10, atol=1e-10)
    return Case("contrastive", "info_nce_rows", lambda: info_nce_rows(q, p, q, p, tau), bad, check, f"tau={tau!r}")


@_covers(("losses", "emo_loss_reference"), ("losses", "frontier_area"), ("losses", "divergence_frontier"))
@st.composite
def losses_reference_twins(draw) -> Case:
    """emo_loss_reference validates like emo_loss (NaN / +inf / complex / meta logits refused) and equals it when
    valid; frontier_area refuses complex histograms and huge n_lambda, and is 1 for equal histograms."""
    from taskloss import losses as L
    gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    if draw(st.booleans()):
        x = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64)
        t = torch.randint(0, 5, (2, 3), generator=gen)
        e = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        fault = draw(st.sampled_from(["none", "none", "-inf entry", "nan", "+inf", "complex", "meta", "ignored"]))
        if fault == "-inf entry":
            x[0, 0, 1] = -math.inf
        elif fault == "nan":
            x[1, 1, 1] = math.nan
        elif fault == "+inf":
            x[0, 2, 4] = math.inf
        elif fault == "complex":
            x = x.to(torch.complex128)
        elif fault == "meta":
            x = x.to("meta")
        elif fault == "ignored":
            t[0, 0] = -100

        def check(r):
            _close(r, L.emo_loss(x, t, e), rtol=1e-12, atol=1e-12)
        return Case("losses", "emo_loss_reference", lambda: L.emo_loss_reference(x, t, e),
                    fault in ("nan", "+inf", "complex", "meta"), check, f"logits fault={fault}")
    k = draw(st.integers(1, 5))
    h = torch.rand(k, generator=gen, dtype=torch.float64) + 0.1
    kind = draw(st.sampled_from(["tensor", "tensor", "numpy", "list", "complex", "complex numpy"]))
    p = {"tensor": h, "numpy": h.numpy(), "list": h.tolist(), "complex": h.to(torch.complex128),
         "complex numpy": h.numpy().astype(np.complex128)}[kind]
    n_lambda, bad_n = pick(draw, [2, 25], [1, 10**12, 2.5])

    def check(r):
        assert abs(r - 1.0) < 1e-9, r                        # p = q: the frontier is the unit square's corner
    return Case("losses", "frontier_area", lambda: L.frontier_area(p, h, n_lambda=n_lambda),
                kind.startswith("complex") or bad_n, check, f"{kind} k={k} n_lambda={n_lambda!r}")


@_covers(("losses", "macro_f1"), ("lm", "pad_sequences"))
@st.composite
def sizes_before_allocation(draw) -> Case:
    """macro_f1's num_classes and pad_sequences' width up to 10**12: beyond memory refused (before allocating),
    else equal to scikit-learn's f1_score / the padded rows."""
    from sklearn.metrics import f1_score

    from taskloss.lm import pad_sequences
    from taskloss.losses import macro_f1
    if draw(st.booleans()):
        C, bad = pick(draw, [3, 4, 1000], [10**12, 10**15])
        p, t = torch.tensor([0, 2, 1, 1]), torch.tensor([0, 1, 1, 2])

        def check(r):
            _close(r, f1_score(t, p, labels=list(range(C)), average="macro", zero_division=0.0))
        return Case("losses", "macro_f1", lambda: macro_f1(p, t, C), bad, check, f"num_classes={C}")
    rows = [[1, 2], [3]]
    width, bad = pick(draw, [None, 2, 5], [10**12, 1, -1])

    def check_pad(r):
        w = 2 if width is None else width
        assert torch.equal(r, torch.tensor([[1, 2] + [0] * (w - 2), [3] + [0] * (w - 1)]))
    return Case("lm", "pad_sequences", lambda: pad_sequences(rows, 0, width=width), bad, check_pad, f"width={width}")


@_covers(("search", "MeZO"))
@st.composite
def search_mezo_state(draw) -> Case:
    """MeZO's load_state_dict over the same or other shapes (other refused), and a closure's n_examples (whole
    numbers only): a resumed run steps bit-identically to the uninterrupted one."""
    from taskloss.search import MeZO
    shape, bad_shape = pick(draw, [(3, 2)], [(4, 2), (3, 1)])
    n, bad_n = pick(draw, [None, 4, 4.0], [2.5, 0.5, "4"])
    x = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))

    def build(sh):
        torch.manual_seed(0)
        m = nn.Linear(*sh).double()
        return m, MeZO(m.parameters(), lr=0.01, sigma=1e-3, seed=1)

    def closure(m):
        return (lambda: m(x).pow(2).mean()) if n is None else (lambda: (m(x).pow(2).mean(), n))

    def call():
        m1, a = build((3, 2))
        a.step(closure(m1))
        m2, b = build(shape)
        m2.load_state_dict(m1.state_dict()) if shape == (3, 2) else None
        b.load_state_dict(a.state_dict())
        a.step(closure(m1))
        b.step(closure(m2))
        return m1, m2

    def check(r):
        for u, v in zip(r[0].parameters(), r[1].parameters()):
            assert torch.equal(u, v), "the resumed MeZO took another step"
    return Case("search", "MeZO", call, bad_shape or bad_n, check, f"shape={shape} n_examples={n!r}")


@_covers(("results", "start"))
@st.composite
def results_paths(draw) -> Case:
    """Run.savefig's filename: inside the run folder (subfolders made, .png added) or refused ('..', absolute,
    results.json)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from taskloss.results import Run
    name, bad = pick(draw, ["a.png", "sub/b", "c.svg"], ["../escape.png", "../../x", "/tmp/abs.png", "results.json",
                                                          "", 3])
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=_TMP.name)) / "run"
    run = Run(name="walk", dir=folder, device=torch.device("cpu"), seed=0)
    folder.mkdir()

    def call():
        fig = plt.figure(figsize=(1, 1))
        try:
            return run.savefig(fig, name)
        finally:
            plt.close(fig)

    def check(path):
        assert path.is_relative_to(folder.resolve()) and path.exists(), path
    return Case("results", "Run.savefig", call, bad, check, f"filename={name!r}")


@_covers(("harness", "register"), ("harness", "make_rule"))
@st.composite
def harness_registry(draw) -> Case:
    """register over built-in and new names with replace= flags: a registered name is replaced only with
    replace=True (a bool); the registry reads back what was registered."""
    from taskloss import harness as H

    class Rule:
        def __init__(self, problem, lr=0.1):
            self.lr = lr

        def step(self):
            return None
    name = draw(st.sampled_from(["sgd", "adam", "walk-new"]))
    replace, bad_flag = pick(draw, [False, True], ["yes", 1, None])
    clash = name in H.RULES and not replace
    before = H.RULES.get(name)

    def call():
        try:
            return H.register(name, Rule, {"lr": 0.5}, replace=replace)
        finally:
            if before is not None:
                H.RULES[name] = before          # leave the process's registry as it was
            else:
                H.RULES.pop(name, None)

    def check(spec):
        assert spec.cls is Rule and spec.defaults == {"lr": 0.5}
    return Case("harness", "register", call, bad_flag or clash, check, f"name={name!r} replace={replace!r}")


@_covers(("models", "MLP"), ("models", "SmallCNN"), ("models", "RNNLM"))
@st.composite
def models_dtypes(draw) -> Case:
    """MLP / SmallCNN on inputs of their weights' dtype or another (refused), and numpy integer sizes: the output
    equals the layers applied by hand."""
    from taskloss.models import MLP, RNNLM, SmallCNN
    which = draw(st.sampled_from(["MLP", "SmallCNN", "RNNLM"]))
    torch.manual_seed(0)
    if which == "RNNLM":
        d = draw(st.sampled_from([4, np.int64(4), np.int32(6)]))
        idx = torch.randint(0, 10, (2, 5))

        def check_rnn(r):
            torch.manual_seed(0)
            ref = RNNLM(10, d_model=int(d))
            _close(r(idx), ref(idx))
        def build():
            torch.manual_seed(0)
            return RNNLM(10, d_model=d)
        return Case("models", which, build, False, check_rnn, f"d_model={d!r}")
    w_dt = draw(st.sampled_from([torch.float32, torch.float64]))
    x_dt, bad = pick(draw, [w_dt], [torch.float16, torch.bfloat16, torch.float64 if w_dt == torch.float32
                                    else torch.float32])
    model = (MLP(4, (3,), 2) if which == "MLP" else SmallCNN(width=2)).to(w_dt)
    x = torch.randn(2, 4) if which == "MLP" else torch.randn(2, 1, 8, 8)
    x = x.to(x_dt)

    def check(r):
        if which == "MLP":
            ref = model[2](torch.relu(model[0](x)))
        else:
            ref = model.fc(model.pool(torch.relu(model.conv2(torch.relu(model.conv1(x))))).flatten(1))
        _close(r, ref, rtol=1e-6, atol=1e-6)
    return Case("models", which, lambda: model(x), bad, check, f"weights {w_dt}, input {x_dt}")


@_covers(("search", "spsa_grad"), ("search", "gaussian_smoothing_grad"), ("contrastive", "embedding_gradients"),
         ("curvature", "conjugate_gradient"))
@st.composite
def callbacks_nonfinite(draw) -> Case:
    """Callbacks returning NaN / ±inf (a loss, a matrix-vector product, a contrastive loss) are refused; finite
    ones give the reference: a constant loss has a zero gradient estimate, CG solves a diagonal system, the cached
    gradient of Σ c·e is c everywhere."""
    from taskloss import contrastive as C
    from taskloss import curvature as CV
    from taskloss import search as S
    bad_value = draw(st.sampled_from([None, None, math.nan, math.inf, -math.inf]))
    c = 2.5 if bad_value is None else bad_value
    which = draw(st.sampled_from(["spsa_grad", "gaussian_smoothing_grad", "embedding_gradients",
                                  "conjugate_gradient"]))
    note = f"{which} callback value {c!r}"
    if which in ("spsa_grad", "gaussian_smoothing_grad"):
        theta = {"w": torch.zeros(3, dtype=torch.float64)}

        def check(r):
            est = r[0] if isinstance(r, tuple) else r
            assert torch.equal(est["w"], torch.zeros(3, dtype=torch.float64)), est
        return Case("search", which, lambda: getattr(S, which)(lambda t: t["w"].sum() * 0 + c, theta, 0.1, 2,
                                                              generator=torch.Generator().manual_seed(0)),
                    bad_value is not None, check, note)
    if which == "embedding_gradients":
        e = torch.randn(2, 3, generator=torch.Generator().manual_seed(draw(st.integers(0, 9))))

        def check(r):
            _close(r[1][0], torch.full((2, 3), c))
        return Case("contrastive", which, lambda: C.embedding_gradients(lambda z: (z * c).sum(), [e]),
                    bad_value is not None, check, note)
    d = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    b = torch.ones(3, dtype=torch.float64)

    def check(r):
        _close(r[0] if isinstance(r, tuple) else r, b / (d * c), rtol=1e-8, atol=1e-10)
    return Case("curvature", which, lambda: CV.conjugate_gradient(lambda u: u * d * c, b), bad_value is not None,
                check, note)


for _sub, _fam in (("attribution", attribution_deterministic), ("search", callbacks_nonfinite), ("contrastive", contrastive_rows),
                   ("losses", losses_reference_twins), ("losses", sizes_before_allocation),
                   ("search", search_mezo_state), ("results", results_paths), ("harness", harness_registry),
                   ("models", models_dtypes)):
    FAMILIES.setdefault(_sub, []).append(_fam)


# ------------------------------------------------------------------------------------------------ one poisoned argument
# The entry families poison every required argument at once, so a function's first check answers. The *argument*
# families below keep the other arguments valid (VALID_ARGS, by parameter name) and poison one, for every public
# callable whose required arguments all have a valid value here and whose unpoisoned call succeeds.
def _small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 5)).double().eval()


def _f64(*shape):
    return lambda: torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


VALID_ARGS: dict[str, Callable[[], Any]] = {
    "logits": _f64(4, 5), "targets": lambda: torch.tensor([0, 4, 2, 1]), "target": lambda: torch.tensor([0, 4, 2, 1]),
    "pred": lambda: torch.tensor([0, 3, 2, 1]), "inputs": _f64(4, 3), "x": _f64(4, 3), "model": _small_model,
    "model_or_fn": _small_model, "module": _small_model, "params": lambda: list(_small_model().parameters()),
    "theta": lambda: {"w": torch.zeros(3, dtype=torch.float64)}, "tensor": _f64(4, 3), "queries": _f64(4, 3),
    "positives": _f64(4, 3), "candidates": _f64(4, 3), "grad": _f64(3), "g": _f64(3),
    "H": lambda: 2 * torch.eye(3, dtype=torch.float64), "mean": lambda: torch.zeros(3, dtype=torch.float64),
    "cov": lambda: torch.eye(3, dtype=torch.float64), "scores": _f64(5), "tokens": lambda: list("abcde"),
    "idx": lambda: torch.tensor([[1, 2, 3, 4], [0, 1, 2, 3]]), "blocks": lambda: torch.tensor([[1, 2, 3, 4, 0]] * 2),
    "weights": lambda: torch.full((4,), 0.25, dtype=torch.float64), "log_weights": _f64(4), "values": _f64(4),
    "a": _f64(4), "b": _f64(4), "v": _f64(3), "alpha": lambda: 0.5, "sigma": lambda: 0.1, "gamma": lambda: 1.0,
    "lr": lambda: 0.1, "n_samples": lambda: 4, "temperature": lambda: 0.1, "dim": lambda: 3, "d": lambda: 3,
    "radius": lambda: 1.0, "n": lambda: 4, "c": lambda: 5, "seqs": lambda: [[1, 2], [3]], "pad_id": lambda: 0,
    "eos_id": lambda: 3, "hyps": lambda: [[1, 2], [3]], "refs": lambda: [[1, 2], [3, 4]],
    "y": lambda: np.array([0, 1, 0, 1, 1, 0]), "p": lambda: [1.0, 2.0], "q": lambda: [2.0, 1.0],
    "vocab_size": lambda: 5, "num_classes": lambda: 5, "hidden": lambda: 4, "in_dim": lambda: 3,
    "loss_fn": lambda: (lambda out: out.pow(2).mean()), "fn": lambda: (lambda t: (t ** 2).sum()),
    "f": lambda: (lambda t: sum((v ** 2).sum() for v in t.values()) if isinstance(t, dict) else (t ** 2).sum()),
    # the Gaussian family: N(m, V), its natural (l1, l2) and expectation (mu1, mu2) parameters
    "m": lambda: torch.tensor([0.5, -1.0], dtype=torch.float64),
    "V": lambda: torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64),
    "m0": lambda: torch.zeros(2, dtype=torch.float64), "m1": lambda: torch.ones(2, dtype=torch.float64),
    "V0": lambda: torch.eye(2, dtype=torch.float64), "V1": lambda: 2 * torch.eye(2, dtype=torch.float64),
    "l1": lambda: torch.tensor([0.5, -1.0], dtype=torch.float64), "l2": lambda: -0.5 * torch.eye(2, dtype=torch.float64),
    "mu1": lambda: torch.zeros(2, dtype=torch.float64), "mu2": lambda: 2 * torch.eye(2, dtype=torch.float64),
    "S": lambda: torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64),
    "fisher": lambda: 2 * torch.eye(3, dtype=torch.float64), "max_kl": lambda: 0.1,
    "precision": lambda: torch.eye(2, dtype=torch.float64), "prior_precision": lambda: torch.eye(2, dtype=torch.float64),
    "prior_mean": lambda: torch.zeros(2, dtype=torch.float64), "grad_mean": lambda: torch.ones(2, dtype=torch.float64),
    "hess_mean": lambda: -torch.eye(2, dtype=torch.float64), "log_lik": lambda: (lambda z: -(z ** 2).sum()),
    # dynamics: a loss of a parameter list
    "params_next": lambda: [torch.full((3,), 0.1, dtype=torch.float64)], "h": lambda: 0.1, "T": lambda: 0.5,
    "y0": lambda: torch.ones(2, dtype=torch.float64), "field": lambda: (lambda y: -y),
    "theta0": lambda: [torch.ones(2, dtype=torch.float64)], "norm": lambda: 2.0,
    "loss": lambda: (torch.ones(3, dtype=torch.float64, requires_grad=True) ** 2).sum(),
    "vector": lambda: [torch.ones(3, dtype=torch.float64)],
    "grad_norms": lambda: [1.0, 2.0, 3.0], "smoothness": lambda: [1.5, 2.0, 3.5],
    # attribution, lm, gradflow, harness
    "n_steps": lambda: 8, "method": lambda: "gausslegendre", "images": _f64(2, 1, 8, 8), "std": lambda: 0.1,
    "data": _f64(5, 3), "k": lambda: 2, "jac": lambda: torch.eye(3, dtype=torch.float64).expand(2, 3, 3),
    "prefix": lambda: torch.tensor([[1, 2], [3, 4]]), "continuation": lambda: torch.tensor([[2, 3], [4, 1]]),
    "max_new_tokens": lambda: 3, "hyp": lambda: torch.tensor([[1, 2, 3], [2, 3, 0]]), "spec": lambda: "edit_distance",
    "delta": _f64(3), "reference": lambda: torch.ones(3, dtype=torch.float64), "split": lambda: "train",
}
# arguments that must refer to one another (the parameters of *the* model, the model of *the* problem)
JOINT_ARGS: dict[str, Callable[[dict], Any]] = {
    "params": lambda ctx: (dict(ctx["model"].named_parameters()) if "model_or_fn" in ctx["req"]
                           else [torch.zeros(3, dtype=torch.float64, requires_grad=True)]
                           if "loss_fn" in ctx["req"] else list(ctx["model"].parameters())),
    "loss_fn": lambda ctx: ((lambda ps: sum((p ** 2).sum() for p in (ps if isinstance(ps, (list, tuple))
                                                                       else ps.values())))
                            if "params" in ctx["req"] or "theta0" in ctx["req"] else (lambda out: out.pow(2).mean())),
    "model_or_fn": lambda ctx: ctx["model"], "model": lambda ctx: ctx["model"],
    "problem": lambda ctx: __import__("taskloss.harness", fromlist=["Problem"]).Problem(
        ctx["model"], VALID_ARGS["inputs"](), VALID_ARGS["targets"]()),
    "name": lambda ctx: "sgd",
}


def _valid_call_args(req: tuple[str, ...]) -> dict[str, Any]:
    """Valid values of the required arguments ``req``, one model shared by those that refer to it."""
    ctx = {"req": req, "model": _small_model()}
    return {r: JOINT_ARGS[r](ctx) if r in JOINT_ARGS else VALID_ARGS[r]() for r in req}


ARG_POISONS = ("meta tensor", "complex tensor", "empty tensor", "0-d NaN tensor", "non-contiguous NaN tensor",
               "string", "None", "opaque object", "ModelOutput", "list with NaN", "huge size")
# (subpackage, name, argument) → poisons the contract admits there (checked to return)
ARG_ACCEPTS = {
    ("search", "mixture_log_density", "sigma"): {"huge size"},      # a (silly) finite scale has a finite density
    ("attribution", "average_ranks", "x"): {"empty tensor"},                  # a batch of no rows
    ("attribution", "uniform_noise_baseline", "inputs"): {"non-contiguous NaN tensor"},   # its shape only
    ("attribution", "gaussian_noise_baseline", "inputs"): {"non-contiguous NaN tensor"},
    ("contrastive", "gather_with_grad", "x"): {"complex tensor", "empty tensor", "0-d NaN tensor",
                                               "non-contiguous NaN tensor"},  # one process: x itself
    ("dynamics", "ClippedSGD", "lr"): {"huge size"},
    ("lm", "pad_sequences", "pad_id"): {"huge size"},
    ("losses", "non_termination", "eos_id"): {"huge size"},
    ("sampling", "ball_expected_update", "g"): {"empty tensor"},
    ("sampling", "ball_expected_update", "alpha"): {"empty tensor", "huge size"},
    ("sampling", "ball_expected_update", "radius"): {"huge size"},
    ("sampling", "log_ball_volume", "dim"): {"huge size"},
    ("sampling", "log_ball_volume", "radius"): {"huge size"},
    ("search", "gaussian_smoothing_grad", "sigma"): {"huge size"},
    ("search", "spsa_grad", "sigma"): {"huge size"},
    ("attribution", "captum_trapezoid_factor", "n_steps"): {"huge size"},    # a formula of n
    ("attribution", "gaussian_noise_baseline", "std"): {"huge size"},
    ("curvature", "trust_region_step", "max_kl"): {"huge size"},
    ("dynamics", "clip_coefficient", "norm"): {"empty tensor", "huge size"},  # batched over norms
    ("dynamics", "clip_coefficient", "gamma"): {"huge size"},
    ("lm", "task_loss_terms", "eos_id"): {"huge size"},
    ("lm", "task_loss_terms", "pad_id"): {"huge size"},
    ("results", "start", "name"): {"string"},                                # "no" names a notebook
    **{("curvature", n, "params"): {"None"} for n in (                       # None: every trainable parameter
        "empirical_fisher", "empirical_fisher_diagonal", "fisher_matrix", "ggn_diagonal", "ggn_matrix",
        "ggn_operator", "mc_fisher", "mc_fisher_diagonal")},
}


@functools.lru_cache(maxsize=1)
def argument_targets() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """subpackage → [(name, required argument names)] of the callables whose valid call succeeds."""
    out: dict[str, list] = {}
    for (sub, name), obj in sorted(public_callables().items()):
        if (sub, name) in EXEMPT or (sub, name) in OWNED_ELSEWHERE or sub == "utils":
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        req = tuple(p.name for p in sig.parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        if not req or any(r not in VALID_ARGS and r not in JOINT_ARGS for r in req):
            continue
        try:
            with _sandbox():
                obj(**_valid_call_args(req))
        except Exception:  # noqa: BLE001 — no valid call from these values: the entry family walks it
            continue
        out.setdefault(sub, []).append((name, req))
    return out


def _argument_family(sub: str):
    @st.composite
    def family(draw) -> Case:
        name, req = draw(st.sampled_from(argument_targets()[sub]))
        arg = draw(st.sampled_from(req))
        kind = draw(st.sampled_from(ARG_POISONS))
        obj = public_callables()[sub, name]

        def call():
            with _sandbox():
                return obj(**{**_valid_call_args(req), arg: POISONS[kind]()})
        return Case(sub, name, call, kind not in ARG_ACCEPTS.get((sub, name, arg), set()), lambda r: None,
                    f"{kind} for {arg}, the others valid", DOCUMENTED.get((sub, name), ()))
    family.__name__ = f"{sub}_argument_entry"
    family.covers = {(sub, n) for n, _ in argument_targets().get(sub, [])}
    return family


for _sub in sorted(argument_targets()):
    FAMILIES.setdefault(_sub, []).append(_argument_family(_sub))
