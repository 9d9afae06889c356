"""Identity and integrity of built SFT rows: file names, the rows hash, file hashes.

``rows_sha256`` is defined independently of the Parquet encoding: sha256 over, for each
written row in order, its ``input_ids`` as little-endian int32 bytes (``4 * row_tokens``
bytes) followed by its ``loss_mask`` as uint8 bytes (``row_tokens`` bytes).
Rows in ``boundaries`` mode also hash their ``cu_seqlens`` (little-endian int32) after the
mask. ``parquet_sha256`` is the sha256 of the Parquet file bytes, which also depend on the
pyarrow version and compression (both recorded in the manifest).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow.parquet as pq

ROWS_FILE = "rows.parquet"
MANIFEST_FILE = "manifest.json"
VAL_DIR = "val"  # the validation rows: a rows folder of its own inside the training one
CU_COLUMN = "cu_seqlens"  # per-row conversation boundaries (boundaries mode)

ROWS_SHA256_DEFINITION = (
    "sha256 over, for each row in order, input_ids as little-endian int32 bytes followed by loss_mask as uint8 bytes"
)
ROWS_SHA256_DEFINITION_BOUNDARIES = ROWS_SHA256_DEFINITION + ", then cu_seqlens as little-endian int32 bytes"


def update_rows_hash(hasher: hashlib._Hash, ids: np.ndarray, mask: np.ndarray, cu: np.ndarray | None = None) -> None:
    """Feed one row into a rows_sha256 hasher (see the module docstring for the definition)."""
    hasher.update(np.asarray(ids, dtype="<i4").tobytes())
    hasher.update(np.asarray(mask, dtype=np.uint8).tobytes())
    if cu is not None:
        hasher.update(np.asarray(cu, dtype="<i4").tobytes())


def parquet_rows_sha256(path: str | os.PathLike) -> str:
    """Recompute rows_sha256 from a rows Parquet file, one row group at a time."""
    hasher = hashlib.sha256()
    pf = pq.ParquetFile(path)
    for rg in range(pf.num_row_groups):
        table = pf.read_row_group(rg)
        cus = table.column(CU_COLUMN).to_pylist() if CU_COLUMN in table.column_names else [None] * table.num_rows
        for ids, mask, cu in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), cus):
            update_rows_hash(hasher, np.asarray(ids), np.asarray(mask), None if cu is None else np.asarray(cu))
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 16 * 2**20) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()
