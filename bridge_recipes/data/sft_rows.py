"""Packed fixed-length SFT rows with an assistant-only loss mask (docs/sft_data.md): the build's entry
point (:func:`build_sft_rows`), its settings (:class:`RowOptions`) and their checks, the reading of the
source, the two splits and their manifests.

1. Index the source conversations (a first pass: byte offsets of JSONL lines, or the row
   count of a Parquet file), so a global permutation can be drawn without holding the data.
2. Permute the conversation order with ``numpy.random.default_rng(seed).permutation(n)``; with
   ``val_fraction`` the first ``ceil(val_fraction x n)`` of it form the validation split.
3. Read the conversations in that order (a second pass, random access in sorted windows),
   render each with the tokenizer's chat template (``chat_template``) or plain ChatML
   (``chat_render``) and tokenize it, with a loss mask (``conversation_rendering``, in the
   worker processes of ``render_workers``).
4. Pack them into rows of exactly ``row_tokens`` tokens (``packing``): ``boundaries`` places
   whole conversations and records where each starts (``cu_seqlens``), padding the rest;
   ``one_per_row`` places one conversation per row, padded, with no boundaries to pass;
   ``eos_joined`` (the OpenRecipes workload ``qwen35-tulu3-fixed8192-v1``: seed 42,
   8,192-token rows, 0 padding tokens) joins them with one EOS between consecutive ones and
   cuts the stream, dropping the final partial row. Rows without a supervised token are
   skipped and counted. ``split_packing`` runs steps 3 and 4 for one split and counts them.
5. Write the rows incrementally to Parquet (``row_writer``) and a ``manifest.json`` with the
   counts and the sha256 of every artefact (``integrity``), in a staging folder beside the
   output that replaces it only when complete.

``rows_sha256`` and ``parquet_sha256`` are defined in ``integrity``; how the manifest's counts add up,
and how malformed conversations are reported and counted, in ``split_packing``.

Memory stays bounded for sources larger than memory: the index costs 8 bytes per JSONL line
(or nothing for Parquet), the permutation 8 bytes per conversation, reads go through windows
of ``READ_WINDOW`` conversations (Parquet row groups cached up to ``PARQUET_CACHE_BYTES``),
and rows are written ``ROWS_PER_BATCH`` at a time.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bridge_recipes.chat.chat_formats import role_problem
from bridge_recipes.chat.chat_render import DEFAULT_EOS_TOKEN
from bridge_recipes.chat.conversations import (
    DEFAULT_MESSAGES_KEY,
    PARQUET_CACHE_BYTES,
    READ_WINDOW,
    JsonlSource,
    ParquetSource,
    effective_role_map,
    source_kind,
    spool_hf_dataset,
)
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data.conversation_rendering import _cutter, _renderer, thinking_warning
from bridge_recipes.data.integrity import (
    MANIFEST_FILE,
    ROWS_FILE,
    ROWS_SHA256_DEFINITION,
    ROWS_SHA256_DEFINITION_BOUNDARIES,
    VAL_DIR,
)
from bridge_recipes.data.long_conversations import DEFAULT_LONG, LONG_MODES
from bridge_recipes.data.packing import PACKING_MODES
from bridge_recipes.data.row_writer import PARQUET_COMPRESSION, ROWS_PER_BATCH, output_folder, staged_build
from bridge_recipes.data.split_packing import (
    DEFAULT_MAX_DROPPED_SHARE,
    IN_VALIDATION,
    _pack_and_write,
    _Packing,
    _refuse_dropped_share,
)
from bridge_recipes.models.qwen35 import SPECS
from bridge_recipes.utils.outputs import file_sha256, overlap_problem, worker_count

log = logging.getLogger(__name__)

BUILDER_VERSION = "2"
BUILDER = f"bridge_recipes.data.sft_rows/{BUILDER_VERSION}"
DEFAULT_ROW_TOKENS = 8192  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_SEED = 42  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_PACKING = "boundaries"  # whole conversations packed with their boundaries; see packing.py
CHAT_FORMATS = ("template", "chatml")
PERMUTATION = "numpy.random.default_rng(seed).permutation(conversations.indexed)"
# Qwen3.5's context window: no training sequence, so no row, is longer.
MAX_ROW_TOKENS = max(spec.max_position_embeddings for spec in SPECS.values())


def _open_source(source: str, kind: str, work: Path, opts: RowOptions) -> JsonlSource | ParquetSource:
    """The conversations of ``source``: a local file read in place, a Hub dataset spooled into ``work`` first."""
    if kind == "hf":
        spool = work / "hf-spool.jsonl"
        spool_hf_dataset(
            source,
            spool,
            split=opts.split,
            revision=opts.revision,
            messages_key=opts.messages_key,
            progress=opts.progress,
        )
        return JsonlSource(spool, opts.messages_key, opts.progress, unit="record", role_map=opts.role_map)
    if kind == "jsonl":
        return JsonlSource(source, opts.messages_key, opts.progress, role_map=opts.role_map)
    return ParquetSource(source, opts.messages_key, opts.parquet_cache_bytes, role_map=opts.role_map)


def context_window(folder: str | os.PathLike) -> int | None:
    """The context window a checkpoint folder's config.json states (``max_position_embeddings``, or its
    ``text_config``'s for a vision-language one), or None when the folder has none."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the tokenizer checks name an unreadable folder
    if not isinstance(config, dict):
        return None
    for part in (config, config.get("text_config")):
        value = part.get("max_position_embeddings") if isinstance(part, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def context_window_problem(tokenizer: str | os.PathLike, row_tokens: int) -> str | None:
    """Rows longer than the model's context window: the model never saw positions that far."""
    window = context_window(tokenizer) if Path(tokenizer).is_dir() else None
    if window is None or row_tokens <= window:
        return None
    return (
        f"--row-tokens {row_tokens} is above the model's context window: {Path(tokenizer) / 'config.json'} says "
        f"max_position_embeddings {window}; use --row-tokens {window} or less"
    )


@dataclass(frozen=True)
class RowOptions:
    """Every setting of a rows build but its input, tokenizer and output folder; the command line's
    options of the same names (docs/sft_data.md). ``long`` is ``--long``; ``read_window``,
    ``rows_per_batch`` and ``parquet_cache_bytes`` bound the memory a build holds."""

    row_tokens: int = DEFAULT_ROW_TOKENS
    seed: int = DEFAULT_SEED
    messages_key: str = DEFAULT_MESSAGES_KEY
    eos_token: str = DEFAULT_EOS_TOKEN
    supervise_eos: bool = False
    max_rows: int | None = None
    revision: str | None = None
    split: str = "train"
    overwrite: bool = False
    progress: bool = True
    read_window: int = READ_WINDOW
    rows_per_batch: int = ROWS_PER_BATCH
    parquet_cache_bytes: int = PARQUET_CACHE_BYTES
    chat_format: str = "template"
    packing: str = DEFAULT_PACKING
    val_fraction: float = 0.0
    val_input: str | os.PathLike | None = None
    workers: int = 1
    long: str = DEFAULT_LONG
    dedupe: bool = False
    max_dropped_share: float = DEFAULT_MAX_DROPPED_SHARE
    train_empty_think: bool = False
    role_map: dict[str, str] = field(default_factory=dict)  # speaker names read as roles, over the defaults


@dataclass(frozen=True)
class _Staged:
    """A build in its staging folder: the training input in its permuted order, whose first ``n_val``
    conversations are the validation split unless ``opts.val_input`` gives it."""

    source: str
    kind: str
    val_kind: str | None
    stage: Path
    opts: RowOptions
    pack: _Packing
    base: dict  # the manifest fields both splits share
    reader: JsonlSource | ParquetSource
    order: np.ndarray
    n_val: int


def build_sft_rows(
    source: str | os.PathLike,
    tokenizer: str | os.PathLike,
    out_dir: str | os.PathLike,
    options: RowOptions | None = None,
    **changes: Any,
) -> dict:
    """Build ``out_dir/rows.parquet``, ``out_dir/manifest.json`` and (with a validation split)
    ``out_dir/val/``; returns the manifest.

    ``source`` is a local ``.jsonl`` / ``.parquet`` file or a Hugging Face dataset id
    (``split`` and ``revision`` apply to the latter; needs network). ``tokenizer`` is the
    model's tokenizer folder (``chat_format="template"``) or a ``tokenizer.json``
    (``"chatml"``). The settings are ``options`` (:class:`RowOptions`' defaults when None) with
    ``changes`` of its fields by keyword (``row_tokens=1024``). The validation split is
    ``val_fraction`` of the permuted conversations or the whole of ``val_input``. Everything is
    built in a staging folder beside ``out_dir`` and renamed into place when complete: a failed
    or killed build leaves the previous dataset as it was. Raises SftRowsError on bad input.
    """
    opts = replace(options or RowOptions(), **changes)
    _check_options(opts, tokenizer)
    source = str(source)
    kind = source_kind(source)
    val_kind = source_kind(str(opts.val_input)) if opts.val_input is not None else None
    # ~ is the home folder for every path (a shell leaves it as typed after --input=)
    source = source if kind == "hf" else str(Path(source).expanduser())
    if val_kind not in (None, "hf"):
        opts = replace(opts, val_input=Path(str(opts.val_input)).expanduser())
    out = _output(out_dir, source, kind, val_kind, tokenizer, opts)
    render, render_fields, eos_id, tok = _renderer(tokenizer, opts.chat_format, opts.eos_token, opts.train_empty_think)
    cutter = _cutter(tok, opts.long)
    workers, note = worker_count(opts.workers)
    if note:
        log.warning("%s", note)
    with staged_build(out, opts.overwrite, log=log) as build:
        reader = _open_source(source, kind, build.stage, opts)
        order = np.random.default_rng(opts.seed).permutation(len(reader))
        n_val = math.ceil(opts.val_fraction * len(order)) if opts.val_fraction else 0
        if n_val and n_val >= len(order):
            raise SftRowsError(
                f"--val-fraction {opts.val_fraction} puts all {len(order)} conversation(s) of {source} in the "
                f"validation split (ceil({opts.val_fraction} x {len(order)}) = {n_val}), leaving none to train on; "
                "give a smaller fraction (0.01 holds out 1%), or --val-input with a separate file"
            )
        pack = _Packing(
            render=render,
            eos_id=eos_id,
            row_tokens=opts.row_tokens,
            packing=opts.packing,
            supervise_eos=opts.supervise_eos,
            read_window=opts.read_window,
            rows_per_batch=opts.rows_per_batch,
            progress=opts.progress,
            workers=workers,
            long_mode=opts.long,
            cutter=cutter,
            context_limit=context_window(tokenizer) or MAX_ROW_TOKENS,
            dedupe=opts.dedupe,
            max_dropped_share=opts.max_dropped_share,
        )
        base = _base_fields(opts, render_fields, eos_id)
        staged = _Staged(source, kind, val_kind, build.stage, opts, pack, base, reader, order, n_val)
        val_prints: set[bytes] = set()  # the validation conversations' tokens, hashed, to count those in training
        validation = _write_validation(staged, val_prints) if n_val or opts.val_input is not None else None
        manifest = _write_training(staged, val_prints, validation)
        for spool in build.stage.glob("hf-spool.jsonl"):
            spool.unlink()
        (build.stage / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        build.publish()
        return manifest


def _check_options(opts: RowOptions, tokenizer: str | os.PathLike) -> None:
    """The settings within their ranges and fit together, each refused naming its option and the fix."""
    row_tokens, packing, long = opts.row_tokens, opts.packing, opts.long
    if not 1 <= row_tokens <= MAX_ROW_TOKENS:
        raise SftRowsError(
            f"--row-tokens {row_tokens} is outside [1, {MAX_ROW_TOKENS:,}]: a row is one training sequence, at most "
            "the model's context window"
        )
    if problem := context_window_problem(tokenizer, row_tokens):
        raise SftRowsError(problem)
    if not 0 <= opts.seed < 2**32:
        raise SftRowsError(f"seed must be in [0, 2**32), got {opts.seed}")
    workers = opts.workers
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise SftRowsError(f"--workers {workers}: at least 1 (the rows are the same whatever the number)")
    if opts.max_rows is not None and opts.max_rows < 1:
        raise SftRowsError(f"max_rows must be positive, got {opts.max_rows}")
    if opts.chat_format not in CHAT_FORMATS:
        raise SftRowsError(f"chat format {opts.chat_format!r} is not one of {', '.join(CHAT_FORMATS)}")
    if packing not in PACKING_MODES:
        raise SftRowsError(f"packing {packing!r} is not one of {', '.join(PACKING_MODES)}")
    if not 0.0 <= opts.val_fraction < 1.0:
        raise SftRowsError(
            f"--val-fraction {opts.val_fraction} is outside [0, 1): it is the share of conversations held out "
            "for validation (0.01 holds out 1%)"
        )
    if not 0.0 <= opts.max_dropped_share <= 1.0:
        raise SftRowsError(
            f"--max-dropped-share {opts.max_dropped_share} is outside [0, 1]: it is the share of the tokens a build "
            "may leave out (1 allows any)"
        )
    if opts.val_fraction and opts.val_input is not None:
        raise SftRowsError("give either a validation fraction or a validation input, not both")
    if long not in LONG_MODES:
        raise SftRowsError(f"--long {long!r} is not one of {', '.join(LONG_MODES)}")
    if long != DEFAULT_LONG and packing == "eos_joined":
        raise SftRowsError(
            f"--long {long} applies to boundaries and one_per_row rows; eos_joined rows already carry a "
            "conversation on into the next row (leave --long out, or choose --packing boundaries)"
        )
    if opts.supervise_eos and packing != "eos_joined":
        raise SftRowsError(
            f"supervise_eos applies to eos_joined rows ({packing} rows have no EOS separators between conversations)"
        )
    for name, role in (opts.role_map or {}).items():
        if problem := role_problem(name, role):
            raise SftRowsError(problem)
    if opts.train_empty_think and opts.chat_format != "template":
        raise SftRowsError(
            f"--train-empty-think applies to --chat-format template (--chat-format {opts.chat_format} writes no "
            "think block before a reply); leave it out, or build with --chat-format template"
        )


def _output(
    out_dir: str | os.PathLike,
    source: str,
    kind: str,
    val_kind: str | None,
    tokenizer: str | os.PathLike,
    opts: RowOptions,
) -> Path:
    """The output folder, checked to be none of the inputs nor inside one, and the validation input
    checked not to be the training input."""
    val_input = opts.val_input
    if val_kind and val_kind != "hf" and kind != "hf" and os.path.samefile(source, val_input):
        raise SftRowsError(
            f"--val-input {val_input} is the training input itself: validation rows would repeat training "
            "conversations; give a separate file, or --val-fraction to split this one"
        )
    out = output_folder(out_dir)
    local = [
        (flag, p) for flag, p, k in (("--input", source, kind), ("--val-input", val_input, val_kind)) if k != "hf"
    ]
    if problem := overlap_problem(out, option="--out", inputs=[*local, ("--tokenizer", tokenizer)]):
        raise SftRowsError(problem)
    return out


def _base_fields(opts: RowOptions, render_fields: dict, eos_id: int) -> dict:
    """The manifest fields both splits share: the builder, the rendering and the packing."""
    return {
        "builder": BUILDER,
        "builder_version": BUILDER_VERSION,
        "messages_key": opts.messages_key,
        **render_fields,
        "packing": opts.packing,
        "loss_on": render_fields.pop("loss_on") + (" + EOS separators" if opts.supervise_eos else ""),
        "eos_token": opts.eos_token,
        "eos_token_id": eos_id,
        "eos_supervised": opts.supervise_eos,
        "seed": opts.seed,
        "row_tokens": opts.row_tokens,
        "long": opts.long,
        "dedupe": opts.dedupe,
        "max_dropped_share": opts.max_dropped_share,
        "role_map": effective_role_map(opts.role_map),
    }


def _write_validation(staged: _Staged, prints: set[bytes]) -> dict:
    """The validation split's rows and manifest in ``val/``: the first ``n_val`` permuted conversations,
    or the whole ``--val-input``; ``prints`` collects its conversations' fingerprints. Returns its manifest."""
    opts, stage, val_input = staged.opts, staged.stage, staged.opts.val_input
    if val_input is not None:
        val_reader = _open_source(str(val_input), staged.val_kind, stage, opts)
        if val_reader.sha256 == staged.reader.sha256:
            raise SftRowsError(
                f"--val-input {val_input} holds the same bytes as --input {staged.source} (sha256 "
                f"{staged.reader.sha256[:16]}...): validation rows would repeat training conversations; give a "
                "separate file, or --val-fraction to split this one"
            )
        val_order = np.random.default_rng(opts.seed).permutation(len(val_reader))
        val_source = {"source": str(val_input), "source_format": staged.val_kind, "permutation": PERMUTATION}
    else:
        val_reader, val_order = staged.reader, staged.order[: staged.n_val]
        val_source = {
            "source": staged.source,
            "source_format": staged.kind,
            "permutation": f"{PERMUTATION}[:{staged.n_val}]",
            "val_fraction": opts.val_fraction,
        }
    (stage / VAL_DIR).mkdir()
    rows_path = stage / VAL_DIR / ROWS_FILE
    val_stats = _pack_and_write(val_reader, val_order, rows_path, None, staged.pack, fingerprints=prints)
    val_stats.pop("conversations_in_validation")
    _refuse_dropped_share(val_stats, staged.pack, "the validation split")
    if val_stats["rows"] == 0:
        conv = val_stats["conversations"]
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(conv["skipped"].items()))
        raise SftRowsError(
            f"the validation split gave no rows: {conv['read']} conversation(s) read, {conv['used']} used"
            + (f", skipped: {skipped}" if skipped else "")
            + f", {val_stats['stream_tokens']} tokens; "
            + (
                f"give a --val-input with usable conversations (now {val_input})"
                if val_input is not None
                else f"raise --val-fraction (now {opts.val_fraction}) or give --val-input"
            )
            + (", or fix the skipped conversations" if skipped else "")
        )
    validation = _manifest(staged.base, val_source, val_reader, val_stats, rows_path, None, "validation")
    (stage / VAL_DIR / MANIFEST_FILE).write_text(json.dumps(validation, indent=2) + "\n")
    return validation


def _write_training(staged: _Staged, prints: set[bytes], validation: dict | None) -> dict:
    """The training split's rows: the permuted conversations after the validation ones. Returns the
    build's manifest, which names the validation split; a conversation also in it is warned about."""
    opts, stage, source, n_val = staged.opts, staged.stage, staged.source, staged.n_val
    order = staged.order[n_val:]
    stats = _pack_and_write(staged.reader, order, stage / ROWS_FILE, opts.max_rows, staged.pack, seen=prints)
    in_both = stats.pop("conversations_in_validation")
    if in_both:
        log.warning(
            "%d training conversation(s) are also in the validation split (the same tokens): the validation "
            "loss on them measures memory, not generalization; --dedupe removes them from training",
            in_both,
        )
    _refuse_dropped_share(stats, staged.pack, str(source))
    if warning := thinking_warning(staged.base["thinking"], stats["conversations"]):
        log.warning("%s", warning)
    if stats["rows"] == 0:
        conv = stats["conversations"]
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(conv["skipped"].items()))
        raise SftRowsError(
            f"no rows built from {source}: {conv['read']} conversation(s) read, {conv['used']} usable, "
            f"giving {stats['stream_tokens']} tokens, fewer than one supervised {opts.row_tokens}-token row"
            + (f"; skipped: {skipped} (the warnings above show examples)" if skipped else "")
        )
    train_source = {
        "source": source,
        "source_format": staged.kind,
        "revision": opts.revision,
        "split": opts.split if staged.kind == "hf" else None,
        "permutation": f"{PERMUTATION}[{n_val}:]" if n_val else PERMUTATION,
    }
    manifest = _manifest(staged.base, train_source, staged.reader, stats, stage / ROWS_FILE, opts.max_rows, "train")
    manifest["validation"] = (
        None
        if validation is None
        else {k: validation[k] for k in ("rows", "rows_sha256", "parquet_sha256", "conversations")}
        | {
            "folder": VAL_DIR,
            "conversations_also_in_training": in_both,
            "conversations_removed_from_training": stats["conversations"]["skipped"].get(IN_VALIDATION, 0),
        }
    )
    return manifest


def _manifest(base: dict, source: dict, reader, stats: dict, rows_path: Path, max_rows, split_name: str) -> dict:
    return {
        **base,
        "split_name": split_name,
        **source,
        "source_sha256": getattr(reader, "sha256", None) if source.get("source_format") != "hf" else None,
        "record_format": reader.format.name if reader.format else None,
        "max_rows": max_rows,
        **stats,
        "rows_sha256_definition": ROWS_SHA256_DEFINITION_BOUNDARIES
        if base["packing"] == "boundaries"
        else ROWS_SHA256_DEFINITION,
        "parquet_file": ROWS_FILE,
        "parquet_sha256": file_sha256(rows_path),
        "parquet_bytes": rows_path.stat().st_size,
        "parquet_compression": PARQUET_COMPRESSION,
        "pyarrow_version": pa.__version__,
    }
