"""Token attributions shown as shaded text: as HTML (for a notebook) and as a matplotlib figure.

Derived in notebook 15_integrated_gradients. Each token gets a background whose opacity is ``|score| / max|score|``
of its sequence (red for a positive contribution to the explained output, blue for a negative one), so shades
compare tokens within one sequence, not across sequences.
"""
from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import torch

from taskloss.validation import all_finite, check_not_meta

__all__ = ["token_colors", "tokens_html", "plot_tokens"]

_POS, _NEG = (214, 39, 40), (31, 119, 180)       # matplotlib's tab:red and tab:blue


def _scores(scores) -> torch.Tensor:
    """``scores`` (a real tensor, array or list of numbers) as a flat float64 tensor; clear errors otherwise."""
    if isinstance(scores, torch.Tensor):
        check_not_meta("scores", scores)
        if scores.is_complex():
            raise TypeError(f"scores must be real, got dtype {scores.dtype}")
        return scores.detach().to("cpu", torch.float64).reshape(-1)
    arr = np.asarray(scores) if isinstance(scores, (list, tuple, np.ndarray)) else None
    if arr is None or arr.dtype.kind not in "fiub":
        raise TypeError(f"scores must be a real tensor, array or list of numbers, got {type(scores).__name__}"
                        f"{'' if arr is None else f' of dtype {arr.dtype}'}")
    return torch.as_tensor(arr.astype(np.float64)).reshape(-1)


def token_colors(scores) -> list[tuple[tuple[int, int, int], float]]:
    """``[(rgb, opacity)]`` per score: red for ≥ 0, blue for < 0, opacity ``|s| / max|s|`` (0 when all are 0)."""
    s = _scores(scores)
    if s.numel() == 0:
        raise ValueError("scores is empty")
    if not all_finite(s):
        raise ValueError("scores contain NaN or inf")
    top = float(s.abs().max())
    return [(_POS if v >= 0 else _NEG, abs(float(v)) / top if top > 0 else 0.0) for v in s]


def _check(tokens: Sequence[str], scores) -> list:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be a sequence of strings")
    colors = token_colors(scores)
    if len(colors) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(colors)} scores")
    return colors


def tokens_html(tokens: Sequence[str], scores, title: str | None = None) -> str:
    """An HTML ``<div>`` with one shaded ``<span>`` per token (its score in the hover title)."""
    colors = _check(tokens, scores)
    vals = _scores(scores).tolist()
    spans = [f'<span title="{v:+.4f}" style="background-color: rgba({r},{g},{b},{a:.3f}); padding: 1px 2px; '
             f'margin: 0 1px; border-radius: 3px">{html.escape(t)}</span>'
             for t, v, ((r, g, b), a) in zip(tokens, vals, colors)]
    head = f"<b>{html.escape(title)}</b> " if title else ""
    return f'<div style="line-height: 1.9; font-family: monospace">{head}{"".join(spans)}</div>'


def plot_tokens(ax, tokens: Sequence[str], scores, fontsize: float = 10.0, chars_per_line: int | None = None) -> None:
    """Draw the tokens as shaded boxes on ``ax`` (axes off), left to right in a monospace font, wrapping after
    ``chars_per_line`` characters (``None``: as many as fit the axes' width, a monospace character being taken
    as 0.6 em wide); the axes' height is split evenly between the lines."""
    colors = _check(tokens, scores)
    char_w = 0.6 * fontsize / 72                                   # inches per character
    if chars_per_line is None:
        width_in = ax.get_position().width * ax.figure.get_figwidth()
        chars_per_line = max(1, int(width_in / char_w))
    if not isinstance(chars_per_line, int) or chars_per_line < 1:
        raise ValueError(f"chars_per_line must be a positive int, got {chars_per_line!r}")
    ax.set_axis_off()
    places, col, row = [], 0, 0
    for tok in tokens:
        width = len(tok) + 1
        if col and col + width > chars_per_line:
            col, row = 0, row + 1
        places.append((col, row))
        col += width
    n_lines = row + 1
    for tok, (c, r), ((red, g, b), a) in zip(tokens, places, colors):
        ax.text(c / chars_per_line, 1 - (r + 0.5) / n_lines, tok, ha="left", va="center", fontsize=fontsize,
                family="monospace",
                bbox=dict(boxstyle="round,pad=0.2", facecolor=(red / 255, g / 255, b / 255, a), edgecolor="none"))
