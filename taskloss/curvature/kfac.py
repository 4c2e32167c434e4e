"""K-FAC: Kronecker-factored approximate curvature for ``nn.Linear``, ``nn.Conv2d`` and ``transformers``' ``Conv1D``
as a gradient preconditioner.

After Martens & Grosse, "Optimizing Neural Networks with Kronecker-factored Approximate Curvature" (ICML 2015) and
Grosse & Martens, "A Kronecker-factored approximate Fisher matrix for convolution layers" (ICML 2016). Derived in
notebook 07_fisher_approximations. The maths (rows, factors, inverses, preconditioning, and the plain step
:func:`~taskloss.curvature.kfac_math.kfac_precondition_reference`) is in :mod:`taskloss.curvature.kfac_math`; the
factors and their inverses are a state object, :class:`~taskloss.curvature.kfac_factors.KroneckerFactors`, and the
gradient side another, :class:`~taskloss.curvature.kfac_gradients.LayerGradients`, both owned by :class:`KFAC` and
built with the layers they cover; this module holds the shell (hooks, running averages, intervals, checkpoints).

For a layer ``s = W a`` (bias as a homogeneous coordinate: ``a ← [a, 1]``, ``W ← [W, b]``) the per-example weight
gradient is ``g aᵀ`` with ``g = ∂ℓ/∂s``, and the layer's Fisher block is approximated by ``A ⊗ G`` (acting on the
row-major flattening of ``[W, b]`` as ``G ⊗ A``), with ``A = E[a aᵀ]`` and ``G = E[g gᵀ]`` estimated on the batch and
averaged over steps. Conv2d and Linear layers applied to sequences ``[N, T, D]``: ``a`` are the input patches /
tokens and ``g`` the output gradients at each of the ``L`` locations ("expand" convention, as curvlinops'
``KFACType.EXPAND``): ``A = (1/NL) Σ_{n,l} a aᵀ``, ``G = (1/n_terms) Σ_{n,l} g gᵀ``. A layer whose weight is frozen
but whose bias trains gets the bias-only block ``G`` (``a = 1``). Scale: the curvature of the batch-mean NLL (see
:mod:`taskloss.curvature.fisher`, whose :func:`~taskloss.curvature.fisher.curvature_scale` converts to libraries
that take a loss module) — so ``G`` uses per-term gradients ``g`` (not the ``1/N``-scaled ones of the mean) over
``n_terms`` loss terms: ``N`` for outputs ``[N, C]``, ``N·T`` for per-token outputs ``[N, T, C]``.

Models no one here wrote (Hugging Face GPT-2, Llama, BERT): which modules are covered, which keep their plain
gradients and why — embeddings, normalization scales, and a tied weight, whose gradient sums its uses and is never
rewritten with one use's factors — is :mod:`taskloss.curvature.kfac_coverage` (``print(kfac.coverage)``). Inputs
may be a mapping of keyword tensors, outputs a ``ModelOutput`` (``.logits``); labels equal to ``ignore_index`` and
padding (the attention mask) leave the factors as :mod:`taskloss.curvature.kfac_terms` states (``masked_rows``
chooses the ``-100`` convention). The batch structure is read from the tensors each layer sees: a layer whose rows
are the outputs' positions flattened (OPT's ``fc1`` / ``fc2`` see ``[N·T, D]``) has them read back as ``[N, T, D]``,
and one whose rows match neither the batch nor the positions is refused with its shapes. A train-mode
Dropout / BatchNorm in the forward the statistics come from is refused, as by the Fisher functions. Float16 /
bfloat16 models get float32 factors, inverses and preconditioning (the gradients are cast back). Under
``torch.compile`` the hooks run eagerly (a graph break per layer on the forward passes that compute factors), so
the factors equal the uncompiled ones.

Fisher types for ``G`` (explicit, ``fisher_type``):

* ``"mc"``: ``g`` back-propagated from labels sampled from the model's predictive distribution ``p(y | f)``
  (``n_samples`` draws; K-FAC proper, unbiased for the true Fisher);
* ``"empirical"``: ``g`` from the observed targets (the empirical Fisher — biased, see notebook 07);
* ``"exact"``: the ``C`` columns of ``H_out^{1/2}`` are back-propagated (the "type-2" Fisher; exact for one example).

Cost between refreshes: the forward hooks are attached only while the next ``update_statistics`` computes factors
(a forward pass in between runs hook-free and the call only counts); ``precondition_`` gathers all gradients into one
flat buffer, preconditions each layer's view of it and scatters the result back in a handful of kernel launches. A
factor update draws the MC labels and forms ``softmax − onehot`` from one softmax, and folds each batch moment into
its running average with one in-place ``addmm`` (:func:`~taskloss.curvature.kfac_math.fold_moment`); a
convolution's ``A`` is built from channels-last patches (:func:`~taskloss.curvature.kfac_math.input_moment`).
``benchmarks/bench_curvature.py`` measures the step against its FLOP floor and against curvlinops.

Usage (the hooks belong to the ``KFAC`` object: ``remove()`` them, or use it as a context manager)::

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with KFAC(model, damping=1e-3, fisher_type="mc", kl_clip=1e-2, optimizer=opt) as kfac:
        for x, y in batches:
            out = model(x)                           # forward hooks record layer inputs/outputs
            loss = nll_loss(out, y)                  # batch-mean NLL (taskloss.curvature.fisher convention)
            kfac.update_statistics(x, y, outputs=out)   # G-backward (retains the graph) → running factors
            opt.zero_grad(); loss.backward()
            kfac.precondition_()                     # .grad ← (A ⊗ G + λ)⁻¹ .grad (inverses every T_inv calls)
            opt.step()

A Hugging Face causal LM (keyword batch, ``-100`` labels; ``model.eval()``: dropout is refused)::

    kfac = KFAC(gpt2, optimizer=opt)
    print(kfac.coverage)                             # the Conv1D layers; wte / tied lm_head, norms: plain gradients
    out = gpt2(**batch)                              # batch = {"input_ids": ..., "attention_mask": ...}
    loss = nll_loss(out, labels)                     # labels [B, T]: the next tokens, -100 where there is none
    kfac.update_statistics(batch, labels, outputs=out)   # padding and -100 labels leave both factors
"""
from __future__ import annotations

import math
import sys
import warnings
import weakref
from typing import Mapping

import torch
from torch import Tensor, nn

from taskloss.curvature.distributed import (
    all_reduce_sum,
    check_process_group,
    failing_fast,
    pack_symmetric,
    refuse_sharded,
    unpack_symmetric,
    world_size,
)
from taskloss.curvature.fisher import IGNORE_INDEX, LIKELIHOODS
from taskloss.curvature.kfac_coverage import KFACCoverage, find_layers
from taskloss.curvature.kfac_factors import DAMPING_MODES, KroneckerFactors
from taskloss.curvature.kfac_gradients import LayerGradients
from taskloss.curvature.kfac_math import input_moment, second_moment
from taskloss.curvature.kfac_terms import factor_rows, loss_terms, output_cotangents, padding_mask
from taskloss.curvature.model_io import (
    HALF,
    check_inputs,
    model_logits,
)
from taskloss.validation import (
    check_bool,
    check_generator,
    check_int,
    check_not_meta,
    check_positive,
    check_probability,
    random_modules,
    train_mode_error,
)

__all__ = ["KFAC"]


def _remove_handles(handles: list) -> None:
    for h in handles:
        h.remove()
    handles.clear()


_HYPER = ("decay", "factor_update_interval", "inverse_update_interval", "eigenbasis_update_interval", "kl_clip",
          "trust_region")
#: The default bound on the preconditioned gradient's squared length in the damped K-FAC metric (``trust_region``).
DEFAULT_TRUST_REGION = 1.0


class KFAC:
    """K-FAC preconditioner: ``kfac.update_statistics(inputs, targets)`` folds a batch into the factors and
    ``kfac.precondition_()`` rewrites ``.grad`` with ``(A ⊗ G + λ)⁻¹ .grad``; any optimizer then steps.

    Not a ``torch.optim.Optimizer``: it moves no parameter, it transforms the gradients that an optimizer of the
    caller's choice (SGD with momentum, Adam, …) applies — so its verb is ``precondition_()``, not ``step()``, and
    learning rates and their schedules live in that optimizer (the KL clip reads them from it at every call). Its
    statistics come in as :class:`~taskloss.curvature.diagonal.FisherDiagonalPreconditioner`'s do,
    ``update_statistics(inputs, targets)``; ``outputs=`` passes the forward already run on ``inputs`` (with grad
    enabled, while the hooks record) instead of running one more.

    Args:
        model: the network (or its ``torch.compile`` wrapper); every ``nn.Linear`` / ``nn.Conv2d`` / ``Conv1D``
            with trainable parameters is preconditioned, except a parameter shared between modules (tied
            embeddings), which keeps its plain gradient. Embeddings and vector-only modules (norms) keep theirs by
            default; any other module owning trainable parameters raises ``ValueError`` unless
            ``skip_unsupported=True`` (then its gradients are left untouched). Every module left alone is listed in
            ``self.skipped`` and, with its reason, in ``self.coverage``.
        damping: Tikhonov damping λ > 0 (an attribute; a new value is checked on assignment and at the next
            ``precondition_``, which refreshes the inverses for it). The default 1e-3, with the default trust
            region, beats plain SGD on the digits MLP at SGD's usual rates (``tests/curvature/test_kfac_defaults.py``).
            On language models tune it with the learning rate: on the tiny LMs of notebook 17 (section 6) the
            tuned λ was 0.01–0.1, never 1e-3, and whether K-FAC + SGD then beats tuned AdamW depended on the family
            and the number of steps.
        damping_mode: ``"eigen"`` inverts ``A ⊗ G + λI`` exactly
            through the factors' eigendecompositions; ``"pi"`` uses the factored ``(A + π√λ I) ⊗ (G + √λ/π I)``
            with ``π = sqrt((tr A / dim A) / (tr G / dim G))`` (the K-FAC paper's π-heuristic).
        fisher_type: ``"mc"`` | ``"empirical"`` | ``"exact"`` (see the module docstring).
        likelihood: ``"categorical"`` (outputs are logits) or ``"gaussian"`` (outputs are means of N(f, I)).
        decay: running-average weight of old factors, ``F ← decay·F + (1 − decay)·F_batch`` (0 → batch only).
        factor_update_interval: recompute factors in every k-th ``update_statistics`` call.
        inverse_update_interval: recompute the eigendecompositions / inverses in every k-th ``precondition_`` call.
        eigenbasis_update_interval: ``"eigen"`` mode only, a multiple of ``inverse_update_interval`` (default:
            equal to it). Between eigendecompositions the inverse refreshes keep the eigenbases and re-estimate the
            eigenvalues as ``diag(Qᵀ F Q)`` of the current factors (EKFAC-style rescaling, one matmul per factor
            instead of an ``eigh``).
        kl_clip: if set, scale the step by ``ν = min(1, sqrt(kl_clip / Σ lr² gᵀF⁻¹g))`` with each parameter's
            *current* learning rate read from ``optimizer.param_groups`` at every call (so schedules are followed).
        trust_region: on by default (1.0): scale the step by ``ν = min(1, sqrt(trust_region / Σ gᵀF⁻¹g))``, so
            that the preconditioned gradient ``v = F⁻¹g`` (``F`` the damped K-FAC matrix) has ``vᵀFv ≤
            trust_region`` — a KL bound of ``lr²·trust_region / 2`` on the step ``lr·v`` that needs no learning rate,
            so it works without ``optimizer=``. It is what keeps the default damping from exploding the step where
            the curvature is tiny (``λ = 1e-3`` divides the gradient by up to 1000 there): on notebook 17's digits
            MLP the unclipped defaults diverge at SGD's usual rates 0.01–0.1, with it they beat plain SGD at 0.1.
            ``None`` turns it off (the plain K-FAC step, as curvlinops computes it). A ``kl_clip``, which reads
            the learning rate, replaces it.
        optimizer: the ``torch.optim`` optimizer that applies the gradients (needed by ``kl_clip``).
        n_samples: MC labels per example.
        generator: the generator drawing them (checkpointed; without one the global RNG is used, which the caller
            checkpoints).
        skip_unsupported: see ``model``.
        ignore_index: the categorical label of a loss term that does not count (``update_statistics``' targets).
        masked_rows: the ``-100`` convention, for a position whose label is ``ignore_index`` inside real tokens.
            ``"drop"`` (default): its row leaves a layer's ``A`` (and ``G``) where no gradient flows through it in
            that layer (the output layer and the last block there), and stays where gradient does flow (lower
            layers, through attention to later positions). The factors then average over the rows that shape the
            gradient being preconditioned: a row whose ``g`` is exactly zero adds nothing to the Fisher block
            ``E[a aᵀ ⊗ g gᵀ]``, and putting its ``a aᵀ`` into ``A`` would only dilute ``A`` with inputs the
            gradient never sees. ``"keep"``: every computed position is a row of ``A`` — curvlinops' convention (its
            K-FAC equals this one to float rounding then); use it to compare with curvlinops. ``G`` is normalized by
            the loss terms that count in both. Padding (the attention mask) leaves both factors in both modes.
        process_group: the ``torch.distributed`` ranks whose batches make one batch (``None``: the default group
            when ``torch.distributed`` is initialized, else this process alone). See "Across ranks" below.

    Across ranks (``torch.distributed``, the model wrapped in ``DistributedDataParallel`` or not): the hooks see
    each rank's local batch; every factor update sums each layer's local moments ``Σ aaᵀ``, ``Σ ggᵀ`` (their upper
    triangles) and their row and term counts into one buffer per dtype and all-reduces it once (:mod:`taskloss.curvature.distributed`), so
    the factors are those of one process on the concatenated batch, an uneven last batch and masks included. The
    all-reduce leaves the same bits on every rank: each rank forms the (identical) inverses itself, no inverse is
    communicated, and with DDP's averaged gradients the step is the same on every rank. For DDP's gradient to be
    the concatenated batch's mean when the ranks hold unequal batches, scale the local loss as
    ``loss_sum_r · world / N_total`` (DDP divides the summed gradients by the world size). ``"mc"`` labels are
    drawn by each rank's own generator (seed them differently per rank, or the ranks draw correlated labels).
    Sharded parameters (FSDP, ``fully_shard``) are refused with ``ValueError``: a factor needs a layer's whole
    weight gradient. ``update_statistics`` is then a collective: every rank calls it in every step, and every rank
    needs at least one loss term per factor update. A rank that cannot form its statistics (no loss term left, NaN /
    inf, shapes that do not match) does not leave the others waiting in the all-reduce: the ranks agree on a status
    first (:func:`~taskloss.curvature.distributed.failing_fast`) and every rank raises the same
    :class:`~taskloss.curvature.distributed.RankFailure` naming it.

    The state is composed, not inherited: ``factors`` (:class:`~taskloss.curvature.kfac_factors.KroneckerFactors`:
    ``factors.A``, ``factors.G``, ``factors.inverses``) and ``gradients``
    (:class:`~taskloss.curvature.kfac_gradients.LayerGradients`; attribute ``use_flat_buffers``, default True:
    ``False`` runs ``precondition_`` layer by layer instead of through the flat gradient buffer — the same matmuls,
    only the KL clip's ``Σ vᵀg`` summed in another order).

    ``state_dict()`` / ``load_state_dict()`` hold the factors, inverses / eigenbases, counters, damping and
    hyperparameters and the generator's state: a restored object continues bit-identically.

    Raises:
        TypeError: a bad model, generator or flag.
        ValueError: bad arguments (a meta-device model); NaN/inf in a gradient or a factor (at ``precondition_``); a
            non-positive damping.
    """

    FISHER_TYPES = ("mc", "empirical", "exact")
    MASKED_ROWS = ("drop", "keep")
    DAMPING_MODES = DAMPING_MODES

    def __init__(self, model: nn.Module, *, damping: float = 1e-3, fisher_type: str = "mc",
                 likelihood: str = "categorical", decay: float = 0.95, factor_update_interval: int = 1,
                 inverse_update_interval: int = 10, eigenbasis_update_interval: int | None = None,
                 damping_mode: str = "eigen", kl_clip: float | None = None,
                 trust_region: float | None = DEFAULT_TRUST_REGION,
                 optimizer: torch.optim.Optimizer | None = None, n_samples: int = 1,
                 generator: torch.Generator | None = None, skip_unsupported: bool = False,
                 ignore_index: int = IGNORE_INDEX, masked_rows: str = "drop", process_group=None):
        if not isinstance(model, nn.Module):
            raise TypeError("model must be an nn.Module")
        check_not_meta("the model", model)
        refuse_sharded(model, "KFAC")
        self.process_group = check_process_group(process_group)
        self.ignore_index = check_int("ignore_index", ignore_index)
        if masked_rows not in self.MASKED_ROWS:
            raise ValueError(f"masked_rows must be one of {self.MASKED_ROWS}, got {masked_rows!r}")
        self.masked_rows = masked_rows
        if fisher_type not in self.FISHER_TYPES:
            raise ValueError(f"fisher_type must be one of {self.FISHER_TYPES}, got {fisher_type!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if damping_mode not in self.DAMPING_MODES:
            raise ValueError(f"damping_mode must be one of {self.DAMPING_MODES}, got {damping_mode!r}")
        check_generator("generator", generator)
        check_bool("skip_unsupported", skip_unsupported)
        self.damping = damping
        self.decay = decay
        self.factor_update_interval = factor_update_interval
        self.inverse_update_interval = inverse_update_interval
        self.eigenbasis_update_interval = eigenbasis_update_interval or inverse_update_interval
        self.kl_clip = kl_clip
        self.trust_region = trust_region
        self._check_hyperparameters()
        if self.eigenbasis_update_interval != self.inverse_update_interval and damping_mode != "eigen":
            raise ValueError("eigenbasis_update_interval applies to damping_mode='eigen' only")
        if kl_clip is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError("kl_clip needs optimizer= (the torch.optim optimizer whose param_groups hold the "
                             "current learning rates)")
        self.optimizer = optimizer
        self.n_samples = check_int("n_samples", n_samples, minimum=1)
        if fisher_type != "mc" and n_samples != 1:
            raise ValueError("n_samples > 1 only makes sense for fisher_type='mc'")
        self.model, self.fisher_type, self.likelihood = model, fisher_type, likelihood
        self.damping_mode, self.generator = damping_mode, generator
        # a compiled model (torch.compile) runs its original module, whose layers carry the hooks
        self._module = model._orig_mod if isinstance(getattr(model, "_orig_mod", None), nn.Module) else model
        # the trained parameters of every layer (None where frozen, shared or absent), and what is left alone
        self.layers, self._coverage = find_layers(self._module, skip_unsupported)
        self.modules = {layer.name: layer.module for layer in self.layers}
        self.skipped = list(self._coverage.skipped)
        if self._coverage.unable:
            warnings.warn("K-FAC cannot precondition " + "; ".join(f"{n!r} ({r})" for n, r in
                                                                   self._coverage.unable.items())
                          + ". print(kfac.coverage) lists every module and what happens to it", stacklevel=2)
        self._random = random_modules(self._module)   # Dropout / BatchNorm: refused in train mode, as everywhere
        self._forward_error: str | None = None
        self._checked: tuple | None = None
        self._flattened: set[str] = set()
        self._lead: tuple = ()
        if optimizer is not None:
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            missing = [layer.name for layer in self.layers for p in layer.params if id(p) not in owned]
            if missing:
                raise ValueError(f"layers {sorted(set(missing))} have parameters the optimizer does not hold")
        self.factors = KroneckerFactors(self.layers, damping_mode)
        self.gradients = LayerGradients(self.layers)
        self._inputs: dict[str, list[Tensor]] = {n: [] for n in self.modules}
        self._outputs: dict[str, list[Tensor]] = {n: [] for n in self.modules}
        self._n_updates = self._n_steps = 0
        self._handles: list = []
        self._removed = False
        self._finalizer = weakref.finalize(self, _remove_handles, self._handles)  # no hook outlives its owner
        self._sync_hooks()

    @property
    def coverage(self) -> KFACCoverage:
        """Which modules are preconditioned, which keep their plain gradients and why, and the fraction of the
        model's trainable parameters covered (:class:`~taskloss.curvature.kfac_coverage.KFACCoverage`;
        ``print(kfac.coverage)`` shows a table)."""
        return self._coverage

    # ------------------------------------------------------------------------------------ hyperparameters
    @property
    def damping(self) -> float:
        """The Tikhonov damping λ > 0 (checked on assignment)."""
        return self._damping

    @damping.setter
    def damping(self, value: float) -> None:
        self._damping = check_positive("damping", value)

    def _check_hyperparameters(self) -> None:
        check_positive("damping", self._damping)
        if check_probability("decay", self.decay) == 1.0:
            raise ValueError("decay must be < 1")
        check_int("factor_update_interval", self.factor_update_interval, minimum=1)
        check_int("inverse_update_interval", self.inverse_update_interval, minimum=1)
        check_int("eigenbasis_update_interval", self.eigenbasis_update_interval, minimum=1)
        if self.eigenbasis_update_interval % self.inverse_update_interval:
            raise ValueError(f"eigenbasis_update_interval ({self.eigenbasis_update_interval}) must be a multiple of "
                             f"inverse_update_interval ({self.inverse_update_interval})")
        if self.kl_clip is not None:
            check_positive("kl_clip", self.kl_clip)
        if self.trust_region is not None:
            check_positive("trust_region", self.trust_region)

    @property
    def factor_update_interval(self) -> int:
        """Factors are recomputed in every k-th ``update_statistics`` call."""
        return self._factor_update_interval

    @factor_update_interval.setter
    def factor_update_interval(self, value: int) -> None:
        self._factor_update_interval = value  # checked with the other hyperparameters (at construction, step)
        if hasattr(self, "_handles"):
            self._sync_hooks()

    # ------------------------------------------------------------------------------------------ recording
    def _sync_hooks(self) -> None:
        """Hooks are attached only while the next ``update`` computes factors: between factor updates a forward
        pass runs without them (nothing is recorded, no hook is called)."""
        t = self._factor_update_interval
        want = not self._removed and not (isinstance(t, int) and t >= 1 and self._n_updates % t)
        if want and not self._handles:
            if "torch._dynamo" in sys.modules:   # torch.compile may trace the hooks: make their eager twin now
                _eager_record()
            ref = weakref.ref(self)
            self._handles += [m.register_forward_hook(_Hook(ref, n)) for n, m in self.modules.items()]
            # each forward of the whole model starts a fresh record (an evaluation pass simply replaces it)
            self._handles.append(self._module.register_forward_pre_hook(_Hook(ref)))
        elif not want and self._handles:
            _remove_handles(self._handles)
            self._clear()

    def remove(self) -> None:
        """Remove the hooks (also done on leaving a ``with`` block and when the object is garbage-collected)."""
        self._removed = True
        _remove_handles(self._handles)
        self._clear()

    def __enter__(self) -> "KFAC":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def _clear(self):
        for n in self.modules:
            self._inputs[n].clear()
            self._outputs[n].clear()

    def _output_cotangents(self, out: Tensor, targets: Tensor | None, valid: Tensor | None = None) -> Tensor:
        """Per-term output-space vectors ``V [K, n_terms, C]`` (:func:`~taskloss.curvature.kfac_terms.output_cotangents`
        with this object's Fisher type, likelihood, samples and generator)."""
        return output_cotangents(out, targets, valid, self.fisher_type, self.likelihood, self.n_samples,
                                 self.generator)

    def update_statistics(self, inputs=None, targets: Tensor | None = None, *, outputs=None,
                          mask: Tensor | None = None) -> None:
        """Fold this batch's factors into the running averages (every ``factor_update_interval``-th call).

        Args:
            inputs: the batch the model sees: a tensor ``[N, ...]`` (``model(inputs)``) or a mapping of keyword
                tensors (``model(**inputs)``, a Hugging Face batch); may be ``None`` when ``outputs`` are given.
            targets: observed labels ``[N, ...]`` ids (categorical; ``ignore_index`` marks a term that does not
                count) or ``[N, ..., C]`` (gaussian); needed for ``"empirical"``, checked for shape otherwise.
            outputs: the model's outputs on ``inputs`` from the forward pass just run with grad enabled (the hooks
                recorded it): ``[N, C]``, or per-token ``[N, T, C]`` (any ``[N, ..., C]``: every position is a loss
                term, as curvlinops flattens them), or a ``ModelOutput`` holding them as ``.logits``; still attached
                to the graph. Without it the call runs the model on ``inputs`` itself — only on the calls that
                compute factors.
            mask: the padding mask ``[N, T]`` (1 = a real token; default: ``inputs["attention_mask"]`` of a
                mapping). Padded positions are neither loss terms nor rows of either factor in any layer whose input
                is laid out ``[N, T, D]``.

        Masked terms (padding, labels equal to ``ignore_index``): their output vectors are zero (no MC label is
        drawn for them) and ``G`` is normalized by the terms left. A position without a loss term still enters a
        layer's ``A`` and ``G`` when gradient flows through it there (a causal LM's prompt in the lower layers); where
        none does (the output layer at that position), its row is left out of ``A`` as well.

        The extra backward uses ``retain_graph=True`` and does not touch ``.grad``. The forward hooks are attached
        only before a call that computes factors (the others only count), so the checks that every layer ran once
        on this batch are made on those calls.

        Raises:
            TypeError: bad types.
            ValueError: bad shapes or values (outputs not attached to the graph, batch sizes that differ), a
                train-mode Dropout / BatchNorm in the forward the statistics come from (the policy of the Fisher
                functions: call ``model.eval()``).
            RuntimeError: the hooks were removed, or a layer did not run exactly once on the batch.
        """
        try:
            with failing_fast("KFAC.update_statistics", self.process_group):
                if not (isinstance(inputs, (Tensor, Mapping)) or (inputs is None and outputs is not None)):
                    raise TypeError(f"inputs must be a torch.Tensor or a mapping of keyword tensors (or None with "
                                    f"outputs=), got {type(inputs).__name__}")
                if self._removed:
                    raise RuntimeError("this KFAC's hooks were removed (remove() or the end of its with-block); create a "
                                       "new one to record")
                if self._n_updates % self.factor_update_interval != 0:  # no factors this call: nothing was recorded
                    self._n_updates += 1
                    return
                n = None if inputs is None else check_inputs(inputs, half=True, finite=False)
                if outputs is None:
                    error = train_mode_error(self._random, type(self._module).__name__)
                    if error is not None:
                        raise ValueError(error)
                    with torch.enable_grad():
                        outputs = self.model(**inputs) if isinstance(inputs, Mapping) else self.model(inputs)
                elif self._forward_error is not None:
                    raise ValueError(self._forward_error)
                outputs = model_logits(outputs, "outputs")
                if n is not None and outputs.ndim >= 1 and outputs.shape[0] != n:
                    raise ValueError(f"outputs have batch size {outputs.shape[0]}, inputs {n}")
                self._update(outputs, targets, mask, inputs)
        finally:
            self._clear()  # drop the recorded activations (and their graph) whatever happened
            self._sync_hooks()

    def _update(self, outputs: Tensor, targets: Tensor | None, mask, inputs) -> None:
        if not isinstance(outputs, Tensor) or outputs.ndim < 2:
            raise ValueError("outputs must be a tensor of shape [N, C] (or per-token [N, T, C])")
        if not outputs.requires_grad:
            raise ValueError("outputs must be attached to the autograd graph (computed with grad enabled)")
        counts = {n: len(v) for n, v in self._outputs.items()}
        if any(c != 1 for c in counts.values()):
            raise RuntimeError(f"each K-FAC layer must be called exactly once per update (calls: {counts}); pass the "
                               "outputs of one forward pass of the model with grad enabled, or none")
        n = outputs.shape[0]
        self._flattened = self._flattened_layers(outputs)
        self._lead = tuple(outputs.shape[:-1])
        pad = padding_mask(mask, inputs, n)
        flat, flat_targets, valid = loss_terms(outputs, targets, pad, self.likelihood, self.ignore_index)
        names = list(self.modules)
        s_list = [self._outputs[k][0] for k in names]
        cot = self._output_cotangents(flat, flat_targets, valid).to(outputs.dtype)    # [K, n_terms, C]
        if outputs.ndim > 2:
            cot = cot.reshape(cot.shape[0], *outputs.shape)
        if cot.shape[0] == 1:
            grads = [g.unsqueeze(0) if g is not None else None for g in
                     torch.autograd.grad(outputs, s_list, cot[0], retain_graph=True, allow_unused=True)]
        else:  # K backward passes at once (vmapped over the cotangents)
            grads = torch.autograd.grad(outputs, s_list, cot, retain_graph=True, allow_unused=True,
                                        is_grads_batched=True)
        n_terms = flat.shape[0] if valid is None else int(valid.sum())
        term_mask = None if valid is None else valid.reshape(outputs.shape[:-1])
        self._fold_factors(names, grads, n_terms, term_mask, pad)
        self._n_updates += 1  # counted once the factors are folded in (a call that raised changes nothing)

    def _flattened_layers(self, outputs: Tensor) -> set[str]:
        """The layers whose recorded tensors do not lead with the batch dimension but hold the outputs' positions
        flattened or reshaped (OPT's ``fc1`` / ``fc2`` see ``[N·T, D]``): their rows are read back in the outputs'
        layout ``[N, T, …]``. The batch structure is read from the tensors each layer saw, not assumed.

        Raises:
            ValueError: a layer whose rows match neither the outputs' batch nor their positions."""
        lead, flattened = tuple(outputs.shape[:-1]), set()
        for layer in self.layers:
            s = self._outputs[layer.name][0]
            if s.shape[0] == lead[0]:
                continue
            if not isinstance(layer.module, nn.Conv2d) and len(lead) > 1 and math.prod(s.shape[:-1]) == math.prod(lead):
                flattened.add(layer.name)
                continue
            raise ValueError(f"layer {layer.name!r} saw outputs of shape {tuple(s.shape)}: neither the batch size "
                             f"{lead[0]} nor the {math.prod(lead)} positions of the model's outputs {tuple(lead)} "
                             "lead them, so K-FAC cannot tell which example each row belongs to. Freeze that layer "
                             "(requires_grad_(False)) or pass the outputs of the forward pass the hooks recorded")
        return flattened

    @torch.no_grad()
    def _fold_factors(self, names: list[str], grads, n_terms: int, terms: Tensor | None,
                      pad: Tensor | None) -> None:
        unused = [k for k, g in zip(names, grads) if g is None]
        if unused:
            raise ValueError(f"outputs do not depend on layers {unused}: the outputs must come from the forward pass "
                             "the hooks recorded (with grad enabled)")
        rows = self._factor_rows(grads, terms, pad)
        if world_size(self.process_group) > 1:
            self._fold_across_ranks(rows, n_terms)
            return
        for layer, (g, a) in zip(self.layers, rows):
            # folded into the running averages in place (one addmm per factor; the first batch starts them)
            self.factors.fold(layer, g.reshape(-1, g.shape[-1]), n_terms, a, self.decay)

    def _factor_rows(self, grads, terms: Tensor | None, pad: Tensor | None) -> list[tuple[Tensor, Tensor]]:
        """Per layer, the output gradients ``[K, R, out]`` (``K`` draws of ``R`` rows) and the input they go with,
        the masked rows left out."""
        rows = []
        for layer, g in zip(self.layers, grads):
            a = self._inputs[layer.name][0]
            if layer.name in self._flattened:     # rows of the outputs' positions, flattened: back in their layout
                a, g = a.reshape(*self._lead, a.shape[-1]), g.reshape(g.shape[0], *self._lead, g.shape[-1])
            if isinstance(layer.module, nn.Conv2d):
                g = g.movedim(2, -1)                                                   # [K, N, H, W, C_out]
            elif terms is not None or pad is not None:
                keep = factor_rows(a, g, terms, pad, self.masked_rows)
                if keep is not None:
                    if not bool(keep.any()):
                        raise ValueError(f"layer {layer.name!r}: no row is left after masking")
                    a = a.reshape(-1, a.shape[-1])[keep]
                    g = g.reshape(g.shape[0], -1, g.shape[-1])[:, keep]
            rows.append((g.reshape(g.shape[0], -1, g.shape[-1]), a))
        return rows

    def _fold_across_ranks(self, rows: list[tuple[Tensor, Tensor]], n_terms: int) -> None:
        """Each layer's moment sums ``Σ ggᵀ``, ``R·A_local`` and row counts ``R`` of this rank, summed over the ranks in
        one all-reduce (per dtype), folded as the moments of the concatenated batch: ``ΣS / Σn``. The moments are
        symmetric: only their upper triangles travel (:func:`~taskloss.curvature.distributed.pack_symmetric`)."""
        sums, counts = [], [float(n_terms)]
        for layer, (g, a) in zip(self.layers, rows):
            g = g.float() if g.dtype in HALF else g          # float16 / bfloat16: moments in float32, as in fold()
            sums.append(second_moment(g.reshape(-1, g.shape[-1]), 1))
            if layer.weight is not None:
                a = a.float() if a.dtype in HALF else a
                sums.append(input_moment(layer.module, a, layer.bias is not None).mul_(g.shape[1]))
                counts.append(float(g.shape[1]))           # A's rows: one per location (R of the K·R rows of g)
        total = all_reduce_sum([pack_symmetric(m) for m in sums] + [sums[0].new_tensor(counts)], self.process_group)
        counts = total[-1].tolist()
        if counts[0] <= 0:  # (unreachable: a rank without terms fails fast before the all-reduce)
            raise ValueError("no loss term on any rank (every label is ignore_index or padding)")
        moments, c = iter(unpack_symmetric(t, m.shape[0]) for t, m in zip(total[:-1], sums)), 1
        for layer in self.layers:
            G = next(moments).div_(counts[0])
            if layer.weight is not None:
                A, c = next(moments).div_(counts[c]), c + 1
            else:
                A = None
            self.factors.fold_moments(layer, A, G, self.decay)

    # ------------------------------------------------------------------------------------------ the gradients
    @property
    def use_flat_buffers(self) -> bool:
        """Whether ``precondition_`` runs through the flat gradient buffer (else layer by layer)."""
        return self.gradients.use_flat_buffers

    @use_flat_buffers.setter
    def use_flat_buffers(self, value: bool) -> None:
        self.gradients.use_flat_buffers = check_bool("use_flat_buffers", value)

    def precondition_(self) -> float:
        """Rewrite ``.grad`` of every K-FAC layer with ``(A ⊗ G + λ)⁻¹ grad`` (times ν under ``kl_clip``).

        The inverses are refreshed every ``inverse_update_interval``-th call (eigenbases every
        ``eigenbasis_update_interval``-th), and when the damping changed.

        Returns:
            The clip factor ν (1 without ``kl_clip`` and ``trust_region``, or where neither bound is reached).

        Raises:
            RuntimeError: no statistics yet.
            ValueError: NaN/inf gradients or factors, an invalid (changed) hyperparameter.
        """
        if not self.factors.A:
            raise RuntimeError("call update_statistics(inputs, targets) at least once before precondition_()")
        hyper = (self._damping, self.decay, self.factor_update_interval, self.inverse_update_interval,
                 self.eigenbasis_update_interval, self.kl_clip, self.trust_region)
        if hyper != self._checked:  # attributes may have been changed since the last check
            self._check_hyperparameters()
            self._checked = hyper
        if self._n_steps % self.inverse_update_interval == 0 or not self.factors.inverses:
            self.factors.refresh(self._damping, new_basis=self._n_steps % self.eigenbasis_update_interval == 0)
        elif self._damping != self.factors.inverse_damping:
            self.factors.set_damping(self._damping)
        self._n_steps += 1
        groups = self.optimizer.param_groups if self.kl_clip is not None else None
        trust = self.trust_region if self.kl_clip is None else None   # a KL clip (it knows the lr) replaces it
        return self.gradients.precondition_(self.factors, self.kl_clip, groups, trust)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Factors, inverses / eigenbases, counters, damping, hyperparameters and generator state (copies)."""
        factors = self.factors.state_dict()
        return {
            "layers": list(self.modules),
            "config": {"fisher_type": self.fisher_type, "likelihood": self.likelihood,
                       "damping_mode": self.damping_mode, "masked_rows": self.masked_rows},
            "A": factors["A"], "G": factors["G"], "inv": factors["inv"],
            "damping": self._damping, "inv_damping": factors["inv_damping"],
            "n_updates": self._n_updates, "n_steps": self._n_steps,
            "hyper": {h: getattr(self, h) for h in _HYPER},
            "generator": None if self.generator is None else self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (checked against this object's layers and configuration).

        Args:
            state: what :meth:`state_dict` returned.

        Raises:
            ValueError: a state of other layers, configuration, factor shapes or generator use.
        """
        if not isinstance(state, dict) or not {"A", "G", "inv", "config", "layers"} <= state.keys():
            raise ValueError("not a KFAC state_dict")
        mine = {"fisher_type": self.fisher_type, "likelihood": self.likelihood, "damping_mode": self.damping_mode,
                "masked_rows": self.masked_rows}
        if "masked_rows" not in state["config"]:   # saved before the option existed: the default then
            state = {**state, "config": {**state["config"], "masked_rows": "drop"}}
        if state["config"] != mine:
            raise ValueError(f"state_dict was saved with {state['config']}, this KFAC has {mine}")
        if set(state["layers"]) != set(self.modules):
            raise ValueError(f"state_dict holds layers {sorted(state['layers'])}, this KFAC {sorted(self.modules)}")
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError("state_dict and this KFAC disagree on whether a generator is used")
        self.factors.load_state_dict({k: state[k] for k in ("A", "G", "inv", "inv_damping")})
        for h, v in state["hyper"].items():
            setattr(self, h, v)
        self.damping = state["damping"]
        self._check_hyperparameters()
        self._n_updates, self._n_steps = state["n_updates"], state["n_steps"]
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        self._sync_hooks()

    def to_dense(self) -> Tensor:
        """Block-diagonal K-FAC matrix ``[P, P]`` (no damping) in the order of ``model.named_parameters()``
        restricted to the K-FAC layers' trainable parameters (per layer: weight flattened row-major, then bias)."""
        return self.factors.to_dense()


class _Hook:
    """Forward hook of a K-FAC layer (``name``) recording input and output for its owner, or, with ``name=None``, the
    model's pre-hook starting a fresh record (and noting whether the forward runs a train-mode Dropout / BatchNorm).
    The owner is held weakly: no reference cycle keeps it alive.

    Under ``torch.compile`` the hook is not traced (it runs eagerly between compiled graphs, a graph break per
    recorded layer on the forward passes that compute factors): a traced hook would record an intermediate of the
    fused graph, which its outputs do not depend on through autograd."""

    def __init__(self, owner_ref, name=None):
        self.owner_ref, self.name = owner_ref, name

    def __call__(self, mod, inputs, output=None):
        if torch.compiler.is_compiling():
            return _eager_record()(self, mod, inputs, output)
        return self.record(mod, inputs, output)

    def record(self, mod, inputs, output=None):
        owner = self.owner_ref()
        if owner is None:
            return
        if self.name is None:
            owner._clear()
            owner._forward_error = train_mode_error(owner._random, type(owner._module).__name__)
        elif torch.is_grad_enabled() and output.requires_grad:
            owner._inputs[self.name].append(inputs[0].detach())
            owner._outputs[self.name].append(output)


_EAGER: list = []


def _eager_record():
    """:meth:`_Hook.record` excluded from ``torch.compile`` tracing (``torch.compiler.disable``), made once."""
    if not _EAGER:
        _EAGER.append(torch.compiler.disable(_Hook.record, recursive=True))
    return _EAGER[0]
