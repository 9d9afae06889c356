"""The benchmark command of scripts/benchmark.py: run recipes, write result and ratio files."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bridge_recipes import runner_args
from bridge_recipes.bench.harness import PROXY_GLOBAL_BATCH, build_config, comparison, different_training
from bridge_recipes.bench.result import CAP_NOTE
from bridge_recipes.config.overrides import FLAG_KEYS, flag_option, in_cli_terms
from bridge_recipes.features import random_lora, te_wgrad
from bridge_recipes.recipes import registry
from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import write_text_atomic

DESCRIPTION = """Benchmark a recipe (and, side by side, a second one) and write OpenRecipes-shaped result files.

    # 8 GPUs, the recipe's own layout, window of steps 5..19 of a 20-step run
    python scripts/benchmark.py --recipe qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config --out results/x.yaml
    # one GPU, two policies compared in one session (proxy: fewer layers, per-GPU expert count)
    python scripts/benchmark.py --proxy-layers 4 --recipe A --against B --out results/a_vs_b.yaml

Each run is a separate ``torchrun scripts/run_recipe.py`` process; its full log is kept beside
the result file. With --against, both policies run back to back and a ratio file is written: the
tokens/s ratio and, where the two runs train the same model on the same rows, whether their loss
curves agree (validate_convergence rules).
Exit status 0 on success, 2 on bad input (a run that run_recipe.py refuses included: its errors are
printed), 1 when a run fails.
"""


# run_recipe.py's options that this command spells its own way; its other convenience flags are the
# KEY=VALUE overrides they stand for (bridge_recipes.config.overrides.FLAG_KEYS)
OWN_OPTIONS = {"--max-steps": "--steps", "--scale-down": "--proxy-layers", "--gpus": "--proxy-gpus"}
_FLAG_OF = {flag_option(dest): flag for dest, flag in FLAG_KEYS.items()}
_OPTION = re.compile(
    r"(?<![\w-])("
    + "|".join(re.escape(o) for o in sorted({*_FLAG_OF, *OWN_OPTIONS}, key=len, reverse=True))
    + r")(?![\w-])(?: ([-+.\w]+))?"
)
_VALUE = re.compile(r"[-+]?(\d[\w.+-]*|[A-Z]+)")  # a number, or a placeholder such as N


def in_benchmark_terms(message: str) -> str:
    """``message`` (from the checks this command shares with run_recipe.py) with the library's keywords and
    run_recipe.py's options spelt as this command takes them: its own option where it has one (``--steps``
    for ``--max-steps``), else the override the option stands for (``--warmup-iters 2`` ->
    ``scheduler.lr_warmup_iters=2``)."""

    def spelt(m: re.Match) -> str:
        option, value = m.group(1), m.group(2)
        if option in OWN_OPTIONS:
            return OWN_OPTIONS[option] + (f" {value}" if value else "")
        keys = _FLAG_OF[option].keys
        if value and _VALUE.fullmatch(value):
            return " ".join(f"{k}={value}" for k in keys)
        return " and ".join(keys) + (f" {value}" if value else "")

    return _OPTION.sub(spelt, in_cli_terms(message))


class RunRefused(RuntimeError):
    """A run whose run_recipe.py refused its arguments (bad input, exit status 2 here too)."""


def refusal(log_text: str) -> str | None:
    """The errors a run's ``run_recipe.py`` printed before it refused to run (its ``[run_recipe] error:``
    lines and its last ``run_recipe.py: error:`` line), or None when it printed none."""
    final = re.findall(r"run_recipe\.py: error: (.*)", log_text)
    if not final:
        return None
    return "; ".join([*dict.fromkeys(re.findall(r"\[run_recipe\] error: (.*)", log_text)), final[-1].strip()])


def planned_run(name: str, opts, extra: Sequence[str] = ()) -> tuple[dict, object]:
    """The bridge_recipes.build keywords of recipe ``name``'s benchmark run and the config they
    build (scale-down changes printed as the runner prints them); ``extra``: this run's own
    overrides (a candidate's), after the command's."""
    from bridge_recipes.bench import harness

    rows = opts.rows
    data = {"dataset": "sft-rows"} if rows else {}  # --rows: the packed rows replace the recipe's data
    overrides = [*([f"dataset.path={Path(rows).resolve()}"] if rows else []), *opts.overrides, *extra]
    request = harness.run_request(
        build_config(name, overrides=overrides, **data),
        steps=opts.steps,
        proxy_layers=opts.proxy_layers,
        extra=overrides,
        proxy_global_batch=opts.proxy_global_batch,
        proxy_gpus=opts.proxy_gpus,
    )
    request.update(data)
    return request, build_config(name, **request)


def gpus_of(name: str, opts) -> int:
    """GPUs a run takes: the proxy's (--proxy-gpus) or the recipe's own."""
    return opts.proxy_gpus if opts.proxy_layers else registry.find(name).meta.gpus


def runs_of(opts) -> list[tuple[str, str, list[str]]]:
    """(label, recipe, own overrides) of each run, in order: --recipe and --against.
    Raises UnknownRecipe or ValueError."""
    if not opts.recipe:
        raise ValueError("--recipe NAME is required")
    sets = list(opts.against_set or ())
    if sets and not opts.against:
        raise ValueError(f"--against-set {sets[0]}: changes the --against run; name it with --against RECIPE")
    names = [registry.find(n).name for n in filter(None, (opts.recipe, opts.against))]
    runs = [(n, n, []) for n in names]
    if sets:
        # the second run: its recipe, the command's overrides, then these (e.g. the same recipe, one field changed)
        runs[1] = (f"{names[1]} with {' '.join(sets)}", names[1], sets)
    return runs


def running_gpu() -> str:
    """The table type of the GPU this process sees (``"H100"`` for ``NVIDIA H100 80GB HBM3``), the one a
    result's runs ran on; RuntimeError naming ``--gpu`` when there is none or it is not in the table."""
    from bridge_recipes.hardware.gpu_memory import current_device
    from bridge_recipes.hardware.gpus import gpu_type_from_name

    device = current_device()
    if device is None:
        raise RuntimeError("no CUDA GPU to name the result by; pass --gpu TYPE")
    try:
        return gpu_type_from_name(device.name)
    except KeyError as exc:
        raise RuntimeError(f"{exc.args[0]}; pass --gpu TYPE") from None


def launch_args(request: dict, opts) -> list[str]:
    """``run_recipe.py`` arguments after ``--recipe NAME`` of a run's :func:`planned_run` request."""
    cap = ["--gpu-memory-gb", f"{opts.gpu_memory_gb:g}"] if opts.gpu_memory_gb is not None else []
    return runner_args(**request) + ([random_lora.OPTION] if opts.lora_from_random_init else []) + cap


def one(
    name: str, opts, out: Path, request: dict, cfg, label: str | None = None
) -> tuple[dict, object, dict[int, float]]:
    """Run and measure one recipe (its :func:`planned_run`): its result document, its config and
    its loss curve."""
    from bridge_recipes.bench import harness
    from bridge_recipes.bench.runs import launch

    entry = registry.find(name)
    # the result names the GPU it ran on unless --gpu names one
    gpu = opts.gpu or running_gpu()
    nproc = gpus_of(name, opts)
    args = launch_args(request, opts)
    log_path = out.with_suffix(".log")
    step_s = None if opts.proxy_layers else harness.published_step_seconds(cfg, entry)
    expect = f", ~{opts.steps * step_s / 60:.0f} min of steps at the published rate" if step_s else ""
    print(f"[benchmark] {name}: {nproc} GPU(s), {opts.steps} steps{expect}; log {log_path}", flush=True)
    run = launch(label or name, name, args, log_path, nproc=nproc)
    if run.returncode != 0 and (why := refusal(run.log)):
        raise RunRefused(f"{name}: run_recipe.py refused it (exit {run.returncode}): {why} (log: {log_path})")
    if run.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {run.returncode}); see {log_path}")
    if cfg.model.gradient_accumulation_fusion and not te_wgrad.ran_fused(cfg, run.log):
        # a run that asked for fusion and went without measured another policy than it names
        raise RuntimeError(
            f"{name} asked for gradient-accumulation fusion and ran without it: "
            f"{harness.fusion_note(cfg, run.log)}; see {log_path}"
        )
    command = f"torchrun --nproc-per-node {nproc} scripts/run_recipe.py --recipe {name} {shlex.join(args)}"
    doc = harness.write(
        out,
        recipe=name,
        cfg=cfg,
        log_text=run.log,
        world_size=nproc,
        gpu=gpu,
        window=tuple(opts.window),
        command=command,
        proxy=bool(opts.proxy_layers),
        notes=[
            *([random_lora.NOTE] if opts.lora_from_random_init else []),
            *([f"{CAP_NOTE} {opts.gpu_memory_gb:g} GB"] if opts.gpu_memory_gb is not None else []),
        ]
        or None,
    )
    r = doc["result"]
    print(
        f"[benchmark] {name}: {r['tokens_per_s_per_gpu']} tokens/s/GPU, MFU {r['mfu']}, "
        f"CV {r['step_time_cv_percent']}%"
    )
    return doc, cfg, run.losses


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    quiet.add_flag(ap)
    ap.add_argument("--recipe")
    ap.add_argument("--against", help="a second recipe measured right after, for a ratio")
    ap.add_argument(
        "--against-set",
        action="append",
        metavar="KEY=VALUE",
        help="an override of the --against run only, after the command's (repeatable): e.g. the same recipe with "
        "one field changed",
    )
    ap.add_argument("--proxy-layers", type=int, help="one-GPU proxy with this many layers (multiple of 4)")
    ap.add_argument(
        "--proxy-global-batch",
        type=int,
        default=PROXY_GLOBAL_BATCH,
        help=f"micro batches per step in proxy mode, the same for both policies (default {PROXY_GLOBAL_BATCH})",
    )
    ap.add_argument(
        "--proxy-gpus",
        type=int,
        default=1,
        help="GPUs of the proxy (2: keeps what fits of the recipe's layout, e.g. EP2, and its per-GPU experts)",
    )
    ap.add_argument(
        "--rows",
        metavar="DIR",
        help="packed SFT rows (scripts/build_sft_rows.py) both runs train on instead of mock data",
    )
    ap.add_argument(
        random_lora.OPTION,
        action="store_true",
        help="LoRA recipes on random base weights instead of a checkpoint (their speed and memory; the result "
        "says so); the runs keep nothing",
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--window", type=int, nargs=2, default=[5, 19], metavar=("FIRST", "LAST"))
    ap.add_argument(
        "--gpu-memory-gb",
        type=float,
        metavar="GB",
        help="each run within GB of the GPU's memory (the runner's --gpu-memory-gb: a smaller card's memory)",
    )
    ap.add_argument(
        "--gpu",
        default=None,
        help="GPU type of the result and its peak FLOP/s (h100, h200, b200, gb200, gb300); default: the running one",
    )
    ap.add_argument("--out", help="result file (.yaml); logs are written beside it")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return ap


def steps_problems(steps: int, window: Sequence[int]) -> list[str]:
    """What is wrong with ``--steps`` and ``--window FIRST LAST`` (1-based, inclusive)."""
    out = []
    if steps < 1:
        out.append(f"--steps {steps}: run at least one step")
    first, last = window
    if not 1 <= first <= last:
        out.append(f"--window {first} {last}: need 1 <= FIRST <= LAST")
    elif last > steps:
        out.append(f"--window ends at step {last} but only {steps} steps run; raise --steps or lower LAST")
    return out


def gpu_problems(name: str, cfg, nproc: int, cap_gb: float | None) -> list[str]:
    """Why recipe ``name``'s run ``cfg`` on ``nproc`` GPUs cannot run on the GPU here (within ``cap_gb``),
    as its run_recipe.py would refuse it at launch (:func:`bridge_recipes.recipes.gpu_fit.problems`); none without
    a GPU."""
    from bridge_recipes.hardware.gpu_memory import cap_problem, current_device
    from bridge_recipes.recipes import gpu_fit

    device = current_device()
    if device is None:
        return []
    if cap_gb is not None and (problem := cap_problem(cap_gb, device)):
        return [problem]
    return gpu_fit.problems(registry.find(name), cfg, device, cap_gb, nproc)


def argument_problems(opts, runs: list[tuple[str, str, list[str]]]) -> tuple[list[str], list[tuple[dict, object]]]:
    """Everything wrong with the arguments that can be known before a run starts: step counts,
    the window, the GPU type, the proxy size, the output path, and each recipe's config as the
    run would build it (scale-down, overrides and value ranges); and each recipe's
    :func:`planned_run`, built once here for the run."""
    from bridge_recipes.config.overrides import OverrideError
    from bridge_recipes.config.values import value_problems
    from bridge_recipes.hardware.gpu_memory import cap_value_problem
    from bridge_recipes.hardware.gpus import GPUS
    from bridge_recipes.utils.outputs import output_problem

    out = steps_problems(opts.steps, opts.window)
    if opts.gpu_memory_gb is not None and (problem := cap_value_problem(opts.gpu_memory_gb)):
        out.append(problem)
    if opts.gpu is not None and opts.gpu.upper() not in GPUS:
        out.append(f"--gpu {opts.gpu}: unknown; choose one of {', '.join(g.lower() for g in GPUS)}")
    if opts.proxy_layers is not None and (opts.proxy_layers < 4 or opts.proxy_layers % 4):
        out.append(f"--proxy-layers {opts.proxy_layers}: a positive multiple of 4 (the GDN/attention period)")
    if opts.proxy_gpus < 1 or (opts.proxy_gpus > 1 and not opts.proxy_layers):
        out.append(f"--proxy-gpus {opts.proxy_gpus}: at least 1, and more than 1 only with --proxy-layers")
    if opts.proxy_global_batch < 1:
        out.append(f"--proxy-global-batch {opts.proxy_global_batch}: at least 1")
    problem = output_problem(opts.out, option="--out", inputs=[("--rows", opts.rows)] if opts.rows else [])
    if problem:
        out.append(problem)
    plans: list[tuple[dict, object]] = []
    if out:
        return out, plans
    for label, name, extra in runs:
        try:
            plans.append(planned_run(name, opts, extra))
        except (OverrideError, ValueError) as exc:
            out.append(f"{label}: {exc}")
            continue
        nproc = gpus_of(name, opts)
        out += [f"{label}: {p}" for p in value_problems(plans[-1][1], nproc)]
        if opts.lora_from_random_init:
            out += [f"{label}: {p}" for p in random_lora.problems(plans[-1][1])]
        out += [f"{label}: {p}" for p in gpu_problems(name, plans[-1][1], nproc, opts.gpu_memory_gb)]
    if opts.rows:
        # the runner's own dry-run check of the rows against each run's model (once per distinct message)
        from bridge_recipes.data.packed_rows import dry_run_problems

        found = dict.fromkeys(p for _, cfg in plans for p in dry_run_problems(cfg)[0])
        out += [f"--rows {opts.rows}: {p}" for p in found]
    return out, plans


def main(argv: list[str] | None = None) -> int:
    """The command."""
    ap = build_parser()
    return run_parsed(ap.parse_intermixed_args(argv), ap)


def run_parsed(
    opts: argparse.Namespace,
    ap: argparse.ArgumentParser,
    *,
    runs: Callable[[argparse.Namespace], list[tuple[str, str, list[str]]]] = runs_of,
) -> int:
    """The command on options ``ap`` parsed; a caller that extends :func:`build_parser` with options
    naming the runs another way parses once and passes its own ``runs``."""
    if not opts.out:
        ap.error("--out FILE is required (the result file)")
    try:
        planned = runs(opts)
    except (registry.UnknownRecipe, ValueError) as exc:
        ap.error(in_benchmark_terms(str(exc)))
    problems, plans = argument_problems(opts, planned)
    if problems:
        ap.error(in_benchmark_terms("; ".join(problems)))
    out = Path(opts.out)
    names = [label for label, _, _ in planned]
    try:
        docs = [
            one(name, opts, out if i == 0 else out.with_name(out.stem + "_against.yaml"), *plans[i], label=label)
            for i, (label, name, _) in enumerate(planned)
        ]
    except RunRefused as exc:
        print(f"benchmark.py: error: {in_benchmark_terms(str(exc))}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"benchmark.py: {exc}", file=sys.stderr)
        return 1
    if len(docs) == 2:
        (cand, cand_cfg, cand_losses), (ref, ref_cfg, ref_losses) = docs
        losses = different_training(cand_cfg, ref_cfg) or (cand_losses, ref_losses)
        ratio = comparison(cand, ref, proxy=bool(opts.proxy_layers), losses=losses)
        if opts.against_set:
            ratio["reference_overrides"] = list(opts.against_set)  # what the reference ran beyond its recipe
        write_text_atomic(out.with_name(out.stem + "_ratio.json"), json.dumps(ratio, indent=1) + "\n")
        print(
            f"[benchmark] ratio {names[0]} / {names[1]} = {ratio['tokens_per_s_ratio']}"
            + (
                f"; forward-backward per token {ratio['forward_backward_per_token_ratio']}"
                if "forward_backward_per_token_ratio" in ratio
                else ""
            )
        )
        agree = ratio["loss_curves"]
        print(
            "[benchmark] loss curves: "
            + (
                agree["why"]
                if not agree["compared"]
                else f"correlation {agree['correlation']:.6f}, "
                f"final-loss difference {agree['final_loss_difference']:.2%}, "
                f"{agree['pointwise_failures']} point-wise failures: {'agree' if agree['passed'] else 'DIFFER'}"
            )
        )
    return 0
