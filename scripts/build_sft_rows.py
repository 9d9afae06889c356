#!/usr/bin/env python3
"""Build packed fixed-length SFT rows with an assistant-only loss mask:

    python scripts/build_sft_rows.py --input train.jsonl --tokenizer /models/Qwen3.5 \\
        --out data/sft-rows --row-tokens 8192 --seed 42 [--max-rows 6400]

Defaults follow the OpenRecipes build qwen35-tulu3-fixed8192-v1 (seed 42, 8,192-token rows).
Writes OUT/rows.parquet and OUT/manifest.json. Bad input exits with status 2. The logic lives
in bridge_recipes.data.sft_rows (importable and tested).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tqdm.contrib.logging import logging_redirect_tqdm

from bridge_recipes.data import sft_rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--input", required=True, help="local .jsonl / .parquet file, or a Hugging Face dataset id (needs network)"
    )
    p.add_argument("--tokenizer", required=True, help="a tokenizer.json file or a folder holding one")
    p.add_argument("--out", required=True, help="output folder (must be empty or new unless --overwrite)")
    p.add_argument("--row-tokens", type=int, default=sft_rows.DEFAULT_ROW_TOKENS)
    p.add_argument("--seed", type=int, default=sft_rows.DEFAULT_SEED)
    p.add_argument("--messages-key", default=sft_rows.DEFAULT_MESSAGES_KEY)
    p.add_argument("--eos-token", default=sft_rows.DEFAULT_EOS_TOKEN, help="token placed between conversations")
    p.add_argument("--supervise-eos", action="store_true", help="put the EOS separators in the loss (default: not)")
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--revision", default=None, help="dataset revision (passed to the Hub; recorded in the manifest)")
    p.add_argument("--split", default="train", help="split of a Hugging Face dataset")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace {sft_rows.ROWS_FILE} and {sft_rows.MANIFEST_FILE} in a non-empty --out (other files are kept)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        with logging_redirect_tqdm():
            manifest = sft_rows.build_sft_rows(
                args.input,
                args.tokenizer,
                args.out,
                row_tokens=args.row_tokens,
                seed=args.seed,
                messages_key=args.messages_key,
                eos_token=args.eos_token,
                supervise_eos=args.supervise_eos,
                max_rows=args.max_rows,
                revision=args.revision,
                split=args.split,
                overwrite=args.overwrite,
                progress=not args.no_progress,
            )
    except sft_rows.SftRowsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m, c = manifest, manifest["conversations"]
    print(
        f"{m['rows']} rows x {m['row_tokens']} tokens, supervised ratio {m['supervised_ratio']:.3f}, "
        f"{c['used']} conversations used, {c['skipped_total']} skipped, "
        f"{m['tail_tokens_dropped']} tail tokens dropped\n"
        f"rows_sha256    {m['rows_sha256']}\n"
        f"parquet_sha256 {m['parquet_sha256']}\n"
        f"wrote {os.path.join(args.out, sft_rows.ROWS_FILE)} and {os.path.join(args.out, sft_rows.MANIFEST_FILE)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
