"""Packing rendered conversations into fixed-length rows, in one of the modes of ``PACKING_MODES``.

``boundaries`` (the SFT default): whole conversations are placed into rows (first fit over
``OPEN_ROWS`` open rows, in the permuted order), the rest of a row is padding with mask 0, and
each row records its conversation boundaries as ``cu_seqlens`` (0, end of conversation 1, ...,
row_tokens; the padding is a last segment of its own). Training passes them to Megatron as
packed-sequence (THD) parameters, so attention (causal within each conversation,
``bridge_recipes.features.packed_attention``), the Gated DeltaNet recurrence, the MTP shift and the
positions restart at each conversation, and a row is mostly conversation tokens. A conversation
longer than a row is skipped and counted (``longer_than_row``), never cut.

``one_per_row``: one whole conversation per row, the rest padding (mask 0), no boundaries
recorded. The padding follows the conversation, so causal attention and the Gated DeltaNet
recurrence already keep it alone: it trains through the standard (non-THD) path, with any micro
batch, context parallelism or CUDA graphs, at the cost of the padding (a row per conversation).

``eos_joined`` (the OpenRecipes benchmark workload, kept so published comparisons stay like for
like): conversations joined with one EOS between consecutive ones and cut into consecutive
rows; no padding, and a conversation sees the ones before it in its row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

PACKING_MODES = ("boundaries", "one_per_row", "eos_joined")
OPEN_ROWS = 8  # rows kept open for first-fit placement in boundaries mode


class Row(NamedTuple):
    ids: np.ndarray  # int32, row_tokens long
    mask: np.ndarray  # uint8, 1 = supervised
    cu: np.ndarray | None  # int32 conversation boundaries (boundaries mode), else None
    padding: int  # padding tokens at the end of the row


class RowPacker:
    """Joins conversations with one EOS between consecutive ones and cuts rows of ``row_tokens``.

    ``add`` returns the rows completed by a conversation; tokens not yet in a row stay pending
    (at the end of a build they are the dropped tail, never padded).
    """

    def __init__(self, row_tokens: int, eos_id: int, supervise_eos: bool = False):
        if row_tokens < 1:
            raise ValueError(f"row_tokens must be positive, got {row_tokens}")
        self.row_tokens = row_tokens
        self._eos_ids = np.asarray([eos_id], dtype=np.int32)
        self._eos_mask = np.asarray([1 if supervise_eos else 0], dtype=np.uint8)
        self._ids: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self.pending_tokens = 0
        self.stream_tokens = 0
        self.conversations = 0

    padding_tokens = 0

    def fits(self, n_tokens: int) -> bool:
        return True  # a conversation may span rows

    def add(self, ids: np.ndarray, mask: np.ndarray) -> list[Row]:
        if len(ids) != len(mask):
            raise ValueError(f"ids and mask differ in length ({len(ids)} != {len(mask)})")
        if self.conversations:  # between conversations only: no EOS before the first
            self._push(self._eos_ids, self._eos_mask)
        self._push(np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8))
        self.conversations += 1
        return self._cut_rows()

    def _push(self, ids: np.ndarray, mask: np.ndarray) -> None:
        self._ids.append(ids)
        self._mask.append(mask)
        self.pending_tokens += len(ids)
        self.stream_tokens += len(ids)

    def finish(self) -> list[Row]:
        return []  # the partial last row is the dropped tail, never padded

    def _cut_rows(self) -> list[Row]:
        n = self.row_tokens
        if self.pending_tokens < n:
            return []
        ids, mask = np.concatenate(self._ids), np.concatenate(self._mask)
        full = len(ids) // n * n
        rows = [Row(ids[i : i + n], mask[i : i + n], None, 0) for i in range(0, full, n)]
        self._ids, self._mask = [ids[full:]], [mask[full:]]
        self.pending_tokens = len(ids) - full
        return rows


class _OpenRow:
    def __init__(self):
        self.ids: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.cu = [0]

    @property
    def used(self) -> int:
        return self.cu[-1]


class BoundaryPacker:
    """Whole conversations per row with their boundaries; rows padded with ``pad_id`` (mask 0).

    ``add`` returns the rows closed to make room; ``finish`` the rows still open. Every row is
    ``(ids, mask, cu_seqlens)`` with ``cu_seqlens`` int32, from 0 to ``row_tokens``.
    """

    def __init__(self, row_tokens: int, pad_id: int, open_rows: int = OPEN_ROWS):
        if row_tokens < 1:
            raise ValueError(f"row_tokens must be positive, got {row_tokens}")
        self.row_tokens = row_tokens
        self.pad_id = pad_id
        self.open_rows = open_rows
        self._open: list[_OpenRow] = []
        self.stream_tokens = 0
        self.padding_tokens = 0
        self.conversations = 0

    @property
    def pending_tokens(self) -> int:
        return sum(r.used for r in self._open)

    def fits(self, n_tokens: int) -> bool:
        return n_tokens <= self.row_tokens

    def add(self, ids: np.ndarray, mask: np.ndarray) -> list[Row]:
        n = len(ids)
        if n != len(mask):
            raise ValueError(f"ids and mask differ in length ({n} != {len(mask)})")
        if not self.fits(n):
            raise ValueError(f"a conversation of {n} tokens does not fit a {self.row_tokens}-token row")
        closed = []
        row = next((r for r in self._open if r.used + n <= self.row_tokens), None)
        if row is None:
            if len(self._open) >= self.open_rows:  # make room: close the fullest open row
                fullest = max(range(len(self._open)), key=lambda k: (self._open[k].used, -k))
                closed.append(self._close(self._open.pop(fullest)))
            row = _OpenRow()
            self._open.append(row)
        row.ids.append(np.asarray(ids, dtype=np.int32))
        row.mask.append(np.asarray(mask, dtype=np.uint8))
        row.cu.append(row.used + n)
        self.stream_tokens += n
        self.conversations += 1
        return closed

    def finish(self) -> list[Row]:
        rows = [self._close(r) for r in self._open]
        self._open = []
        return rows

    def _close(self, row: _OpenRow) -> Row:
        pad = self.row_tokens - row.used
        if pad:
            row.ids.append(np.full(pad, self.pad_id, dtype=np.int32))
            row.mask.append(np.zeros(pad, dtype=np.uint8))
            row.cu.append(self.row_tokens)
            self.padding_tokens += pad
        return Row(np.concatenate(row.ids), np.concatenate(row.mask), np.asarray(row.cu, dtype=np.int32), pad)


class OnePerRowPacker(BoundaryPacker):
    """One whole conversation per row, padded with ``pad_id`` (mask 0); rows carry no boundaries."""

    def add(self, ids: np.ndarray, mask: np.ndarray) -> list[Row]:
        super().add(ids, mask)  # the only open row, closed at once
        return self.finish()

    def _close(self, row: _OpenRow) -> Row:
        return super()._close(row)._replace(cu=None)


def packer_for(packing: str, row_tokens: int, eos_id: int, supervise_eos: bool = False):
    """The packer of a mode of ``PACKING_MODES`` (padding and EOS separators are ``eos_id``)."""
    if packing == "boundaries":
        return BoundaryPacker(row_tokens, eos_id)
    if packing == "one_per_row":
        return OnePerRowPacker(row_tokens, eos_id, open_rows=1)
    if packing == "eos_joined":
        return RowPacker(row_tokens, eos_id, supervise_eos)
    raise ValueError(f"packing {packing!r} is not one of {', '.join(PACKING_MODES)}")
