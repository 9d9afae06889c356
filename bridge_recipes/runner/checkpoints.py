"""Checkpoint settings that cannot work, caught before launch.

- asynchronous saving with no save folder;
- a pretrained checkpoint or an explicit resume folder that does not exist (an automatic
  resume from the save folder may find nothing: that is a fresh start, not an error);
- resuming a checkpoint of another kind of run (LoRA against full fine-tuning);
- resuming from a checkpoint whose saved run differs in a way the format cannot reshard:
  the architecture (layers, hidden size, heads, experts, vocabulary) never; with the legacy
  ``torch`` format, any change of TP or PP. torch_dist reshards TP/PP/CP/EP changes of the
  weights. The distributed optimizer's state is saved by Megatron-Bridge as ``dp_reshardable``
  unless ``checkpoint.dist_ckpt_optim_fully_reshardable`` is set; Megatron-Core documents that
  format (``DistributedOptimizer.sharded_state_dict``) as resting on the optimizer's internal
  buffers, reshardable "only in DP dimension". So a change of the data-parallel size is fine,
  and a change of TP, PP, CP, EP or ETP is refused unless the state was saved fully reshardable
  or is not loaded (``checkpoint.load_optim=false``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bridge_recipes.saved_runs import CheckpointMetadataError, latest_run_config

ARCHITECTURE_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "num_moe_experts",
    "moe_ffn_hidden_size",
    "vocab_size",
    "linear_num_value_heads",
)
LAYOUT_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size")
# Model-parallel sizes a dp_reshardable optimizer state must be loaded with (see the docstring).
DP_RESHARDABLE_FIXED = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def folder_problem(key: str, folder: str) -> str | None:
    """Why ``folder`` cannot be created or written as ``key``, or None when it can."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        return f"{key}={folder} is a file, not a folder; choose a folder path"
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{key}={folder}: {probe} is a file, so the folder cannot be created; choose another path"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{key}={folder}: {probe} is not writable; choose a folder you can write to"
    return None


def data_overlap(cfg: Any, key: str, folder: str) -> str | None:
    """An output folder (``key``) that is the dataset folder, inside it or holding it: the run's files would
    be mixed with the data (and a rebuild of the data with --overwrite would delete them)."""
    from bridge_recipes.outputs import overlap_problem

    data = getattr(getattr(cfg, "dataset", None), "path", None)
    if not isinstance(data, (str, os.PathLike)) or not str(data):
        return None
    problem = overlap_problem(folder, option=key, inputs=[("dataset.path", data)])
    return f"{problem} (the run's files would be mixed with the data)" if problem else None


def is_megatron_checkpoint(folder: str) -> bool:
    """Megatron-Bridge's own test: a tracker file, or an iteration folder with its markers."""
    from megatron.bridge.training.utils.checkpoint_utils import checkpoint_exists

    return checkpoint_exists(folder)


def problems(cfg: Any, world_size: int) -> list[str]:
    c, out = cfg.checkpoint, []  # a save interval below 1 is refused earlier, by bridge_recipes.values
    if getattr(c, "async_save", False) and not c.save:
        out.append(
            "checkpoint.async_save needs checkpoint.save; give a save folder or set checkpoint.async_save=false"
        )
    if c.save:
        out += [
            msg
            for msg in [folder_problem("checkpoint.save", c.save), data_overlap(cfg, "checkpoint.save", c.save)]
            if msg
        ]
    if c.pretrained_checkpoint and not os.path.exists(c.pretrained_checkpoint):
        out.append(f"checkpoint.pretrained_checkpoint={c.pretrained_checkpoint} does not exist")
    elif c.pretrained_checkpoint and not is_megatron_checkpoint(c.pretrained_checkpoint):
        out.append(
            f"checkpoint.pretrained_checkpoint={c.pretrained_checkpoint} is not a Megatron checkpoint (no "
            "latest_checkpointed_iteration.txt, no iteration folder markers); point it at a converted checkpoint"
        )
    if c.load and c.load != c.save and not os.path.exists(c.load):
        out.append(f"checkpoint.load={c.load} does not exist (to resume automatically, leave load equal to save)")
    try:
        saved = latest_run_config(c.load) if c.load and os.path.isdir(c.load) else None
    except CheckpointMetadataError as exc:
        return [*out, f"checkpoint.load={c.load}: {exc}; repair or remove that checkpoint, or load from another"]
    if saved:
        out += reshard_problems(cfg, world_size, *saved)
    return out


def task_problem(cfg: Any, where: str, run_config: dict) -> str | None:
    """A LoRA run resuming a full fine-tuning checkpoint, or the reverse: the saved state (adapters and
    their optimizer, or every weight's) is not the one this run trains."""
    saved_lora, this_lora = run_config.get("peft") is not None, getattr(cfg, "peft", None) is not None
    if saved_lora == this_lora:
        return None
    kinds = {True: "a LoRA run", False: "a full fine-tuning run"}
    start = (
        f"to start LoRA from those weights, set checkpoint.pretrained_checkpoint={cfg.checkpoint.load} and "
        if this_lora
        else ""
    )
    return (
        f"{where} was saved by {kinds[saved_lora]} and this is {kinds[this_lora]}: a run resumes only a "
        f"checkpoint of its own kind; {start}give this run its own folder: checkpoint.save=DIR checkpoint.load=DIR"
    )


def reshard_problems(cfg: Any, world_size: int, iteration: int, run_config: dict) -> list[str]:
    model, m, out = run_config.get("model") or {}, cfg.model, []
    where = f"checkpoint iteration {iteration} in {cfg.checkpoint.load}"
    if problem := task_problem(cfg, where, run_config):
        return [problem]
    for f in ARCHITECTURE_FIELDS:
        # the saved run_config.yaml holds the finalized config; a field this run leaves unset
        # (None) is derived from the others at finalize, so it is compared through them
        if f in model and getattr(m, f, None) is not None and model[f] != getattr(m, f):
            out.append(
                f"{where} was saved with model.{f}={model[f]} but this run has {getattr(m, f, None)}; "
                "a checkpoint cannot be resharded to another architecture"
            )
    saved_format = (run_config.get("checkpoint") or {}).get("ckpt_format")
    if saved_format == "torch":
        for f in LAYOUT_FIELDS:
            if f in model and model[f] != getattr(m, f):
                out.append(
                    f"{where} is in the legacy 'torch' format, saved at {f}={model[f]}; it cannot be loaded at "
                    f"{getattr(m, f)}: resume with the saved layout, or convert it to torch_dist"
                )
    # Distributed-optimizer state in Megatron-Bridge's default dp_reshardable format follows the
    # model-parallel structure it was saved with: only the data-parallel size may change.
    saved_ckpt = run_config.get("checkpoint") or {}
    if (
        cfg.checkpoint.load_optim
        and not saved_ckpt.get("dist_ckpt_optim_fully_reshardable", False)
        and (run_config.get("optimizer") or {}).get("use_distributed_optimizer")
    ):
        changed = [
            f"{f}={model[f]} -> {getattr(m, f)}"
            for f in DP_RESHARDABLE_FIXED
            if model.get(f) is not None and getattr(m, f, None) is not None and model[f] != getattr(m, f)
        ]
        if changed:
            out.append(
                f"{where} holds distributed-optimizer state in the dp_reshardable format, which reshards only "
                f"the data-parallel size, and this run changes {', '.join(changed)}: keep those sizes, set "
                "checkpoint.load_optim=false (weights only), or save with "
                "checkpoint.dist_ckpt_optim_fully_reshardable=true"
            )
    return out
