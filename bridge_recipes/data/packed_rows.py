"""Megatron-Bridge dataset over packed SFT rows (``scripts/build_sft_rows.py`` output).

Each row of ``rows.parquet`` is exactly ``row_tokens`` token ids with a per-token loss mask
(1 = the token is a supervised target: assistant content and its ``<|im_end|>``). A training
sample is one whole row, as in the OpenRecipes runs (one 8,192-token row per micro batch):

- ``tokens`` = the row; ``labels[j]`` = ``row[j + 1]`` (the last position has no target);
- ``loss_mask[j]`` = ``mask[j + 1]``: position j is trained when the token it predicts is
  supervised, so system and user tokens are never targets;
- ``position_ids`` run 0..L-1 over the row (conversations in a row are not re-based).

Rows are read in file order; the builder already permuted the conversations with its seed, and
epochs repeat that order, so runs are reproducible and resumable by sample index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bridge_recipes.data.sft_rows import MANIFEST_FILE, ROWS_FILE

try:  # the Megatron-Bridge base class, when the stack is importable
    from megatron.bridge.data.base import DatasetBuildContext, DatasetProvider
except ImportError:  # pragma: no cover - the package requires Megatron-Bridge
    DatasetProvider, DatasetBuildContext = object, Any


class PackedRowsError(ValueError):
    pass


def read_manifest(folder: str | Path) -> dict:
    folder = Path(folder)
    for name in (ROWS_FILE, MANIFEST_FILE):
        if not (folder / name).is_file():
            raise PackedRowsError(f"{folder} has no {name}: build it with scripts/build_sft_rows.py --out {folder}")
    return json.loads((folder / MANIFEST_FILE).read_text())


class PackedRowsDataset:
    """``num_samples`` samples cycling over the rows in file order."""

    def __init__(self, folder: str | Path, seq_length: int, num_samples: int):
        import pyarrow.parquet as pq

        manifest = read_manifest(folder)
        if manifest["row_tokens"] != seq_length:
            raise PackedRowsError(
                f"rows in {folder} are {manifest['row_tokens']} tokens but the model's seq_length is {seq_length}; "
                f"set -sl {manifest['row_tokens']} or rebuild the rows with --row-tokens {seq_length}"
            )
        table = pq.read_table(Path(folder) / ROWS_FILE, columns=["input_ids", "loss_mask"])
        self.ids = np.asarray(table.column("input_ids").combine_chunks().flatten(), dtype=np.int64).reshape(
            -1, seq_length
        )
        self.mask = np.asarray(table.column("loss_mask").combine_chunks().flatten(), dtype=np.float32).reshape(
            -1, seq_length
        )
        if len(self.ids) == 0:
            raise PackedRowsError(f"{folder} holds no rows")
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        import torch

        row = index % len(self.ids)
        ids, mask = self.ids[row], self.mask[row]
        labels = np.empty_like(ids)
        labels[:-1], labels[-1] = ids[1:], 0
        loss_mask = np.zeros_like(mask)
        loss_mask[:-1] = mask[1:]
        return {
            "tokens": torch.from_numpy(ids.copy()),
            "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask),
            "position_ids": torch.arange(len(ids), dtype=torch.int64),
        }


@dataclass(kw_only=True)
class PackedSFTRowsConfig(DatasetProvider):
    """Dataset config of the SFT recipes on built rows: ``--dataset sft-rows dataset.path=DIR``."""

    path: str | None = None
    seq_length: int
    dataloader_type: str | None = "single"
    skip_getting_attention_mask_from_dataset: bool = True

    def build_datasets(self, context: DatasetBuildContext):
        if not self.path:
            raise PackedRowsError("dataset.path is not set: point it at a folder built by scripts/build_sft_rows.py")
        train = PackedRowsDataset(self.path, self.seq_length, context.train_samples)
        return train, None, None
