"""One split's pass of a rows build: its conversations read in the permuted order, rendered (by the
``render_workers`` processes), the long ones skipped, split or truncated (``--long``), packed into rows,
written and counted for the split's manifest. The build (``sft_rows``) runs it for the validation split,
then for the training split.

Malformed conversations are never silently dropped: each one is reported (a warning naming
the source row index and the reason, the first ``MAX_REPORTED`` of them) and counted by
reason in the manifest under ``conversations.skipped``. The source row index is 0-based: the
Parquet row, or for JSONL the non-blank line (blank lines are not conversations; they are
counted as ``conversations.blank_lines``).

Counts in the manifest obey ``stream_tokens + padding_tokens == (rows +
rows_skipped_without_targets) * row_tokens + tail_tokens_dropped``: ``stream_tokens`` counts
every token of the used conversations and EOS separators that were produced,
``padding_tokens`` the padding of boundaries and one_per_row rows, ``tail_tokens_dropped`` the ones in no row
(the final partial row of eos_joined rows, or, when ``max_rows`` stopped the build, what was
read but not written). ``conversations`` holds ``indexed`` (in the source), ``read``, ``used``,
``skipped`` (by reason), ``skipped_total``, ``skipped_examples``, ``blank_lines``, and of the used ones
``with_reasoning`` / ``without_reasoning`` (by their last reply) and ``replies_with_empty_think``.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bridge_recipes.chat.conversations import JsonlSource, ParquetSource
from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.data.conversation_rendering import Renderer, _prepare, conversation_fingerprint
from bridge_recipes.data.long_conversations import LongConversations, TurnCutter
from bridge_recipes.data.packing import RowPacker, packer_for
from bridge_recipes.data.render_workers import _stop_on_worker_error, prepared
from bridge_recipes.data.row_writer import RowWriter

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # malformed conversations logged one by one (and kept in the manifest)
IN_VALIDATION = "also_in_validation"  # skip reason: a training conversation --dedupe removes, being in validation
# Rows that hold whole conversations: a build that leaves out more than this share of the tokens (long
# conversations skipped or cut) stops before writing, unless --max-dropped-share allows more.
DEFAULT_MAX_DROPPED_SHARE = 0.10


@dataclass(frozen=True)
class _Packing:
    """How a split's conversations become rows: the same for the training and the validation split."""

    render: Renderer
    eos_id: int
    row_tokens: int
    packing: str
    supervise_eos: bool
    read_window: int
    rows_per_batch: int
    progress: bool
    workers: int
    long_mode: str
    cutter: TurnCutter | None
    context_limit: int
    dedupe: bool = False
    max_dropped_share: float = DEFAULT_MAX_DROPPED_SHARE


@dataclass
class _Tally:
    """What one split's pass counts as it reads, packs and writes."""

    read: int = 0
    used: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    rows_without_targets: int = 0
    padding: int = 0  # in the rows written or skipped without targets
    segments: int = 0  # conversations and pieces of split ones in the rows written (boundaries rows)
    in_validation: int = 0
    formats: Counter = field(default_factory=Counter)  # record formats of the conversations used
    notes: Counter = field(default_factory=Counter)  # what the used conversations hold that is reported
    hashes: array = field(default_factory=lambda: array("q"))  # of the used conversations (duplicates counted)
    kept: set[int] = field(default_factory=set)  # with --dedupe: those of the conversations used so far
    duplicates: int = 0
    reasoning: int = 0  # used conversations whose last reply carries reasoning
    empty_thinks: int = 0  # trained replies of the used conversations that open with an empty think block

    def skip(self, e: MalformedConversation, where: str) -> None:
        """A skipped conversation: counted by reason, the first :data:`MAX_REPORTED` logged and kept
        (``where``: the record as its reader counts it, from 1)."""
        self.skipped[e.reason] += 1
        if len(self.examples) < MAX_REPORTED:
            self.examples.append(e.at(where))
            log.warning("skipping conversation, %s", e.at(where))

    def repeated(self, fingerprint: bytes, dedupe: bool) -> bool:
        """Whether a used conversation repeats an earlier one of the split (counted); with ``dedupe`` it is
        then skipped. 8 bytes a conversation when duplicates are only counted."""
        key = int.from_bytes(fingerprint[:8], "little", signed=True)
        if dedupe:
            if key in self.kept:
                self.duplicates += 1
                return True
            self.kept.add(key)
        else:
            self.hashes.append(key)
        return False

    def count_duplicates(self) -> int:
        """Used conversations that repeat an earlier one (the same tokens), with or without --dedupe."""
        if self.hashes:
            self.duplicates = len(self.hashes) - len(np.unique(np.frombuffer(self.hashes, dtype=np.int64)))
        return self.duplicates


def _write_rows(rows: Any, writer: RowWriter, tally: _Tally, max_rows: int | None) -> bool:
    """Write the packed ``rows`` (one without a supervised token is counted, not written); True once
    ``max_rows`` are written."""
    for row in rows:
        tally.padding += row.padding
        if not row.mask.any():  # nothing to learn from: counted, not written
            tally.rows_without_targets += 1
            continue
        writer.add(row.ids, row.mask, row.cu)
        if row.cu is not None:
            tally.segments += len(row.cu) - 1 - (1 if row.padding else 0)
        if writer.rows == max_rows:
            return True
    return False


def _pieces(ids: np.ndarray, mask: np.ndarray, index: int, long: LongConversations, row_tokens: int) -> list:
    """A rendered conversation's pieces to pack (the whole of it, or its pieces under ``--long``);
    MalformedConversation when no piece of it is kept."""
    pieces = long.pieces_of(ids, mask)
    if not pieces:
        kept = "" if long.mode == "skip" else f"; --long {long.mode} kept no piece of it"
        raise MalformedConversation(
            index,
            "longer_than_row",
            f"conversation of {len(ids)} tokens is longer than a {row_tokens}-token row{kept}",
        )
    return pieces


def _pack_and_write(
    reader: JsonlSource | ParquetSource,
    order: np.ndarray,
    path: Path,
    max_rows: int | None,
    pack: _Packing,
    *,
    fingerprints: set[bytes] | None = None,
    seen: set[bytes] | None = None,
) -> dict:
    """Conversations in ``order`` -> rendered (by ``pack.workers`` processes) -> the long ones skipped, split
    or truncated (``pack.long_mode``) -> packed -> written, in that order whatever the workers. Returns the
    counts. ``fingerprints`` collects a hash of each used conversation's tokens; the conversations whose hash
    is in ``seen`` (the validation split's) are counted (``conversations_in_validation``), or with
    ``pack.dedupe`` skipped as :data:`IN_VALIDATION`: the validation split stays as the user chose it (a
    held-out file, or the seeded fraction) and its loss measures conversations training never saw."""
    row_tokens, long_mode = pack.row_tokens, pack.long_mode
    packer = packer_for(pack.packing, row_tokens, pack.eos_id, pack.supervise_eos)
    writer = RowWriter(path, row_tokens, pack.rows_per_batch, boundaries=pack.packing == "boundaries")
    tally = _Tally()
    whole = pack.packing != "eos_joined"
    long = LongConversations(long_mode, row_tokens, cutter=pack.cutter, whole=whole, limit=pack.context_limit)
    stopped = False
    try:
        with (
            _stop_on_worker_error(reader),
            tqdm(total=len(order), desc="pack", unit="conv", disable=not pack.progress, smoothing=0.05) as bar,
        ):
            prepare = partial(_prepare, reader.decode, pack.render, row_tokens if long_mode == "skip" else None)
            for index, done in prepared(reader.records(order, pack.read_window), prepare, pack.workers):
                tally.read += 1
                bar.update(1)
                try:
                    if isinstance(done, MalformedConversation):
                        if done.size:
                            long.skipped_unread(done.size)
                        raise done
                    ids, mask = done.ids, done.mask
                    fingerprint = conversation_fingerprint(ids)
                    if pack.dedupe and seen and fingerprint in seen:
                        raise MalformedConversation(
                            index, IN_VALIDATION, "the same conversation as one of the validation split (--dedupe)"
                        )
                    if tally.repeated(fingerprint, pack.dedupe):
                        raise MalformedConversation(
                            index, "duplicate_conversation", "the same conversation as an earlier one (--dedupe)"
                        )
                    long.measured_bytes += done.size
                    pieces = _pieces(ids, mask, index, long, row_tokens)
                except MalformedConversation as e:
                    tally.skip(e, reader.location(index))
                    continue
                tally.used += 1
                tally.formats[done.record_format] += 1
                tally.notes.update(done.notes)
                tally.reasoning += done.reasoning
                tally.empty_thinks += done.empty_thinks
                if fingerprints is not None:
                    fingerprints.add(fingerprint)
                if seen and fingerprint in seen:
                    tally.in_validation += 1
                if stopped := any(_write_rows(packer.add(i, m), writer, tally, max_rows) for i, m in pieces):
                    break
                if tally.read % 256 == 0:
                    bar.set_postfix(rows=writer.rows, refresh=False)
        if not stopped:
            stopped = _write_rows(packer.finish(), writer, tally, max_rows)
    except BaseException:
        writer.abandon()  # the first error is the one to report (a full disk), not the closing's
        raise
    writer.close()
    return _split_stats(reader, writer, packer, tally, long, pack, max_rows)


def _split_stats(
    reader: JsonlSource | ParquetSource,
    writer: RowWriter,
    packer: RowPacker,
    tally: _Tally,
    long: LongConversations,
    pack: _Packing,
    max_rows: int | None,
) -> dict:
    """A split's counts for its manifest (see the module docstring for how they add up)."""
    skipped_total = sum(tally.skipped.values())
    duplicates = tally.count_duplicates()
    if skipped_total > len(tally.examples):
        unreported = skipped_total - len(tally.examples)
        log.warning("%d more conversation(s) skipped; the counts by reason follow", unreported)
    row_tokens, rows_without_targets, padding = pack.row_tokens, tally.rows_without_targets, tally.padding
    written_tokens = writer.rows * row_tokens
    return {
        "rows": writer.rows,
        "padding_tokens": padding,
        # the share of the rows' tokens that is padding: work a step does that trains nothing
        "padding_share": round(padding / ((writer.rows + rows_without_targets) * row_tokens), 6)
        if writer.rows + rows_without_targets
        else 0.0,
        "supervised_tokens": writer.supervised_tokens,
        "supervised_ratio": round(writer.supervised_tokens / written_tokens, 6) if written_tokens else 0.0,
        "stream_tokens": packer.stream_tokens,
        "tail_tokens_dropped": packer.stream_tokens + padding - (writer.rows + rows_without_targets) * row_tokens,
        "rows_skipped_without_targets": rows_without_targets,
        "stopped_at_max_rows": max_rows is not None and writer.rows == max_rows,
        "rows_sha256": writer.rows_sha256,
        "segments": tally.segments if pack.packing == "boundaries" else None,
        "long_conversations": long.summary(),
        "conversations_in_validation": tally.in_validation,
        "conversations": {
            "indexed": len(reader),
            "read": tally.read,
            "used": tally.used,
            "skipped": dict(sorted(tally.skipped.items())),
            "skipped_total": skipped_total,
            "skipped_examples": tally.examples,
            "blank_lines": reader.blank_lines,
            "record_formats": dict(sorted(tally.formats.items())),
            "notes": dict(sorted(tally.notes.items())),
            "duplicates": duplicates,
            "duplicates_removed": pack.dedupe,
            "with_reasoning": tally.reasoning,
            "without_reasoning": tally.used - tally.reasoning,
            "replies_with_empty_think": tally.empty_thinks,
        },
    }


def _refuse_dropped_share(stats: dict, pack: _Packing, what: str) -> None:
    """SftRowsError when rows of whole conversations leave out more of the tokens than
    ``--max-dropped-share`` allows (conversations too long for a row, those skipped unread counted)."""
    lc = stats["long_conversations"]
    share = lc["dropped_share"]
    if pack.packing == "eos_joined" or share <= pack.max_dropped_share:
        return
    unread = lc["skipped_unread"]
    keep = lc["row_tokens_keeping_99_percent"]
    fixes = [] if pack.long_mode != "skip" else ["--long split (pieces at turn boundaries)", "--long truncate"]
    if keep and keep > pack.row_tokens:
        fixes.append(f"--row-tokens {keep} (holds whole the conversations with 99% of the tokens)")
    fixes.append(f"--max-dropped-share {min(1.0, math.ceil(share * 100) / 100):g} to build anyway")
    raise SftRowsError(
        f"{what}: {share:.1%} of the tokens would be left out of the rows: {lc['longer_than_row']} conversation(s) "
        f"longer than a {pack.row_tokens}-token row (--long {pack.long_mode})"
        + (
            f" and {unread['conversations']} more skipped unread for their size (about "
            f"{unread['tokens_estimated']:,} tokens)"
            if unread["conversations"]
            else ""
        )
        + f"; that is over --max-dropped-share {pack.max_dropped_share:g} (default {DEFAULT_MAX_DROPPED_SHARE:g}), "
        f"so nothing was written. Use {', or '.join(fixes)}"
    )
