#!/usr/bin/env python3
"""Build the packing benchmark's rows: the same lognormal-length chats (a mean of about 1,700
tokens) as ``boundaries`` and as ``one_per_row`` rows of 8,192 tokens, with the fixture tokenizer;
with a row length, as ``boundaries`` rows of that length only.

    python lab/gpu/make_lognormal_rows.py OUT          # OUT/boundaries, OUT/one_per_row
    python lab/gpu/make_lognormal_rows.py OUT 32768    # OUT/boundaries of 32,768-token rows
"""

import sys
from pathlib import Path

from bridge_recipes.data.synthetic_chat import build_lognormal_rows

TOKENIZER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen35_chat_tokenizer"

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or not (len(sys.argv) == 2 or sys.argv[2].isdigit()):
        sys.exit("usage: make_lognormal_rows.py OUT [ROW_TOKENS]")
    row_tokens = int(sys.argv[2]) if len(sys.argv) == 3 else 8192
    for packing in ("boundaries", "one_per_row") if len(sys.argv) == 2 else ("boundaries",):
        m = build_lognormal_rows(Path(sys.argv[1]) / packing, TOKENIZER, packing, row_tokens=row_tokens)
        print(f"{packing}: {m['rows']} rows, {m['padding_tokens']} padding, {m['stream_tokens']} conversation tokens")
