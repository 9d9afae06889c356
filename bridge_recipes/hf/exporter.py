"""The export: a Megatron checkpoint back into a Hugging Face folder shaped like its template.

:func:`export_checkpoint` checks that the checkpoint folder is a run's and that ``--recipe`` and
the template fit the run it records (:func:`saved_run_problem`), then writes the folder: the full
weights, a LoRA run's adapters merged into the template's weights (:mod:`bridge_recipes.hf.adapters`),
or a text model trained from a released folder back in the released form; into a temporary folder
renamed into place only once the whole export succeeded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from bridge_recipes.hf.adapters import build_lora_model, convert_lora_to_hf, lora_settings
from bridge_recipes.hf.architecture import (
    MODEL_FIELD_OF,
    _fix_hint,
    check_folder_for_recipe,
    expected_from_spec,
    found_fields,
    mismatch_error,
    spec_for_recipe,
    takes_language_model,
)
from bridge_recipes.hf.checkpoint import (
    FAMILY_FIELDS,
    FAMILY_NAMES,
    HfFolder,
    _conversion_context,
    _need_gpu,
    _quiet_megatron_import,
    inspect_folder,
    is_megatron_checkpoint,
    refuse_overlap,
    staged_output,
)
from bridge_recipes.hf.files import AdapterExportError, HfCheckpointError
from bridge_recipes.training import saved_runs


def convert_megatron_to_hf(megatron: Path, template: Path, out: Path) -> None:
    """Megatron-Bridge's export (``AutoBridge.export_ckpt``'s steps): the newest ``iter_*`` of
    ``megatron`` into safetensors at ``out``, with config and tokenizer copied from ``template``."""
    _need_gpu("the export")
    _quiet_megatron_import()
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(str(template))
    with _conversion_context():
        model = bridge.load_megatron_model(
            str(megatron), mp_overrides={"gradient_accumulation_fusion": False}, wrap_with_ddp=False
        )
        bridge.save_hf_pretrained(model, str(out), source_path=str(template), show_progress=True)


def saved_model_is_vl(megatron: Path) -> bool | None:
    """Whether the newest checkpoint of ``megatron`` holds a VL model (its saved model config has a
    vision tower), or None when no run config says."""
    from bridge_recipes.training.saved_runs import CheckpointMetadataError, latest_run_config

    try:
        found = latest_run_config(megatron)
    except CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    model = (found[1].get("model") if found else None) or {}
    return ("vision_config" in model) if model else None


def _export_released(megatron: Path, template: Path, out: Path, *, text_only: bool, adapter_out: Path | None) -> None:
    _need_gpu("the export")
    _quiet_megatron_import()
    from bridge_recipes.hf import released_bridge

    settings = lora_settings(megatron)
    released_bridge.export(
        inspect_folder(template),
        megatron,
        out,
        context=_conversion_context,
        lora_model=None if settings is None else (lambda bridge: build_lora_model(bridge, megatron, settings)),
        text_only=text_only,
        adapter_out=adapter_out,
    )


# --------------------------------------------------------------------------- the run a checkpoint records
# An export names a recipe and a Hugging Face template; the checkpoint folder records the run that
# saved it: run_identity.json (its recipe, model architecture, starting weights and LoRA settings;
# bridge_recipes.training.saved_runs) or, in a folder saved without one, the newest run_config.yaml.
# saved_run_problem names each way the recipe and the template do not fit that run: a recipe of
# another model family, a LoRA recipe for a full fine-tuning checkpoint or the reverse, a template of
# another shape, and for a LoRA run a template holding other weights than those it started from (the
# export merges the adapters into the template's weights).

# The template's config.json field (as found_fields reads it) of each recorded architecture field.
TEMPLATE_FIELD_OF = {m: hf for hf, m in MODEL_FIELD_OF.items() if m in saved_runs.ARCHITECTURE_FIELDS}
START_FOLDER = "Hugging Face folder"  # the kind of starting weights a template can be compared with


def iteration_folder_error(megatron: Path) -> HfCheckpointError | None:
    """One iteration folder of a run given as --megatron: the export reads the run's folder (its newest step)."""
    if saved_runs.iteration_of(megatron) is None or not (megatron.parent / saved_runs.TRACKER).is_file():
        return None
    return HfCheckpointError(
        f"--megatron {megatron} is one iteration folder of a run; pass the run's folder, --megatron {megatron.parent} "
        f"(the export reads the step its {saved_runs.TRACKER} names)"
    )


def tracker_error(megatron: Path) -> HfCheckpointError | None:
    """The error for a checkpoint whose tracker names no saved step (or saved steps with no tracker)."""
    problem = saved_runs.tracker_problem(megatron)
    return HfCheckpointError(f"--megatron {megatron}: {problem}") if problem else None


def recorded_run(megatron: Path) -> tuple[dict, str]:
    """(what the run that saved ``megatron`` recorded, the file it comes from): its identity, else the
    architecture and LoRA settings of its newest run_config.yaml; ({}, "") when neither is there."""
    try:
        identity = saved_runs.read_identity(megatron)
        if identity is not None:
            return identity, saved_runs.IDENTITY
        found = saved_runs.latest_run_config(megatron)
    except saved_runs.CheckpointMetadataError as e:
        raise HfCheckpointError(str(e)) from None
    if not found or not found[1]:
        return {}, ""
    model = found[1].get("model") or {}
    record = saved_runs.identity_of_run_config(found[1])
    record["model"] = {f: model[f] for f in saved_runs.ARCHITECTURE_FIELDS if f in model}
    return record, saved_runs.RUN_CONFIG


def _family_problem(saved_recipe: str, recipe: str) -> str | None:
    """``recipe`` for a model of another family than the recipe the run was (MoE or dense, attention
    pattern, head sizes); a VL recipe and its text model are of one family."""
    try:
        saved, given = spec_for_recipe(saved_recipe), spec_for_recipe(recipe)
    except HfCheckpointError:
        return None
    a, b = expected_from_spec(saved), expected_from_spec(given)
    a["architecture"], b["architecture"] = (
        FAMILY_NAMES[(saved.is_moe, False)],
        FAMILY_NAMES[(given.is_moe, False)],
    )
    differ = [f"{f} {a[f]!r} -> {b[f]!r}" for f in FAMILY_FIELDS if a[f] != b[f]]
    if not differ:
        return None
    return f"--recipe {recipe} is of another model family than the run's recipe {saved_recipe}: {'; '.join(differ)}"


def _task_problem(record: dict, recipe: str) -> str | None:
    """A LoRA recipe given for the checkpoint of a full fine-tuning recipe's run, or the reverse (both
    recipes known; a run of a recipe given ``--peft`` keeps its recipe's name and is not compared)."""
    from bridge_recipes.recipes import registry

    try:
        saved, given = registry.find(record["recipe"]).meta.task, registry.find(recipe).meta.task
    except registry.UnknownRecipe:  # a catalog model name, or a recipe no longer listed: no task
        return None
    if saved == given or {saved, given} != {"sft", "peft"}:
        return None
    kind = "a LoRA recipe" if given == "peft" else "a full fine-tuning recipe"
    return (
        f"--recipe {recipe} is {kind}, and the run's recipe {record['recipe']} was not: its checkpoint holds "
        f"{saved_runs.lora_words(record.get('lora'))}"
    )


def _shape_problems(record: dict, folder: HfFolder) -> list[str]:
    """The recorded architecture against the template's config.json: the export writes the weights in
    the template's shape."""
    found, out, model = found_fields(folder), [], record.get("model") or {}
    for key, name in TEMPLATE_FIELD_OF.items():
        if key not in model:  # not recorded: not compared
            continue
        saved, have = model[key], found.get(name)
        if key == "num_moe_experts":
            saved, have = saved or None, have or None  # 0 and None: a dense model
        elif saved is None or (have is None and key == "ffn_hidden_size"):  # a MoE config has no dense FFN
            continue
        if saved != have:
            out.append(f"model.{key}: the run has {saved}, --hf-template's config.json {name} is {have}")
    return out


def _start_problem(record: dict, folder: HfFolder) -> str | None:
    """A LoRA run's template holding other weights than those the run started from."""
    start = record.get("start")
    if record.get("lora") is None or not start or start.get("kind") != START_FOLDER or not start.get("weights_key"):
        return None
    key = saved_runs.weights_key(sorted(folder.path.glob("*.safetensors")), folder.path)
    if key is None or key == start["weights_key"]:
        return None
    return (
        f"--hf-template {folder.path} holds other weights (weights key {key[:12]}) than the run started from, "
        f"{saved_runs.start_words(start)}: the adapters were trained on those, and the export merges them into "
        "the template's"
    )


def saved_run_problem(megatron: Path, folder: HfFolder, recipe: str | None) -> HfCheckpointError | None:
    """The error naming how ``recipe`` and the template ``folder`` do not fit the run that saved
    ``megatron`` (see the comment above), or None when they fit or the folder records no run."""
    record, source = recorded_run(megatron)
    if not record:
        return None
    saved_recipe = record.get("recipe")
    problems = []
    if recipe and saved_recipe and recipe != saved_recipe:
        problems += [_family_problem(saved_recipe, recipe), _task_problem(record, recipe)]
    problems += _shape_problems(record, folder)
    problems.append(_start_problem(record, folder))
    if not (problems := [p for p in problems if p]):
        return None
    start = record.get("start") or {}
    fix = "Pass the run's recipe" + (f" (--recipe {saved_recipe})" if saved_recipe else "")
    fix += " and the Hugging Face folder it started from as --hf-template"
    fix += f" ({start['path']})" if start.get("kind") == START_FOLDER else ""
    lines = "\n  ".join(problems)
    return HfCheckpointError(
        f"--megatron {megatron} was saved by a run that --recipe and --hf-template do not fit (its {source}):\n"
        f"  {lines}\n{fix}."
    )


def _export_inputs(megatron: Path, template: str | os.PathLike, recipe: str | None, progress: bool) -> HfFolder:
    """The export's checkpoint folder checked (a run's folder whose tracker names a saved step) and its
    template read and checked against the run the checkpoint records; the template's folder."""
    if error := iteration_folder_error(megatron):
        raise error
    if not megatron.is_dir() or not is_megatron_checkpoint(megatron):
        raise HfCheckpointError(
            f"--megatron {megatron} is not a Megatron checkpoint folder (no latest_checkpointed_iteration.txt "
            "or iter_* inside); pass the run's checkpoint.save folder or an imported checkpoint"
        )
    if error := tracker_error(megatron):
        raise error
    folder = inspect_folder(template, progress=progress)
    if error := saved_run_problem(megatron, folder, recipe):
        raise error
    return folder


def export_checkpoint(
    megatron: str | os.PathLike,
    template: str | os.PathLike,
    out: str | os.PathLike,
    *,
    recipe: str | None = None,
    scaled: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    text_model: bool | None = None,
    text_only: bool = False,
    adapter: bool = True,
    convert: Callable[[Path, Path, Path], None] = convert_megatron_to_hf,
    lora_convert: Callable[..., None] = convert_lora_to_hf,
    released_convert: Callable[..., None] = _export_released,
) -> Path:
    """Export the Megatron checkpoint ``megatron`` to a HF folder shaped like ``template``; a LoRA
    run's checkpoint (adapters only) is merged into ``template``'s base weights and, unless not
    ``adapter``, also written alone as a PEFT folder beside ``out``
    (:func:`bridge_recipes.hf.released.adapter_folder`).

    A text model trained from a released VL ``template`` (``text_model``; default: what the
    checkpoint's saved config says, else whether ``recipe`` is a text recipe) comes back in the
    released form: the template's vision tower and config unchanged, its MTP layer present
    (:func:`bridge_recipes.hf.released.write_export`); ``text_only`` asks for the text form."""
    from bridge_recipes.hf.released import TEXT_ONLY_OPTION, adapter_folder

    inputs = (("--megatron", megatron), ("--hf-template", template))
    refuse_overlap(out, *inputs, overwrite=overwrite)
    megatron = Path(megatron).expanduser()
    folder = _export_inputs(megatron, template, recipe, progress)
    if recipe is not None:
        problems = check_folder_for_recipe(folder, recipe, scaled=scaled)
        if problems:
            raise mismatch_error(folder.path, problems, _fix_hint(scaled))
    if text_model is None:
        saved_vl = saved_model_is_vl(megatron)
        if saved_vl is not None:
            text_model = not saved_vl
        else:
            text_model = recipe is not None and not spec_for_recipe(recipe).is_vl
    released = takes_language_model(folder, not text_model)
    if text_only and folder.is_vl and not released:
        raise HfCheckpointError(
            f"{TEXT_ONLY_OPTION}: {megatron} holds a VL model (vision tower included); its export is the VL form. "
            "The text form is for a text recipe trained from a released folder"
        )
    lora = lora_settings(megatron) is not None
    adapter_out = adapter_folder(out) if lora and adapter else None
    if adapter_out is not None:
        refuse_overlap(
            adapter_out, *inputs, overwrite=overwrite, what=f"the adapter folder {adapter_out} beside --out"
        )
    staged_adapter = staged_output(adapter_out, overwrite) if adapter_out is not None else contextlib.nullcontext()
    adapter_failure = None
    with staged_output(out, overwrite) as tmp:
        try:  # the adapter folder is written after the merged one: its failure keeps the merged folder
            with staged_adapter as tmp_adapter:
                if released:
                    released_convert(megatron, folder.path, tmp, text_only=text_only, adapter_out=tmp_adapter)
                elif lora:  # adapters only: merged into the template's base weights
                    lora_convert(megatron, folder.path, tmp, tmp_adapter)
                else:
                    convert(megatron, folder.path, tmp)
        except AdapterExportError as e:
            adapter_failure = e
        if not list(tmp.glob("*.safetensors")):
            raise HfCheckpointError(f"the export wrote no safetensors into {tmp}")
    if adapter_failure is not None:
        raise AdapterExportError(
            f"the merged export is complete in {out}, but the adapter-only folder {adapter_out} could not be "
            f"written ({adapter_failure})"
        ) from adapter_failure.__cause__
    return Path(out)
