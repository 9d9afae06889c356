"""The runner's argument parser and what its options translate into: the keywords of the build, the
world size the run is checked for, the progress watch's budgets, and the runner options a config file
records taken onto the parsed command line.

The lowest of the command line's modules, so it also holds what the others answer a usage error with:
:data:`USAGE_ERROR` and :func:`fail`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from bridge_recipes.config.builder import PEFT_SCHEMES
from bridge_recipes.config.overrides import FLAG_KEYS, flag_option, in_cli_terms
from bridge_recipes.features import random_lora
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
        setattr(args, dest, run_option_value(option, value, args.config_file))
        print(f"[run_recipe] --{option} {value} (from {args.config_file})")


def run_option_value(option: str, value: str | bool, path: str) -> Any:
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


def budgets_of(args: argparse.Namespace) -> watchdog.Budgets:
    """The progress watch's budgets: --first-step-timeout and --step-timeout (checked by
    :func:`bridge_recipes.runner.problems.request_problem`), else the defaults."""
    default = watchdog.Budgets()
    first, later = args.first_step_timeout, args.step_timeout
    return watchdog.Budgets(
        first_step_s=default.first_step_s if first is None else float(first),
        step_s=default.step_s if later is None else float(later),
    )
