"""``samples.parquet`` of a VL dataset and what it tells: each sample's length under an image budget.

The build writes a row a sample (its split, key, shard, source row, text tokens with one image
token an image, and each image's height and width) through :class:`SamplesWriter`; the dry run
reads the file back and works out every sample's length in tokens under any ``min_pixels`` /
``max_pixels`` (:func:`sequence_tokens`, :func:`visual_tokens`) without opening the shards.
Below both the build (:mod:`bridge_recipes.vl.vl_dataset`) and the dry run's checks
(:mod:`bridge_recipes.vl.vl_checks`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SAMPLES_PER_BATCH = 65536  # samples.parquet rows per row group
# Megatron-Bridge's Qwen-VL collate passes each image through qwen-vl-utils' fetch_image first
# (its defaults: 14-pixel patches merged 2 x 2, 4 to 16,384 tokens), then the processor resizes
# the result to multiples of patch x merge within [min_pixels, max_pixels].
FETCH_FACTOR = 28
FETCH_MIN_PIXELS = 4 * FETCH_FACTOR**2
FETCH_MAX_PIXELS = 16384 * FETCH_FACTOR**2


# --------------------------------------------------------------------------- image budget


@lru_cache(maxsize=65536)
def image_tokens(height: int, width: int, *, patch: int, merge: int, min_pixels: int, max_pixels: int) -> int:
    """Tokens one ``height`` x ``width`` image takes in a sample: qwen-vl-utils' resize (multiples of
    28), then the processor's (multiples of ``patch`` x ``merge`` within [``min_pixels``,
    ``max_pixels``]), one token a ``merge`` x ``merge`` block of patches."""
    f = FETCH_FACTOR
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > FETCH_MAX_PIXELS:
        beta = math.sqrt(height * width / FETCH_MAX_PIXELS)
        h, w = math.floor(height / beta / f) * f, math.floor(width / beta / f) * f
    elif h * w < FETCH_MIN_PIXELS:
        beta = math.sqrt(FETCH_MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    f = patch * merge
    h2, w2 = round(h / f) * f, round(w / f) * f
    if h2 * w2 > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h2, w2 = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    elif h2 * w2 < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h2, w2 = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    return (h2 // patch) * (w2 // patch) // (merge * merge)


def sequence_tokens(samples: pa.Table, *, patch: int, merge: int, min_pixels: int, max_pixels: int) -> np.ndarray:
    """Each sample's length in tokens under an image budget: its text tokens with each image's one
    token replaced by the tokens :func:`image_tokens` gives it."""
    budget = dict(patch=patch, merge=merge, min_pixels=min_pixels, max_pixels=max_pixels)
    text = samples.column("text_tokens").to_numpy().astype(np.int64)
    heights = samples.column("image_heights").to_pylist()
    widths = samples.column("image_widths").to_pylist()
    extra = [sum(image_tokens(h, w, **budget) - 1 for h, w in zip(hs, ws)) for hs, ws in zip(heights, widths)]
    return text + np.asarray(extra, dtype=np.int64)


def visual_tokens(samples: pa.Table, *, patch: int, merge: int, min_pixels: int, max_pixels: int) -> np.ndarray:
    """Each sample's image tokens under an image budget (the task encoder's ``max_visual_tokens`` counts these)."""
    budget = dict(patch=patch, merge=merge, min_pixels=min_pixels, max_pixels=max_pixels)
    heights = samples.column("image_heights").to_pylist()
    widths = samples.column("image_widths").to_pylist()
    return np.asarray(
        [sum(image_tokens(h, w, **budget) for h, w in zip(hs, ws)) for hs, ws in zip(heights, widths)], dtype=np.int64
    )


# --------------------------------------------------------------------------- samples.parquet


SAMPLES_SCHEMA = pa.schema(
    [
        ("split", pa.string()),
        ("key", pa.string()),
        ("shard", pa.string()),
        ("source_row", pa.int64()),
        ("text_tokens", pa.int32()),
        ("image_heights", pa.list_(pa.int32())),
        ("image_widths", pa.list_(pa.int32())),
    ]
)


class SamplesWriter:
    """``samples.parquet``, written :data:`SAMPLES_PER_BATCH` rows at a time (memory stays bounded)."""

    def __init__(self, path: Path):
        self._writer = pq.ParquetWriter(path, SAMPLES_SCHEMA, compression="zstd")
        self._rows: list[dict] = []

    def add(self, row: dict) -> None:
        self._rows.append(row)
        if len(self._rows) >= SAMPLES_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=SAMPLES_SCHEMA))
            self._rows = []

    def __enter__(self) -> SamplesWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._flush()
        self._writer.close()
