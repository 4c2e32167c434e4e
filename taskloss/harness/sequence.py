"""A sequence problem for the update-rule harness: a causal LM fine-tuned on text completion, whose surrogate is
the teacher-forced token NLL of reference continuations and whose task loss is a sequence task loss of its greedy
continuations.

Derived in notebook 16_update_rule_harness (the completion task itself in 04_sequence_task_losses).

:class:`SequenceProblem` is a :class:`~taskloss.harness.problem.Problem` whose ``inputs`` are prefixes ``[B, P]``
and ``targets`` reference continuations ``[B, C]`` (a :class:`~taskloss.lm.completion.CompletionBatch`), so every
rule sees the interface it already calls:

* ``surrogate()`` — :func:`~taskloss.lm.completion.window_nll` of prefix ⊕ reference (teacher forcing, pads and
  tokens after the reference's EOS skipped), what gradient rules descend and what MGS centres its proposal on;
* ``task_outputs(call)`` — the greedy continuations ``[B, T]`` (:func:`~taskloss.lm.causal_lm.greedy_decode`,
  key/value cached; ``call`` runs the model, e.g. at other parameters through ``functional_call``);
* ``task_from_outputs(hyp)`` — the mean per-sequence task loss of :class:`~taskloss.lm.completion.CompletionTask`
  (e.g. ``edit_distance+repetition``), lower is better; MGS, MeZO and the zeroth-order rules minimize it;
* ``sequence_reinforce_loss(...)`` — the REINFORCE surrogate of :func:`~taskloss.search.policy_gradient.sequence_reinforce`
  (sampled continuations, reward = −task loss, leave-one-out baseline).

**How passes are counted.** The counted module is the LM's output layer (``counted_module``): every evaluation of
the model ends in exactly one call of it, whatever path computed the hidden states (a teacher-forced window, a
cached decoding step, the sampling loop of :func:`~taskloss.lm.generation.generate`). So one forward is one
next-token evaluation over the B rows of the batch: a teacher-forced window counts 1 forward (and its gradient 1
backward); a greedy decoding of T tokens counts **T forwards** — the prefill of the prefix and T − 1 cached
steps of one new position each, attending to a growing context; S sampled continuations per prefix count S·T
(the :class:`~taskloss.harness.problem.PassCounter` weights a call by its rows over B). A cached step costs far
fewer FLOPs than a full window, so the pass axis overstates decoding and the CPU seconds are the other axis.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from taskloss.harness.problem import Problem
from taskloss.lm.causal_lm import CausalLM, greedy_decode
from taskloss.lm.completion import CompletionBatch, CompletionTask, window_nll
from taskloss.search.policy_gradient import sequence_reinforce
from taskloss.validation import check_generator, check_int

__all__ = ["SequenceProblem"]


class SequenceProblem(Problem):
    """A completion problem for the harness (see the module docstring).

    Args:
        model: a :class:`~taskloss.lm.causal_lm.CausalLM`, or a taskloss ``TransformerLM`` / Hugging Face causal LM
            (wrapped in one; parameters shared, not copied). Decode and fine-tune it in eval mode (no dropout) for
            a deterministic task loss.
        batch: the :class:`~taskloss.lm.completion.CompletionBatch` (prefixes ``[B, P]``, references ``[B, C]``
            padded with ``task.pad_id``); its ``blocks`` are not used.
        task: the :class:`~taskloss.lm.completion.CompletionTask` (task-loss terms, ``decode_len`` T, EOS/pad ids).

    Raises ``TypeError`` on a wrong model/batch/task type and ``ValueError`` on an empty batch, mismatched batch
    sizes or token ids outside the vocabulary.
    """

    def __init__(self, model: nn.Module, batch: CompletionBatch, task: CompletionTask):
        if not isinstance(task, CompletionTask):
            raise TypeError(f"task must be a taskloss.lm CompletionTask, got {type(task).__name__}")
        if not isinstance(batch, CompletionBatch):
            raise TypeError(f"batch must be a taskloss.lm CompletionBatch, got {type(batch).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.task = task
        super().__init__(model if isinstance(model, CausalLM) else CausalLM(model), batch.prefixes, batch.refs)

    def __post_init__(self):
        super().__post_init__()
        for name, t in (("prefixes", self.inputs), ("refs", self.targets)):
            if t.ndim != 2 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"{name} must be a [B, T] integer tensor, got {t.dtype} {tuple(t.shape)}")
            if bool((t < 0).any()) or bool((t >= self.model.vocab_size).any()):
                raise ValueError(f"{name} holds token ids outside [0, {self.model.vocab_size})")

    # -- what the rules call ---------------------------------------------------------------------------------
    @property
    def counted_module(self) -> nn.Module:
        """The module whose calls count as passes, here the LM's output layer (one call per next-token evaluation)."""
        lm = self.model.lm
        return lm.get_output_embeddings() if self.model.kind == "hf" else lm.head

    @property
    def batch(self) -> CompletionBatch:
        """The problem's batch as a :class:`~taskloss.lm.completion.CompletionBatch`."""
        return CompletionBatch(self.inputs, self.targets)

    def surrogate_from_outputs(self, outputs, params=None):
        """Refused: a sequence problem's surrogate is a function of the model (:meth:`surrogate`), not of outputs."""
        raise TypeError("a SequenceProblem's surrogate is a function of the model (window_nll), not of outputs; "
                        "call surrogate()")

    def surrogate(self, model: nn.Module | None = None, batch=None) -> Tensor:
        """Teacher-forced mean token NLL of prefix ⊕ reference (:func:`~taskloss.lm.completion.window_nll`)."""
        return window_nll(model or self.model, self.inputs, self.targets, self.task.pad_id, self.task.eos_id)

    def task_outputs(self, call: Callable | None = None) -> Tensor:
        """Greedy continuations ``[B, decode_len]`` of the prefixes by ``call`` (default: the model)."""
        return greedy_decode(call or self.model, self.inputs, self.task.decode_len, self.task.eos_id,
                             self.task.pad_id, cache=self.task.cache)

    def task_from_outputs(self, outputs: Tensor, params=None) -> Tensor:
        """Mean task loss of continuations ``outputs`` ``[B, T]`` against the references (0-d tensor)."""
        return self.task.per_sequence(outputs, self.targets).mean()

    def sequence_reinforce_loss(self, n_samples: int, generator: torch.Generator | None = None,
                                mle_weight: float = 0.0) -> Tensor:
        """REINFORCE surrogate of the expected task loss of ``n_samples`` sampled continuations per prefix
        (reward = −task loss, leave-one-out baseline; :func:`~taskloss.search.policy_gradient.sequence_reinforce`)
        plus ``mle_weight`` × :meth:`surrogate`. Differentiable."""
        check_int("n_samples", n_samples, minimum=2)
        check_generator("generator", generator)
        t = self.task
        res = sequence_reinforce(self.model, self.inputs, self.targets, t.per_sequence, n_samples=n_samples,
                                 max_new_tokens=t.decode_len, eos_id=t.eos_id, pad_id=t.pad_id, baseline="loo",
                                 generator=generator)
        return res.loss + mle_weight * self.surrogate() if mle_weight > 0 else res.loss

    def grad_hessian(self):
        """Refused: a dense Hessian over a Transformer is out of reach."""
        raise TypeError("a dense Hessian of a sequence problem is out of reach (P² memory over a Transformer)")

    def flat_loss(self):
        """Refused: a sequence problem has no flat surrogate of the outputs."""
        raise TypeError("a SequenceProblem has no flat surrogate of the outputs; use surrogate()")
