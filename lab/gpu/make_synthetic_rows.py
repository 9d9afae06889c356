#!/usr/bin/env python3
"""Build a small, deterministic SFT row set for the GPU evidence runs (no download).

Conversations are synthetic arithmetic dialogues (system / user / assistant turns), so the
assistant-only loss has something learnable; a byte-level BPE tokenizer is trained on them
with the Qwen chat special tokens. The rows are built by scripts/build_sft_rows.py's library
in the benchmark workload's layout (``eos_joined``), rendered as plain ChatML (``chatml``): the
rows the published H200 SFT run trained on.

    python lab/gpu/make_synthetic_rows.py --out lab/evidence/sft_rows_synthetic --row-tokens 8192
"""

import argparse
import json
import random
import tempfile
from pathlib import Path

from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.vl.byte_bpe import train_byte_bpe

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def conversations(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": "You are a careful calculator."})
        msgs.append({"role": "user", "content": f"What is {a} {op} {b}?"})
        msgs.append({"role": "assistant", "content": f"{a} {op} {b} = {value}."})
        yield {"messages": msgs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--row-tokens", type=int, default=8192)
    ap.add_argument("--conversations", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    convs = list(conversations(args.conversations, args.seed))
    tok = train_byte_bpe((f"{m['role']}\n{m['content']}\n" for c in convs for m in c["messages"]), SPECIAL, 1024)
    tok.save(str(out / "tokenizer.json"))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "conversations.jsonl"
        src.write_text("".join(json.dumps(c) + "\n" for c in convs))
        manifest = build_sft_rows(
            src,
            out / "tokenizer.json",
            out / "rows",
            row_tokens=args.row_tokens,
            seed=args.seed,
            overwrite=True,
            progress=False,
            chat_format="chatml",
            packing="eos_joined",
        )
    print(json.dumps({k: manifest[k] for k in ("rows", "row_tokens", "supervised_ratio", "rows_sha256")}))


if __name__ == "__main__":
    main()
