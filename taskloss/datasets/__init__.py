"""Data that ships with the machine: 8×8 digits with fixed splits, a no-download English corpus built from
Python's own prose (and a WikiText reader), MiniLM's WordPiece tokenizer cut to a corpus, and offline
MiniLM token and sentence embeddings.

Sources, licenses and builds: ``data/README.md``.

Notebooks: 02_importance_sampling_and_mgs, 03_metric_optimization_classification, 05_policy_gradient_vs_zeroth_order,
06_natural_gradient, 07_fisher_approximations, 09_emo_loss, 11_gradient_clipping,
12_implicit_gradient_regularization, 13_recurrent_gradients, 14_realformer, 15_integrated_gradients,
16_update_rule_harness.

Modules:

- :mod:`~taskloss.datasets.digits`            — 8×8 digits with fixed train/valid/test splits
- :mod:`~taskloss.datasets.corpus`            — the corpus, LM blocks, prefix/continuation pairs, WikiText
- :mod:`~taskloss.datasets.stdlib_corpus`     — builds the corpus from Python's prose in an isolated interpreter
- :mod:`~taskloss.datasets.tokenizer`         — MiniLM's WordPiece tokenizer restricted to a corpus
- :mod:`~taskloss.datasets.minilm`            — MiniLM token and sentence embeddings, offline
"""
from taskloss.datasets.corpus import (
    CACHE_DIR,
    MAX_UNK_RATE,
    SPLITS,
    Document,
    UnknownTokenWarning,
    corpus_hash,
    corpus_stats,
    get_tokenizer,
    lm_blocks,
    load_corpus,
    load_documents,
    prefix_continuations,
    unigram_perplexity,
)
from taskloss.datasets.digits import (
    N_CLASSES,
    N_DIGITS,
    N_FEATURES,
    SPLIT_FRACTIONS,
    DigitsSplits,
    digits_images,
    indices_checksum,
    load_digits_splits,
    split_indices,
)
from taskloss.datasets.minilm import load_minilm, minilm_token_embeddings, sentence_embeddings
from taskloss.datasets.tokenizer import DEFAULT_MIN_COUNT, SPECIAL_TOKENS, Tokenizer, minilm_path

__all__ = [
    "DigitsSplits", "load_digits_splits", "digits_images", "split_indices", "indices_checksum", "N_DIGITS",
    "N_FEATURES", "N_CLASSES", "SPLIT_FRACTIONS", "SPLITS", "CACHE_DIR", "MAX_UNK_RATE", "UnknownTokenWarning",
    "Document", "load_documents",
    "load_corpus", "corpus_hash", "corpus_stats", "get_tokenizer", "lm_blocks", "prefix_continuations",
    "unigram_perplexity", "Tokenizer", "minilm_path", "SPECIAL_TOKENS", "DEFAULT_MIN_COUNT", "load_minilm",
    "minilm_token_embeddings", "sentence_embeddings",
]
