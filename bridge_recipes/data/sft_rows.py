"""Packed fixed-length SFT rows with an assistant-only loss mask.

Builds the kind of data set the SFT recipes train on, as the OpenRecipes workload
``qwen35-tulu3-fixed8192-v1`` was built (published: seed 42, 8,192-token rows, 6,400 rows,
0 padding tokens, supervised-token ratio 0.676, every artefact identified by sha256):

1. Index the source conversations (a first pass: byte offsets of JSONL lines, or the row
   count of a Parquet file), so a global permutation can be drawn without holding the data.
2. Permute the conversation order with ``numpy.random.default_rng(seed).permutation(n)``.
3. Read the conversations in that order (a second pass, random access in sorted windows),
   render each with the Qwen chat format and tokenize it, with a loss mask.
4. Concatenate the conversations with one EOS token *between* consecutive conversations
   (none before the first) and cut the stream into consecutive rows of exactly
   ``row_tokens`` tokens. The final partial row is dropped (``tail_tokens_dropped``), so
   there is never any padding. Rows without a supervised token are skipped and counted.
5. Write the rows incrementally to Parquet and a ``manifest.json`` with the counts and the
   sha256 of every artefact.

Chat format (Qwen ChatML, as the Qwen3.5 chat template renders plain text turns): each
message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. Supervised (mask 1) are the
content tokens of assistant messages and their closing ``<|im_end|>``; the
``<|im_start|>assistant\\n`` header, the ``\\n`` after ``<|im_end|>``, every system and user
token and (by default) the EOS separator between conversations have mask 0. Content is used
verbatim: no ``<think>`` block is inserted (a content that already holds one is supervised as
written). Roles are ``system``, ``user`` and ``assistant``; ``tool`` turns are rejected
because the Qwen template folds them into user turns, which this builder does not replicate.

Tokenization is per segment (the ``{role}\\n`` header, each content, the ``\\n`` after
``<|im_end|>``; the special tokens are inserted by id), so every token belongs to exactly one
message and the mask is exact. Tokenizing the whole rendered string instead can merge
characters across a segment boundary (e.g. a content starting with ``\\n`` joins the header's
``\\n`` in one BPE token), and such a token has no single correct mask value. The price is
that those rare boundary tokens differ from a whole-string tokenization. As with the HF
chat template, special-token text inside a content (e.g. ``<|im_end|>``) encodes to the
special token.

Malformed conversations are never silently dropped: each one is reported (a warning naming
the source row index and the reason, the first ``MAX_REPORTED`` of them) and counted by
reason in the manifest under ``conversations.skipped``. The source row index is 0-based: the
Parquet row, or for JSONL the non-blank line (blank lines are not conversations; they are
counted as ``conversations.blank_lines``).

``rows_sha256`` is defined independently of the Parquet encoding: sha256 over, for each
written row in order, its ``input_ids`` as little-endian int32 bytes (``4 * row_tokens``
bytes) followed by its ``loss_mask`` as uint8 bytes (``row_tokens`` bytes).
``parquet_sha256`` is the sha256 of the Parquet file bytes, which also depend on the
pyarrow version and compression (both recorded in the manifest).

Counts in the manifest obey ``stream_tokens == (rows + rows_skipped_without_targets) *
row_tokens + tail_tokens_dropped``: ``stream_tokens`` counts every token of the used
conversations and EOS separators that were produced, ``tail_tokens_dropped`` the ones in no
row (the final partial row, or, when ``max_rows`` stopped the build, the rest of the last
conversation read). ``conversations`` holds ``indexed`` (in the source), ``read``, ``used``,
``skipped`` (by reason), ``skipped_total``, ``skipped_examples`` and ``blank_lines``.

Memory stays bounded for sources larger than memory: the index costs 8 bytes per JSONL line
(or nothing for Parquet), the permutation 8 bytes per conversation, reads go through windows
of ``READ_WINDOW`` conversations (Parquet row groups cached up to ``PARQUET_CACHE_BYTES``),
and rows are written ``ROWS_PER_BATCH`` at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer
from tqdm import tqdm

log = logging.getLogger(__name__)

BUILDER_VERSION = "1"
BUILDER = f"bridge_recipes.data.sft_rows/{BUILDER_VERSION}"
DEFAULT_ROW_TOKENS = 8192  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_SEED = 42  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_MESSAGES_KEY = "messages"
DEFAULT_EOS_TOKEN = "<|endoftext|>"  # Qwen3.5's EOS, id 248046 in the released tokenizer
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant")
SUPERVISED_ROLE = "assistant"

ROWS_FILE = "rows.parquet"
MANIFEST_FILE = "manifest.json"
PARQUET_COMPRESSION = "zstd"
ROWS_PER_BATCH = 128  # rows per Parquet row group: ~5 MB in memory at 8,192 tokens
READ_WINDOW = 4096  # conversations fetched per sorted random-access window
PARQUET_CACHE_BYTES = 512 * 2**20  # decoded Parquet row groups kept between windows
MAX_REPORTED = 20  # malformed conversations logged one by one (and kept in the manifest)

ROWS_SHA256_DEFINITION = (
    "sha256 over, for each row in order, input_ids as little-endian int32 bytes followed by loss_mask as uint8 bytes"
)

_FILE_SUFFIXES = {".jsonl": "jsonl", ".parquet": "parquet"}
# Suffixes that mark a missing *file* rather than a Hugging Face dataset id.
_PATH_LIKE_SUFFIXES = {".jsonl", ".json", ".parquet", ".arrow", ".csv", ".txt", ".gz", ".zst", ".bz2", ".xz"}
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class SftRowsError(Exception):
    """Bad input to a build (missing file, unusable tokenizer, output folder in use, ...)."""


class MalformedConversation(ValueError):
    """A source conversation that cannot be rendered; ``index`` is its source row index."""

    def __init__(self, index: int | None, reason: str, detail: str):
        self.index = index
        self.reason = reason
        self.detail = detail
        where = f"source row {index}" if index is not None else "conversation"
        super().__init__(f"{where}: {detail} [{reason}]")


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class ChatFormat:
    """Token ids of the fixed parts of the Qwen chat format for one tokenizer."""

    im_start_id: int
    im_end_id: int
    eos_id: int | None
    newline_ids: tuple[int, ...]
    header_ids: dict[str, tuple[int, ...]]  # role -> ids of "{role}\n"


def backend_tokenizer(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` behind a ``Tokenizer`` or a HF ``PreTrainedTokenizerFast``."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(f"expected a tokenizers.Tokenizer or a PreTrainedTokenizerFast, got {type(tokenizer).__name__}")


def load_tokenizer(path: str | os.PathLike) -> tuple[Tokenizer, Path]:
    """Load ``tokenizer.json`` (a file, or a folder holding one); returns it and its path."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise SftRowsError(f"tokenizer not found: {file} (pass a tokenizer.json file or a folder holding one)")
    try:
        return Tokenizer.from_file(str(file)), file
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise SftRowsError(f"cannot read tokenizer {file}: {e}") from e


def chat_format(tokenizer: Any, eos_token: str | None = DEFAULT_EOS_TOKEN) -> ChatFormat:
    """Resolve the chat-format token ids; ``eos_token=None`` when no packing is needed."""
    tok = backend_tokenizer(tokenizer)
    needed = [IM_START, IM_END] + ([eos_token] if eos_token is not None else [])
    missing = [t for t in needed if tok.token_to_id(t) is None]
    if missing:
        raise SftRowsError(
            f"tokenizer lacks the token(s) {', '.join(missing)}: the Qwen chat format needs "
            f"{IM_START} and {IM_END}, and the EOS separator between conversations "
            f"({eos_token!r}, set with --eos-token) must be a single token"
        )
    newline = tuple(tok.encode("\n", add_special_tokens=False).ids)
    if not newline:  # a tokenizer that drops newlines cannot represent the format
        raise SftRowsError("tokenizer encodes '\\n' to no token; it cannot render the Qwen chat format")
    headers = {role: tuple(tok.encode(f"{role}\n", add_special_tokens=False).ids) for role in ROLES}
    return ChatFormat(
        im_start_id=tok.token_to_id(IM_START),
        im_end_id=tok.token_to_id(IM_END),
        eos_id=tok.token_to_id(eos_token) if eos_token is not None else None,
        newline_ids=newline,
        header_ids=headers,
    )


# --------------------------------------------------------------------- render and mask


def validate_conversation(messages: Any, index: int | None = None) -> list[dict]:
    """Return ``messages`` if it is a renderable conversation, else raise MalformedConversation."""
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise MalformedConversation(index, "messages_not_a_list", f"messages is {kind}, not a list")
    if not messages:
        raise MalformedConversation(index, "empty_conversation", "messages is an empty list")
    for j, message in enumerate(messages):
        if not isinstance(message, dict):
            raise MalformedConversation(
                index, "message_not_an_object", f"message {j} is {type(message).__name__}, not an object"
            )
        for key in ("role", "content"):
            if message.get(key) is None:
                raise MalformedConversation(index, "missing_role_or_content", f"message {j} has no {key!r}")
        if message["role"] not in ROLES:
            raise MalformedConversation(
                index, "unknown_role", f"message {j} has unknown role {message['role']!r} (expected one of {ROLES})"
            )
        if not isinstance(message["content"], str):
            kind = type(message["content"]).__name__
            raise MalformedConversation(index, "content_not_a_string", f"message {j} content is {kind}, not a string")
    if not any(m["role"] == SUPERVISED_ROLE for m in messages):
        raise MalformedConversation(index, "no_assistant_turn", "conversation has no assistant turn")
    return messages


def render_conversation(
    tokenizer: Any, messages: Any, fmt: ChatFormat | None = None, *, index: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32) and loss mask (uint8, 1 = supervised) of one conversation.

    Raises MalformedConversation (naming ``index``) if the conversation is malformed.
    """
    tok = backend_tokenizer(tokenizer)
    fmt = fmt or chat_format(tok, eos_token=None)
    validate_conversation(messages, index)
    contents = tok.encode_batch([m["content"] for m in messages], add_special_tokens=False)
    ids: list[int] = []
    mask: list[int] = []
    for message, content in zip(messages, contents):
        header = [fmt.im_start_id, *fmt.header_ids[message["role"]]]
        body = [*content.ids, fmt.im_end_id]  # the closing <|im_end|> is learned with the reply
        supervised = 1 if message["role"] == SUPERVISED_ROLE else 0
        ids += header + body + list(fmt.newline_ids)
        mask += [0] * len(header) + [supervised] * len(body) + [0] * len(fmt.newline_ids)
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)


# ------------------------------------------------------------------------------ packing


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


# ------------------------------------------------------------------------------ hashing


def update_rows_hash(hasher: hashlib._Hash, ids: np.ndarray, mask: np.ndarray) -> None:
    """Feed one row into a rows_sha256 hasher (see the module docstring for the definition)."""
    hasher.update(np.asarray(ids, dtype="<i4").tobytes())
    hasher.update(np.asarray(mask, dtype=np.uint8).tobytes())


def parquet_rows_sha256(path: str | os.PathLike) -> str:
    """Recompute rows_sha256 from a rows Parquet file, one row group at a time."""
    hasher = hashlib.sha256()
    pf = pq.ParquetFile(path)
    for rg in range(pf.num_row_groups):
        table = pf.read_row_group(rg, columns=["input_ids", "loss_mask"])
        for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
            update_rows_hash(hasher, np.asarray(ids), np.asarray(mask))
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike, chunk: int = 16 * 2**20) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()


# ------------------------------------------------------------------------------ sources


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


class JsonlSource:
    """A JSONL file indexed by the byte offset of each non-blank line (8 bytes per line)."""

    kind = "jsonl"

    def __init__(self, path: str | os.PathLike, messages_key: str = DEFAULT_MESSAGES_KEY, progress: bool = False):
        self.path = Path(path)
        self.messages_key = messages_key
        offsets = array("q")
        hasher = hashlib.sha256()
        self.blank_lines = 0
        with open(self.path, "rb") as f, _bytes_bar(self.path, "index", progress) as bar:
            offset = 0
            for line in f:
                hasher.update(line)  # hashed while indexing: the source identity costs no extra pass
                if line.isspace():
                    self.blank_lines += 1
                else:
                    offsets.append(offset)
                offset += len(line)
                bar.update(len(line))
        self.offsets = np.frombuffer(offsets, dtype=np.int64) if offsets else np.zeros(0, dtype=np.int64)
        self.sha256 = hasher.hexdigest()

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

    def decode(self, line: bytes, index: int) -> Any:
        try:
            record = json.loads(line)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise MalformedConversation(index, "invalid_json", f"line is not valid JSON ({e})") from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise MalformedConversation(index, "record_not_an_object", f"line is a JSON {kind}, not an object")
        if self.messages_key not in record:
            raise MalformedConversation(index, "missing_messages_key", f"record has no {self.messages_key!r} key")
        return record[self.messages_key]


class ParquetSource:
    """A Parquet file read by row group; decoded row groups are cached up to ``cache_bytes``."""

    kind = "parquet"
    blank_lines = 0

    def __init__(
        self, path: str | os.PathLike, messages_key: str = DEFAULT_MESSAGES_KEY, cache_bytes: int = PARQUET_CACHE_BYTES
    ):
        self.path = Path(path)
        self.messages_key = messages_key
        try:
            self.file = pq.ParquetFile(self.path)
        except Exception as e:
            raise SftRowsError(f"cannot read Parquet file {self.path}: {e}") from e
        names = self.file.schema_arrow.names
        if messages_key not in names:
            columns = ", ".join(names)
            raise SftRowsError(f"Parquet file {self.path} has no {messages_key!r} column (columns: {columns})")
        sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, pa.ChunkedArray] = OrderedDict()
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

    def _row_group(self, group: int) -> pa.ChunkedArray:
        if group in self._cache:
            self._cache.move_to_end(group)
            return self._cache[group]
        column = self.file.read_row_group(group, columns=[self.messages_key]).column(0)
        self._cache[group] = column
        self._cached_bytes += column.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:  # keep at least the newest
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= evicted.nbytes
        return column

    def decode(self, value: Any, index: int) -> Any:
        return value


def spool_hf_dataset(
    dataset_id: str, dest: Path, *, split: str, revision: str | None, messages_key: str, progress: bool
) -> None:
    """Stream a Hub dataset's ``messages_key`` column into a local JSONL file.

    A streaming dataset has no random access; spooling it once gives the count and the
    offsets a global permutation needs, with bounded memory (disk: about the column's size).
    """
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
                record = {messages_key: example[messages_key]} if messages_key in example else {}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    except Exception as e:
        raise SftRowsError(
            f"cannot load Hugging Face dataset {dataset_id!r} (split {split!r}): {type(e).__name__}: {e}; {hint}"
        ) from e


def _bytes_bar(path: Path, desc: str, progress: bool) -> tqdm:
    return tqdm(total=path.stat().st_size, desc=desc, unit="B", unit_scale=True, disable=not progress)


# ------------------------------------------------------------------------------- output


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


# -------------------------------------------------------------------------------- build


def build_sft_rows(
    source: str | os.PathLike,
    tokenizer: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    row_tokens: int = DEFAULT_ROW_TOKENS,
    seed: int = DEFAULT_SEED,
    messages_key: str = DEFAULT_MESSAGES_KEY,
    eos_token: str = DEFAULT_EOS_TOKEN,
    supervise_eos: bool = False,
    max_rows: int | None = None,
    revision: str | None = None,
    split: str = "train",
    overwrite: bool = False,
    progress: bool = True,
    read_window: int = READ_WINDOW,
    rows_per_batch: int = ROWS_PER_BATCH,
    parquet_cache_bytes: int = PARQUET_CACHE_BYTES,
) -> dict:
    """Build ``out_dir/rows.parquet`` and ``out_dir/manifest.json``; returns the manifest.

    ``source`` is a local ``.jsonl`` / ``.parquet`` file or a Hugging Face dataset id
    (``split`` and ``revision`` apply to the latter; needs network). Files are written under
    temporary names and renamed at the end, so a failed build leaves nothing half-written.
    Raises SftRowsError on bad input.
    """
    if row_tokens < 1:
        raise SftRowsError(f"row_tokens must be positive, got {row_tokens}")
    if max_rows is not None and max_rows < 1:
        raise SftRowsError(f"max_rows must be positive, got {max_rows}")
    source = str(source)
    kind = source_kind(source)
    tok, tokenizer_file = load_tokenizer(tokenizer)
    fmt = chat_format(tok, eos_token)
    out = Path(out_dir).expanduser()
    check_output_dir(out, overwrite)

    created_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tag = f".tmp-{os.getpid()}"
    tmp_rows, tmp_manifest = out / (ROWS_FILE + tag), out / (MANIFEST_FILE + tag)
    spool = out / ("hf-spool.jsonl" + tag)
    try:
        if kind == "hf":
            spool_hf_dataset(
                source, spool, split=split, revision=revision, messages_key=messages_key, progress=progress
            )
            reader: JsonlSource | ParquetSource = JsonlSource(spool, messages_key, progress)
        elif kind == "jsonl":
            reader = JsonlSource(source, messages_key, progress)
        else:
            reader = ParquetSource(source, messages_key, parquet_cache_bytes)
        stats = _pack_and_write(
            reader,
            tok,
            fmt,
            tmp_rows,
            row_tokens,
            seed,
            supervise_eos,
            max_rows,
            read_window,
            rows_per_batch,
            progress,
        )
        if stats["rows"] == 0:
            raise SftRowsError(
                f"no rows built from {source}: {stats['conversations']['used']} usable conversation(s) "
                f"gave {stats['stream_tokens']} tokens, fewer than one supervised {row_tokens}-token row"
            )
        manifest = {
            "builder": BUILDER,
            "builder_version": BUILDER_VERSION,
            "source": source,
            "source_format": kind,
            "source_sha256": reader.sha256 if kind != "hf" else None,
            "revision": revision,
            "split": split if kind == "hf" else None,
            "messages_key": messages_key,
            "tokenizer": str(tokenizer_file),
            "tokenizer_sha256": file_sha256(tokenizer_file),
            "chat_format": "qwen-chatml: <|im_start|>{role}\\n{content}<|im_end|>\\n, tokenized per segment",
            "loss_on": "assistant content + its <|im_end|>" + (" + EOS separators" if supervise_eos else ""),
            "eos_token": eos_token,
            "eos_token_id": fmt.eos_id,
            "eos_supervised": supervise_eos,
            "seed": seed,
            "permutation": "numpy.random.default_rng(seed).permutation(conversations.indexed)",
            "row_tokens": row_tokens,
            "max_rows": max_rows,
            **stats,
            "rows_sha256_definition": ROWS_SHA256_DEFINITION,
            "parquet_file": ROWS_FILE,
            "parquet_sha256": file_sha256(tmp_rows),
            "parquet_bytes": tmp_rows.stat().st_size,
            "parquet_compression": PARQUET_COMPRESSION,
            "pyarrow_version": pa.__version__,
        }
        tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n")
        # The manifest goes last: a folder with rows but no manifest is visibly incomplete.
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        os.replace(tmp_rows, out / ROWS_FILE)
        os.replace(tmp_manifest, out / MANIFEST_FILE)
        return manifest
    except BaseException:
        for path in (tmp_rows, tmp_manifest):
            path.unlink(missing_ok=True)
        if created_out and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        spool.unlink(missing_ok=True)


def _pack_and_write(
    reader: JsonlSource | ParquetSource,
    tok: Tokenizer,
    fmt: ChatFormat,
    path: Path,
    row_tokens: int,
    seed: int,
    supervise_eos: bool,
    max_rows: int | None,
    read_window: int,
    rows_per_batch: int,
    progress: bool,
) -> dict:
    """The second pass: permuted conversations -> rendered -> packed -> written. Returns counts."""
    order = np.random.default_rng(seed).permutation(len(reader))
    packer = RowPacker(row_tokens, fmt.eos_id, supervise_eos)
    writer = RowWriter(path, row_tokens, rows_per_batch)
    read, skipped, examples, rows_without_targets = 0, Counter(), [], 0
    try:
        with tqdm(total=len(order), desc="pack", unit="conv", disable=not progress) as bar:
            for index, raw in reader.records(order, read_window):
                read += 1
                bar.update(1)
                try:
                    ids, mask = render_conversation(tok, reader.decode(raw, index), fmt, index=index)
                except MalformedConversation as e:
                    skipped[e.reason] += 1
                    if len(examples) < MAX_REPORTED:
                        examples.append(str(e))
                        log.warning("skipping malformed conversation, %s", e)
                    continue
                for row_ids, row_mask in packer.add(ids, mask):
                    if not row_mask.any():  # nothing to learn from: counted, not written
                        rows_without_targets += 1
                        continue
                    writer.add(row_ids, row_mask)
                    if writer.rows == max_rows:
                        break
                if writer.rows == max_rows:
                    break
                if read % 256 == 0:
                    bar.set_postfix(rows=writer.rows, refresh=False)
    finally:
        writer.close()
    skipped_total = sum(skipped.values())
    if skipped_total > len(examples):
        unreported = skipped_total - len(examples)
        log.warning("%d more malformed conversation(s) skipped; counts by reason in the manifest", unreported)
    written_tokens = writer.rows * row_tokens
    return {
        "rows": writer.rows,
        "padding_tokens": 0,  # rows are cut from the stream, never padded
        "supervised_tokens": writer.supervised_tokens,
        "supervised_ratio": round(writer.supervised_tokens / written_tokens, 6) if written_tokens else 0.0,
        "stream_tokens": packer.stream_tokens,
        "tail_tokens_dropped": packer.stream_tokens - (writer.rows + rows_without_targets) * row_tokens,
        "rows_skipped_without_targets": rows_without_targets,
        "stopped_at_max_rows": max_rows is not None and writer.rows == max_rows,
        "rows_sha256": writer.rows_sha256,
        "conversations": {
            "indexed": len(order),
            "read": read,
            "used": packer.conversations,
            "skipped": dict(sorted(skipped.items())),
            "skipped_total": skipped_total,
            "skipped_examples": examples,
            "blank_lines": reader.blank_lines,
        },
    }
