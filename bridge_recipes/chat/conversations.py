"""Conversation sources of an SFT rows build: local JSONL / Parquet files or a Hub dataset.

Each record is read as the format its keys fit (OpenAI messages, ShareGPT or Alpaca;
:mod:`chat_formats`), so a file may mix them; a file whose first record (a Parquet file: whose
columns) fits none is refused, and one that is not UTF-8 text is refused naming the encoding it
looks like.

Sources are indexed in a first pass (byte offsets of JSONL lines, or the row count of a
Parquet file), so a global permutation can be drawn without holding the data, then read in
that order through windows of ``READ_WINDOW`` conversations (Parquet row groups cached up to
``PARQUET_CACHE_BYTES``). The source row index is 0-based: the Parquet row, or for JSONL the
non-blank line (blank lines are not conversations; they are counted as ``blank_lines``); messages
name a record as its reader's :meth:`location` does, counting from 1 (a JSONL file's line number,
blank lines included, as an editor shows it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.utils.outputs import file_sha256

DEFAULT_MESSAGES_KEY = "messages"
READ_WINDOW = 4096  # conversations fetched per sorted random-access window
PARQUET_CACHE_BYTES = 512 * 2**20  # decoded Parquet row groups kept between windows

_FILE_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
# Suffixes that mark a missing *file* rather than a Hugging Face dataset id.
_PATH_LIKE_SUFFIXES = {".jsonl", ".json", ".parquet", ".arrow", ".csv", ".txt", ".gz", ".zst", ".bz2", ".xz"}
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def source_kind(source: str) -> str:
    """``jsonl`` or ``parquet`` for a local file, ``hf`` for a Hugging Face dataset id."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if path.exists():
        if not path.is_file():
            raise SftRowsError(f"input {source} is not a file; pass a .jsonl or .parquet file")
        if suffix not in _FILE_SUFFIXES:
            raise SftRowsError(f"input {source}: unsupported file type {suffix or '(none)'}; use .jsonl or .parquet")
        return _FILE_SUFFIXES[suffix]
    if suffix in _PATH_LIKE_SUFFIXES or source.startswith((".", "/", "~")) or not _HF_ID.fullmatch(source):
        raise SftRowsError(f"input file not found: {source}")
    return "hf"


def chunks(order: np.ndarray, size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(order), size):
        yield order[start : start + size]


HEAD_BYTES = 64 * 2**10  # of a file's first line, read to tell its encoding
UTF16_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


def encoding_problem(data: bytes, cut: bool = False) -> str | None:
    """What text encoding ``data`` (a line) looks like when it is not UTF-8, or None: a UTF-16 (or UTF-32)
    byte-order mark, or bytes UTF-8 cannot decode (Latin-1 / Windows-1252 text, most often). ``cut``: the
    data may end inside a character (the first bytes of a longer line)."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32 (it starts with a UTF-32 byte-order mark)"
    for bom, name in UTF16_BOMS.items():
        if data.startswith(bom):
            return f"{name} (it starts with a UTF-16 byte-order mark)"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        if cut and e.reason == "unexpected end of data":
            return None
        byte = data[e.start : e.start + 1].hex()
        return f"not UTF-8 (byte 0x{byte} at position {e.start}; Latin-1 or Windows-1252 text, most likely)"
    return None


def convert_hint(encoding: str) -> str:
    """How to turn a file of ``encoding`` (:func:`encoding_problem`'s words) into UTF-8."""
    source = "UTF-16" if "UTF-16" in encoding else "UTF-32" if "UTF-32" in encoding else "LATIN1"
    return f"convert it to UTF-8 first (iconv -f {source} -t UTF-8 IN > OUT)"


def json_record(line: bytes, index: int) -> dict:
    """One JSONL line as a record: a JSON object whose text UTF-8 can encode, else MalformedConversation."""
    if encoding := encoding_problem(line):
        raise MalformedConversation(index, "not_utf8", f"line is {encoding}; JSONL is UTF-8: {convert_hint(encoding)}")
    try:
        record = json.loads(line)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise MalformedConversation(index, "invalid_json", f"line is not valid JSON ({e})") from None
    except RecursionError:
        raise MalformedConversation(index, "invalid_json", "line nests JSON deeper than Python can read") from None
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise MalformedConversation(
            index, "invalid_text", f"text holds a character UTF-8 cannot encode ({e.reason}: a lone surrogate)"
        ) from None
    if not isinstance(record, dict):
        kind = type(record).__name__
        raise MalformedConversation(index, "record_not_an_object", f"line is a JSON {kind}, not an object")
    return record


class Decoded(tuple):
    """A record read: ``(messages, tools)``, with the record format it was read as (``record_format``) and
    a turn note for each turn whose speaker the role map renamed (``notes``)."""

    record_format: str
    notes: tuple[str, ...]

    def __new__(cls, messages: Any, tools: Any, record_format: str, notes: tuple[str, ...] = ()) -> Decoded:
        decoded = super().__new__(cls, (messages, tools))
        decoded.record_format = record_format
        decoded.notes = notes
        return decoded

    def __reduce__(self):
        return type(self), (self[0], self[1], self.record_format, self.notes)


def effective_role_map(role_map: dict[str, str] | None) -> dict[str, str]:
    """The speaker names a reader renames: the defaults (:data:`~chat_formats.DEFAULT_ROLE_MAP`) and ``role_map``
    over them."""
    from bridge_recipes.chat.chat_formats import DEFAULT_ROLE_MAP

    return {**DEFAULT_ROLE_MAP, **(role_map or {})}


class JsonlSource:
    """A JSONL file indexed by the byte offset of each non-blank line (8 bytes per line)."""

    kind = "jsonl"

    def __init__(
        self,
        path: str | os.PathLike,
        messages_key: str = DEFAULT_MESSAGES_KEY,
        progress: bool = False,
        chat_format: bool = True,
        unit: str = "line",
        role_map: dict[str, str] | None = None,
    ):
        """``chat_format``: detect the file's chat record format (:mod:`chat_formats`) for ``decode``;
        False for readers of other records, which take the lines as JSON records themselves. ``unit``:
        what :meth:`location` calls a record (``record`` for a dataset spooled here). ``role_map``: speaker
        names read as roles, over the defaults (:func:`effective_role_map`)."""
        self.path = Path(path)
        self.messages_key = messages_key
        self.role_map = effective_role_map(role_map)
        self.unit = unit
        offsets = array("q")
        blank_at = array("q")  # for each blank line, the number of non-blank lines before it
        hasher = hashlib.sha256()
        self.blank_lines = 0
        with open(self.path, "rb") as f, _bytes_bar(self.path, "index", progress) as bar:
            offset = 0
            for line in f:
                hasher.update(line)  # hashed while indexing: the source identity costs no extra pass
                if line.isspace():
                    self.blank_lines += 1
                    blank_at.append(len(offsets))
                else:
                    offsets.append(offset)
                offset += len(line)
                bar.update(len(line))
        self.offsets = np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, dtype=np.int64)
        self._blank_at = blank_at
        self.sha256 = hasher.hexdigest()
        self._check_encoding()
        self.format = self._first_record_format() if chat_format and len(self.offsets) else None

    def location(self, index: int) -> str:
        """Record ``index`` as a person finds it in the file: its line number, from 1, blank lines counted."""
        import bisect

        return f"{self.unit} {index + 1 + bisect.bisect_right(self._blank_at, index)}"

    def _check_encoding(self) -> None:
        """SftRowsError naming the encoding when the file starts in one other than UTF-8 (a UTF-16 file's
        lines would all be skipped as invalid JSON)."""
        with open(self.path, "rb") as f:
            head = f.readline(HEAD_BYTES)
        if encoding := encoding_problem(head, cut=len(head) == HEAD_BYTES):
            raise SftRowsError(f"input {self.path} is {encoding}; JSONL is UTF-8: {convert_hint(encoding)}")

    def _first_record_format(self):
        """The format of the file's first record; SftRowsError listing the formats when it fits none."""
        from bridge_recipes.chat import chat_formats

        with open(self.path, "rb") as f:
            f.seek(int(self.offsets[0]))
            line = f.readline()
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        keys = sorted(record) if isinstance(record, dict) else None
        found = chat_formats.detect(keys or (), self.messages_key)
        if found is None:
            what = f"has keys {', '.join(keys) or '(none)'}" if keys is not None else "is not a JSON object"
            raise SftRowsError(
                f"input {self.path}: its first record {what}, which fits no accepted conversation format; "
                + chat_formats.formats_help(self.messages_key)
            )
        return found

    def __len__(self) -> int:
        return len(self.offsets)

    def records(self, order: np.ndarray, window: int = READ_WINDOW) -> Iterator[tuple[int, bytes]]:
        """Lines in ``order``; each window is read in file order, so seeks mostly go forward."""
        with open(self.path, "rb") as f:
            for part in chunks(order, window):
                lines = {}
                for i in np.sort(part):
                    f.seek(int(self.offsets[i]))
                    lines[int(i)] = f.readline()
                for i in part:
                    yield int(i), lines[int(i)]

    def decode(self, line: bytes, index: int) -> Decoded:
        """The record's messages and tool list, read as the format its keys fit."""
        from bridge_recipes.chat.chat_formats import record_format

        record = json_record(line, index)
        fmt = record_format(record, self.format, self.messages_key)
        record, notes = fmt.map_roles(record, self.role_map)
        return Decoded(*fmt.read(record, index), fmt.name, notes)


class ParquetSource:
    """A Parquet file read by row group; decoded row groups are cached up to ``cache_bytes``."""

    kind = "parquet"
    blank_lines = 0

    def __init__(
        self,
        path: str | os.PathLike,
        messages_key: str = DEFAULT_MESSAGES_KEY,
        cache_bytes: int = PARQUET_CACHE_BYTES,
        role_map: dict[str, str] | None = None,
    ):
        self.path = Path(path)
        self.messages_key = messages_key
        self.role_map = effective_role_map(role_map)
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as e:
            raise SftRowsError(f"cannot read Parquet file {self.path}: {e}") from e
        from bridge_recipes.chat import chat_formats

        names = self.file.schema_arrow.names
        self.format = chat_formats.detect(names, messages_key)
        if self.format is None:
            raise SftRowsError(
                f"Parquet file {self.path} has columns {', '.join(names)}, which fit no accepted conversation "
                "format; " + chat_formats.formats_help(messages_key)
            )
        # the columns of every format the file has (a row is read as the one its non-null columns fit)
        found = [f for f in chat_formats.formats(messages_key) if all(k in names for k in f.required)]
        self.columns = list(dict.fromkeys(c for f in found for c in f.keys if c in names))
        sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._cached_bytes = 0
        self.sha256 = file_sha256(self.path)

    def __len__(self) -> int:
        return int(self.group_starts[-1])

    def records(self, order: np.ndarray, window: int = READ_WINDOW) -> Iterator[tuple[int, Any]]:
        """Rows in ``order``; each row group needed by a window is decoded once for it."""
        for part in chunks(order, window):
            groups = np.searchsorted(self.group_starts, part, side="right") - 1
            values = {}
            for group in np.unique(groups):
                wanted = part[groups == group]
                column = self._row_group(int(group))
                taken = column.take(pa.array(wanted - self.group_starts[group])).to_pylist()
                values.update(zip(wanted.tolist(), taken))
            for i in part:
                yield int(i), values[int(i)]

    def _row_group(self, group: int) -> pa.Table:
        if group in self._cache:
            self._cache.move_to_end(group)
            return self._cache[group]
        column = self.file.read_row_group(group, columns=self.columns)
        self._cache[group] = column
        self._cached_bytes += column.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:  # keep at least the newest
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= evicted.nbytes
        return column

    def location(self, index: int) -> str:
        return f"row {index + 1}"

    def decode(self, value: dict, index: int) -> Decoded:
        """The row's conversation, tool calls and tool list read without the keys of other rows (a struct
        column gives each row every key any row has, null where it had none: a null is read as absent), and
        the format its non-null columns fit."""
        from bridge_recipes.chat.chat_formats import record_format
        from bridge_recipes.chat.message_text import drop_nulls

        fmt = record_format(value, self.format, self.messages_key)
        value, notes = fmt.map_roles(value, self.role_map)
        messages, tools = fmt.read(value, index)
        if isinstance(messages, list):
            messages = [
                {**m, "tool_calls": drop_nulls(m["tool_calls"])}
                if isinstance(m, dict) and isinstance(m.get("tool_calls"), list)
                else m
                for m in messages
            ]
        return Decoded(messages, drop_nulls(tools) if isinstance(tools, list) else tools, fmt.name, notes)


def spool_hf_dataset(
    dataset_id: str, dest: Path, *, split: str, revision: str | None, messages_key: str, progress: bool
) -> None:
    """Stream the conversation columns of a Hub dataset (those of any accepted format) into a
    local JSONL file.

    A streaming dataset has no random access; spooling it once gives the count and the
    offsets a global permutation needs, with bounded memory (disk: about the column's size).
    """
    from bridge_recipes.chat.chat_formats import formats

    keys = list(dict.fromkeys(k for f in formats(messages_key) for k in f.keys))
    try:
        import datasets
    except ImportError as e:
        raise SftRowsError(
            f"input {dataset_id!r} is not a local file, and reading a Hugging Face dataset needs "
            "the `datasets` library"
        ) from e
    hint = (
        "reading a Hugging Face dataset by id needs network access to the Hub; "
        "offline, pass a local .jsonl or .parquet file"
    )
    try:
        stream = datasets.load_dataset(dataset_id, split=split, revision=revision, streaming=True)
        with open(dest, "w", encoding="utf-8") as out:
            for example in tqdm(stream, desc="download", unit="conv", disable=not progress):
                record = {k: example[k] for k in keys if k in example}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    except Exception as e:
        raise SftRowsError(
            f"cannot load Hugging Face dataset {dataset_id!r} (split {split!r}): {type(e).__name__}: {e}; {hint}"
        ) from e


def _bytes_bar(path: Path, desc: str, progress: bool) -> tqdm:
    return tqdm(total=path.stat().st_size, desc=desc, unit="B", unit_scale=True, disable=not progress)
