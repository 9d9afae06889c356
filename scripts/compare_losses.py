#!/usr/bin/env python3
"""Compare the loss curves of two runs (Megatron-Bridge validate_convergence rules).

    python scripts/compare_losses.py ref.log cand.log
    python scripts/compare_losses.py RUNS.log --reference reference --candidate no_recompute [--out result.json]

Input formats (each log is read as the first that gives losses):
- a Megatron(-Bridge) training log: the loss of each step is read from its iteration lines,
  " [2026-01-01 10:00:00] iteration       10/     100 | ... | lm loss: 2.345678E+00 | ...";
- plain text: one "STEP LOSS" pair a line ("10 2.3456", "10,2.3456" or tab-separated), with
  blank lines, "#" comments and one header line ("step loss") allowed;
- one log holding several runs (written by bridge_recipes.bench.runs.launch), split at its
  "===== run NAME: ..." lines; --reference and --candidate name two of them.
Exit status 0 when the curves agree (two identical runs do), 1 when they do not (a loss of inf or
nan in either run is a divergence), 2 on bad input.
"""

import argparse
import json
import math
import sys
from pathlib import Path

from bridge_recipes.bench.convergence import compare, diverged
from bridge_recipes.logs.run_log import complete_losses, plain_losses, run_names, split_runs
from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import output_problem, write_text_atomic


def fail(msg: str) -> int:
    print(f"compare_losses.py: error: {msg}", file=sys.stderr)
    return 2


def _losses(text: str, what: str) -> dict[int, float]:
    """step -> loss of one log: a whole Megatron run (every step once, up to its last), else plain
    STEP LOSS text."""
    losses = complete_losses(text, what)  # ValueError: a run cut short, or a step twice
    if losses:
        return losses
    try:
        return plain_losses(text)
    except ValueError as exc:
        raise ValueError(
            f"{what} is neither a Megatron training log (no iteration lines with 'lm loss') nor plain "
            f"'STEP LOSS' text: {exc} (--help shows the formats)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quiet.add_flag(ap)
    ap.add_argument("logs", nargs="+", help="one multi-run log, or two logs")
    ap.add_argument("--reference", help="run name in a multi-run log")
    ap.add_argument("--candidate", help="run name in a multi-run log")
    ap.add_argument("--out", help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    if len(args.logs) > 2:
        return fail(f"{len(args.logs)} logs given: pass one multi-run log, or two logs (reference, candidate)")
    if len(args.logs) == 2 and (args.reference or args.candidate):
        return fail("--reference/--candidate name runs inside one multi-run log; with two logs, drop them")
    if args.out:
        problem = output_problem(args.out, option="--out", inputs=args.logs)
        if problem:
            return fail(problem)
    texts = []
    for p in args.logs:
        try:
            texts.append(Path(p).read_text())
        except UnicodeDecodeError:
            return fail(f"{p} is not a text log (it does not decode as UTF-8)")
        except OSError as exc:
            return fail(f"cannot read {p}: {exc.strerror or exc}")
    try:
        if len(texts) == 2:
            if Path(args.logs[0]).resolve() == Path(args.logs[1]).resolve():
                return fail(f"{args.logs[0]} is given twice; compare two runs' logs")
            ref = _losses(texts[0], f"the reference ({args.logs[0]})")
            cand = _losses(texts[1], f"the candidate ({args.logs[1]})")
        else:
            names = run_names(texts[0])
            if twice := sorted({n for n in names if names.count(n) > 1}):
                return fail(f"{args.logs[0]} holds more than one run named {', '.join(twice)}; rename or split them")
            runs = split_runs(texts[0])
            missing = [n for n in (args.reference, args.candidate) if n not in runs]
            if missing or not args.reference:
                return fail(f"name --reference and --candidate among the runs {sorted(runs)}")
            if args.reference == args.candidate:
                return fail(f"--reference and --candidate both name {args.reference}; compare two runs")
            ref = _losses(runs[args.reference], f"run {args.reference}")
            cand = _losses(runs[args.candidate], f"run {args.candidate}")
        if reasons := diverged(ref, cand):  # a diverged run: the curves disagree, there is nothing to measure
            shown = [
                {s: v if math.isfinite(v) else str(v) for s, v in c.items()} for c in (ref, cand)
            ]  # JSON has no inf
            doc = {"reference_losses": shown[0], "candidate_losses": shown[1], "passed": False, "reasons": reasons}
            print(json.dumps({"passed": False, "reasons": reasons}, indent=1))
            if args.out:
                write_text_atomic(args.out, json.dumps(doc, indent=1) + "\n")
            return 1
        result = compare(ref, cand)
    except ValueError as exc:
        return fail(str(exc))
    doc = {"reference_losses": ref, "candidate_losses": cand, **result.as_dict()}
    print(
        json.dumps(
            {
                k: doc[k]
                for k in (
                    "correlation",
                    "final_loss_difference",
                    "pointwise_failures",
                    "points_checked",
                    "passed",
                    "reasons",
                )
            },
            indent=1,
        )
    )
    if args.out:
        write_text_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    return 0 if result.passed else 1


if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    sys.exit(main())
