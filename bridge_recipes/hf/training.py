"""The runner's side of Hugging Face checkpoints (``run_recipe.py --hf-checkpoint / --export-hf``).

- :func:`check_family` and :func:`take_shape` (before the scale-down and the overrides): the
  folder must be a checkpoint of the recipe's model family, and its ``config.json`` (read by
  Megatron-Bridge's ``AutoBridge``) decides the model's shape (:data:`checkpoint.SHAPE_FIELDS`),
  so a toy or scaled checkpoint needs no ``model.*`` overrides; the recipe keeps its policy.
- :func:`use_checkpoint` (before the KEY=VALUE overrides): makes the folder's
  tokenizer the run's (Megatron-Bridge ``HuggingFaceTokenizer`` with ``tokenizer_model=DIR``,
  so vocabulary, EOS and pad come from it), for a VL checkpoint its processor the VL dataset's
  (``hf_processor_path``), and the HF template of Megatron-Bridge's own
  ``also_save_hf_checkpoint`` (``checkpoint.hf_source_path``).
- :func:`check_model` (after the overrides): the folder's architecture must be the recipe's
  model as configured (``model.*`` overrides included), or its weights cannot load.
- :func:`attach` (at launch): converts once into the cache (:func:`checkpoint.cached_import`;
  rank 0 converts in a child process, the other ranks wait for the folder to appear) and sets
  ``checkpoint.pretrained_checkpoint``, so an SFT/PEFT recipe runs through ``finetune()``.
- :func:`export_after_training` (rank 0, after training): the newest checkpoint of
  ``checkpoint.save`` to a HF folder, in a child process.

Conversions run in child processes because the training process's environment belongs to
torchrun (its rendezvous address and ranks), while a conversion runs as one process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bridge_recipes.hf import checkpoint as ck

LOG = "[run_recipe]"
WAIT_S = 3600  # longest wait of the other ranks for rank 0's conversion (a 397B import takes long)
FAILED_SUFFIX = ".failed"
# Where a Hugging Face folder keeps its image processor (transformers 5 saves it in processor_config.json).
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
_TORCHRUN_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
)


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def inspect(hf_dir: str) -> ck.HfFolder:
    """The checked Hugging Face folder ``hf_dir``. Raises ValueError (exit 2) on bad input."""
    try:
        return ck.inspect_folder(hf_dir)
    except ck.HfCheckpointError as e:
        raise ValueError(f"hf_checkpoint: {e}") from None


def check_family(cfg: Any, folder: ck.HfFolder) -> None:
    """The folder must hold the recipe's model family (:data:`checkpoint.FAMILY_FIELDS`: model
    class, attention interval, head dimensions, ...); ValueError naming each differing field."""
    from bridge_recipes.models.qwen35 import is_vlm

    found, expected = ck.found_fields(folder), ck.expected_from_model(cfg.model, is_vlm(cfg))
    if problems := ck.check_against(found, expected, scaled=True):
        raise ValueError(
            f"hf_checkpoint={folder.path} is not of this recipe's model family: {'; '.join(problems)}. "
            "Choose a recipe of its family (run_recipe.py --list) or a checkpoint of the recipe's"
        )


def layers_and_experts(folder: ck.HfFolder) -> tuple[int, int | None]:
    """The checkpoint's decoder layers and routed experts (None for a dense model)."""
    found = ck.found_fields(folder)
    return found["num_hidden_layers"], found["num_experts"]


def take_shape(cfg: Any, folder: ck.HfFolder) -> list[str]:
    """Set ``cfg.model``'s architecture fields (:data:`checkpoint.SHAPE_FIELDS`) to what Megatron-Bridge's
    provider for the folder has, and a VL model's vision token ids to the folder's config.json (top level
    or text_config); returns the changes as ``model.FIELD: old -> new``."""
    provider = ck.provider_of(folder)
    changes = []
    for name in ck.SHAPE_FIELDS:
        if not hasattr(cfg.model, name) or not hasattr(provider, name):
            continue
        old, new = getattr(cfg.model, name), getattr(provider, name)
        if old == new:
            continue
        setattr(cfg.model, name, new)
        if hasattr(new, "to_dict") and hasattr(old, "to_dict"):  # a sub-config (the vision tower): its fields
            a, b = old.to_dict(), new.to_dict()
            keys = [k for k in b if k != "transformers_version" and a.get(k) != b[k]]
            changes += [f"model.{name}.{k}: {a.get(k)!r} -> {b[k]!r}" for k in keys]
        elif name == "linear_attention_freq":
            changes.append(f"model.{name}: {len(old)} layers -> {len(new)} layers")
        else:
            changes.append(f"model.{name}: {old!r} -> {new!r}")
    try:
        token_ids = ck.vision_token_ids(folder)
    except ck.HfCheckpointError as e:
        raise ValueError(f"hf_checkpoint: {e}") from None
    for name, new in token_ids.items():  # a VL dataset built with the folder's processor writes these ids
        if hasattr(cfg.model, name) and getattr(cfg.model, name) != new:
            changes.append(f"model.{name}: {getattr(cfg.model, name)!r} -> {new!r}")
            setattr(cfg.model, name, new)
    return changes


def use_checkpoint(cfg: Any, folder: ck.HfFolder) -> None:
    """Make the checked folder's tokenizer the run's (and, for a VL checkpoint with an image
    processor, its processor the VL dataset's)."""
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    cfg.tokenizer = TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(folder.path))
    cfg.checkpoint.hf_source_path = str(folder.path)
    if folder.is_vl and any((folder.path / f).is_file() for f in IMAGE_PROCESSOR_FILES):
        # a VL checkpoint's images go through its own processor, as its text through its tokenizer
        for holder in (cfg.dataset, getattr(cfg.dataset, "task_encoder", None)):
            if holder is not None and getattr(holder, "hf_processor_path", None) is not None:
                holder.hf_processor_path = str(folder.path)


def check_model(cfg: Any, folder: ck.HfFolder) -> None:
    """The folder's architecture against ``cfg.model`` after the overrides (the shape came from the
    folder, so only a ``model.*`` override can differ); ValueError naming each differing field."""
    from bridge_recipes.models.qwen35 import is_vlm

    problems = ck.check_against(ck.found_fields(folder), ck.expected_from_model(cfg.model, is_vlm(cfg)))
    if problems:
        overridden = [
            f"model.{ck.MODEL_FIELD_OF[p.split(':')[0]]}" for p in problems if p.split(":")[0] in ck.MODEL_FIELD_OF
        ]
        hint = f"; drop the override(s) of {', '.join(overridden)}" if overridden else ""
        raise ValueError(
            f"hf_checkpoint={folder.path}: its weights would not load into the model as overridden: "
            + "; ".join(problems)
            + f"{hint} (the model's shape comes from the checkpoint's config.json)"
        )


def cache_folder(folder: ck.HfFolder) -> Path:
    return ck.cache_root() / ck.cache_key(folder)


def random_init_warning(cfg: Any, task: str, hf_checkpoint: str | None) -> str | None:
    """The warning for an SFT/PEFT run with no weights to start from (the runner refuses a LoRA one)."""
    if task not in ("sft", "peft") or hf_checkpoint or cfg.checkpoint.pretrained_checkpoint:
        return None
    if task == "peft" and getattr(cfg, "peft", None) is not None:
        return (
            "a LoRA run needs base weights to put its adapters on, and none are named: pass --hf-checkpoint DIR "
            "(a Hugging Face folder, converted once and cached) or checkpoint.pretrained_checkpoint=DIR (a Megatron "
            "checkpoint from scripts/convert_checkpoint.py import); to time a LoRA recipe on random weights, "
            "--lora-from-random-init (benchmark only)"
        )
    return (
        f"WARNING: this {task} recipe has no pretrained weights: it would train from random initialization. "
        "Pass hf_checkpoint=DIR (a Hugging Face folder, converted once and cached) or "
        "checkpoint.pretrained_checkpoint=DIR (a Megatron checkpoint from scripts/convert_checkpoint.py import)."
    )


def child_env() -> dict[str, str]:
    """The environment of a conversion child: torchrun's variables removed. Kept, the child's
    one-process group would join torchrun's rendezvous; TORCHELASTIC_USE_AGENT_STORE=True alone
    makes it wait, as a client, for a store that nobody hosts."""
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def attach(cfg: Any, folder: ck.HfFolder) -> Path:
    """Convert (once) and point ``checkpoint.pretrained_checkpoint`` at the conversion."""
    target = cache_folder(folder)
    failed = target.with_name(target.name + FAILED_SUFFIX)
    if not (target.is_dir() and ck.is_megatron_checkpoint(target)):
        if _rank() == 0:
            failed.unlink(missing_ok=True)
            _log(f"hf checkpoint: converting {folder.path} -> {target} (once; reused while the folder is unchanged)")
            cmd = [sys.executable, "-m", "bridge_recipes.hf.training", "import", str(folder.path), str(target)]
            rc = subprocess.run(cmd, env=child_env()).returncode
            if rc != 0:
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(f"exit status {rc}\n")
                raise SystemExit(f"{LOG} hf checkpoint: the conversion of {folder.path} failed (exit status {rc})")
        else:
            deadline = time.monotonic() + WAIT_S
            while not (target.is_dir() and ck.is_megatron_checkpoint(target)):
                if failed.exists() or time.monotonic() > deadline:
                    raise SystemExit(f"{LOG} hf checkpoint: rank 0's conversion into {target} failed or timed out")
                time.sleep(2)
    else:
        _log(f"hf checkpoint: reusing the conversion in {target}")
    cfg.checkpoint.pretrained_checkpoint = str(target)
    return target


def check_export_target(cfg: Any, out: str) -> None:
    """--export-hf needs a save folder (the export reads the final checkpoint) and a free, writable
    --export-hf apart from every folder the run reads or writes, the data's included (checked at the dry run, not
    after training)."""
    from bridge_recipes.outputs import overlap_problem

    ckpt = cfg.checkpoint
    if not ckpt.save:
        raise ValueError("export_hf needs checkpoint.save (the export reads the run's final checkpoint)")
    path = Path(out).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"export_hf={path} exists and is not empty; choose a new folder")
    folders = [
        ("checkpoint.save", ckpt.save),
        ("checkpoint.load", ckpt.load),
        ("checkpoint.pretrained_checkpoint", ckpt.pretrained_checkpoint),
        ("hf_checkpoint", getattr(ckpt, "hf_source_path", None)),
        (
            "dataset.path",
            data if isinstance(data := getattr(getattr(cfg, "dataset", None), "path", None), str) else None,
        ),
    ]
    if problem := overlap_problem(path, option="export_hf", inputs=[(n, p) for n, p in folders if p]):
        raise ValueError(problem)
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"export_hf={str(path)!r}: {existing} is not a writable folder; choose a folder you can write"
        )


def export_after_training(cfg: Any, out: str, template: str) -> int:
    """Rank 0: the final checkpoint of ``checkpoint.save`` to a HF folder at ``out``; exit status."""
    if _rank() != 0:
        return 0
    _log(f"export: {cfg.checkpoint.save} -> {out} (config and tokenizer from {template})")
    cmd = [sys.executable, "-m", "bridge_recipes.hf.training", "export", cfg.checkpoint.save, template, out]
    return subprocess.run(cmd, env=child_env()).returncode


def main(argv: list[str] | None = None) -> int:
    """``python -m bridge_recipes.hf.training import HF OUT | export MEGATRON TEMPLATE OUT`` (the runner's
    child processes; the checks ran before)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["import"] and len(argv) == 3:
            ck.import_checkpoint(argv[1], argv[2], overwrite=True)
        elif argv[:1] == ["export"] and len(argv) == 4:
            ck.export_checkpoint(argv[1], argv[2], argv[3])
        else:
            print("usage: python -m bridge_recipes.hf.training import HF OUT | export MEGATRON TEMPLATE OUT")
            return 2
    except ck.HfCheckpointError as e:
        print(f"{LOG} error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
