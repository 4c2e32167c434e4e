"""Every update rule of the package behind one interface: ``rule = make_rule(name, problem, **hp)``;
``rule.step()`` updates ``problem.model`` in place, exactly as the wrapped implementation does.

Derived in notebook 16_update_rule_harness. Each wrapper *calls* the real implementation — ``torch.optim``
(SGD, momentum, Adam), :class:`~taskloss.curvature.natural_gradient.NaturalGradientDescent` with the exact Fisher
(:func:`~taskloss.curvature.fisher.fisher_matrix`) or the empirical one
(:func:`~taskloss.curvature.fisher.empirical_fisher`), :class:`~taskloss.curvature.kfac.KFAC`,
:class:`~taskloss.curvature.diagonal.FisherDiagonalPreconditioner`, :class:`~taskloss.curvature.hessian_free.HessianFree`,
:class:`~taskloss.search.mgs.MGS`, :func:`~taskloss.search.policy_gradient.classification_reinforce`,
:func:`~taskloss.search.zeroth_order.gaussian_smoothing_grad`, :func:`~taskloss.search.zeroth_order.spsa_grad`,
:class:`~taskloss.search.zeroth_order.MeZO`, :class:`~taskloss.dynamics.clipping.ClippedSGD`,
:class:`~taskloss.curvature.shampoo.Shampoo`, :class:`~taskloss.curvature.soap.SOAP`, ``torch.optim.Muon`` with
``torch.optim.AdamW`` (:func:`~taskloss.curvature.shampoo.muon_with_adamw`) and
:func:`~taskloss.dynamics.implicit.gradient_norm_penalty` — and Newton's step by a dense Hessian
(:meth:`~taskloss.harness.problem.Problem.grad_hessian`) solved with :func:`~taskloss.sampling.update.newton_direction`.
Nothing is reimplemented.

Objectives: gradient and curvature rules descend the surrogate ``l̃``; MGS, the zeroth-order rules and REINFORCE
use the task loss ``l`` (REINFORCE: the expected task loss of labels sampled from the softmax, so categorical
problems only; on a :class:`~taskloss.harness.sequence.SequenceProblem` the expected task loss of sampled
continuations, :func:`~taskloss.search.policy_gradient.sequence_reinforce`). Add a rule with :func:`register`: a
class whose ``__init__(problem, **hp)`` builds the wrapped optimizer and whose ``step()`` takes one step.

Not every rule applies to every problem: a rule class says why not in ``unsupported(problem)`` (``None`` when it
applies). On a sequence problem the gradient penalty (no double backward through fused attention) and the curvature rules (Newton, exact and empirical natural gradient, K-FAC, the
diagonal Fishers, Hessian-free) do not: they need outputs ``[N, C]`` with a per-example likelihood, a dense
``[P, P]`` matrix or layer hooks a Transformer's attention does not have. :func:`applicable_rules` lists the rules
that apply, and :func:`make_rule` raises ``ValueError`` with the reason for the others.
"""
from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from taskloss.curvature.diagonal import FisherDiagonalPreconditioner
from taskloss.curvature.fisher import empirical_fisher, fisher_matrix
from taskloss.curvature.hessian_free import HessianFree
from taskloss.curvature.kfac import KFAC
from taskloss.curvature.natural_gradient import NaturalGradientDescent
from taskloss.curvature.shampoo import Shampoo, muon_with_adamw
from taskloss.curvature.soap import SOAP
from taskloss.dynamics.clipping import ClippedSGD
from taskloss.dynamics.implicit import gradient_norm_penalty
from taskloss.harness.problem import Problem
from taskloss.harness.sequence import SequenceProblem
from taskloss.sampling.update import newton_direction
from taskloss.search.functional import call_with_parameters
from taskloss.search.mgs import MGS
from taskloss.search.policy_gradient import classification_reinforce
from taskloss.search.zeroth_order import MeZO, gaussian_smoothing_grad, spsa_grad
from taskloss.validation import check_bool, check_int, check_positive

__all__ = ["RuleSpec", "RULES", "DEFAULT_OVERRIDES", "OWN_MEANING", "DENSE_MAX_PARAMS", "register", "make_rule",
           "applicable_rules", "inapplicable_rules"]

_CURVATURE = ("it needs outputs [N, C] with a per-example likelihood (a Fisher, a Kronecker factor or a GGN of "
              "the model's outputs); a sequence problem's surrogate is a token NLL over a Transformer's windows")
#: the most trainable parameters the rules with a dense [P, P] matrix (Newton, the natural gradients) accept by default
DENSE_MAX_PARAMS = 5000


def _dense_too_large(problem: Problem, max_params: int, what: str) -> str | None:
    n = sum(p.numel() for p in problem.params)
    if n > max_params:
        return f"it needs the dense [P, P] {what}: P = {n} > max_params = {max_params}"
    return None


class _Rule:
    """Base of the rules: ``self.problem``; ``_closure()`` sets ``.grad`` of the surrogate at the current parameters.

    ``unsupported(problem)`` states the requirements a rule can check from the problem alone; a rule whose support
    also depends on what the model's autograd can do (double backward, forward-mode AD, layer types a
    preconditioner knows) sets ``needs_trial = True``, and :func:`applicable_rules` then builds it on a copy of the
    problem and takes one step there before calling it applicable.

    Not a ``torch.optim.Optimizer``: a rule binds an update rule to a :class:`~taskloss.harness.problem.Problem`,
    which supplies the batch, so ``rule.step()`` takes no closure; the optimizer it wraps, where there is one, is
    ``rule.opt`` (``torch.optim`` shaped, with its ``param_groups``, schedulers and ``state_dict``). Newton's and the
    zeroth-order rules apply θ ← θ − lr·d themselves and keep no state.
    """

    objective = "surrogate"
    needs_trial = False

    def __init__(self, problem: Problem):
        if not isinstance(problem, Problem):
            raise TypeError(f"problem must be a taskloss.harness Problem, got {type(problem).__name__}")
        reason = self.unsupported(problem)
        if reason is not None:
            raise ValueError(f"{type(self).__name__} does not apply to this {type(problem).__name__}: {reason}")
        self.problem = problem

    @classmethod
    def unsupported(cls, problem: Problem) -> str | None:
        """Why this rule cannot run on ``problem`` (``None``: it can)."""
        return None

    def _closure(self):
        for p in self.problem.params:
            p.grad = None
        loss = self.problem.surrogate()
        loss.backward()
        return loss

    def step(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class _CurvatureRule(_Rule):
    """A rule that needs the curvature of per-example output likelihoods: not on a sequence problem; what the model's
    autograd supports is tried on a copy (``needs_trial``)."""

    needs_trial = True

    @classmethod
    def unsupported(cls, problem: Problem) -> str | None:
        return _CURVATURE if isinstance(problem, SequenceProblem) else None


class _TorchOptim(_Rule):
    """A ``torch.optim``-style optimizer stepped with the surrogate closure."""

    def step(self) -> None:
        self.opt.step(self._closure)


class SGD(_TorchOptim):
    """``torch.optim.SGD``: θ ← θ − lr·∇l̃."""

    def __init__(self, problem, lr: float = 0.1):
        super().__init__(problem)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr))


class Momentum(_TorchOptim):
    """``torch.optim.SGD`` with heavy-ball ``momentum`` (its first step equals SGD's)."""

    def __init__(self, problem, lr: float = 0.1, momentum: float = 0.9):
        super().__init__(problem)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr), momentum=momentum)


class Adam(_TorchOptim):
    """``torch.optim.Adam`` with learning rate ``lr`` (its first step is ≈ −lr·sign(g))."""

    def __init__(self, problem, lr: float = 1e-2):
        super().__init__(problem)
        self.opt = torch.optim.Adam(problem.params, lr=check_positive("lr", lr))


class Clipped(_TorchOptim):
    """:class:`ClippedSGD`, hard global clipping: θ ← θ − min(lr, lr·γ/‖g‖)·g (``gamma`` = γ)."""

    def __init__(self, problem, lr: float = 0.1, gamma: float = 1.0):
        super().__init__(problem)
        self.opt = ClippedSGD(problem.params, lr=lr, gamma=gamma)


class GradPenalty(_TorchOptim):
    """SGD (``lr``) on ``l̃ + μ‖∇l̃‖²`` (``mu`` = μ; the explicit gradient regularizer, one double backward)."""

    needs_trial = True          # double backward through the model (SDPA attention has none on a CPU)

    @classmethod
    def unsupported(cls, problem: Problem) -> str | None:
        if isinstance(problem, SequenceProblem):
            return ("the penalty's double backward goes through the Transformer's fused attention "
                    "(torch's scaled_dot_product_attention has no second derivative on the CPU)")
        return None

    def __init__(self, problem, lr: float = 0.1, mu: float = 0.05):
        super().__init__(problem)
        self.mu = check_positive("mu", mu)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr))

    def _closure(self):
        for p in self.problem.params:
            p.grad = None
        loss = self.problem.surrogate()
        total = loss + self.mu * gradient_norm_penalty(loss, self.problem.params)
        total.backward()
        return loss


class Newton(_CurvatureRule):
    """``θ ← θ − lr (H + δI)⁻¹ g`` with the dense Hessian of the surrogate (``damping`` = δ; ``max_params``
    guards the P² memory and raises ``ValueError`` above it)."""

    def __init__(self, problem, lr: float = 1.0, damping: float = 0.0, max_params: int = DENSE_MAX_PARAMS):
        reason = _dense_too_large(problem, check_int("max_params", max_params, minimum=1), "Hessian") \
            if isinstance(problem, Problem) else None
        if reason is not None:
            raise ValueError(f"Newton does not apply: {reason}")
        super().__init__(problem)
        self.lr, self.damping = check_positive("lr", lr), float(damping)

    def step(self) -> None:
        theta = self.problem.flat_params()
        g, H = self.problem.grad_hessian()
        if self.damping:
            H = H + self.damping * torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
        self.problem.set_flat_params(theta - self.lr * newton_direction(H, g))


class NaturalGradient(_CurvatureRule, _TorchOptim):
    """:class:`NaturalGradientDescent` with the exact Fisher (= GGN) or the empirical Fisher of the batch.
    The weight decay's curvature λ is added to the damping, so for a linear softmax model this is Newton.
    ``lr``, ``damping`` as in :class:`NaturalGradientDescent`; ``fisher``: ``"exact"`` or ``"empirical"``;
    ``max_params`` guards the dense [P, P] Fisher's memory."""

    def __init__(self, problem, lr: float = 1.0, damping: float = 1e-4, fisher: str = "exact",
                 max_params: int = DENSE_MAX_PARAMS):
        reason = _dense_too_large(problem, check_int("max_params", max_params, minimum=1), "Fisher") \
            if isinstance(problem, Problem) else None
        if reason is not None:
            raise ValueError(f"NaturalGradient does not apply: {reason}")
        super().__init__(problem)
        if fisher not in ("exact", "empirical"):
            raise ValueError(f"fisher must be 'exact' or 'empirical', got {fisher!r}")
        pb = problem
        if fisher == "exact":
            fn = lambda: fisher_matrix(pb.model, None, pb.inputs, pb.likelihood)  # noqa: E731
        else:
            fn = lambda: empirical_fisher(pb.model, None, pb.inputs, pb.targets, pb.likelihood)  # noqa: E731
        self.opt = NaturalGradientDescent(problem.params, fn, lr=lr, damping=damping + problem.weight_decay)


class KFACRule(_CurvatureRule):
    """SGD (``lr``) preconditioned by :class:`KFAC` (``damping``, ``fisher_type``, ``decay`` = 0: batch factors,
    ``inverse_update_interval`` = 1: inverses refreshed every step; ``seed`` seeds its MC-label generator)."""

    def __init__(self, problem, lr: float = 0.1, damping: float = 1e-2, fisher_type: str = "exact",
                 decay: float = 0.0, inverse_update_interval: int = 1, seed: int = 0):
        super().__init__(problem)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr))
        self.kfac = KFAC(problem.model, damping=damping + problem.weight_decay, fisher_type=fisher_type,
                         likelihood=problem.likelihood, decay=decay,
                         inverse_update_interval=inverse_update_interval,
                         generator=torch.Generator(device=problem.inputs.device).manual_seed(seed))

    def step(self) -> None:
        pb = self.problem
        for p in pb.params:
            p.grad = None
        outputs = pb.model(pb.inputs)
        pb.surrogate_from_outputs(outputs).backward(retain_graph=True)
        self.kfac.update_statistics(pb.inputs, pb.targets, outputs=outputs)
        self.kfac.precondition_()
        self.opt.step()


class DiagonalFisher(_CurvatureRule):
    """SGD (``lr``) preconditioned by :class:`FisherDiagonalPreconditioner`: ``fisher_type`` ``"exact"``, ``"mc"``
    or ``"empirical"``, ``p.grad ← p.grad / (D + damping)^power``, running average ``decay`` (0: this batch)."""

    def __init__(self, problem, lr: float = 0.1, damping: float = 1e-3, fisher_type: str = "exact",
                 power: float = 1.0, decay: float = 0.0, seed: int = 0):
        super().__init__(problem)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr))
        self.pre = FisherDiagonalPreconditioner(
            problem.model, fisher_type, likelihood=problem.likelihood, damping=damping + problem.weight_decay,
            decay=decay, power=power, generator=torch.Generator(device=problem.inputs.device).manual_seed(seed))

    def step(self) -> None:
        self._closure()
        self.pre.update_statistics(self.problem.inputs, self.problem.targets)
        self.pre.precondition_()
        self.opt.step()


class HessianFreeRule(_CurvatureRule):
    """:class:`HessianFree` (truncated CG on GGN-vector products of the current batch; ``cg_iters`` iterations,
    ``adapt_damping``: Levenberg–Marquardt, undoing steps that raise the loss); weight decay's λ joins ``damping``."""

    def __init__(self, problem, lr: float = 1.0, damping: float = 1e-3, cg_iters: int = 10,
                 adapt_damping: bool = False):
        super().__init__(problem)
        self.opt = HessianFree(problem.named_params, problem.model, lr=lr, damping=damping + problem.weight_decay,
                               cg_iters=cg_iters, likelihood=problem.likelihood, adapt_damping=adapt_damping)

    def _hf_closure(self):
        return self._closure(), self.problem.inputs        # the GGN batch travels with the loss

    def step(self) -> None:
        self.opt.step(self._hf_closure)


class MGSRule(_Rule):
    """:class:`MGS` with SGD(lr=1) (θ ← θ + Δθ* exactly), candidates scored one after another (exact counts).
    ``n_samples``, ``alpha``, ``sigma``, ``mix``, ``sigma_mode``, clipping norms and ``seed`` as in :class:`MGS`; the
    MLE component is centred at −lr·∇l̃ (MGS's closure returns the surrogate scaled by ``lr``). On a sequence problem
    each candidate is scored by the task loss of its greedy continuations, as in notebook 04_sequence_task_losses."""

    objective = "task"

    def __init__(self, problem, n_samples: int = 8, alpha: float = 0.01, sigma: float = 1.0, mix: float = 0.5,
                 lr: float = 0.1, sigma_mode: str = "relative", max_update_norm: float | None = None,
                 max_grad_norm: float | None = None, seed: int = 0):
        super().__init__(problem)
        pb = problem
        self.lr = check_positive("lr", lr)
        self.opt = torch.optim.SGD(pb.params, lr=1.0)
        task = lambda outputs, batch: pb.task_from_outputs(outputs)  # noqa: E731
        forward = lambda model, batch: pb.task_outputs(model)  # noqa: E731
        self.mgs = MGS(pb.model, self.opt, task, forward_fn=forward, n_samples=n_samples, alpha=alpha, sigma=sigma,
                       mix=mix, sigma_mode=sigma_mode, max_grad_norm=max_grad_norm, max_update_norm=max_update_norm,
                       parallel=False, eval_mode=False, seed=seed, ess_warning=None)   # the harness reads last_stats

    def _mgs_closure(self):
        # the MLE component is centred at −lr·∇l̃ (MGS centres it at −g of the loss the closure differentiates)
        loss = self.lr * self.problem.surrogate()
        loss.backward()
        return loss, (self.problem.inputs, self.problem.targets)

    def step(self) -> None:
        self.mgs.step(self._mgs_closure)
        self.last_stats = self.mgs.last_stats


class Reinforce(_Rule):
    """SGD (``lr``) on the REINFORCE surrogate of the expected task loss of ``n_samples`` label vectors drawn
    from ``softmax(outputs)`` (leave-one-out baseline): per-example accuracy reward when the problem has no
    ``task_labels_fn``, else the batch-level reward −task(labels); ``mle_weight`` adds cross-entropy. On a
    :class:`SequenceProblem`: ``n_samples`` sampled continuations per prefix, reward = −task loss
    (:meth:`SequenceProblem.sequence_reinforce_loss`), ``mle_weight`` adds the teacher-forced token NLL."""

    objective = "task"

    @classmethod
    def unsupported(cls, problem: Problem) -> str | None:
        if problem.likelihood != "categorical":
            return "REINFORCE samples class labels or tokens: it needs a categorical problem"
        return None

    def __init__(self, problem, lr: float = 0.1, n_samples: int = 8, mle_weight: float = 0.0, seed: int = 0):
        super().__init__(problem)
        self.opt = torch.optim.SGD(problem.params, lr=check_positive("lr", lr))
        self.S, self.mle_weight = n_samples, mle_weight
        self.gen = torch.Generator(device=problem.inputs.device).manual_seed(seed)

    def step(self) -> None:
        pb = self.problem
        if isinstance(pb, SequenceProblem):
            for p in pb.params:
                p.grad = None
            pb.sequence_reinforce_loss(self.S, self.gen, self.mle_weight).backward()
            self.opt.step()
            return
        task = pb.task_labels_fn
        reward = "accuracy" if task is None else (lambda s, t: -task(s, t))
        for p in pb.params:
            p.grad = None
        res = classification_reinforce(pb.model(pb.inputs), pb.targets, self.S, reward=reward,
                                       mle_weight=self.mle_weight, generator=self.gen)
        res.loss.backward()
        self.opt.step()


class ZerothOrder(_Rule):
    """θ ← θ − lr·ĝ with a zeroth-order gradient ĝ of the task loss from ``n_samples`` directions: Gaussian
    smoothing with antithetic pairs (``estimator="gaussian"``) or SPSA (``"spsa"``), both of scale ``sigma``;
    perturbed points evaluated one after another (``vectorize=False``), so every forward is counted. Under
    ``torch.distributed`` each rank's problem holds its part of the batch: the estimate (like MeZO's step) is that
    of the whole batch, each rank's task loss weighted by its rows."""

    objective = "task"

    def __init__(self, problem, lr: float = 0.1, sigma: float = 1e-2, n_samples: int = 8,
                 estimator: str = "gaussian", seed: int = 0):
        super().__init__(problem)
        if estimator not in ("gaussian", "spsa"):
            raise ValueError(f"estimator must be 'gaussian' or 'spsa', got {estimator!r}")
        self.lr, self.sigma, self.n, self.estimator = check_positive("lr", lr), sigma, n_samples, estimator
        self.gen = torch.Generator(device=problem.inputs.device).manual_seed(seed)

    def step(self) -> None:
        pb = self.problem
        theta = {k: p.detach() for k, p in pb.named_params.items()}

        def g_of(params):      # the whole task loss at `params` (the model's methods and submodules see them too)
            return call_with_parameters(pb.model, params,
                                        lambda model: pb.task_from_outputs(pb.task_outputs(model), params.values()))

        n = pb.inputs.shape[0]        # the weight of this batch when the estimate is combined across ranks
        if self.estimator == "gaussian":
            g = gaussian_smoothing_grad(g_of, theta, self.sigma, self.n, baseline="antithetic",
                                        generator=self.gen, vectorize=False, n_examples=n)
        else:
            g = spsa_grad(g_of, theta, self.sigma, self.n, generator=self.gen, vectorize=False, n_examples=n)
        with torch.no_grad():
            for k, p in pb.named_params.items():
                p.sub_(self.lr * g[k])


class MeZORule(_Rule):
    """:class:`MeZO` on the task loss (in-place perturbations, two forwards per perturbation; ``lr``, ``sigma``,
    ``n_samples``, ``seed`` as there)."""

    objective = "task"

    def __init__(self, problem, lr: float = 0.1, sigma: float = 1e-2, n_samples: int = 4, seed: int = 0):
        super().__init__(problem)
        self.opt = MeZO(problem.params, lr=lr, sigma=sigma, n_samples=n_samples, seed=seed)

    def step(self) -> None:
        pb = self.problem           # (loss, n_examples): the batch's weight when MeZO combines ranks
        self.opt.step(lambda: (pb.task_from_outputs(pb.task_outputs()), pb.inputs.shape[0]))


class ShampooRule(_TorchOptim):
    """:class:`Shampoo` (``lr``, ``exponent``, ``epsilon``, ``precondition_interval``, ``grafting``, ``betas``): on
    one full batch with β₂ = 1 its first step is ``L^e G R^e`` with ``L = GGᵀ``, ``R = GᵀG`` (e = −1/4: the polar
    factor of ``G``, Muon's step without Newton–Schulz's error), scaled to the grafted base's norm."""

    def __init__(self, problem, lr: float = 0.01, exponent: float = -0.25, epsilon: float = 1e-8,
                 precondition_interval: int = 1, grafting: str = "adam", betas: tuple = (0.0, 1.0)):
        super().__init__(problem)
        self.opt = Shampoo(problem.params, lr=lr, exponent=exponent, epsilon=epsilon, betas=betas,
                           precondition_interval=precondition_interval, grafting=grafting)


class SOAPRule(_TorchOptim):
    """:class:`SOAP` (``lr``, ``betas``, ``eps``, ``weight_decay``, ``precondition_frequency``, ``eigenbasis``). SOAP's
    first call only gathers statistics and its eigenbasis; the rule then steps again on the same gradient (no extra
    pass), so its first step is Adam's first step in the eigenbasis of ``GGᵀ`` and ``GᵀG``."""

    def __init__(self, problem, lr: float = 0.01, betas: tuple = (0.95, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0, precondition_frequency: int = 10, eigenbasis: str = "qr"):
        super().__init__(problem)
        self.opt = SOAP(problem.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        precondition_frequency=precondition_frequency, eigenbasis=eigenbasis)

    def step(self) -> None:
        first = not self.opt.state
        self.opt.step(self._closure)
        if first:                    # the statistics are in; the same gradient now moves the parameters
            self.opt.step()


class MuonRule(_Rule):
    """``torch.optim.Muon`` on the problem's hidden matrices and ``torch.optim.AdamW`` on the rest
    (:func:`muon_with_adamw`: biases, embeddings and the parameters named in ``exclude``); ``lr``, ``momentum``,
    ``adamw_lr``, ``weight_decay``, ``nesterov``. ``rule.opt`` is the Muon optimizer (``None`` without a matrix),
    ``rule.opt_rest`` the AdamW one."""

    def __init__(self, problem, lr: float = 0.02, momentum: float = 0.95, adamw_lr: float = 0.01,
                 weight_decay: float = 0.0, nesterov: bool = True, exclude: tuple = ()):
        super().__init__(problem)
        self.opt, self.opt_rest = muon_with_adamw(problem.model, lr=lr, momentum=momentum, adamw_lr=adamw_lr,
                                                  weight_decay=weight_decay, exclude=exclude,
                                                  nesterov=check_bool("nesterov", nesterov))

    def step(self) -> None:
        self._closure()
        for opt in (self.opt, self.opt_rest):
            if opt is not None:
                opt.step()


@dataclass
class RuleSpec:
    """A registered rule: its class, default hyperparameters, a one-line description and what it wraps (the classes
    and functions whose defaults :data:`~taskloss.harness.rules.DEFAULT_OVERRIDES` compares it with)."""

    name: str
    cls: Callable[..., Any]
    defaults: dict = field(default_factory=dict)
    description: str = ""
    wraps: tuple = ()

    @property
    def objective(self) -> str:
        """``"surrogate"`` or ``"task"``: the loss the rule descends."""
        return getattr(self.cls, "objective", "surrogate")

    def unsupported(self, problem: Problem, trial: bool = False) -> str | None:
        """Why the rule cannot run on ``problem`` (``None``: it can).

        Args:
            problem: the problem.
            trial: for a rule that sets ``needs_trial`` and states no reason of its own, also build it (with its
                defaults) on a deep copy of the problem and take one step there; an error is the reason. The copy
                keeps the problem and the global random state untouched.

        Returns:
            The reason, or ``None``.
        """
        check = getattr(self.cls, "unsupported", None)
        reason = check(problem) if callable(check) else None
        if reason is None and trial and getattr(self.cls, "needs_trial", False):
            reason = _trial_step(self, problem)
        return reason


def _trial_step(spec: RuleSpec, problem: Problem) -> str | None:
    """Build ``spec``'s rule on a deep copy of ``problem`` and step it once; the error's message, or ``None``."""
    dev = problem.inputs.device
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        copy_ = copy.deepcopy(problem)
        stage = "building it"
        try:
            rule = spec.cls(copy_, **spec.defaults)
            stage = "one step"
            rule.step()
        except Exception as e:  # noqa: BLE001 — any failure means the rule does not run here; the message says why
            return f"{stage} on a copy of the problem failed: {type(e).__name__}: {str(e)[:300]}"
    return None


RULES: dict[str, RuleSpec] = {}

#: Every default of a rule that differs from the default of the class or function it wraps, as
#: ``{rule: {argument: (the harness's default, the wrapped one's)}}`` (``"required"``: no default there). The
#: harness's are chosen for the small problems of notebook 16_update_rule_harness (one full batch, a step compared
#: with Δθ*); ``tests/harness/test_harness_rules.py`` derives this table from the signatures and
#: ``docs/vocabulary.md`` prints it. Two arguments share a name without sharing a meaning, so they are left out: a
#: natural-gradient rule's ``fisher`` picks the matrix (the optimizer's is the callable that computes it), and the
#: MGS rule's ``lr`` scales the surrogate, centring the MLE component at −lr·∇l̃ (MGS's own ``lr``, the factor on
#: Δθ*, stays 1). Besides, the MGS rule scores candidates with ``parallel=False, eval_mode=False`` (exact pass
#: counts on the module as it is), and the curvature rules add the problem's weight decay to ``damping``.
DEFAULT_OVERRIDES: dict[str, dict[str, tuple]] = {
    "sgd": {"lr": (0.1, 0.001)},
    "momentum": {"lr": (0.1, 0.001), "momentum": (0.9, 0)},
    "adam": {"lr": (0.01, 0.001)},
    "clipped_sgd": {"lr": (0.1, "required"), "gamma": (1.0, math.inf)},
    "grad_penalty": {"lr": (0.1, 0.001)},
    "newton": {},
    "natural_exact": {"lr": (1.0, 0.1), "damping": (0.0001, 0.0)},
    "natural_empirical": {"lr": (1.0, 0.1), "damping": (0.0001, 0.0)},
    "kfac": {"damping": (0.01, 0.001), "fisher_type": ("exact", "mc"), "decay": (0.0, 0.95),
             "inverse_update_interval": (1, 10), "lr": (0.1, 0.001)},
    "diag_fisher": {"fisher_type": ("exact", "mc"), "decay": (0.0, 0.95), "lr": (0.1, 0.001)},
    "diag_empirical": {"fisher_type": ("empirical", "mc"), "power": (0.5, 1.0), "decay": (0.0, 0.95),
                       "lr": (0.1, 0.001)},
    "hessian_free": {"damping": (0.001, 1.0), "cg_iters": (10, 20), "adapt_damping": (False, True)},
    "mgs": {"n_samples": (8, 4), "max_update_norm": (None, 1.0), "max_grad_norm": (None, 1.0), "seed": (0, None)},
    "reinforce": {"n_samples": (8, 4), "lr": (0.1, 0.001)},
    "zo_gaussian": {"sigma": (0.01, "required"), "n_samples": (8, "required")},
    "spsa": {"sigma": (0.01, "required"), "n_samples": (8, 1)},
    "mezo": {"lr": (0.1, 0.001), "sigma": (0.01, 0.001), "n_samples": (4, 1)},
    "shampoo": {"lr": (0.01, 0.001), "epsilon": (1e-08, 1e-12)},
    "soap": {"lr": (0.01, 0.003), "weight_decay": (0.0, 0.01)},
    "muon": {"adamw_lr": (0.01, 0.001), "lr": (0.02, 0.001), "weight_decay": (0.0, 0.1)},
}
#: (rule, argument) pairs whose name the wrapped class uses for something else (see :data:`~taskloss.harness.rules.DEFAULT_OVERRIDES`)
OWN_MEANING = {("natural_exact", "fisher"), ("natural_empirical", "fisher"), ("mgs", "lr")}


def register(name: str, cls, defaults: dict | None = None, description: str = "", wraps: tuple = (), *,
             replace: bool = False) -> RuleSpec:
    """Add a rule to :data:`RULES` (replace one already registered, a built-in included, only with ``replace=True``).

    Args:
        name: the rule's name.
        cls: ``cls(problem, **hp)`` builds it and ``.step()`` applies it.
        defaults: hyperparameters that override the class's own defaults.
        description: one line.
        wraps: the classes and functions of the package (or torch) that the rule calls.
        replace: allow replacing a rule of that name for the whole process (a bool); without it a name already
            in :data:`RULES` — ``"sgd"``, say — is refused rather than silently redefined for every later table.

    Returns:
        The :class:`RuleSpec`.

    Raises:
        ValueError: an empty name, a name already registered without ``replace=True``, defaults that ``cls`` does
            not take.
        TypeError: ``cls`` is not a class whose instances have a ``step()`` method and whose ``__init__`` takes the
            problem, an ``unsupported`` that is not callable, defaults that are not a dict, a description that is
            not a string, ``wraps`` that holds something not callable.
    """
    replace = check_bool("replace", replace)
    if not isinstance(name, str) or not name:
        raise ValueError("rule name must be a non-empty string")
    if name in RULES and not replace:
        raise ValueError(f"a rule named {name!r} is already registered ({RULES[name].cls.__name__}): pick another "
                         "name, or pass replace=True to redefine it for the whole process")
    if not inspect.isclass(cls) or not callable(getattr(cls, "step", None)):
        raise TypeError(f"cls must be a class whose instances have a step() method (cls(problem, **hp).step() takes "
                        f"one step), got {type(cls).__name__} {getattr(cls, '__name__', cls)!r}")
    if "unsupported" in dir(cls) and not callable(getattr(cls, "unsupported")):
        raise TypeError("cls.unsupported must be callable: unsupported(problem) -> reason or None")
    if defaults is not None and not isinstance(defaults, dict):
        raise TypeError(f"defaults must be a dict of hyperparameters, got {type(defaults).__name__}")
    sig = inspect.signature(cls.__init__)
    params = list(sig.parameters.values())[1:]          # after self
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            inspect.Parameter.VAR_POSITIONAL):
        raise TypeError(f"{cls.__name__}.__init__ must take the problem as its first argument")
    named = {p.name for p in params[1:]}
    unknown = sorted(set(defaults or {}) - named) if not takes_any else []
    if unknown:
        raise ValueError(f"defaults {unknown} are not arguments of {cls.__name__}.__init__ (it takes {sorted(named)})")
    if not isinstance(description, str):
        raise TypeError(f"description must be a str, got {type(description).__name__}")
    wraps = (wraps,) if callable(wraps) else tuple(wraps)
    if not all(callable(w) for w in wraps):
        raise TypeError("wraps must hold the classes and functions the rule calls")
    RULES[name] = RuleSpec(name, cls, dict(defaults or {}), description, wraps)
    return RULES[name]


def make_rule(name: str, problem: Problem, **hp):
    """Build the registered rule ``name`` on ``problem`` (``hp`` overrides its defaults). Raises ``ValueError`` for an
    unknown rule or one that does not apply to ``problem`` (the reason named)."""
    if not isinstance(name, str) or name not in RULES:
        raise ValueError(f"unknown rule {name!r}; registered: {sorted(RULES)}")
    spec = RULES[name]
    reason = spec.unsupported(problem)
    if reason is not None:
        raise ValueError(f"rule {name!r} does not apply to this {type(problem).__name__}: {reason}")
    return spec.cls(problem, **{**spec.defaults, **hp})


def applicable_rules(problem: Problem, trial: bool = True) -> list[str]:
    """Names of the registered rules that apply to ``problem``, in registration order.

    A rule applies when it states no reason against the problem (``unsupported``) and — for a rule whose support
    depends on the model's autograd (``needs_trial``: Newton, the natural gradients, K-FAC, the diagonal Fishers,
    Hessian-free, the gradient penalty) — when one step with its defaults on a copy of the problem succeeds, so a
    model the rule cannot build on (a layer K-FAC does not know, more parameters than a dense matrix allows) or step
    (no double backward, no forward-mode AD through its attention) is not listed. :func:`inapplicable_rules` gives
    the reasons.

    Args:
        problem: the problem.
        trial: run the trial steps (``False``: the stated reasons only, no computation).

    Returns:
        The rule names.

    Raises:
        TypeError: ``problem`` is not a :class:`~taskloss.harness.problem.Problem`; ``trial`` not a bool.
    """
    reasons = inapplicable_rules(problem, trial)
    return [n for n in RULES if n not in reasons]


def inapplicable_rules(problem: Problem, trial: bool = True) -> dict[str, str]:
    """``{rule: why it does not apply to problem}`` for the registered rules that do not (see :func:`applicable_rules`).

    Args:
        problem: the problem.
        trial: run the trial steps of the rules that need one.

    Returns:
        The reasons, in registration order.

    Raises:
        TypeError: ``problem`` is not a :class:`~taskloss.harness.problem.Problem`; ``trial`` not a bool.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a taskloss.harness Problem, got {type(problem).__name__}")
    trial = check_bool("trial", trial)
    out = {}
    for n, spec in RULES.items():
        reason = spec.unsupported(problem, trial)
        if reason is not None:
            out[n] = reason
    return out


_TORCH_SGD = torch.optim.SGD
for _n, _c, _d, _t, _w in [
    ("sgd", SGD, {}, "torch.optim.SGD", (_TORCH_SGD,)),
    ("momentum", Momentum, {}, "torch.optim.SGD(momentum=0.9)", (_TORCH_SGD,)),
    ("adam", Adam, {}, "torch.optim.Adam", (torch.optim.Adam,)),
    ("clipped_sgd", Clipped, {}, "taskloss.dynamics ClippedSGD (hard, global)", (ClippedSGD,)),
    ("grad_penalty", GradPenalty, {}, "SGD on l̃ + μ‖∇l̃‖² (taskloss.dynamics gradient_norm_penalty)", (_TORCH_SGD,)),
    ("newton", Newton, {}, "dense Hessian (torch.func), newton_direction", ()),
    ("natural_exact", NaturalGradient, {"fisher": "exact"}, "NaturalGradientDescent, exact Fisher",
     (NaturalGradientDescent,)),
    ("natural_empirical", NaturalGradient, {"fisher": "empirical"}, "NaturalGradientDescent, empirical Fisher",
     (NaturalGradientDescent,)),
    ("kfac", KFACRule, {}, "SGD preconditioned by KFAC (exact factors)", (KFAC, _TORCH_SGD)),
    ("diag_fisher", DiagonalFisher, {"fisher_type": "exact"}, "SGD / exact GGN diagonal",
     (FisherDiagonalPreconditioner, _TORCH_SGD)),
    ("diag_empirical", DiagonalFisher, {"fisher_type": "empirical", "power": 0.5},
     "SGD / sqrt of the empirical Fisher diagonal", (FisherDiagonalPreconditioner, _TORCH_SGD)),
    ("hessian_free", HessianFreeRule, {}, "HessianFree, truncated CG on the GGN", (HessianFree,)),
    ("mgs", MGSRule, {}, "MGS, SNIS with the MLE-guided mixture proposal", (MGS,)),
    ("reinforce", Reinforce, {}, "SGD on classification_reinforce", (classification_reinforce, _TORCH_SGD)),
    ("zo_gaussian", ZerothOrder, {"estimator": "gaussian"}, "Gaussian smoothing, antithetic",
     (gaussian_smoothing_grad,)),
    ("spsa", ZerothOrder, {"estimator": "spsa"}, "SPSA", (spsa_grad,)),
    ("mezo", MeZORule, {}, "MeZO", (MeZO,)),
    ("shampoo", ShampooRule, {}, "Shampoo, L^-1/4 G R^-1/4 grafted onto Adam's norm", (Shampoo,)),
    ("soap", SOAPRule, {}, "SOAP, Adam in the eigenbasis of Shampoo's factors", (SOAP,)),
    ("muon", MuonRule, {}, "torch.optim.Muon on hidden matrices, AdamW on the rest",
     (muon_with_adamw, torch.optim.Muon, torch.optim.AdamW)),
]:
    register(_n, _c, _d, _t, wraps=_w)
