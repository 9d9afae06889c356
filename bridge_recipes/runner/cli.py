"""Command line of scripts/run_recipe.py: list, build, override, check, dry-run, run.

The main flow: :func:`main` parses the command line (``runner.arguments``), refuses what is wrong with it
before anything is built (``runner.problems``), builds the config and checks it, then prints the plan or
the dry run (``runner.summaries``) or launches the training run (:func:`launch_run`).

Exit codes: 0 success, 2 bad input (unknown recipe, bad override, layout that cannot work),
anything else comes from the training run itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import bridge_recipes
from bridge_recipes.config.overrides import OverrideError
from bridge_recipes.features import random_lora
from bridge_recipes.recipes import registry
from bridge_recipes.runner.arguments import (
    budgets_of,
    build_parser,
    build_request,
    fail,
    take_run_options,
    world_size_of,
)
from bridge_recipes.runner.problems import (
    budgets_problem,
    checks_problem,
    fit_this_gpu,
    mock_data_warning,
    named_card_problem,
    request_problem,
)
from bridge_recipes.runner.summaries import dry_run, print_plan, run_summary


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
