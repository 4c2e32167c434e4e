"""Fisher information, generalized Gauss-Newton (GGN): dense, diagonal and matrix-free (GGN-vector products).

Derived in notebooks 06_natural_gradient (Fisher, GGN, trust region) and 07_fisher_approximations (exact / MC /
empirical Fisher, diagonal). Built on these functions: conjugate gradients and Hessian-free in
:mod:`taskloss.curvature.hessian_free`, diagonal-Fisher preconditioning in :mod:`taskloss.curvature.diagonal`,
K-FAC in :mod:`taskloss.curvature.kfac`.

Scale convention (the whole module, and :mod:`taskloss.curvature.kfac`)
------------------------------------------------------------------------
* A model maps inputs ``[N, ...]`` to outputs ``f`` of shape ``[N, C]``: logits for ``likelihood="categorical"``,
  means for ``likelihood="gaussian"`` (the NLL of ``N(f, I)``, i.e. ``½‖y − f‖²`` per example, constants dropped).
  Per-token outputs ``[N, T, C]`` (any ``[N, ..., C]``) make every position a loss term.
* The training loss is the **mean** of the per-term negative log-likelihoods (:func:`nll_loss`) over the terms that
  count: all of them, or those a ``mask`` keeps and whose label is not ``ignore_index``.
* Every curvature matrix is the curvature of that mean loss:
  ``F = (1/n) Σ_i J_iᵀ H_i J_i`` over the ``n`` terms, with ``J_i = ∂f_i/∂θ`` and ``H_i`` the Hessian of the
  term's NLL in ``f_i`` (``diag(p) − ppᵀ`` resp. ``I``). For these likelihoods the exact Fisher equals the GGN.
  The MC Fisher replaces ``H_i`` by ``(1/S) Σ_s ∇ℓ(f_i, ŷ_s)∇ℓᵀ`` with ``ŷ_s ~ p(y | f_i)`` (no label is drawn for
  a masked term); the empirical Fisher uses the observed label: ``(1/n) Σ_i ∇ℓ_i ∇ℓ_iᵀ``.

Libraries that take the curvature of *the loss module you hand them* (curvlinops' ``GGNLinearOperator``,
``EFLinearOperator``, ``KFACLinearOperator``; BackPACK likewise) differ from ours by a factor that depends on the
curvature type, the loss (``CrossEntropyLoss`` or ``MSELoss``, which has no ½), its reduction, ``N`` and ``C``.
:func:`curvature_scale` returns that factor (``theirs = curvature_scale(...) · ours``); it is tested against
curvlinops for the GGN, the empirical Fisher and K-FAC with both losses and both reductions in
``tests/curvature/test_fisher.py``. Check any other library against :func:`ggn_matrix` on a small model first.

Train-mode ``Dropout`` / ``BatchNorm`` make the network random or couple the examples, so the per-example
curvature is undefined; the functions here raise ``ValueError`` on them (call ``model.eval()``). Float16 /
bfloat16 parameters or inputs are refused (``TypeError``: compute curvature in float32), and so are meta tensors.

Parameters are a dict ``name → tensor``; flat vectors concatenate ``params.values()`` flattened, in dict order.
``model_or_fn`` is an ``nn.Module`` (called through ``torch.func.functional_call``; ``params=None`` means all its
parameters that require grad, a tied weight once; other names must be the module's parameters, each tensor once)
or a function ``fn(params_dict, inputs) → outputs``. ``inputs`` is a tensor or a mapping of keyword inputs
(``model(**inputs)``), and a model may return a ``transformers`` ``ModelOutput`` (its ``.logits`` are used): see
:mod:`taskloss.curvature.model_io`, which also says why the transformed calls run attention under its math
kernel. ``mask`` (a bool tensor of the outputs' leading shape) keeps the loss terms that count; by default a
mapping's ``inputs["attention_mask"]`` of that shape does (a causal LM's padding), else every term counts.

Across ``torch.distributed`` ranks (``process_group=``; ``None``: the default group when initialized, else this
process alone): each rank passes its local batch, and the dense and diagonal curvatures are those of the
concatenated batch — each rank's mean over its ``n_r`` terms weighted by ``n_r`` in one all-reduce
(:mod:`taskloss.curvature.distributed`), an uneven last batch and masks included; every rank gets the same bits.
:func:`ggn_operator` all-reduces its term count once and each product once. MC labels are drawn by each rank's own
generator. The parameters must be equal on every rank (as DDP keeps them). Each call is then a collective: every
rank makes it, with at least one loss term of its own.
"""
from __future__ import annotations

import math
from typing import Callable, Literal, Mapping

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp

from taskloss.curvature.distributed import all_reduce_sum, check_process_group, fails_fast, world_size
from taskloss.curvature.model_io import (
    batch_size,
    call_model,
    check_precision,
    default_mask,
    loss_term_mask,
    math_attention,
    model_logits,
    prepare,
)
from taskloss.curvature.per_term import dense_sum, diagonal_sum, jt_factors
from taskloss.parameter_vectors import flatten, unflatten
from taskloss.validation import check_choice, check_finite, check_generator, check_int, check_not_meta

__all__ = [
    "LIKELIHOODS", "check_likelihood", "check_outputs", "check_targets", "nll_loss", "nll_grad", "sample_targets",
    "draw_categorical", "output_hessian_sqrt",
    "ggn_matrix", "fisher_matrix", "mc_fisher", "empirical_fisher", "ggn_diagonal", "mc_fisher_diagonal",
    "empirical_fisher_diagonal", "ggn_vector_product", "ggn_operator", "curvature_scale",
]

Likelihood = Literal["categorical", "gaussian"]
LIKELIHOODS = ("categorical", "gaussian")
IGNORE_INDEX = -100  # the label of a term that does not count (torch.nn.functional.cross_entropy's default)


# ----------------------------------------------------------------------------------------------- likelihoods
def check_likelihood(likelihood: str) -> None:
    """Raise ``ValueError`` unless ``likelihood`` is one of :data:`LIKELIHOODS`."""
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")


def check_outputs(outputs: Tensor, likelihood: str) -> Tensor:
    """``outputs`` after checking it is a finite, non-empty floating ``[N, C]`` tensor (and ``likelihood`` known).

    Args:
        outputs: the model's outputs.
        likelihood: ``"categorical"`` or ``"gaussian"``.

    Returns:
        ``outputs``.

    Raises:
        TypeError: not a floating tensor, or a float16 / bfloat16 one.
        ValueError: a bad shape, an empty batch, NaN/inf, an unknown likelihood, a meta tensor.
    """
    check_likelihood(likelihood)
    if not isinstance(outputs, Tensor) or not outputs.is_floating_point():
        raise TypeError("outputs must be a floating-point torch.Tensor")
    check_not_meta("outputs", outputs)
    check_precision("outputs", outputs)
    if outputs.ndim != 2:
        raise ValueError(f"outputs must have shape [N, C], got {tuple(outputs.shape)}")
    if outputs.shape[0] == 0 or outputs.shape[1] == 0:
        raise ValueError("outputs is empty (batch size 0 or no output dimensions)")
    return check_finite("outputs", outputs)


def check_targets(outputs: Tensor, targets: Tensor, likelihood: str, ignore_index: int | None = None) -> Tensor:
    """``targets`` after checking they fit ``outputs [N, ..., C]``: class ids ``[N, ...]`` in ``[0, C)`` (or equal to
    ``ignore_index``) or finite floats ``[N, ..., C]``.

    Args:
        outputs: the (checked) outputs.
        targets: the observed targets.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        ignore_index: a categorical label marking a term that does not count (``None``: every label is a class).

    Returns:
        ``targets``.

    Raises:
        TypeError: not a tensor.
        ValueError: a bad dtype, shape or value.
    """
    if not isinstance(targets, Tensor):
        raise TypeError("targets must be a torch.Tensor")
    check_not_meta("targets", targets)
    c, lead = outputs.shape[-1], tuple(outputs.shape[:-1])
    if likelihood == "categorical":
        if targets.dtype not in (torch.int64, torch.int32) or tuple(targets.shape) != lead:
            raise ValueError(f"categorical targets must be integer class ids of shape {lead}, "
                             f"got dtype {targets.dtype}, shape {tuple(targets.shape)}")
        bad = (targets < 0) | (targets >= c)
        if ignore_index is not None:
            bad &= targets != ignore_index
        if bool(bad.any()):
            extra = "" if ignore_index is None else f" (or equal ignore_index={ignore_index})"
            raise ValueError(f"categorical targets must lie in [0, {c}){extra}")
    else:
        if tuple(targets.shape) != tuple(outputs.shape) or not targets.is_floating_point():
            raise ValueError(f"gaussian targets must be floats of shape {tuple(outputs.shape)}, got "
                             f"{tuple(targets.shape)}")
        check_finite("targets", targets)
    return targets


def nll_loss(outputs, targets: Tensor, likelihood: Likelihood = "categorical", *,
             ignore_index: int = IGNORE_INDEX) -> Tensor:
    """The module's loss: the mean NLL over the loss terms. ``outputs [N, C]`` or per-token ``[N, T, C]`` (any
    ``[N, ..., C]``; a ``ModelOutput``'s ``.logits``); targets ``[N, ...]`` ids or floats shaped like ``outputs``.

    Categorical: cross-entropy of logits, averaged over the terms whose label is not ``ignore_index``. Gaussian:
    ``½‖y − f‖²`` per term (NLL of ``N(f, I)``, no constant). Computed in float32 for float16 / bfloat16 outputs.

    Args:
        outputs: the model's outputs.
        targets: the observed targets.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        ignore_index: the label of a term that does not count (categorical).

    Returns:
        The scalar loss.

    Raises:
        TypeError: bad types.
        ValueError: bad shapes or values, every label ``ignore_index``.
    """
    outputs = model_logits(outputs, "outputs")
    check_int("ignore_index", ignore_index)
    if isinstance(outputs, Tensor) and outputs.is_floating_point() and outputs.dtype in (torch.float16,
                                                                                          torch.bfloat16):
        outputs = outputs.float()
    if not isinstance(outputs, Tensor) or outputs.ndim < 2:
        raise ValueError("outputs must have shape [N, C] or per-token [N, T, C]")
    check_outputs(outputs.reshape(-1, outputs.shape[-1]), likelihood)
    check_targets(outputs, targets, likelihood, ignore_index if likelihood == "categorical" else None)
    if likelihood == "categorical":
        t = targets.reshape(-1).long()
        if not bool((t != ignore_index).any()):
            raise ValueError(f"every target equals ignore_index={ignore_index}: no loss term is left")
        return nn.functional.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), t, ignore_index=ignore_index)
    return 0.5 * (targets - outputs).pow(2).sum(-1).mean()


def nll_grad(outputs: Tensor, targets: Tensor, likelihood: str, probs: Tensor | None = None) -> Tensor:
    """∂ℓ_n/∂f_n of the per-example NLL: ``softmax(f) − onehot(y)`` or ``f − y`` (checked inputs).

    Args:
        outputs: ``[..., C]`` the model's outputs f.
        targets: class ids or target values y.
        likelihood: ``"categorical"`` or ``"gaussian"``.
        probs: ``softmax(f)`` when the caller already has it (the same numbers, one softmax less).

    Returns:
        The gradient, shaped like ``outputs``.
    """
    if likelihood == "categorical":
        p = outputs.softmax(-1) if probs is None else probs
        return p - nn.functional.one_hot(targets.long(), outputs.shape[-1]).to(outputs.dtype)
    return outputs - targets


def sample_targets(outputs: Tensor, likelihood: Likelihood = "categorical", n_samples: int = 1,
                   generator: torch.Generator | None = None) -> Tensor:
    """Draw labels from the model's predictive distribution ``p(y | f)``.

    Returns ``[n_samples, N]`` class ids (categorical) or ``[n_samples, N, C]`` draws ``f + ε``, ``ε ~ N(0, I)``.
    The generator may live on another device than ``outputs`` (draws are made on the generator's device).

    Raises:
        TypeError: a bad ``outputs`` or ``n_samples``, or a ``generator`` that is not a ``torch.Generator`` (a
            seed is not one: pass ``torch.Generator().manual_seed(seed)``).
        ValueError: bad shapes or values of ``outputs``, ``n_samples < 1``.
    """
    check_generator("generator", generator)
    check_outputs(outputs, likelihood)
    check_int("n_samples", n_samples, minimum=1)
    outputs = outputs.detach()
    if likelihood == "categorical":
        return draw_categorical(outputs.softmax(-1), n_samples, generator)
    gen_device = generator.device if generator is not None else outputs.device
    eps = torch.randn(n_samples, *outputs.shape, generator=generator, device=gen_device, dtype=outputs.dtype)
    return outputs.unsqueeze(0) + eps.to(outputs.device)


def draw_categorical(probs: Tensor, n_samples: int, generator: torch.Generator | None) -> Tensor:
    """Class ids drawn from the rows of ``probs`` by inverting the CDF with uniforms from ``generator``.

    The draws of :func:`sample_targets`, for callers that already hold the probabilities (checked inputs).

    Args:
        probs: ``[N, C]`` probabilities.
        n_samples: draws per row.
        generator: their RNG (``None``: torch's global one).

    Returns:
        ``[n_samples, N]`` class ids.
    """
    n, c = probs.shape
    gen_device = generator.device if generator is not None else probs.device
    u = torch.rand(n_samples, n, 1, generator=generator, device=gen_device, dtype=probs.dtype)
    return (probs.cumsum(-1).unsqueeze(0) < u.to(probs.device)).sum(-1).clamp_(max=c - 1)


def output_hessian_sqrt(outputs: Tensor, likelihood: Likelihood = "categorical") -> Tensor:
    """``L_n [N, C, C]`` with ``L_n L_nᵀ = H_n`` (Hessian of the per-example NLL in ``f_n``).

    Categorical: ``L = diag(√p) − p √pᵀ`` (uses ``Σp = 1``); Gaussian: ``L = I``.
    """
    check_outputs(outputs, likelihood)
    n, c = outputs.shape
    if likelihood == "gaussian":
        return torch.eye(c, dtype=outputs.dtype, device=outputs.device).expand(n, c, c)
    p = outputs.detach().softmax(-1)
    sp = p.sqrt()
    return torch.diag_embed(sp) - p.unsqueeze(-1) * sp.unsqueeze(-2)


def _apply_output_hessian(outputs: Tensor, u: Tensor, likelihood: str) -> Tensor:
    """``H_n u_n`` for every example, without forming ``H`` (``[N, C]``)."""
    if likelihood == "gaussian":
        return u
    p = outputs.softmax(-1)
    return p * u - p * (p * u).sum(-1, keepdim=True)


def curvature_scale(curvature: str, loss: str, reduction: str, n: int, c: int) -> float:
    """The factor ``s`` with ``theirs = s · ours`` between a library's curvature of a PyTorch loss and ours.

    "Ours" is the curvature of the batch-mean NLL (module docstring). "Theirs" is the curvature of
    ``nn.CrossEntropyLoss(reduction=...)`` or ``nn.MSELoss(reduction=...)`` over ``n`` loss terms with ``c``
    outputs each, as curvlinops defines it. For per-token outputs ``[N, T, C]``, ``n = N·T`` (every token is a
    loss term). The factors:

    =====================================================  =======  ======  ========  =======
    curvature                                              CE mean  CE sum  MSE mean  MSE sum
    =====================================================  =======  ======  ========  =======
    GGN type: ``"ggn"`` ``"fisher"`` ``"exact"`` ``"mc"``  1        n       2/c       2n
    ``"empirical"`` (empirical Fisher)                     1        n       4/c       4n
    =====================================================  =======  ======  ========  =======

    The K-FAC of :mod:`taskloss.curvature.kfac` follows the row of its ``fisher_type``.
    Why: ``reduction="sum"`` adds ``n`` terms where we average; ``MSELoss`` is ``(y − f)²`` = 2 × our
    ``½(y − f)²``, which doubles the output Hessian (2) but doubles the gradient, so gradient outer products
    grow 4×; ``MSELoss(reduction="mean")`` also averages over the ``c`` output entries.

    Args:
        curvature: ``"ggn"`` (also ``"fisher"``, ``"exact"``, ``"mc"``) or ``"empirical"``.
        loss: ``"cross_entropy"`` or ``"mse"``.
        reduction: ``"mean"`` or ``"sum"``.
        n: number of loss terms (≥ 1).
        c: output dimension (≥ 1).

    Returns:
        ``s`` as a float.
    """
    kinds = {"ggn": 2.0, "fisher": 2.0, "exact": 2.0, "mc": 2.0, "empirical": 4.0}
    check_choice("curvature", curvature, tuple(kinds))     # an unhashable value is refused, not a TypeError
    check_choice("loss", loss, ("cross_entropy", "mse"))
    check_choice("reduction", reduction, ("mean", "sum"))
    n, c = check_int("n", n, minimum=1), check_int("c", c, minimum=1)
    if loss == "cross_entropy":
        return float(n) if reduction == "sum" else 1.0
    square = kinds[curvature]  # squared error without ½: ×2 on the Hessian, ×4 on gradient outer products
    return square * n if reduction == "sum" else square / c


# ----------------------------------------------------------------------------------------- params & models
def _terms(fn, params, inputs, likelihood, mask):
    """The outputs ``[N, ..., C]`` at ``params``, their rows ``[R, C]`` (one per loss term) and the bool mask of the
    terms that count (``None``: all)."""
    with torch.no_grad(), math_attention():
        out = call_model(fn, params, inputs)
    if out.ndim < 2:
        raise ValueError(f"outputs must have shape [N, C] or per-token [N, T, C], got {tuple(out.shape)}")
    n = batch_size(inputs)
    if out.shape[0] != n:
        raise ValueError(f"model returned {out.shape[0]} outputs for {n} inputs")
    flat = check_outputs(out.reshape(-1, out.shape[-1]), likelihood)
    valid = loss_term_mask(default_mask(mask, inputs, out.shape[:-1]), out.shape[:-1], out.device)
    return out, flat, None if valid is None else valid.reshape(-1)


def _n_terms(flat: Tensor, valid: Tensor | None) -> int:
    return flat.shape[0] if valid is None else int(valid.sum())


def _masked(factors: Tensor, valid: Tensor | None) -> Tensor:
    return factors if valid is None else factors * valid[:, None, None].to(factors.dtype)


def _exact_factors(flat, likelihood, valid):
    return _masked(output_hessian_sqrt(flat, likelihood).transpose(1, 2), valid)


def _mc_factors(flat, likelihood, n_samples, generator, valid):
    rows = flat if valid is None else flat[valid]                                     # no draw for a masked term
    ys = sample_targets(rows, likelihood, n_samples, generator)                       # [S, R] or [S, R, C]
    g = torch.stack([nll_grad(rows, y, likelihood) for y in ys], dim=1)               # [R, S, C]
    g = g / math.sqrt(n_samples)
    if valid is None:
        return g
    full = g.new_zeros(flat.shape[0], *g.shape[1:])
    full[valid] = g
    return full


def _ef_terms(fn, params, inputs, targets, likelihood, mask, ignore_index):
    """``(flat, factors [R, 1, C], valid, lead)`` of the empirical Fisher: the gradient at the observed label of
    every term; terms whose label is ``ignore_index`` (or that ``mask`` drops) do not count."""
    check_int("ignore_index", ignore_index)
    out, flat, valid = _terms(fn, params, inputs, likelihood, mask)
    check_targets(out, targets, likelihood, ignore_index if likelihood == "categorical" else None)
    if likelihood == "categorical":
        t = targets.reshape(-1)
        labelled = t != ignore_index
        valid = labelled if valid is None else valid & labelled
        if not bool(valid.any()):
            raise ValueError(f"no loss term is left: every target equals ignore_index={ignore_index} or is masked")
        if bool(labelled.all()) and mask is None and valid is labelled:
            valid = None
        t = t.masked_fill(~labelled, 0)
    else:
        t = targets.reshape(-1, out.shape[-1])
    return flat, _masked(nll_grad(flat, t, likelihood).unsqueeze(1), valid), valid, out.shape[:-1]


# ------------------------------------------------------------------------------------------ dense & diagonal
def _global_mean(stat: Tensor, n: int, process_group) -> Tensor:
    """``stat`` (a mean over this rank's ``n`` terms) as the mean over every rank's terms: one all-reduce of
    ``[n·stat, n]`` (``stat`` itself in one process)."""
    check_process_group(process_group)
    if world_size(process_group) == 1:
        return stat
    total, count = all_reduce_sum([stat * n, stat.new_tensor([float(n)])], process_group)
    return total.div_(count)



def _term_mean(reduce, fn, params, inputs, factors, lead, flat, valid, process_group) -> Tensor:
    """``reduce`` (``dense_sum`` or ``diagonal_sum``) of the per-term ``Jᵀ`` factors, as a mean over the loss terms
    that count, across ranks when a process group is given."""
    n = _n_terms(flat, valid)
    return _global_mean(reduce(jt_factors(fn, params, inputs, factors, lead, valid), n), n, process_group)


@fails_fast
def ggn_matrix(model_or_fn, params, inputs, likelihood: Likelihood = "categorical", *, mask=None, process_group=None) -> Tensor:
    """Exact GGN = exact Fisher ``(1/n) Σ_i J_iᵀ H_i J_i`` over the loss terms, a dense ``[P, P]`` matrix (small
    models only; ``mask`` keeps the terms that count, see the module docstring)."""
    fn, params = prepare(model_or_fn, params, inputs)
    out, flat, valid = _terms(fn, params, inputs, likelihood, mask)
    factors = _exact_factors(flat, likelihood, valid)
    return _term_mean(dense_sum, fn, params, inputs, factors, out.shape[:-1], flat, valid, process_group)


fisher_matrix = ggn_matrix  # the Fisher of a categorical / unit-variance Gaussian likelihood is the GGN


@fails_fast
def mc_fisher(model_or_fn, params, inputs, likelihood: Likelihood = "categorical", n_samples: int = 1,
              generator: torch.Generator | None = None, *, mask=None, process_group=None) -> Tensor:
    """Monte-Carlo Fisher ``[P, P]``: ``(1/nS) Σ_{i,s} g_{is} g_{is}ᵀ`` with ``g_{is} = ∇_θ ℓ(f_i, ŷ_{is})`` and
    ``ŷ_{is} ~ p(·|f_i)`` over the loss terms that count (``generator``, a ``torch.Generator`` on any device, makes
    the draws reproducible; anything else is a ``TypeError``)."""
    check_generator("generator", generator)
    fn, params = prepare(model_or_fn, params, inputs)
    out, flat, valid = _terms(fn, params, inputs, likelihood, mask)
    factors = _mc_factors(flat, likelihood, n_samples, generator, valid)
    return _term_mean(dense_sum, fn, params, inputs, factors, out.shape[:-1], flat, valid, process_group)


@fails_fast
def empirical_fisher(model_or_fn, params, inputs, targets: Tensor, likelihood: Likelihood = "categorical", *,
                     mask=None, process_group=None, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Empirical Fisher ``[P, P]``: ``(1/n) Σ_i g_i g_iᵀ`` with per-term gradients at the observed labels (terms
    labelled ``ignore_index`` do not count)."""
    fn, params = prepare(model_or_fn, params, inputs)
    flat, factors, valid, lead = _ef_terms(fn, params, inputs, targets, likelihood, mask, ignore_index)
    return _term_mean(dense_sum, fn, params, inputs, factors, lead, flat, valid, process_group)


@fails_fast
def ggn_diagonal(model_or_fn, params, inputs, likelihood: Likelihood = "categorical", *, mask=None, process_group=None) -> Tensor:
    """Exact diagonal of the GGN/Fisher, flat ``[P]`` (C vjps per loss term through ``H_i = L_i L_iᵀ``)."""
    fn, params = prepare(model_or_fn, params, inputs)
    out, flat, valid = _terms(fn, params, inputs, likelihood, mask)
    factors = _exact_factors(flat, likelihood, valid)
    return _term_mean(diagonal_sum, fn, params, inputs, factors, out.shape[:-1], flat, valid, process_group)


@fails_fast
def mc_fisher_diagonal(model_or_fn, params, inputs, likelihood: Likelihood = "categorical",
                       n_samples: int = 1, generator: torch.Generator | None = None, *, mask=None, process_group=None) -> Tensor:
    """Diagonal of :func:`mc_fisher`, flat ``[P]``."""
    check_generator("generator", generator)
    fn, params = prepare(model_or_fn, params, inputs)
    out, flat, valid = _terms(fn, params, inputs, likelihood, mask)
    factors = _mc_factors(flat, likelihood, n_samples, generator, valid)
    return _term_mean(diagonal_sum, fn, params, inputs, factors, out.shape[:-1], flat, valid, process_group)


@fails_fast
def empirical_fisher_diagonal(model_or_fn, params, inputs, targets: Tensor,
                              likelihood: Likelihood = "categorical", *, mask=None, process_group=None,
                              ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Diagonal of :func:`empirical_fisher` (mean of squared per-term gradients), flat ``[P]``."""
    fn, params = prepare(model_or_fn, params, inputs)
    flat, factors, valid, lead = _ef_terms(fn, params, inputs, targets, likelihood, mask, ignore_index)
    return _term_mean(diagonal_sum, fn, params, inputs, factors, lead, flat, valid, process_group)


# ---------------------------------------------------------------------------------------- matrix-free GGN
@fails_fast
def ggn_operator(model_or_fn, params, inputs, likelihood: Likelihood = "categorical", *, mask=None,
                 process_group=None) -> Callable:
    """A matvec ``v ↦ G v`` (flat ``[P]`` or dict) at fixed params: one forward now, then jvp → H → vjp per call.

    The parameters are copied: the operator stays the GGN at the point where it was built even if they move. The
    vector must be finite and match the parameters' names, shapes and dtypes (``ValueError`` / ``TypeError``); a
    model function whose outputs change between calls (train-mode dropout) raises ``ValueError``. ``mask`` keeps
    the loss terms that count (see the module docstring). Across ranks (``process_group``) the GGN is that of the
    concatenated batch: the term counts are all-reduced once here and every product once (every rank must call it
    with the same vector); the operator's ``n_terms`` attribute is ``(this rank's terms, every rank's)``.
    """
    fn, params = prepare(model_or_fn, params, inputs)
    check_likelihood(likelihood)
    check_process_group(process_group)
    world = world_size(process_group)
    params = {k: p.clone() for k, p in params.items()}  # the GGN at this point, even if the parameters move later
    n = batch_size(inputs)

    def f(p):
        return call_model(fn, p, inputs)

    with math_attention():
        out, vjp_fn = vjp(f, params)
    out = out.detach()
    if out.ndim < 2:
        raise ValueError(f"outputs must have shape [N, C] or per-token [N, T, C], got {tuple(out.shape)}")
    check_outputs(out.reshape(-1, out.shape[-1]), likelihood)
    if out.shape[0] != n:
        raise ValueError(f"model returned {out.shape[0]} outputs for {n} inputs")
    valid = loss_term_mask(default_mask(mask, inputs, out.shape[:-1]), out.shape[:-1], out.device)
    local_terms = out.shape[:-1].numel() if valid is None else int(valid.sum())
    n_terms = local_terms
    if world > 1:
        n_terms = int(all_reduce_sum([torch.tensor([local_terms], dtype=torch.float64)], process_group)[0])
    weight = None if valid is None else valid.unsqueeze(-1).to(out.dtype)

    def matvec(v):
        as_dict = isinstance(v, Mapping)
        vd = dict(v) if as_dict else unflatten(v, params)
        if vd.keys() != params.keys() or any(vd[k].shape != params[k].shape for k in params):
            raise ValueError("vector must match the parameters' names and shapes")
        for k, t in vd.items():
            if t.dtype != params[k].dtype:
                raise TypeError(f"vector entry {k!r} has dtype {t.dtype}, the parameter {params[k].dtype}")
            check_finite(f"vector entry {k!r}", t)
        with math_attention():
            out2, jv = jvp(f, (params,), (vd,))
        if not torch.allclose(out2.detach(), out, rtol=1e-4, atol=1e-6):  # a random fn (dropout) would be silent
            raise ValueError("the model function returned different outputs for the same parameters and inputs "
                             "(train-mode Dropout?): the GGN needs a deterministic function; call model.eval()")
        hjv = _apply_output_hessian(out, jv, likelihood)
        (res,) = vjp_fn((hjv if weight is None else hjv * weight) / n_terms)
        if world > 1:        # the ranks' sums over their terms, already divided by the global count: one all-reduce
            res = dict(zip(res, all_reduce_sum(list(res.values()), process_group)))
        return res if as_dict else flatten(res)

    matvec.n_terms = (local_terms, n_terms)
    return matvec


@fails_fast
def ggn_vector_product(model_or_fn, params, inputs, v, likelihood: Likelihood = "categorical", *, mask=None,
                       process_group=None):
    """``G v`` without forming ``G`` (jvp → output Hessian → vjp). ``v`` flat ``[P]`` or dict (finite, same dtype as the
    parameters); returns the same kind; ``mask`` and ``process_group`` as in :func:`ggn_operator`. Derived in notebook
    07_fisher_approximations."""
    return ggn_operator(model_or_fn, params, inputs, likelihood, mask=mask, process_group=process_group)(v)
