"""The wider walk: draw many more cases of every family of tests/api_walk.py and print the counts clear / obscure /
silent / valid per subpackage, with an example of each obscure or silent kind. PENDING families (the entry family
of the names whose checks belong to another room, api_walk.OWNED_ELSEWHERE) are counted on rows of their own and
left out of the "all but pending" total. The entry families draw up to --entry-examples cases and stop early once every (name, poison) pair is drawn.
Not collected by pytest (no test_ prefix); run it by hand:

    OMP_NUM_THREADS=1 PYTHONPATH=. python tests/walk_counts.py --examples 200
"""
from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_walk import FAMILIES, KINDS, PENDING, classify  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402


def walk(families: dict, examples: int, seed: int, entry_examples: int = 1000) -> tuple[dict, dict]:
    """Counts per subpackage and kind, and up to three details per (subpackage, name, kind) not clear/valid."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    findings: dict[tuple, list[str]] = collections.defaultdict(list)
    for sub, fams in families.items():
        for fam in fams:
            n = max(examples, entry_examples) if "_entry" in fam.__name__ else examples

            @settings(max_examples=n, deadline=None, derandomize=seed == 0, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(fam())
            def run(case):
                kind, detail = classify(case)
                counts[sub][kind] += 1
                if kind in ("obscure", "silent") and len(findings[sub, case.name, kind]) < 3:
                    findings[sub, case.name, kind].append(f"[{case.note}] {detail}")
            run()
    return counts, findings


def main() -> None:
    """Parse the arguments, walk, print a Markdown table and the findings."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=200, help="draws per family (default 200)")
    ap.add_argument("--entry-examples", type=int, default=1000,
                    help="draws per entry family (default 1000: every (name, poison) pair of a subpackage)")
    ap.add_argument("--seed", type=int, default=0, help="0: derandomized (the same draws every run); else random")
    ap.add_argument("--no-pending", action="store_true", help="skip the PENDING families")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    families = {**FAMILIES, **({} if args.no_pending else {f"{sub} (pending)": fams for sub, fams in PENDING.items()})}
    counts, findings = walk(families, args.examples, args.seed, args.entry_examples)
    print("| subpackage | calls | " + " | ".join(KINDS) + " |")
    print("|---|---:|" + "---:|" * len(KINDS))
    total = collections.Counter()
    for sub in families:
        c = counts[sub]
        total.update(c)
        print(f"| {sub} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
    print(f"| **all** | {sum(total.values())} | " + " | ".join(str(total[k]) for k in KINDS) + " |")
    asserted = collections.Counter()
    for sub in FAMILIES:
        asserted.update(counts[sub])
    print(f"| **all but pending** | {sum(asserted.values())} | " + " | ".join(str(asserted[k]) for k in KINDS) + " |")
    for (sub, name, kind), details in sorted(findings.items()):
        print(f"\n{kind}: {sub}.{name}")
        for d in details:
            print(f"  - {d}")


if __name__ == "__main__":
    main()
