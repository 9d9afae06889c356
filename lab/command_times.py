"""How long the runner's everyday commands take, each run several times in turn in one command:
the dry runs of three recipes (an 8-GPU SFT, a one-GPU LoRA run as the benchmark starts it, the
GB300 MXFP8 VL pretraining), the plan, a misspelt key, and the recipe list. A result whose commands
come in pairs, ``LABEL`` and ``LABEL, plain imports`` (the runner once deferred some package bodies in
a dry run), also gives each pair's ratio.

    python -m lab.command_times [--repeats 3] [--prediction "dry run: 9-10 s"] [--result FILE --log FILE]

writes lab/results/command_times.json and its log lab/evidence/startup/command_times.log (one line
per run: label, run number, wall seconds, exit status, CPU seconds of the command's processes: on a
machine others share, the CPU seconds move less with their load than the wall seconds); each
--prediction, written before the run, goes into the result with the time the run started.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bridge_recipes.bench.harness import BENCHMARK_OVERRIDES
from bridge_recipes.features import random_lora

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "lab" / "results" / "command_times.json"
LOG = ROOT / "lab" / "evidence" / "startup" / "command_times.log"
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
LORA_RECIPE = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
VL_RECIPE = "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_fp8mx_library_config"
# a LoRA recipe without base weights dry-runs as the benchmark launches it
LORA_ARGS = [random_lora.OPTION, *BENCHMARK_OVERRIDES]
COMMANDS = (  # (label, runner arguments)
    ("dry run", ["--recipe", RECIPE, "--dry-run"]),
    ("LoRA dry run", ["--recipe", LORA_RECIPE, "--dry-run", *LORA_ARGS]),
    ("VL MXFP8 dry run", ["--recipe", VL_RECIPE, "--dry-run"]),
    ("plan", ["--recipe", RECIPE, "--plan"]),
    ("misspelt key", ["--recipe", RECIPE, "--dry-run", "train.trian_iters=5"]),
    ("list", ["--list"]),
)
LINE = re.compile(
    r"^\[command_times\] (?P<label>.+?): run (?P<run>\d+) (?P<seconds>[\d.]+) s "
    r"\(rc (?P<rc>-?\d+)(?:, cpu (?P<cpu>[\d.]+) s)?\)$"
)
Run = tuple[float, int, float | None]  # wall seconds, exit status, CPU seconds (None in older logs)


def timed(args: list[str]) -> Run:
    """Wall seconds, exit status and CPU seconds (user and system, its processes) of one runner command
    in a fresh interpreter."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_recipe.py"), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, p.returncode, (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)


def runs_in_log(text: str) -> dict[str, list[Run]]:
    """label -> [(wall seconds, exit status, CPU seconds or None)] in the order run."""
    out: dict[str, list[Run]] = {}
    for line in text.splitlines():
        if m := LINE.match(line):
            cpu = float(m["cpu"]) if m["cpu"] else None
            out.setdefault(m["label"], []).append((float(m["seconds"]), int(m["rc"]), cpu))
    return out


def summary(runs: dict[str, list[Run]]) -> dict:
    """Each command's median and fastest wall seconds, median CPU seconds (where logged) and exit statuses;
    each command's plain-over-deferred ratio of medians where both succeeded."""
    commands = {}
    for label, got in runs.items():
        commands[label] = {
            "median_s": round(statistics.median(s for s, _, _ in got), 2),
            "min_s": round(min(s for s, _, _ in got), 2),
            "exit_status": sorted({rc for _, rc, _ in got}),
            "runs": len(got),
        }
        if all(cpu is not None for _, _, cpu in got):
            commands[label]["cpu_median_s"] = round(statistics.median(cpu for _, _, cpu in got if cpu is not None), 2)
    out: dict = {"commands": commands}
    pairs = [
        (label, f"{label}, plain imports")
        for label in commands
        if f"{label}, plain imports" in commands
        and commands[label]["exit_status"] == commands[f"{label}, plain imports"]["exit_status"] == [0]
    ]  # only where both commands succeeded: a failed one stops early
    for key, field in (("plain_over_deferred", "median_s"), ("plain_over_deferred_cpu", "cpu_median_s")):
        ratios = {
            label: round(commands[plain][field] / commands[label][field], 2)
            for label, plain in pairs
            if field in commands[label] and field in commands[plain]
        }
        if ratios or key == "plain_over_deferred":
            out[key] = ratios
    return out


def _commit() -> str:
    """The checked-out commit the commands ran at ("unknown" outside a git checkout)."""
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return p.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command, taken in turn (default 3)")
    parser.add_argument("--prediction", action="append", default=[], help="what you expect, kept in the result")
    parser.add_argument("--result", type=Path, default=RESULT, help=f"result (default {RESULT.relative_to(ROOT)})")
    parser.add_argument("--log", type=Path, default=LOG, help=f"its log (default {LOG.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    result, log = args.result.resolve(), args.log.resolve()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"[command_times] load average before: {os.getloadavg()[0]:.2f}"]
    for run in range(1, args.repeats + 1):
        for label, runner_args in COMMANDS:
            seconds, rc, cpu = timed(runner_args)
            lines.append(f"[command_times] {label}: run {run} {seconds:.2f} s (rc {rc}, cpu {cpu:.2f} s)")
            print(lines[-1], flush=True)
    lines.append(f"[command_times] load average after: {os.getloadavg()[0]:.2f}")
    log.write_text("\n".join(lines) + "\n")
    doc = {
        "what": "the runner's everyday commands, wall seconds in a fresh interpreter, each run in turn",
        "command": "python -m lab.command_times " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "hardware": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
        "commit": _commit(),
        "recipe": RECIPE,
        "runner_args": {label: " ".join(a) for label, a in COMMANDS},
        "log": str(log.relative_to(ROOT)),
        "prediction": {"made": started, "expected": args.prediction} if args.prediction else None,
        **summary(runs_in_log(log.read_text())),
    }
    result.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["commands"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
