"""Why a run cannot go on, found before launch: the command line before anything is built (options that
do not go together, bad values, what a look at the disk refutes), then the built config (the layout
checks and patches' refusals, the card ``--gpu`` names, a memory cap it does not fit, Megatron-Bridge's
own validation, this GPU). Each answers with the message, or None when there is nothing to say.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from typing import Any

from bridge_recipes.config.builder import peft_problem
from bridge_recipes.config.overrides import OverrideError, flag_overrides, precheck, range_precheck
from bridge_recipes.recipes import registry
from bridge_recipes.runner.arguments import run_option_value, world_size_of
from bridge_recipes.training import watchdog


def gpus_conflict(args: argparse.Namespace) -> str | None:
    """--gpus N (the GPU count a scale-down shrinks to) against the world size the run is checked
    for (--world-size, or $WORLD_SIZE as torchrun sets it), when both are given and differ."""
    if args.gpus is None:
        return None
    given = "--world-size" if args.world_size is not None else "$WORLD_SIZE" if "WORLD_SIZE" in os.environ else None
    if given is None:
        return None
    try:
        world = world_size_of(args)
    except ValueError:
        return None  # reported as such later
    if world == args.gpus:
        return None
    return (
        f"--gpus {args.gpus} and {given} {world} conflict: --gpus shrinks the recipe to {args.gpus} GPU(s), "
        f"the run is checked for {world}; give the same number, or drop one of them"
    )


def megatron_validation(cfg: Any, world_size: int) -> str | None:
    """Megatron-Bridge's own pre-launch validation on a copy; the error text, or None.

    Without a GPU, the one step that asks the GPU (the flex dispatcher's architecture check)
    is skipped with a note (``bridge_recipes.patches.flex_check``): it runs again at launch."""
    import megatron.bridge.training.config as mb_config

    from bridge_recipes.patches import flex_check

    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", *cfg.env_vars)}
    os.environ["WORLD_SIZE"] = str(world_size)
    try:
        with flex_check.skipped(cfg) as skipped:
            if skipped:
                print(flex_check.NOTE)
            probe = copy.deepcopy(cfg)
            probe.model.gradient_accumulation_fusion = False  # APEX or its stand-in, decided at launch
            with tempfile.TemporaryDirectory() as stand_in:
                if probe.peft is not None and not probe.checkpoint.pretrained_checkpoint:
                    # LoRA needs starting weights, which --hf-checkpoint supplies at launch (the dry-run
                    # warns when none are given): an empty folder stands in for them here
                    probe.checkpoint.pretrained_checkpoint = stand_in
                mb_config.runtime_config_update(probe)
        return None
    except (AssertionError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def save_config_problem(args: argparse.Namespace) -> str | None:
    """Why --save-config cannot be written (checked before any work), or None."""
    from bridge_recipes.utils.outputs import output_problem

    if not args.dry_run:
        return "--save-config needs --dry-run (it writes the resolved config instead of launching)"
    inputs = [("--config-file", args.config_file), ("--hf-checkpoint", args.hf_checkpoint)]
    problem = output_problem(args.save_config, option="--save-config", inputs=[i for i in inputs if i[1]])
    if not problem and os.path.exists(args.save_config) and not args.overwrite_config:
        problem = f"--save-config {args.save_config} exists; pass --overwrite-config to replace it"
    return problem


def mock_data_warning(cfg: Any, task: str) -> str | None:
    """The warning for a fine-tuning run (SFT, or any with PEFT) that would read mock data."""
    from bridge_recipes.config.datasets import is_mock, real_data

    if (task in ("sft", "peft") or cfg.peft is not None) and is_mock(cfg):
        return (
            f"WARNING: this {task if cfg.peft is None else 'PEFT'} run trains on MOCK data (generated samples, "
            f"nothing to learn): pass {real_data(cfg)}"
        )
    return None


def budgets_problem(args: argparse.Namespace) -> str | None:
    """Why --first-step-timeout or --step-timeout (given, or read from a config file) is no budget."""
    for option in ("--first-step-timeout", "--step-timeout"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and (problem := watchdog.budget_problem(option, value)):
            return problem
    return None


def fit_this_gpu(entry: registry.RecipeEntry, cfg: Any, cap_gb: float | None, world: int) -> str | None:
    """Before launch (and before the re-exec, which imports the stack again): why the recipe cannot run
    on this GPU (or within ``--gpu-memory-gb``), naming the recipes that can; None when it can."""
    from bridge_recipes.hardware import gpu_memory
    from bridge_recipes.recipes import gpu_fit

    device = gpu_memory.current_device()
    if cap_gb is not None and (problem := gpu_memory.cap_problem(cap_gb, device)):
        return problem
    if device is None:
        return None  # the launch names the missing GPU
    if found := gpu_fit.problems(entry, cfg, device, cap_gb, world):
        return "; ".join(found)
    return None


def request_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line before anything is built: options that do not go together,
    bad overrides or flag values, an unknown recipe, a training stack that is not installed."""
    if not args.recipe and not args.config_file:
        return "--recipe NAME is required (or --config-file FILE, or --list to see the recipes)"
    if args.overwrite_config and not args.save_config:
        return "--overwrite-config applies to --save-config FILE; add it, or drop --overwrite-config"
    if args.save_config and (problem := save_config_problem(args)):
        return problem
    if problem := gpus_conflict(args):
        return problem
    if problem := budgets_problem(args):
        return problem
    if args.epochs is not None:
        from bridge_recipes.config.builder import epochs_conflict

        try:
            if problem := epochs_conflict(args.epochs, {"max_steps": args.max_steps}, args.overrides):
                return problem
        except OverrideError as exc:
            return str(exc)
    if args.peft is not None and (problem := peft_problem(args.peft)):
        return problem
    if problem := cap_request_problem(args):
        return problem
    if problem := paths_problem(args):
        return problem
    from bridge_recipes.features import replaced_env_problems

    if replaced := replaced_env_problems(None):  # a process environment variable a config key replaced
        return "; ".join(replaced)
    from bridge_recipes.config.files import recipe_of, run_options

    try:  # what needs no Megatron import is answered before it
        precheck(args.overrides)
        range_precheck(flag_overrides(vars(args)))
        if args.recipe:
            registry.find(args.recipe)
        if args.config_file:  # read, its sections checked, its recipe line held to its model and task
            registry.find(recipe_of(args.config_file, args.recipe))
            for option, value in run_options(args.config_file).items():
                run_option_value(option, value, args.config_file)
    except (OverrideError, registry.UnknownRecipe, ValueError) as exc:
        return str(exc)
    from bridge_recipes.hardware.installed import training_stack_problem

    return training_stack_problem("a dry run, --plan or a launch")


def _given(args: argparse.Namespace, key: str) -> str | None:
    """The value the command line gives ``key`` (the last ``KEY=VALUE`` override, quotes removed), or None."""
    value = None
    for token in args.overrides:
        name, sep, raw = token.partition("=")
        if sep and name.lstrip("+") == key:
            value = raw.strip().strip("'\"")
    return value


def paths_problem(args: argparse.Namespace) -> str | None:
    """What the command line names that a look at the disk refutes, before Megatron loads: an unknown
    --dataset, a starting checkpoint folder that is not there, a data path that is a file or missing."""
    from pathlib import Path

    from bridge_recipes.config.datasets import KINDS

    if args.dataset is not None and args.dataset not in KINDS:
        return f"--dataset {args.dataset!r} is not known; choose one of {', '.join(KINDS)}"
    local = ("/", ".", "~")
    weights = [("--hf-checkpoint", args.hf_checkpoint)] if args.hf_checkpoint else []
    weights += [
        (
            "checkpoint.pretrained_checkpoint",
            args.pretrained_checkpoint or _given(args, "checkpoint.pretrained_checkpoint"),
        )
    ]
    for name, value in weights:
        if value and value.startswith(local) and not Path(value).expanduser().exists():
            return f"{name} {value}: no such folder; give the folder of the starting weights"
    if args.hf_checkpoint:  # the folder's config and weights against each other need no Megatron
        from bridge_recipes.hf.run_hooks import inspect

        try:
            inspect(args.hf_checkpoint)
        except ValueError as exc:
            return str(exc)
    from bridge_recipes.runner.checkpoints import FOLDER_FLAGS, given_folder_problem

    for key, flag in FOLDER_FLAGS.items():  # a Hugging Face folder, or a tracker naming no saved step
        value = getattr(args, flag[2:].replace("-", "_")) or _given(args, key)
        if problem := given_folder_problem(key, value, fresh=bool(args.fresh)):
            return problem
    data = _given(args, "dataset.path")
    if not data or args.dataset not in ("sft-rows", "energon"):
        return None
    builder = "scripts/build_sft_rows.py" if args.dataset == "sft-rows" else "scripts/build_vl_dataset.py"
    path = Path(data).expanduser()
    if path.is_file() and args.dataset == "sft-rows":
        from bridge_recipes.data.integrity import MANIFEST_FILE, ROWS_FILE

        if path.name in (ROWS_FILE, MANIFEST_FILE):
            return f"dataset.path {data} is a file of a rows folder; set it to the folder: dataset.path={path.parent}"
    if path.is_file():
        return (
            f"dataset.path {data} is a file; --dataset {args.dataset} reads the folder built from it: "
            f"{builder} --input {data}{'' if args.dataset == 'sft-rows' else ' --processor CHECKPOINT'} --out DIR, "
            "then dataset.path=DIR"
        )
    if not path.exists():
        return f"dataset.path {data}: no such folder; build it with {builder} --out {data}"
    return None


def cap_request_problem(args: argparse.Namespace) -> str | None:
    """--gpu NAME turned into the card's memory (``args.gpu_memory_gb``), a cap checked for being a GPU's
    memory at all, and a note when the cap is the size printed on a card rather than what it holds."""
    from bridge_recipes.hardware.gpu_memory import cap_value_problem, nominal_note

    if args.gpu is not None:
        from bridge_recipes.hardware.gpus import card_by_name

        if args.gpu_memory_gb is not None:
            return f"--gpu {args.gpu} and --gpu-memory-gb {args.gpu_memory_gb:g} both set the memory; pass one"
        try:
            card = card_by_name(args.gpu)
        except KeyError as exc:
            return str(exc.args[0])
        args.gpu_memory_gb = card.usable_memory_gb
        print(
            f"[run_recipe] --gpu {args.gpu}: {args.gpu_memory_gb:.1f} GB (the {card.name}'s memory)", file=sys.stderr
        )
        return None
    if args.gpu_memory_gb is None:
        return None
    if problem := cap_value_problem(args.gpu_memory_gb):
        return problem
    recipe_gpu = None
    if args.recipe:
        try:
            recipe_gpu = registry.find(args.recipe).meta.gpu
        except registry.UnknownRecipe:
            pass  # named as such next
    if note := nominal_note(args.gpu_memory_gb, recipe_gpu):
        print(f"[run_recipe] note: {note}", file=sys.stderr)
    return None


def named_card_problem(name: str, entry: registry.RecipeEntry, cfg: Any, world: int) -> str | None:
    """Why the card ``--gpu NAME`` names cannot run ``cfg`` for its architecture (FP8, MXFP8, packed attention),
    naming the recipes it can; None when it can (its memory is the plan's to answer)."""
    from bridge_recipes.hardware.gpu_memory import Device
    from bridge_recipes.hardware.gpus import card_by_name
    from bridge_recipes.recipes import gpu_fit

    card = card_by_name(name)  # checked with the command line
    device = Device(card.name, card.usable_memory_gb, card.capability)
    found = gpu_fit.architecture_problems(entry, cfg, device)
    return "; ".join(gpu_fit.with_recipes_that_fit(entry, found, device.memory_gb, world, device)) or None


def checks_problem(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int) -> str | None:
    """The layout checks (each printed) and the patches' refusals for ``world`` GPUs: why the run cannot go on
    (naming the GPU count only where the layout over the GPUs is among the errors)."""
    from bridge_recipes.runner import checks

    problems = checks.check(cfg, world, entry.name)
    for p in problems:
        print(f"[run_recipe] {p}", file=sys.stderr)
    if errors := checks.errors(problems):
        if not any(p.layout for p in errors):  # nothing of the GPUs: the count is not the point
            return f"{entry.name} as configured cannot run; fix the error(s) above"
        hint = ""
        if args.hf_checkpoint and args.scale_down is None and not args.config_file:  # a config file takes none
            from bridge_recipes.hf.run_hooks import layers_and_experts

            layers, _ = layers_and_experts(args.hf_folder)
            hint = f" (for this checkpoint on fewer GPUs, add --scale-down {layers}: its layer count)"
        return f"{entry.name} as configured cannot run on {world} GPU(s); fix the errors above{hint}"
    from bridge_recipes import features

    if refused := features.patch_problems(cfg, dry_run=args.dry_run):
        return "; ".join(refused)
    return None


def cap_fit_problem(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int) -> str | None:
    """With a memory cap (--gpu-memory-gb, --gpu): why the memory plan says the run does not fit it, as
    --plan with the same options would refuse it; None when it fits."""
    from bridge_recipes.recipes.gpu_fit import plan_fits

    fits, peak = plan_fits(cfg, world, args.gpu_memory_gb)
    if fits:
        print(f"memory: planned peak {peak:.1f} of {args.gpu_memory_gb:.1f} GB per GPU")
        return None
    given = f"--gpu {args.gpu}" if args.gpu else f"--gpu-memory-gb {args.gpu_memory_gb:g}"
    return (
        f"{entry.name} as configured does not fit {given}: the memory plan's peak is {peak:.1f} of "
        f"{args.gpu_memory_gb:.1f} GB per GPU; run the same command with --plan instead of --dry-run for the "
        "plan per stage, the changes that fit and the recipes that do"
    )
