"""taskloss — the gap between the loss we train and the metric we evaluate.

The package tree is the repository's table of contents: one subpackage per method family, each named after
what it holds, each ``__init__`` naming its notebooks (``notebooks/NN_topic.py``) and its public names. The
numbers after each entry are the notebooks that import it (a test derives them from the notebooks' imports).

- :mod:`taskloss.sampling`   — optimization as sampling an update: SNIS, proposals, ε-ball and Newton limits (01, 02, 18)
- :mod:`taskloss.search`     — MLE-guided parameter search, REINFORCE and group policy gradients, zeroth-order
  estimators (02–05, 17, 18)
- :mod:`taskloss.curvature`  — Fisher/GGN, CG and Hessian-free, diagonal Fisher, K-FAC, natural gradient,
  the Gaussian exponential family (06–08, 17)
- :mod:`taskloss.losses`     — task losses and metrics, the EMO loss, distribution-level text quality (02, 03, 05, 09,
  16, 17, 18)
- :mod:`taskloss.contrastive` — InfoNCE with in-batch negatives, exact two-pass gradient accumulation, the
  all-gather across ranks, MiniLM fine-tuning for retrieval (10, 17)
- :mod:`taskloss.models`     — Transformer LM (Post-LN, Pre-LN, RealFormer), LSTM/RNN LM, MLP, small CNN (03, 06,
  07, 09, 11–16, 18)
- :mod:`taskloss.lm`         — decoding, the causal-LM adapter, completion tasks, the pretrained small LM (04, 09, 13,
  15, 16)
- :mod:`taskloss.datasets`   — digits, the no-download corpus and WikiText reader, the tokenizer, MiniLM (02, 03,
  05–07, 09, 11–16)
- :mod:`taskloss.attribution` — integrated gradients (Riemann and Gauss–Legendre rules, baselines, token embeddings),
  the randomization sanity check (15, 17)
- :mod:`taskloss.dynamics`   — gradient clipping and (L0, L1)-smoothness probes, gradient-norm penalties, the modified
  loss of a finite step and its flows (11, 12)
- :mod:`taskloss.gradflow`   — gradient flow through time and depth: exact Jacobian-vs-lag probes of recurrent
  networks, attention entropy and gradient norms by layer, an LM-training harness (13, 14)
- :mod:`taskloss.harness`    — every update rule behind one interface, counted passes, the ideal update Δθ* with its
  Monte Carlo error, training to an equal pass budget, a causal LM with a sequence task loss (16)
- :mod:`taskloss.results`    — the results API of notebooks: records, paired comparisons, plots, headline checks (01–18)
- :mod:`taskloss.runner`     — parameters, kernels, run folders, the rerun/sweep runner (it executes the notebooks; none
  imports it)
- :mod:`taskloss.utils`      — paths, device resolution, seeding; with its two rooms :mod:`taskloss.validation`
  (how inputs are checked) and :mod:`taskloss.parameter_vectors` (parameters as flat vectors and pure functions)
  (03–05, 07, 11, 12, 14)

Dependencies point one way (a test checks that the import graph has no cycle, and that each line below lists
exactly what its subpackages import):

- ``utils``: nothing
- ``attribution``, ``curvature``, ``datasets``, ``dynamics``, ``models``, ``results``, ``sampling``: ``utils``
- ``contrastive``, ``losses``: ``datasets``, ``utils``
- ``lm``: ``datasets``, ``losses``, ``models``, ``utils``
- ``gradflow``: ``lm``, ``models``, ``utils``
- ``search``: ``curvature``, ``lm``, ``losses``, ``sampling``, ``utils``
- ``harness``: ``curvature``, ``dynamics``, ``lm``, ``sampling``, ``search``, ``utils``
- ``runner``: ``results``, ``utils``
"""
from taskloss.utils import resolve_device, seed_everything

__version__ = "0.1.0"
__all__ = ["resolve_device", "seed_everything", "__version__"]
