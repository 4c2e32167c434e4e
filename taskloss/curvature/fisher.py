"""Fisher information, generalized Gauss-Newton (GGN): dense, diagonal and matrix-free (GGN-vector products).

Derived in notebooks 06_natural_gradient (Fisher, GGN, trust region) and 07_fisher_approximations (exact / MC /
empirical Fisher, diagonal). Built on these functions: conjugate gradients and Hessian-free in
:mod:`taskloss.curvature.hessian_free`, diagonal-Fisher preconditioning in :mod:`taskloss.curvature.diagonal`,
K-FAC in :mod:`taskloss.curvature.kfac`.

Scale convention (the whole module, and :mod:`taskloss.curvature.kfac`)
------------------------------------------------------------------------
* A model maps inputs ``[N, ...]`` to outputs ``f`` of shape ``[N, C]``: logits for ``likelihood="categorical"``,
  means for ``likelihood="gaussian"`` (the NLL of ``N(f, I)``, i.e. ``½‖y − f‖²`` per example, constants dropped).
* The training loss is the batch **mean** of per-example negative log-likelihoods (:func:`nll_loss`).
* Every curvature matrix is the curvature of that mean loss:
  ``F = (1/N) Σ_n J_nᵀ H_n J_n`` with ``J_n = ∂f_n/∂θ`` and ``H_n`` the Hessian of the per-example NLL in ``f_n``
  (``diag(p) − ppᵀ`` resp. ``I``). For these likelihoods the exact Fisher equals the GGN.
  The MC Fisher replaces ``H_n`` by ``(1/S) Σ_s ∇ℓ(f_n, ŷ_s)∇ℓᵀ`` with ``ŷ_s ~ p(y | f_n)``; the empirical Fisher
  uses the observed label: ``(1/N) Σ_n ∇ℓ_n ∇ℓ_nᵀ``.

Libraries that take the curvature of *the loss module you hand them* (curvlinops' ``GGNLinearOperator``,
``EFLinearOperator``, ``KFACLinearOperator``; BackPACK likewise) differ from ours by a factor that depends on the
curvature type, the loss (``CrossEntropyLoss`` or ``MSELoss``, which has no ½), its reduction, ``N`` and ``C``.
:func:`curvature_scale` returns that factor (``theirs = curvature_scale(...) · ours``); it is tested against
curvlinops for the GGN, the empirical Fisher and K-FAC with both losses and both reductions in
``tests/curvature/test_fisher.py``. Check any other library against :func:`ggn_matrix` on a small model first.

Train-mode ``Dropout`` / ``BatchNorm`` make the network random or couple the examples, so the per-example
curvature is undefined; the functions here raise ``ValueError`` on them (call ``model.eval()``).

Parameters are a dict ``name → tensor``; flat vectors concatenate ``params.values()`` flattened, in dict order.
``model_or_fn`` is an ``nn.Module`` (called through ``torch.func.functional_call``; ``params=None`` means all its
parameters that require grad) or a function ``fn(params_dict, inputs) → outputs``.
"""
from __future__ import annotations

import math
from typing import Callable, Literal, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vjp, vmap

from taskloss.utils import check_finite, check_int, flatten, unflatten

__all__ = [
    "LIKELIHOODS", "check_likelihood", "check_outputs", "check_targets", "nll_loss", "nll_grad", "sample_targets",
    "draw_categorical", "output_hessian_sqrt",
    "ggn_matrix", "fisher_matrix", "mc_fisher", "empirical_fisher", "ggn_diagonal", "mc_fisher_diagonal",
    "empirical_fisher_diagonal", "ggn_vector_product", "ggn_operator", "curvature_scale",
]

Likelihood = Literal["categorical", "gaussian"]
LIKELIHOODS = ("categorical", "gaussian")
_CHUNK_ELEMENTS = 2**24  # bound on N_chunk · K · P floats held by the per-example factor computation


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
        TypeError: not a floating tensor.
        ValueError: a bad shape, an empty batch, NaN/inf, an unknown likelihood.
    """
    check_likelihood(likelihood)
    if not isinstance(outputs, Tensor) or not outputs.is_floating_point():
        raise TypeError("outputs must be a floating-point torch.Tensor")
    if outputs.ndim != 2:
        raise ValueError(f"outputs must have shape [N, C], got {tuple(outputs.shape)}")
    if outputs.shape[0] == 0 or outputs.shape[1] == 0:
        raise ValueError("outputs is empty (batch size 0 or no output dimensions)")
    return check_finite("outputs", outputs)


def check_targets(outputs: Tensor, targets: Tensor, likelihood: str) -> Tensor:
    """``targets`` after checking they fit ``outputs [N, C]``: class ids ``[N]`` in ``[0, C)`` or finite ``[N, C]``.

    Args:
        outputs: the (checked) outputs.
        targets: the observed targets.
        likelihood: ``"categorical"`` or ``"gaussian"``.

    Returns:
        ``targets``.

    Raises:
        TypeError: not a tensor.
        ValueError: a bad dtype, shape or value.
    """
    if not isinstance(targets, Tensor):
        raise TypeError("targets must be a torch.Tensor")
    n, c = outputs.shape
    if likelihood == "categorical":
        if targets.dtype not in (torch.int64, torch.int32) or targets.shape != (n,):
            raise ValueError(f"categorical targets must be integer class ids of shape ({n},), "
                             f"got dtype {targets.dtype}, shape {tuple(targets.shape)}")
        if bool((targets < 0).any()) or bool((targets >= c).any()):
            raise ValueError(f"categorical targets must lie in [0, {c})")
    else:
        if targets.shape != (n, c) or not targets.is_floating_point():
            raise ValueError(f"gaussian targets must be floats of shape ({n}, {c}), got {tuple(targets.shape)}")
        check_finite("targets", targets)
    return targets


def nll_loss(outputs: Tensor, targets: Tensor, likelihood: Likelihood = "categorical") -> Tensor:
    """The module's loss: batch mean of per-example NLL. ``outputs [N, C]``; targets ``[N]`` ids or ``[N, C]``.

    Categorical: cross-entropy of logits. Gaussian: ``½‖y − f‖²`` per example (NLL of ``N(f, I)``, no constant).
    """
    check_outputs(outputs, likelihood)
    check_targets(outputs, targets, likelihood)
    if likelihood == "categorical":
        return nn.functional.cross_entropy(outputs, targets.long())
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
    """
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
    if curvature not in kinds:
        raise ValueError(f"curvature must be one of {tuple(kinds)}, got {curvature!r}")
    if loss not in ("cross_entropy", "mse"):
        raise ValueError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    n, c = check_int("n", n, minimum=1), check_int("c", c, minimum=1)
    if loss == "cross_entropy":
        return float(n) if reduction == "sum" else 1.0
    square = kinds[curvature]  # squared error without ½: ×2 on the Hessian, ×4 on gradient outer products
    return square * n if reduction == "sum" else square / c


# ----------------------------------------------------------------------------------------- params & models
_RANDOM_OR_COUPLED = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _check_eval_mode(module: nn.Module) -> None:
    """Raise ``ValueError`` if ``module`` holds a train-mode Dropout or BatchNorm (random / batch-coupled outputs)."""
    for name, m in module.named_modules():
        if isinstance(m, _RANDOM_OR_COUPLED) and m.training and not (
                isinstance(m, nn.modules.dropout._DropoutNd) and m.p == 0):
            raise ValueError(f"module {name or type(module).__name__!r} ({type(m).__name__}) is in training mode: "
                             "its outputs are random or couple the examples, so the per-example curvature is "
                             "undefined; call model.eval() before computing curvature (train mode again afterwards)")


def _prepare(model_or_fn, params, inputs: Tensor):
    """Return ``(fn(params, inputs), params_dict_detached)`` after validating everything."""
    if isinstance(model_or_fn, nn.Module):
        module = model_or_fn
        _check_eval_mode(module)
        if params is None:
            params = {k: p for k, p in module.named_parameters() if p.requires_grad}

        def fn(p, x):
            return functional_call(module, p, (x,))
    elif callable(model_or_fn):
        fn = model_or_fn
        if params is None:
            raise ValueError("params must be given (a dict name → tensor) when model_or_fn is a function")
    else:
        raise TypeError("model_or_fn must be an nn.Module or a callable fn(params, inputs)")
    if not isinstance(params, Mapping) or len(params) == 0:
        raise ValueError("params must be a non-empty dict name → tensor")
    for k, p in params.items():
        if not isinstance(p, Tensor) or not p.is_floating_point():
            raise TypeError(f"parameter {k!r} must be a floating-point tensor")
        check_finite(f"parameter {k!r}", p)
    if not isinstance(inputs, Tensor):
        raise TypeError("inputs must be a torch.Tensor")
    if inputs.ndim == 0 or inputs.shape[0] == 0:
        raise ValueError("inputs is empty (batch size 0)")
    check_finite("inputs", inputs)
    return fn, {k: p.detach() for k, p in params.items()}


def _call_model(fn, params, inputs):
    try:
        return fn(params, inputs)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise ValueError(f"model raised on inputs of shape {tuple(inputs.shape)} and dtype {inputs.dtype} "
                         f"(do they match the model and its parameters?): {e}") from e


def _forward(fn, params, inputs, likelihood) -> Tensor:
    with torch.no_grad():
        out = _call_model(fn, params, inputs)
    check_outputs(out, likelihood)
    if out.shape[0] != inputs.shape[0]:
        raise ValueError(f"model returned {out.shape[0]} outputs for {inputs.shape[0]} inputs")
    return out


def _jt_factors(fn, params, inputs: Tensor, factors: Tensor) -> Tensor:
    """``B[n, k] = J_nᵀ V[n, k]`` for ``factors V [N, K, C]``, flattened to ``[N, K, P]`` (vmapped vjp)."""

    def one(x, v):
        _, vjp_fn = vjp(lambda p: fn(p, x.unsqueeze(0)).squeeze(0), params)
        if v.shape[0] == 1:
            return flatten(vjp_fn(v[0])[0]).unsqueeze(0)
        return torch.cat([t.reshape(v.shape[0], -1) for t in vmap(vjp_fn)(v)[0].values()], dim=1)

    n, k, _ = factors.shape
    p_dim = sum(p.numel() for p in params.values())
    chunk = max(1, _CHUNK_ELEMENTS // max(1, k * p_dim))
    try:
        return [vmap(one)(inputs[i:i + chunk], factors[i:i + chunk]) for i in range(0, n, chunk)]
    except RuntimeError as e:
        if "random" in str(e) or "batch_norm" in str(e).lower() or "in-place" in str(e):
            raise ValueError("the model function draws random numbers or updates state in place (train-mode "
                             "Dropout / BatchNorm?): per-example curvature needs a deterministic function of "
                             f"(params, one input); call model.eval() first. Original error: {e}") from e
        raise


def _dense(chunks, n) -> Tensor:
    return sum(torch.einsum("nkp,nkq->pq", b, b) for b in chunks) / n


def _diag(chunks, n) -> Tensor:
    return sum(b.pow(2).sum((0, 1)) for b in chunks) / n


def _exact_factors(fn, params, inputs, likelihood):
    return output_hessian_sqrt(_forward(fn, params, inputs, likelihood), likelihood).transpose(1, 2)


def _mc_factors(fn, params, inputs, likelihood, n_samples, generator):
    out = _forward(fn, params, inputs, likelihood)
    ys = sample_targets(out, likelihood, n_samples, generator)                       # [S, N] or [S, N, C]
    g = torch.stack([nll_grad(out, y, likelihood) for y in ys], dim=1)               # [N, S, C]
    return g / math.sqrt(n_samples)


def _ef_factors(fn, params, inputs, targets, likelihood):
    out = _forward(fn, params, inputs, likelihood)
    check_targets(out, targets, likelihood)
    if targets.shape[0] != inputs.shape[0]:
        raise ValueError("inputs and targets have different batch sizes")
    return nll_grad(out, targets, likelihood).unsqueeze(1)


# ------------------------------------------------------------------------------------------ dense & diagonal
def ggn_matrix(model_or_fn, params, inputs: Tensor, likelihood: Likelihood = "categorical") -> Tensor:
    """Exact GGN = exact Fisher ``(1/N) Σ J_nᵀ H_n J_n`` as a dense ``[P, P]`` matrix (small models only)."""
    fn, params = _prepare(model_or_fn, params, inputs)
    return _dense(_jt_factors(fn, params, inputs, _exact_factors(fn, params, inputs, likelihood)), len(inputs))


fisher_matrix = ggn_matrix  # the Fisher of a categorical / unit-variance Gaussian likelihood is the GGN


def mc_fisher(model_or_fn, params, inputs: Tensor, likelihood: Likelihood = "categorical", n_samples: int = 1,
              generator: torch.Generator | None = None) -> Tensor:
    """Monte-Carlo Fisher ``[P, P]``: ``(1/NS) Σ_{n,s} g_{ns} g_{ns}ᵀ`` with ``g_{ns} = ∇_θ ℓ(f_n, ŷ_{ns})`` and
    ``ŷ_{ns} ~ p(·|f_n)`` (``generator`` makes the draws reproducible)."""
    fn, params = _prepare(model_or_fn, params, inputs)
    factors = _mc_factors(fn, params, inputs, likelihood, n_samples, generator)
    return _dense(_jt_factors(fn, params, inputs, factors), len(inputs))


def empirical_fisher(model_or_fn, params, inputs: Tensor, targets: Tensor,
                     likelihood: Likelihood = "categorical") -> Tensor:
    """Empirical Fisher ``[P, P]``: ``(1/N) Σ_n g_n g_nᵀ`` with per-example gradients at the observed labels."""
    fn, params = _prepare(model_or_fn, params, inputs)
    factors = _ef_factors(fn, params, inputs, targets, likelihood)
    return _dense(_jt_factors(fn, params, inputs, factors), len(inputs))


def ggn_diagonal(model_or_fn, params, inputs: Tensor, likelihood: Likelihood = "categorical") -> Tensor:
    """Exact diagonal of the GGN/Fisher, flat ``[P]`` (C vjps per example through ``H_n = L_n L_nᵀ``)."""
    fn, params = _prepare(model_or_fn, params, inputs)
    return _diag(_jt_factors(fn, params, inputs, _exact_factors(fn, params, inputs, likelihood)), len(inputs))


def mc_fisher_diagonal(model_or_fn, params, inputs: Tensor, likelihood: Likelihood = "categorical",
                       n_samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
    """Diagonal of :func:`mc_fisher`, flat ``[P]``."""
    fn, params = _prepare(model_or_fn, params, inputs)
    factors = _mc_factors(fn, params, inputs, likelihood, n_samples, generator)
    return _diag(_jt_factors(fn, params, inputs, factors), len(inputs))


def empirical_fisher_diagonal(model_or_fn, params, inputs: Tensor, targets: Tensor,
                              likelihood: Likelihood = "categorical") -> Tensor:
    """Diagonal of :func:`empirical_fisher` (mean of squared per-example gradients), flat ``[P]``."""
    fn, params = _prepare(model_or_fn, params, inputs)
    factors = _ef_factors(fn, params, inputs, targets, likelihood)
    return _diag(_jt_factors(fn, params, inputs, factors), len(inputs))


# ---------------------------------------------------------------------------------------- matrix-free GGN
def ggn_operator(model_or_fn, params, inputs: Tensor, likelihood: Likelihood = "categorical") -> Callable:
    """A matvec ``v ↦ G v`` (flat ``[P]`` or dict) at fixed params: one forward now, then jvp → H → vjp per call.

    The parameters are copied: the operator stays the GGN at the point where it was built even if they move. The
    vector must be finite and match the parameters' names, shapes and dtypes (``ValueError`` / ``TypeError``); a
    model function whose outputs change between calls (train-mode dropout) raises ``ValueError``.
    """
    fn, params = _prepare(model_or_fn, params, inputs)
    check_likelihood(likelihood)
    params = {k: p.clone() for k, p in params.items()}  # the GGN at this point, even if the parameters move later
    n = inputs.shape[0]

    def f(p):
        return _call_model(fn, p, inputs)

    out, vjp_fn = vjp(f, params)
    out = check_outputs(out.detach(), likelihood)
    if out.shape[0] != n:
        raise ValueError(f"model returned {out.shape[0]} outputs for {n} inputs")

    def matvec(v):
        as_dict = isinstance(v, Mapping)
        vd = dict(v) if as_dict else unflatten(v, params)
        if vd.keys() != params.keys() or any(vd[k].shape != params[k].shape for k in params):
            raise ValueError("vector must match the parameters' names and shapes")
        for k, t in vd.items():
            if t.dtype != params[k].dtype:
                raise TypeError(f"vector entry {k!r} has dtype {t.dtype}, the parameter {params[k].dtype}")
            check_finite(f"vector entry {k!r}", t)
        out2, jv = jvp(f, (params,), (vd,))
        if not torch.allclose(out2.detach(), out, rtol=1e-4, atol=1e-6):  # a random fn (dropout) would be silent
            raise ValueError("the model function returned different outputs for the same parameters and inputs "
                             "(train-mode Dropout?): the GGN needs a deterministic function; call model.eval()")
        (res,) = vjp_fn(_apply_output_hessian(out, jv, likelihood) / n)
        return res if as_dict else flatten(res)

    return matvec


def ggn_vector_product(model_or_fn, params, inputs: Tensor, v, likelihood: Likelihood = "categorical"):
    """``G v`` without forming ``G`` (jvp → output Hessian → vjp). ``v`` flat ``[P]`` or dict (finite, same dtype as the
    parameters); returns the same kind. Derived in notebook 07_fisher_approximations."""
    return ggn_operator(model_or_fn, params, inputs, likelihood)(v)
