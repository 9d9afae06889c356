"""Checkpoint settings that cannot work, caught before launch.

- asynchronous saving with no save folder;
- a pretrained checkpoint or an explicit resume folder that does not exist (an automatic
  resume from the save folder may find nothing: that is a fresh start, not an error);
- a Hugging Face folder given as the resume, save or pretrained checkpoint folder (its weights are
  started from with ``--hf-checkpoint``), and a tracker that disagrees with the iteration folders;
- resuming a checkpoint of another run, or saving beside one: another recipe, model, starting
  weights, data (a rows folder by its content hash), sequence length or LoRA setting
  (``bridge_recipes.training.saved_runs``: the launch records what identifies its run in its save
  folder); the error names each difference and ``--fresh`` starts a new run in a new subfolder instead;
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

from bridge_recipes.training.saved_runs import (
    ARCHITECTURE_FIELDS,
    CheckpointMetadataError,
    fresh_folder,
    identity_differences,
    is_hf_folder,
    latest_iteration,
    latest_run_config,
    run_identity,
    saved_identity,
    saved_steps,
    tracker_problem,
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
    from bridge_recipes.utils.outputs import overlap_problem

    data = getattr(getattr(cfg, "dataset", None), "path", None)
    if not isinstance(data, (str, os.PathLike)) or not str(data):
        return None
    problem = overlap_problem(folder, option=key, inputs=[("dataset.path", data)])
    return f"{problem} (the run's files would be mixed with the data)" if problem else None


# The flag that sets each checkpoint folder, named in a refusal beside the field.
FOLDER_FLAGS = {
    "checkpoint.load": "--load-dir",
    "checkpoint.save": "--save-dir",
    "checkpoint.pretrained_checkpoint": "--pretrained-checkpoint",
}


def hf_folder_problem(key: str, folder: str | os.PathLike | None) -> str | None:
    """A Hugging Face folder (config.json and weights, no Megatron checkpoint) given as the checkpoint
    folder ``key``: not a run's checkpoint to resume, save beside or load, but weights to start from."""
    if not isinstance(folder, str | os.PathLike) or not str(folder) or not os.path.isdir(folder):
        return None
    if not is_hf_folder(Path(folder).expanduser()):
        return None
    what = {
        "checkpoint.load": "not a checkpoint of a run to resume",
        "checkpoint.save": "the run would write its checkpoints among its files",
        "checkpoint.pretrained_checkpoint": "not a Megatron checkpoint",
    }[key]
    rest = (
        "and give the run its own --save-dir" if key == "checkpoint.save" else f"and drop {FOLDER_FLAGS[key]} ({key})"
    )
    return (
        f"{key}={folder} ({FOLDER_FLAGS[key]}) is a Hugging Face folder (config.json and its weights), {what}; "
        f"to start from its weights pass --hf-checkpoint {folder} (converted once and cached) {rest}"
    )


def given_folder_problem(key: str, folder: str | os.PathLike | None, *, fresh: bool = False) -> str | None:
    """What a look at the checkpoint folder ``key`` refutes before anything is built: a Hugging Face
    folder (:func:`hf_folder_problem`), a file, or a tracker that disagrees with its iteration folders
    (unless ``fresh`` for the run's own folders: ``--fresh`` leaves them alone)."""
    if not isinstance(folder, str | os.PathLike) or not str(folder):
        return None
    if problem := hf_folder_problem(key, folder):
        return problem
    path = Path(folder).expanduser()
    if key != "checkpoint.save" and path.is_file():  # the save folder's own check names a file
        return f"{key}={folder} ({FOLDER_FLAGS[key]}) is a file, not a checkpoint folder; name the folder"
    pretrained = key == "checkpoint.pretrained_checkpoint"
    if path.is_dir() and (pretrained or not fresh) and (problem := tracker_problem(path)):
        way = "" if pretrained else "; or give this run another folder (--save-dir DIR)"
        return f"{key}={folder} ({FOLDER_FLAGS[key]}): {problem}{way}"
    return None


def is_megatron_checkpoint(folder: str) -> bool:
    """Megatron-Bridge's own test: a tracker file, or an iteration folder with its markers."""
    from megatron.bridge.training.utils.checkpoint_utils import checkpoint_exists

    return checkpoint_exists(folder)


def problems(cfg: Any, world_size: int, recipe: str | None = None) -> list[str]:
    """Why the checkpoint settings cannot work; ``recipe``, when given, is compared with the recipe
    of a checkpoint the run would resume or save beside."""
    c, out = cfg.checkpoint, []  # a save interval below 1 is refused earlier, by bridge_recipes.config.values
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
    keys = [k for k in FOLDER_FLAGS if not (k == "checkpoint.load" and c.load == c.save)]  # load follows save
    if given := [p for k in keys if (p := given_folder_problem(k, getattr(c, k.split(".")[1], None)))]:
        return [*out, *given]  # not a checkpoint folder, or one whose records disagree: nothing more to read
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
        where = f"checkpoint iteration {saved[0]} in {c.load}" if saved else ""
        if saved and (other_kind := task_problem(cfg, where, saved[1])):
            return [*out, other_kind]
        if other_run := identity_problems(cfg, recipe):
            return [*out, *other_run]  # not this run's checkpoint: how it would reshard does not matter
    except CheckpointMetadataError as exc:
        return [*out, f"{exc}; or give this run another folder (--save-dir DIR)"]
    if saved:
        out += reshard_problems(cfg, world_size, *saved)
    return out


def identity_problems(cfg: Any, recipe: str | None = None) -> list[str]:
    """The load folder (what the run resumes) or the save folder (what it saves beside) holding a
    checkpoint of another run: each difference named, and the ways on. CheckpointMetadataError for a
    folder whose records cannot be read."""
    c = cfg.checkpoint
    this = run_identity(cfg, recipe or "")
    if recipe is None:
        this.pop("recipe")
    out = []
    folders = [("checkpoint.load", c.load)] + ([("checkpoint.save", c.save)] if c.save != c.load else [])
    for key, folder in folders:
        if not folder or not os.path.isdir(folder) or (saved := saved_identity(folder)) is None:
            continue
        iteration, identity, complete = saved
        if not (differences := identity_differences(identity, this)):
            continue
        unchecked = "" if complete else " (a checkpoint saved without run_identity.json: recipe and data not compared)"
        if key == "checkpoint.load" and c.load == c.save:
            ways = (
                f"pass --fresh to start a new run in {fresh_folder(folder)} (the checkpoint stays as it is), "
                "give this run its own folder (--save-dir DIR), or run it with the saved settings to resume it"
            )
        elif key == "checkpoint.load":
            ways = "load a checkpoint of this run (--load-dir DIR), or run with the saved settings"
        else:
            ways = "give this run its own folder (--save-dir DIR): saving there would mix the two runs' checkpoints"
        verb = "resume" if key == "checkpoint.load" else "save beside"
        out.append(
            f"{key}={folder} holds a checkpoint (step {iteration}) of another run, which this run would {verb}: "
            f"{'; '.join(differences)} (saved -> this run){unchecked}; {ways}"
        )
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


def resume_line(cfg: Any) -> str:
    """Whether the run resumes, and from which step of which folder (the dry run's summary)."""
    c = cfg.checkpoint
    if not c.load:
        return "no: checkpoint.load is null, every launch starts at step 0"
    try:
        saved = saved_identity(c.load) if os.path.isdir(c.load) else None
    except CheckpointMetadataError as exc:
        return f"unknown: {exc}"
    if saved is None:
        return f"no: {c.load} holds no checkpoint, the run starts at step 0 (a later launch resumes its own)"
    iteration, identity, complete = saved
    weights = "starting weights, " if "start" in identity else ""
    same = (
        f"the same recipe, model, {weights}data, sequence length and LoRA settings"
        if complete
        else "saved without run_identity.json: its sequence length and LoRA settings match; recipe and data "
        "not compared"
    )
    return f"yes, from step {iteration} of {c.load} ({same})"


def start_fresh(cfg: Any, recipe: str) -> str:
    """``--fresh``: a new run rather than the save folder's checkpoint. When the save folder holds a
    checkpoint, the save (and the resume folder that follows it) and the log folders laid out beside it
    move to ``<save>/fresh_<N>``, the first N not taken; nothing is moved, deleted or written over.
    Returns the summary's resume line; ValueError when a load folder of its own is named (a resume)."""
    from bridge_recipes.config import tracking

    c = cfg.checkpoint
    if c.load and c.load != c.save:
        raise ValueError(
            f"--fresh starts a new run, and checkpoint.load={c.load} names a checkpoint to resume from; "
            "drop one of them"
        )
    if not c.save:
        return "no (--fresh): nothing is saved and nothing resumed"
    folder = str(fresh_folder(c.save))
    if os.path.normpath(folder) == os.path.normpath(c.save):
        return f"no (--fresh): {c.save} holds no checkpoint, the run starts at step 0 there"
    old, before = c.save, tracking.snapshot(cfg)
    c.save = folder
    if c.load:
        c.load = folder
    tracking.follow_save(cfg, before, [], recipe)
    step = latest_iteration(old)
    kept = f"step {step}" if step is not None else f"steps {', '.join(map(str, saved_steps(old)))}"
    return (
        f"no (--fresh): a new run in {folder}; {old} keeps its checkpoint ({kept}); "
        f"to resume this run later: --save-dir {folder}"
    )
