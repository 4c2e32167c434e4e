"""Shaded-text rendering of token attributions."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from taskloss.attribution import plot_tokens, token_colors, tokens_html  # noqa: E402


def test_colors_are_signed_and_scaled_to_the_largest_score():
    c = token_colors([0.5, -1.0, 0.0, 0.25])
    assert [a for _, a in c] == [0.5, 1.0, 0.0, 0.25]
    assert c[0][0] == c[2][0] == c[3][0] != c[1][0]
    assert [a for _, a in token_colors([0.0, 0.0])] == [0.0, 0.0]


def test_html_escapes_tokens_and_carries_scores():
    out = tokens_html(["<b>", "x&y"], [1.0, -0.5], title="t")
    assert "&lt;b&gt;" in out and "x&amp;y" in out and "<b>t</b>" in out
    assert 'title="+1.0000"' in out and 'title="-0.5000"' in out and out.count("<span") == 2


def test_plot_draws_one_text_per_token_and_wraps():
    fig, ax = plt.subplots()
    plot_tokens(ax, ["alpha", "beta", "gamma", "delta"], [1.0, 0.2, -0.3, 0.0], chars_per_line=12)
    texts = ax.texts
    assert [t.get_text() for t in texts] == ["alpha", "beta", "gamma", "delta"]
    assert len({round(t.get_position()[1], 6) for t in texts}) == 2      # wrapped onto two lines
    plt.close(fig)
