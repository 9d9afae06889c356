#!/usr/bin/env python3
"""Regenerate docs/memory_plan.md: the memory planner against the measured H200 peaks.

    python -m lab.memory_page              # writes docs/memory_plan.md
    python -m lab.memory_page --check      # exit 1 when the committed file is stale

Each measured run's config is rebuilt as the runner built it (recipe and the runner arguments
in its log's header: scale-down, overrides), planned
with ``bridge_recipes.plan.memory.plan_memory`` on one GPU, and compared with the run's peak:
the largest ``mem-max-allocated-gigabytes`` (GB = 1e9 bytes) in its committed log. The
published facts (8-GPU layouts of the sources in docs/sources.md) are planned the same
way. Nothing is fitted here: the script only reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import output_problem, write_text_atomic
from lab import EVIDENCE
from lab.memory_table import DOC, render


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quiet.add_flag(ap)
    ap.add_argument("--out", type=Path, default=DOC)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from what would be written")
    args = ap.parse_args()
    if args.out.is_dir():
        print(f"lab.memory_page: error: --out {args.out} is a folder; give a file path", file=sys.stderr)
        return 2
    if not args.check:
        evidence = ("the measured logs in", EVIDENCE)
        problem = output_problem(args.out, option="--out", inputs=[evidence])
        if problem:
            print(f"lab.memory_page: error: {problem}", file=sys.stderr)
            return 2
    text = render()
    ours = text.splitlines()[0] if text else ""
    if not args.check and args.out.exists() and args.out.resolve() != DOC.resolve():
        with open(args.out, "rb") as existing:
            first = existing.readline().decode("utf-8", "replace").rstrip("\n")
        if first != ours:  # a file this script did not write: the user's
            print(
                f"lab.memory_page: error: --out {args.out} exists and is not a memory table; remove it or choose "
                "another path",
                file=sys.stderr,
            )
            return 2
    if args.check:
        current = args.out.read_bytes().decode("utf-8", "replace") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python -m lab.memory_page", file=sys.stderr)
            return 1
        return 0
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    raise SystemExit(main())
