"""Benchmark: how far each method's answer moves from its float64 value in float32, bfloat16 and float16.

For every method family a *row* computes one output — a value, a gradient, a step or an attribution — twice on the
same inputs: once in the dtype measured (parameters, activations and data in that dtype, or ``torch.autocast``
where that is how users run it) and once in float64 on the very same numbers (the inputs rounded to the dtype,
then widened). A cell is the relative error ``‖out − ref‖ / ‖ref‖`` and, for vectors, the cosine between the two;
a cell is marked **⚠** when the error could change a verdict: a vector whose direction's cosine to the float64
one is below 0.99, a scalar off by more than 1 %, or a non-finite output. A method that refuses the dtype shows
``refuses`` and its message under the table; one that crashes (an operator without a half kernel) shows ``error``.

Random draws are inputs too: inside a row, ``torch.randn`` and ``Tensor.normal_`` draw in float64 and round to the
dtype asked for (:func:`same_noise`), so MGS, MeZO and the MC estimators see the same noise in every dtype (torch's
CPU generator otherwise fills float64 and float32 tensors from different streams). Categorical draws
(``multinomial``) depend on the probabilities, which differ slightly per dtype: a flipped draw shows up as error.

Models: a small MLP (8 → 16 → 4, tanh) on 32 examples and the tiny GPT-2 of ``tests/hf_models.py`` (2 layers,
width 32, 97 tokens) on 4 × 8 tokens, both built offline from seeds.

Rows are a registry: a function ``fn(env, model) -> Tensor`` decorated with :func:`row`. ``env`` gives the dtype
(``env.dtype``, what inputs are rounded to; ``env.compute``, what the computation runs in), the cast
``env.cast(tensor_or_module)``, the models (``env.model(kind)``) and the autocast context (``env.amp()``). A new
family (the GRPO estimators, Shampoo/SOAP) is one decorated function of a few lines, see :func:`muon_step`.

    python benchmarks/bench_precision.py [--device cpu|cuda] [--quick] [--out FILE] [--only SUBSTRING]

On CUDA the float32 column is measured twice, with TF32 matmuls off and on (``torch.backends.cuda.matmul.
allow_tf32``; the float64 reference is unaffected).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

#: a vector output whose cosine to the float64 one is below this is marked (its direction could change a verdict)
COS_MIN = 0.99
#: a scalar output whose relative error exceeds this is marked
SCALAR_RTOL = 1e-2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: exceptions that mean "refused" (a clear message) — anything else is reported as an error
REFUSALS = (TypeError, ValueError, NotImplementedError)


# ------------------------------------------------------------------------------------------------ the registry
@dataclasses.dataclass
class Row:
    family: str
    method: str
    output: str
    model: str
    fn: Callable
    autocast: bool = False
    note: str = ""


ROWS: list[Row] = []


def row(family: str, method: str, output: str, models=("mlp", "gpt2"), *, autocast: bool = False, note: str = ""):
    """Register ``fn(env, model) -> Tensor`` as one row per model (``models``: ``"mlp"``, ``"gpt2"``, or ``"-"`` for a
    row without a model); ``autocast=True`` adds an autocast row per model (float32 parameters, the half dtype
    inside ``torch.autocast``)."""
    def deco(fn):
        for m in models:
            ROWS.append(Row(family, method, output, m, fn, False, note))
            if autocast:
                ROWS.append(Row(family, method + " (autocast)", output, m, fn, True, note))
        return fn
    return deco


@dataclasses.dataclass
class Env:
    """One computation: inputs rounded to ``dtype``, computed in ``compute`` (``dtype`` itself, or float64 for the
    reference), under autocast to ``amp`` when set (then ``dtype`` is float32)."""
    dtype: torch.dtype
    compute: torch.dtype
    device: torch.device
    amp: torch.dtype | None = None

    def cast(self, x):
        if isinstance(x, nn.Module):
            return x.to(self.dtype).to(self.compute).to(self.device)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(self.dtype).to(self.compute).to(self.device)
        return x.to(self.device) if isinstance(x, torch.Tensor) else x

    def amp_ctx(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def model(self, kind: str) -> nn.Module:
        return self.cast(_master(kind))


_MASTERS: dict[str, nn.Module] = {}


def _master(kind: str) -> nn.Module:
    """The float64 copy of a model (built once; rows receive casts of it)."""
    import copy
    if kind not in _MASTERS:
        if kind == "mlp":
            torch.manual_seed(0)
            _MASTERS[kind] = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).double().eval()
        elif kind == "gpt2":
            from hf_models import tiny_gpt2
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _MASTERS[kind] = tiny_gpt2(attn_implementation="eager").double().eval()
        else:
            raise ValueError(kind)
    return copy.deepcopy(_MASTERS[kind])


def _data(kind: str):
    """The inputs and integer targets of a model: ``(x [32, 8] float64, y [32])``, or for GPT-2 ``(ids [4, 8],
    next [4, 8])`` with ``next[:, t] = ids[:, t + 1]`` and -100 (no loss term) at the last position."""
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return torch.randn(32, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (32,), generator=g)
    from hf_models import token_batch
    ids, _, _ = token_batch(4, 8)
    return ids, torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], dim=1)


def _forward(env: Env, kind: str, model: nn.Module, x):
    """The model's logits on ``x``: ``[N, C]`` (MLP) or ``[B, T, V]`` (GPT-2), under the row's autocast."""
    with env.amp_ctx():
        return model(env.cast(x)) if kind == "mlp" else model(input_ids=x.to(env.device)).logits


def _outputs(env: Env, kind: str, model: nn.Module):
    """``[N, C]`` logits of the loss terms (GPT-2: every position but the last, flattened) and their targets."""
    xs, y = _data(kind)
    out = _forward(env, kind, model, xs)
    if kind == "mlp":
        return out, y.to(env.device)
    return out[:, :-1].reshape(-1, out.shape[-1]), y[:, :-1].reshape(-1).to(env.device)


def _loss(env: Env, kind: str, model: nn.Module) -> torch.Tensor:
    """Mean cross-entropy of the loss terms, in float32 at least (as Hugging Face's losses upcast the logits)."""
    out, y = _outputs(env, kind, model)
    return F.cross_entropy(_wide(out), y)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is float16 / bfloat16 (where a user's loss upcasts), unchanged otherwise (the float64
    reference keeps float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None])


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


@contextlib.contextmanager
def same_noise():
    """``torch.randn`` and ``Tensor.normal_`` draw float64 numbers and round them to the dtype asked for, so that a
    seeded method sees the same noise in every dtype."""
    randn, normal_ = torch.randn, torch.Tensor.normal_

    def randn64(*size, generator=None, dtype=None, device=None, **kw):
        dtype = dtype or torch.get_default_dtype()
        return randn(*size, generator=generator, dtype=torch.float64, device=device, **kw).to(dtype)

    def normal64(self, mean=0.0, std=1.0, *, generator=None):
        if self.dtype == torch.float64:
            return normal_(self, mean, std, generator=generator)
        tmp = torch.empty(self.shape, dtype=torch.float64, device=self.device)
        return self.copy_(normal_(tmp, mean, std, generator=generator))

    torch.randn, torch.Tensor.normal_ = randn64, normal64
    try:
        yield
    finally:
        torch.randn, torch.Tensor.normal_ = randn, normal_


# ---------------------------------------------------------------------------------------------------- the rows
@row("losses", "EMO (emo_loss, emo_mle_ratio)", "gradient", autocast=True,
     note="EMO computes its per-token terms in float32 (issue 28)")
def emo_gradient(env, kind):
    from taskloss.losses import emo_loss
    model = env.model(kind)
    out, y = _outputs(env, kind, model)
    emb = model[2].weight.T.detach() if kind == "mlp" else model.transformer.wte.weight.detach()
    cost = emb if kind != "mlp" else torch.randn(4, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with env.amp_ctx():
        emo_loss(out, y, env.cast(cost) if kind == "mlp" else cost, combine="emo_mle_ratio").backward()
    return _grads(model)


@row("losses", "macro-F1 loss of the argmax", "value", note="integer predictions: the value is exact")
def f1_value(env, kind):
    from taskloss.losses import macro_f1_loss
    out, y = _outputs(env, kind, env.model(kind))
    return macro_f1_loss(out.argmax(-1), y, out.shape[-1]).reshape(1)


@row("dynamics", "clip_grad_ (soft, γ = 0.1)", "clipped gradient", note="norm and coefficient in float32 (issue 28)")
def clip_gradient(env, kind):
    from taskloss.dynamics import clip_grad_
    model = env.model(kind)
    _loss(env, kind, model).backward()
    clip_grad_(list(model.parameters()), 0.1, "soft")
    return _grads(model)


@row("search", "MGS step (8 candidates, SGD lr 1)", "step")
def mgs_step(env, kind):
    from taskloss.search import MGS
    model = env.model(kind)
    xs, y = _data(kind)

    def task(out, batch):
        return F.cross_entropy(_wide(out.reshape(-1, out.shape[-1])), batch[1].reshape(-1))

    def forward(m, batch):
        return m(batch[0]) if kind == "mlp" else m(input_ids=batch[0]).logits

    batch = (env.cast(xs), y.to(env.device))
    mgs = MGS(model, torch.optim.SGD(model.parameters(), lr=1.0), task, n_samples=8, seed=0, parallel=False,
              forward_fn=forward)

    def closure():
        mgs.zero_grad()
        loss = task(forward(model, batch), batch)
        loss.backward()
        return loss, batch

    before = _flat(model)
    with same_noise():
        mgs.step(closure)
    return _flat(model) - before


@row("search", "MeZO step (σ = 1e-3, 4 perturbations)", "step")
def mezo_step(env, kind):
    from taskloss.search import MeZO
    model = env.model(kind)
    opt = MeZO(model.parameters(), lr=1.0, sigma=1e-3, n_samples=4, seed=0)
    before = _flat(model)
    with same_noise():
        opt.step(lambda: _loss(env, kind, model))
    return _flat(model) - before


@row("search", "Gaussian smoothing gradient (σ = 1e-3, 8 antithetic pairs)", "gradient", models=("mlp",))
def smoothing_gradient(env, kind):
    """:func:`taskloss.search.gaussian_smoothing_grad` of the loss over the parameters (central differences)."""
    from taskloss.search import gaussian_smoothing_grad
    from taskloss.parameter_vectors import functional_loss
    model = env.model(kind)
    xs, y = _data(kind)
    f, theta = functional_loss(model, lambda out: F.cross_entropy(_wide(out), y.to(env.device)), env.cast(xs))
    with same_noise():
        g = gaussian_smoothing_grad(f, theta, 1e-3, 8, baseline="antithetic",
                                    generator=torch.Generator(env.device).manual_seed(0))
    return torch.cat([v.reshape(-1).double() for v in g.values()])


@row("search", "REINFORCE (classification_reinforce, 4 draws, LOO)", "gradient", models=("mlp",))
def reinforce_gradient(env, kind):
    """Labels drawn from the policy, reward = accuracy, leave-one-out baseline."""
    from taskloss.search import classification_reinforce
    model = env.model(kind)
    out, y = _outputs(env, kind, model)
    res = classification_reinforce(out, y, n_samples=4, generator=torch.Generator(env.device).manual_seed(0))
    res.loss.backward()
    return _grads(model)


@row("search", "REINFORCE (reinforce_loss, 4 sequences, LOO)", "gradient", models=("gpt2",))
def reinforce_sequences(env, kind):
    """Sequence log-probabilities of 4 fixed continuations, float32 rewards near 1 with a leave-one-out baseline
    (the GRPO family's rows follow this pattern: sequence log-probs in, a policy-gradient loss out)."""
    from taskloss.search import leave_one_out_baseline, reinforce_loss
    model = env.model(kind)
    ids, nxt = _data(kind)
    logp = _wide(_forward(env, kind, model, ids)[:, :-1]).log_softmax(-1)
    seq = logp.gather(-1, nxt[:, :-1, None].to(env.device)).squeeze(-1).sum(-1)
    rewards = torch.tensor([1.0, 0.97, 1.02, 0.99], device=env.device)
    reinforce_loss(seq, rewards, leave_one_out_baseline(rewards)).backward()
    return _grads(model)


@row("search", "Muon (torch.optim.Muon, 2-D weights)", "step",
     note="torch.optim.Muon runs its Newton–Schulz iteration in bfloat16 in every dtype, float64 included")
def muon_step(env, kind):
    model = env.model(kind)
    _loss(env, kind, model).backward()
    mats = [p for n, p in model.named_parameters() if p.ndim == 2 and "wte" not in n and "wpe" not in n]
    before = _flat(model)
    torch.optim.Muon(mats, lr=1.0, weight_decay=0.0).step()
    return _flat(model) - before


def _newton_schulz64(grad, ns_coefficients, ns_steps, eps):
    """The quintic Newton–Schulz orthogonalization of Muon (Jordan et al., *Muon: An optimizer for hidden layers
    in neural networks*, 2024) in float64: ``X ← X/‖X‖_F``, then ``ns_steps`` times ``X ← aX + (bA + cA²)X`` with
    ``A = XXᵀ`` (on the wide orientation), written from the formula as the reference for torch's bfloat16 one."""
    a, b, c = ns_coefficients
    tall = grad.shape[0] > grad.shape[1]
    x = (grad.T if tall else grad).to(torch.float64)
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@row("search", "Muon, against a float64 Newton–Schulz", "step",
     note="the reference runs the Newton–Schulz iteration in float64: the float32 column is torch's bfloat16 "
          "iteration's own error")
def muon_exact_step(env, kind):
    """:func:`muon_step` with the reference's orthogonalization in float64 instead of torch's bfloat16."""
    import torch.optim._muon as muon
    if env.compute != torch.float64:
        return muon_step(env, kind)
    keep = muon._zeropower_via_newtonschulz
    muon._zeropower_via_newtonschulz = _newton_schulz64
    try:
        return muon_step(env, kind)
    finally:
        muon._zeropower_via_newtonschulz = keep


@row("curvature", "K-FAC (empirical, damping 1e-3)", "preconditioned gradient", autocast=True,
     note="K-FAC computes its factors and inverses in float32")
def kfac_gradient(env, kind):
    from taskloss.curvature import KFAC
    model = env.model(kind)
    k = KFAC(model, fisher_type="empirical", damping=1e-3, decay=0.0)
    xs, y = _data(kind)
    out = _forward(env, kind, model, xs)
    k.update_statistics(env.cast(xs), y.to(env.device), outputs=out)
    model.zero_grad()
    F.cross_entropy(_wide(out).reshape(-1, out.shape[-1]), y.to(env.device).reshape(-1)).backward()
    k.precondition_()
    return _grads(model)


@row("curvature", "Fisher diagonal preconditioner (exact GGN diagonal)", "preconditioned gradient", models=("mlp",))
def diagonal_gradient(env, kind):
    """:class:`taskloss.curvature.FisherDiagonalPreconditioner` on the loss gradient."""
    from taskloss.curvature import FisherDiagonalPreconditioner
    model = env.model(kind)
    pre = FisherDiagonalPreconditioner(model, "exact", damping=1e-3)
    pre.update_statistics(env.cast(_data(kind)[0]))
    _loss(env, kind, model).backward()
    pre.precondition_()
    return _grads(model)


@row("curvature", "GGN matrix (ggn_matrix)", "matrix", models=("mlp",))
def ggn(env, kind):
    from taskloss.curvature import ggn_matrix
    model = env.model(kind)
    return ggn_matrix(model, None, env.cast(_data(kind)[0])).reshape(-1)


@row("curvature", "empirical Fisher diagonal", "diagonal")
def ef_diagonal(env, kind):
    from taskloss.curvature import empirical_fisher_diagonal
    model = env.model(kind)
    xs, y = _data(kind)
    if kind == "mlp":
        return empirical_fisher_diagonal(model, None, env.cast(xs), y.to(env.device))
    return empirical_fisher_diagonal(model, None, {"input_ids": xs.to(env.device)}, y.to(env.device))


@row("curvature", "Hessian-free direction (CG, 20 iterations)", "direction", models=("mlp",))
def hf_direction(env, kind):
    from taskloss.curvature import hessian_free_direction
    model = env.model(kind)
    _loss(env, kind, model).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = hessian_free_direction(model, None, env.cast(_data(kind)[0]), _grads(model).to(env.compute),
                                   damping=1e-2, cg_iters=20)
    return d.reshape(-1)


@row("curvature", "natural gradient (dense Fisher solve, λ = 1e-3)", "direction", models=("mlp",),
     note="solved in float32 for half inputs")
def natgrad(env, kind):
    from taskloss.curvature import ggn_matrix, natural_gradient
    model64 = _master(kind)
    fisher = ggn_matrix(model64, None, _data(kind)[0]).detach()          # the system: an input, rounded to the dtype
    model = env.model(kind)
    _loss(env, kind, model).backward()
    return natural_gradient(env.cast(fisher), _grads(model).to(env.compute), 1e-3)


@row("curvature", "Gaussian natural gradient (Bonnet + Price, 64 draws)", "natural gradient", models=("-",))
def gaussian_natgrad(env, kind):
    """:func:`taskloss.curvature.gaussian_natural_gradient` of a quartic under N(m, V) in 4 dimensions."""
    from taskloss.curvature import gaussian_natural_gradient
    g = torch.Generator().manual_seed(0)
    m = env.cast(torch.randn(4, generator=g, dtype=torch.float64))
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    V = env.cast(a @ a.T / 4 + torch.eye(4, dtype=torch.float64))
    with same_noise():
        mean, cov = gaussian_natural_gradient(lambda x: (x ** 4).sum() + x.prod(), m, V, 64,
                                              generator=torch.Generator(env.device).manual_seed(1))
    return torch.cat([mean.mean.reshape(-1), cov.mean.reshape(-1)]).double()


@row("contrastive", "accumulated_backward (InfoNCE, micro-batch 8)", "gradient", autocast=True,
     note="the embedding cache and the loss are float32")
def contrastive_gradient(env, kind):
    from taskloss.contrastive import accumulated_backward, info_nce
    model = env.model(kind)
    xs, _ = _data(kind)
    g = torch.Generator().manual_seed(3)
    if kind == "mlp":
        q, p = env.cast(xs), env.cast(xs + 0.1 * torch.randn(xs.shape, generator=g, dtype=torch.float64))
        enc = model
    else:
        q, p = xs.to(env.device), torch.roll(xs, 1, dims=1).to(env.device)

        def enc(ids):
            return model(input_ids=ids, output_hidden_states=True).hidden_states[-1].mean(1)
    with env.amp_ctx():
        accumulated_backward(enc, [q, p], lambda a, b: info_nce(a, b, temperature=0.05), 8 if kind == "mlp" else 2)
    return _grads(model)


@row("contrastive", "retrieval MRR (512 crowded pairs)", "value", models=("-",),
     note="scores in float32 (issue 45; bfloat16 scores had tied and reordered the candidates)")
def retrieval_mrr(env, kind):
    """MRR of 512 pairs whose embeddings share one large common direction, so that their scores crowd."""
    from taskloss.contrastive import retrieval_metrics
    g = torch.Generator().manual_seed(0)
    common = 5.0 * torch.randn(1, 64, generator=g, dtype=torch.float64)
    z = torch.randn(512, 64, generator=g, dtype=torch.float64)
    q = F.normalize(common + z, dim=-1)
    c = F.normalize(common + z + 2.5 * torch.randn(512, 64, generator=g, dtype=torch.float64), dim=-1)
    with env.amp_ctx():
        return torch.tensor([retrieval_metrics(env.cast(q), env.cast(c))["mrr"]], dtype=torch.float64)


@row("attribution", "integrated gradients (Gauss–Legendre, 16 nodes)", "attribution")
def ig(env, kind):
    from taskloss.attribution import EmbeddingIntegratedGradients, IntegratedGradients
    model = env.model(kind)
    xs, y = _data(kind)
    if kind == "mlp":
        return IntegratedGradients(model).attribute(env.cast(xs[:8]), target=y[:8], n_steps=16).attributions.reshape(-1)
    ig_ = EmbeddingIntegratedGradients(lambda ids: model(input_ids=ids).logits[:, -1], model.transformer.wte)
    return ig_.attribute(xs.to(env.device), target=y[:, -2], n_steps=16).attributions.reshape(-1)


@row("attribution", "integrated gradients (1024 nodes, one node per pass)", "attribution", models=("mlp",),
     note="the gradient integral is summed in float32 for half inputs (issue 45; it was summed in the half dtype)")
def ig_long(env, kind):
    """Many nodes in many chunks: the sum over nodes is where a half-precision accumulator loses the attribution."""
    from taskloss.attribution import IntegratedGradients
    xs, y = _data(kind)
    return IntegratedGradients(env.model(kind)).attribute(env.cast(xs[:8]), target=y[:8], n_steps=1024,
                                                          internal_batch_size=8).attributions.reshape(-1)


# --------------------------------------------------------------------------------------------------- measuring
@dataclasses.dataclass
class Cell:
    text: str
    flagged: bool = False
    message: str = ""


def _run(r: Row, env: Env) -> torch.Tensor:
    out = r.fn(env, r.model)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"row {r.method} returned {type(out).__name__}")
    return out.detach().reshape(-1)


def measure(r: Row, dtype: torch.dtype, device: torch.device, tf32: bool = False) -> Cell:
    """One cell: the row in ``dtype`` (autocast rows: ``dtype`` inside autocast over float32) against float64."""
    amp = dtype if r.autocast and dtype != torch.float32 else None
    env = Env(torch.float32 if amp else dtype, torch.float32 if amp else dtype, device, amp)
    ref_env = Env(env.dtype, torch.float64, device)
    prev = _set_tf32(device, tf32)
    try:
        out = _run(r, env)
    except REFUSALS as e:
        return Cell("refuses", False, f"{type(e).__name__}: {e}")
    except RuntimeError as e:
        return Cell("error", True, f"RuntimeError: {e}")
    finally:
        _set_tf32(device, prev)
    ref = _run(r, ref_env)
    out64 = out.double().to(ref.device)
    if not bool(torch.isfinite(out64).all()):
        return Cell(f"non-finite ({int((~torch.isfinite(out64)).sum())} of {out64.numel()})", True)
    den = float(ref.norm())
    rel = float((out64 - ref).norm()) / den if den > 0 else float((out64 - ref).norm())
    if ref.numel() == 1:
        return Cell(f"{rel:.1e}", rel > SCALAR_RTOL)
    cos = float(out64 @ ref) / (float(out64.norm()) * den) if den > 0 and float(out64.norm()) > 0 else float("nan")
    flagged = not (cos >= COS_MIN)
    cos_text = "—" if math.isnan(cos) else f"{cos:.4f}" if cos < 0.9999 else ">0.9999"
    return Cell(f"{rel:.1e}, cos {cos_text}", flagged)


def _shorten(message: str, limit: int = 240) -> str:
    """The message on one line, at most ``limit`` characters (cut at a word)."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def _set_tf32(device: torch.device, on: bool) -> bool:
    if device.type != "cuda":
        return False
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return prev


def columns(device: torch.device, quick: bool) -> list[tuple[str, torch.dtype, bool]]:
    cols = [("float32", torch.float32, False)]
    if device.type == "cuda":
        cols.append(("float32 + TF32", torch.float32, True))
    cols += [("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False)]
    return cols


def table(rows: list[Row], device: torch.device, quick: bool) -> str:
    """The Markdown table of ``rows`` (one column per dtype of :func:`columns`) and its notes: each row's note
    and each refusal or error message, once per method for all the models and dtypes it applies to."""
    cols = columns(device, quick)
    head = "| family | method | output | model | " + " | ".join(c for c, _, _ in cols) + " |"
    lines = [head, "|" + "---|" * (4 + len(cols))]
    notes: dict[str, dict[str, list[str]]] = {}          # method → note → where it applies
    for r in rows:
        t0 = time.perf_counter()
        cells = [measure(r, dt, device, tf32) for _, dt, tf32 in cols]
        mark = " **⚠**" if any(c.flagged for c in cells) else ""
        texts = [f"**{c.text}**" if c.flagged else c.text for c in cells]
        lines.append(f"| {r.family} | {r.method}{mark} | {r.output} | {r.model} | " + " | ".join(texts) + " |")
        method = notes.setdefault(r.method.removesuffix(" (autocast)"), {})
        where = ("" if r.model == "-" else r.model) + (" autocast" if r.autocast else "")
        if r.note:
            method.setdefault(r.note, []).append(where)
        for (name, dt, _), c in zip(cols, cells):
            if c.message:
                method.setdefault(_shorten(c.message.replace(str(dt), "<dtype>")), []).append(f"{where} {name}".strip())
        print(f"  {r.method} / {r.model}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    out = "\n".join(lines)
    items = [f"- **{m}**: " + "; ".join(text + (f" ({', '.join(dict.fromkeys(w))})" if any(w) else "")
                                        for text, w in v.items()) for m, v in notes.items() if v]
    if items:
        out += "\n\nNotes (refusals and errors quote the method's message; where each applies in parentheses):\n\n"
        out += "\n".join(items)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--quick", action="store_true", help="the MLP rows only")
    ap.add_argument("--out", type=Path, help="also write the Markdown table to this file")
    ap.add_argument("--only", default=None, help="rows whose family or method contains this substring")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_precision: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    rows = [r for r in ROWS if (not args.quick or r.model != "gpt2") and
            (args.only is None or args.only in r.family or args.only in r.method)]
    t0 = time.perf_counter()
    body = table(rows, device, args.quick)
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    text = (f"### Precision: relative error against float64 on the same inputs ({device.type}: {dev}; torch "
            f"{torch.__version__}{'; --quick' if args.quick else ''})\n\n"
            f"Cells: ‖out − ref‖/‖ref‖ and, for vectors, the cosine to the float64 output; **⚠** marks a cosine "
            f"< {COS_MIN}, a scalar off by > {SCALAR_RTOL:.0%}, a non-finite output or a crash. "
            f"`python benchmarks/bench_precision.py --device {device.type}{' --quick' if args.quick else ''}`, "
            f"{time.perf_counter() - t0:.0f} s.\n\n" + body + "\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
