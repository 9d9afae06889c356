"""Identity and integrity of built SFT rows: file names, the rows hash, file hashes.

``rows_sha256`` is defined independently of the Parquet encoding: sha256 over, for each
written row in order, its ``input_ids`` as little-endian int32 bytes (``4 * row_tokens``
bytes) followed by its ``loss_mask`` as uint8 bytes (``row_tokens`` bytes).
Rows in ``boundaries`` mode also hash their ``cu_seqlens`` (little-endian int32) after the
mask. ``parquet_sha256`` is the sha256 of the Parquet file bytes, which also depend on the
pyarrow version and compression (both recorded in the manifest).

A process reads a rows folder once: :func:`read_manifest` parses a folder's ``manifest.json`` once and
:func:`check_rows` reads, hashes and checks its Parquet file once, whoever asks (the build, the dry run's
checks, the summary, the run's identity, the dataset at launch). Each reading is kept under the folder's
resolved path and the size, modification time and inode of the files it read, so a folder rebuilt or a
file replaced is read again; what depends on the caller (the sequence length, the vocabulary, the
tokenizer) is checked on every call against the one reading. The training process the runner re-executes
into is another process and reads the folder again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bridge_recipes.chat.chat_template import TEMPLATE_FILES, template_files_sha256
from bridge_recipes.data.packing import PACKING_MODES
from bridge_recipes.utils.outputs import file_sha256

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


class RowsIntegrityError(ValueError):
    """A rows folder that cannot be trained on as it is; the message names the file and the fix."""


REQUIRED_KEYS = ("builder_version", "row_tokens", "rows", "packing", "rows_sha256", "parquet_sha256", "parquet_bytes")
# The manifest fields training reads, with the JSON type each must have (``None``: may be null) and,
# for numbers, the least value.
FIELD_TYPES: dict[str, tuple[tuple[type, ...], int | None]] = {
    "builder_version": ((str,), None),
    "row_tokens": ((int,), 1),
    "rows": ((int,), 0),
    "packing": ((str,), None),
    "rows_sha256": ((str,), None),
    "parquet_sha256": ((str,), None),
    "parquet_bytes": ((int,), 0),
    "eos_token_id": ((int, type(None)), 0),
    "segments": ((int, type(None)), 0),
    "tokenizer_sha256": ((str, type(None)), None),
    "validation": ((dict, type(None)), None),
}
JSON_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number with a fraction",
    dict: "an object",
    list: "a list",
    type(None): "null",
    bool: "a boolean",
}
ID_TYPE, MASK_TYPE = "list<element: int32>", "list<element: uint8>"


@dataclass(frozen=True)
class LoadedRows:
    manifest: dict
    ids: np.ndarray  # int32 [rows, row_tokens]
    mask: np.ndarray  # uint8 [rows, row_tokens]
    cu: list[np.ndarray] | None  # per-row int32 conversation boundaries (boundaries mode)


def _rebuild(folder: Path) -> str:
    return f"rebuild it with scripts/build_sft_rows.py --out {folder} --overwrite"


def read_manifest(folder: str | os.PathLike) -> dict:
    """The manifest of a rows folder, with the fields training relies on present (parsed once per process
    while the file stays as it is; each caller gets its own copy)."""
    folder = Path(folder)
    if folder.is_file():
        parent = folder.parent if folder.name in (ROWS_FILE, MANIFEST_FILE) else None
        raise RowsIntegrityError(
            f"{folder} is a file; the rows path is the folder holding {ROWS_FILE} and {MANIFEST_FILE}"
            + (f": set it to {parent}" if parent else " (the --out folder of scripts/build_sft_rows.py)")
        )
    if not folder.exists():
        raise RowsIntegrityError(
            f"rows folder {folder} does not exist: build it with scripts/build_sft_rows.py --out {folder}"
        )
    for name in (ROWS_FILE, MANIFEST_FILE):
        if not (folder / name).is_file():
            raise RowsIntegrityError(f"{folder} has no {name}: build it with scripts/build_sft_rows.py --out {folder}")
    key = (str(folder.resolve()), _file_state(folder / MANIFEST_FILE))
    manifest = _MANIFESTS.get(key)
    if manifest is None:
        manifest = _parse_manifest(folder)
        _MANIFESTS.put(key, manifest)
    return copy.deepcopy(manifest)


def _parse_manifest(folder: Path) -> dict:
    """The one reading of ``folder``'s manifest file: parsed and its fields checked."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise RowsIntegrityError(f"{folder / MANIFEST_FILE} is not valid JSON ({e}); {_rebuild(folder)}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise RowsIntegrityError(
            f"{folder / MANIFEST_FILE} lacks {', '.join(missing)} (not written by this builder); {_rebuild(folder)}"
        )
    if problem := _field_problem(manifest):
        raise RowsIntegrityError(f"{folder / MANIFEST_FILE}: {problem}; {_rebuild(folder)}")
    return manifest


class _Recent(OrderedDict):
    """The last ``size`` readings, by key: a process keeps the folders it reads, not every folder it ever read."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key: tuple, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


# A run reads one training folder and its validation split; a few more cover a tool that compares two.
_MANIFESTS = _Recent(64)
_SCANS = _Recent(4)


def _file_state(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten or replaced: its modification time, size and inode."""
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


def forget_readings() -> None:
    """Drop the kept readings of rows folders: the next call reads them again."""
    _MANIFESTS.clear()
    _SCANS.clear()


def _field_problem(manifest: dict) -> str | None:
    """The first manifest field of the wrong JSON type or below its least value (:data:`FIELD_TYPES`)."""
    for key, (kinds, least) in FIELD_TYPES.items():
        if key not in manifest:
            continue
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            found = JSON_NAMES.get(type(value), type(value).__name__)
            want = " or ".join(JSON_NAMES[k] for k in kinds)
            hint = (
                f" (write {value} without quotes)"
                if isinstance(value, str) and value.isdigit() and int in kinds
                else ""
            )
            return f"the manifest field {key} is {found} ({value!r}), not {want}{hint}"
        if least is not None and isinstance(value, int) and value < least:
            return f"the manifest field {key} is {value}, below {least}"
    if manifest["packing"] not in PACKING_MODES:
        return f"the manifest field packing is {manifest['packing']!r}, not one of {', '.join(PACKING_MODES)}"
    validation = manifest.get("validation")
    if validation is not None and not isinstance(validation.get("rows_sha256"), str):
        return "the manifest field validation.rows_sha256 is missing or not a string"
    return None


def tokenizer_json(path: str | os.PathLike) -> Path:
    path = Path(path).expanduser()
    return path / "tokenizer.json" if path.is_dir() else path


def check_tokenizer(folder: Path, manifest: dict, tokenizer: str | os.PathLike) -> None:
    """The rows were rendered with ``tokenizer`` (a folder, or its tokenizer.json): its tokenizer.json, and for
    rows rendered by a chat template the folder's template files, against the manifest's sha256. Asked for, the
    check is never skipped: a manifest without the fields or a folder without the files is an error."""
    tok_file = tokenizer_json(tokenizer)
    where = folder / MANIFEST_FILE
    if not tok_file.is_file():
        raise RowsIntegrityError(
            f"the tokenizer to check the rows in {folder} against, {tokenizer}, has no tokenizer.json; point it at "
            "the checkpoint's tokenizer folder (--hf-checkpoint, tokenizer.tokenizer_model or dataset.tokenizer_path)"
        )
    missing = [k for k in ("tokenizer_sha256", "chat_template_sha256") if k not in manifest]
    if missing or not manifest["tokenizer_sha256"]:
        raise RowsIntegrityError(
            f"{where} lacks {', '.join(missing or ['tokenizer_sha256'])}, so the rows cannot be checked against the "
            f"tokenizer {tok_file}; {_rebuild(folder)}"
        )
    if file_sha256(tok_file) != manifest["tokenizer_sha256"]:
        raise RowsIntegrityError(
            f"rows in {folder} were built with a different tokenizer than the recipe's {tok_file} "
            f"(sha256 differs from the manifest's tokenizer_sha256); rebuild them with --tokenizer {tokenizer}"
        )
    if manifest["chat_template_sha256"] is None:  # plain ChatML rows: rendered by no template
        return
    templates = tok_file.parent
    if not any((templates / name).is_file() for name in TEMPLATE_FILES[1:]):
        raise RowsIntegrityError(
            f"rows in {folder} were rendered with a chat template, and {templates} holds none "
            f"({', '.join(TEMPLATE_FILES[1:])}) to check it against; point at the checkpoint's tokenizer folder"
        )
    if template_files_sha256(templates) != manifest["chat_template_sha256"]:
        raise RowsIntegrityError(
            f"rows in {folder} were rendered with another chat template than {templates}'s (its "
            f"{', '.join(TEMPLATE_FILES)} differ from the manifest's chat_template_sha256): the turns would not be "
            f"what the model sees; rebuild them with --tokenizer {templates}"
        )


def _padding_segment(ids: np.ndarray, mask: np.ndarray, cu: np.ndarray, pad_id: int | None) -> int:
    """1 when a boundaries row's last segment is its padding (pad tokens outside the loss), else 0."""
    last = slice(int(cu[-2]), int(cu[-1]))
    return int(pad_id is not None and not mask[last].any() and bool((ids[last] == pad_id).all()))


def check_rows(
    folder: str | os.PathLike,
    *,
    seq_length: int | None = None,
    vocab_size: int | None = None,
    tokenizer: str | os.PathLike | None = None,
    vocab_field: str | None = None,
) -> LoadedRows:
    """Check a rows folder against its manifest and the recipe, and load it.

    Checked: the manifest's fields; the Parquet size and sha256 against the manifest (a
    truncated, zero-byte or replaced file); that Parquet can read it; row count; column types;
    every row ``row_tokens`` long and ``row_tokens == seq_length``; token ids in
    ``[0, vocab_size)`` (``vocab_field``: the config field that set it, named in the message); loss
    mask only 0/1; boundaries from 0 to ``row_tokens``, increasing;
    the rows hash; with ``tokenizer`` (a folder or its tokenizer.json), :func:`check_tokenizer`;
    and the same for the validation rows in ``val/``. Raises RowsIntegrityError. The file is read and
    hashed once per process (:func:`_scanned`); the rows returned are read-only, shared by every caller.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    row_tokens = manifest["row_tokens"]
    if seq_length is not None and row_tokens != seq_length:
        raise RowsIntegrityError(
            f"rows in {folder} are {row_tokens} tokens but the model's seq_length is {seq_length}; "
            f"set -sl {row_tokens} or rebuild the rows with --row-tokens {seq_length}"
        )
    scan = _scanned(folder, manifest)
    if scan.file_problem:
        raise RowsIntegrityError(scan.file_problem)
    if tokenizer is not None:
        check_tokenizer(folder, manifest, tokenizer)
    if scan.table_problem:
        raise RowsIntegrityError(scan.table_problem)
    assert scan.ids is not None and scan.mask is not None
    _check_ids_and_mask(folder, scan.ids, scan.mask, vocab_size, vocab_field)
    if scan.rows_problem:
        raise RowsIntegrityError(scan.rows_problem)
    if manifest.get("validation"):
        val = check_rows(
            folder / VAL_DIR,
            seq_length=seq_length,
            vocab_size=vocab_size,
            tokenizer=tokenizer,
            vocab_field=vocab_field,
        )
        if val.manifest["rows_sha256"] != manifest["validation"]["rows_sha256"]:
            raise RowsIntegrityError(
                f"{folder / VAL_DIR} is not the validation split {folder / MANIFEST_FILE} records; {_rebuild(folder)}"
            )
    return LoadedRows(manifest, scan.ids, scan.mask, scan.cu)


@dataclass(frozen=True)
class _Scan:
    """One reading of a rows file against its manifest: the rows (read-only), or the first problem of
    each stage, in the order :func:`check_rows` reports them."""

    ids: np.ndarray | None = None
    mask: np.ndarray | None = None
    cu: list[np.ndarray] | None = None
    file_problem: str | None = None  # size or sha256 of the file
    table_problem: str | None = None  # unreadable, row count, column types, row lengths
    rows_problem: str | None = None  # boundaries, rows hash


def _scanned(folder: Path, manifest: dict) -> _Scan:
    """``folder``'s rows, read and hashed once while its manifest and rows file stay as they are."""
    key = (str(folder.resolve()), _file_state(folder / MANIFEST_FILE), _file_state(folder / ROWS_FILE))
    scan = _SCANS.get(key)
    if scan is None:
        scan = _scan_rows(folder, manifest)
        _SCANS.put(key, scan)
    return scan


def _scan_rows(folder: Path, manifest: dict) -> _Scan:
    """The one reading of ``folder``'s rows file: its bytes against the manifest, then its table, its
    boundaries and its rows hash."""
    try:
        _check_file(folder, manifest)
    except RowsIntegrityError as e:
        return _Scan(file_problem=str(e))
    row_tokens = manifest["row_tokens"]
    try:
        table = _read_table(folder, manifest)
        ids = _column(table, "input_ids", np.int32, folder, row_tokens)[0].reshape(-1, row_tokens)
        mask = _column(table, "loss_mask", np.uint8, folder, row_tokens)[0].reshape(-1, row_tokens)
    except RowsIntegrityError as e:
        return _Scan(table_problem=str(e))
    ids.flags.writeable = mask.flags.writeable = False  # one copy serves every caller of the process
    try:
        cu = _boundaries(table, folder, manifest, ids, mask) if manifest["packing"] == "boundaries" else None
        hasher = hashlib.sha256()
        for r in range(len(ids)):
            update_rows_hash(hasher, ids[r], mask[r], None if cu is None else cu[r])
        if hasher.hexdigest() != manifest["rows_sha256"]:
            raise RowsIntegrityError(
                f"{folder / ROWS_FILE} rows do not match rows_sha256 in {MANIFEST_FILE}; {_rebuild(folder)}"
            )
    except RowsIntegrityError as e:
        return _Scan(ids=ids, mask=mask, rows_problem=str(e))
    for c in cu or ():
        c.flags.writeable = False
    return _Scan(ids=ids, mask=mask, cu=cu)


def _check_file(folder: Path, manifest: dict) -> None:
    """The rows file's size and sha256 against the manifest: a truncated, zero-byte or replaced file."""
    rows_file = folder / ROWS_FILE
    size = rows_file.stat().st_size
    if size != manifest["parquet_bytes"]:
        raise RowsIntegrityError(
            f"{rows_file} is {size} bytes but {MANIFEST_FILE} records {manifest['parquet_bytes']}: the file is "
            f"truncated or was replaced; {_rebuild(folder)}"
        )
    if file_sha256(rows_file) != manifest["parquet_sha256"]:
        raise RowsIntegrityError(
            f"{rows_file} does not match the sha256 in {MANIFEST_FILE} (the file changed after the build); "
            f"{_rebuild(folder)}"
        )


def _count_problem(folder: Path, manifest: dict, rows: int) -> str | None:
    """``rows`` (what the rows file holds) against the manifest's count, or None where they agree."""
    if rows == manifest["rows"]:
        return None
    return f"{folder / ROWS_FILE} holds {rows} rows but {MANIFEST_FILE} records {manifest['rows']}; {_rebuild(folder)}"


def file_rows_problem(folder: str | os.PathLike) -> str | None:
    """Why a rows folder's file does not hold the rows its manifest records (read from the Parquet footer
    alone, without reading the rows), or None; what a count of the rows, such as the steps of epochs,
    rests on."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    try:
        rows = pq.ParquetFile(folder / ROWS_FILE).metadata.num_rows
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError on a damaged file
        return f"cannot read {folder / ROWS_FILE}: {e}; {_rebuild(folder)}"
    return _count_problem(folder, manifest, rows)


def _read_table(folder: Path, manifest: dict) -> Any:
    """The rows file as a table, readable, of the manifest's row count and with the columns' types."""
    import pyarrow as pa

    where = folder / ROWS_FILE
    try:
        table = pq.read_table(where)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError on a damaged file
        raise RowsIntegrityError(f"cannot read {where}: {e}; {_rebuild(folder)}") from None
    if problem := _count_problem(folder, manifest, table.num_rows):
        raise RowsIntegrityError(problem)
    expected = {"input_ids": pa.list_(pa.int32()), "loss_mask": pa.list_(pa.uint8())}
    if manifest["packing"] == "boundaries":
        expected[CU_COLUMN] = pa.list_(pa.int32())
    for name, kind in expected.items():
        if name not in table.column_names or table.schema.field(name).type != kind:
            found = table.schema.field(name).type if name in table.column_names else "missing"
            raise RowsIntegrityError(f"{where} column {name!r} is {found}, expected {kind}; {_rebuild(folder)}")
    if table.num_rows == 0:
        raise RowsIntegrityError(f"{folder} holds no rows; {_rebuild(folder)}")
    return table


def _column(table: Any, name: str, dtype: Any, folder: Path, row_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values, flat, and each row's length; ``input_ids`` and ``loss_mask`` rows must be
    ``row_tokens`` long."""
    column = table.column(name).combine_chunks()
    lengths = np.diff(np.asarray(column.offsets))
    if name != CU_COLUMN and (lengths != row_tokens).any():
        bad = int(np.flatnonzero(lengths != row_tokens)[0])
        raise RowsIntegrityError(
            f"{folder / ROWS_FILE} row {bad} {name} has {lengths[bad]} tokens, not {row_tokens}; {_rebuild(folder)}"
        )
    return np.asarray(column.flatten(), dtype=dtype), lengths


def _check_ids_and_mask(
    folder: Path, ids: np.ndarray, mask: np.ndarray, vocab_size: int | None, vocab_field: str | None
) -> None:
    """Token ids within the model's vocabulary, the loss mask only 0 and 1."""
    where = folder / ROWS_FILE
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        value = int(ids.min()) if ids.min() < 0 else int(ids.max())
        if vocab_field is not None and value >= 0:
            raise RowsIntegrityError(
                f"{where} holds token id {value}, outside {vocab_field}={vocab_size} (ids 0 to {vocab_size - 1}): "
                f"set {vocab_field} above {value} if the model's vocabulary is that large, else rebuild the rows "
                "with the model's tokenizer"
            )
        raise RowsIntegrityError(
            f"{where} holds token id {value}, outside the model's vocabulary [0, {vocab_size}); the rows were built "
            "with another tokenizer: rebuild them with the model's tokenizer"
        )
    if mask.max() > 1:
        raise RowsIntegrityError(
            f"{where} loss_mask holds {int(mask.max())}; only 0 and 1 are allowed; {_rebuild(folder)}"
        )


def _boundaries(table: Any, folder: Path, manifest: dict, ids: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Each boundaries row's cu_seqlens, checked to run from 0 to ``row_tokens`` in increasing order, and
    the conversations and pieces they place against the manifest's ``segments``."""
    where, row_tokens = folder / ROWS_FILE, manifest["row_tokens"]
    values, lengths = _column(table, CU_COLUMN, np.int32, folder, row_tokens)
    cu = np.split(values, np.cumsum(lengths)[:-1])
    for r, c in enumerate(cu):
        if len(c) < 2 or c[0] != 0 or c[-1] != row_tokens or (np.diff(c) <= 0).any():
            raise RowsIntegrityError(
                f"{where} row {r} cu_seqlens {c.tolist()[:8]} do not run from 0 to {row_tokens} in increasing "
                f"order; {_rebuild(folder)}"
            )
    placed = sum(
        len(c) - 1 - _padding_segment(ids[r], mask[r], c, manifest.get("eos_token_id")) for r, c in enumerate(cu)
    )
    if manifest.get("segments") is not None and placed != manifest["segments"]:
        raise RowsIntegrityError(
            f"{where} rows hold {placed} conversations and pieces of split ones but {MANIFEST_FILE} records "
            f"{manifest['segments']}; {_rebuild(folder)}"
        )
    return cu
