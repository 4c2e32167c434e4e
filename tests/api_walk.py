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

import functools
import json
import math
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
    from taskloss.utils import flatten, unflatten, unique_tensors
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


FAMILIES = {
    "losses": [losses_macro_f1, losses_edit_distance], "sampling": [sampling_newton, sampling_weights],
    "contrastive": [contrastive_accumulation], "dynamics": [dynamics_clip, dynamics_shared],
    "search": [search_zeroth_order, search_mezo], "gradflow": [gradflow_init_recurrent],
    "lm": [lm_block_nll], "models": [models_mlp],
    "results": [results_record, results_paired_comparison], "datasets": [datasets_split], "utils": [utils_parameters],
    "curvature": [curvature_generators, curvature_dtypes, curvature_cg],
    "attribution": [attribution_quadrature, attribution_ig, attribution_baselines],
}
PENDING: dict = {}          # rooms whose validators are still to come (walk_counts.py counts them as well)
