"""The notebooks as chapters: docs/chapters.yaml (what each notebook asks, follows and found, in reading order)
joined with what each committed notebook records in its metadata (``metadata["taskloss"]``: the headline results,
and where the refresh recorded them the runtime and the machine's fingerprint).

One source for three views, so that none drifts from the notebooks: the notebook table of README.md, the page of
expected results docs/results.md (both written by ``python docs/expected_results.py``) and the box under each
chapter's title in the book (docs/_ext/book_sources.py). A headline in chapters.yaml is a template:
``{key:format}`` reads the committed headline result ``key`` and ``{key.field}`` a field of a recorded paired
comparison (``effect``, ``verdict``, ``ci_low`` …) — the same fields as ``Run.say`` in a notebook.
"""
from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHAPTERS = REPO / "docs" / "chapters.yaml"
NOTEBOOKS = REPO / "notebooks"
FIELDS = ("question", "source", "headline", "scope", "sources", "findings")
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Chapter:
    stem: str              # 01_optimization_as_sampling
    question: str          # one line (README)
    source: str            # the main source, Markdown
    headline: str          # template over the committed headline results
    scope: str             # what the notebook does, in full
    sources: str           # every source, Markdown
    findings: str          # what the committed run found: a template over its recorded values, like headline

    @property
    def notebook(self) -> Path:
        return NOTEBOOKS / f"{self.stem}.ipynb"


def load_chapters(path: Path = CHAPTERS) -> list[Chapter]:
    """The chapters in reading order, each with every field of :data:`FIELDS` as a non-empty string."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path} must map notebook names to their fields")
    out = []
    for stem, entry in data.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: {stem} must be a mapping of {', '.join(FIELDS)}")
        missing = [f for f in FIELDS if not isinstance(entry.get(f), str) or not entry[f].strip()]
        extra = sorted(set(entry) - set(FIELDS))
        if missing or extra:
            raise ValueError(f"{path}: {stem} " + "; ".join(
                ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown {', '.join(extra)}"]
                                                                      if extra else [])))
        out.append(Chapter(stem=str(stem), **{f: " ".join(entry[f].split()) for f in FIELDS}))
    return out


@lru_cache(maxsize=None)
def _metadata(path: Path, mtime: float) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")).get("metadata", {}).get("taskloss", {})


def notebook_metadata(path: Path) -> dict[str, Any]:
    """``metadata["taskloss"]`` of a committed notebook ({} when it has none)."""
    return _metadata(path, path.stat().st_mtime)


class _Headline(string.Formatter):
    """``{key:fmt}`` from a dict of headline results whose keys contain ``/``; ``{key.field}`` reads a field of a
    recorded comparison."""

    def __init__(self, values: dict[str, Any], where: str):
        super().__init__()
        self.values, self.where = values, where

    def get_field(self, field_name, args, kwargs):
        if field_name in self.values:
            return self.values[field_name], field_name
        key, _, attr = field_name.rpartition(".")
        if isinstance(self.values.get(key), dict) and attr in self.values[key]:
            return self.values[key][attr], field_name
        raise KeyError(f"{self.where}: the headline template names {field_name!r}, which the committed notebook does "
                       f"not record; its headline results are {sorted(self.values)}")

    def format_field(self, value, format_spec):
        if format_spec and isinstance(value, str) and value in ("inf", "-inf", "nan"):    # JSON's non-finite numbers
            value = float(value)
        return super().format_field(value, format_spec)


def _values(chapter: Chapter) -> dict[str, Any]:
    """The committed headline results, each recorded comparison with its family-corrected fields
    (``{key.verdict_adjusted}``), and the claims as ``claim/<key>`` (``{claim/<key>.held}``)."""
    meta = notebook_metadata(chapter.notebook)
    values = dict(meta.get("headline", {}))
    for key, adjusted in (meta.get("adjusted") or {}).items():
        if isinstance(values.get(key), dict) and isinstance(adjusted, dict):
            values[key] = {**values[key], **adjusted}
    for key, claim in (meta.get("claims") or {}).items():
        values[f"claim/{key}"] = claim
    return values


def render_headline(chapter: Chapter, headline: dict[str, Any] | None = None) -> str:
    """The chapter's headline sentence with the numbers of its committed notebook."""
    values = _values(chapter) if headline is None else headline
    return _Headline(values, chapter.stem).format(chapter.headline)


def render_findings(chapter: Chapter, headline: dict[str, Any] | None = None) -> str:
    """The chapter's findings with the numbers of its committed notebook (a template, like the headline: a
    number in the text is a ``{key:format}`` field, so it cannot drift from the committed run)."""
    values = _values(chapter) if headline is None else headline
    return _Headline(values, chapter.stem).format(chapter.findings)


def _seconds(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min"


def runtime_text(meta: dict[str, Any]) -> str:
    """How long the committed run took, from ``metadata["taskloss"]["runtime"]`` (``wall_s``, ``cpu_s``,
    ``threads``): "84 s wall, 71 s CPU, 1 thread"; "not recorded" when the notebook carries no runtime."""
    rt = meta.get("runtime")
    if not isinstance(rt, dict) or not all(isinstance(rt.get(k), (int, float)) and math.isfinite(rt[k])
                                           for k in ("wall_s", "cpu_s", "threads")):
        return NOT_RECORDED
    threads = int(rt["threads"])
    return f"{_seconds(rt['wall_s'])} wall, {_seconds(rt['cpu_s'])} CPU, {threads} thread{'s' * (threads != 1)}"


def fingerprint_text(meta: dict[str, Any]) -> str:
    """The machine of the committed run, from ``metadata["taskloss"]["fingerprint"]`` ("" when not recorded)."""
    fp = meta.get("fingerprint")
    if not isinstance(fp, dict) or not fp:
        return ""
    return ", ".join(f"{k} {v}" for k, v in fp.items() if isinstance(v, (str, int, float)) and str(v))


def _number(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    return f"{v:.4g}"


def headline_rows(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) of every committed headline result, a paired comparison written as its verdict, effect,
    interval and seeds — the family-corrected verdict when the notebook's comparison table made one."""
    rows, adjusted = [], meta.get("adjusted") or {}
    for key, v in meta.get("headline", {}).items():
        if isinstance(v, dict) and "verdict" in v:
            fam = adjusted.get(key) or {}
            verdict = f"**{v['verdict']}**"
            if fam.get("verdict_adjusted"):
                verdict = (f"**{fam['verdict_adjusted']}** ({fam.get('correction', 'holm').capitalize()} across "
                           f"{fam.get('family_size', '?')} comparisons; uncorrected: {v['verdict']})")
            text = (f"{verdict}: {v.get('name', 'a')} − {v.get('baseline', 'b')} = {_number(v['effect'])} "
                    f"[{_number(v['ci_low'])}, {_number(v['ci_high'])}], {v.get('n', '?')} seeds")
        elif isinstance(v, list):
            text = ", ".join(_number(x) for x in v[:8]) + (f" … ({len(v)} values)" if len(v) > 8 else "")
        else:
            text = _number(v)
        rows.append((key, text.replace("|", "\\|")))
    return rows


def repository_url(pyproject: Path = REPO / "pyproject.toml") -> str | None:
    """The repository's GitHub address from ``[project.urls]`` (Repository, Source or Homepage), or None when
    pyproject.toml declares none — then the book links no hosted service (no address is guessed)."""
    import tomllib

    urls = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("urls", {})
    for key in ("Repository", "Source", "Homepage"):
        url = str(urls.get(key, "")).rstrip("/").removesuffix(".git")
        m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+)", url)
        if m:
            return url
    return None


def hosted_links(stem: str, repo_url: str | None) -> list[tuple[str, str]]:
    """(label, address) of the notebook on Colab and Binder — only for a known GitHub repository."""
    if not repo_url:
        return []
    path = repo_url.removeprefix("https://github.com/")
    return [("Open in Colab", f"https://colab.research.google.com/github/{path}/blob/HEAD/notebooks/{stem}.ipynb"),
            ("Launch on Binder", f"https://mybinder.org/v2/gh/{path}/HEAD?labpath=notebooks/{stem}.ipynb")]


# -- the page of expected results ------------------------------------------------------------------------------

def title(stem: str) -> str:
    """``01_optimization_as_sampling`` → ``01 · optimization as sampling``."""
    number, _, rest = stem.partition("_")
    return f"{number} · {rest.replace('_', ' ')}"


def results_page(chapters: list[Chapter], *, book: bool = False) -> str:
    """The page of every notebook's expected results: docs/results.md (``book=False``, links for a repository
    browser) or the book's page docs/notebooks/results.md (links to the chapters)."""
    out = ["# Expected results", "",
           "What each notebook finds with its default parameters (CI-sized, one CPU thread per kernel, seed 0), as "
           "committed in `notebooks/NN_topic.ipynb`, and what its full-scale runs found. Generated by "
           "`python docs/expected_results.py` from " + ("`docs/chapters.yaml`" if book else
                                                          "[`chapters.yaml`](chapters.yaml)")
           + " and the notebooks' metadata — edit those, not this page (`make test` fails while `docs/results.md` is "
             "out of date).", "",
           "A rerun on another machine reproduces the headline results within the tolerance `make test` checks "
           "(`|fresh − committed| ≤ 1e-8 + 1e-3·|committed|`, verdicts exactly); a paired comparison reads "
           "*verdict*: a − b = effect [95 % interval], over the seeds named.", ""]
    if not book:                          # (the book lists the sections in its sidebar)
        out += [f"- [{title(ch.stem)}](#{re.sub(r'[^a-z0-9 -]', '', title(ch.stem).lower()).replace(' ', '-')})"
                for ch in chapters]
    for ch in chapters:
        meta = notebook_metadata(ch.notebook)
        machine = fingerprint_text(meta)
        out += ["", f"## {title(ch.stem)}", "",
                (f"[The chapter]({ch.stem}.ipynb)" if book else
                 f"[`notebooks/{ch.stem}.ipynb`](../notebooks/{ch.stem}.ipynb) (executed, with its figures) · "
                 f"[`notebooks/{ch.stem}.py`](../notebooks/{ch.stem}.py) (the source)"), "",
                f"**Question.** {ch.scope}", "", f"**Sources.** {ch.sources}", "",
                f"**In one line.** {render_headline(ch)}.", "",
                f"**Runtime of the committed run.** {runtime_text(meta)}" + (f" ({machine})" if machine else "") + ".",
                "", "| headline result | committed value |", "|---|---|"]
        out += [f"| `{key}` | {value} |" for key, value in headline_rows(meta)]
        out += ["", f"**What the runs found.** {render_findings(ch)}"]
    return "\n".join(out) + "\n"
