"""How long the runner's everyday commands take, each run several times in turn in one command:
the dry run and the plan with the package bodies deferred (the runner's default) and with plain
imports ($BRIDGE_RECIPES_PLAIN_IMPORTS=1), a misspelt key, and the recipe list.

    python -m lab.command_times [--repeats 3] [--prediction "dry run: 9-10 s"]

writes lab/results/command_times.json and its log lab/evidence/startup/command_times.log (one line
per run: label, run number, seconds, exit status); each --prediction, written before the run, goes into
the result with the time the run started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "lab" / "results" / "command_times.json"
LOG = ROOT / "lab" / "evidence" / "startup" / "command_times.log"
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
PLAIN = {"BRIDGE_RECIPES_PLAIN_IMPORTS": "1"}
COMMANDS = (  # (label, runner arguments, extra environment)
    ("dry run", ["--recipe", RECIPE, "--dry-run"], {}),
    ("dry run, plain imports", ["--recipe", RECIPE, "--dry-run"], PLAIN),
    ("plan", ["--recipe", RECIPE, "--plan"], {}),
    ("plan, plain imports", ["--recipe", RECIPE, "--plan"], PLAIN),
    ("misspelt key", ["--recipe", RECIPE, "--dry-run", "train.trian_iters=5"], {}),
    ("list", ["--list"], {}),
)
LINE = re.compile(r"^\[command_times\] (?P<label>.+?): run (?P<run>\d+) (?P<seconds>[\d.]+) s \(rc (?P<rc>-?\d+)\)$")


def timed(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Seconds and exit status of one runner command in a fresh interpreter."""
    start = time.perf_counter()
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_recipe.py"), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start, p.returncode


def runs_in_log(text: str) -> dict[str, list[tuple[float, int]]]:
    """label -> [(seconds, exit status)] in the order run."""
    out: dict[str, list[tuple[float, int]]] = {}
    for line in text.splitlines():
        if m := LINE.match(line):
            out.setdefault(m["label"], []).append((float(m["seconds"]), int(m["rc"])))
    return out


def summary(runs: dict[str, list[tuple[float, int]]]) -> dict:
    """Each command's median, fastest and exit statuses; the dry run's and the plan's plain-over-deferred ratio."""
    commands = {
        label: {
            "median_s": round(statistics.median(s for s, _ in got), 2),
            "min_s": round(min(s for s, _ in got), 2),
            "exit_status": sorted({rc for _, rc in got}),
            "runs": len(got),
        }
        for label, got in runs.items()
    }
    ratios = {
        label: round(commands[f"{label}, plain imports"]["median_s"] / commands[label]["median_s"], 2)
        for label in ("dry run", "plan")
        if label in commands and f"{label}, plain imports" in commands
    }
    return {"commands": commands, "plain_over_deferred": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command, taken in turn (default 3)")
    parser.add_argument("--prediction", action="append", default=[], help="what you expect, kept in the result")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"[command_times] load average before: {os.getloadavg()[0]:.2f}"]
    for run in range(1, args.repeats + 1):
        for label, runner_args, env in COMMANDS:
            seconds, rc = timed(runner_args, env)
            lines.append(f"[command_times] {label}: run {run} {seconds:.2f} s (rc {rc})")
            print(lines[-1], flush=True)
    LOG.write_text("\n".join(lines) + "\n")
    doc = {
        "what": "the runner's everyday commands, wall seconds in a fresh interpreter, each run in turn",
        "command": f"python -m lab.command_times --repeats {args.repeats}",
        "date": datetime.date.today().isoformat(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "recipe": RECIPE,
        "log": str(LOG.relative_to(ROOT)),
        "prediction": {"made": started, "expected": args.prediction} if args.prediction else None,
        **summary(runs_in_log(LOG.read_text())),
    }
    RESULT.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["commands"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
