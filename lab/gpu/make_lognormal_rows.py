#!/usr/bin/env python3
"""Build the packing benchmark's rows with the fixture tokenizer: the same lognormal-length chats
(a mean of about 1,700 tokens) as ``boundaries`` and as ``one_per_row`` rows of 8,192 tokens; with a
row length, as ``boundaries`` rows of that length only; with ``--long-split``, long multi-turn chats
(a mean of about 4,300 tokens, about one in ten longer than a row) as ``long_split`` boundaries rows,
the long ones split into pieces.

    python lab/gpu/make_lognormal_rows.py OUT               # OUT/boundaries, OUT/one_per_row
    python lab/gpu/make_lognormal_rows.py OUT 32768         # OUT/boundaries of 32,768-token rows
    python lab/gpu/make_lognormal_rows.py OUT --long-split  # OUT/long_split of 8,192-token rows
    python lab/gpu/make_lognormal_rows.py OUT --long-split 32768
"""

import sys
from pathlib import Path

from bridge_recipes.data.synthetic_chat import build_lognormal_rows, build_long_split_rows

TOKENIZER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen35_chat_tokenizer"


def _report(name: str, m: dict) -> None:
    print(f"{name}: {m['rows']} rows, {m['padding_tokens']} padding, {m['stream_tokens']} conversation tokens")


if __name__ == "__main__":
    args = sys.argv[1:]
    split = "--long-split" in args
    rest = [a for a in args if a != "--long-split"]
    if len(rest) not in (1, 2) or not (len(rest) == 1 or rest[1].isdigit()):
        sys.exit("usage: make_lognormal_rows.py OUT [ROW_TOKENS] [--long-split]")
    row_tokens = int(rest[1]) if len(rest) == 2 else 8192
    if split:
        _report("long_split", build_long_split_rows(Path(rest[0]) / "long_split", TOKENIZER, row_tokens=row_tokens))
        sys.exit(0)
    for packing in ("boundaries", "one_per_row") if len(rest) == 1 else ("boundaries",):
        _report(packing, build_lognormal_rows(Path(rest[0]) / packing, TOKENIZER, packing, row_tokens=row_tokens))
