"""An Energon dataset of image conversations for the VL recipes (``--dataset energon dataset.path=DIR``).

``build_vl_dataset`` reads a JSONL file of image conversations (the forms of
:mod:`bridge_recipes.vl.vl_conversations`) and writes what Megatron-Bridge's Qwen-VL task
encoder reads:

- ``train-NNNNNN.tar`` / ``val-NNNNNN.tar``: WebDataset shards, one sample a conversation: its
  turns as JSON (``KEY.json``, image parts without payload) and its images' own file bytes as a
  pickled list (``KEY.jpgs``), the layout of Megatron-Bridge's ``ChatMLWebdataset``;
- ``.nv-meta/``: Energon's index, split and info files from Megatron-Bridge's
  ``prepare_webdataset``, and the ``dataset.yaml`` that names the sample loader;
- ``samples.parquet``: per sample, its text tokens (one image token an image, as the chat
  template writes it) and each image's height and width, so that the dry run works out every
  sample's length under any image budget (:func:`bridge_recipes.vl.vl_samples.sequence_tokens`)
  without reading the shards;
- ``manifest.json``: counts, conversations skipped by reason, the processor's files (sha256) and
  fields, and each shard's size and sha256.

The conversations are permuted with ``numpy.random.default_rng(seed)`` as the SFT rows are; the
first ``ceil(val_fraction x n)`` form the validation split. Each conversation is rendered with
the processor's own chat template and tokenizer: a conversation the template cannot render, or
whose text would pass for vision tokens, is skipped and counted like a missing, unreadable or
oversized image. Everything is written in a staging folder beside ``out`` and renamed into place
when complete (:mod:`bridge_recipes.data.row_writer`).

This module holds the folder's layout, the shard writer and the build; the processor each
conversation is rendered with and the dataset is pinned to is loaded by
:mod:`bridge_recipes.vl.vl_processor` (with :class:`VlDatasetError`), and ``samples.parquet``'s
schema, its writer and the image budget are in :mod:`bridge_recipes.vl.vl_samples`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import pickle
import re
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from bridge_recipes.chat.conversations import JsonlSource, MalformedConversation, json_record
from bridge_recipes.data.integrity import MANIFEST_FILE
from bridge_recipes.data.render_workers import WorkerError, prepared  # the SFT rows' worker processes
from bridge_recipes.data.row_writer import output_folder, staged_build
from bridge_recipes.data.sft_rows import DEFAULT_SEED, PERMUTATION  # the SFT rows' order and seed
from bridge_recipes.utils.outputs import file_sha256, overlap_problem, worker_count, worker_processes
from bridge_recipes.vl.vl_conversations import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    Image,
    load_image,
    parse_record,
    relative_base,
)
from bridge_recipes.vl.vl_processor import Processor, VlDatasetError, load_processor
from bridge_recipes.vl.vl_samples import SamplesWriter, sequence_tokens

log = logging.getLogger(__name__)

BUILDER_VERSION = "1"
# The builder id datasets record (a name, kept when the module moves: built datasets stay readable).
BUILDER_NAME = "bridge_recipes.data.vl_dataset"
BUILDER = f"{BUILDER_NAME}/{BUILDER_VERSION}"
SPLITS = ("train", "val")  # the split names Megatron-Bridge's Energon data module asks for
SAMPLES_FILE = "samples.parquet"
META_DIR = ".nv-meta"  # Energon's metadata folder
DATASET_YAML = "dataset.yaml"
# Megatron-Bridge's ChatML sample loader: the turns from KEY.json, the images from KEY.jpgs (a
# pickled list of image file bytes, decoded by its video handler's ``jpgs`` branch).
SAMPLE_LOADER = {
    "__module__": "megatron.bridge.data.energon.task_encoder_utils",
    "__class__": "ChatMLWebdataset",
    "field_map": {"imgs": "jpgs", "conversation": "json"},
    "subflavors": {},
}
SHARD_NAME = "{split}-{number:06d}.tar"
_SHARD = re.compile(r"^(train|val)-\d{6}\.tar(\.idx)?$")
DEFAULT_SAMPLES_PER_SHARD = 1000
SHARD_BYTES = 2**30  # a shard is closed once it holds this much
MAX_REPORTED = 20  # skipped conversations logged one by one (and kept in the manifest)
# Conversations a worker prepares per task: images travel back to the writer with them, so a task
# is smaller than the SFT rows' (what is in flight: this x CHUNKS_AHEAD x workers conversations).
WORK_CHUNK = 8


def is_dataset_entry(name: str) -> bool:
    """Whether ``name`` in an output folder is something a build writes."""
    return name in (MANIFEST_FILE, SAMPLES_FILE, META_DIR) or bool(_SHARD.match(name))


# --------------------------------------------------------------------------- shards


class ShardWriter:
    """Samples into ``{split}-NNNNNN.tar`` shards, reproducibly (fixed member metadata, so a build
    of the same input gives the same bytes); a shard is closed at ``samples_per_shard`` samples or
    :data:`SHARD_BYTES`."""

    def __init__(self, folder: Path, split: str, samples_per_shard: int):
        self.folder, self.split, self.samples_per_shard = folder, split, samples_per_shard
        self.shards: list[dict] = []
        self._tar: tarfile.TarFile | None = None

    def add(self, key: str, conversation: list[dict], images: list[bytes]) -> str:
        tar = self._tar
        if tar is None or self.shards[-1]["samples"] >= self.samples_per_shard or tar.offset >= SHARD_BYTES:
            self._close_current()
            name = SHARD_NAME.format(split=self.split, number=len(self.shards))
            tar = self._tar = tarfile.open(self.folder / name, "w", format=tarfile.USTAR_FORMAT)
            self.shards.append({"file": name, "samples": 0})
        self._member(tar, f"{key}.json", json.dumps(conversation, ensure_ascii=False).encode())
        self._member(tar, f"{key}.jpgs", pickle.dumps(images, protocol=4))
        self.shards[-1]["samples"] += 1
        return self.shards[-1]["file"]

    @staticmethod
    def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o444
        tar.addfile(info, io.BytesIO(data))

    def _close_current(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
            shard = self.shards[-1]
            path = self.folder / shard["file"]
            shard.update(bytes=path.stat().st_size, sha256=file_sha256(path))

    def close(self) -> list[dict]:
        self._close_current()
        return self.shards


# --------------------------------------------------------------------------- build


def build_vl_dataset(
    source: str | os.PathLike,
    processor: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    val_fraction: float = 0.0,
    seed: int = DEFAULT_SEED,
    samples_per_shard: int = DEFAULT_SAMPLES_PER_SHARD,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    overwrite: bool = False,
    progress: bool = True,
    workers: int = 1,
) -> dict:
    """Build the Energon dataset of ``source`` (a ``.jsonl`` file) rendered with the processor of
    the checkpoint folder ``processor`` into ``out_dir``; returns the manifest. ``workers``
    processes read the images and render the conversations; the dataset's bytes are the same
    for any number. Raises VlDatasetError on bad input; a conversation that cannot be used is
    skipped and counted."""
    _check_settings(val_fraction, seed, samples_per_shard, max_image_bytes, max_image_pixels, workers)
    workers, note = worker_count(workers)
    if note:
        log.warning("%s", note)
    src = _input_file(source)
    out = output_folder(out_dir, error=VlDatasetError)
    if problem := overlap_problem(out, option="--out", inputs=[("--input", src), ("--processor", processor)]):
        raise VlDatasetError(problem)
    proc = load_processor(processor)
    described = f"its shards, {META_DIR}/, {SAMPLES_FILE} and {MANIFEST_FILE}"
    with staged_build(
        out, overwrite, log=log, ours=is_dataset_entry, described=described, error=VlDatasetError
    ) as build:
        stage = build.stage
        reader = JsonlSource(
            src, progress=progress, chat_format=False
        )  # image conversations: vl_conversations reads them
        order = np.random.default_rng(seed).permutation(len(reader))
        n_val = math.ceil(val_fraction * len(order)) if val_fraction else 0
        settings: dict[str, Any] = dict(
            stage=stage,
            proc=proc,
            base=relative_base(src),
            limits=dict(max_bytes=max_image_bytes, max_pixels=max_image_pixels),
            samples_per_shard=samples_per_shard,
            progress=progress,
            workers=workers,
        )
        splits, counts = {}, {}
        with SamplesWriter(stage / SAMPLES_FILE) as samples:
            for split, part in (("val", order[:n_val]), ("train", order[n_val:])):
                if len(part):
                    splits[split], counts[split] = _write_split(reader, part, split, samples, **settings)
        _refuse_empty(splits, counts, n_val, src, val_fraction)
        _prepare_energon(stage, [s for s in SPLITS if splits.get(s, {}).get("samples")])
        _add_sequence_lengths(splits, pq.read_table(stage / SAMPLES_FILE), proc)
        manifest = {
            "builder": BUILDER,
            "builder_version": BUILDER_VERSION,
            "format": "energon-webdataset",
            "sample_loader": SAMPLE_LOADER,
            "source": str(src),
            "source_sha256": reader.sha256,
            "images_relative_to": str(settings["base"]),
            "seed": seed,
            "val_fraction": val_fraction,
            "permutation": PERMUTATION,
            "processor": {"path": str(proc.folder), "files": proc.files, **proc.fields},
            "image_limits": {"max_image_bytes": max_image_bytes, "max_image_pixels": max_image_pixels},
            "splits": splits,
            "conversations": _merge_counts(counts, len(reader), reader.blank_lines),
            "samples_file": SAMPLES_FILE,
            "samples_sha256": file_sha256(stage / SAMPLES_FILE),
            "versions": _versions(),
        }
        (stage / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        build.publish()
        return manifest


def _check_settings(
    val_fraction: float, seed: int, samples_per_shard: int, max_image_bytes: int, max_image_pixels: int, workers: int
) -> None:
    """The build's numbers within their ranges, each refused naming its flag."""
    if not 0.0 <= val_fraction < 1.0:
        raise VlDatasetError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if not 0 <= seed < 2**32:
        raise VlDatasetError(f"--seed must be in [0, 2**32), got {seed}")
    for flag, value in (
        ("--samples-per-shard", samples_per_shard),
        ("--max-image-bytes", max_image_bytes),
        ("--max-image-pixels", max_image_pixels),
    ):
        if value < 1:
            raise VlDatasetError(f"{flag} must be at least 1, got {value}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise VlDatasetError(f"--workers {workers}: at least 1 (the dataset is the same whatever the number)")


def _input_file(source: str | os.PathLike) -> Path:
    """``--input``: an existing ``.jsonl`` file."""
    src = Path(source).expanduser()
    if not src.is_file():
        raise VlDatasetError(f"--input {source}: no such file; pass the conversations' .jsonl file")
    if src.suffix.lower() != ".jsonl":
        raise VlDatasetError(f"--input {source}: {src.suffix or 'no suffix'} is not .jsonl; one JSON record a line")
    return src


def _add_sequence_lengths(splits: dict[str, dict], table: pa.Table, proc: Processor) -> None:
    """Each split's longest and mean sample, in tokens at the processor's own pixel bounds."""
    budget = dict(
        patch=proc.fields["patch_size"],
        merge=proc.fields["merge_size"],
        min_pixels=proc.fields["min_pixels"],
        max_pixels=proc.fields["max_pixels"],
    )
    lengths = sequence_tokens(table, **budget)
    for split, info in splits.items():
        mine = lengths[np.asarray(table.column("split").to_pylist()) == split]
        info["sequence_tokens_at_processor_pixels"] = {
            "max": int(mine.max()),
            "mean": round(float(mine.mean()), 1),
        }


def _prepare_conversation(
    proc: Processor, base: Path, limits: dict, index: int, line: bytes
) -> tuple[list[dict], list[Image], int] | MalformedConversation:
    """One conversation read, its images loaded and checked, and rendered (in a worker process when
    there are several): its turns, images and text tokens, or why it is skipped."""
    try:
        conversation = parse_record(json_record(line, index), index, base)
        loaded = [load_image(ref, index, **limits) for ref in conversation.images]
        return conversation.messages, loaded, proc.render(conversation, index)
    except MalformedConversation as e:
        return e


@contextlib.contextmanager
def _stop_on_worker_error(reader: JsonlSource) -> Iterator[None]:
    """A failure no skip reason covers stops the build, naming the record; nothing is written."""
    try:
        yield
    except WorkerError as e:
        raise VlDatasetError(
            f"--input {reader.path}, {reader.location(e.index)}: {e.detail}; the build stopped and wrote nothing "
            "(remove or fix that record, and report the error if the record is valid)"
        ) from None


def _write_split(
    reader: JsonlSource,
    order: np.ndarray,
    split: str,
    samples: SamplesWriter,
    *,
    stage: Path,
    proc: Processor,
    base: Path,
    limits: dict,
    samples_per_shard: int,
    progress: bool,
    workers: int = 1,
) -> tuple[dict, dict]:
    """One split's conversations, in ``order``, into its shards (each used one's row added to
    ``samples``); returns the split's summary and its conversation counts."""
    writer = ShardWriter(stage, split, samples_per_shard)
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    read = images = text_only = 0
    pixels_max = 0
    try:
        with (
            _stop_on_worker_error(reader),
            tqdm(total=len(order), desc=split, unit="conv", disable=not progress, smoothing=0.05) as bar,
        ):
            work = partial(_prepare_conversation, proc, base, limits)
            for index, done in prepared(reader.records(order), work, workers, chunk=WORK_CHUNK):
                read += 1
                bar.update(1)
                if isinstance(done, MalformedConversation):
                    skipped[done.reason] += 1
                    if len(examples) < MAX_REPORTED:  # named by its line in the file, from 1
                        examples.append(done.at(reader.location(index)))
                        log.warning("skipping conversation, %s", examples[-1])
                    bar.set_postfix(skipped=sum(skipped.values()), refresh=False)
                    continue
                messages, loaded, tokens = done
                key = f"{index:09d}"
                shard = writer.add(key, messages, [im.data for im in loaded])
                images += len(loaded)
                text_only += not loaded
                pixels_max = max([pixels_max, *(im.width * im.height for im in loaded)])
                samples.add(
                    {
                        "split": split,
                        "key": key,
                        "shard": shard,
                        "source_row": index,
                        "text_tokens": tokens,
                        "image_heights": [im.height for im in loaded],
                        "image_widths": [im.width for im in loaded],
                    }
                )
    finally:
        shards = writer.close()
    used = sum(s["samples"] for s in shards)
    summary = {"samples": used, "images": images, "text_only": text_only, "image_pixels_max": pixels_max}
    summary["shards"] = shards
    counts = {"read": read, "used": used, "skipped": skipped, "examples": examples, "text_only": text_only}
    return summary, counts


def _refuse_empty(splits: dict, counts: dict, n_val: int, src: Path, val_fraction: float) -> None:
    def why(split: str) -> str:
        c = counts.get(split, {"read": 0, "used": 0, "skipped": {}})
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(c["skipped"].items()))
        return f"{c['read']} conversation(s) read, {c['used']} used" + (f", skipped: {skipped}" if skipped else "")

    if not splits.get("train", {}).get("samples"):
        raise VlDatasetError(f"no training samples from {src}: {why('train')}; fix the skipped conversations")
    if n_val and not splits.get("val", {}).get("samples"):
        raise VlDatasetError(
            f"the validation split gave no samples: {why('val')}; raise --val-fraction (now {val_fraction})"
        )


def _merge_counts(counts: dict, indexed: int, blank_lines: int) -> dict:
    skipped: Counter[str] = sum((c["skipped"] for c in counts.values()), Counter())
    return {
        "indexed": indexed,
        "read": sum(c["read"] for c in counts.values()),
        "used": sum(c["used"] for c in counts.values()),
        "text_only": sum(c["text_only"] for c in counts.values()),
        "skipped": dict(sorted(skipped.items())),
        "skipped_total": sum(skipped.values()),
        "skipped_examples": [e for c in counts.values() for e in c["examples"]][:MAX_REPORTED],
        "blank_lines": blank_lines,
    }


def _prepare_energon(folder: Path, splits: list[str]) -> None:
    """Energon's index, split and info files (Megatron-Bridge's ``prepare_webdataset``) and the
    sample loader's ``dataset.yaml``. Energon prints as it indexes; that goes to stderr, so the
    command's own output stays its summary."""
    import yaml
    from megatron.bridge.data.energon import prepare_webdataset

    # regular expressions without braces: Energon brace-expands a split pattern before compiling it
    patterns = {split: rf"{split}-[0-9]+\.tar$" for split in splits}
    shards = len(list(folder.glob("*.tar")))
    log.info("indexing %d shard(s) with Energon", shards)
    with contextlib.redirect_stdout(sys.stderr), worker_processes():  # a Ctrl-C stops its workers too
        prepare_webdataset(folder, patterns, num_workers=max(1, min(4, shards, os.cpu_count() or 1)))
    (folder / META_DIR / DATASET_YAML).write_text(yaml.safe_dump(SAMPLE_LOADER, sort_keys=False))


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("megatron-bridge", "megatron-energon", "transformers", "pillow"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def read_manifest(folder: str | os.PathLike) -> dict | None:
    """A built dataset's manifest, or None when the folder holds none (an Energon dataset prepared
    elsewhere). Raises VlDatasetError for one that cannot be read."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise VlDatasetError(
            f"{path} cannot be read ({e}); rebuild the dataset with scripts/build_vl_dataset.py"
        ) from None
    if not isinstance(manifest, dict) or not str(manifest.get("builder", "")).startswith(BUILDER_NAME):
        return None
    return manifest
