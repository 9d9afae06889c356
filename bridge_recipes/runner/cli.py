"""Command line of scripts/run_recipe.py: list, build, override, check, dry-run, run.

Exit codes: 0 success, 2 bad input (unknown recipe, bad override, layout that cannot work),
anything else comes from the training run itself.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
from typing import Any

import bridge_recipes
from bridge_recipes.config.builder import PEFT_SCHEMES, peft_problem
from bridge_recipes.config.overrides import (
    FLAG_KEYS,
    OverrideError,
    flag_option,
    flag_overrides,
    in_cli_terms,
    precheck,
    range_precheck,
)
from bridge_recipes.features import random_lora
from bridge_recipes.recipes import registry
from bridge_recipes.training import watchdog
from bridge_recipes.utils import quiet

USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, with the nearest known options named for a misspelt one."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            import difflib

            known = [o for a in self._actions for o in a.option_strings]
            unknown = [t.split("=", 1)[0] for t in message.split(":", 1)[1].split() if t.startswith("-")]
            near = {t: difflib.get_close_matches(t, known, n=2, cutoff=0.6) for t in unknown}
            hints = [f"{t}: did you mean {' or '.join(n)}?" for t, n in near.items() if n]
            message = "; ".join([message, *hints])
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="run_recipe.py",
        description="Build, check and run a Qwen3.5/3.6 recipe. Trailing KEY=VALUE overrides use Hydra "
        "grammar (a.b=1, +env_vars.X=1, ~peft, lists, null) and win over the convenience flags.",
    )
    p.add_argument("--list", action="store_true", help="print the recipe table and exit")
    quiet.add_flag(p)
    p.add_argument(
        "--filter",
        nargs="+",
        default=[],
        metavar="TERM",
        help="with --list: keep rows matching every term (e.g. h200 sft)",
    )
    p.add_argument("--recipe", help="exported recipe function name")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="build, override and check; print the layout and what the run reads and writes; no GPU needed",
    )
    p.add_argument(
        "--dataset",
        metavar="KIND",
        help="replace the recipe's data: mock | sft-rows (text) | energon (VL); then set dataset.path=...",
    )
    p.add_argument(
        "--scale-down",
        type=int,
        metavar="LAYERS",
        help="shrink the recipe to one GPU with LAYERS layers (a multiple of 4), keeping its execution "
        "policy; the changes are printed",
    )
    p.add_argument("--scale-experts", type=int, metavar="N", help="with --scale-down: keep N routed experts")
    p.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="with --scale-down: shrink to N GPUs, keeping as much of the recipe's parallel layout as fits "
        "(default 1); also the world size checked when --world-size and $WORLD_SIZE are unset",
    )
    p.add_argument(
        "--epochs",
        type=float,
        metavar="N",
        help="train N passes over the SFT rows (--dataset sft-rows): sets train.train_iters from the rows folder's "
        "row count and the rows per step (whole steps, rounded down); instead of --max-steps",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start a new run instead of resuming the save folder's checkpoint: when that folder holds one, the run "
        "saves to a new subfolder fresh_N of it (nothing is moved or deleted); resume it later with --save-dir",
    )
    p.add_argument(
        "--peft",
        metavar="SCHEME",
        help=f"fine-tune with adapters instead of all weights ({' | '.join(PEFT_SCHEMES)}): lora puts LoRA "
        "(rank 32) on attention, Gated DeltaNet and MLP/expert projections, lr 1e-4; the recipe's layout is kept",
    )
    _add_run_options(p)
    g = p.add_argument_group("convenience flags (applied before trailing overrides)")
    for dest, flag in FLAG_KEYS.items():
        g.add_argument(flag_option(dest), dest=dest, type=flag.type, help=" and ".join(flag.keys))
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return p


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of what a build is checked for, planned or run with, and what it writes."""
    p.add_argument(
        "--world-size",
        type=int,
        help="GPU count to check against (default: $WORLD_SIZE, else for --dry-run and --plan the recipe's own, "
        "else 1)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="estimate per-GPU memory per pipeline stage and exit (2 when a stage does not fit)",
    )
    p.add_argument(
        "--gpu-memory-gb",
        type=float,
        metavar="GB",
        help="train within GB of the GPU's memory (GB = 1e9 bytes, as torch reports a card's total: an H100 "
        "sold as 80 GB holds 85.0; --gpu names a card instead): the allocator is capped, and --plan and "
        "--dry-run plan for it",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="plan and train within the memory of this card, as its CUDA runtime reports it (h100, h100-pcie, "
        "h100-nvl, h200, a100, l40s, rtx6000ada, l40, a6000, rtx4090, rtx5090, ...; docs/memory_plan.md), and check "
        "its FP8 support: --gpu-memory-gb with the card's real figure",
    )
    p.add_argument(
        "--show-env",
        action="store_true",
        help="print the environment the training process starts with (after the re-exec) and exit",
    )
    p.add_argument(
        "--hf-checkpoint",
        metavar="DIR",
        help="start from this Hugging Face folder: checked against the model, converted once into "
        "$QWEN35_RECIPES_CACHE/hf_import (default ~/.cache/qwen35_recipes), its tokenizer used",
    )
    p.add_argument(
        "--config-file",
        metavar="FILE",
        help="build from a config saved with --save-config (its recipe is recorded in it); overrides still apply",
    )
    p.add_argument("--save-config", metavar="FILE", help="with --dry-run: write the resolved YAML to FILE")
    p.add_argument("--show-yaml", action="store_true", help="with --dry-run: also print the resolved YAML")
    p.add_argument("--overwrite-config", action="store_true", help="let --save-config replace an existing file")
    p.add_argument(
        "--export-hf",
        metavar="DIR",
        help="after training, write the final checkpoint as a HF folder here, in the form --hf-checkpoint has "
        "(a released VL folder comes back as one); a LoRA run also writes its adapters alone to DIR-adapter",
    )
    p.add_argument(
        "--export-text-only",
        action="store_true",
        default=None,
        help="with --export-hf of a text recipe trained from a released VL folder: the text form "
        "(Qwen3_5(Moe)ForCausalLM, no vision tower) instead of the released form",
    )
    p.add_argument(
        "--first-step-timeout",
        metavar="SECONDS",
        help=f"end the run with its last stage and every thread's stack when the first micro-batch (kernel "
        f"compiles included) takes longer (default {watchdog.FIRST_STEP_S:g}; 0: no limit)",
    )
    p.add_argument(
        "--step-timeout",
        metavar="SECONDS",
        help=f"likewise when, after it, no micro-batch starts and no step ends for this long (default "
        f"{watchdog.STEP_S:g}; 0: no limit)",
    )
    p.add_argument(
        random_lora.OPTION,
        action="store_true",
        help="benchmark only: train a LoRA recipe's adapters on random base weights (speed and memory, no "
        "checkpoint); refused unless checkpoint.save and checkpoint.load are null and no weights are named",
    )


def fail(msg: str) -> int:
    print(f"run_recipe.py: error: {in_cli_terms(msg)}", file=sys.stderr)
    return USAGE_ERROR


def world_size_of(args: argparse.Namespace, recipe_gpus: int = 1) -> int:
    """--world-size, else $WORLD_SIZE (as torchrun sets it), else --gpus, else for a dry run or a plan of
    the recipe as written (no --scale-down, no --config-file) its own GPU count ``recipe_gpus``, else 1
    (a launch without torchrun is one process); ValueError naming a bad one."""
    if args.world_size is not None:
        return args.world_size
    as_written = (args.dry_run or args.plan) and args.scale_down is None and not args.config_file
    default = args.gpus or (recipe_gpus if as_written else 1)
    raw = os.environ.get("WORLD_SIZE", str(default))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"WORLD_SIZE={raw!r} is not an integer; unset it or pass --world-size N") from None


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


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of :func:`bridge_recipes.build` that the parsed command line asks for
    (``--lora-from-random-init`` is ``features.random_lora.enabled=true``, before the overrides)."""
    random_init = [f"{random_lora.KEY}=true"] if getattr(args, "lora_from_random_init", False) else []
    return {
        "scale_down": args.scale_down,
        "scale_experts": args.scale_experts,
        **({"gpus": args.gpus} if args.gpus is not None else {}),
        "dataset": args.dataset,
        "flags": {dest: getattr(args, dest) for dest in FLAG_KEYS},
        "overrides": [*random_init, *args.overrides],
        **({"peft": args.peft} if args.peft else {}),
        **({"hf_checkpoint": args.hf_checkpoint} if args.hf_checkpoint else {}),
        **({"config_file": args.config_file} if args.config_file else {}),
        **({"epochs": args.epochs} if args.epochs is not None else {}),
    }


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


def build(args: argparse.Namespace) -> tuple[registry.RecipeEntry, Any]:
    if args.config_file:
        take_run_options(args)
    if problem := budgets_problem(args):
        raise ValueError(f"{problem} (from {args.config_file})" if args.config_file else problem)
    entry = registry.find(args.recipe)
    if args.hf_checkpoint and args.pretrained_checkpoint:
        raise ValueError("--hf-checkpoint and --pretrained-checkpoint both name the starting weights; pass one")
    cfg = bridge_recipes.build(
        args.recipe, **build_request(args), report=lambda change: print(f"[run_recipe] {change}")
    )
    args.fresh_note = None
    if args.fresh:
        from bridge_recipes.runner.checkpoints import start_fresh

        args.fresh_note = start_fresh(cfg, entry.name)
    if args.hf_checkpoint:
        from bridge_recipes.hf import run_hooks as hf_training
        from bridge_recipes.runner.checks import fp8_parameter_problems

        args.hf_folder = hf_training.inspect(args.hf_checkpoint)
        from bridge_recipes.hf.importer import cache_problem

        if problem := cache_problem(args.hf_folder, hf_training.text_model(cfg)):  # the launch converts into it
            raise ValueError(problem)
        from bridge_recipes.utils.outputs import overlap_problem

        inputs = [("--hf-checkpoint", args.hf_checkpoint)]
        if cfg.checkpoint.save and (
            problem := overlap_problem(cfg.checkpoint.save, option="checkpoint.save", inputs=inputs)
        ):
            raise ValueError(problem)
        # the launch attaches the converted weights after the layout checks: what depends on them is checked now
        if problems := fp8_parameter_problems(cfg, weights=str(args.hf_checkpoint)):
            raise ValueError(problems[0])
    if args.export_hf:
        from bridge_recipes.hf import run_hooks as hf_training

        if not args.hf_checkpoint:
            raise ValueError("--export-hf needs --hf-checkpoint (its config and tokenizer template the export)")
        hf_training.check_export_target(cfg, args.export_hf, args.hf_folder, text_only=bool(args.export_text_only))
    elif args.export_text_only:
        raise ValueError("--export-text-only applies to --export-hf DIR; add it, or drop --export-text-only")
    return entry, cfg


def take_run_options(args: argparse.Namespace) -> None:
    """The recipe a config file was written from (``args.recipe``) and the runner options it records (its
    weights, export folder, epochs, ...), each unless the command line gives its own (a step count given
    there replaces the file's epochs); each option taken is printed."""
    from bridge_recipes.config.builder import STEP_KEYS
    from bridge_recipes.config.files import recipe_of, run_options
    from bridge_recipes.config.overrides import parse

    args.recipe = recipe_of(args.config_file, args.recipe)
    for option, value in run_options(args.config_file).items():
        dest = option.replace("-", "_")
        if getattr(args, dest) is not None or (dest == "gpu_memory_gb" and args.gpu):
            continue
        if dest == "epochs":
            steps = [f"--max-steps {args.max_steps}"] if args.max_steps is not None else []
            steps += [t for t in args.overrides if parse(t).key in STEP_KEYS]
            if steps:
                print(f"[run_recipe] '# epochs: {value}' of {args.config_file} not taken: {steps[0]} sets the steps")
                continue
        setattr(args, dest, _run_option(option, value, args.config_file))
        print(f"[run_recipe] --{option} {value} (from {args.config_file})")


def _run_option(option: str, value: str | bool, path: str) -> Any:
    """A runner option as a config file records it: a folder, or the memory cap or the epochs (a number,
    checked)."""
    if option == "epochs":
        from bridge_recipes.config.run_length import epochs_value_problem

        try:
            epochs = float(value)
        except ValueError:
            epochs = math.nan
        if epochs_value_problem(epochs):
            raise ValueError(f"config file {path}: '# epochs: {value}' is not a number of passes over the rows > 0")
        return epochs
    if option != "gpu-memory-gb":
        return value
    from bridge_recipes.hardware.gpu_memory import cap_value_problem

    try:
        gb = float(value)
    except ValueError:
        raise ValueError(f"config file {path}: '# gpu-memory-gb: {value}' is not a number of GB") from None
    if problem := cap_value_problem(gb):
        raise ValueError(f"config file {path}: {problem}")
    return gb


def mock_data_warning(cfg: Any, task: str) -> str | None:
    """The warning for a fine-tuning run (SFT, or any with PEFT) that would read mock data."""
    from bridge_recipes.config.datasets import is_mock, real_data

    if (task in ("sft", "peft") or cfg.peft is not None) and is_mock(cfg):
        return (
            f"WARNING: this {task if cfg.peft is None else 'PEFT'} run trains on MOCK data (generated samples, "
            f"nothing to learn): pass {real_data(cfg)}"
        )
    return None


def run_summary(cfg: Any, entry: registry.RecipeEntry, args: argparse.Namespace, world: int) -> str:
    """What the run reads and writes and how long it is: data, steps, epochs and tokens, validation, the
    expected time, PEFT, the starting weights, whether it resumes, the save and export folders."""
    from bridge_recipes.config.datasets import describe

    peft = cfg.peft
    if peft is None:
        adapters = "none (all weights train)"
    else:
        targets = ", ".join(getattr(peft, "target_modules", []) or [])
        adapters = f"{type(peft).__name__} rank {getattr(peft, 'dim', '?')}, alpha {getattr(peft, 'alpha', '?')}"
        adapters += f" on {targets}" if targets else ""
    ckpt = cfg.checkpoint
    taken = None
    if cfg.features.random_lora.enabled:
        weights = random_lora.NOTE.removeprefix("base weights: ")
    elif args.hf_checkpoint:
        from bridge_recipes.hf.run_hooks import cache_folder, released_summary, text_model

        weights = (
            f"{args.hf_folder.path} (Hugging Face; converted at launch into "
            f"{cache_folder(args.hf_folder, text_model(cfg))}, or reused from there)"
        )
        taken = released_summary(cfg, args.hf_folder)
    elif ckpt.pretrained_checkpoint:
        weights = f"{ckpt.pretrained_checkpoint} (Megatron checkpoint)"
    else:
        weights = "random initialization"
        if entry.checkpoint is not None:
            weights += f" (--hf-checkpoint DIR starts from {entry.checkpoint.hf_id}'s weights)"
    if args.hf_checkpoint and taken:
        weights += f"\n                  {taken}"
    expected, step_seconds = timing(cfg, entry, world, args)
    save = "none (nothing is saved)"
    if ckpt.save:
        from bridge_recipes.config.save_interval import saves_line

        first, *more = saves_line(cfg, save_interval_source(args), step_seconds)
        save = "".join([f"{ckpt.save} {first}", *(f"\n{' ' * 18}{line}" for line in more)])
    export = "none"
    if args.export_hf:
        from bridge_recipes.hf.run_hooks import export_summary

        export = export_summary(cfg, args.export_hf, args.hf_folder, bool(args.export_text_only))
    from bridge_recipes.config import run_length
    from bridge_recipes.runner.checkpoints import resume_line

    return "\n".join(
        [
            f"progress watch    {budgets_of(args).describe()}",
            f"data              {describe(cfg)}",
            f"length            {run_length.length_line(cfg)}",
            f"validation        {run_length.validation_line(cfg)}",
            f"time              {expected}",
            f"peft              {adapters}",
            f"weights           {weights}",
            f"resume            {getattr(args, 'fresh_note', None) or resume_line(cfg)}",
            f"save              {save}",
            f"export            {export}",
            f"disk              {disk_line(cfg, args)}",
        ]
    )


def save_interval_source(args: argparse.Namespace) -> str:
    """Who set a save interval the build did not set from the run: an override, the flag, the config
    file, else the recipe."""
    from bridge_recipes.config.builder import SAVE_INTERVAL_KEY

    if any(t.partition("=")[0].lstrip("+~") == SAVE_INTERVAL_KEY for t in args.overrides):
        return f"set by {SAVE_INTERVAL_KEY}="
    if args.save_interval is not None:
        return "set by --save-interval"
    if args.config_file:
        return f"as the config file {args.config_file} records it"
    return "the recipe's own"


def disk_line(cfg: Any, args: argparse.Namespace) -> str:
    """What the run writes to disk (the checkpoints it keeps, the exports) and the conversion it makes once
    (``bridge_recipes.plan.disk``)."""
    from bridge_recipes.plan.dims import model_dims
    from bridge_recipes.plan.disk import folder_vision_params, run_disk

    folder = args.hf_folder if args.hf_checkpoint else None
    conversion = None
    vision = 0
    if folder is not None:
        from bridge_recipes.hf.checkpoint import is_megatron_checkpoint
        from bridge_recipes.hf.run_hooks import cache_folder, text_model

        text = text_model(cfg)
        vision = folder_vision_params(folder.config)
        if not is_megatron_checkpoint(cache_folder(folder, text)):
            conversion = 0 if text else vision
        if text and args.export_text_only:
            vision = 0
    try:
        d = model_dims(cfg.model)
    except (ValueError, KeyError, AttributeError, TypeError) as exc:  # a model the planner cannot size
        return f"not estimated ({type(exc).__name__}: {exc})"
    return run_disk(cfg, d, export=bool(args.export_hf), export_vision=vision, conversion_vision=conversion).line()


def time_line(cfg: Any, entry: registry.RecipeEntry, world: int, args: argparse.Namespace) -> str:
    """The expected time of the training steps at the recipe's rate on the card the run is for
    (:func:`run_card`): measured, an estimate labelled as such, or why there is none
    (:func:`bridge_recipes.recipes.rates.run_rate`)."""
    return timing(cfg, entry, world, args)[0]


def timing(cfg: Any, entry: registry.RecipeEntry, world: int, args: argparse.Namespace) -> tuple[str, float | None]:
    """:func:`time_line`'s line, and the seconds a step takes where it gives a rate (else None)."""
    from bridge_recipes.config.run_length import duration, expected_seconds, step_seconds
    from bridge_recipes.hardware.gpu_memory import current_device
    from bridge_recipes.recipes.rates import run_rate

    name = entry.alias_of or entry.name
    if registry.measured(name) is None:
        return f"not estimated: {name} has no measured rate (--list shows the measured recipes)", None
    card, where = run_card(args, entry, current_device())
    scaled = args.scale_down is not None
    rate = run_rate(name, card, cfg, world=world, recipe_gpus=entry.meta.gpus, scaled=scaled)
    if rate.tokens_per_s_per_gpu is None:
        return rate.describe(), None
    seconds = expected_seconds(cfg, world, rate.tokens_per_s_per_gpu)
    return (
        f"about {duration(seconds)} of training steps on {world} GPU(s) at {rate.describe()} "
        f"({where}; {rate.costed + '; ' if rate.costed else ''}start-up and saving not included)"
    ), step_seconds(cfg, world, rate.tokens_per_s_per_gpu)


def run_card(args: argparse.Namespace, entry: registry.RecipeEntry, device: Any = None) -> tuple[str, str]:
    """The card a run's rate is for, as a key of the GPU table (another card: its name), and whence: the
    GPU here (``device``), else the card ``--gpu`` names, else the recipe's own."""
    from bridge_recipes.hardware.gpus import card_by_name, gpu_key, gpu_type_from_name

    if device is not None:
        try:
            return gpu_type_from_name(device.name), f"this GPU, {device.name}"
        except KeyError:
            return device.name, f"this GPU, {device.name}"
    if getattr(args, "gpu", None):
        return card_by_name(args.gpu).name, f"--gpu {args.gpu}; no GPU here"
    try:
        return gpu_key(entry.meta.gpu), "the recipe's GPU; no GPU here"
    except KeyError:
        return entry.meta.gpu, "the recipe's GPU; no GPU here"


def budgets_problem(args: argparse.Namespace) -> str | None:
    """Why --first-step-timeout or --step-timeout (given, or read from a config file) is no budget."""
    for option in ("--first-step-timeout", "--step-timeout"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and (problem := watchdog.budget_problem(option, value)):
            return problem
    return None


def budgets_of(args: argparse.Namespace) -> watchdog.Budgets:
    """The progress watch's budgets: --first-step-timeout and --step-timeout (checked by
    :func:`request_problem`), else the defaults."""
    default = watchdog.Budgets()
    first, later = args.first_step_timeout, args.step_timeout
    return watchdog.Budgets(
        first_step_s=default.first_step_s if first is None else float(first),
        step_s=default.step_s if later is None else float(later),
    )


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


def cap_this_gpu(cap_gb: float | None) -> None:
    """In the training process: cap the allocator where ``--gpu-memory-gb`` asks (the cap and, at exit,
    the peak against it are logged)."""
    import atexit

    from bridge_recipes.hardware import gpu_memory

    if gpu_memory.current_device() is None:
        return  # the launch names the missing GPU
    if cap_gb is not None:
        print(f"[run_recipe] {gpu_memory.cap(cap_gb)}", flush=True)
    atexit.register(lambda: print(f"[run_recipe] {gpu_memory.summary(cap_gb)}", flush=True))


def main(argv: list[str] | None = None, start_state: dict | None = None) -> int:
    # intermixed: KEY=VALUE tokens may come before, between or after the flags
    args = build_parser().parse_intermixed_args(argv)
    if args.list:
        entries = [e for e in registry.entries().values() if registry.matches(e, args.filter)]
        print(registry.table(sorted(entries, key=lambda e: (e.tree, e.name))))
        return 0
    if problem := request_problem(args):
        return fail(problem)
    print(
        f"[run_recipe] loading Megatron-Bridge and building {args.recipe or args.config_file}",
        file=sys.stderr,
        flush=True,
    )
    try:
        entry, cfg = build(args)
    except registry.UnknownRecipe as exc:
        return fail(str(exc))
    except (OverrideError, ValueError) as exc:
        return fail(str(exc))
    random_init = cfg.features.random_lora.enabled
    if random_init and (
        refused := random_lora.problems(cfg, hf_checkpoint=args.hf_checkpoint, export_hf=args.export_hf)
    ):
        return fail("; ".join(refused))
    if warning := mock_data_warning(cfg, entry.meta.task):
        print(warning, file=sys.stderr, flush=True)
    try:
        world = world_size_of(args, entry.meta.gpus)
    except ValueError as exc:
        return fail(str(exc))
    if problem := checks_problem(args, entry, cfg, world):
        return fail(problem)
    card_problem = named_card_problem(args.gpu, entry, cfg, world) if args.gpu is not None else None
    if args.plan:  # the plan first, then what the named card cannot run
        status = print_plan(args, entry, cfg, world)
        return fail(card_problem) if card_problem else status
    if card_problem:
        return fail(card_problem)
    from bridge_recipes.hf.run_hooks import random_init_warning

    warning = None if random_init else random_init_warning(cfg, entry.meta.task, args.hf_checkpoint)
    if warning and entry.meta.task == "peft" and cfg.peft is not None:
        # adapters on random weights learn nothing worth keeping: refused, dry run and launch alike
        return fail(warning)
    if args.dry_run:
        return dry_run(args, entry, cfg, world, warning)
    return launch_run(args, entry, cfg, world, start_state)


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
                _run_option(option, value, args.config_file)
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


def print_plan(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int) -> int:
    """--plan: the memory plan per pipeline stage, and where it does not fit the recipes that do; 0 when it fits."""
    from bridge_recipes.plan.memory import plan_report

    text, fits = plan_report(cfg, world, entry.meta.gpu, gpu_memory_gb=args.gpu_memory_gb)
    print(text)
    if args.scale_down is None and world == entry.meta.gpus:  # the rate is of the recipe as written
        print(plan_speed(args, entry, cfg, world, fits))
    if not fits:
        from bridge_recipes.hardware.gpus import class_memory_gb
        from bridge_recipes.recipes.gpu_fit import recipes_that_fit

        memory = args.gpu_memory_gb or class_memory_gb(entry.meta.gpu)
        if memory and (fitting := recipes_that_fit(entry, memory, world, build=_peer_builder(args))):
            mine = (
                " with your overrides"
                if args.overrides or any(getattr(args, d) is not None for d in FLAG_KEYS)
                else ""
            )
            print(f"recipes of this model and task planned to fit {memory:.1f} GB{mine}: {', '.join(fitting)}")
    return 0 if fits else USAGE_ERROR


def plan_speed(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int, fits: bool) -> str:
    """--plan's speed line: none for a configuration that does not fit; else the recipe's rate on the card
    planned for (--gpu's, else the recipe's own), measured or an estimate, and an epoch's time on rows."""
    from bridge_recipes.config.run_length import speed_line
    from bridge_recipes.recipes.rates import rate_on

    if not fits:
        return "speed: not estimated: this configuration does not fit (the plan above); no rate or epoch time"
    card, _ = run_card(args, entry)
    return speed_line(cfg, world, rate_on(entry.alias_of or entry.name, card, cfg))


def _peer_builder(args: argparse.Namespace):
    """How --plan builds another recipe to offer in place of one that does not fit: with the same flags,
    overrides, data and scale-down as the command line (a config file's settings are its recipe's own)."""
    request = {k: v for k, v in build_request(args).items() if k not in ("config_file", "hf_checkpoint")}

    def build_peer(name: str) -> Any:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            try:
                return bridge_recipes.build(name, **request, report=lambda change: None)
            except OverrideError as exc:
                raise ValueError(str(exc)) from None

    return build_peer


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


def dry_run(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int, warning: str | None) -> int:
    """--dry-run: the layout and what the run reads and writes, Megatron-Bridge's validation, and the
    config written where --save-config asks."""
    from bridge_recipes.runner import checks

    print(f"# {entry.name} ({entry.tree}, {entry.meta.task}); written for {entry.meta.gpus} x {entry.meta.gpu}")
    if entry.checkpoint is not None:
        rev = f" at revision {entry.checkpoint.revision}" if entry.checkpoint.revision else ""
        alias = f"; an alias of {entry.alias_of}" if entry.alias_of else ""
        print(f"# model: {entry.checkpoint.hf_id}{rev} ({entry.family}){alias}")
    print(checks.summary(cfg, world))
    if args.gpu_memory_gb is not None and (problem := cap_fit_problem(args, entry, cfg, world)):
        return fail(problem)  # before the summary: no expected time for a run that does not fit
    print(run_summary(cfg, entry, args, world))
    problem = megatron_validation(cfg, world)
    if problem:
        return fail(f"Megatron-Bridge rejects this config: {problem}")
    if warning:
        print(in_cli_terms(warning), file=sys.stderr)
    if cfg.features.random_lora.enabled:
        print(f"{random_lora.NOTE}; at launch the adapters go on the random weights and nothing is loaded")
    if args.show_yaml:
        cfg.print_yaml()
    if args.save_config:
        from bridge_recipes.config import files as config_files
        from bridge_recipes.utils.outputs import write_text_atomic

        run = {
            o: "true"
            if o in config_files.RUN_SWITCHES
            else os.path.abspath(v)
            if o in config_files.PATH_OPTIONS
            else f"{v:g}"
            for o in config_files.RUN_OPTIONS
            if o not in config_files.WATCH_OPTIONS and (v := getattr(args, o.replace("-", "_")))
        }
        budgets = budgets_of(args)
        run |= {"first-step-timeout": f"{budgets.first_step_s:g}", "step-timeout": f"{budgets.step_s:g}"}
        try:
            write_text_atomic(args.save_config, config_files.to_text(cfg, entry.name, run, written_for=True))
        except OSError as exc:  # a full disk, a file-size limit, a folder gone read-only: the old file stays
            kept = "the file there is as it was" if os.path.exists(args.save_config) else "nothing was written"
            return fail(
                f"--save-config {args.save_config}: cannot write it ({exc.strerror or exc}); {kept}: free some "
                "space or choose another path"
            )
        print(f"config: written to {args.save_config} (run it with --config-file {args.save_config})")
    print("checks: ok (layout checks and Megatron-Bridge validation passed)")
    return 0


def launch_run(
    args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int, start_state: dict | None
) -> int:
    """The launch: the machine's prerequisites, this GPU's fit, the recipe's environment (a re-exec, or
    --show-env's report of it), then training and the --export-hf export."""
    from bridge_recipes.runner import checks, environment

    if not args.show_env:
        from bridge_recipes.runner.prerequisites import launch_problems

        if missing := launch_problems(cfg):
            for line in missing:
                print(f"[run_recipe] {line}", file=sys.stderr)
            return fail(f"this machine cannot train {entry.name}: {len(missing)} thing(s) missing, listed above")
    if not args.show_env and (problem := fit_this_gpu(entry, cfg, args.gpu_memory_gb, world)):
        return fail(problem)
    environment.reexec_with(cfg.env_vars)  # returns only once the environment is in place
    if args.show_env:
        state = start_state or {}
        names = sorted(cfg.env_vars)
        report = {
            "reexecuted_from_pid": os.environ.get(environment.MARKER),
            "transformer_engine_imported_at_start": state.get("transformer_engine_imported"),
            "recipe_env_at_start": {k: (state.get("environ") or {}).get(k) for k in names},
        }
        print(json.dumps(report, indent=1))
        return 0
    cap_this_gpu(args.gpu_memory_gb)
    from bridge_recipes.runner import launch

    if args.hf_checkpoint:
        from bridge_recipes.hf.run_hooks import attach

        attach(cfg, args.hf_folder)  # checkpoint.pretrained_checkpoint: the run goes through finetune()
    for change in launch.prepare(cfg):  # what this machine changes, made and said before what runs is printed
        print(f"[run_recipe] {change}", flush=True)
    print(checks.summary(cfg, world))
    print(run_summary(cfg, entry, args, world), flush=True)
    if cfg.checkpoint.save and os.environ.get("RANK", "0") == "0":
        from bridge_recipes.training.saved_runs import run_identity, write_identity

        write_identity(cfg.checkpoint.save, run_identity(cfg, entry.name))  # what a later run is checked against
    launch.run(cfg, entry.meta.task, budgets_of(args))
    if args.export_hf:
        from bridge_recipes.hf.run_hooks import export_after_training

        return export_after_training(
            cfg,
            args.export_hf,
            str(args.hf_folder.path),
            bool(args.export_text_only),
            recipe=entry.name,
            scaled=args.scale_down is not None,
        )
    return 0
