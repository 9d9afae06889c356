#!/usr/bin/env python3
"""Where a training process's start-up went, from a py-spy speedscope profile.

    python -m lab.startup_breakdown startup.speedscope.json [--rate 20] [--out result.json]

Each sample (all processes and threads; py-spy records active samples only) is put in the
first matching phase: TileLang kernel compilation, torch.compile (Dynamo tracing, Inductor
compile and autotuning), Triton kernel compile and autotuning outside Inductor (the FLA Gated
DeltaNet kernels), Python imports, checkpoint I/O, everything else. Prints seconds per phase.
"""

import argparse
import json
import sys
from pathlib import Path

from lab.startup import breakdown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--rate", type=float, default=20.0, help="py-spy's sampling rate (--rate), samples/s")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--about",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="context written into --out beside the figures (command, date, hardware); repeatable",
    )
    args = ap.parse_args()
    try:
        doc = json.loads(args.profile.read_text())
    except (OSError, ValueError) as exc:
        print(f"startup_breakdown.py: error: {args.profile}: {exc}", file=sys.stderr)
        return 2
    result = breakdown(doc, args.rate)
    width = max(map(len, result))
    for phase, s in result.items():
        print(f"{phase:<{width}}  {s:7.1f} s")
    print(f"{'total (active samples)':<{width}}  {sum(result.values()):7.1f} s")
    if args.out:
        about = dict(item.split("=", 1) for item in args.about if "=" in item)
        doc = {**about, "seconds_by_phase": result, "total_active_s": round(sum(result.values()), 1)}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
