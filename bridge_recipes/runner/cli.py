"""Command line of scripts/run_recipe.py: list, build, override, check, dry-run, run.

Exit codes: 0 success, 2 bad input (unknown recipe, bad override, layout that cannot work),
anything else comes from the training run itself.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from typing import Any

import bridge_recipes
from bridge_recipes import quiet, registry
from bridge_recipes.builder import PEFT_SCHEMES
from bridge_recipes.features import random_lora
from bridge_recipes.overrides import (
    FLAG_KEYS,
    OverrideError,
    flag_option,
    flag_overrides,
    in_cli_terms,
    precheck,
    range_precheck,
)

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
        help="train within GB of the GPU's memory (GB = 1e9 bytes; e.g. an 80 or 48 GB card's, on a larger GPU): "
        "the allocator is capped and --plan plans for it",
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
    p.add_argument("--export-hf", metavar="DIR", help="after training, write the final checkpoint as a HF folder here")
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
    }


def save_config_problem(args: argparse.Namespace) -> str | None:
    """Why --save-config cannot be written (checked before any work), or None."""
    from bridge_recipes.outputs import output_problem

    if not args.dry_run:
        return "--save-config needs --dry-run (it writes the resolved config instead of launching)"
    inputs = [("--config-file", args.config_file), ("--hf-checkpoint", args.hf_checkpoint)]
    problem = output_problem(args.save_config, option="--save-config", inputs=[i for i in inputs if i[1]])
    if not problem and os.path.exists(args.save_config) and not args.overwrite_config:
        problem = f"--save-config {args.save_config} exists; pass --overwrite-config to replace it"
    return problem


def build(args: argparse.Namespace) -> tuple[registry.RecipeEntry, Any]:
    if args.config_file:
        from bridge_recipes.config_files import recipe_of, run_options

        args.recipe = recipe_of(args.config_file, args.recipe)
        # the saved run's weights and export folder, unless the command line names others
        for option, value in run_options(args.config_file).items():
            dest = option.replace("-", "_")
            if getattr(args, dest) is None:
                setattr(args, dest, value)
                print(f"[run_recipe] --{option} {value} (from {args.config_file})")
    entry = registry.find(args.recipe)
    if args.hf_checkpoint and args.pretrained_checkpoint:
        raise ValueError("--hf-checkpoint and --pretrained-checkpoint both name the starting weights; pass one")
    cfg = bridge_recipes.build(
        args.recipe, **build_request(args), report=lambda change: print(f"[run_recipe] {change}")
    )
    if args.hf_checkpoint:
        from bridge_recipes.hf import training as hf_training
        from bridge_recipes.runner.checks import fp8_parameter_problems

        args.hf_folder = hf_training.inspect(args.hf_checkpoint)
        from bridge_recipes.hf.checkpoint import cache_problem

        if problem := cache_problem(args.hf_folder):  # the launch converts into it
            raise ValueError(problem)
        from bridge_recipes.outputs import overlap_problem

        inputs = [("--hf-checkpoint", args.hf_checkpoint)]
        if cfg.checkpoint.save and (
            problem := overlap_problem(cfg.checkpoint.save, option="checkpoint.save", inputs=inputs)
        ):
            raise ValueError(problem)
        # the launch attaches the converted weights after the layout checks: what depends on them is checked now
        if problems := fp8_parameter_problems(cfg, weights=str(args.hf_checkpoint)):
            raise ValueError(problems[0])
    if args.export_hf:
        from bridge_recipes.hf import training as hf_training

        if not args.hf_checkpoint:
            raise ValueError("--export-hf needs --hf-checkpoint (its config and tokenizer template the export)")
        hf_training.check_export_target(cfg, args.export_hf)
    return entry, cfg


def mock_data_warning(cfg: Any, task: str) -> str | None:
    """The warning for a fine-tuning run (SFT, or any with PEFT) that would read mock data."""
    from bridge_recipes.datasets import is_mock, real_data

    if (task in ("sft", "peft") or cfg.peft is not None) and is_mock(cfg):
        return (
            f"WARNING: this {task if cfg.peft is None else 'PEFT'} run trains on MOCK data (generated samples, "
            f"nothing to learn): pass {real_data(cfg)}"
        )
    return None


def run_summary(cfg: Any, entry: registry.RecipeEntry, args: argparse.Namespace) -> str:
    """What the run reads and writes: data, PEFT, the starting weights, the save and export folders."""
    from bridge_recipes.datasets import describe

    peft = cfg.peft
    if peft is None:
        adapters = "none (all weights train)"
    else:
        targets = ", ".join(getattr(peft, "target_modules", []) or [])
        adapters = f"{type(peft).__name__} rank {getattr(peft, 'dim', '?')}, alpha {getattr(peft, 'alpha', '?')}"
        adapters += f" on {targets}" if targets else ""
    ckpt = cfg.checkpoint
    if cfg.features.random_lora.enabled:
        weights = random_lora.NOTE.removeprefix("base weights: ")
    elif args.hf_checkpoint:
        from bridge_recipes.hf.training import cache_folder

        weights = (
            f"{args.hf_folder.path} (Hugging Face; converted at launch into {cache_folder(args.hf_folder)}, "
            "or reused from there)"
        )
    elif ckpt.pretrained_checkpoint:
        weights = f"{ckpt.pretrained_checkpoint} (Megatron checkpoint)"
    else:
        weights = "random initialization"
        if entry.checkpoint is not None:
            weights += f" (--hf-checkpoint DIR starts from {entry.checkpoint.hf_id}'s weights)"
    if ckpt.load and ckpt.load != ckpt.pretrained_checkpoint:
        weights += f"; resumes from {ckpt.load} when it holds a checkpoint"
    save = f"{ckpt.save} (every {ckpt.save_interval} steps)" if ckpt.save else "none (nothing is saved)"
    export = f"{args.export_hf} (a Hugging Face folder, after training)" if args.export_hf else "none"
    return "\n".join(
        [
            f"data              {describe(cfg)}",
            f"peft              {adapters}",
            f"weights           {weights}",
            f"save              {save}",
            f"export            {export}",
        ]
    )


def fit_this_gpu(entry: registry.RecipeEntry, cfg: Any, cap_gb: float | None, world: int) -> str | None:
    """In the training process, before launch: why the recipe cannot run on this GPU (or within
    ``--gpu-memory-gb``), or None after capping the allocator where asked (the cap and, at exit, the
    peak against it are logged)."""
    import atexit

    from bridge_recipes import gpu_memory
    from bridge_recipes.runner import gpu_fit

    device = gpu_memory.current_device()
    if cap_gb is not None and (problem := gpu_memory.cap_problem(cap_gb, device)):
        return problem
    if device is None:
        return None  # the launch names the missing GPU
    if found := gpu_fit.problems(entry, cfg, device, cap_gb, world):
        return "; ".join(found)
    if cap_gb is not None:
        print(f"[run_recipe] {gpu_memory.cap(cap_gb)}", flush=True)
    atexit.register(lambda: print(f"[run_recipe] {gpu_memory.summary(cap_gb)}", flush=True))
    return None


def main(argv: list[str] | None = None, start_state: dict | None = None) -> int:
    # intermixed: KEY=VALUE tokens may come before, between or after the flags
    args = build_parser().parse_intermixed_args(argv)
    if args.list:
        entries = [e for e in registry.entries().values() if registry.matches(e, args.filter)]
        print(registry.table(sorted(entries, key=lambda e: (e.tree, e.name))))
        return 0
    if problem := request_problem(args):
        return fail(problem)
    if args.dry_run or args.plan:
        from bridge_recipes.patches import lazy_inits

        lazy_inits.install()  # this process builds and checks, it never trains
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
    if args.plan:
        return print_plan(args, entry, cfg, world)
    from bridge_recipes.hf.training import random_init_warning

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
    if args.gpu_memory_gb is not None:
        from bridge_recipes.gpu_memory import cap_value_problem

        if problem := cap_value_problem(args.gpu_memory_gb):
            return problem
    from bridge_recipes.features import replaced_env_problems

    if replaced := replaced_env_problems(None):  # a process environment variable a config key replaced
        return "; ".join(replaced)
    try:  # what needs no Megatron import is answered before it
        precheck(args.overrides)
        range_precheck(flag_overrides(vars(args)))
        if args.recipe:
            registry.find(args.recipe)
    except (OverrideError, registry.UnknownRecipe) as exc:
        return str(exc)
    from bridge_recipes.installed import training_stack_problem

    return training_stack_problem("a dry run, --plan or a launch")


def checks_problem(args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int) -> str | None:
    """The layout checks (each printed) and the patches' refusals for ``world`` GPUs: why the run cannot go on."""
    from bridge_recipes.runner import checks

    problems = checks.check(cfg, world)
    for p in problems:
        print(f"[run_recipe] {p}", file=sys.stderr)
    if checks.errors(problems):
        hint = ""
        if args.hf_checkpoint and args.scale_down is None:
            from bridge_recipes.hf.training import layers_and_experts

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
    if not fits:
        from bridge_recipes.gpus import class_memory_gb
        from bridge_recipes.runner.gpu_fit import recipes_that_fit

        memory = args.gpu_memory_gb or class_memory_gb(entry.meta.gpu)
        if memory and (fitting := recipes_that_fit(entry, memory, world)):
            print(f"recipes of this model and task planned to fit {memory:.1f} GB: {', '.join(fitting)}")
    return 0 if fits else USAGE_ERROR


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
    print(run_summary(cfg, entry, args))
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
        from bridge_recipes import config_files
        from bridge_recipes.outputs import write_text_atomic

        run = {o: os.path.abspath(v) for o in config_files.RUN_OPTIONS if (v := getattr(args, o.replace("-", "_")))}
        write_text_atomic(args.save_config, config_files.to_text(cfg, entry.name, run))
        print(f"config: written to {args.save_config} (run it with --config-file {args.save_config})")
    print("checks: ok (layout checks and Megatron-Bridge validation passed)")
    return 0


def launch_run(
    args: argparse.Namespace, entry: registry.RecipeEntry, cfg: Any, world: int, start_state: dict | None
) -> int:
    """The launch: the machine's prerequisites, the recipe's environment (a re-exec, or --show-env's
    report of it), this GPU's fit, then training and the --export-hf export."""
    from bridge_recipes.runner import checks, environment

    if not args.show_env:
        from bridge_recipes.runner.prerequisites import launch_problems

        if missing := launch_problems(cfg):
            for line in missing:
                print(f"[run_recipe] {line}", file=sys.stderr)
            return fail(f"this machine cannot train {entry.name}: {len(missing)} thing(s) missing, listed above")
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
    if problem := fit_this_gpu(entry, cfg, args.gpu_memory_gb, world):
        return fail(problem)
    from bridge_recipes.runner import launch

    if args.hf_checkpoint:
        from bridge_recipes.hf.training import attach

        attach(cfg, args.hf_folder)  # checkpoint.pretrained_checkpoint: the run goes through finetune()
    for change in launch.prepare(cfg):  # what this machine changes, made and said before what runs is printed
        print(f"[run_recipe] {change}", flush=True)
    print(checks.summary(cfg, world))
    print(run_summary(cfg, entry, args), flush=True)
    launch.run(cfg, entry.meta.task)
    if args.export_hf:
        from bridge_recipes.hf.training import export_after_training

        return export_after_training(cfg, args.export_hf, str(args.hf_folder.path))
    return 0
