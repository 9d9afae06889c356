"""Packing rendered conversations into fixed-length rows."""

from __future__ import annotations

import numpy as np


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

    def add(self, ids: np.ndarray, mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
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

    def _cut_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
        n = self.row_tokens
        if self.pending_tokens < n:
            return []
        ids, mask = np.concatenate(self._ids), np.concatenate(self._mask)
        full = len(ids) // n * n
        rows = [(ids[i : i + n], mask[i : i + n]) for i in range(0, full, n)]
        self._ids, self._mask = [ids[full:]], [mask[full:]]
        self.pending_tokens = len(ids) - full
        return rows
