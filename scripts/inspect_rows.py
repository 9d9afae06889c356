#!/usr/bin/env python3
"""Show what SFT rows hold: each row decoded, its supervised spans (loss mask 1) marked, and its
statistics (padding, supervised share, conversations).

    python scripts/inspect_rows.py data/sft-rows                 # the first three training rows
    python scripts/inspect_rows.py data/sft-rows --row 7 --row 9
    python scripts/inspect_rows.py data/sft-rows --split val

Rows of a thinking template (Qwen3.5/3.6) say how many conversations carry reasoning, and each empty think
block left out of the loss is shown between (( and )).

The rows are checked against their manifest first (as training does); the tokenizer is the one
they were built with (--tokenizer DIR if it moved). Exit status 2 on bad input. The logic lives in
bridge_recipes.data.inspect_rows.
"""

import argparse
import sys

from bridge_recipes.data.inspect_rows import inspect_rows
from bridge_recipes.data.integrity import RowsIntegrityError
from bridge_recipes.utils import quiet


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quiet.add_flag(ap)
    ap.add_argument("rows", metavar="ROWS", help="a folder written by scripts/build_sft_rows.py")
    ap.add_argument("--row", type=int, action="append", metavar="N", help="row to show (repeatable; default 0-2)")
    ap.add_argument("--split", default="train", choices=("train", "val"), help="train rows or the val/ rows")
    ap.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder or tokenizer.json (default: the manifest's)")
    args = ap.parse_args(argv)
    try:
        print(inspect_rows(args.rows, args.row, args.split, args.tokenizer))
    except RowsIntegrityError as e:
        print(f"inspect_rows.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    sys.exit(main())
