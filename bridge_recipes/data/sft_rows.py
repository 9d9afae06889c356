"""Packed fixed-length SFT rows with an assistant-only loss mask (docs/sft_data.md).

1. Index the source conversations (a first pass: byte offsets of JSONL lines, or the row
   count of a Parquet file), so a global permutation can be drawn without holding the data.
2. Permute the conversation order with ``numpy.random.default_rng(seed).permutation(n)``; with
   ``val_fraction`` the first ``ceil(val_fraction x n)`` of it form the validation split.
3. Read the conversations in that order (a second pass, random access in sorted windows),
   render each with the tokenizer's chat template (``chat_template``) or plain ChatML
   (``chat_render``) and tokenize it, with a loss mask.
4. Pack them into rows of exactly ``row_tokens`` tokens (``packing``): ``boundaries`` places
   whole conversations and records where each starts (``cu_seqlens``), padding the rest;
   ``one_per_row`` places one conversation per row, padded, with no boundaries to pass;
   ``eos_joined`` (the OpenRecipes workload ``qwen35-tulu3-fixed8192-v1``: seed 42,
   8,192-token rows, 0 padding tokens) joins them with one EOS between consecutive ones and
   cuts the stream, dropping the final partial row. Rows without a supervised token are
   skipped and counted.
5. Write the rows incrementally to Parquet (``row_writer``) and a ``manifest.json`` with the
   counts and the sha256 of every artefact (``integrity``), in a staging folder beside the
   output that replaces it only when complete.

Malformed conversations are never silently dropped: each one is reported (a warning naming
the source row index and the reason, the first ``MAX_REPORTED`` of them) and counted by
reason in the manifest under ``conversations.skipped``. The source row index is 0-based: the
Parquet row, or for JSONL the non-blank line (blank lines are not conversations; they are
counted as ``conversations.blank_lines``).

``rows_sha256`` and ``parquet_sha256`` are defined in ``integrity``.

Counts in the manifest obey ``stream_tokens + padding_tokens == (rows +
rows_skipped_without_targets) * row_tokens + tail_tokens_dropped``: ``stream_tokens`` counts
every token of the used conversations and EOS separators that were produced,
``padding_tokens`` the padding of boundaries and one_per_row rows, ``tail_tokens_dropped`` the ones in no row
(the final partial row of eos_joined rows, or, when ``max_rows`` stopped the build, what was
read but not written). ``conversations`` holds ``indexed`` (in the source), ``read``, ``used``,
``skipped`` (by reason), ``skipped_total``, ``skipped_examples``, ``blank_lines``, and of the used ones
``with_reasoning`` / ``without_reasoning`` (by their last reply) and ``replies_with_empty_think``.

A thinking chat template (Qwen3.5/3.6's) writes an empty think block before a reply without reasoning;
its tokens stay out of the loss unless ``train_empty_think`` (``thinking`` in the manifest), and a build
whose conversations carry reasoning less than :data:`MIN_REASONING_SHARE` of the time warns.

Memory stays bounded for sources larger than memory: the index costs 8 bytes per JSONL line
(or nothing for Parquet), the permutation 8 bytes per conversation, reads go through windows
of ``READ_WINDOW`` conversations (Parquet row groups cached up to ``PARQUET_CACHE_BYTES``),
and rows are written ``ROWS_PER_BATCH`` at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from bridge_recipes.chat.chat_formats import role_problem
from bridge_recipes.chat.chat_render import (  # noqa: F401 - the public names of the builder
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
from bridge_recipes.chat.chat_render import eos_id as special_token_id
from bridge_recipes.chat.chat_template import Rendered, TemplateRenderer
from bridge_recipes.chat.conversations import (  # noqa: F401
    DEFAULT_MESSAGES_KEY,
    PARQUET_CACHE_BYTES,
    READ_WINDOW,
    JsonlSource,
    MalformedConversation,
    ParquetSource,
    SftRowsError,
    effective_role_map,
    source_kind,
    spool_hf_dataset,
)
from bridge_recipes.chat.message_text import ends_with_reasoning, turn_notes
from bridge_recipes.data.integrity import (  # noqa: F401
    MANIFEST_FILE,
    ROWS_FILE,
    ROWS_SHA256_DEFINITION,
    ROWS_SHA256_DEFINITION_BOUNDARIES,
    VAL_DIR,
    file_sha256,
    parquet_rows_sha256,
    update_rows_hash,
)
from bridge_recipes.data.long_conversations import DEFAULT_LONG, LONG_MODES, LongConversations, TurnCutter  # noqa: F401
from bridge_recipes.data.packing import PACKING_MODES, BoundaryPacker, RowPacker, packer_for  # noqa: F401
from bridge_recipes.data.row_writer import (
    PARQUET_COMPRESSION,
    ROWS_PER_BATCH,
    RowWriter,
    output_folder,
    staged_build,
)
from bridge_recipes.models.qwen35 import SPECS
from bridge_recipes.utils.outputs import overlap_problem, worker_count, worker_processes

log = logging.getLogger(__name__)

BUILDER_VERSION = "2"
BUILDER = f"bridge_recipes.data.sft_rows/{BUILDER_VERSION}"
DEFAULT_ROW_TOKENS = 8192  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_SEED = 42  # OpenRecipes qwen35-tulu3-fixed8192-v1
DEFAULT_PACKING = "boundaries"  # whole conversations packed with their boundaries; see packing.py
CHAT_FORMATS = ("template", "chatml")
PERMUTATION = "numpy.random.default_rng(seed).permutation(conversations.indexed)"
MAX_REPORTED = 20  # malformed conversations logged one by one (and kept in the manifest)
IN_VALIDATION = "also_in_validation"  # skip reason: a training conversation --dedupe removes, being in validation
# Qwen3.5's context window: no training sequence, so no row, is longer.
WORK_CHUNK = 64  # conversations a worker renders per task
CHUNKS_AHEAD = 4  # tasks in flight per worker: the bound on what is read ahead of the packer
MAX_ROW_TOKENS = max(spec.max_position_embeddings for spec in SPECS.values())
# A token of Qwen3.5's vocabulary is a few bytes of text (at most a few dozen, written as JSON
# escapes); a JSONL line (or a Parquet row's text) of more than this many bytes a token cannot fit
# its row, and is skipped before it is parsed or tokenized.
MAX_LINE_BYTES_PER_TOKEN = 64
# With --long split or truncate a conversation of any length is tokenized; one larger than this is a
# broken record rather than a conversation, and is skipped before it is parsed.
MAX_CONVERSATION_BYTES = 64 * 2**20
# Rows that hold whole conversations: a build that leaves out more than this share of the tokens (long
# conversations skipped or cut) stops before writing, unless --max-dropped-share allows more.
DEFAULT_MAX_DROPPED_SHARE = 0.10
# A thinking model trained on fewer conversations with reasoning than this share loses its thinking mode: the
# build warns, naming the share (the advice for fine-tuning a thinking model: three in four with reasoning).
MIN_REASONING_SHARE = 0.75

Renderer = Callable[[Any, int], Rendered]


def _renderer(
    tokenizer: str | os.PathLike, fmt: str, eos_token: str, train_empty_think: bool = False
) -> tuple[Renderer, dict, int, Any]:
    """The conversation renderer, its manifest fields, the EOS (separator / padding) id and the
    tokenizer (``tokenizers.Tokenizer``) it encodes with."""
    if fmt == "chatml":
        tok, tokenizer_file = load_tokenizer(tokenizer)
        chat = chat_format(tok, eos_token)

        def render(conversation: Any, index: int) -> Rendered:
            messages, tools = conversation
            if tools:
                raise MalformedConversation(index, "tools_need_template", "a tools list needs --chat-format template")
            ids, mask = render_conversation(tok, messages, chat, index=index)
            return Rendered(ids, mask, ends_with_reasoning(messages), 0)

        fields = {
            "tokenizer": str(tokenizer_file),
            "tokenizer_sha256": file_sha256(tokenizer_file),
            "chat_format": "qwen-chatml: <|im_start|>{role}\\n{content}<|im_end|>\\n, tokenized per segment",
            "chat_template_sha256": None,
            "loss_on": "assistant content + its <|im_end|>",
            "thinking": thinking_fields(None, False),
        }
        return render, fields, chat.eos_id, tok
    renderer = TemplateRenderer(tokenizer, train_empty_think=train_empty_think)
    eos_id = special_token_id(renderer.backend, eos_token)
    if train_empty_think and renderer.empty_think is None:
        log.warning(
            "--train-empty-think: the chat template of %s writes no empty think block (it is no thinking "
            "template), so the option changes nothing",
            renderer.folder,
        )

    def render(conversation: Any, index: int) -> Rendered:
        messages, tools = conversation
        return renderer.rendered(messages, tools, index=index)

    loss_on = "assistant reasoning, text, tool calls and end-of-turn token"
    if renderer.empty_think is not None:
        loss_on += (
            ", and the empty think block of a reply without reasoning (--train-empty-think)"
            if train_empty_think
            else "; not the empty think block of a reply without reasoning"
        )
    fields = {
        "tokenizer": str(renderer.folder / "tokenizer.json"),
        "tokenizer_sha256": file_sha256(renderer.folder / "tokenizer.json"),
        "chat_format": "chat_template: the tokenizer folder's template through transformers' apply_chat_template",
        "chat_template_sha256": renderer.sha256,
        "loss_on": loss_on,
        "thinking": thinking_fields(renderer.empty_think, train_empty_think),
    }
    return render, fields, eos_id, renderer.backend


def thinking_fields(empty_think: str | None, train_empty_think: bool) -> dict:
    """The manifest's ``thinking``: whether the chat template is a thinking template (it writes a think block
    before each reply), the empty block it writes before a reply without reasoning, and whether that block
    is trained (``--train-empty-think``) or left out of the loss (the default)."""
    return {
        "template": empty_think is not None,
        "empty_think_block": empty_think,
        "empty_think_trained": bool(train_empty_think and empty_think is not None),
    }


def _cutter(tok: Any, long: str) -> TurnCutter | None:
    """The turn cutter ``--long split`` needs (None for the other modes)."""
    if long != "split":
        return None
    try:
        return TurnCutter(lambda text: tok.encode(text, add_special_tokens=False).ids, tok.token_to_id)
    except ValueError as e:
        raise SftRowsError(f"--long split: {e}; use --long truncate or skip") from None


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
class _Packing:
    """How a split's conversations become rows: the same for the training and the validation split."""

    render: Renderer
    eos_id: int
    row_tokens: int
    packing: str
    supervise_eos: bool
    read_window: int
    rows_per_batch: int
    progress: bool
    workers: int
    long_mode: str
    cutter: TurnCutter | None
    context_limit: int
    dedupe: bool = False
    max_dropped_share: float = DEFAULT_MAX_DROPPED_SHARE


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


def reasoning_share(conversations: dict) -> float | None:
    """The share of a split's used conversations whose last reply carries reasoning (None when none was used
    or the counts are not in the manifest)."""
    used = conversations.get("used") or 0
    with_reasoning = conversations.get("with_reasoning")
    return with_reasoning / used if used and with_reasoning is not None else None


def thinking_warning(thinking: dict | None, conversations: dict) -> str | None:
    """What a thinking template trained on mostly replies without reasoning does to the model, with the share
    and the ways out; None when the template is no thinking template or the share is at least
    :data:`MIN_REASONING_SHARE`."""
    share = reasoning_share(conversations)
    if not (thinking or {}).get("template") or share is None or share >= MIN_REASONING_SHARE:
        return None
    used = conversations["used"]
    effect = (
        "the empty think blocks of the others are trained (--train-empty-think), so the model learns to close its "
        "thinking at once: thinking mode is trained away"
        if thinking.get("empty_think_trained")
        else "the empty think blocks of the others are left out of the loss, but their replies are learned with no "
        "thinking before them, so thinking mode gets little training and may weaken"
    )
    without = "serve it with enable_thinking=false (the prompt then ends with the empty think block, as these rows do)"
    if not thinking.get("empty_think_trained"):
        without += " or build with --train-empty-think"
    return (
        f"only {share:.1%} of the {used:,} training conversations ({conversations['with_reasoning']:,}) end on a "
        f"reply with reasoning, and the chat template is a thinking template: {effect}. To keep thinking mode, give "
        f"at least {MIN_REASONING_SHARE:.0%} of the conversations reasoning (reasoning_content); for a model that "
        f"answers without thinking, {without} (docs/sft_data.md, Thinking mode)"
    )


def _refuse_dropped_share(stats: dict, pack: _Packing, what: str) -> None:
    """SftRowsError when rows of whole conversations leave out more of the tokens than
    ``--max-dropped-share`` allows (conversations too long for a row, those skipped unread counted)."""
    lc = stats["long_conversations"]
    share = lc["dropped_share"]
    if pack.packing == "eos_joined" or share <= pack.max_dropped_share:
        return
    unread = lc["skipped_unread"]
    keep = lc["row_tokens_keeping_99_percent"]
    fixes = [] if pack.long_mode != "skip" else ["--long split (pieces at turn boundaries)", "--long truncate"]
    if keep and keep > pack.row_tokens:
        fixes.append(f"--row-tokens {keep} (holds whole the conversations with 99% of the tokens)")
    fixes.append(f"--max-dropped-share {min(1.0, math.ceil(share * 100) / 100):g} to build anyway")
    raise SftRowsError(
        f"{what}: {share:.1%} of the tokens would be left out of the rows: {lc['longer_than_row']} conversation(s) "
        f"longer than a {pack.row_tokens}-token row (--long {pack.long_mode})"
        + (
            f" and {unread['conversations']} more skipped unread for their size (about "
            f"{unread['tokens_estimated']:,} tokens)"
            if unread["conversations"]
            else ""
        )
        + f"; that is over --max-dropped-share {pack.max_dropped_share:g} (default {DEFAULT_MAX_DROPPED_SHARE:g}), "
        f"so nothing was written. Use {', or '.join(fixes)}"
    )


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


def conversation_fingerprint(ids: np.ndarray) -> bytes:
    """A conversation's identity for finding it in both splits: a hash of its rendered tokens."""
    return hashlib.blake2b(np.asarray(ids, dtype="<i4").tobytes(), digest_size=16).digest()


def _text_size(value: Any) -> int:
    """Characters of text in a decoded record (a Parquet row): its strings, nested in lists and
    mappings, summed."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_size(v) for v in value)
    return 0


@dataclass(frozen=True)
class Prepared:
    """A conversation rendered: its tokens and loss mask, the record format it was read as, what it
    holds that is counted (:func:`~bridge_recipes.chat.message_text.turn_notes`), its size in bytes, whether
    its last reply carries reasoning and how many of its trained replies open with an empty think block."""

    ids: np.ndarray
    mask: np.ndarray
    record_format: str
    notes: tuple[str, ...]
    size: int
    reasoning: bool = False
    empty_thinks: int = 0


def _prepare(
    decode: Callable, render: Renderer, row_bound: int | None, index: int, raw: Any
) -> Prepared | MalformedConversation:
    """One conversation read, decoded and rendered (in a worker process
    when there are several), or why it is skipped. ``row_bound``: the row length when a conversation longer
    than a row is skipped (one of more bytes than could fit it is skipped unread); None when it may be
    split or truncated (only a record over :data:`MAX_CONVERSATION_BYTES` is)."""
    try:
        size = len(raw) if isinstance(raw, bytes) else _text_size(raw)
        if row_bound is None and size > MAX_CONVERSATION_BYTES:
            raise MalformedConversation(
                index,
                "conversation_too_large",
                f"conversation of {size:,} bytes, over the {MAX_CONVERSATION_BYTES:,} a build reads of one "
                "conversation; skipped before tokenizing",
                size,
            )
        if row_bound is not None and size > row_bound * MAX_LINE_BYTES_PER_TOKEN:
            raise MalformedConversation(
                index,
                "longer_than_row",
                f"conversation of {size:,} bytes cannot fit a {row_bound}-token row "
                f"(over {MAX_LINE_BYTES_PER_TOKEN} bytes a token); skipped before tokenizing",
                size,
            )
        conversation = decode(raw, index)
        try:
            done = render(conversation, index)
            fmt = getattr(conversation, "record_format", "")
            notes = tuple(turn_notes(conversation[0])) + getattr(conversation, "notes", ())
            return Prepared(done.ids, done.mask, fmt, notes, size, done.reasoning, done.empty_thinks)
        except MalformedConversation:
            raise
        except (TypeError, ValueError, UnicodeError, RecursionError) as e:
            # one conversation the tokenizer or template cannot take: counted, never fatal
            raise MalformedConversation(index, "render_failed", f"{type(e).__name__}: {e}") from None
    except MalformedConversation as e:
        return e


_WORK: Callable | None = None  # the forked workers' per-conversation function (inherited, never pickled)


def _work_chunk(chunk: list[tuple[int, Any]]) -> list[Any]:
    assert _WORK is not None
    return [_work_one(_WORK, index, raw) for index, raw in chunk]


def _work_one(work: Callable, index: int, raw: Any) -> Any:
    try:
        return work(index, raw)
    except Exception as e:  # handed back as text: an exception that cannot be pickled would stall the pool
        raise WorkerError(index, f"{type(e).__name__}: {e}") from None


class WorkerError(RuntimeError):
    """A conversation the rendering failed on in a way no skip reason covers (a bug, not bad data)."""

    def __init__(self, index: int, detail: str):
        super().__init__(f"source row {index}: {detail}")
        self.index, self.detail = index, detail

    def __reduce__(self):
        return type(self), (self.index, self.detail)


def default_workers() -> int:
    """The cores this process may run on."""
    return worker_count(None)[0]


def prepared(
    records: Iterator[tuple[int, Any]], work: Callable, workers: int, chunk: int | None = None
) -> Iterator[tuple[int, Any]]:
    """``(index, work(index, raw))`` for each record, in the records' order, ``workers`` processes
    rendering ahead of the packer: chunks of ``chunk`` (:data:`WORK_CHUNK`) conversations, at most
    :data:`CHUNKS_AHEAD` per worker in flight (memory bounded whatever the input's size). The workers
    are forked: they inherit the tokenizer and template instead of loading them again. One worker, or a
    platform without fork, renders in this process. A Ctrl-C stops the workers quietly
    (:func:`~bridge_recipes.utils.outputs.worker_processes`)."""
    global _WORK
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for index, raw in records:
            yield index, _work_one(work, index, raw)
        return
    _WORK = work
    pending: deque = deque()
    try:
        with worker_processes():
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_start)
            try:

                def drain(limit: int) -> Iterator[tuple[int, Any]]:
                    while len(pending) > limit:
                        indices, result = pending.popleft()
                        yield from zip(indices, result.get())

                while part := list(islice(records, chunk or WORK_CHUNK)):
                    pending.append(([index for index, _ in part], pool.apply_async(_work_chunk, (part,))))
                    yield from drain(CHUNKS_AHEAD * workers)
                yield from drain(0)
                # at the end of the work the workers take their end marker and exit: no signal is sent, since a
                # SIGTERM reaching a worker just forked can be lost, and Pool.terminate() then waits on it forever
                pool.close()
                pool.join()
            finally:
                # an error, an early stop or a Ctrl-C: no new work, and the chunks in flight (at most
                # CHUNKS_AHEAD per worker) finish before the workers take their end marker. Terminating would
                # send SIGTERM, which can end a worker while it holds the result queue's lock and leave the
                # pool's threads waiting on that lock forever. After a normal end both calls return at once.
                pool.close()
                pool.join()
    finally:
        _WORK = None


def _worker_start() -> None:
    """A worker process ends on SIGTERM at once: the command's own handler (which turns SIGTERM into a
    cleanup in the main process) has nothing to clean up in a worker."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def _stop_on_worker_error(reader: JsonlSource | ParquetSource) -> Iterator[None]:
    """A rendering failure no skip reason covers stops the build, naming the record (the staging folder
    goes with it, so nothing half-written is left)."""
    try:
        yield
    except WorkerError as e:
        raise SftRowsError(
            f"{getattr(reader, 'path', 'the input')}, {reader.location(e.index)}: {e.detail}; the build stopped and "
            "wrote nothing "
            "(remove or fix that record, and report the error if the record is valid)"
        ) from None


@dataclass
class _Tally:
    """What one split's pass counts as it reads, packs and writes."""

    read: int = 0
    used: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    rows_without_targets: int = 0
    padding: int = 0  # in the rows written or skipped without targets
    segments: int = 0  # conversations and pieces of split ones in the rows written (boundaries rows)
    in_validation: int = 0
    formats: Counter = field(default_factory=Counter)  # record formats of the conversations used
    notes: Counter = field(default_factory=Counter)  # what the used conversations hold that is reported
    hashes: array = field(default_factory=lambda: array("q"))  # of the used conversations (duplicates counted)
    kept: set[int] = field(default_factory=set)  # with --dedupe: those of the conversations used so far
    duplicates: int = 0
    reasoning: int = 0  # used conversations whose last reply carries reasoning
    empty_thinks: int = 0  # trained replies of the used conversations that open with an empty think block

    def skip(self, e: MalformedConversation, where: str) -> None:
        """A skipped conversation: counted by reason, the first :data:`MAX_REPORTED` logged and kept
        (``where``: the record as its reader counts it, from 1)."""
        self.skipped[e.reason] += 1
        if len(self.examples) < MAX_REPORTED:
            self.examples.append(e.at(where))
            log.warning("skipping conversation, %s", e.at(where))

    def repeated(self, fingerprint: bytes, dedupe: bool) -> bool:
        """Whether a used conversation repeats an earlier one of the split (counted); with ``dedupe`` it is
        then skipped. 8 bytes a conversation when duplicates are only counted."""
        key = int.from_bytes(fingerprint[:8], "little", signed=True)
        if dedupe:
            if key in self.kept:
                self.duplicates += 1
                return True
            self.kept.add(key)
        else:
            self.hashes.append(key)
        return False

    def count_duplicates(self) -> int:
        """Used conversations that repeat an earlier one (the same tokens), with or without --dedupe."""
        if self.hashes:
            self.duplicates = len(self.hashes) - len(np.unique(np.frombuffer(self.hashes, dtype=np.int64)))
        return self.duplicates


def _write_rows(rows: Any, writer: RowWriter, tally: _Tally, max_rows: int | None) -> bool:
    """Write the packed ``rows`` (one without a supervised token is counted, not written); True once
    ``max_rows`` are written."""
    for row in rows:
        tally.padding += row.padding
        if not row.mask.any():  # nothing to learn from: counted, not written
            tally.rows_without_targets += 1
            continue
        writer.add(row.ids, row.mask, row.cu)
        if row.cu is not None:
            tally.segments += len(row.cu) - 1 - (1 if row.padding else 0)
        if writer.rows == max_rows:
            return True
    return False


def _pieces(ids: np.ndarray, mask: np.ndarray, index: int, long: LongConversations, row_tokens: int) -> list:
    """A rendered conversation's pieces to pack (the whole of it, or its pieces under ``--long``);
    MalformedConversation when no piece of it is kept."""
    pieces = long.pieces_of(ids, mask)
    if not pieces:
        kept = "" if long.mode == "skip" else f"; --long {long.mode} kept no piece of it"
        raise MalformedConversation(
            index,
            "longer_than_row",
            f"conversation of {len(ids)} tokens is longer than a {row_tokens}-token row{kept}",
        )
    return pieces


def _pack_and_write(
    reader: JsonlSource | ParquetSource,
    order: np.ndarray,
    path: Path,
    max_rows: int | None,
    pack: _Packing,
    *,
    fingerprints: set[bytes] | None = None,
    seen: set[bytes] | None = None,
) -> dict:
    """Conversations in ``order`` -> rendered (by ``pack.workers`` processes) -> the long ones skipped, split
    or truncated (``pack.long_mode``) -> packed -> written, in that order whatever the workers. Returns the
    counts. ``fingerprints`` collects a hash of each used conversation's tokens; the conversations whose hash
    is in ``seen`` (the validation split's) are counted (``conversations_in_validation``), or with
    ``pack.dedupe`` skipped as :data:`IN_VALIDATION`: the validation split stays as the user chose it (a
    held-out file, or the seeded fraction) and its loss measures conversations training never saw."""
    row_tokens, long_mode = pack.row_tokens, pack.long_mode
    packer = packer_for(pack.packing, row_tokens, pack.eos_id, pack.supervise_eos)
    writer = RowWriter(path, row_tokens, pack.rows_per_batch, boundaries=pack.packing == "boundaries")
    tally = _Tally()
    whole = pack.packing != "eos_joined"
    long = LongConversations(long_mode, row_tokens, cutter=pack.cutter, whole=whole, limit=pack.context_limit)
    stopped = False
    try:
        with (
            _stop_on_worker_error(reader),
            tqdm(total=len(order), desc="pack", unit="conv", disable=not pack.progress, smoothing=0.05) as bar,
        ):
            prepare = partial(_prepare, reader.decode, pack.render, row_tokens if long_mode == "skip" else None)
            for index, done in prepared(reader.records(order, pack.read_window), prepare, pack.workers):
                tally.read += 1
                bar.update(1)
                try:
                    if isinstance(done, MalformedConversation):
                        if done.size:
                            long.skipped_unread(done.size)
                        raise done
                    ids, mask = done.ids, done.mask
                    fingerprint = conversation_fingerprint(ids)
                    if pack.dedupe and seen and fingerprint in seen:
                        raise MalformedConversation(
                            index, IN_VALIDATION, "the same conversation as one of the validation split (--dedupe)"
                        )
                    if tally.repeated(fingerprint, pack.dedupe):
                        raise MalformedConversation(
                            index, "duplicate_conversation", "the same conversation as an earlier one (--dedupe)"
                        )
                    long.measured_bytes += done.size
                    pieces = _pieces(ids, mask, index, long, row_tokens)
                except MalformedConversation as e:
                    tally.skip(e, reader.location(index))
                    continue
                tally.used += 1
                tally.formats[done.record_format] += 1
                tally.notes.update(done.notes)
                tally.reasoning += done.reasoning
                tally.empty_thinks += done.empty_thinks
                if fingerprints is not None:
                    fingerprints.add(fingerprint)
                if seen and fingerprint in seen:
                    tally.in_validation += 1
                if stopped := any(_write_rows(packer.add(i, m), writer, tally, max_rows) for i, m in pieces):
                    break
                if tally.read % 256 == 0:
                    bar.set_postfix(rows=writer.rows, refresh=False)
        if not stopped:
            stopped = _write_rows(packer.finish(), writer, tally, max_rows)
    except BaseException:
        writer.abandon()  # the first error is the one to report (a full disk), not the closing's
        raise
    writer.close()
    return _split_stats(reader, writer, packer, tally, long, pack, max_rows)


def _split_stats(
    reader: JsonlSource | ParquetSource,
    writer: RowWriter,
    packer: RowPacker,
    tally: _Tally,
    long: LongConversations,
    pack: _Packing,
    max_rows: int | None,
) -> dict:
    """A split's counts for its manifest (see the module docstring for how they add up)."""
    skipped_total = sum(tally.skipped.values())
    duplicates = tally.count_duplicates()
    if skipped_total > len(tally.examples):
        unreported = skipped_total - len(tally.examples)
        log.warning("%d more conversation(s) skipped; the counts by reason follow", unreported)
    row_tokens, rows_without_targets, padding = pack.row_tokens, tally.rows_without_targets, tally.padding
    written_tokens = writer.rows * row_tokens
    return {
        "rows": writer.rows,
        "padding_tokens": padding,
        # the share of the rows' tokens that is padding: work a step does that trains nothing
        "padding_share": round(padding / ((writer.rows + rows_without_targets) * row_tokens), 6)
        if writer.rows + rows_without_targets
        else 0.0,
        "supervised_tokens": writer.supervised_tokens,
        "supervised_ratio": round(writer.supervised_tokens / written_tokens, 6) if written_tokens else 0.0,
        "stream_tokens": packer.stream_tokens,
        "tail_tokens_dropped": packer.stream_tokens + padding - (writer.rows + rows_without_targets) * row_tokens,
        "rows_skipped_without_targets": rows_without_targets,
        "stopped_at_max_rows": max_rows is not None and writer.rows == max_rows,
        "rows_sha256": writer.rows_sha256,
        "segments": tally.segments if pack.packing == "boundaries" else None,
        "long_conversations": long.summary(),
        "conversations_in_validation": tally.in_validation,
        "conversations": {
            "indexed": len(reader),
            "read": tally.read,
            "used": tally.used,
            "skipped": dict(sorted(tally.skipped.items())),
            "skipped_total": skipped_total,
            "skipped_examples": tally.examples,
            "blank_lines": reader.blank_lines,
            "record_formats": dict(sorted(tally.formats.items())),
            "notes": dict(sorted(tally.notes.items())),
            "duplicates": duplicates,
            "duplicates_removed": pack.dedupe,
            "with_reasoning": tally.reasoning,
            "without_reasoning": tally.used - tally.reasoning,
            "replies_with_empty_think": tally.empty_thinks,
        },
    }
