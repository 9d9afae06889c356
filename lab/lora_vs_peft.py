"""Each one-GPU LoRA recipe at its released size and its transformers + PEFT peer, back to back on
one GPU: the same rows, the same tokens per step, the same steps and window.

    python -m lab.lora_vs_peft --rows DIR --out lab/results/single_gpu_lora_vs_peft.json
    python -m lab.lora_vs_peft --rows DIR --dry-run   # on a CPU: checks, trains nothing
    python -m lab.lora_vs_peft --rows DIR --work DIR --assemble --out FILE
                                           # the comparison of runs already in --work; trains nothing

For each recipe (default :data:`RECIPES`), in this order:

- ours: ``scripts/benchmark.py --recipe NAME --rows DIR --lora-from-random-init`` (the recipe's own
  layout on its one GPU, random base weights: :mod:`bridge_recipes.features.random_lora`), its result
  file and log in ``--work``;
- the peer: ``python -m lab.peer_peft`` with the same recipe, rows, overrides,
  steps and window, in a process of its own (its JSON and log in ``--work``); once for recipes
  whose peer workload is the same (a variant that changes only ours' execution shares its base's).
  Each peer configuration of ``--peer-stack`` (default :data:`lab.peer_peft.BY_EXPECTED_SPEED`:
  Unsloth, Liger, plain transformers + PEFT) is tried in that order until one gives figures
  (``--all-peer-stacks``: every one); each tried is recorded in ``peers`` with what it reached
  (tokens/s, peak) or why it gave none: ``out of memory``, ``not installed`` (its packages do not
  import on the host: not a failure of the comparison) or ``failed``. The line's peer figures
  and ``best_peer`` are those of the fastest that ran; configurations never tried are absent;
- the planner: :func:`bridge_recipes.plan.memory.plan_memory` of the config ours runs: its peak
  allocated memory (``planner_gb``, the figure a measured peak is compared with) and that plus the
  framework overhead (``planner_total_gb``, the recipes' docstring figure).

Both run ``--global-batch`` rows per step instead of the recipes' 128 (by default one of ours' micro
batches, at least :data:`GLOBAL_BATCH` rows: :func:`step_rows`): the peer trains one row per micro
batch either way, so each row costs it the same; the optimizer step, over adapters only, is amortized
over fewer rows. A ``--gpu-memory-gb`` cap below what a recipe is planned to need is refused
before anything runs, naming the recipes of the model planned to fit it. ``--out`` is a JSON list
of :data:`FIELDS` and a few
more per recipe (tokens/s ratio, step-time spread, useful-token share, errors), rewritten after each
recipe so that a run cut short keeps what finished. A run that fails is recorded with its error and
the next one runs; a peer that runs out of memory is recorded as not fitting (``peer_fits`` false),
an answer rather than a failure. ``--dry-run`` runs ours' runner dry run with the exact launch
arguments, the planner, and the peer's ``--dry-run`` (full model and adapters on the meta device): what fails on
the GPU host for a reason a CPU can see fails here. Exit status 0 when every run gave figures,
1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bridge_recipes.config.datasets import row_tokens, rows_per_sequence, rows_per_step
from bridge_recipes.utils.outputs import write_text_atomic
from lab import ROOT
from lab.peer_peft import BY_EXPECTED_SPEED

RECIPES = ("qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config")
GLOBAL_BATCH = 2  # the fewest rows per step of both runs (16,384 tokens), in place of the recipes' 128
FIELDS = (
    "model",
    "ours_tokens_per_s",
    "peer_tokens_per_s",
    "ours_peak_gb",
    "peer_peak_gb",
    "planner_gb",
    "steps",
    "row_tokens",
    "peer_stack",
)
LOG = "[lora_vs_peft]"
# lines of the peer's and the runner's output shown as they come (the rest goes to the logs only)
SHOWN = ("[peer]", "peer_peft:", "run_recipe.py: error", "checks: ok", "base weights:")


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def benchmark_argv(recipe: str, opts: argparse.Namespace, out: Path) -> list[str]:
    """``scripts/benchmark.py`` arguments of ours' run of ``recipe``."""
    from bridge_recipes.features import random_lora

    return [
        "--recipe",
        recipe,
        "--rows",
        str(opts.rows),
        random_lora.OPTION,
        "--steps",
        str(opts.steps),
        "--window",
        *map(str, opts.window),
        "--out",
        str(out),
        *cap_args(recipe, opts),
        *overrides(recipe, opts),
    ]


def memory_cap(recipe: str, opts: argparse.Namespace) -> float | None:
    """The GB both runs of ``recipe`` train within: ``--gpu-memory-gb`` (``auto``: the memory of the
    recipe's GPU), or None."""
    if opts.gpu_memory_gb is None:
        return None
    if opts.gpu_memory_gb == "auto":
        from bridge_recipes.hardware.gpus import class_memory_gb
        from bridge_recipes.recipes import registry

        return class_memory_gb(registry.find(recipe).meta.gpu)
    return float(opts.gpu_memory_gb)


def cap_args(recipe: str, opts: argparse.Namespace) -> list[str]:
    cap = memory_cap(recipe, opts)
    return [] if cap is None else ["--gpu-memory-gb", f"{cap:g}"]


def peer_argv(recipe: str, opts: argparse.Namespace, out: Path | None, stack: str | None = None) -> list[str]:
    """``python -m lab.peer_peft`` arguments of the peer of ``recipe`` (``out``
    None: its dry run) in configuration ``stack`` (None: the peer's default)."""
    return [
        "--recipe",
        recipe,
        *(["--peer-stack", stack] if stack else []),
        "--rows",
        str(opts.rows),
        "--steps",
        str(opts.steps),
        "--window",
        *map(str, opts.window),
        *(["--out", str(out)] if out else ["--dry-run"]),
        *cap_args(recipe, opts),
        *overrides(recipe, opts),
    ]


def step_rows(recipe: str, opts: argparse.Namespace) -> int:
    """The rows per step both runs of ``recipe`` train: ``--global-batch``, or else one of ours' micro
    batches (the recipe's rows per micro batch with the command's overrides), at least
    :data:`GLOBAL_BATCH`: a step of ours is then never cut below one micro batch."""
    from lab import peer_peft

    if opts.global_batch is not None:
        return opts.global_batch
    try:
        cfg = peer_peft.workload_config(recipe, opts.rows, opts.overrides)
    except peer_peft.PeerError:
        return GLOBAL_BATCH  # the runs name the problem
    return max(GLOBAL_BATCH, cfg.train.micro_batch_size * rows_per_sequence(cfg))


def overrides(recipe: str, opts: argparse.Namespace) -> list[str]:
    """The recipe overrides both runs get: the rows per step, then the command's KEY=VALUE."""
    return [f"train.global_batch_size={step_rows(recipe, opts)}", *opts.overrides]


def peer_out(work: Path, recipe: str, stack: str) -> Path:
    """The result file of the peer of ``recipe`` in configuration ``stack`` (the plain one keeps
    the name it always had)."""
    from lab.peer_peft import DEFAULT_STACK

    return work / (f"{recipe}_peer.json" if stack == DEFAULT_STACK else f"{recipe}_peer_{stack}.json")


OUTCOMES = ("ran", "out of memory", "not installed", "failed")


def peer_outcome(doc: dict) -> str:
    """What a peer run came to (:data:`OUTCOMES`): figures, out of memory, its packages not
    installed on the host, or another failure."""
    if (doc.get("result") or {}).get("tokens_per_s"):
        return "ran"
    if "out of memory" in str(doc.get("error") or ""):
        return "out of memory"
    if doc.get("not_installed"):
        return "not installed"
    return "failed"


def peer_record(stack: str, doc: dict) -> dict:
    """One configuration tried: its name, outcome, and its figures or why it gave none."""
    r = doc.get("result") or {}
    out = {"stack": stack, "outcome": peer_outcome(doc)}
    if out["outcome"] == "ran":
        out.update(tokens_per_s=r.get("tokens_per_s"), peak_gb=r.get("peak_allocated_gb"))
        if doc.get("cut_short"):
            out["cut_short"] = doc["cut_short"]
    else:
        out["why"] = doc.get("not_installed") or doc.get("error")
    if doc.get("peer_stack"):
        out["peer_stack"] = doc["peer_stack"]
    return out


def best_peer(tried: list[tuple[str, dict]]) -> tuple[str, dict] | None:
    """The configuration with the most tokens/s among those that ran, or None."""
    ran = [(stack, doc) for stack, doc in tried if peer_outcome(doc) == "ran"]
    return max(ran, key=lambda t: t[1]["result"]["tokens_per_s"], default=None)


def cap_problem(recipe: str, opts: argparse.Namespace) -> str | None:
    """Why ours cannot run ``recipe`` within the command's memory cap (the planner's peak over it),
    naming the recipes of its model and task planned to fit; None without a cap or when it fits."""
    from bridge_recipes.plan.memory import plan_memory
    from bridge_recipes.recipes import registry
    from bridge_recipes.recipes.gpu_fit import recipes_that_fit
    from lab import peer_peft

    cap = memory_cap(recipe, opts)
    if cap is None:
        return None
    import bridge_recipes
    from bridge_recipes.config.overrides import OverrideError

    try:
        cfg = peer_peft.workload_config(recipe, opts.rows, overrides(recipe, opts))
    except peer_peft.PeerError:
        try:  # rows the recipe refuses: the config without them, which the memory plan does not read
            cfg = bridge_recipes.build(recipe, overrides=overrides(recipe, opts))
        except (OverrideError, ValueError):
            return None  # the benchmark's own checks name the problem
    plan = plan_memory(cfg, 1, gpu_memory_gb=cap)
    if plan.fits:
        return None
    entry = registry.find(recipe)
    fitting = recipes_that_fit(entry, cap, 1)
    return f"--gpu-memory-gb {cap:g}: {recipe} is planned at {plan.peak_gb:.1f} GB, more than the cap; " + (
        f"recipes of {entry.model} planned to fit {cap:g} GB: {', '.join(fitting)}"
        if fitting
        else f"no one-GPU LoRA recipe of {entry.model} is planned to fit {cap:g} GB; raise the cap"
    )


def planned(recipe: str, opts: argparse.Namespace, out: Path) -> tuple[list[str], Any, Any]:
    """Ours' run as ``scripts/benchmark.py`` plans it: the runner arguments it launches, its
    config, and the planner's memory plan of that config on one H200. Raises ValueError on bad input."""
    from bridge_recipes.bench import benchmark
    from bridge_recipes.plan.memory import plan_memory

    bench_opts = benchmark.build_parser().parse_intermixed_args(benchmark_argv(recipe, opts, out))
    problems, plans = benchmark.argument_problems(bench_opts, benchmark.runs_of(bench_opts))
    if problems:
        raise ValueError("; ".join(problems))
    request, cfg = plans[0]
    return benchmark.launch_args(request, bench_opts), cfg, plan_memory(cfg, 1, gpu_memory_gb=memory_cap(recipe, opts))


def streamed(cmd: list[str], log_path: Path) -> int:
    """Run ``cmd`` from the repository root, its output both printed and written to ``log_path``."""
    with open(log_path, "a", buffering=1) as log:  # line by line: a run cut short keeps its log
        log.write(f"\n===== {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout or ():
            log.write(line)
            if line.startswith(SHOWN):
                print(line, end="", flush=True)
        return proc.wait()


def run_ours(recipe: str, opts: argparse.Namespace, out: Path) -> dict:
    """Ours' benchmark run of ``recipe``: its result document (scripts/benchmark.py's), or
    ``{"error": ...}``."""
    from bridge_recipes.bench import benchmark
    from bridge_recipes.bench.result import read_result

    try:
        code = benchmark.main(benchmark_argv(recipe, opts, out))
    except SystemExit as exc:  # its argument errors
        code = exc.code if isinstance(exc.code, int) else 2
    if code != 0 or not out.is_file():
        return {"error": f"scripts/benchmark.py exited {code}; see {out.with_suffix('.log')}"}
    return read_result(out)


def run_peer(
    recipe: str, opts: argparse.Namespace, out: Path, useful_share: float | None, stack: str | None = None
) -> dict:
    """The peer's run of ``recipe`` (configuration ``stack``) in its own process: its result JSON, or
    ``{"error": ...}`` (with the figures of the steps its log holds when it stopped part way), or
    ``{"not_installed": ...}`` when the configuration's packages do not import."""
    from lab.peer_peft import NOT_INSTALLED

    cmd = [sys.executable, "-m", "lab.peer_peft", *peer_argv(recipe, opts, out, stack)]
    out.unlink(missing_ok=True)
    out.with_suffix(".log").unlink(missing_ok=True)
    code = streamed(cmd, out.with_suffix(".log"))
    doc = peer_document(out, tuple(opts.window), useful_share)
    if code == NOT_INSTALLED and doc.get("not_installed"):
        doc.pop("error", None)
    elif code != 0:
        own = json.loads(out.read_text()).get("error") if out.is_file() else None
        doc["error"] = own or f"peer_peft exited {code}; see {out.with_suffix('.log')}"
    return doc


def run_peers(recipe: str, opts: argparse.Namespace, work: Path, useful_share: float | None) -> list[tuple[str, dict]]:
    """Each configuration of ``opts.peer_stack`` in order, until one gives figures (every one with
    ``--all-peer-stacks``); with ``--assemble``, the results already in ``work`` (a configuration
    without a result file was not tried)."""
    tried = []
    for stack in opts.peer_stack:
        out = peer_out(work, recipe, stack)
        if opts.assemble:
            if not out.is_file() and not out.with_suffix(".log").is_file():
                continue
            doc = peer_document(out, tuple(opts.window), useful_share)
        else:
            doc = run_peer(recipe, opts, out, useful_share, stack)
        tried.append((stack, doc))
        _log(f"{recipe}: peer {stack}: {peer_outcome(doc)}")
        if peer_outcome(doc) == "ran" and not opts.all_peer_stacks:
            break
    return tried


def peer_document(out: Path, window: tuple[int, int], useful_share: float | None) -> dict:
    """The peer's result JSON ``out``; when it holds no figures, the figures of its log
    (:func:`lab.peer_peft.result_from_log`) with the JSON's error, if any."""
    from lab.peer_peft import result_from_log

    doc = json.loads(out.read_text()) if out.is_file() else {}
    log = out.with_suffix(".log")
    if doc.get("not_installed"):
        return doc
    if not doc.get("result") and log.is_file():
        try:
            doc = {
                **result_from_log(log.read_text(), window, useful_share),
                **({"error": doc["error"]} if doc.get("error") else {}),
            }
        except ValueError as exc:
            doc.setdefault("error", f"{log}: {exc}")
    if not doc:
        doc["error"] = f"neither {out} nor its log is there"
    return doc


def ours_document(out: Path) -> dict:
    """Ours' benchmark result ``out``, or ``{"error": ...}``."""
    from bridge_recipes.bench.result import read_result

    return read_result(out) if out.is_file() else {"error": f"no result file {out}"}


def entry(
    recipe: str,
    opts: argparse.Namespace,
    ours: dict,
    peer: dict,
    plan: Any,
    step: tuple[int, int],
    gemms: str | None = None,
    tried: list[tuple[str, dict]] | None = None,
) -> dict:
    """One recipe's line of the comparison file: :data:`FIELDS` first, then what else the two
    result documents say (``plan``: the planner's memory plan of ours' config; ``step``: its rows per
    step and tokens per row; ``gemms``: how that config's FP8 base multiplies, overrides applied;
    ``tried``: each peer configuration tried and its result, ``peer`` being the best of them or the last)."""
    global_batch, row_tokens = step
    o, p = ours.get("result") or {}, peer.get("result") or {}
    line = {
        "model": ours.get("model") or peer.get("model"),
        "ours_tokens_per_s": o.get("tokens_per_s_per_gpu"),
        "peer_tokens_per_s": p.get("tokens_per_s"),
        "ours_peak_gb": o.get("peak_allocated_gb"),
        "peer_peak_gb": p.get("peak_allocated_gb"),
        "planner_gb": round(plan.peak_allocated_gb, 1),
        "steps": opts.steps,
        "row_tokens": row_tokens,
        "peer_stack": peer.get("peer_stack"),
        "recipe": recipe,
        "global_batch": global_batch,
        "window": list(opts.window),
        "planner_total_gb": round(plan.peak_gb, 1),
    }
    if p.get("window") and list(p["window"]) != list(opts.window):
        line["peer_window"] = list(p["window"])
    if peer.get("cut_short"):
        line["peer_cut_short"] = peer["cut_short"]
    if tried:
        best = best_peer(tried)
        line["best_peer"] = best[0] if best else None
        line["peers"] = [peer_record(stack, doc) for stack, doc in tried]
    line.update(memory_class_fields(recipe, opts, ours, peer, line, gemms, tried))
    if line["ours_tokens_per_s"] and line["peer_tokens_per_s"]:
        line["tokens_per_s_ratio"] = round(line["ours_tokens_per_s"] / line["peer_tokens_per_s"], 3)
    if line["ours_peak_gb"]:
        line["ours_peak_vs_planner"] = round(line["ours_peak_gb"] / plan.peak_allocated_gb - 1, 4)
    line["ours_step_time_cv_percent"] = o.get("step_time_cv_percent")
    line["peer_step_time_cv_percent"] = p.get("step_time_cv_percent")
    rows = (ours.get("workload") or {}).get("rows") or (peer.get("workload") or {}).get("rows") or {}
    line["useful_token_share"] = rows.get("useful_token_share")
    line["ours_notes"] = ours.get("notes") or []
    for side, doc in (("ours", ours), ("peer", peer)):
        if doc.get("error"):
            line[f"{side}_error"] = doc["error"]
    return line


def memory_class_fields(
    recipe: str,
    opts: argparse.Namespace,
    ours: dict,
    peer: dict,
    line: dict,
    gemms: str | None = None,
    tried: list[tuple[str, dict]] | None = None,
) -> dict:
    """What a comparison at a card's memory adds: the card, the cap both ran within, the base's precision
    and how an FP8 base multiplied (``gemms``: ours' config's ``features.fp8_base.gemms``, the feature's
    default when not given), ours' useful tokens/s and whether a peer fit at all (False: none gave figures
    and one ran out of memory; ``tried``: every configuration tried, else ``peer`` alone)."""
    from bridge_recipes.bench.result import memory_cap_gb
    from bridge_recipes.features import fp8_base
    from bridge_recipes.recipes import registry

    meta = registry.find(recipe).meta
    useful = (ours.get("result") or {}).get("useful_tokens_per_s_per_gpu")
    ran_out = any(peer_outcome(doc) == "out of memory" for _, doc in tried or [("", peer)])
    measured_on = ((ours.get("gpu") or {}).get("type") or "").lower()
    # the cap the run had (its result's note; a run that gave no result: the one asked for)
    cap = memory_cap_gb(ours)
    cap = memory_cap(recipe, opts) if cap is None else cap
    fp8 = meta.precision == "fp8base"
    return {
        "gpu": meta.gpu,
        "memory_cap_gb": cap,
        # a card emulated by a cap has its memory, not its speed (an A100 or L40S computes slower than an H200)
        "speed_of": meta.gpu if measured_on in ("", meta.gpu) or cap is None else f"{measured_on}, not {meta.gpu}",
        "base_precision": "fp8" if fp8 else "bf16",
        # how an FP8 base multiplies: BF16 on the dequantized weights or FP8 (bridge_recipes.features.fp8_base)
        "base_compute": (gemms or fp8_base.Config().gemms) if fp8 else "bf16",
        "ours_useful_tokens_per_s": useful,
        # it trained (figures), it ran out of memory, or it stopped for another reason (unknown)
        "peer_fits": True if line["peer_tokens_per_s"] else False if ran_out else None,
    }


def dry_run(opts: argparse.Namespace, work: Path) -> int:
    """Everything a CPU can check of the comparison: ours' runner dry run with its launch arguments,
    the planner's figure, the peer's model and adapters at full size on the meta device."""
    from lab.peer_peft import NOT_INSTALLED

    failed = 0
    for recipe in opts.recipe:
        try:
            args, cfg, plan = planned(recipe, opts, work / f"{recipe}.yaml")
        except ValueError as exc:
            _log(f"{recipe}: ours cannot run: {exc}")
            failed += 1
            continue
        ours_cmd = [sys.executable, "-m", "bridge_recipes.runner", "--recipe", recipe, "--dry-run", *args]
        ours_rc = streamed(ours_cmd, work / f"{recipe}_dry_run.log")
        peers = []
        for stack in opts.peer_stack:
            peer_cmd = [sys.executable, "-m", "lab.peer_peft", *peer_argv(recipe, opts, None, stack)]
            rc = streamed(peer_cmd, work / f"{recipe}_peer_{stack}_dry_run.log")
            # a configuration whose packages this machine lacks is a fact about the machine
            said = "passes" if rc == 0 else "not installed here" if rc == NOT_INSTALLED else f"FAILS (exit {rc})"
            peers.append(f"{stack} {said}")
            failed += rc not in (0, NOT_INSTALLED)
        _log(
            f"{recipe}: ours' dry run {'passes' if ours_rc == 0 else f'FAILS (exit {ours_rc})'} "
            f"({' '.join(args)}); planner {plan.peak_allocated_gb:.1f} GB allocated, {plan.peak_gb:.1f} GB with "
            f"the framework's overhead, of {plan.gpu_memory_gb:.1f}; the peer's dry runs: {', '.join(peers)}; "
            f"logs in {work}"
        )
        failed += ours_rc != 0
    return 1 if failed else 0


def gpu_problem() -> str | None:
    """Why the comparison cannot run here (no GPU), or None."""
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU: the comparison runs on one GPU (--dry-run checks it on a CPU)"
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m lab.lora_vs_peft",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", required=True, metavar="DIR", help="packed SFT rows both runs train on")
    ap.add_argument("--out", help="the comparison file (.json); required unless --dry-run")
    ap.add_argument(
        "--work",
        default="experiments/lora_vs_peft",
        metavar="DIR",
        help="where each run's result and log go (default experiments/lora_vs_peft)",
    )
    ap.add_argument(
        "--recipe", action="append", help=f"a one-GPU LoRA recipe (repeatable; default {', '.join(RECIPES)})"
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--window", type=int, nargs=2, default=[5, 19], metavar=("FIRST", "LAST"))
    ap.add_argument(
        "--global-batch",
        type=int,
        help=f"rows per step (default: a micro batch of the recipe's, at least {GLOBAL_BATCH})",
    )
    ap.add_argument(
        "--gpu-memory-gb",
        metavar="GB|auto",
        help="both runs within GB of the GPU's memory; auto: the memory of each recipe's GPU (an 80 or 48 GB card's)",
    )
    ap.add_argument(
        "--peer-stack",
        action="append",
        metavar="NAME",
        help="a peer configuration to try (repeatable, tried in the order given; default: "
        "the order of lab.peer_peft.BY_EXPECTED_SPEED, fastest expected first)",
    )
    ap.add_argument(
        "--all-peer-stacks",
        action="store_true",
        help="try every --peer-stack even after one gave figures (default: stop at the first)",
    )
    ap.add_argument("--dry-run", action="store_true", help="check everything a CPU can; train nothing")
    ap.add_argument(
        "--assemble",
        action="store_true",
        help="write --out from the runs already in --work (a run cut short: the steps its log holds); train nothing",
    )
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides both runs get")
    return ap


def argument_problems(opts: argparse.Namespace) -> list[str]:
    from bridge_recipes.recipes import registry
    from bridge_recipes.utils.outputs import output_problem

    out = []
    if not Path(opts.rows).is_dir():
        out.append(f"--rows {opts.rows}: not a folder (build one with scripts/build_sft_rows.py)")
    if opts.gpu_memory_gb not in (None, "auto"):
        try:
            if not float(opts.gpu_memory_gb) > 0:
                raise ValueError
        except ValueError:
            out.append(f"--gpu-memory-gb {opts.gpu_memory_gb}: a positive number of GB, or auto")
    if opts.global_batch is not None and opts.global_batch < 1:
        out.append(f"--global-batch {opts.global_batch}: at least 1")
    from lab.peer_peft import STACKS

    stacks = opts.peer_stack or list(BY_EXPECTED_SPEED)
    for stack in stacks:
        if stack not in STACKS:
            out.append(f"--peer-stack {stack}: unknown; choose from {', '.join(STACKS)}")
    if len(set(stacks)) != len(stacks):
        out.append(f"--peer-stack {' '.join(stacks)}: each configuration once")
    if not opts.dry_run:
        if not opts.out:
            out.append("--out FILE is required (the comparison file), or --dry-run")
        elif problem := output_problem(opts.out, option="--out", inputs=[("--rows", opts.rows)]):
            out.append(problem)
    for recipe in opts.recipe:
        try:
            entry = registry.find(recipe)
        except registry.UnknownRecipe as exc:
            out.append(str(exc))
            continue
        if entry.meta.task != "peft" or entry.meta.gpus != 1:
            out.append(
                f"--recipe {recipe}: a one-GPU LoRA recipe is needed (this one is {entry.meta.task} on "
                f"{entry.meta.gpus} GPU(s))"
            )
    return out


def shared_peers(recipes: list[str], opts: argparse.Namespace) -> dict[str, str]:
    """Each recipe's peer run: its own, or that of the first recipe before it whose peer workload and
    memory cap are the same (:func:`lab.peer_peft.workload_key`; e.g. a recipe and a
    variant changing only ours' execution). The peer runs once for both."""
    from lab import peer_peft

    keys: dict[str, Any] = {}
    for recipe in recipes:
        try:
            cfg = peer_peft.workload_config(recipe, opts.rows, overrides(recipe, opts))
            keys[recipe] = {**peer_peft.workload_key(cfg), "gpu_memory_gb": memory_cap(recipe, opts)}
        except peer_peft.PeerError:
            keys[recipe] = None  # the peer's own run names the problem
    return {
        recipe: next((r for r in recipes if keys[r] is not None and keys[r] == keys[recipe]), recipe)
        for recipe in recipes
    }


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    opts = ap.parse_intermixed_args(argv)
    opts.recipe = opts.recipe or list(RECIPES)
    opts.peer_stack = opts.peer_stack or list(BY_EXPECTED_SPEED)
    problems = argument_problems(opts)
    if problems:
        ap.error("; ".join(problems))
    if not opts.assemble:  # a cap ours cannot run within is refused before anything runs
        capped = [p for recipe in opts.recipe if (p := cap_problem(recipe, opts))]
        if capped:
            ap.error("; ".join(capped))
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    if opts.dry_run:
        return dry_run(opts, work)
    if not opts.assemble and (problem := gpu_problem()):
        ap.error(problem)
    plans = {}
    for recipe in opts.recipe:  # every run's arguments checked before the first starts
        try:
            plans[recipe] = planned(recipe, opts, work / f"{recipe}.yaml")
        except ValueError as exc:
            ap.error(str(exc))
    peer_of = shared_peers(opts.recipe, opts)
    peers: dict[str, list[tuple[str, dict]]] = {}
    lines: list[dict] = []
    for recipe in opts.recipe:
        _, cfg, plan = plans[recipe]
        start = time.time()
        what = (
            "assembled from"
            if opts.assemble
            else f"ours ({opts.steps} steps of {rows_per_step(cfg)} rows), then the peer; logs in"
        )
        _log(f"{recipe}: {what} {work}")
        ours_out = work / f"{recipe}.yaml"
        ours = ours_document(ours_out) if opts.assemble else run_ours(recipe, opts, ours_out)
        share = ((ours.get("workload") or {}).get("rows") or {}).get("useful_token_share")
        if peer_of[recipe] in peers:
            _log(f"{recipe}: the peer's workload is {peer_of[recipe]}'s; its run is shared")
        else:
            peers[peer_of[recipe]] = run_peers(peer_of[recipe], opts, work, share)
        tried = peers[peer_of[recipe]]
        best = best_peer(tried)
        peer = best[1] if best else tried[-1][1] if tried else {"error": f"no peer result in {work}"}
        step = (rows_per_step(cfg), row_tokens(cfg))
        lines.append(entry(recipe, opts, ours, peer, plan, step, cfg.features.fp8_base.gemms, tried))
        if peer_of[recipe] != recipe:
            lines[-1]["peer_recipe"] = peer_of[recipe]
        write_text_atomic(Path(opts.out), json.dumps(lines, indent=1) + "\n")
        last = lines[-1]
        _log(
            f"{recipe} ({time.time() - start:.0f} s): ours {last['ours_tokens_per_s']} tokens/s, peak "
            f"{last['ours_peak_gb']} GB (planner {last['planner_gb']}); peer {last['peer_tokens_per_s']} tokens/s, "
            f"peak {last['peer_peak_gb']} GB; ratio {last.get('tokens_per_s_ratio')}"
        )
    # a peer that ran out of memory under a card's cap, or whose packages the host lacks, answered the
    # question: the comparison failed only where ours did, or where no peer ran and one failed otherwise
    gave_figures = [
        not (
            ln.get("ours_error")
            or (ln.get("peer_error") and ln.get("peer_fits") is not False)  # e.g. the best stopped part way
            or (not ln.get("best_peer") and any(p["outcome"] == "failed" for p in ln.get("peers", [])))
        )
        for ln in lines
    ]
    return 0 if all(gave_figures) else 1


if __name__ == "__main__":
    sys.exit(main())
