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

The chat rendering is in ``chat_render``, the sources in ``conversations``, packing in
``packing``, hashes in ``integrity`` and Parquet output in ``row_writer``; this module builds.

Malformed conversations are never silently dropped: each one is reported (a warning naming
the source row index and the reason, the first ``MAX_REPORTED`` of them) and counted by
reason in the manifest under ``conversations.skipped``. The source row index is 0-based: the
Parquet row, or for JSONL the non-blank line (blank lines are not conversations; they are
counted as ``conversations.blank_lines``).

``rows_sha256`` and ``parquet_sha256`` are defined in ``integrity``.

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

import json
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer
from tqdm import tqdm

from bridge_recipes.data.chat_render import (  # noqa: F401 - the public names of the builder
    DEFAULT_EOS_TOKEN,
    IM_END,
    IM_START,
    ROLES,
    SUPERVISED_ROLE,
    ChatFormat,
    backend_tokenizer,
    chat_format,
    load_tokenizer,
    render_conversation,
    validate_conversation,
)
from bridge_recipes.data.conversations import (  # noqa: F401
    DEFAULT_MESSAGES_KEY,
    PARQUET_CACHE_BYTES,
    READ_WINDOW,
    JsonlSource,
    MalformedConversation,
    ParquetSource,
    SftRowsError,
    source_kind,
    spool_hf_dataset,
)
from bridge_recipes.data.integrity import (  # noqa: F401
    MANIFEST_FILE,
    ROWS_FILE,
    ROWS_SHA256_DEFINITION,
    file_sha256,
    parquet_rows_sha256,
    update_rows_hash,
)
from bridge_recipes.data.packing import RowPacker
from bridge_recipes.data.row_writer import PARQUET_COMPRESSION, ROWS_PER_BATCH, RowWriter, check_output_dir

log = logging.getLogger(__name__)

BUILDER_VERSION = "1"
BUILDER = f"bridge_recipes.data.sft_rows/{BUILDER_VERSION}"
DEFAULT_ROW_TOKENS = 8192  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_SEED = 42  # OpenRecipes qwen35-tulu3-fixed8192-v1
MAX_REPORTED = 20  # malformed conversations logged one by one (and kept in the manifest)


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
