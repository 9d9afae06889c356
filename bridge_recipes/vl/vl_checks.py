"""The dry run's checks of an Energon dataset (``--dataset energon dataset.path=DIR``), each
problem one line naming the file or field and the fix.

Every Energon dataset: Energon's metadata (``.nv-meta/dataset.yaml``, ``split.yaml``,
``index.sqlite`` and the info file), a ChatML sample loader, a ``train`` split, and a ``val``
split when the run validates. A dataset built by scripts/build_vl_dataset.py also: its shards
whole (sizes against the manifest) and its ``samples.parquet`` unchanged (sha256); the processor
the run renders with (``dataset.task_encoder.hf_processor_path``) and the run's tokenizer, where
they are local folders, holding the files the dataset was built with (sha256); the model's vision
token ids and the task encoder's patch geometry those of that processor; and the image budget:
every sample's length under the task encoder's ``min_pixels`` / ``max_pixels``
(:func:`bridge_recipes.vl.vl_samples.sequence_tokens`) within the sequence, with the samples
the task encoder would drop (``max_visual_tokens``, ``max_num_images``) counted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from bridge_recipes.chat.message_text import VL_BUILDER
from bridge_recipes.utils.outputs import file_sha256
from bridge_recipes.vl.vl_dataset import DATASET_YAML, META_DIR, SAMPLE_LOADER, SAMPLES_FILE, read_manifest
from bridge_recipes.vl.vl_processor import IMAGE_PROCESSOR_FILES, VlDatasetError, processor_files
from bridge_recipes.vl.vl_samples import sequence_tokens, visual_tokens

META_FILES = (DATASET_YAML, "split.yaml", "index.sqlite")
INFO_FILES = (".info.json", ".info.yaml")  # Energon 7.4 writes the first, earlier 7.x the second
VISION_TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
BUILD = VL_BUILDER  # how a dataset is (re)built, for the messages


def dry_run_problems(cfg: Any) -> tuple[list[str], list[str]]:
    """Errors and warnings of ``--dataset energon`` for a built config."""
    d = cfg.dataset
    if not getattr(d, "path", None):
        return ["--dataset energon needs the dataset folder: add dataset.path=/path/to/energon/dataset"], []
    root = Path(d.path).expanduser()
    if not root.is_dir():
        return [f"dataset.path={d.path} is not a folder; point it at a prepared Energon dataset ({BUILD} --out)"], []
    errors = _energon_problems(cfg, root)
    if errors:
        return errors, []
    try:
        manifest = read_manifest(root)
    except VlDatasetError as e:
        return [str(e)], []
    if manifest is None:
        return [], [
            f"{root} has no manifest.json (a dataset {BUILD.split()[0]} did not build): its processor, image sizes "
            "and sample lengths are not checked"
        ]
    errors = _file_problems(root, manifest)
    if errors:
        return errors, []
    errors, warnings = _processor_problems(cfg, root, manifest)
    more_errors, more_warnings = _budget_problems(cfg, root, manifest)
    return errors + more_errors, warnings + more_warnings


def _energon_problems(cfg: Any, root: Path) -> list[str]:
    import yaml

    meta = root / META_DIR
    missing = [meta / f for f in META_FILES if not (meta / f).is_file()]
    if not any((meta / f).is_file() for f in INFO_FILES):
        missing.append(meta / INFO_FILES[0])
    if missing:
        return [
            f"{missing[0]} is missing: dataset.path={root} is not a prepared Energon dataset; build it with {BUILD} "
            "(or run energon prepare on its shards)"
        ]
    try:
        loader = yaml.safe_load((meta / DATASET_YAML).read_text()) or {}
        splits = (yaml.safe_load((meta / "split.yaml").read_text()) or {}).get("split_parts") or {}
    except (OSError, yaml.YAMLError, AttributeError) as e:
        return [f"{meta} holds a YAML file that cannot be read ({type(e).__name__}); rebuild the dataset with {BUILD}"]
    errors = []
    if not isinstance(loader, dict) or loader.get("__class__") != SAMPLE_LOADER["__class__"]:
        shown = loader.get("__class__") if isinstance(loader, dict) else loader
        errors.append(
            f"{meta / DATASET_YAML}: __class__ is {shown!r}; the Qwen-VL task encoder reads Megatron-Bridge's "
            f"ChatMLWebdataset samples (__module__: {SAMPLE_LOADER['__module__']}); rebuild with {BUILD}"
        )
    elif "conversation" not in (loader.get("field_map") or {}):
        errors.append(f"{meta / DATASET_YAML}: field_map names no conversation field; rebuild with {BUILD}")
    if not splits.get("train"):
        errors.append(f"{meta / 'split.yaml'} has no train split; rebuild the dataset with {BUILD}")
    if _validates(cfg) and not splits.get("val"):
        errors.append(
            f"{meta / 'split.yaml'} has no val split and the run validates (validation.eval_iters="
            f"{cfg.validation.eval_iters}): rebuild with --val-fraction, or set dataset.do_validation=false"
        )
    return errors


def _validates(cfg: Any) -> bool:
    v = cfg.validation
    return bool(getattr(cfg.dataset, "do_validation", True) and v.eval_iters and v.eval_interval)


def _file_problems(root: Path, manifest: dict) -> list[str]:
    errors = []
    for split, info in manifest.get("splits", {}).items():
        for shard in info.get("shards", []):
            path = root / shard["file"]
            if not path.is_file():
                errors.append(f"{path} is missing ({split} shard in manifest.json); rebuild the dataset with {BUILD}")
            elif path.stat().st_size != shard["bytes"]:
                errors.append(
                    f"{path} is {path.stat().st_size} bytes, manifest.json says {shard['bytes']}: truncated or "
                    f"replaced; rebuild the dataset with {BUILD}"
                )
    samples = root / SAMPLES_FILE
    if not samples.is_file() or file_sha256(samples) != manifest.get("samples_sha256"):
        errors.append(f"{samples} is missing or differs from manifest.json's samples_sha256; rebuild with {BUILD}")
    return errors


def local_folder(path: str | None) -> Path | None:
    """``path`` as a local folder, or None (a Hub id, which the dry run does not resolve)."""
    if not path:
        return None
    folder = Path(path).expanduser()
    return folder if folder.is_dir() else None


def _checkpoint_without_processor(cfg: Any, built: dict) -> str | None:
    """The warning for a ``--hf-checkpoint`` folder (``checkpoint.hf_source_path``) that holds no image
    processor, so the run keeps the recipe's processor (``built``: the manifest's processor); None for
    another run."""
    checkpoint = local_folder(getattr(cfg.checkpoint, "hf_source_path", None))
    if checkpoint is None or any((checkpoint / name).is_file() for name in IMAGE_PROCESSOR_FILES):
        return None
    field = "dataset.task_encoder.hf_processor_path"
    wanted = ", ".join(name for name in IMAGE_PROCESSOR_FILES if name in built["files"]) or "the release's file"
    source = Path(built["path"])
    fix = (
        f"put back {wanted} (the dataset was built with it) into {checkpoint}"
        if source.exists() and source.resolve() == checkpoint.resolve()
        else f"copy {wanted} from {source} into {checkpoint}, or set {field}={source}"
    )
    return (
        f"--hf-checkpoint {checkpoint} holds no image processor ({' or '.join(IMAGE_PROCESSOR_FILES)}), so the "
        f"images go through {field}={cfg.dataset.task_encoder.hf_processor_path} instead, which is not compared "
        f"with the processor the dataset was built with ({source}): {fix}"
    )


def _processor_problems(cfg: Any, root: Path, manifest: dict) -> tuple[list[str], list[str]]:
    errors, warnings = [], []
    built = manifest["processor"]
    enc, m = cfg.dataset.task_encoder, cfg.model
    proc_path = getattr(enc, "hf_processor_path", None)
    folder = local_folder(proc_path)
    field = "dataset.task_encoder.hf_processor_path"
    if folder is None and (missing := _checkpoint_without_processor(cfg, built)):
        warnings.append(missing)
    elif folder is None:
        warnings.append(
            f"{field}={proc_path} is not a local folder, so it is not compared with the processor {root} was built "
            f"with ({built['path']}); pass --hf-checkpoint with the checkpoint folder, or set {field}={built['path']}"
        )
    else:
        now = processor_files(folder)
        differ = [n for n in sorted(set(now) | set(built["files"])) if now.get(n) != built["files"].get(n)]
        if differ:
            errors.append(
                f"{field}={proc_path}: {', '.join(differ)} differ(s) from the processor {root} was built with "
                f"({built['path']}; manifest.json processor.files): rebuild the dataset with --processor {proc_path}, "
                f"or set {field}={built['path']}"
            )
    tok = getattr(cfg, "tokenizer", None)
    tok_model = getattr(tok, "tokenizer_model", None)
    tok_folder = local_folder(tok_model)
    if getattr(tok, "tokenizer_type", None) == "HuggingFaceTokenizer" and tok_folder is not None:
        tok_file = tok_folder / "tokenizer.json"
        want = built["files"].get("tokenizer.json")
        if want and (not tok_file.is_file() or file_sha256(tok_file) != want):
            errors.append(
                f"tokenizer.tokenizer_model={tok_model}: its tokenizer.json is not the one {root} was built "
                f"with ({built['path']}/tokenizer.json): train with the checkpoint the dataset was built for, or "
                f"rebuild with --processor {tok_model}"
            )
    for name in VISION_TOKEN_FIELDS:
        want, have = built.get(name), getattr(m, name, None)
        if want is not None and have is not None and have != want:
            errors.append(
                f"model.{name}={have}, but {root} was built with a processor ({built['path']}) whose token for it is "
                f"id {want}: the model would not find the images; set model.{name}={want}"
            )
    if m.vocab_size and built.get("vocab_size") and built["vocab_size"] > m.vocab_size:
        errors.append(
            f"the processor's tokenizer has {built['vocab_size']} tokens, more than model.vocab_size={m.vocab_size}: "
            "token ids would fall outside the embedding; use the checkpoint's own processor"
        )
    v = m.vision_config
    for name, key, model_value in (
        ("patch_size", "patch_size", v.patch_size),
        ("spatial_merge_size", "merge_size", v.spatial_merge_size),
        ("temporal_patch_size", "temporal_patch_size", v.temporal_patch_size),
    ):
        want = built[key]
        if getattr(enc, name) != want:
            errors.append(
                f"dataset.task_encoder.{name}={getattr(enc, name)}, but {root} was built with a processor "
                f"({built['path']}) whose {key} is {want}; set dataset.task_encoder.{name}={want}"
            )
        if model_value != want:
            errors.append(
                f"model.vision_config.{name}={model_value}, but {root} was built with a processor ({built['path']}) "
                f"whose {key} is {want}: the vision tower would not take its patches; build the dataset with this "
                "checkpoint's processor"
            )
    return errors, warnings


def _budget_problems(cfg: Any, root: Path, manifest: dict) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    enc, m, train = cfg.dataset.task_encoder, cfg.model, cfg.train
    errors, warnings = [], []
    if enc.min_pixels > enc.max_pixels:
        return [
            f"dataset.task_encoder.min_pixels={enc.min_pixels} is above dataset.task_encoder.max_pixels="
            f"{enc.max_pixels}; set min_pixels at most max_pixels"
        ], []
    table = pq.read_table(root / SAMPLES_FILE)
    budget = dict(patch=enc.patch_size, merge=enc.spatial_merge_size, min_pixels=enc.min_pixels)
    lengths = sequence_tokens(table, max_pixels=enc.max_pixels, **budget)
    over = np.flatnonzero(lengths > m.seq_length)
    if len(over):
        longest = int(lengths.max())
        fit = _fitting_max_pixels(table.take(over), m.seq_length, enc.max_pixels, **budget)
        fix = f"dataset.task_encoder.max_pixels={fit}" if fit else "dataset.task_encoder.min_pixels lower"
        errors.append(
            f"{len(over)} of {len(lengths)} samples in {root} ({SAMPLES_FILE}) are longer than the "
            f"{m.seq_length}-token sequence with dataset.task_encoder.max_pixels={enc.max_pixels} (the longest "
            f"{longest} tokens): raise -sl to {math.ceil(longest / 128) * 128} or set {fix}"
        )
    splits = np.asarray(table.column("split").to_pylist())
    dropped: np.ndarray = np.zeros(len(lengths), dtype=bool)
    if enc.max_visual_tokens:
        heavy = visual_tokens(table, max_pixels=enc.max_pixels, **budget) > enc.max_visual_tokens
        dropped |= heavy
        if heavy.any():
            warnings.append(
                f"{int(heavy.sum())} sample(s) in {root} hold more than dataset.task_encoder.max_visual_tokens="
                f"{enc.max_visual_tokens} image tokens and are skipped in training; raise it or lower max_pixels"
            )
    if enc.max_num_images:
        many = np.asarray([len(h) for h in table.column("image_heights").to_pylist()]) > enc.max_num_images
        dropped |= many
        if many.any():
            warnings.append(
                f"{int(many.sum())} sample(s) in {root} hold more than dataset.task_encoder.max_num_images="
                f"{enc.max_num_images} images and are skipped in training; raise it to keep them"
            )
    kept = int(((splits == "train") & ~dropped).sum())
    if kept == 0:
        errors.append(
            f"every training sample in {root} would be skipped by the task encoder (max_visual_tokens, max_num_images)"
        )
    elif (samples := train.train_iters * train.global_batch_size) > kept:
        warnings.append(
            f"the run reads {samples} training samples from {kept} in {root}: {samples / kept:.2f} epochs; "
            "build from more conversations or lower train.train_iters x train.global_batch_size"
        )
    return errors, warnings


def _fitting_max_pixels(
    over: Any, seq_length: int, max_pixels: int, *, patch: int, merge: int, min_pixels: int
) -> int | None:
    """The largest ``max_pixels`` (a multiple of one merged patch's pixels, not below ``min_pixels``)
    under which every sample of ``over`` fits ``seq_length``; None when none does. A smaller budget
    never lengthens a sample, so only the samples over the sequence now need testing."""
    unit = (patch * merge) ** 2
    lo, hi = max(1, math.ceil(min_pixels / unit)), max_pixels // unit

    def fits(k: int) -> bool:
        lengths = sequence_tokens(over, patch=patch, merge=merge, min_pixels=min_pixels, max_pixels=k * unit)
        return bool((lengths <= seq_length).all())

    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo * unit
