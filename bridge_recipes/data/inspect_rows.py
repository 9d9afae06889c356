"""What an SFT rows folder holds, row by row: the tokens decoded, the supervised spans (loss mask
1) marked, and each row's statistics (padding, supervised share, conversations).

Rows are loaded through :func:`integrity.check_rows`, so what is shown is what training reads;
the tokenizer is the manifest's (the one the rows were built with) unless another is given.
Padding (the trailing EOS tokens of ``one_per_row`` and ``boundaries`` rows) is shown as a count. Rows of a
thinking template say how many conversations carry reasoning, and the empty think block left out of the loss
before a reply without reasoning (the manifest's ``thinking``) is marked where it stands.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge_recipes.data.integrity import MANIFEST_FILE, VAL_DIR, RowsIntegrityError, check_rows, tokenizer_json

OPEN, CLOSE = "[[", "]]"  # around each supervised span
UNTRAINED_OPEN, UNTRAINED_CLOSE = "((", "))"  # around each empty think block left out of the loss


@dataclass(frozen=True)
class RowStats:
    tokens: int
    supervised: int
    padding: int
    conversations: int

    @property
    def supervised_share(self) -> float:
        return self.supervised / self.tokens


def row_stats(ids: np.ndarray, mask: np.ndarray, cu: np.ndarray | None, packing: str, eos_id: int) -> RowStats:
    """A row's counts: padding is the trailing run of EOS tokens outside the loss (none in
    ``eos_joined`` rows, which are cut from one stream); conversations are the boundaries' segments
    (less a padding segment), one per ``one_per_row`` row, and the EOS-separated pieces of an
    ``eos_joined`` row."""
    n = len(ids)
    padding = 0
    if packing != "eos_joined":
        while padding < n and ids[n - 1 - padding] == eos_id and not mask[n - 1 - padding]:
            padding += 1
    if cu is not None:
        conversations = len(cu) - 1 - (1 if padding and n - padding in set(cu.tolist()) else 0)
    elif packing == "eos_joined":
        conversations = int((ids == eos_id).sum()) + 1
    else:
        conversations = 1 if padding < n else 0
    return RowStats(n, int(mask.sum()), padding, conversations)


def row_conversations(
    ids: np.ndarray, mask: np.ndarray, cu: np.ndarray | None, packing: str, eos_id: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (tokens, loss mask) of each conversation a ``boundaries`` or ``one_per_row`` row holds, in
    order, padding (as :func:`row_stats` finds it) stripped: a boundaries row's segments between
    its ``cu_seqlens``, a one_per_row row's one conversation."""
    if packing == "eos_joined":
        raise ValueError("eos_joined rows are cut from one stream: their conversations have no boundaries")
    stats = row_stats(ids, mask, cu, packing, eos_id)
    end = stats.tokens - stats.padding
    if cu is None:
        edges = [0, end] if end else []
    else:  # the padding is a segment of its own when it ends where a conversation does
        edges = [int(c) for c in cu]
        edges = edges[:-1] if stats.padding and end in edges else edges
    return [(ids[a:b], mask[a:b]) for a, b in zip(edges, edges[1:])]


def _spans(mask: np.ndarray, end: int) -> list[tuple[int, int, bool]]:
    """(start, stop, supervised) runs of ``mask[:end]``."""
    out, start = [], 0
    for i in range(1, end + 1):
        if i == end or mask[i] != mask[start]:
            out.append((start, i, bool(mask[start])))
            start = i
    return out


def render_row(
    tokenizer, ids: np.ndarray, mask: np.ndarray, stats: RowStats, eos_token: str, untrained_think: str | None = None
) -> str:
    """The row's text with each supervised span between :data:`OPEN` and :data:`CLOSE`, and each
    ``untrained_think`` (the empty think block left out of the loss) outside them between
    :data:`UNTRAINED_OPEN` and :data:`UNTRAINED_CLOSE`."""
    end = stats.tokens - stats.padding
    parts = []
    for a, b, supervised in _spans(mask, end):
        text = tokenizer.decode([int(t) for t in ids[a:b]], skip_special_tokens=False)
        if not supervised and untrained_think:
            text = text.replace(untrained_think, f"{UNTRAINED_OPEN}{untrained_think}{UNTRAINED_CLOSE}")
        parts.append(f"{OPEN}{text}{CLOSE}" if supervised else text)
    if stats.padding:
        parts.append(f"\n[padding: {stats.padding} x {eos_token}]")
    return "".join(parts)


def thinking_line(thinking: dict, conversations: dict) -> str | None:
    """What rows of a thinking template train of its think blocks, in one line; None for other rows."""
    if not thinking.get("template"):
        return None
    block = json.dumps(thinking.get("empty_think_block"))
    used, with_reasoning = conversations.get("used", "?"), conversations.get("with_reasoning", "?")
    where = (
        f"trained (built with --train-empty-think): inside {OPEN} {CLOSE}"
        if thinking.get("empty_think_trained")
        else f"not trained: shown between {UNTRAINED_OPEN} and {UNTRAINED_CLOSE}"
    )
    return (
        f"thinking template: {with_reasoning} of {used} conversations end on a reply with reasoning; the empty think "
        f"block {block} before a reply without reasoning is {where}"
    )


def inspect_rows(
    folder: str | os.PathLike,
    rows: list[int] | None = None,
    split: str = "train",
    tokenizer: str | os.PathLike | None = None,
) -> str:
    """The report for ``rows`` (default: the first three) of the ``split`` (train or val) rows."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    if split not in ("train", "val"):
        raise RowsIntegrityError(f"--split {split!r}: choose train or val")
    where = folder / VAL_DIR if split == "val" else folder
    if split == "val" and not where.exists() and (folder / MANIFEST_FILE).is_file():
        raise RowsIntegrityError(
            f"--split val: the rows in {folder} have no validation split ({where} does not exist); build one with "
            f"scripts/build_sft_rows.py --val-fraction F (held out of the input) or --val-input FILE, or inspect "
            "--split train"
        )
    loaded = check_rows(where)
    m = loaded.manifest
    tok_file = tokenizer_json(tokenizer or m.get("tokenizer") or "")
    if not tok_file.is_file():
        raise RowsIntegrityError(
            f"the tokenizer the rows were built with ({tok_file}) is not there; pass --tokenizer DIR (its folder)"
        )
    try:
        tok = Tokenizer.from_file(str(tok_file))
    except Exception as exc:  # the tokenizers library raises its own Exception for a file it cannot read
        raise RowsIntegrityError(
            f"{tok_file} is not a tokenizer.json the tokenizers library reads ({exc}); pass --tokenizer DIR, the "
            "folder of the tokenizer the rows were built with"
        ) from None
    count = len(loaded.ids)
    picked = rows if rows is not None else list(range(min(3, count)))
    if bad := [r for r in picked if not 0 <= r < count]:
        raise RowsIntegrityError(f"--row {bad[0]}: {where} holds rows 0 to {count - 1}")
    eos_id, eos = m.get("eos_token_id", 0), m.get("eos_token", "<eos>")
    conv = m.get("conversations", {})
    lines = [
        f"{where}: {count} rows x {m['row_tokens']} tokens ({m['packing']}), supervised share "
        f"{m.get('supervised_ratio', 0):.3f}, {m.get('padding_tokens', 0)} padding tokens, "
        f"{conv.get('used', '?')} conversations ({conv.get('skipped_total', 0)} skipped at build)",
        f"supervised spans (loss mask 1) are shown between {OPEN} and {CLOSE}",
    ]
    thinking = m.get("thinking") or {}
    if line := thinking_line(thinking, conv):
        lines.append(line)
    untrained = None if thinking.get("empty_think_trained") else thinking.get("empty_think_block")
    long = m.get("long_conversations") or {}
    pieces = long.get("mode") == "split" and long.get("pieces")
    if pieces:
        lines.insert(
            1,
            f"{long['longer_than_row']} conversations longer than a row were split into {pieces} pieces at turn "
            "boundaries; each piece begins with its conversation's system prompt and is a segment of its own",
        )
    for r in picked:
        cu = None if loaded.cu is None else loaded.cu[r]
        stats = row_stats(loaded.ids[r], loaded.mask[r], cu, m["packing"], eos_id)
        text = render_row(tok, loaded.ids[r], loaded.mask[r], stats, eos, untrained)
        blocks = text.count(f"{UNTRAINED_OPEN}{untrained}{UNTRAINED_CLOSE}") if untrained else 0
        lines += [
            "",
            f"=== row {r}: {stats.tokens} tokens, {stats.supervised} supervised ({stats.supervised_share:.1%}), "
            f"{stats.padding} padding, {stats.conversations} conversation(s)"
            + (" or pieces" if pieces else "")
            + (f", {blocks} empty think block(s) not trained" if blocks else ""),
            text,
        ]
    return "\n".join(lines)
