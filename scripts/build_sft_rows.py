#!/usr/bin/env python3
"""Build packed fixed-length SFT rows with an assistant-only loss mask:

    python scripts/build_sft_rows.py --input train.jsonl --tokenizer /models/Qwen3.5 \\
        --out data/sft-rows --row-tokens 8192 --seed 42 --val-fraction 0.01

Each input file's record format is detected from its first record: OpenAI messages (roles system,
developer, user, assistant, tool), ShareGPT (conversations of from/value turns) or Alpaca
(instruction, input, output, system, history); docs/sft_data.md shows one record of each.
Conversations are rendered with the tokenizer folder's own chat template and packed whole, several
to a row, with their boundaries (``--packing boundaries``, the default: each conversation attends
only to itself and a row is mostly conversation tokens); ``--packing one_per_row`` puts one
conversation in each padded row; ``--packing eos_joined`` builds the OpenRecipes benchmark workload
(qwen35-tulu3-fixed8192-v1: seed 42, 8,192-token rows, EOS-joined). Writes OUT/rows.parquet,
OUT/manifest.json and, with a validation split, OUT/val/; all of it appears at once when the
build completes. Bad input exits with status 2; Ctrl-C stops the build (and its workers) with
status 130 and leaves --out as it was; one build at a time into an --out. The logic lives in
bridge_recipes.data.sft_rows and the modules it calls beside it (importable and tested).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tqdm.contrib.logging import logging_redirect_tqdm

from bridge_recipes.chat.chat_formats import DEFAULT_ROLE_MAP, ROLE_NOTE_PREFIX, parse_role_map
from bridge_recipes.chat.chat_render import DEFAULT_EOS_TOKEN
from bridge_recipes.chat.conversations import DEFAULT_MESSAGES_KEY
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data import sft_rows
from bridge_recipes.data.conversation_rendering import reasoning_share, thinking_warning
from bridge_recipes.data.integrity import MANIFEST_FILE, ROWS_FILE, VAL_DIR
from bridge_recipes.data.long_conversations import DEFAULT_LONG, LONG_MODES
from bridge_recipes.data.packing import PACKING_MODES
from bridge_recipes.data.render_workers import default_workers
from bridge_recipes.data.split_packing import DEFAULT_MAX_DROPPED_SHARE
from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import INTERRUPTED, add_build_options, exit_on_termination, interrupted


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quiet.add_flag(p)
    p.add_argument(
        "--input",
        required=True,
        help="local .jsonl / .parquet file, or a Hugging Face dataset id (needs network); OpenAI, ShareGPT or "
        "Alpaca records",
    )
    p.add_argument(
        "--tokenizer",
        required=True,
        help="the model's tokenizer folder (tokenizer.json, chat template), a tokenizer.json for --chat-format chatml",
    )
    p.add_argument(
        "--chat-format",
        choices=sft_rows.CHAT_FORMATS,
        default="template",
        help="template: the tokenizer's chat template (default); chatml: hand-written plain ChatML",
    )
    p.add_argument(
        "--packing",
        choices=PACKING_MODES,
        default=sft_rows.DEFAULT_PACKING,
        help="boundaries: whole conversations packed with their boundaries (default); one_per_row: one "
        "conversation per padded row; eos_joined: the benchmark workload (conversations see the ones before them)",
    )
    p.add_argument(
        "--long",
        choices=LONG_MODES,
        default=DEFAULT_LONG,
        help="a conversation longer than a row: skip it (default: rows hold whole conversations, each token "
        "trained with all its context), split it at turn boundaries into pieces that each begin with the "
        "system prompt, or truncate it to its first row of tokens",
    )
    p.add_argument(
        "--max-dropped-share",
        type=float,
        default=DEFAULT_MAX_DROPPED_SHARE,
        help="the largest share of the tokens the build may leave out of rows of whole conversations (long "
        f"conversations skipped or cut); above it the build stops and writes nothing (default "
        f"{DEFAULT_MAX_DROPPED_SHARE:g}; 1 allows any)",
    )
    p.add_argument(
        "--dedupe",
        action="store_true",
        help="keep one of each repeated conversation (the same tokens), and leave out of training the ones in the "
        "validation split; without it repeats are counted and kept",
    )
    p.add_argument(
        "--train-empty-think",
        action="store_true",
        help="train the empty think block a thinking template (Qwen3.5/3.6) writes before a reply without "
        "reasoning; by default it stays out of the loss, so the model does not learn to close its thinking at once",
    )
    p.add_argument(
        "--role-map",
        action="append",
        metavar="NAME=ROLE",
        help="read turns whose speaker (ShareGPT 'from', OpenAI 'role') is NAME as ROLE (system, user, assistant, "
        f"tool); repeatable. Already read so: {', '.join(f'{n}={r}' for n, r in DEFAULT_ROLE_MAP.items())}",
    )
    p.add_argument("--val-fraction", type=float, default=0.0, help="fraction of conversations for validation rows")
    p.add_argument("--val-input", default=None, help="a separate .jsonl / .parquet file for validation rows")
    p.add_argument("--row-tokens", type=int, default=sft_rows.DEFAULT_ROW_TOKENS)
    p.add_argument("--seed", type=int, default=sft_rows.DEFAULT_SEED)
    p.add_argument(
        "--messages-key",
        default=DEFAULT_MESSAGES_KEY,
        help="the key of an OpenAI-format record's message list (default: messages)",
    )
    p.add_argument("--eos-token", default=DEFAULT_EOS_TOKEN, help="token placed between conversations")
    p.add_argument("--supervise-eos", action="store_true", help="put the EOS separators in the loss (default: not)")
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--revision", default=None, help="dataset revision (passed to the Hub; recorded in the manifest)")
    p.add_argument("--split", default="train", help="split of a Hugging Face dataset")
    add_build_options(p, work="rendering conversations", result="the rows are")
    return p.parse_args(argv)


PADDING_HINT_SHARE = 0.5  # one-per-row rows more than half padding: say what a row length costs


def long_lines(m: dict) -> list[str]:
    """What became of the conversations longer than a row, in tokens, and the row length that keeps 99%."""
    lc = m.get("long_conversations")
    unread = (lc or {}).get("skipped_unread") or {"conversations": 0}
    if not lc or not (lc["longer_than_row"] or unread["conversations"]):
        return []
    t = lc["tokens"]
    total = max(1, t["of_conversations"])
    done = {"skip": "skipped", "split": f"split into {lc['pieces']} pieces", "truncate": "truncated"}[lc["mode"]]
    lines = [
        f"long conversations: {lc['longer_than_row']} of {lc['conversations_measured']} longer than a "
        f"{m['row_tokens']}-token row (the longest {lc['longest_conversation']:,} tokens), {done} "
        f"(--long {lc['mode']})",
        f"  tokens kept {t['kept']:>12,} of {t['of_conversations']:,} ({t['kept'] / total:.1%})",
    ]
    lines += [f"  dropped     {n:>12,}  {reason}" for reason, n in t["dropped"].items()]
    if unread["conversations"]:
        lines.append(
            f"  skipped unread for their size: {unread['conversations']} conversation(s), {unread['bytes']:,} bytes, "
            f"about {unread['tokens_estimated']:,} tokens"
        )
    if "dropped_share" in lc:
        lines.append(f"  share of all the tokens left out: {lc['dropped_share']:.1%} (unread ones included)")
    if t["system_prompt_repeated"]:
        lines.append(f"  system prompt repeated in later pieces: {t['system_prompt_repeated']:,} tokens")
    keep = lc["row_tokens_keeping_99_percent"]
    if keep and keep > m["row_tokens"]:
        lines.append(f"  --row-tokens {keep} would hold whole the conversations with 99% of the tokens")
    if lc["mode"] == "skip":
        lines.append("  --long split keeps them as pieces at turn boundaries; --long truncate keeps their beginning")
    return lines


NOTE_WORDS = {
    "assistant_turns_with_weight_0": "assistant turn(s) with weight 0: kept as context, not trained",
    "blank_user_turns": "user turn(s) with only white space",
    "user_turns_in_a_row": "user turn(s) right after another user turn",
    "ending_on_a_user_turn": "conversation(s) ending on a user turn nobody answers",
}


def note_words(note: str) -> str:
    """A turn note as the summary says it: a mapped speaker's name says where its role came from."""
    if note.startswith(ROLE_NOTE_PREFIX):
        name, _, role = note.removeprefix(ROLE_NOTE_PREFIX).rpartition("=")
        given = "default" if DEFAULT_ROLE_MAP.get(name) == role else f"--role-map {name}={role}"
        return f"turn(s) from {name!r} read as {role} ({given})"
    return NOTE_WORDS.get(note, note)


def data_lines(c: dict) -> list[str]:
    """What the used conversations hold that was kept but is worth knowing: the record formats of a file
    that mixes them, repeated conversations, and the turn notes."""
    lines = []
    formats = c.get("record_formats") or {}
    if len(formats) > 1:
        lines.append(
            "  record formats (each record read as its own): " + ", ".join(f"{n} {f}" for f, n in formats.items())
        )
    if c.get("duplicates"):
        what = "skipped (--dedupe)" if c.get("duplicates_removed") else "kept; --dedupe keeps one of each"
        lines.append(f"  repeated {c['duplicates']:>7}  conversation(s) the same as an earlier one, {what}")
    lines += [f"  note {n:>11}  {note_words(note)}" for note, n in (c.get("notes") or {}).items()]
    return lines


def thinking_lines(m: dict) -> list[str]:
    """How many conversations end on a reply with reasoning, what becomes of the empty think blocks of a
    thinking template, and the warning when too few carry reasoning."""
    c, thinking = m["conversations"], m.get("thinking") or {}
    share = reasoning_share(c)
    if share is None or not (thinking.get("template") or c["with_reasoning"]):
        return []
    counts = f"{c['with_reasoning']:,} of {c['used']:,} conversations ({share:.1%}) end on a reply with reasoning"
    if not thinking.get("template"):
        return [f"reasoning: {counts}; the chat format writes no think block"]
    trained = (
        "trained (--train-empty-think)"
        if thinking.get("empty_think_trained")
        else "not trained (--train-empty-think trains them)"
    )
    lines = [
        f"thinking template: {counts}, {c['without_reasoning']:,} without",
        f"  empty think blocks {c['replies_with_empty_think']:>7,}  before replies without reasoning, {trained}",
    ]
    if warning := thinking_warning(thinking, c):
        lines.append(f"  warning: {warning}")
    return lines


def summary(m: dict, out: str) -> str:
    """What was built and what was left out, by reason."""
    c = m["conversations"]
    lines = [
        f"{m['rows']} rows x {m['row_tokens']} tokens ({m['packing']}), supervised ratio {m['supervised_ratio']:.3f}, "
        f"{m['padding_tokens']} padding tokens ({m['padding_share']:.1%} of the rows), "
        f"{m['tail_tokens_dropped']} tail tokens dropped",
        f"conversations: {c['used']} used, {c['skipped_total']} skipped, of {c['read']} read",
    ]
    lines += [f"  skipped {n:>8}  {reason}" for reason, n in c["skipped"].items()]
    lines += data_lines(c)
    lines += thinking_lines(m)
    lines += long_lines(m)
    padding = m["padding_share"]
    if m["packing"] == "one_per_row" and padding > PADDING_HINT_SHARE:
        mean = (m["rows"] * m["row_tokens"] - m["padding_tokens"]) / max(1, m["rows"])
        lines.append(
            f"note: the rows are {padding:.0%} padding (a conversation averages {mean:.0f} of {m['row_tokens']} "
            "tokens); the default --packing boundaries packs several conversations per row"
        )
    v = m.get("validation")
    if v:
        vc = v["conversations"]
        lines.append(f"validation: {v['rows']} rows from {vc['used']} conversations, {vc['skipped_total']} skipped")
        if v.get("conversations_removed_from_training"):
            lines.append(
                f"  removed {v['conversations_removed_from_training']:>8}  training conversation(s) the same as a "
                "validation one (--dedupe)"
            )
        if v.get("conversations_also_in_training"):
            lines.append(
                f"  warning: {v['conversations_also_in_training']} training conversation(s) are also in the "
                "validation split (the same tokens), so its loss on them measures memory; --dedupe removes them "
                "from training"
            )
        lines += [f"  skipped {n:>8}  {reason}" for reason, n in vc["skipped"].items()]
    lines += [
        f"rows_sha256    {m['rows_sha256']}",
        f"parquet_sha256 {m['parquet_sha256']}",
        f"wrote {out}/ ({ROWS_FILE}, {MANIFEST_FILE}" + (f", {VAL_DIR}/)" if v else ")"),
    ]
    return "\n".join(lines)


def options(args: argparse.Namespace) -> sft_rows.RowOptions:
    """The build's settings from the command line."""
    return sft_rows.RowOptions(
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
        chat_format=args.chat_format,
        packing=args.packing,
        val_fraction=args.val_fraction,
        val_input=args.val_input,
        workers=default_workers() if args.workers is None else args.workers,
        long=args.long,
        dedupe=args.dedupe,
        max_dropped_share=args.max_dropped_share,
        train_empty_think=args.train_empty_think,
        role_map=parse_role_map(args.role_map),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        with logging_redirect_tqdm():
            manifest = sft_rows.build_sft_rows(args.input, args.tokenizer, args.out, options(args))
    except SftRowsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted(args.out), file=sys.stderr)
        return INTERRUPTED
    try:
        print(summary(manifest, args.out))
        sys.stdout.flush()
    except BrokenPipeError:  # the summary piped into a reader that stopped early (| head): the build is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    exit_on_termination()  # a kill removes the staging folder beside --out
    sys.exit(main())
