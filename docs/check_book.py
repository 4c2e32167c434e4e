"""Open built pages of the book in headless Chromium and check what a reader would see.

For each page (by default a notebook page and an API page) it asserts that

- the math rendered: MathJax ran, every Sphinx math element holds MathJax output (``mjx-container``), MathJax
  reported no TeX error (``mjx-merror``), and no raw TeX delimiters (``$$``, ``\\(``, ``\\[``, ``\\begin``) are left
  in the text outside code;
- the figures loaded: every ``<img>`` has a natural width > 0 (and the notebook page has figures at all), and
  every figure of a notebook page has its caption as alt text (not a file name);
- the cross-links resolve: every link into the site points at a file that exists and, with a ``#fragment``, at an
  element id in it; the notebook page links API entries (its "Uses" box) and the API page links notebook pages;
- the page needed no network: every request was ``file:``/``data:``/``blob:`` and none failed, and no script error
  was thrown.

Before the browser opens anything, a static pass over every built page (:func:`raw_tex_in_navigation`) checks that
no page title carries raw TeX in the navigation and the ``<title>`` (a title's math is shown on every page's
sidebar, most of which load no MathJax; ``docs/conf.py`` writes it in Unicode).

A screenshot of each page is written into ``<site>/../check/`` (an artifact of the run, not committed), with
``report.json``. Chromium is driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``), so
nothing but the Python standard library and Debian's ``chromium`` package is needed.

    python docs/check_book.py [--site docs/_build/html] [--page notebooks/06_natural_gradient.html ...]
                              [--all-notebooks]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

DOCS = Path(__file__).resolve().parent
DEFAULT_PAGES = ("notebooks/06_natural_gradient.html", "api/taskloss.search.html")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# the Chromium flags that keep a headless run on this machine's closed network quiet (no background services)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-pipe")

# Runs in the page once it has loaded: waits for MathJax and for every image, then reports what it sees.
PAGE_PROBE = r"""
(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++) await sleep(50);
  const hasMathJax = !!(window.MathJax && MathJax.startup && MathJax.startup.promise);
  if (hasMathJax) await MathJax.startup.promise;
  await Promise.all([...document.images].map(img => img.complete ? null :
      new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r); })));
  await document.fonts.ready;
  const mathNodes = [...document.querySelectorAll('span.math, div.math')];
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight, textarea').forEach(e => e.remove());
  const text = clone.textContent;
  const raw = ['$$', '\\(', '\\)', '\\[', '\\begin{', '$\\'].filter(t => text.includes(t));
  return JSON.stringify({
    title: document.title,
    mathjax: hasMathJax,
    math_elements: mathNodes.length,
    math_unrendered: mathNodes.filter(e => !e.querySelector('mjx-container')).length,
    mjx_containers: document.querySelectorAll('mjx-container').length,
    mjx_errors: [...document.querySelectorAll('mjx-merror')]
        .map(e => e.getAttribute('data-mjx-error') || e.textContent),
    raw_tex: raw,
    images: [...document.images].map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth,
                                            alt: i.getAttribute('alt') || ''})),
    links: [...document.querySelectorAll('a[href]')].map(a => ({href: a.href, text: a.textContent.trim().slice(0, 80),
                                                               cls: a.className})),
    uses_links: [...document.querySelectorAll('.taskloss-uses a.reference.internal')].map(a => a.href),
  });
})()
"""


class Chromium:
    """A headless Chromium spoken to over the DevTools protocol on fds 3/4 (NUL-separated JSON messages)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 1600):
        self.profile = tempfile.mkdtemp(prefix="taskloss-book-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def child_fds():        # Chromium reads commands on fd 3 and writes replies on fd 4
            high_r, high_w = os.dup(cmd_r), os.dup(res_w)     # out of the way of 3 and 4 first
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(res_w)
        self.width, self.height = width, height
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._res_r, 1 << 16)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
                raise RuntimeError(f"Chromium closed the DevTools pipe (exit {self.proc.poll()}): {err[-2000:]}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)
        shutil.rmtree(self.profile, ignore_errors=True)

    def open(self, url: str, screenshot: Path) -> dict:
        """Load ``url`` in a new tab, run the probe, save a screenshot; returns the probe's report plus the
        requests the page made, those that failed and the script errors it threw."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session)
        probe = self.send("Runtime.evaluate", {"expression": PAGE_PROBE, "awaitPromise": True,
                                               "returnByValue": True}, session=session, timeout=120)
        if "exceptionDetails" in probe:
            raise RuntimeError(f"page probe failed on {url}: {probe['exceptionDetails']}")
        report = json.loads(probe["result"]["value"])
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        mine = [e for e in self.events if e.get("sessionId") == session]
        report["requests"] = sorted({e["params"]["request"]["url"] for e in mine
                                     if e.get("method") == "Network.requestWillBeSent"})
        failed_ids = {e["params"]["requestId"]: e["params"].get("errorText") for e in mine
                      if e.get("method") == "Network.loadingFailed"}
        urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in mine
                if e.get("method") == "Network.requestWillBeSent"}
        report["failed_requests"] = sorted(f"{urls.get(i, i)} ({err})" for i, err in failed_ids.items())
        report["script_errors"] = [e["params"]["exceptionDetails"].get("exception", {}).get("description")
                                   or e["params"]["exceptionDetails"].get("text")
                                   for e in mine if e.get("method") == "Runtime.exceptionThrown"]
        report["console_errors"] = [e["params"]["entry"]["text"] for e in mine
                                    if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]
        report["screenshot"] = str(screenshot)
        self.send("Target.closeTarget", {"targetId": target})
        return report


def find_browser() -> str | None:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    return None


_IDS: dict[Path, set[str]] = {}


def _ids(path: Path) -> set[str]:
    if path not in _IDS:
        _IDS[path] = set(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8", errors="replace")))
    return _IDS[path]


def broken_internal_links(site: Path, links: list[str]) -> list[str]:
    """Links into the site (file: URLs under ``site``) whose file or #fragment does not exist."""
    bad = []
    root = site.resolve()
    for href in links:
        url = urlparse(href)
        if url.scheme != "file":
            continue
        path = Path(unquote(url.path))
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():
            bad.append(f"{href} (no such file)")
        elif root not in path.resolve().parents and path.resolve() != root:
            bad.append(f"{href} (outside the site)")
        elif url.fragment and path.suffix == ".html" and unquote(url.fragment) not in _ids(path):
            bad.append(f"{href} (no element with id {unquote(url.fragment)!r})")
    return bad


_NAV = re.compile(r"<nav\b.*?</nav>|<title>.*?</title>", re.S)
_OWN_TOC = re.compile(r'aria-label="Page"|id="pst-page-toc-nav"|class="page-toc"')
_RAW_TEX = re.compile(r"\\\(|\\\[|\$[^$<]+\$|\\(?:prod|sum|frac|operatorname|mathcal)\b")


def raw_tex_in_navigation(site: Path) -> dict[str, list[str]]:
    """Page → raw TeX found in its navigation (``<nav>``: the sidebar, the page's table of contents) or its
    ``<title>``, for every ``.html`` page of ``site`` (a static check: no browser)."""
    found = {}
    for path in sorted(Path(site).rglob("*.html")):
        if "_static" in path.parts or "_sources" in path.parts:
            continue
        html = path.read_text(encoding="utf-8", errors="replace")
        mathjax = bool(re.search(r"<script[^>]*(?:mathjax|tex-chtml)", html, re.I))
        # the page's own table of contents ("On this page") lists its section headings, whose math MathJax renders on
        # this page when the page loads it; every other navigation (the sidebar with the other pages' titles) and
        # the <title> must carry no raw TeX
        blocks = [b for b in _NAV.findall(html) if not (mathjax and _OWN_TOC.search(b[:300]))]
        hits = sorted({m.group(0)[:40] for block in blocks for m in _RAW_TEX.finditer(block)})
        if hits:
            found[str(path.relative_to(site))] = hits
    return found


def problems(site: Path, page: str, report: dict) -> list[str]:
    """What is wrong with one page's report (empty when the page passes)."""
    out = []
    is_notebook = re.match(r"notebooks/\d\d_", page) is not None
    is_api = page.startswith("api/")
    if not report["mathjax"]:
        out.append("MathJax did not load")
    if report["math_elements"] == 0:
        out.append("the page has no math elements to check")
    if report["math_unrendered"]:
        out.append(f"{report['math_unrendered']} of {report['math_elements']} math elements were not rendered")
    if report["mjx_containers"] < report["math_elements"]:
        out.append(f"{report['mjx_containers']} MathJax outputs for {report['math_elements']} math elements")
    if report["mjx_errors"]:
        out.append(f"MathJax TeX errors: {report['mjx_errors'][:5]}")
    if report["raw_tex"]:
        out.append(f"raw TeX left in the text: {report['raw_tex']}")
    if is_notebook and not report["images"]:
        out.append("the notebook page shows no figure")
    out += [f"image did not load: {img['src']}" for img in report["images"] if img["width"] <= 0]
    if is_notebook:
        out += [f"figure without a caption as alt text: {img['src']} (alt {img.get('alt', '')!r})"
                for img in report["images"] if "/_images/" in img["src"] and
                (not img.get("alt", "").strip() or re.search(r"\.(png|jpe?g|svg)$", img.get("alt", "")))]
    links = [link["href"] for link in report["links"]]
    out += [f"broken link: {b}" for b in broken_internal_links(site, links)]
    if is_notebook:
        if not report["uses_links"]:
            out.append("no 'Uses' box linking taskloss entries")
        elif not all("/api/" in href for href in report["uses_links"]):
            out.append(f"'Uses' links that do not point at API pages: {report['uses_links']}")
    if is_api and not any("/notebooks/" in href and not href.split("#")[0].endswith("index.html") for href in links):
        out.append("the API page links no notebook page")
    external = [u for u in report["requests"] if urlparse(u).scheme not in ("file", "data", "blob", "about")]
    out += [f"request outside the site: {u}" for u in external]
    out += [f"failed request: {u}" for u in report["failed_requests"]]
    out += [f"script error: {e}" for e in report["script_errors"]]
    out += [f"console error: {e}" for e in report["console_errors"]]
    return out


def check(site: Path, pages: list[str], out_dir: Path, browser: str | None = None) -> dict[str, list[str]]:
    """Check ``pages`` of the built ``site``; returns page → problems, writes screenshots and report.json."""
    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found: install Debian's package (`apt-get install chromium`)")
    for page in pages:
        if not (site / page).is_file():
            raise FileNotFoundError(f"{site / page} does not exist: build the book first (`make book`)")
    chrome = Chromium(browser)
    results, reports = {}, {}
    try:
        for page in pages:
            shot = out_dir / (page.replace("/", "__").removesuffix(".html") + ".png")
            report = chrome.open((site / page).resolve().as_uri(), shot)
            reports[page] = report
            results[page] = problems(site, page, report)
    finally:
        chrome.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps({"problems": results, "reports": reports}, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=DOCS / "_build" / "html")
    parser.add_argument("--page", action="append", help="page relative to the site (repeatable); default: "
                        + ", ".join(DEFAULT_PAGES))
    parser.add_argument("--all-notebooks", action="store_true", help="also check every notebook page")
    parser.add_argument("--out", type=Path, help="folder for screenshots and report.json (default: <site>/../check)")
    parser.add_argument("--browser", help="Chromium binary (default: found on PATH)")
    args = parser.parse_args(argv)
    pages = args.page or list(DEFAULT_PAGES)
    if args.all_notebooks:
        pages += sorted(f"notebooks/{p.name}" for p in (args.site / "notebooks").glob("[0-9][0-9]_*.html")
                        if f"notebooks/{p.name}" not in pages)
    out = args.out or args.site.parent / "check"
    raw = raw_tex_in_navigation(args.site)
    for page, hits in raw.items():
        print(f"FAIL {page}: raw TeX in the navigation or title: {', '.join(hits)}")
    try:
        results = check(args.site, pages, out, args.browser)
    except FileNotFoundError as exc:
        print(f"check_book: {exc}", file=sys.stderr)
        return 2
    for page, found in results.items():
        print(f"{'FAIL' if found else 'ok  '} {page}")
        for p in found:
            print(f"     - {p}")
    print(f"screenshots and report.json in {out}")
    return 1 if any(results.values()) or raw else 0


if __name__ == "__main__":
    sys.exit(main())
