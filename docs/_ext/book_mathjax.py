"""MathJax served from the site itself, so that the book's math renders without a network.

Sphinx's ``mathjax_path`` points at a CDN by default. This extension takes MathJax 3 from npm (``npm install
mathjax@3.2.2`` into ``docs/_build/mathjax``, done once; the npm registry is a package registry, like PyPI) or from
the folder named by ``TASKLOSS_MATHJAX``, copies what the CommonHTML renderer needs (``tex-chtml.js``, its fonts,
the TeX extensions it loads on demand, the menu and accessibility components) into the site's ``_static/mathjax``
and points ``mathjax_path`` there. Without npm and without a copy it stops the build with a message that says so:
a book whose math would silently need the internet is not built.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError
from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_VERSION = "3.2.2"
ENTRY = "tex-chtml.js"
# what tex-chtml.js loads at run time (relative to its folder): TeX packages autoloaded by \require or a macro,
# the CommonHTML fonts, the context menu and its accessibility and speech components
PARTS = (ENTRY, "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y", "sre", "adaptors")


def _cache_dir(confdir: Path) -> Path:
    return confdir / "_build" / "mathjax"


def find_or_install(confdir: Path) -> Path:
    """The MathJax ``es5`` folder: ``$TASKLOSS_MATHJAX``, else the npm copy in docs/_build/mathjax (installed now
    when missing). Raises ConfigError when neither exists and npm cannot install it."""
    given = os.environ.get("TASKLOSS_MATHJAX")
    if given:
        es5 = Path(given)
        if not (es5 / ENTRY).is_file():
            raise ConfigError(f"TASKLOSS_MATHJAX={given} holds no {ENTRY} (expected MathJax 3's es5 folder)")
        return es5
    cache = _cache_dir(confdir)
    es5 = cache / "node_modules" / "mathjax" / "es5"
    if (es5 / ENTRY).is_file():
        return es5
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError("MathJax is needed to render the book's math offline: install Node.js/npm (the build then "
                          f"runs `npm install mathjax@{MATHJAX_VERSION}` once) or set TASKLOSS_MATHJAX to a MathJax 3 "
                          "es5 folder")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:          # two builds at once (make book beside make test) install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (es5 / ENTRY).is_file():
            logger.info(f"installing MathJax {MATHJAX_VERSION} from npm into {cache}")
            proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(cache),
                                   f"mathjax@{MATHJAX_VERSION}"], capture_output=True, text=True)
            if proc.returncode != 0 or not (es5 / ENTRY).is_file():
                raise ConfigError(f"npm install mathjax@{MATHJAX_VERSION} failed:\n{proc.stdout}\n{proc.stderr}")
    return es5


def stage(es5: Path, confdir: Path) -> Path:
    """Copy the parts the site loads into a static folder ``<cache>/static/mathjax`` (refreshed when the source
    changes); returns the folder to add to ``html_static_path``."""
    root = _cache_dir(confdir) / "static"
    target = root / "mathjax"
    stamp = target / ".source"
    source_id = f"{es5.resolve()} {(es5 / ENTRY).stat().st_mtime_ns}"
    if stamp.is_file() and stamp.read_text() == source_id:
        return root
    tmp = root / f".mathjax-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for part in PARTS:
        src = es5 / part
        if src.is_dir():
            shutil.copytree(src, tmp / part)
        elif src.is_file():
            (tmp / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tmp / part)
    (tmp / ".source").write_text(source_id)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return root


def configure(app: Sphinx, config: Config) -> None:
    confdir = Path(app.confdir)
    static_root = stage(find_or_install(confdir), confdir)
    config.html_static_path = [*config.html_static_path, str(static_root)]
    # MathJax finds its own folder from its <script> tag, so its components and fonts load from _static/mathjax on
    # pages at any depth.
    config.mathjax_path = f"mathjax/{ENTRY}"


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", configure, priority=400)
    return {"version": MATHJAX_VERSION, "parallel_read_safe": True, "parallel_write_safe": True}
