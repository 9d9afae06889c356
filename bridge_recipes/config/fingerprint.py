"""A recipe's fingerprint: the sha256 of the config file text of what it builds, config and features.

One definition for three readers: the fingerprint test (every recipe's, committed), a benchmark's result
file (``fingerprint``: the recipe's as it stood when the run was measured) and the measured status (a
recipe whose fingerprint is no longer its result's has changed since it was measured).

A recipe has two texts (:func:`recipe_fingerprint`): ``recipe``, as the runner builds it, and for a text
recipe ``rows``, on SFT rows with conversation boundaries, where the rows a recipe declares per micro
batch become one packed sequence. What depends on the machine is written as a placeholder: the rows
folder as :data:`ROWS`, the working folder (where the default save folders lie) as ``.``.

The save interval a run sets from its length and the recipe's measured rate
(:mod:`bridge_recipes.config.save_interval`) is written as the recipe's own: how often a run saves is no
execution policy (it changes nothing a step computes, and a benchmark saves nothing), and an interval
taken from the measured rate would change the fingerprint whenever the recipe is measured again, the
new result no longer matching the recipe it measured. An interval given by a flag, an override or a
config file is written as it is.

Importing this module imports neither torch nor Megatron; computing a fingerprint builds the recipe.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROWS = "/rows-with-boundaries"  # the rows folder as it appears in the fingerprinted text
ROW_TOKENS = 8  # the one row of the folder :func:`boundaries_rows` writes


def config_text(cfg: Any, name: str, rows: str | Path | None = None) -> str:
    """The config file text of ``cfg`` (recipe ``name``) with the machine's paths as placeholders and a save
    interval set from the run's length written as the recipe's own (see the module)."""
    from bridge_recipes.config import files as config_files
    from bridge_recipes.config.save_interval import derived

    ckpt, record = cfg.checkpoint, derived(cfg)
    try:
        if record is not None:
            ckpt.save_interval = record.own
        text = config_files.to_text(cfg, name)
    finally:
        if record is not None:
            ckpt.save_interval = record.interval
    if rows is not None:
        text = text.replace(str(rows), ROWS)
    return text.replace(str(Path.cwd()), ".")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def config_texts(name: str, rows: str | Path) -> dict[str, str]:
    """The texts of recipe ``name``: as built (``recipe``) and, for a text recipe, on the rows with
    boundaries in the folder ``rows`` (``rows``)."""
    from bridge_recipes.config.builder import build
    from bridge_recipes.models.qwen35 import is_vlm

    cfg = build(name)
    texts = {"recipe": config_text(cfg, name, rows)}
    if not is_vlm(cfg):
        on_rows = build(name, dataset="sft-rows", overrides=[f"dataset.path={rows}"])
        texts["rows"] = config_text(on_rows, name, rows)
    return texts


def boundaries_rows(folder: str | Path) -> Path:
    """Write a rows folder of one row with conversation boundaries into ``folder`` (which must not hold
    one): all a build reads of rows is their manifest, whose packing decides how rows are batched."""
    import json

    import numpy as np

    from bridge_recipes.data.integrity import MANIFEST_FILE, ROWS_FILE
    from bridge_recipes.data.row_writer import RowWriter
    from bridge_recipes.data.sft_rows import BUILDER_VERSION
    from bridge_recipes.utils.outputs import file_sha256

    folder = Path(folder)
    folder.mkdir(parents=True)
    writer = RowWriter(folder / ROWS_FILE, ROW_TOKENS, boundaries=True)
    writer.add(np.zeros(ROW_TOKENS, np.int32), np.ones(ROW_TOKENS, np.uint8), np.array([0, ROW_TOKENS], np.int32))
    writer.close()
    manifest = {
        "builder_version": BUILDER_VERSION,
        "row_tokens": ROW_TOKENS,
        "rows": 1,
        "segments": 1,
        "packing": "boundaries",
        "eos_token_id": None,
        "rows_sha256": writer.rows_sha256,
        "parquet_sha256": file_sha256(folder / ROWS_FILE),
        "parquet_bytes": (folder / ROWS_FILE).stat().st_size,
        "validation": None,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def fingerprints(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Each named recipe's fingerprint: the sha256 of each of its texts (:func:`config_texts`)."""
    with tempfile.TemporaryDirectory() as tmp:
        rows = boundaries_rows(Path(tmp) / "rows")
        return {name: {k: digest(t) for k, t in config_texts(name, rows).items()} for name in names}


def recipe_fingerprint(name: str) -> dict[str, str]:
    """Recipe ``name``'s fingerprint as it builds now."""
    return fingerprints([name])[name]
