"""Run every ``benchmarks/bench_*.py`` and write their Markdown into ``benchmarks/RESULTS.md``.

Each benchmark measures ours against the reference in one process and prints a Markdown section of ratios.
RESULTS.md keeps one block per machine (this CPU, a GPU, …): a run replaces only its own machine's block, so
CPU and GPU figures live side by side.

    python benchmarks/run_all.py                 # all benchmarks, device auto
    python benchmarks/run_all.py --device cuda --only mgs emo
    python benchmarks/run_all.py --quick         # smaller sizes (smoke run)

``--device cuda`` on a machine without CUDA stops at once with exit status 2 (``benchmarks/gpu_check.sh`` runs the
GPU block: the CUDA tests and every benchmark on cuda, into one folder).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


def machine_description(device: str) -> tuple[str, str]:
    """A stable key and a human description of the machine the numbers come from."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        gpu = torch.cuda.get_device_name(0)
        key = "cuda-" + re.sub(r"\W+", "-", gpu).strip("-").lower()
        desc = f"GPU {gpu} (CUDA {torch.version.cuda}), host CPU {cpu}, {cores} cores"
    else:
        key = f"cpu-{cores}cores"
        desc = f"CPU {cpu}, {cores} cores, no GPU"
    desc += f"; torch {torch.__version__}, Python {platform.python_version()}"
    return key, desc


def replace_block(text: str, key: str, block: str) -> str:
    """Put ``block`` between this machine's markers in ``text`` (added at the end if it has none)."""
    start, end = f"<!-- machine: {key} -->", f"<!-- end machine: {key} -->"
    new = f"{start}\n{block.strip()}\n{end}"
    if start in text and end in text:
        return text[: text.index(start)] + new + text[text.index(end) + len(end):]
    if not text.strip():
        text = ("# Benchmark results\n\nWritten by `make bench` (`python benchmarks/run_all.py`). Ratios are ours / "
                "reference from one run on the machine named in each block; see each script for what it measures.\n")
    return text.rstrip() + "\n\n" + new + "\n"


def bench_sections(text: str, key: str) -> dict[str, str]:
    """The per-script sections already recorded for this machine (kept when ``--only`` reruns a subset)."""
    start, end = f"<!-- machine: {key} -->", f"<!-- end machine: {key} -->"
    if start not in text or end not in text:
        return {}
    block = text[text.index(start): text.index(end)]
    pattern = re.compile(r"<!-- bench: (\S+) -->.*?<!-- end bench: \1 -->", re.S)
    return {m.group(1): m.group(0) for m in pattern.finditer(block)}


def target_rows(section: str) -> list[tuple[str, str, str]]:
    """(case, columns, verdicts) of every table row of one benchmark section that carries a ✓/✗ target mark.

    ``case`` is the row's first four cells (what was measured), ``verdicts`` each marked cell as
    ``header: value``, so the summary says which ratio met or missed which target.
    """
    rows, header = [], None
    for line in section.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        marked = [(h, c) for h, c in zip(header, cells) if "✓" in c or "✗" in c]
        if marked:
            case = " · ".join(c for c in cells[:4] if c and "✓" not in c and "✗" not in c)
            rows.append((case, "; ".join(f"{h}: {c}" for h, c in marked), "✗" if any("✗" in c for _, c in marked)
                         else "✓"))
    return rows


def summary_table(sections: dict[str, str]) -> str:
    """One table over every benchmark: each row with a target, its marked ratios, and ✓ (all met) or ✗."""
    lines = ["### Summary: every ratio with a target", "",
             "| benchmark | case | ratios against their targets | met |", "|---|---|---|---|"]
    met = total = 0
    for name in sorted(sections):
        for case, verdicts, mark in target_rows(sections[name]):
            lines.append(f"| {name.removeprefix('bench_')} | {case} | {verdicts} | {mark} |")
            total, met = total + 1, met + (mark == "✓")
    lines += ["", f"{met} of {total} rows meet every target they carry (each script's section says what the "
              "target is and why)."]
    return "<!-- bench: zz_summary -->\n" + "\n".join(lines) + "\n<!-- end bench: zz_summary -->"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="topics, e.g. mgs emo curvature")
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print(f"--device cuda: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False;"
                  f" CUDA build: {torch.version.cuda or 'none, a CPU wheel'}); nothing was run", file=sys.stderr)
            return 2
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in args.only]
    if not scripts:
        print("no benchmark selected", file=sys.stderr)
        return 2
    key, desc = machine_description(args.device)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = Path(args.output)
    previous = out.read_text() if out.exists() else ""
    sections, failed = bench_sections(previous, key), []
    sections.pop("zz_summary", None)
    for script in scripts:
        print(f"running {script.name} …", flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(script), "--device", args.device] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout)
        if proc.returncode != 0:
            failed.append(script.name)
            print(proc.stderr[-4000:], file=sys.stderr)
            body = f"### {script.stem}: FAILED (exit {proc.returncode})"
        else:
            body = re.sub(r"^## ", "### ", proc.stdout.strip(), flags=re.M)
        note = f"_{script.name}: {time.perf_counter() - t0:.0f} s, measured {stamp}{' (--quick)' if args.quick else ''}_"
        sections[script.stem] = f"<!-- bench: {script.stem} -->\n{body}\n\n{note}\n<!-- end bench: {script.stem} -->"
    header = f"## Machine: {desc}\n"
    blocks = [sections[k] for k in sorted(sections)]
    out.write_text(replace_block(previous, key, "\n\n".join([header] + blocks + [summary_table(sections)])))
    print(f"wrote {out} (block {key})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
