"""A Hugging Face folder of PyTorch ``.bin`` weights rewritten as safetensors, every tensor kept.

The conversions read safetensors only (their headers say what a shard holds without loading it).
A folder saved with ``safe_serialization=False`` (``pytorch_model-0000N-of-0000M.bin`` and
``pytorch_model.bin.index.json``, or one ``pytorch_model.bin``) becomes the same folder with
``model-0000N-of-0000M.safetensors`` shards and their index: one shard at a time, each tensor
as stored (dtype and values), the MTP layer and anything else transformers' classes would not
load included; the other files (config, tokenizer, chat template, processor) copied unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bridge_recipes.hf.files import BIN_INDEX_FILE, BIN_SINGLE_FILE, INDEX_FILE, SINGLE_FILE, HfCheckpointError


def bin_shards(folder: Path) -> dict[str, str]:
    """Tensor name -> .bin file of ``folder``, from its index, else its one ``pytorch_model.bin``."""
    index = folder / BIN_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (OSError, ValueError, AttributeError) as e:
            raise HfCheckpointError(f"{index} cannot be read as a shard index ({e})") from None
        if (
            not isinstance(weight_map, dict)
            or not weight_map
            or not all(isinstance(v, str) for v in weight_map.values())
        ):
            raise HfCheckpointError(f"{index} has no weight_map naming the .bin shards")
        return weight_map
    if (folder / BIN_SINGLE_FILE).is_file():
        return {}
    raise HfCheckpointError(f"{folder} holds no PyTorch weights: neither {BIN_INDEX_FILE} nor {BIN_SINGLE_FILE}")


def safetensors_name(bin_name: str) -> str:
    """``pytorch_model-00001-of-00006.bin`` -> ``model-00001-of-00006.safetensors``."""
    return bin_name.replace("pytorch_model", "model", 1).removesuffix(".bin") + ".safetensors"


def _load(file: Path) -> dict:
    import torch

    if not file.is_file():
        raise HfCheckpointError(f"shard {file.name} listed in {BIN_INDEX_FILE} is missing from {file.parent}")
    try:
        try:
            state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a file of the legacy (non-zip) format cannot be memory-mapped
            state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file: torch raises many kinds
        raise HfCheckpointError(f"{file} cannot be read as PyTorch weights ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HfCheckpointError(f"{file} holds no mapping of tensor names to tensors")
    return state


def convert(src: Path, out: Path) -> tuple[int, int]:
    """Write ``src``'s .bin weights into ``out`` (a new, empty folder) as safetensors, with the other
    files of ``src``; (shards, tensors) written."""
    from safetensors.torch import save_file

    from bridge_recipes.hf.released import independent

    weight_map = bin_shards(src)
    files = sorted(set(weight_map.values())) if weight_map else [BIN_SINGLE_FILE]
    new_map: dict[str, str] = {}
    total = 0
    for name in files:
        state = _load(src / name)
        target = safetensors_name(name) if weight_map else SINGLE_FILE
        seen: set[int] = set()
        tensors = {k: independent(v, seen) for k, v in state.items()}
        save_file(tensors, str(out / target), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        new_map.update(dict.fromkeys(tensors, target))
        del state, tensors
    if weight_map:
        if lost := sorted(set(weight_map) - set(new_map)):
            raise HfCheckpointError(
                f"{src / BIN_INDEX_FILE} lists {len(lost)} tensor(s) no shard holds (e.g. {lost[0]})"
            )
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(new_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(".bin") and f.name != BIN_INDEX_FILE and not f.name.startswith("."):
            shutil.copyfile(f, out / f.name)
    return len(files), len(new_map)


def convert_folder(src: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> tuple[int, int]:
    """:func:`convert` from the folder ``src`` into ``out``, written whole or not at all (never over
    or into ``src``)."""
    from bridge_recipes.hf.checkpoint import refuse_overlap, staged_output

    source = Path(src).expanduser()
    if not source.is_dir():
        raise HfCheckpointError(f"--hf {src}: no such folder")
    bin_shards(source)  # a folder without .bin weights is named before --out is touched
    refuse_overlap(out, ("--hf", source), overwrite=overwrite)
    with staged_output(out, overwrite) as tmp:
        counts = convert(source, tmp)
    return counts
