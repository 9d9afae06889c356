"""Command line of scripts/build_vl_dataset.py.

    build_vl_dataset.py --input conversations.jsonl --processor HF_FOLDER --out DIR [--val-fraction F]

Exit status 0 when the dataset is written, 2 on bad input (the message names the flag or file
and the fix), 130 after a Ctrl-C (--out as it was); conversations that cannot be used are
skipped, counted by reason in the summary and the manifest, never fatal.
"""

from __future__ import annotations

import argparse
import logging
import sys

from bridge_recipes.data.render_workers import default_workers
from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import INTERRUPTED, add_build_options, interrupted
from bridge_recipes.vl import vl_dataset, vl_processor
from bridge_recipes.vl.vl_conversations import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build_vl_dataset.py",
        description="Turn image conversations (JSONL: OpenAI image parts or LLaVA <image> placeholders) into the "
        "Energon dataset the VL recipes read with --dataset energon dataset.path=OUT, rendered with the "
        "checkpoint's processor and chat template (docs/sft_data.md).",
    )
    p.add_argument("--input", required=True, help="the conversations, one JSON record a line (.jsonl)")
    quiet.add_flag(p)
    p.add_argument(
        "--processor",
        required=True,
        metavar="HF_FOLDER",
        help="the checkpoint's Hugging Face folder: tokenizer, chat template and image processor",
    )
    p.add_argument("--val-fraction", type=float, default=0.0, help="fraction of conversations for validation")
    p.add_argument("--seed", type=int, default=vl_dataset.DEFAULT_SEED, help="seed of the conversation order")
    p.add_argument("--samples-per-shard", type=int, default=vl_dataset.DEFAULT_SAMPLES_PER_SHARD)
    p.add_argument(
        "--max-image-bytes",
        type=int,
        default=DEFAULT_MAX_IMAGE_BYTES,
        help="an image file larger than this skips its conversation",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="an image of more pixels skips its conversation (checked before decoding)",
    )
    add_build_options(p, work="reading images and rendering conversations", result="the dataset is")
    return p


def summary(m: dict, out: str) -> str:
    """What was built and what was left out, by reason."""
    c, splits, proc = m["conversations"], m["splits"], m["processor"]
    train, val = splits["train"], splits.get("val")
    shards = sum(len(s["shards"]) for s in splits.values())
    images = sum(s["images"] for s in splits.values())
    lines = [
        f"{train['samples']} training samples in {len(train['shards'])} shard(s)"
        + (f", {val['samples']} validation samples in {len(val['shards'])}" if val else ", no validation split")
        + f"; {images} images, {c['text_only']} text-only conversation(s)",
        f"conversations: {c['used']} used, {c['skipped_total']} skipped, of {c['read']} read",
    ]
    lines += [f"  skipped {n:>8}  {reason}" for reason, n in c["skipped"].items()]
    longest = max(s["sequence_tokens_at_processor_pixels"]["max"] for s in splits.values())
    lines += [
        f"longest sample: {longest} tokens with the processor's image budget ({proc['min_pixels']:,} to "
        f"{proc['max_pixels']:,} pixels); the recipe's dry run checks its own",
        f"processor: {proc['path']} ({proc['class']}, {proc['patch_size']}-pixel patches, "
        f"{proc['merge_size']} x {proc['merge_size']} merge)",
        f"wrote {out}/ ({shards} shard(s), {vl_dataset.META_DIR}/, {vl_dataset.SAMPLES_FILE}, manifest.json); "
        f"train with --dataset energon dataset.path={out}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        with logging_redirect_tqdm():
            manifest = vl_dataset.build_vl_dataset(
                args.input,
                args.processor,
                args.out,
                val_fraction=args.val_fraction,
                seed=args.seed,
                samples_per_shard=args.samples_per_shard,
                max_image_bytes=args.max_image_bytes,
                max_image_pixels=args.max_image_pixels,
                overwrite=args.overwrite,
                progress=not args.no_progress,
                workers=default_workers() if args.workers is None else args.workers,
            )
    except vl_processor.VlDatasetError as e:
        print(f"build_vl_dataset.py: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(interrupted(args.out), file=sys.stderr)
        return INTERRUPTED
    print(summary(manifest, args.out))
    return 0


if __name__ == "__main__":
    from bridge_recipes.utils.outputs import exit_on_termination

    exit_on_termination()  # a kill removes the staging folder beside --out
    sys.exit(main())
