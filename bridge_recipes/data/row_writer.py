"""Writing rows to Parquet, hashed as they are written."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bridge_recipes.data.conversations import SftRowsError
from bridge_recipes.data.integrity import CU_COLUMN, MANIFEST_FILE, ROWS_FILE, VAL_DIR, update_rows_hash
from bridge_recipes.outputs import pid_alive

PARQUET_COMPRESSION = "zstd"
ROWS_PER_BATCH = 128  # rows per Parquet row group: ~5 MB in memory at 8,192 tokens


class RowWriter:
    """Writes rows to Parquet in batches (one row group each) and hashes them as they go."""

    SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])
    SCHEMA_BOUNDARIES = SCHEMA.append(pa.field(CU_COLUMN, pa.list_(pa.int32())))

    def __init__(self, path: Path, row_tokens: int, rows_per_batch: int = ROWS_PER_BATCH, boundaries: bool = False):
        self.row_tokens = row_tokens
        self.rows_per_batch = rows_per_batch
        self.schema = self.SCHEMA_BOUNDARIES if boundaries else self.SCHEMA
        self._writer = pq.ParquetWriter(path, self.schema, compression=PARQUET_COMPRESSION)
        self._batch: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._hasher = hashlib.sha256()
        self.rows = 0
        self.supervised_tokens = 0

    def add(self, ids: np.ndarray, mask: np.ndarray, cu: np.ndarray | None = None) -> None:
        assert len(ids) == len(mask) == self.row_tokens, "rows are cut to exactly row_tokens"
        assert (cu is not None) == (self.schema is self.SCHEMA_BOUNDARIES), "boundaries rows carry cu_seqlens"
        update_rows_hash(self._hasher, ids, mask, cu)
        self._batch.append((ids, mask, cu))
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
        columns = [ids, mask]
        if self.schema is self.SCHEMA_BOUNDARIES:
            cus = [r[2] for r in self._batch]
            cu_offsets = pa.array(np.concatenate([[0], np.cumsum([len(c) for c in cus])]).astype(np.int32))
            columns.append(pa.ListArray.from_arrays(cu_offsets, pa.array(np.concatenate(cus), pa.int32())))
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self._batch = []


DATASET_ENTRIES = {ROWS_FILE, MANIFEST_FILE, VAL_DIR}  # what a build writes into its --out folder
_STAGE = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def check_output_dir(
    out_dir: Path,
    overwrite: bool,
    *,
    ours: Callable[[str], bool] = DATASET_ENTRIES.__contains__,
    described: str = f"its {ROWS_FILE}, {MANIFEST_FILE} and {VAL_DIR}/",
    error: type[Exception] = SftRowsError,
) -> None:
    """Refuse an output that is a file, or a folder that is not empty (without --overwrite) or
    that holds anything a build did not write (with it: those files are the user's). ``ours``
    tells a build's entries by name; ``described`` names them in the message."""
    if out_dir.exists() and not out_dir.is_dir():
        raise error(f"output {out_dir} exists and is not a folder")
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not overwrite:
        raise error(f"output folder {out_dir} is not empty; pass --overwrite (overwrite=True) to replace {described}")
    foreign = [e for e in entries if not ours(e)]
    if foreign:
        raise error(
            f"output folder {out_dir} holds files a build did not write ({', '.join(foreign[:5])}); "
            "--overwrite replaces the whole folder, so move them away or choose another --out"
        )


def clean_stale_stages(out_dir: Path) -> list[str]:
    """Remove what killed builds left beside ``out_dir``; returns what was done.

    A build stages into ``.NAME.tmp-PID`` beside ``out_dir`` and, when replacing a dataset,
    parks the old one as ``.NAME.old-PID`` for the instant between two renames. For a PID
    that is no longer running: a ``tmp`` folder is removed; an ``old`` folder is put back
    as ``out_dir`` if ``out_dir`` is missing (the kill fell between the renames), else removed.
    """
    done = []
    parent = out_dir.parent
    if not parent.is_dir():
        return done
    for path in sorted(parent.iterdir()):
        m = _STAGE.match(path.name)
        if not m or m["name"] != out_dir.name or pid_alive(int(m["pid"])):
            continue
        if m["kind"] == "old" and not out_dir.exists():
            os.replace(path, out_dir)
            done.append(f"restored {out_dir} from {path.name}")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path}")
    return done


def stage_dir(out_dir: Path, error: type[Exception] = SftRowsError) -> Path:
    """A fresh staging folder beside ``out_dir`` (same file system, so renames are atomic)."""
    stage = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir(parents=True)
    except OSError as e:
        raise error(
            f"cannot create the output folder's parent {out_dir.parent} ({e.strerror or e}); choose a writable --out"
        ) from None
    return stage


def publish(stage: Path, out_dir: Path) -> None:
    """Put a complete staged dataset in place of ``out_dir``; the old one stays until then."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(stage, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, out_dir)
