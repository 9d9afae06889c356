"""``--dataset KIND``: swap the data side of a recipe without touching its execution policy.

Applied after the recipe is built and before the KEY=VALUE overrides, so ``dataset.*`` keys
address the selected dataset (``--dataset energon dataset.path=/data/wds``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge_recipes.models.qwen35 import is_vlm


def _processor_of(cfg: Any) -> str | None:
    d = cfg.dataset
    return getattr(d, "hf_processor_path", None) or getattr(
        getattr(d, "task_encoder", None), "hf_processor_path", None
    )


def use_mock(cfg: Any) -> None:
    from bridge_recipes.recipes.base import mock_text_dataset, mock_vlm_dataset, null_tokenizer

    seq = cfg.model.seq_length
    cfg.dataset = mock_vlm_dataset(seq, _processor_of(cfg)) if is_vlm(cfg) else mock_text_dataset(seq)
    cfg.tokenizer = null_tokenizer(cfg.model.vocab_size)


def use_energon(cfg: Any) -> None:
    """An Energon (WebDataset) image-text dataset with Megatron-Bridge's Qwen-VL task encoder
    (scripts/build_vl_dataset.py builds one). ``dataset.path`` must then be given; Qwen3.5's
    vision tower uses 16-pixel patches."""
    if not is_vlm(cfg):
        raise ValueError("dataset='energon' needs a VL recipe (qwen35_vl_*): text recipes read token data")
    from megatron.bridge.data.builders.energon import EnergonDatasetConfig, QwenVLEnergonTaskEncoderConfig

    v = cfg.model.vision_config
    cfg.dataset = EnergonDatasetConfig(
        path=None,
        seq_length=cfg.model.seq_length,
        micro_batch_size=cfg.train.micro_batch_size,
        task_encoder=QwenVLEnergonTaskEncoderConfig(
            hf_processor_path=_processor_of(cfg),
            patch_size=v.patch_size,
            spatial_merge_size=v.spatial_merge_size,
            temporal_patch_size=v.temporal_patch_size,
        ),
        num_workers=2,
    )
    # A dataset's val split (scripts/build_vl_dataset.py --val-fraction) is evaluated every
    # validation.eval_interval steps: one global batch unless validation.eval_iters says more.
    cfg.validation.eval_iters = cfg.validation.eval_iters or 1


def use_sft_rows(cfg: Any) -> None:
    """Packed SFT rows from scripts/build_sft_rows.py (``dataset.path=DIR``); text models."""
    if is_vlm(cfg):
        raise ValueError("dataset='sft-rows' is for text recipes; VL recipes take dataset='energon'")
    from bridge_recipes.data.packed_rows import PackedSFTRowsConfig
    from bridge_recipes.recipes.base import null_tokenizer

    cfg.dataset = PackedSFTRowsConfig(
        path=None, seq_length=cfg.model.seq_length, vocab_size=cfg.model.vocab_size, num_workers=1
    )
    cfg.tokenizer = null_tokenizer(cfg.model.vocab_size)  # rows are already token ids
    # Rows with a val/ split are evaluated every validation.eval_interval steps: one global batch
    # of validation rows per evaluation unless validation.eval_iters says more.
    cfg.validation.eval_iters = cfg.validation.eval_iters or 1


def is_mock(cfg: Any) -> bool:
    """Whether the config trains on generated samples (Megatron's mock GPT data, the mock VLM set)."""
    d = cfg.dataset
    if type(d).__name__.startswith("Mock"):
        return True
    # Megatron's GPT dataset config without a blend generates its samples (it sets mock=True)
    blended = hasattr(d, "blend") and hasattr(d, "blend_per_split")
    return blended and d.blend is None and d.blend_per_split is None


def real_data(cfg: Any) -> str:
    """The options that give ``cfg``'s kind of recipe real data: rows for a text recipe, an Energon
    dataset for a VL one (which refuses rows)."""
    if is_vlm(cfg):
        return "--dataset energon dataset.path=DIR (an image-conversation dataset from scripts/build_vl_dataset.py)"
    return "--dataset sft-rows dataset.path=DIR (rows from scripts/build_sft_rows.py)"


def describe(cfg: Any) -> str:
    """The data a run reads, in one line: mock, or the rows folder with the counts its manifest gives."""
    d = cfg.dataset
    if is_mock(cfg):
        return f"mock (generated samples); for real data pass {real_data(cfg)}"
    path = getattr(d, "path", None)
    if type(d).__name__ == "PackedSFTRowsConfig":
        from bridge_recipes.data.integrity import MANIFEST_FILE, RowsIntegrityError, read_manifest

        try:
            m = read_manifest(path) if path else None
        except RowsIntegrityError:  # the dataset checks say what is wrong with it
            m = None
        if m is None:
            return f"sft rows {path} (no readable {MANIFEST_FILE} there)"
        val = m.get("validation") or {}
        return (
            f"sft rows {path}: {m['rows']} rows x {m['row_tokens']} tokens from {m['conversations']['used']} "
            f"conversations ({m.get('record_format') or 'openai'} records)"
            + (f", {val['rows']} validation rows" if val else "")
            + _thinking(m)
        )
    if getattr(d, "blend", None):
        return f"token data {d.blend}"
    return f"{type(d).__name__} {path}" if path else type(d).__name__


def _thinking(manifest: dict) -> str:
    """What rows of a thinking chat template hold of reasoning and train of the empty think block, as a
    clause of :func:`describe`; nothing for other rows."""
    thinking, conversations = manifest.get("thinking") or {}, manifest.get("conversations") or {}
    used, with_reasoning = conversations.get("used"), conversations.get("with_reasoning")
    if not thinking.get("template") or not used or with_reasoning is None:
        return ""
    trained = "trained" if thinking.get("empty_think_trained") else "not trained"
    return f"; thinking template: {with_reasoning / used:.0%} with reasoning, empty think blocks {trained}"


def rows_per_sequence(cfg: Any) -> int:
    """Rows of the data in one sequence of ``model.seq_length``: ``dataset.rows_per_sample`` of packed
    SFT rows (rows joined into one packed sequence), 1 for other data."""
    return getattr(getattr(cfg, "dataset", None), "rows_per_sample", 1) or 1


def rows_per_step(cfg: Any) -> int:
    """Rows of the data per step: the global batch (sequences) x the rows per sequence."""
    return cfg.train.global_batch_size * rows_per_sequence(cfg)


def row_tokens(cfg: Any) -> int:
    """Tokens per row of the data: the sequence length / the rows per sequence."""
    return cfg.model.seq_length // rows_per_sequence(cfg)


KINDS: dict[str, Callable[[Any], None]] = {"mock": use_mock, "energon": use_energon, "sft-rows": use_sft_rows}


def select(cfg: Any, kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"dataset={kind!r} is not known; choose one of {', '.join(KINDS)}")
    KINDS[kind](cfg)
