"""taskloss — the gap between the loss we train and the metric we evaluate.

Submodules follow the method families (each docstring names the notebook that derives it):

- :mod:`taskloss.sampling`  — optimization as sampling an update; self-normalized importance sampling (01)
- :mod:`taskloss.metrics`   — task losses: accuracy, macro-F1, edit distance, repetition, non-termination, BLEU
- :mod:`taskloss.mgs`       — MLE-guided parameter search (02–04)
- :mod:`taskloss.policy_gradient`, :mod:`taskloss.zeroth_order` — sampling outputs vs sampling parameters (05)
- :mod:`taskloss.curvature`, :mod:`taskloss.kfac` — Fisher, GGN, Hessian-free, K-FAC (06–08)
- :mod:`taskloss.emo`       — earth mover distance loss for language models (09)
- :mod:`taskloss.models`, :mod:`taskloss.data`, :mod:`taskloss.text` — shared models and data
- :mod:`taskloss.notebook`, :mod:`taskloss.runs` — recording results, running and sweeping notebooks
"""
from .utils import resolve_device, seed_everything  # noqa: F401

__version__ = "0.1.0"
