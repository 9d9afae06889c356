"""Writing rows to Parquet, hashed as they are written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bridge_recipes.data.conversations import SftRowsError
from bridge_recipes.data.integrity import MANIFEST_FILE, ROWS_FILE, update_rows_hash

PARQUET_COMPRESSION = "zstd"
ROWS_PER_BATCH = 128  # rows per Parquet row group: ~5 MB in memory at 8,192 tokens


class RowWriter:
    """Writes rows to Parquet in batches (one row group each) and hashes them as they go."""

    SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])

    def __init__(self, path: Path, row_tokens: int, rows_per_batch: int = ROWS_PER_BATCH):
        self.row_tokens = row_tokens
        self.rows_per_batch = rows_per_batch
        self._writer = pq.ParquetWriter(path, self.SCHEMA, compression=PARQUET_COMPRESSION)
        self._batch: list[tuple[np.ndarray, np.ndarray]] = []
        self._hasher = hashlib.sha256()
        self.rows = 0
        self.supervised_tokens = 0

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        assert len(ids) == len(mask) == self.row_tokens, "rows are cut to exactly row_tokens"
        update_rows_hash(self._hasher, ids, mask)
        self._batch.append((ids, mask))
        self.rows += 1
        self.supervised_tokens += int(mask.sum(dtype=np.int64))
        if len(self._batch) >= self.rows_per_batch:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    @property
    def rows_sha256(self) -> str:
        return self._hasher.hexdigest()

    def _flush(self) -> None:
        if not self._batch:
            return
        offsets = pa.array(np.arange(len(self._batch) + 1, dtype=np.int32) * self.row_tokens)
        ids = pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[0] for r in self._batch]), pa.int32()))
        mask = pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[1] for r in self._batch]), pa.uint8()))
        self._writer.write_table(pa.Table.from_arrays([ids, mask], schema=self.SCHEMA))
        self._batch = []


def check_output_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise SftRowsError(f"output {out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise SftRowsError(
            f"output folder {out_dir} is not empty; pass --overwrite (overwrite=True) to replace "
            f"its {ROWS_FILE} and {MANIFEST_FILE}"
        )
