#!/usr/bin/env python3
"""Where a training process's start-up went, from a py-spy speedscope profile.

    python3 scripts/gpu/startup_breakdown.py startup.speedscope.json [--rate 20] [--out result.json]

Each sample (all processes and threads; py-spy records active samples only) is put in the
first matching phase: TileLang kernel compilation, torch.compile (Dynamo tracing, Inductor
compile and autotuning), Triton kernel compile and autotuning outside Inductor (the FLA Gated
DeltaNet kernels), Python imports, checkpoint I/O, everything else. Prints seconds per phase.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

PHASES = (  # (phase, substrings of a frame's file or name; first phase with a match wins)
    ("tilelang compile", ("/tilelang/",)),
    (
        "torch.compile (dynamo, inductor)",
        (
            "torch/_dynamo/convert_frame.py",
            "torch/_inductor/compile_fx.py",
            "torch/_inductor/runtime/triton_heuristics.py",
            "torch/_inductor/async_compile.py",
        ),
    ),
    ("triton compile + autotune (FLA kernels)", ("triton/runtime/autotuner.py", "triton/compiler/")),
    ("python imports", ("<frozen importlib._bootstrap>",)),
    ("checkpoint i/o", ("dist_checkpointing",)),
)


def phase_of(stack: list[dict]) -> str:
    text = [f"{f.get('file', '')} {f.get('name', '')}" for f in stack]
    for phase, keys in PHASES:
        if any(k in t for t in text for k in keys):
            return phase
    return "other (set-up, training steps, data)"


def breakdown(profile: dict, rate: float) -> dict[str, float]:
    frames = profile["shared"]["frames"]
    seconds: Counter = Counter()
    for prof in profile["profiles"]:
        for sample in prof["samples"]:
            seconds[phase_of([frames[i] for i in sample])] += 1 / rate
    return {k: round(v, 1) for k, v in seconds.most_common()}


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
