"""What becomes of a rendered conversation longer than a row (``--long``), and what the build reports.

- ``skip`` (the default): the conversation is left out and counted. Every row then holds whole
  conversations, so every supervised token is trained with all of its conversation before it, as at
  inference; the build's summary says how many tokens that left out and which row length would keep
  99% of them.
- ``split``: cut at turn boundaries (before a user message that is not a tool result, so a tool call
  stays with its result) into pieces that fit a row, each piece beginning with the conversation's
  system prompt and tools. A piece holds the tokens and loss mask of the one rendering of the whole
  conversation: it supervises only its own assistant turns (the system prompt is supervised in no
  piece after the first). A turn that alone does not fit a row beside the system prompt is dropped.
- ``truncate``: the conversation's first ``row_tokens`` tokens, the rest dropped.

A conversation of more bytes than a row could hold is skipped before it is read (no tokenizer
runs on it); its tokens are estimated at the tokens per byte of the conversations measured, so the
share of tokens left out (``dropped_share``) counts it too.

Pieces are placed like conversations (``boundaries`` rows: each attends only to itself). The cutter
reads ChatML turn headers (``<|im_start|>user``) from the token ids, which both the chat template and
the plain ChatML renderer write.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

LONG_MODES = ("skip", "split", "truncate")
DEFAULT_LONG = "skip"
KEEP_SHARE = 0.99  # the share of tokens the suggested row length keeps whole
ROW_STEP = 1024  # suggested row lengths are multiples of this

Piece = tuple[np.ndarray, np.ndarray]


class TurnCutter:
    """Turn starts in a ChatML rendering: ``<|im_start|>user\\n`` not followed by ``<tool_response>``."""

    def __init__(self, encode: Callable[[str], list[int]], token_to_id: Callable[[str], int | None]):
        header = list(encode("<|im_start|>user\n"))
        self.im_start = token_to_id("<|im_start|>")
        if self.im_start is None or not header or header[0] != self.im_start:
            raise ValueError("the tokenizer has no <|im_start|> token: --long split needs ChatML turn headers")
        self.user: np.ndarray = np.asarray(header[1:], dtype=np.int64)
        self.tool_response = token_to_id("<tool_response>")

    def turn_starts(self, ids: np.ndarray) -> np.ndarray:
        """Positions where a user turn begins."""
        n, k = len(ids), len(self.user)
        starts = np.flatnonzero(ids == self.im_start)
        starts = starts[starts + k < n]
        for j, token in enumerate(self.user):
            starts = starts[ids[starts + 1 + j] == token]
        if self.tool_response is not None:
            starts = starts[ids[starts + 1 + k] != self.tool_response]
        return starts

    def split(self, ids: np.ndarray, mask: np.ndarray, row_tokens: int, dropped: Counter) -> tuple[list[Piece], int]:
        """Pieces of at most ``row_tokens`` tokens and the length of the system prompt each begins with;
        tokens left out are added to ``dropped`` by reason."""
        starts = self.turn_starts(ids)
        if not len(starts):
            dropped["no_turn_boundary"] += len(ids)
            return [], 0
        head = int(starts[0])  # the system prompt and tools, before the first user turn
        room = row_tokens - head
        if room <= 0:
            dropped["system_prompt_longer_than_row"] += len(ids)
            return [], head
        bounds = [*starts.tolist(), len(ids)]
        pieces: list[Piece] = []
        first: int | None = None  # the turns of the piece being gathered: ids[first:last]
        last = 0

        def close() -> None:
            assert first is not None
            head_mask = mask[:head] if not pieces else np.zeros(head, dtype=mask.dtype)
            piece_mask = np.concatenate([head_mask, mask[first:last]])
            if piece_mask.any():
                pieces.append((np.concatenate([ids[:head], ids[first:last]]), piece_mask))
            else:
                dropped["piece_without_targets"] += last - first

        for a, b in zip(bounds, bounds[1:]):
            if b - a > room:
                dropped["turn_longer_than_row"] += b - a
                continue
            if first is not None and b - first > room:
                close()
                first = None
            if first is None:
                first = a
            last = b
        if first is not None:
            close()
        if not pieces:
            dropped["piece_without_targets"] += head
        return pieces, head


def truncated(ids: np.ndarray, mask: np.ndarray, row_tokens: int, dropped: Counter) -> list[Piece]:
    """The first ``row_tokens`` tokens, or nothing when they supervise no token."""
    if not mask[:row_tokens].any():
        dropped["truncated_without_targets"] += len(ids)
        return []
    dropped["truncated"] += len(ids) - row_tokens
    return [(ids[:row_tokens], mask[:row_tokens])]


def row_tokens_keeping(lengths: np.ndarray, share: float = KEEP_SHARE, limit: int | None = None) -> int | None:
    """The shortest row (a multiple of :data:`ROW_STEP`) in which conversations holding ``share`` of
    the tokens fit whole; None when that is over ``limit`` (the model's context window)."""
    if not len(lengths):
        return None
    ordered: np.ndarray = np.sort(lengths.astype(np.int64))
    covered: np.ndarray = np.cumsum(ordered)
    need = int(ordered[np.searchsorted(covered, share * covered[-1] - 1e-9)])
    row = -(-need // ROW_STEP) * ROW_STEP
    return None if limit is not None and row > limit else row


@dataclass
class LongConversations:
    """The per-build record of conversation lengths and of what became of the long ones."""

    mode: str
    row_tokens: int
    cutter: TurnCutter | None = None
    limit: int | None = None  # the longest row the model takes (its context window)
    whole: bool = True  # rows hold whole conversations (False: eos_joined rows, cut from one stream)
    lengths: array = field(default_factory=lambda: array("i"))
    longer: int = 0
    pieces: int = 0
    dropped: Counter = field(default_factory=Counter)
    head_repeated: int = 0
    measured_bytes: int = 0  # of the conversations tokenized
    unread: int = 0  # conversations skipped unread for their size (bytes over what a row could hold)
    unread_bytes: int = 0

    def skipped_unread(self, size: int) -> None:
        """A conversation of ``size`` bytes skipped before tokenizing: its tokens are estimated."""
        self.unread += 1
        self.unread_bytes += size

    def estimated_unread(self, total: int) -> int:
        """Tokens of the conversations skipped unread, at the tokens per byte of those measured (``total``
        tokens in :attr:`measured_bytes`)."""
        if not self.unread_bytes:
            return 0
        return round(self.unread_bytes * total / self.measured_bytes) if self.measured_bytes and total else 0

    def pieces_of(self, ids: np.ndarray, mask: np.ndarray) -> list[Piece]:
        """What goes into the rows of one rendered conversation (itself when it fits a row)."""
        self.lengths.append(len(ids))
        if len(ids) <= self.row_tokens or not self.whole:
            return [(ids, mask)]
        self.longer += 1
        if self.mode == "split":
            assert self.cutter is not None
            out, head = self.cutter.split(ids, mask, self.row_tokens, self.dropped)
            self.head_repeated += head * max(0, len(out) - 1)
        elif self.mode == "truncate":
            out = truncated(ids, mask, self.row_tokens, self.dropped)
        else:
            self.dropped["longer_than_row"] += len(ids)
            out = []
        self.pieces += len(out)
        return out

    def summary(self) -> dict:
        lengths: np.ndarray = (
            np.frombuffer(self.lengths, dtype=np.int32) if len(self.lengths) else np.zeros(0, np.int32)
        )
        total = int(lengths.sum(dtype=np.int64))
        dropped = sum(self.dropped.values())
        estimated = self.estimated_unread(total)
        return {
            "mode": self.mode,
            "conversations_measured": len(lengths),
            "longer_than_row": self.longer,
            "pieces": self.pieces,
            "tokens": {
                "of_conversations": total,
                "kept": total - dropped,
                "dropped": dict(sorted(self.dropped.items())),
                "system_prompt_repeated": self.head_repeated,
            },
            "skipped_unread": {
                "conversations": self.unread,
                "bytes": self.unread_bytes,
                "tokens_estimated": estimated,
            },
            "dropped_share": round((dropped + estimated) / (total + estimated), 6) if total + estimated else 0.0,
            "longest_conversation": int(lengths.max()) if len(lengths) else 0,
            "row_tokens_keeping_99_percent": row_tokens_keeping(lengths, KEEP_SHARE, self.limit),
        }
