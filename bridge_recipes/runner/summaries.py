"""What the runner prints about a built run: the summary of what it reads and writes and how long it
takes (printed by the dry run and at launch), the dry run itself with its --save-config file, and
--plan's memory plan and speed line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import bridge_recipes
from bridge_recipes.config.overrides import FLAG_KEYS, OverrideError, in_cli_terms
from bridge_recipes.features import random_lora
from bridge_recipes.recipes import registry
from bridge_recipes.runner.arguments import USAGE_ERROR, budgets_of, build_request, fail
from bridge_recipes.runner.problems import cap_fit_problem, megatron_validation


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
