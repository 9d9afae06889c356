#!/usr/bin/env python3
"""How fast SFT rows are built, side by side in one command:

    python scripts/bench_row_building.py --out data_build_throughput.json

1. Turn scaling: conversations of few and of many turns (the same words cut into more, shorter turns),
   rendered with the tokenizer folder's chat template as ``build_sft_rows.py`` does, alternating the two
   over ``--repeats`` rounds, once through the one rendering and once through the prefix renders; the
   seconds per conversation of each and their ratio per token (``turn_scaling_ratio``: many over few, one
   rendering; per token because more turns add a few header tokens to the same words).
2. Build throughput: ``build_sft_rows.py`` on a generated JSONL of multi-turn conversations, once per
   worker count (each in a process of its own, its peak resident memory read from the kernel), against the
   tokenizer's own batch encode of the same rendered text on the same cores (``raw_encode_tokens_per_s``,
   the limit the build approaches). A build's seconds start after a warm-up build of 16 conversations in
   its process (``startup_seconds``: the imports, paid once per process whatever the input's size). Then
   the same build on ``RSS_SCALE`` copies of the input: its peak resident memory beside the first's (a
   streaming build's does not grow with the input).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
WORDS = "plan route weather river bridge city train harbour market museum garden tower".split()
RSS_SCALES = (2, 4)  # the larger inputs of the memory check: this many copies of the build input
BUILD_TURNS = (2, 4, 8, 16, 32)  # turns per conversation of the build input, drawn uniformly
MEASURE = """
import json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
from bridge_recipes.data import sft_rows
warm = Path(sys.argv[3] + "_warm_up")
with open(sys.argv[1]) as source:
    warm.with_suffix(".jsonl").write_text("".join(line for _, line in zip(range(16), source)))
sft_rows.build_sft_rows(warm.with_suffix(".jsonl"), sys.argv[2], warm, row_tokens=int(sys.argv[4]), progress=False)
imports = time.perf_counter() - start  # paid once per process whatever the input's size: timed apart
start = time.perf_counter()
m = sft_rows.build_sft_rows(sys.argv[1], sys.argv[2], sys.argv[3], row_tokens=int(sys.argv[4]),
                            workers=int(sys.argv[5]), progress=False)
seconds = time.perf_counter() - start
# VmHWM: this program's own peak (ru_maxrss would carry over the launching process's, through exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
workers_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "startup_seconds": imports, "rows": m["rows"], "rows_sha256": m["rows_sha256"],
                  "conversations": m["conversations"]["used"], "stream_tokens": m["stream_tokens"],
                  "peak_rss_mb": hwm, "worker_peak_rss_mb": workers_peak}))
"""


def conversation(index: int, turns: int, words: int) -> dict:
    """``turns`` user/assistant pairs sharing ``words`` words, with reasoning on each reply."""
    per_turn = max(1, words // (2 * turns))

    def text(k: int) -> str:
        return " ".join(WORDS[(index + k + j) % len(WORDS)] for j in range(per_turn))

    messages = [{"role": "system", "content": "You help plan trips."}]
    for k in range(turns):
        messages.append({"role": "user", "content": text(2 * k)})
        messages.append({"role": "assistant", "content": text(2 * k + 1), "reasoning_content": "check"})
    return {"messages": messages}


LOG: list[str] = []  # what was printed, written beside the result with --log


def say(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)


def shown(path: str) -> str:
    """A path as the result file records it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else path


def turn_scaling(renderer, opts) -> tuple[list[dict], dict]:
    inputs = {t: [conversation(i, t, opts.words) for i in range(opts.conversations)] for t in (opts.few, opts.many)}
    roads = {"one rendering": renderer.generation_prompt, "prefix renders": None}
    cases = []
    for road, prompt in roads.items():
        renderer.generation_prompt = prompt  # None: every conversation takes the general road
        best: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for round_ in range(opts.repeats):
            for turns, records in inputs.items():
                start = time.perf_counter()
                tokens[turns] = sum(len(renderer.render(r["messages"])[0]) for r in records)
                seconds = (time.perf_counter() - start) / len(records)
                best[turns] = min(best.get(turns, seconds), seconds)
                ms = seconds * 1e3
                say(f"{road}, round {round_ + 1}: {turns} turns: {ms:.2f} ms per conversation")
        cases += [
            {
                "road": road,
                "turns": turns,
                "tokens_per_conversation": round(tokens[turns] / opts.conversations, 1),
                "seconds_per_conversation": round(best[turns], 6),
            }
            for turns in (opts.few, opts.many)
        ]
    renderer.generation_prompt = roads["one rendering"]
    by = {(c["road"], c["turns"]): c["seconds_per_conversation"] for c in cases}
    per_token = {k: c["seconds_per_conversation"] / c["tokens_per_conversation"] for k, c in zip(by, cases)}
    ratios = {road: round(per_token[road, opts.many] / per_token[road, opts.few], 3) for road in roads}
    return cases, ratios


def build_throughput(renderer, opts, work: Path) -> tuple[list[dict], dict]:
    rng = random.Random(0)
    records = [
        conversation(i, rng.choice(BUILD_TURNS), max(64, round(rng.lognormvariate(6.0, 0.6))))
        for i in range(opts.build_conversations)
    ]
    source = work / "conversations.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    texts = [renderer.hf.apply_chat_template(r["messages"], tokenize=False) for r in records]
    start = time.perf_counter()
    encoded = renderer.backend.encode_batch(texts, add_special_tokens=False)  # the tokenizer's own threads
    raw_seconds = time.perf_counter() - start
    raw = {
        "tokens": sum(len(e.ids) for e in encoded),
        "seconds": round(raw_seconds, 3),
        "tokens_per_s": round(sum(len(e.ids) for e in encoded) / raw_seconds, 1),
    }

    say(f"raw encode: {raw['tokens']} tokens in {raw_seconds:.3f} s, {raw['tokens_per_s']:,.0f} tokens/s")

    def measure(source: Path, workers: int, label: str) -> dict:
        cmd = [sys.executable, "-c", MEASURE, str(source), opts.tokenizer, str(work / f"rows_{label}")]
        done = subprocess.run([*cmd, str(opts.row_tokens), str(workers)], capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            raise SystemExit(f"bench_row_building.py: error: the build {label} failed:\n{done.stderr}")
        run = json.loads(done.stdout.strip().splitlines()[-1])
        run["workers"] = workers
        run["conversations_per_s"] = round(run["conversations"] / run["seconds"], 1)
        run["tokens_per_s"] = round(run["stream_tokens"] / run["seconds"], 1)
        say(
            f"build {label}: {run['conversations']} conversations, {run['stream_tokens']} tokens in "
            f"{run['seconds']:.3f} s, {run['tokens_per_s']:,.0f} tokens/s, peak RSS {run['peak_rss_mb']:.1f} MB"
        )
        return run

    runs = [measure(source, workers, f"with {workers} worker(s)") for workers in opts.workers]
    if len({r["rows_sha256"] for r in runs}) != 1:
        raise SystemExit("bench_row_building.py: error: the worker counts built different rows")
    # the same conversations, more times over (each past the reader's window of conversations): a streaming
    # build's peak memory does not grow with them
    for scale in RSS_SCALES:
        larger = work / f"conversations_{scale}x.jsonl"
        larger.write_text(source.read_text() * scale)
        runs.append(measure(larger, max(opts.workers), f"of {scale}x the input"))
    raw["turns_mean"] = round(sum((len(r["messages"]) - 1) / 2 for r in records) / len(records), 2)
    return runs, raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the result file (.json); an existing file is kept")
    ap.add_argument("--tokenizer", default=str(TOKENIZER), help="tokenizer folder with its chat template")
    ap.add_argument("--few", type=int, default=4, help="turn scaling: turns of the first input (default 4)")
    ap.add_argument("--many", type=int, default=64, help="turn scaling: turns of the second (default 64)")
    ap.add_argument("--words", type=int, default=2048, help="turn scaling: words per conversation (default 2048)")
    ap.add_argument("--conversations", type=int, default=40, help="turn scaling: conversations per input")
    ap.add_argument("--repeats", type=int, default=5, help="turn scaling: alternating rounds, the fastest counts")
    ap.add_argument("--build-conversations", type=int, default=3000, help="build: conversations (default 3000)")
    ap.add_argument("--row-tokens", type=int, default=8192, help="build: tokens per row (default 8192)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="build: worker counts (default 1 2)")
    ap.add_argument("--log", default=None, help="also write what is printed to this file (named in the result)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out (and --log)")
    opts = ap.parse_args(argv)
    out = Path(opts.out)
    for path in (out, Path(opts.log) if opts.log else None):
        if path is not None and path.exists() and not opts.overwrite:
            print(f"bench_row_building.py: error: {path} exists; pass --overwrite to replace it", file=sys.stderr)
            return 2
    counts = (opts.few, opts.many, opts.words, opts.conversations, opts.repeats, opts.build_conversations)
    counts += tuple(opts.workers)
    if min(counts) < 1:
        print("bench_row_building.py: error: every count and --workers: at least 1", file=sys.stderr)
        return 2
    from bridge_recipes.chat.chat_template import TemplateRenderer
    from bridge_recipes.chat.conversations import SftRowsError

    try:
        renderer = TemplateRenderer(opts.tokenizer)
    except SftRowsError as exc:
        print(f"bench_row_building.py: error: {exc}", file=sys.stderr)
        return 2
    cases, ratios = turn_scaling(renderer, opts)
    with tempfile.TemporaryDirectory() as tmp:
        runs, raw = build_throughput(renderer, opts, Path(tmp))
    runs, larger = runs[: -len(RSS_SCALES)], runs[-len(RSS_SCALES) :]
    best = max(runs, key=lambda r: r["tokens_per_s"])
    one = next((r for r in runs if r["workers"] == 1), None)
    result = {
        "what": "building packed SFT rows: throughput by worker count, and rendering time against turns",
        "command": "python scripts/bench_row_building.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "tokenizer": shown(opts.tokenizer),
        "log": shown(opts.log) if opts.log else None,
        "conversations": best["conversations"],
        "turns_mean": raw["turns_mean"],
        "tokens": best["stream_tokens"],
        "workers": best["workers"],
        "seconds": round(best["seconds"], 3),
        "conversations_per_s": best["conversations_per_s"],
        "tokens_per_s": best["tokens_per_s"],
        "raw_encode_tokens_per_s": raw["tokens_per_s"],
        "share_of_raw_encode": round(best["tokens_per_s"] / raw["tokens_per_s"], 3),
        "peak_rss_mb": round(best["peak_rss_mb"], 1),
        "peak_rss_mb_of_larger_inputs": [
            {"conversations": r["conversations"], "peak_rss_mb": round(r["peak_rss_mb"], 1)} for r in larger
        ],
        "turn_scaling_ratio": ratios["one rendering"],
        "workers_speedup": {str(r["workers"]): round(one["seconds"] / r["seconds"], 3) for r in runs} if one else None,
        # what the numbers are held to, set before the first measurement
        "goals": {"share_of_raw_encode": ">= 0.30", "turn_scaling_ratio": "<= 1.5", "workers_speedup 2": ">= 1.7"},
        "builds": runs,
        "raw_encode": raw,
        "turn_scaling": {"few": opts.few, "many": opts.many, "words": opts.words, "ratios": ratios, "cases": cases},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    say(
        f"{result['tokens_per_s']:,.0f} tokens/s with {result['workers']} worker(s) "
        f"({result['share_of_raw_encode']:.0%} of the raw encode); {opts.many} turns over {opts.few}: "
        f"{ratios['one rendering']:.2f}x ({ratios['prefix renders']:.2f}x by prefix renders); written to {out}"
    )
    if opts.log:
        Path(opts.log).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.log).write_text("\n".join(LOG) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
