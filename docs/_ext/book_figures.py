"""Figures of the book's chapters and their captions.

A figure's caption is the Markdown under it: the Markdown output that follows the image in the same cell
(``taskloss.results.plotting.show`` writes one, ``*What to see:* …``), or, for the last figure of a cell, the
Markdown cell right after it when that cell opens in emphasis (``*What to see:* …``, ``*Figure: …*``,
``*Left: …*``) — the convention of the notebooks. Bold prose (``**Reading the tables.** …``) is not a caption.

The build gives every figure its caption as alt text (MyST-NB would write the image's file name) and marks the
caption as one (class ``taskloss-caption``, styled in _static/book.css). ``tests/docs`` checks that every figure of
every committed notebook has a caption.
"""
from __future__ import annotations

import re

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform

IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
ALT_KEY = "taskloss_figure_alt"          # cell metadata the page generator writes: one alt text per image


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else (source or "")


def is_caption(markdown: str) -> bool:
    """Markdown that opens in emphasis (one ``*`` or ``_``, not bold)."""
    text = markdown.lstrip()
    return bool(re.match(r"[*_](?![*_\s])", text))


def figure_captions(nb) -> list[tuple[int, int, str | None]]:
    """(cell index, output index, caption Markdown or None) of every image output of the notebook."""
    cells = nb["cells"]
    out = []
    for ci, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        images = [i for i, o in enumerate(outputs) if any(m in o.get("data", {}) for m in IMAGE_MIMES)]
        for k, i in enumerate(images):
            end = images[k + 1] if k + 1 < len(images) else len(outputs)
            caption = None
            for o in outputs[i + 1:end]:
                if "text/markdown" in o.get("data", {}):
                    md = _text(o["data"]["text/markdown"])
                    caption = md if is_caption(md) else None
                    break
            last = k == len(images) - 1
            if caption is None and last and ci + 1 < len(cells) and cells[ci + 1]["cell_type"] == "markdown":
                md = _text(cells[ci + 1]["source"])
                caption = md.split("\n\n")[0] if is_caption(md) else None
            out.append((ci, i, caption))
    return out


def alt_text(caption: str) -> str:
    """A caption as plain text for an ``alt`` attribute: emphasis, code and math markers dropped, one line."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", caption)          # links keep their text
    text = re.sub(r"[*_`$]|\\(?=[a-zA-Z])", "", text)
    return " ".join(text.split())


def add_alt_metadata(nb) -> None:
    """Store each code cell's figure alt texts (in image order) in its metadata, for the transform below."""
    per_cell: dict[int, list[str]] = {}
    for ci, _, caption in figure_captions(nb):
        per_cell.setdefault(ci, []).append(alt_text(caption) if caption else "")
    for ci, alts in per_cell.items():
        nb["cells"][ci]["metadata"][ALT_KEY] = alts


class FigureAltText(SphinxPostTransform):
    """Alt text from the caption for every image of a notebook cell, and the caption output marked as one. Runs
    after MyST-NB has chosen each output's MIME type (priority 4)."""
    default_priority = 20

    def run(self, **kwargs) -> None:
        for cell in self.document.findall(nodes.container):
            if cell.get("nb_element") != "cell_code":
                continue
            alts = (cell.get("cell_metadata") or {}).get(ALT_KEY)
            if not alts:
                continue
            images = list(cell.findall(nodes.image))
            for image, alt in zip(images, alts):
                if alt:
                    image["alt"] = alt
            for image in images:         # the Markdown output right after a figure (its sibling) is its caption
                caption = image.next_node(descend=False, siblings=True)
                if isinstance(caption, nodes.paragraph) and caption.children and \
                        isinstance(caption[0], nodes.emphasis):
                    caption["classes"].append("taskloss-caption")


def setup(app: Sphinx) -> dict:
    app.add_post_transform(FigureAltText)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
