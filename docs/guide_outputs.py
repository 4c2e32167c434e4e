"""The expected output of every example in the guide: run each ``python`` block, compare or rewrite the ``text``
block under it.

A page shows what an example prints in a fenced ``text`` block right after the example, introduced by a line
``Prints:`` (nothing else between them)::

    ```python
    print(f"loss {loss:.3f}")
    ```

    Prints:

    ```text
    loss 0.412
    ```

``python docs/guide_outputs.py`` runs every example of ``docs/guide/*.md`` (each in a fresh namespace, one BLAS
thread, on the CPU) and rewrites those blocks from what they print now — the one command to refresh them after a
change to the code moves a number (``make guide-outputs``). ``--check`` compares instead and exits 1 on a
difference; ``tests/docs/test_guide.py`` runs the same comparison. Numbers with a decimal point or an exponent
are compared to one unit of the last digit the page shows (the last printed digit may round the other way on
another machine); integers and all other text exactly.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE_PAGES = sorted((ROOT / "docs" / "guide").glob("*.md"))
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```\n(?P<after>\nPrints:\n\n```text\n(?P<out>.*?)^```\n)?",
                   re.S | re.M)
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def examples(page: Path) -> list[tuple[str, str, str | None]]:
    """``(name, code, expected output or None)`` of each ``python`` block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(f"{page.relative_to(ROOT)}[{i}]", m.group("code"), m.group("out"))
            for i, m in enumerate(BLOCK.finditer(text))]


def run_example(name: str, code: str) -> str:
    """What ``code`` prints to stdout, run in a fresh namespace."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, name, "exec"), {"__name__": "__guide__"})
    return buf.getvalue()


def output_difference(expected: str, actual: str) -> str | None:
    """``None`` when ``actual`` prints what ``expected`` shows (numbers to one unit of the last digit shown),
    else a sentence naming the first difference."""
    exp, act = expected.strip(), actual.strip()
    if NUMBER.sub("#", exp) != NUMBER.sub("#", act):
        return f"prints {act!r}, the page shows {exp!r}"
    for e, a in zip(NUMBER.findall(exp), NUMBER.findall(act)):
        if not re.search(r"[.eE]", e):
            if e.lstrip("+") != a.lstrip("+"):
                return f"prints {a} where the page shows {e} (in {act!r})"
            continue
        digits = len(e.split("e")[0].split("E")[0].split(".")[1]) if "." in e else 0
        exponent = int(re.split("[eE]", e)[1]) if re.search("[eE]", e) else 0
        unit = 10.0 ** (exponent - digits)
        if abs(float(e) - float(a)) > unit * (1 + 1e-9):
            return f"prints {a} where the page shows {e} (in {act!r})"
    return None


def refresh(page: Path) -> int:
    """Rewrite the ``Prints:`` block of every example of ``page`` from a fresh run (adding one where missing);
    returns the number of blocks changed."""
    text = page.read_text(encoding="utf-8")
    out, last, changed = [], 0, 0
    for i, m in enumerate(BLOCK.finditer(text)):
        printed = run_example(f"{page.relative_to(ROOT)}[{i}]", m.group("code")).strip()
        block = f"```python\n{m.group('code')}```\n\nPrints:\n\n```text\n{printed}\n```\n"
        changed += block != m.group(0)
        out.append(text[last:m.start()] + block)
        last = m.end()
    out.append(text[last:])
    new = "".join(out)
    if new != text:
        page.write_text(new, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    ap.add_argument("pages", nargs="*", type=Path, help="pages (default: docs/guide/*.md)")
    args = ap.parse_args(argv)
    pages = [p.resolve() for p in args.pages] or GUIDE_PAGES
    if not args.check:
        for page in pages:
            print(f"{page.relative_to(ROOT)}: {refresh(page)} output block(s) rewritten")
        return 0
    bad = 0
    for page in pages:
        for name, code, expected in examples(page):
            diff = "no Prints: block" if expected is None else output_difference(expected, run_example(name, code))
            if diff:
                bad += 1
                print(f"{name}: {diff}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
