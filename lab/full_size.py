"""Every one-GPU recipe at full size on two row shapes, in one table.

    python -m lab.full_size queue [--write]       # the queue lines, one per recipe and row shape
    python -m lab.full_size assemble DIR [DIR...] --out lab/results/one_gpu_recipes_full_size.json

Each run is ``scripts/benchmark.py`` on the recipe as listed (its layout, rows per step and packed
attention; random base weights), 20 steps, on its card's memory (``--gpu-memory-gb`` of its class
where the GPU running it has more), once on short conversations (``make_lognormal_rows.py``:
``boundaries``) and once on long ones split into pieces (``--long-split``: ``long_split``). Its
result file is ``RECIPE__SHAPE.yaml`` (``RECIPE__SHAPE__LABEL.yaml`` for one of several runs of a
recipe on a shape, e.g. two packed-attention modes) with its log beside it. ``assemble`` reads those
pairs and writes one entry per run: what it reached, its peak against the planner's, its first step's
time, its first and last loss, the packed-attention mode its log names and the result file. A run that
gave no result file (it stopped, or its watch ended it) is an entry with its ``error``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from bridge_recipes.utils.outputs import write_text_atomic
from lab import ROOT

QUEUE = ROOT / "lab/gpu/queues/one_gpu_full_size.txt"
SHAPES = {"short": "boundaries", "long_split": "long_split"}
ROWS = "/tmp/lora_rows"  # where the queue builds the rows (make_lognormal_rows.py)
STEPS = 20
STEP_ROWS = 2  # rows per step at the least, as the committed one-GPU LoRA measurements
WINDOW = (5, 19)
LIMIT_S = 900  # a run's watch: cold kernel caches take about 3 minutes, then 20 steps of at most 20 s
FIELDS = (
    "recipe",
    "gpu",
    "memory_cap_gb",
    "rows",
    "steps",
    "useful_tokens_per_s",
    "peak_gb",
    "planner_gb",
    "first_step_s",
    "loss_first",
    "loss_last",
    "packed_attention",
    "date",
    "hardware",
)
# the packed-attention install line names its mode (``KEY=mode``); older logs say it in words
_MODE_KEY = re.compile(r"packed rows: attention runs .*?\(features\.packed_attention\.mode=(?P<mode>\w+)\)")
_MODE_WORDS = {
    "one variable-length flash-attention call": "flash_varlen",
    "one conversation at a time": "per_conversation",
    "Transformer Engine's THD kernel": "varlen",
}
_ATTENTION_LINE = re.compile(r"packed rows: attention runs (?P<how>[^(\n]+?)\s*(?:\(|$)", re.M)


def one_gpu_recipes() -> list[str]:
    """The listed one-GPU recipes that train on SFT rows (no alias twins, no mock or smoke runs), the
    80 GB and 48 GB ones first: the cards most one-GPU users hold."""
    from bridge_recipes.recipes import registry

    names = [
        e.name
        for e in registry.discover().values()
        if e.meta.gpus == 1 and e.meta.task in ("peft", "sft") and e.tree == "bridge_recipes" and "smoke" not in e.name
    ]
    order = {"h100": 0, "l40s": 1, "a100": 2, "h200": 3}
    return sorted(names, key=lambda n: (order.get(registry.find(n).meta.gpu, 9), n))


def cap_gb(recipe: str) -> float | None:
    """The memory a run of ``recipe`` trains within: its card's, None for the H200's own (the largest
    card the queue runs on, where the line needs that card)."""
    from bridge_recipes.hardware.gpus import class_memory_gb
    from bridge_recipes.recipes import registry

    gpu = registry.find(recipe).meta.gpu
    return None if gpu == "h200" else class_memory_gb(gpu)


def step_sequences(cfg) -> int:
    """The global batch of a run of ``cfg``: whole micro batches holding at least :data:`STEP_ROWS` rows,
    in place of the recipes' 128 rows (minutes a step on one card): 20 steps then fit a queue step, and a
    step's cost per row is the recipe's (the optimizer updates only adapters)."""
    from bridge_recipes.config.datasets import rows_per_sequence

    micro = cfg.train.micro_batch_size
    return micro * max(1, math.ceil(STEP_ROWS / (micro * rows_per_sequence(cfg))))


def rows_root(tokens: int) -> str:
    """Where the queue builds the rows of ``tokens``-token rows."""
    return ROWS if tokens == 8192 else f"{ROWS}_{tokens}"


def build_line(tokens: int) -> str:
    """The queue step that builds both row shapes of ``tokens``-token rows."""
    size = "" if tokens == 8192 else f" {tokens}"
    return (
        f"python3 lab/gpu/make_lognormal_rows.py {rows_root(tokens)}{size} && "
        f"python3 lab/gpu/make_lognormal_rows.py {rows_root(tokens)}{size} --long-split"
    )


def run_line(recipe: str, shape: str, tokens: int, sequences: int) -> str:
    """The queue step of one run (``sequences`` per step): the benchmark under watch, its result and log in
    ``$OUT/full_size``."""
    name = f"{recipe}__{shape}"
    cap = cap_gb(recipe)
    return (
        ("python3 lab/gpu/needs_memory.py 140 && " if cap is None else "")
        + f"mkdir -p $OUT/full_size && NAME={name} LIMIT={LIMIT_S} STACK_EVERY={LIMIT_S} "
        "bash lab/gpu/watch.sh python3 scripts/benchmark.py "
        f"--recipe {recipe} --rows {rows_root(tokens)}/{SHAPES[shape]} --lora-from-random-init --steps {STEPS} "
        f"--window {WINDOW[0]} {WINDOW[1]}"
        + ("" if cap is None else f" --gpu-memory-gb {cap:g}")
        + f" --out $OUT/full_size/{name}.yaml train.global_batch_size={sequences}"
    )


def queue_lines() -> list[str]:
    """Each row length's build step, then both shapes of each recipe in :func:`one_gpu_recipes`' order."""
    from bridge_recipes import build
    from bridge_recipes.config.datasets import row_tokens

    lines, built = [], set()
    for recipe in one_gpu_recipes():
        cfg = build(recipe, dataset="sft-rows")
        tokens = row_tokens(cfg)
        if tokens not in built:
            built.add(tokens)
            lines.append(build_line(tokens))
        lines.extend(run_line(recipe, shape, tokens, step_sequences(cfg)) for shape in SHAPES)
    return lines


def packed_attention_of(log: str) -> str | None:
    """The packed-attention mode a run's log names (its install line), None when it names none."""
    if m := _MODE_KEY.search(log):
        return m.group("mode")
    m = _ATTENTION_LINE.search(log)
    if not m:
        return None
    how = m.group("how").strip()
    return _MODE_WORDS.get(how, how)


def planner_gb(recipe: str, cap: float | None) -> float:
    """The planner's peak allocated memory of ``recipe`` as listed, on one GPU of ``cap`` GB."""
    from bridge_recipes import build
    from bridge_recipes.plan.memory import plan_memory

    return round(plan_memory(build(recipe, dataset="sft-rows"), 1, gpu_memory_gb=cap).peak_allocated_gb, 1)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is in it."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def entry(result: Path, plan=planner_gb) -> dict[str, Any]:
    """One run's entry from its result file ``result`` (``RECIPE__SHAPE.yaml``) and the log beside it."""
    from bridge_recipes.bench.result import memory_cap_gb, read_result
    from bridge_recipes.logs.megatron_log import parse_megatron_log
    from bridge_recipes.recipes import registry

    recipe, shape, *_ = result.stem.split("__")
    log_path = result.with_suffix(".log")
    log = log_path.read_text(errors="replace") if log_path.is_file() else ""
    line: dict[str, Any] = dict.fromkeys(FIELDS)
    line.update(recipe=recipe, rows=shape, gpu=registry.find(recipe).meta.gpu, result=_shown(result))
    iterations = parse_megatron_log(log)
    line["packed_attention"] = packed_attention_of(log)
    if iterations:
        line["first_step_s"] = round(iterations[0].time_s, 1)
        line["loss_first"] = iterations[0].lm_loss
        line["loss_last"] = iterations[-1].lm_loss
    if not result.is_file():
        line["steps"] = len(iterations)
        line["error"] = f"no result file {result.name}" + (f" (log ends after step {len(iterations)})" if log else "")
        return line
    doc = read_result(result)
    r = doc.get("result") or {}
    cap = memory_cap_gb(doc)
    line.update(
        memory_cap_gb=cap,
        steps=r.get("steps_per_run"),
        useful_tokens_per_s=r.get("useful_tokens_per_s_per_gpu"),
        peak_gb=r.get("peak_allocated_gb"),
        planner_gb=plan(recipe, cap),
        date=str(r.get("measured")),
        hardware=(doc.get("stack") or {}).get("gpu_name"),
    )
    if line["peak_gb"] and line["planner_gb"]:
        line["peak_vs_planner"] = round(line["peak_gb"] / line["planner_gb"] - 1, 4)
    return line


def assemble(folders: list[Path], plan=planner_gb) -> list[dict[str, Any]]:
    """The entries of every ``RECIPE__SHAPE`` run in ``folders`` (a result file, or a log of a run that
    gave none), in recipe then shape order."""
    stems: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*__*.*")):
            parts = path.stem.split("__")
            if path.suffix in (".yaml", ".log") and len(parts) > 1 and parts[1] in SHAPES:
                stems.setdefault(path.stem, path.with_suffix(".yaml"))
    return [entry(path, plan) for _, path in sorted(stems.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.full_size", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    q = sub.add_parser("queue", help="print the queue lines")
    q.add_argument("--write", action="store_true", help=f"rewrite {QUEUE.relative_to(ROOT)} below its comments")
    a = sub.add_parser("assemble", help="write the table of the runs in DIR...")
    a.add_argument("folders", nargs="+", type=Path, metavar="DIR")
    a.add_argument("--out", type=Path, required=True)
    opts = ap.parse_args(argv)
    if opts.command == "queue":
        lines = queue_lines()
        if not opts.write:
            print("\n".join(lines))
            return 0
        head = [line for line in QUEUE.read_text().splitlines() if line.startswith("#")] if QUEUE.is_file() else []
        write_text_atomic(QUEUE, "\n".join([*head, *lines]) + "\n")
        print(f"full_size: {len(lines)} steps -> {QUEUE.relative_to(ROOT)}")
        return 0
    missing = [str(f) for f in opts.folders if not f.is_dir()]
    if missing:
        print(f"full_size: no folder {', '.join(missing)}", file=sys.stderr)
        return 2
    entries = assemble(opts.folders)
    if not entries:
        print(f"full_size: no RECIPE__SHAPE result or log in {', '.join(map(str, opts.folders))}", file=sys.stderr)
        return 2
    write_text_atomic(opts.out, json.dumps(entries, indent=1) + "\n")
    print(f"full_size: {len(entries)} runs -> {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
