#!/usr/bin/env python3
"""Time row building against a conversation's turn count, side by side in one process:

    python scripts/bench_row_building.py --out results/data_build_throughput.json

Builds two inputs of the same conversations' worth of tokens, one of conversations with few turns and
one with many (the same words, cut into more, shorter turns), renders each with the tokenizer folder's
chat template as ``build_sft_rows.py`` does, alternating the two inputs over ``--repeats`` rounds, and
writes the seconds per conversation of each, their ratio and conversations/s to a result file. A
rendering linear in the turns keeps the ratio near 1; one quadratic in them grows with the turns.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
WORDS = "plan route weather river bridge city train harbour market museum garden tower".split()


def conversation(index: int, turns: int, words: int) -> dict:
    """``turns`` user/assistant pairs sharing ``words`` words, with reasoning on each reply."""
    per_turn = max(1, words // (2 * turns))
    text = lambda k: " ".join(WORDS[(index + k + j) % len(WORDS)] for j in range(per_turn))  # noqa: E731
    messages = [{"role": "system", "content": "You help plan trips."}]
    for k in range(turns):
        messages.append({"role": "user", "content": text(2 * k)})
        messages.append({"role": "assistant", "content": text(2 * k + 1), "reasoning_content": "check"})
    return {"messages": messages}


def shown(path: str) -> str:
    """A path as the result file records it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else path


def seconds_per_conversation(renderer, records: list[dict]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = sum(len(renderer.render(r["messages"])[0]) for r in records)
    return (time.perf_counter() - start) / len(records), tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the result file (.json); an existing file is kept")
    ap.add_argument("--tokenizer", default=str(TOKENIZER), help="tokenizer folder with its chat template")
    ap.add_argument("--few", type=int, default=4, help="turns per conversation of the first input (default 4)")
    ap.add_argument("--many", type=int, default=64, help="turns per conversation of the second (default 64)")
    ap.add_argument("--words", type=int, default=2048, help="words per conversation (default 2048)")
    ap.add_argument("--conversations", type=int, default=40, help="conversations per input (default 40)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds; the fastest counts (default 3)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out")
    opts = ap.parse_args(argv)
    out = Path(opts.out)
    if out.exists() and not opts.overwrite:
        print(f"bench_row_building.py: error: {out} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    if min(opts.few, opts.many, opts.words, opts.conversations, opts.repeats) < 1:
        print(
            "bench_row_building.py: error: --few, --many, --words, --conversations, --repeats: at least 1",
            file=sys.stderr,
        )
        return 2
    from bridge_recipes.data.chat_template import TemplateRenderer
    from bridge_recipes.data.conversations import SftRowsError

    try:
        renderer = TemplateRenderer(opts.tokenizer)
    except SftRowsError as exc:
        print(f"bench_row_building.py: error: {exc}", file=sys.stderr)
        return 2
    inputs = {
        turns: [conversation(i, turns, opts.words) for i in range(opts.conversations)]
        for turns in (opts.few, opts.many)
    }
    roads = {"one rendering": renderer.generation_prompt, "prefix renders": None}
    cases = []
    for road, prompt in roads.items():
        renderer.generation_prompt = prompt  # None: every conversation takes the general road
        best: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for round_ in range(opts.repeats):
            for turns, records in inputs.items():
                seconds, tokens[turns] = seconds_per_conversation(renderer, records)
                best[turns] = min(best.get(turns, seconds), seconds)
                print(
                    f"{road}, round {round_ + 1}: {turns} turns: {seconds * 1e3:.2f} ms per conversation", flush=True
                )
        cases += [
            {
                "road": road,
                "turns": turns,
                "tokens_per_conversation": round(tokens[turns] / opts.conversations, 1),
                "seconds_per_conversation": round(best[turns], 6),
                "conversations_per_s": round(1 / best[turns], 1),
                "microseconds_per_token": round(best[turns] / tokens[turns] * opts.conversations * 1e6, 3),
            }
            for turns in (opts.few, opts.many)
        ]
    by = {(c["road"], c["turns"]): c for c in cases}
    ratio = {
        road: by[road, opts.many]["seconds_per_conversation"] / by[road, opts.few]["seconds_per_conversation"]
        for road in roads
    }
    result = {
        "what": "rendering and tokenizing one conversation with the chat template, many turns against few",
        "command": "python scripts/bench_row_building.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (one used)",
        "tokenizer": shown(opts.tokenizer),
        "words_per_conversation": opts.words,
        "conversations": opts.conversations,
        "cases": cases,
        "many_over_few": {road: round(r, 3) for road, r in ratio.items()},
        "prefix_renders_over_one_rendering": round(
            by["prefix renders", opts.many]["seconds_per_conversation"]
            / by["one rendering", opts.many]["seconds_per_conversation"],
            2,
        ),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{opts.many} turns over {opts.few}: {ratio['one rendering']:.2f}x the time per conversation "
        f"({ratio['prefix renders']:.2f}x by prefix renders); written to {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
