"""Bad input across the public API of taskloss.curvature: every name in its ``__all__`` is walked with NaN,
empty, wrong-shape, wrong-dtype and out-of-range inputs, and each call must raise a clear exception (type and
message). ``test_every_public_name_is_walked`` fails when a new public name has no bad-input case."""
import pytest
import torch
from torch import nn

import taskloss.curvature as C
from taskloss.parameter_vectors import flatten

D = torch.float64
NAN = float("nan")


def _m():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


M = _m()
X = torch.randn(7, 4, dtype=D, generator=torch.Generator().manual_seed(1))
Y = torch.randn(7, 3, dtype=D, generator=torch.Generator().manual_seed(2))
y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
P = sum(p.numel() for p in M.parameters())
PARAMS = {k: p.detach() for k, p in M.named_parameters()}
LOGITS = torch.randn(4, 3, dtype=D)
EYE2, V2 = torch.eye(2, dtype=D), torch.ones(2, dtype=D)
nanlike = lambda t: torch.full_like(t, NAN)  # noqa: E731


def _with_nan_grad(model):
    model.zero_grad()
    C.nll_loss(model(X), y).backward()
    next(model.parameters()).grad[0, 0] = NAN
    return model


def _kfac_ready(**kw):
    net = _m()
    k = C.KFAC(net, fisher_type="empirical", **kw)
    k.update_statistics(outputs=net(X), targets=y)
    return net, k


def _kfac_step_nan_grad():
    net, k = _kfac_ready()
    _with_nan_grad(net)
    k.precondition_()


def _kfac_update(outputs_fn, targets):
    net = _m()
    k = C.KFAC(net, fisher_type="empirical")
    k.update_statistics(outputs=outputs_fn(net), targets=targets)


def _diag_step(change):
    net = _m()
    pre = C.FisherDiagonalPreconditioner(net, "exact")
    pre.update_statistics(X)
    change(net, pre)
    pre.precondition_()


def _ngd(fisher, grad=None, **kw):
    p = nn.Parameter(torch.zeros(2, dtype=D))
    p.grad = V2.clone() if grad is None else grad
    C.NaturalGradientDescent([p], fisher=fisher, **kw).step()


def _hf_step(closure_value, inputs=X, **kw):
    net = _m()
    opt = C.HessianFree(net.parameters(), net, **kw)
    opt.step(lambda: (closure_value, inputs))


def _vi(**kw):
    args = dict(log_lik=lambda z: -(z ** 2).sum(), prior_mean=torch.zeros(2, dtype=D), prior_precision=EYE2)
    args.update(kw)
    return C.NaturalGaussianVI(**args)


_NEG = -EYE2  # λ₂ of N(0, ½ I)


def _nan_grad_f(z):
    """A finite value (0) whose derivatives are NaN: the masked branch of ``where`` still back-propagates NaN."""
    return torch.where(z > 100, torch.sqrt(z - 100), torch.zeros_like(z)).sum()

# (public name, case id, call, exception type, message regex)
CASES = [
    # ------------------------------------------------------------------------------------------ likelihoods
    ("nll_loss", "nan", lambda: C.nll_loss(nanlike(LOGITS), y[:4]), ValueError, "outputs contains NaN"),
    ("nll_loss", "empty", lambda: C.nll_loss(LOGITS[:0], y[:0]), ValueError, "outputs is empty"),
    ("nll_loss", "shape", lambda: C.nll_loss(LOGITS[None], y[:4]), ValueError, r"shape \(1, 4\)"),
    ("nll_loss", "1-d", lambda: C.nll_loss(LOGITS[0], y[:1]), ValueError, r"shape \[N, C\]"),
    ("nll_loss", "dtype", lambda: C.nll_loss(LOGITS.long(), y[:4]), TypeError, "floating-point"),
    ("nll_loss", "range", lambda: C.nll_loss(LOGITS, torch.tensor([0, 1, 3, 0])), ValueError, r"lie in \[0, 3\)"),
    ("nll_loss", "target dtype", lambda: C.nll_loss(LOGITS, y[:4].double()), ValueError, "integer class ids"),
    ("nll_loss", "target nan", lambda: C.nll_loss(LOGITS, nanlike(LOGITS), "gaussian"), ValueError,
     "targets contains NaN"),
    ("nll_loss", "likelihood", lambda: C.nll_loss(LOGITS, y[:4], "poisson"), ValueError, "likelihood must be"),
    ("sample_targets", "nan", lambda: C.sample_targets(nanlike(LOGITS)), ValueError, "NaN"),
    ("sample_targets", "empty", lambda: C.sample_targets(LOGITS[:, :0]), ValueError, "empty"),
    ("sample_targets", "range", lambda: C.sample_targets(LOGITS, n_samples=0), ValueError, "n_samples must be >= 1"),
    ("sample_targets", "dtype", lambda: C.sample_targets(LOGITS, n_samples=2.0), TypeError, "n_samples must be an int"),
    ("sample_targets", "shape", lambda: C.sample_targets(LOGITS[0]), ValueError, r"shape \[N, C\]"),
    ("output_hessian_sqrt", "nan", lambda: C.output_hessian_sqrt(nanlike(LOGITS)), ValueError, "NaN"),
    ("output_hessian_sqrt", "shape", lambda: C.output_hessian_sqrt(LOGITS[0]), ValueError, r"shape \[N, C\]"),
    ("output_hessian_sqrt", "dtype", lambda: C.output_hessian_sqrt(y[:4, None]), TypeError, "floating-point"),
    ("curvature_scale", "range", lambda: C.curvature_scale("ggn", "mse", "sum", 0, 3), ValueError, "n must be >= 1"),
    ("curvature_scale", "dtype", lambda: C.curvature_scale("ggn", "mse", "sum", 3, 2.5), TypeError, "c must be an int"),
    ("curvature_scale", "value", lambda: C.curvature_scale("kfac", "mse", "sum", 3, 2), ValueError,
     "curvature must be one of"),
    # ------------------------------------------------------------------------------------ params & models
    # ---------------------------------------------------------------------------------- dense & diagonal
    *[(name, case, call, exc, msg) for name in ("ggn_matrix", "fisher_matrix", "ggn_diagonal")
      for case, call, exc, msg in [
          ("nan", lambda name=name: getattr(C, name)(M, None, nanlike(X)), ValueError, "inputs contains NaN"),
          ("empty", lambda name=name: getattr(C, name)(M, None, X[:0]), ValueError, r"empty \(batch size 0\)"),
          ("shape", lambda name=name: getattr(C, name)(M, None, X[:, :3]), ValueError,
           r"model raised on inputs of shape \(7, 3\)"),
          ("dtype", lambda name=name: getattr(C, name)(M, None, X.float()), ValueError,
           "model raised on inputs .* dtype torch.float32"),
          ("nan params", lambda name=name: getattr(C, name)(M, {"0.weight": nanlike(PARAMS["0.weight"])}, X),
           ValueError, "parameter '0.weight' contains NaN"),
          ("likelihood", lambda name=name: getattr(C, name)(M, None, X, "poisson"), ValueError,
           "likelihood must be one of")]],
    *[(name, case, call, exc, msg) for name in ("mc_fisher", "mc_fisher_diagonal")
      for case, call, exc, msg in [
          ("nan", lambda name=name: getattr(C, name)(M, None, nanlike(X)), ValueError, "inputs contains NaN"),
          ("empty", lambda name=name: getattr(C, name)(M, None, X[:0]), ValueError, "empty"),
          ("range", lambda name=name: getattr(C, name)(M, None, X, n_samples=0), ValueError, "n_samples"),
          ("shape", lambda name=name: getattr(C, name)(M, None, X[:, :2]), ValueError, "model raised on inputs")]],
    *[(name, case, call, exc, msg) for name in ("empirical_fisher", "empirical_fisher_diagonal")
      for case, call, exc, msg in [
          ("nan", lambda name=name: getattr(C, name)(M, None, X, nanlike(Y), "gaussian"), ValueError,
           "targets contains NaN"),
          ("empty", lambda name=name: getattr(C, name)(M, None, X[:0], y[:0]), ValueError, "empty"),
          ("range", lambda name=name: getattr(C, name)(M, None, X, y + 1), ValueError, r"lie in \[0, 3\)"),
          ("shape", lambda name=name: getattr(C, name)(M, None, X, y[:3]), ValueError, r"shape \(7,\)"),
          ("dtype", lambda name=name: getattr(C, name)(M, None, X, y.double()), ValueError, "integer class ids")]],
    # ------------------------------------------------------------------------------------- matrix-free GGN
    ("ggn_vector_product", "nan", lambda: C.ggn_vector_product(M, None, X, torch.full((P,), NAN, dtype=D)),
     ValueError, "vector entry '0.weight' contains NaN"),
    ("ggn_vector_product", "inf", lambda: C.ggn_vector_product(M, None, X, torch.full((P,), float("inf"), dtype=D)),
     ValueError, "contains NaN or inf"),
    ("ggn_vector_product", "shape", lambda: C.ggn_vector_product(M, None, X, torch.ones(P - 1, dtype=D)),
     ValueError, "flat vector must have shape"),
    ("ggn_vector_product", "dtype", lambda: C.ggn_vector_product(M, None, X, torch.ones(P)), TypeError,
     "dtype torch.float32"),
    ("ggn_vector_product", "empty", lambda: C.ggn_vector_product(M, None, X[:0], torch.ones(P, dtype=D)),
     ValueError, "empty"),
    ("ggn_operator", "keys", lambda: C.ggn_operator(M, None, X)({"w": torch.ones(3, dtype=D)}), ValueError,
     "names and shapes"),
    ("ggn_operator", "nan", lambda: C.ggn_operator(M, None, nanlike(X)), ValueError, "inputs contains NaN"),
    ("ggn_operator", "likelihood", lambda: C.ggn_operator(M, None, X, "bernoulli"), ValueError, "likelihood"),
    # ------------------------------------------------------------------------------- CG and Hessian-free
    ("conjugate_gradient", "nan", lambda: C.conjugate_gradient(lambda v: v, torch.tensor([1.0, NAN])),
     ValueError, "b contains NaN"),
    ("conjugate_gradient", "empty", lambda: C.conjugate_gradient(lambda v: v, torch.ones(0)), ValueError,
     "non-empty"),
    ("conjugate_gradient", "dtype", lambda: C.conjugate_gradient(lambda v: v, torch.ones(3, dtype=torch.long)),
     TypeError, "floating point"),
    ("conjugate_gradient", "shape", lambda: C.conjugate_gradient(lambda v: v, torch.ones(2, 2)), ValueError,
     r"flat tensor \[P\]"),
    ("conjugate_gradient", "x0", lambda: C.conjugate_gradient(lambda v: v, torch.ones(3), x0=torch.ones(2)),
     ValueError, "x0 has shape"),
    ("conjugate_gradient", "range", lambda: C.conjugate_gradient(lambda v: v, torch.ones(3), tol=-1.0),
     ValueError, "tol must be >= 0"),
    ("conjugate_gradient", "indefinite", lambda: C.conjugate_gradient(lambda v: -v, torch.ones(3)), ValueError,
     "non-positive curvature .* at iteration 0"),
    ("hessian_free_direction", "range", lambda: C.hessian_free_direction(M, None, X, torch.ones(P, dtype=D),
                                                                        damping=0.0), ValueError, "damping"),
    ("hessian_free_direction", "nan", lambda: C.hessian_free_direction(M, None, X, torch.full((P,), NAN, dtype=D)),
     ValueError, "b contains NaN"),
    ("hessian_free_direction", "shape", lambda: C.hessian_free_direction(M, None, X, torch.ones(P + 2, dtype=D)),
     ValueError, "flat vector must have shape"),
    ("HessianFree", "range", lambda: C.HessianFree(M.parameters(), M, lr=0.0), ValueError, "lr must be > 0"),
    ("HessianFree", "nan", lambda: C.HessianFree(M.parameters(), M, damping=NAN), ValueError, "damping"),
    ("HessianFree", "int", lambda: C.HessianFree(M.parameters(), M, cg_iters=2.5), TypeError, "cg_iters"),
    ("HessianFree", "empty", lambda: C.HessianFree([], M), ValueError, "empty parameter list"),
    ("HessianFree", "nan loss", lambda: _hf_step(torch.tensor(NAN)), FloatingPointError, "non-finite loss"),
    ("HessianFree", "empty batch", lambda: _hf_step(torch.tensor(1.0), X[:0]), ValueError, "empty"),
    ("HessianFree", "warm_start", lambda: C.HessianFree(M.parameters(), M, warm_start=1.5), ValueError,
     r"warm_start must lie in \[0, 1\]"),
    # -------------------------------------------------------------------------------- diagonal Fisher
    ("FisherDiagonalPreconditioner", "range", lambda: C.FisherDiagonalPreconditioner(M, damping=0.0), ValueError,
     "damping must be > 0"),
    ("FisherDiagonalPreconditioner", "decay", lambda: C.FisherDiagonalPreconditioner(M, decay=1.0), ValueError,
     "decay must be < 1"),
    ("FisherDiagonalPreconditioner", "power", lambda: C.FisherDiagonalPreconditioner(M, power=-1.0), ValueError,
     "power must be > 0"),
    ("FisherDiagonalPreconditioner", "type", lambda: C.FisherDiagonalPreconditioner(M, generator=0), TypeError,
     "generator must be"),
    ("FisherDiagonalPreconditioner", "nan inputs", lambda: C.FisherDiagonalPreconditioner(M).update_statistics(nanlike(X)),
     ValueError, "inputs contains NaN"),
    ("FisherDiagonalPreconditioner", "empty", lambda: C.FisherDiagonalPreconditioner(M).update_statistics(X[:0]), ValueError,
     "empty"),
    ("FisherDiagonalPreconditioner", "nan grad", lambda: _diag_step(lambda net, pre: _with_nan_grad(net)),
     ValueError, "gradient of '0.weight' contains NaN"),
    ("FisherDiagonalPreconditioner", "changed damping", lambda: _diag_step(lambda net, pre: setattr(pre, "damping",
                                                                                                  -1.0)),
     ValueError, "damping must be > 0"),
    # ------------------------------------------------------------------------------------------------ K-FAC
    ("KFAC", "range", lambda: C.KFAC(M, damping=0.0), ValueError, "damping must be > 0"),
    ("KFAC", "nan", lambda: C.KFAC(M, damping=NAN), ValueError, "damping must be > 0"),
    ("KFAC", "int", lambda: C.KFAC(M, inverse_update_interval=1.5), TypeError, "inverse_update_interval"),
    ("KFAC", "samples", lambda: C.KFAC(M, n_samples=0), ValueError, "n_samples must be >= 1"),
    ("KFAC", "nan outputs", lambda: _kfac_update(lambda net: net(X) * NAN, y), ValueError, "outputs contains NaN"),
    ("KFAC", "empty", lambda: _kfac_update(lambda net: net(X[:0]), y[:0]), ValueError, "empty"),
    ("KFAC", "shape", lambda: _kfac_update(lambda net: net(X).sum(1), y), ValueError, r"shape \[N, C\]"),
    ("KFAC", "targets", lambda: _kfac_update(lambda net: net(X), y + 5), ValueError, r"lie in \[0, 3\)"),
    ("KFAC", "target shape", lambda: _kfac_update(lambda net: net(X), y[:, None]), ValueError,
     r"targets must have shape \(7,\)"),
    ("KFAC", "nan grad", _kfac_step_nan_grad, ValueError, r"gradients of K-FAC layers \['0'\] contain NaN"),
    # ---------------------------------------------------------------------------------- natural gradient
    ("natural_gradient", "nan", lambda: C.natural_gradient(nanlike(EYE2), V2), ValueError, "fisher contains NaN"),
    ("natural_gradient", "empty", lambda: C.natural_gradient(torch.ones(0, 0, dtype=D), torch.ones(0, dtype=D)),
     ValueError, "empty"),
    ("natural_gradient", "shape", lambda: C.natural_gradient(EYE2, torch.ones(3, dtype=D)), ValueError,
     "does not match fisher"),
    ("natural_gradient", "dtype", lambda: C.natural_gradient(EYE2.long(), V2), TypeError, "floating-point"),
    ("natural_gradient", "range", lambda: C.natural_gradient(EYE2, V2, damping=-1.0), ValueError, "damping"),
    ("natural_gradient", "indefinite", lambda: C.natural_gradient(-EYE2, V2), ValueError,
     "not symmetric positive definite"),
    ("trust_region_step", "range", lambda: C.trust_region_step(EYE2, V2, 0.0), ValueError, "max_kl must be > 0"),
    ("trust_region_step", "nan", lambda: C.trust_region_step(EYE2, V2 * NAN, 0.1), ValueError, "grad contains NaN"),
    ("NaturalGradientDescent", "range", lambda: _ngd(lambda: EYE2, lr=0.0), ValueError, "lr must be > 0"),
    ("NaturalGradientDescent", "damping", lambda: _ngd(lambda: EYE2, damping=-1.0), ValueError, "damping"),
    ("NaturalGradientDescent", "shape", lambda: _ngd(lambda: torch.eye(3, dtype=D)), ValueError,
     "fisher.. returned shape"),
    ("NaturalGradientDescent", "nan grad", lambda: _ngd(lambda: EYE2, grad=V2 * NAN), ValueError,
     "gradient contains NaN"),
    ("NaturalGradientDescent", "nan fisher", lambda: _ngd(lambda: EYE2 * NAN), ValueError, "fisher contains NaN"),
    ("NaturalGradientDescent", "type", lambda: _ngd(EYE2), TypeError, "fisher must be a callable"),
    # --------------------------------------------------------------------------------- Gaussian geometry
    ("gaussian_kl", "nan", lambda: C.gaussian_kl(V2 * NAN, EYE2, V2, EYE2), ValueError, "first mean contains NaN"),
    ("gaussian_kl", "shape", lambda: C.gaussian_kl(V2, EYE2, torch.ones(3, dtype=D), torch.eye(3, dtype=D)),
     ValueError, "dimensions differ"),
    ("gaussian_kl", "not pd", lambda: C.gaussian_kl(V2, -EYE2, V2, EYE2), ValueError,
     "not symmetric positive definite"),
    ("gaussian_kl", "dtype", lambda: C.gaussian_kl(V2.long(), EYE2, V2, EYE2), TypeError, "floating-point"),
    ("gaussian_kl", "empty", lambda: C.gaussian_kl(V2[:0], EYE2[:0, :0], V2[:0], EYE2[:0, :0]), ValueError, "empty"),
    ("gaussian_fisher", "shape", lambda: C.gaussian_fisher(lambda t: (t, EYE2), EYE2), ValueError,
     r"theta must be a vector \[P\]"),
    ("gaussian_fisher", "nan", lambda: C.gaussian_fisher(lambda t: (t, EYE2), V2 * NAN), ValueError, "NaN"),
    ("gaussian_fisher", "not pd", lambda: C.gaussian_fisher(lambda t: (t, -EYE2), V2), ValueError,
     "not symmetric positive definite"),
    ("CoupledGaussian", "shape", lambda: C.CoupledGaussian().loss(torch.ones(3, dtype=D)), ValueError,
     "last dimension 2"),
    ("CoupledGaussian", "nan", lambda: C.CoupledGaussian().grad(V2 * NAN), ValueError, "theta contains NaN"),
    ("CoupledGaussian", "range", lambda: C.CoupledGaussian().kl_after_steps(V2, 0.1, -1), ValueError,
     "non-negative integers"),
    ("CoupledGaussian", "dtype", lambda: C.CoupledGaussian().mean(V2.long()), TypeError, "floating-point"),
    # ------------------------------------------------------------------------------ exponential family
    ("sym_to_vec", "shape", lambda: C.sym_to_vec(torch.ones(2, 3, dtype=D)), ValueError, "square"),
    ("sym_to_vec", "nan", lambda: C.sym_to_vec(EYE2 * NAN), ValueError, "NaN"),
    ("sym_to_vec", "dtype", lambda: C.sym_to_vec(EYE2.long()), TypeError, "floating-point"),
    ("vec_to_sym", "shape", lambda: C.vec_to_sym(torch.ones(4, dtype=D)), ValueError, r"not d\(d\+1\)/2"),
    ("vec_to_sym", "nan", lambda: C.vec_to_sym(torch.ones(3, dtype=D) * NAN), ValueError, "NaN"),
    ("gaussian_to_natural", "shape", lambda: C.gaussian_to_natural(torch.ones(3, dtype=D), EYE2), ValueError,
     "does not match covariance"),
    ("gaussian_to_natural", "not pd", lambda: C.gaussian_to_natural(V2, -EYE2), ValueError, "positive definite"),
    ("gaussian_from_natural", "shape", lambda: C.gaussian_from_natural(torch.ones(3, dtype=D), _NEG), ValueError,
     "lambda1 of shape .* does not match lambda2"),
    ("gaussian_from_natural", "range", lambda: C.gaussian_from_natural(V2, EYE2), ValueError,
     "lambda2 must be negative definite"),
    ("gaussian_to_expectation", "nan", lambda: C.gaussian_to_expectation(V2 * NAN, EYE2), ValueError, "NaN"),
    ("gaussian_from_expectation", "shape", lambda: C.gaussian_from_expectation(torch.ones(3, dtype=D), EYE2),
     ValueError, "mu1 of shape .* does not match mu2"),
    ("gaussian_from_expectation", "range", lambda: C.gaussian_from_expectation(V2, EYE2), ValueError,
     "mu2 - mu1 mu1"),
    ("gaussian_log_partition", "shape", lambda: C.gaussian_log_partition(torch.ones(3, dtype=D), _NEG),
     ValueError, "does not match lambda2"),
    ("gaussian_log_partition", "nan", lambda: C.gaussian_log_partition(V2, _NEG * NAN), ValueError, "NaN"),
    ("gaussian_natural_fisher", "batched", lambda: C.gaussian_natural_fisher(torch.ones(2, 2, dtype=D),
                                                                             _NEG.expand(2, 2, 2)),
     ValueError, "single distribution"),
    ("gaussian_natural_fisher", "shape", lambda: C.gaussian_natural_fisher(torch.ones(3, dtype=D), _NEG),
     ValueError, "does not match lambda2"),
    ("gaussian_natural_fisher", "range", lambda: C.gaussian_natural_fisher(V2, EYE2), ValueError,
     "negative definite"),
    ("gaussian_natural_fisher", "dtype", lambda: C.gaussian_natural_fisher(V2.long(), _NEG), TypeError,
     "floating-point"),
    ("gaussian_samples", "range", lambda: C.gaussian_samples(V2, EYE2, 0), ValueError, "n_samples must be >= 1"),
    ("gaussian_samples", "shape", lambda: C.gaussian_samples(torch.ones(2, 2, dtype=D), EYE2, 3), ValueError,
     r"vector \[d\]"),
    ("gaussian_samples", "nan", lambda: C.gaussian_samples(V2 * NAN, EYE2, 3), ValueError, "NaN"),
    *[(name, case, call, exc, msg) for name in ("bonnet_gradient", "price_gradient", "gaussian_natural_gradient")
      for case, call, exc, msg in [
          ("nan derivative", lambda name=name: getattr(C, name)(_nan_grad_f, V2, EYE2, 4), ValueError,
           r"of f is NaN or inf at 4 of 4 samples"),
          ("non-scalar f", lambda name=name: getattr(C, name)(lambda z: z, V2, EYE2, 4), ValueError,
           "scalar tensor"),
          ("range", lambda name=name: getattr(C, name)(lambda z: z.sum(), V2, EYE2, 0), ValueError, "n_samples"),
          ("nan", lambda name=name: getattr(C, name)(lambda z: z.sum(), V2 * NAN, EYE2, 4), ValueError, "NaN")]],
    ("gaussian_vi_natural_update", "range", lambda: C.gaussian_vi_natural_update(V2, EYE2, V2, EYE2, 1.5, V2, EYE2),
     ValueError, r"lr must lie in \(0, 1\]"),
    ("gaussian_vi_natural_update", "shape", lambda: C.gaussian_vi_natural_update(V2, EYE2, V2, torch.eye(3, dtype=D),
                                                                                 0.5, V2, EYE2),
     ValueError, r"hess_mean must have shape \(2, 2\)"),
    ("gaussian_vi_natural_update", "nan", lambda: C.gaussian_vi_natural_update(V2, EYE2, V2 * NAN, EYE2, 0.5, V2,
                                                                               EYE2),
     ValueError, "grad_mean contains NaN"),
    ("gaussian_vi_natural_update", "not pd", lambda: C.gaussian_vi_natural_update(V2, -EYE2, V2, EYE2, 0.5, V2, EYE2),
     ValueError, "precision is not symmetric positive definite"),
    ("NaturalGaussianVI", "range", lambda: _vi(lr=2.0), ValueError, r"lr must lie in \(0, 1\]"),
    ("NaturalGaussianVI", "samples", lambda: _vi(n_samples=0), ValueError, "n_samples must be >= 1"),
    ("NaturalGaussianVI", "not pd", lambda: _vi(prior_precision=-EYE2), ValueError, "positive definite"),
    ("NaturalGaussianVI", "shape", lambda: _vi(init_mean=torch.ones(3, dtype=D)), ValueError, "match the prior"),
    ("NaturalGaussianVI", "type", lambda: _vi(log_lik=3), TypeError, "log_lik must be callable"),
    ("NaturalGaussianVI", "nan", lambda: _vi(log_lik=_nan_grad_f).step(), ValueError, "gradient of f is NaN"),
    # ------------------------------------------------------------- generators and mixed dtypes (shared validators)
    *[(name, "seed", call, TypeError, r"generator must be a torch.Generator or None, got int \(a seed\?")
      for name, call in [
          ("sample_targets", lambda: C.sample_targets(LOGITS, generator=0)),
          ("mc_fisher", lambda: C.mc_fisher(M, None, X, generator=0)),
          ("mc_fisher_diagonal", lambda: C.mc_fisher_diagonal(M, None, X, generator=0)),
          ("gaussian_samples", lambda: C.gaussian_samples(V2, EYE2, 3, generator=0)),
          ("bonnet_gradient", lambda: C.bonnet_gradient(lambda z: z.sum(), V2, EYE2, 3, generator=0)),
          ("price_gradient", lambda: C.price_gradient(lambda z: z.sum(), V2, EYE2, 3, generator=0)),
          ("gaussian_natural_gradient", lambda: C.gaussian_natural_gradient(lambda z: z.sum(), V2, EYE2, 3,
                                                                            generator=0)),
          ("NaturalGaussianVI", lambda: _vi(generator=0)),
          ("KFAC", lambda: C.KFAC(M, generator=0)),
          ("FisherDiagonalPreconditioner", lambda: C.FisherDiagonalPreconditioner(M, generator=0))]],
    ("mc_fisher", "string generator", lambda: C.mc_fisher(M, None, X, generator="seed"), TypeError,
     "generator must be a torch.Generator or None, got str"),
    *[(name, "mixed dtypes", call, TypeError, match) for name, call, match in [
        ("natural_gradient", lambda: C.natural_gradient(EYE2, V2.float()),
         r"mixed dtypes \(fisher: float64, grad: float32\)"),
        ("trust_region_step", lambda: C.trust_region_step(EYE2.float(), V2, 0.1),
         r"mixed dtypes \(fisher: float32, grad: float64\)"),
        ("gaussian_kl", lambda: C.gaussian_kl(V2.float(), EYE2.float(), V2, EYE2), r"mixed dtypes \(m0: float32"),
        ("gaussian_to_natural", lambda: C.gaussian_to_natural(V2.float(), EYE2),
         r"mixed dtypes \(mean: float32, covariance: float64\)"),
        ("gaussian_from_natural", lambda: C.gaussian_from_natural(V2.float(), _NEG), r"lambda1: float32"),
        ("gaussian_from_expectation", lambda: C.gaussian_from_expectation(V2, 2 * EYE2.float()), r"mu2: float32"),
        ("gaussian_log_partition", lambda: C.gaussian_log_partition(V2.float(), _NEG), r"lambda1: float32"),
        ("gaussian_natural_fisher", lambda: C.gaussian_natural_fisher(V2, _NEG.float()), r"lambda2: float32"),
        ("gaussian_vi_natural_update", lambda: C.gaussian_vi_natural_update(V2, EYE2, V2.float(), EYE2, 0.5, V2, EYE2),
         r"grad_mean: float32"),
        ("NaturalGaussianVI", lambda: _vi(init_mean=V2.float()), r"init_mean: float32")]],
    # ------------------------------------------------------------------- Shampoo, SOAP, matrix roots, Muon's split
    ("Shampoo", "nan lr", lambda: C.Shampoo(M.parameters(), lr=NAN), ValueError, "lr must be > 0"),
    ("Shampoo", "exponent", lambda: C.Shampoo(M.parameters(), exponent=0.5), ValueError,
     r"exponent must be a number in \[-1, 0\)"),
    ("Shampoo", "grafting", lambda: C.Shampoo(M.parameters(), grafting="adagrad"), ValueError,
     "grafting must be one of"),
    ("Shampoo", "nan grad", lambda: C.Shampoo(_with_nan_grad(_m()).parameters()).step(), ValueError,
     "a gradient holds NaN or inf"),
    ("SOAP", "beta2", lambda: C.SOAP(M.parameters(), betas=(0.9, 1.0)), ValueError, r"betas\[1\] must be < 1"),
    ("SOAP", "eigenbasis", lambda: C.SOAP(M.parameters(), eigenbasis="svd"), ValueError, "eigenbasis must be one of"),
    ("SOAP", "nan grad", lambda: C.SOAP(_with_nan_grad(_m()).parameters()).step(), ValueError,
     "a gradient holds NaN or inf"),
    ("matrix_power", "shape", lambda: C.matrix_power(torch.ones(2, 3, dtype=D), -0.5, 1e-6), ValueError,
     "m must be a square matrix"),
    ("matrix_power", "nan", lambda: C.matrix_power(nanlike(EYE2), -0.5, 1e-6), ValueError, "m holds NaN or inf"),
    ("matrix_power", "epsilon", lambda: C.matrix_power(EYE2, -0.5, 0.0), ValueError, "epsilon must be > 0"),
    ("muon_with_adamw", "type", lambda: C.muon_with_adamw(list(M.parameters())), TypeError,
     "model must be an nn.Module"),
    ("muon_with_adamw", "exclude", lambda: C.muon_with_adamw(_m(), exclude=["nope"]), ValueError,
     "exclude names"),
]

EXEMPT = {
    "LIKELIHOODS": "a constant tuple of names, not a callable",
    "MCEstimate": "a NamedTuple container (mean, stderr) without behaviour",
    "RankFailure": "an exception class (raised on every rank; tests/curvature/test_fail_fast.py)",
}


@pytest.mark.parametrize("name,case,call,exc,match", CASES, ids=[f"{n}-{c}" for n, c, *_ in CASES])
def test_bad_input_raises_a_clear_error(name, case, call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_every_public_name_is_walked():
    walked = {name for name, *_ in CASES}
    missing = set(C.__all__) - walked - set(EXEMPT)
    assert not missing, f"public names without a bad-input case: {sorted(missing)}"
    assert set(EXEMPT) <= set(C.__all__) and not walked - set(C.__all__)
    assert isinstance(C.LIKELIHOODS, tuple) and all(isinstance(x, str) for x in C.LIKELIHOODS)


# -------------------------------------------------------------- train-mode Dropout / BatchNorm (vmapped paths)
def _with(layer):
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 6), layer, nn.Tanh(), nn.Linear(6, 3)).double()


RANDOM_OR_COUPLED = [lambda: nn.Dropout(0.3), lambda: nn.AlphaDropout(0.2), lambda: nn.BatchNorm1d(6)]
CURVATURE_PATHS = {
    "ggn_matrix": lambda m: C.ggn_matrix(m, None, X),
    "mc_fisher_diagonal": lambda m: C.mc_fisher_diagonal(m, None, X, generator=torch.Generator().manual_seed(0)),
    "empirical_fisher": lambda m: C.empirical_fisher(m, None, X, y),
    "ggn_vector_product": lambda m: C.ggn_vector_product(m, None, X, torch.ones(sum(
        p.numel() for p in m.parameters()), dtype=D)),
    "FisherDiagonalPreconditioner": lambda m: C.FisherDiagonalPreconditioner(m, "exact").update_statistics(X),
}


@pytest.mark.parametrize("make_layer", RANDOM_OR_COUPLED, ids=["Dropout", "AlphaDropout", "BatchNorm1d"])
@pytest.mark.parametrize("path", sorted(CURVATURE_PATHS))
def test_train_mode_random_or_batch_coupled_layers_give_a_clear_error(make_layer, path):
    layer = make_layer()
    m = _with(layer)
    with pytest.raises(ValueError, match=rf"\({type(layer).__name__}\) is in training mode.*model.eval\(\)"):
        CURVATURE_PATHS[path](m)
    m.eval()                                                  # documented handling: evaluate in eval mode
    out = CURVATURE_PATHS[path](m)
    assert bool(torch.isfinite(flatten(out) if isinstance(out, dict) else out).all())


def test_a_random_function_is_caught_in_the_vmapped_and_matrix_free_paths():
    """A plain function (no module to inspect) that draws random numbers."""
    def fn(p, x):
        return torch.func.functional_call(M, p, (nn.functional.dropout(x, 0.5, training=True),))

    with pytest.raises(ValueError, match="draws random numbers"):
        C.ggn_matrix(fn, PARAMS, X)
    with pytest.raises(ValueError, match="returned different outputs"):
        C.ggn_vector_product(fn, PARAMS, X, torch.ones(P, dtype=D))


# ------------------------------------------------------------------- extreme but valid inputs stay finite
def test_extreme_valid_inputs_give_finite_results():
    big = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, 3.0]], dtype=D)
    assert bool(torch.isfinite(C.nll_loss(big, torch.tensor([1, 0]))))
    assert bool(torch.isfinite(C.output_hessian_sqrt(big)).all())
    assert bool((C.sample_targets(big, n_samples=5, generator=torch.Generator().manual_seed(0)) < 3).all())
    lin = nn.Linear(4, 3).double()
    with torch.no_grad():
        lin.weight.mul_(1e3)
    assert bool(torch.isfinite(C.ggn_matrix(lin, None, X)).all())
    F = torch.diag(torch.tensor([1e8, 1e-8], dtype=D))
    assert bool(torch.isfinite(C.natural_gradient(F, V2, damping=1e-12)).all())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cpu_generator_still_draws_for_cuda_tensors():
    """The curvature samplers draw on the generator's device and move the draws (documented), so the generator
    check refuses only what is not a generator: a CPU generator with CUDA outputs gives the CPU draws."""
    logits, gen = LOGITS.cuda(), torch.Generator().manual_seed(0)
    assert torch.equal(C.sample_targets(logits, generator=gen).cpu(),
                       C.sample_targets(LOGITS, generator=torch.Generator().manual_seed(0)))
    z = C.gaussian_samples(V2.cuda(), EYE2.cuda(), 3, torch.Generator().manual_seed(1))
    torch.testing.assert_close(z.cpu(), C.gaussian_samples(V2, EYE2, 3, torch.Generator().manual_seed(1)))


def test_a_model_output_without_logits_is_refused_naming_the_function_to_pass():
    """Issue 41 item 6: a base model's ``ModelOutput`` (no ``.logits``) is refused by the Fisher functions,
    Hessian-free and K-FAC with the one-line fix (a function returning the tensor; K-FAC's ``outputs=``)."""
    import transformers
    from hf_models import tiny_gpt2, token_batch

    base = transformers.GPT2Model(tiny_gpt2().config).eval()
    ids, _, _ = token_batch(2, 5)
    bias = {"h.0.mlp.c_fc.bias": base.h[0].mlp.c_fc.bias}
    fix = r"without a \.logits tensor \(tensor fields: last_hidden_state\).*functional_call\(model, params, inputs\)"
    with pytest.raises(TypeError, match=fix):
        C.ggn_matrix(base, bias, ids)
    with pytest.raises(TypeError, match=fix):
        C.hessian_free_direction(base, bias, ids, {k: torch.ones_like(v) for k, v in bias.items()})
    k = C.KFAC(base, skip_unsupported=True)
    with pytest.raises(TypeError, match=r"outputs=out\.last_hidden_state"):
        k.update_statistics(ids, None)
