"""taskloss — the gap between the loss we train and the metric we evaluate.

One module per method family; each module's docstring names the notebook (``notebooks/NN_topic.py``) that
derives it:

- :mod:`taskloss.sampling`         — optimization as sampling an update; self-normalized importance sampling (01)
- :mod:`taskloss.proposals`        — Gaussian, uniform-ball and Gaussian-mixture proposals (01, 02)
- :mod:`taskloss.ball`             — the ε-ball update in closed form: partition function, Bessel ratios (01)
- :mod:`taskloss.mgs`              — MLE-guided parameter search, the ``MGS`` optimizer step (02–04)
- :mod:`taskloss.mgs_core`         — MGS proposal density, importance weights, ESS, per-candidate seeds (02)
- :mod:`taskloss.mgs_scoring`      — scoring MGS candidates: one vmap, vmapped forward, or a loop (02–04)
- :mod:`taskloss.metrics`          — task losses: accuracy, macro-F1, edit distance, repetition, BLEU, … (02–05)
- :mod:`taskloss.sequence_tasks`   — text completion scored by sequence task losses (04)
- :mod:`taskloss.causal_lm`        — one interface over causal LMs, KV-cached greedy decoding that vmaps (04)
- :mod:`taskloss.policy_gradient`  — REINFORCE: sampling outputs, scored by a task loss (03–05)
- :mod:`taskloss.zeroth_order`     — zeroth-order optimization: sampling parameters, Gaussian smoothing (03, 05)
- :mod:`taskloss.natural_gradient` — the natural-gradient step, trust region, Gaussian KL and Fisher (06)
- :mod:`taskloss.gaussian_family`  — Gaussian exponential family, Bonnet / Price gradients, natural Gaussian VI (08)
- :mod:`taskloss.curvature`        — Fisher, GGN (dense, diagonal, matrix-free), conjugate gradients (06, 07)
- :mod:`taskloss.second_order`     — Hessian-free optimizer, diagonal-Fisher preconditioner (07)
- :mod:`taskloss.kfac`             — K-FAC preconditioner (07)
- :mod:`taskloss.emo`              — earth mover distance loss for language models (09)
- :mod:`taskloss.text_quality`     — distribution-level quality of generated text: frontier score, MMD² (09)
- :mod:`taskloss.data`             — 8×8 digits with fixed train/valid/test splits (03, 05–07)
- :mod:`taskloss.text`             — no-download corpus, LM blocks, prefix/continuation pairs, pretrained LM (04, 09)
- :mod:`taskloss.stdlib_corpus`    — builds the default corpus from Python's own prose (for :mod:`taskloss.text`)
- :mod:`taskloss.tokenizer`        — MiniLM's WordPiece tokenizer cut to a corpus' vocabulary (04, 09)
- :mod:`taskloss.minilm`           — MiniLM token and sentence embeddings, offline (09)
- :mod:`taskloss.models`           — Transformer / RNN LMs, MLP, small CNN (03, 04, 06, 07, 09)
- :mod:`taskloss.generation`       — batched decoding and sequence log-probabilities (03–05, 09)
- :mod:`taskloss.notebook`         — recording results and figures of a notebook run (every notebook)
- :mod:`taskloss.params`           — reading and validating a notebook's ``parameters`` cell (runner)
- :mod:`taskloss.runs`             — running, rerunning and sweeping notebooks with papermill (``make run``)
- :mod:`taskloss.utils`            — device resolution, seeding, input validation (everywhere)
"""
from .utils import resolve_device, seed_everything  # noqa: F401

__version__ = "0.1.0"
