"""GPU evidence for the Hugging Face road (one H200): logits parity, round trip, fine-tune and export.

    python -m lab.hf_evidence OUT_DIR [SCRATCH]

Arms, each logged to OUT_DIR/hf_evidence.log as it finishes (a failing arm is logged with its
error and the next one runs):

1. toys: dense and MoE 4-layer checkpoints from transformers' classes (:mod:`bridge_recipes.hf.toy`),
   FP32 weights, the MoE one with the tokenizer of the committed synthetic SFT rows;
2. round trip: ``convert_checkpoint.py import`` then ``export`` (no training) of each toy and of a
   VL MoE toy, every tensor compared bit for bit with the original safetensors;
3. parity: the imported Megatron checkpoint's logits against transformers' on the same tokens, FP32
   and BF16, dense / MoE with every expert routed / MoE with the real top-k (:mod:`.parity`);
4. fine-tune and give back: ``run_recipe.py --hf-checkpoint TOY --export-hf DIR`` trains the
   35B-A3B SFT recipe scaled to the toy for 10 steps on the committed SFT rows (through
   ``finetune()``), then transformers loads the export and its logits are compared with the
   trained Megatron checkpoint's;
5. real width: toys with the released models' own widths (hidden size, heads, experts, vocabulary;
   :func:`.toy.real_width_sizes`) at 4 layers, imported and compared like the parity arm, so the
   mapping is checked at the real tensor shapes;
6. multi-GPU (two GPUs): the one-GPU imports loaded at TP2 and EP2 (:mod:`.parity_mp`), compared
   with transformers' logits like the parity arm;
7. LoRA: :func:`lora_arm`.

OUT_DIR/hf_parity.json gets the list of parity cases; the gates are :func:`.parity.gate_failures`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bridge_recipes.bench.runs import free_port
from bridge_recipes.hf import parity
from lab import ROOT

ROWS = ROOT / "lab/evidence/sft_rows_synthetic/rows"
ROWS_TOKENIZER = ROOT / "lab/evidence/sft_rows_synthetic/tokenizer.json"
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
DENSE_RECIPE = "qwen35_27b_sft_8gpu_h200_bf16_config"
VL_RECIPE = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"
# The toys the round-trip arm imports and exports, each with the recipe it converts through.
ROUND_TRIP_RECIPES = {"dense": DENSE_RECIPE, "moe": RECIPE, "vl": VL_RECIPE}
ROUND_TRIP_KINDS = tuple(ROUND_TRIP_RECIPES)
FINETUNE_STEPS = 10
# The one-GPU imports loaded at two-GPU layouts (Megatron resharding them): (toy, TP, EP, routing).
MULTI_GPU_CASES = (("dense", 2, 1, "dense"), ("moe", 2, 1, "all_experts"), ("moe", 1, 2, "all_experts"))


ROUND_TRIP_PREFIX = "round trip "


def round_trip_line(kind: str, result: dict) -> str:
    """The driver log's line for one round trip (``round trip dense: {json}``)."""
    return f"{ROUND_TRIP_PREFIX}{kind}: {json.dumps(result)}"


def round_trips_in_log(text: str) -> dict[str, dict]:
    """The round trips a driver log records, by kind (a later line for a kind replaces an earlier one)."""
    pattern = re.escape(ROUND_TRIP_PREFIX) + r"(\w+): (\{.*\})$"
    return {m.group(1): json.loads(m.group(2)) for m in re.finditer(pattern, text, flags=re.M)}


class Log:
    def __init__(self, path: Path):
        self.path, self.t0 = path, time.time()

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def run_child(log: Log, cmd: list[str], what: str) -> None:
    """Run ``cmd`` (offline, no torchrun variables inherited), log it and its output's tail;
    RuntimeError naming ``what`` when it fails."""
    from bridge_recipes.hf.run_hooks import child_env

    log(f"$ {' '.join(cmd[1:])}")
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
    for line in (p.stdout + p.stderr).splitlines()[-25:]:
        log(f"  | {line}")
    if p.returncode != 0:
        raise RuntimeError(f"{what} exited {p.returncode}")


def _convert(log: Log, *args: str) -> None:
    cmd = [sys.executable, "-m", "bridge_recipes.hf.cli", *args, "--no-progress"]
    run_child(log, cmd, f"convert_checkpoint.py {args[0]}")


def run(out: Path, scratch: Path) -> dict[str, Any]:
    import megatron.bridge  # noqa: F401  (before any cuDNN work)
    import torch

    from bridge_recipes.hf.toy import make_toy

    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    log = Log(out / "hf_evidence.log")
    log(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    summary: dict[str, Any] = {"cases": [], "round_trip": {}, "finetune": {}, "errors": []}

    def save() -> None:
        (out / "hf_parity.json").write_text(json.dumps(summary["cases"], indent=1) + "\n")
        (out / "hf_evidence_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    only = set(filter(None, os.environ.get("HF_EVIDENCE_ARMS", "").split(",")))

    def arm(name: str, fn) -> None:
        if only and name not in only:
            log(f"===== arm {name}: skipped (HF_EVIDENCE_ARMS={','.join(sorted(only))})")
            return
        log(f"===== arm {name}")
        try:
            fn()
        except Exception as e:
            summary["errors"].append(f"{name}: {type(e).__name__}: {e}")
            log(f"arm {name} FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        save()

    # FP32 toys for parity and the round trip; a BF16 MoE toy (the dtype of the released checkpoints
    # and of the recipe's parameters) for the fine-tune.
    toys = {"dense": scratch / "toy_dense", "moe": scratch / "toy_moe"}
    ft_toy = scratch / "toy_moe_bf16"
    # The VL MoE toy (transformers' Qwen3_5MoeForConditionalGeneration: the vision tower, the
    # merger and the MoE language model) takes the round trip only: its logits need images.
    vl_toy = scratch / "toy_vl_moe"
    specs = {}

    def make_toys() -> None:
        from bridge_recipes.hf.toy import toy_spec

        made = (*((k, p, "float32", False) for k, p in toys.items()), ("moe", ft_toy, "bfloat16", False))
        for kind, path, dtype, vl in (*made, ("moe", vl_toy, "float32", True)):
            if not (path / "config.json").exists():
                make_toy(path, kind, vl=vl, dtype=dtype, tokenizer_json=ROWS_TOKENIZER)
            if not vl:
                specs[kind] = toy_spec(kind)
            mb = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e6
            log(f"toy {kind}{' VL' if vl else ''} {dtype}: {path} ({mb:.1f} MB)")

    arm("toys", make_toys)

    trip_toys = {**toys, "vl": vl_toy}
    imported = {k: scratch / f"mcore_{k}" for k in trip_toys}

    def round_trip() -> None:
        for kind, path in trip_toys.items():
            recipe = ROUND_TRIP_RECIPES[kind]
            _convert(
                log,
                "import",
                "--hf",
                str(path),
                "--recipe",
                recipe,
                "--scaled",
                "--out",
                str(imported[kind]),
                "--overwrite",
            )
            back = scratch / f"back_{kind}"
            _convert(
                log,
                "export",
                "--megatron",
                str(imported[kind]),
                "--hf-template",
                str(path),
                "--recipe",
                recipe,
                "--scaled",
                "--out",
                str(back),
                "--overwrite",
            )
            result = parity.tensors_identical(path, back)
            summary["round_trip"][kind] = result
            log(round_trip_line(kind, result))

    arm("round_trip", round_trip)

    tokens = parity.parity_tokens()

    def parity_arm() -> None:
        parity.init_single_gpu()
        for kind, routings in (("dense", ["dense"]), ("moe", ["all_experts", "topk"])):
            for case in parity.parity_cases(kind, kind, imported[kind], toys[kind], tokens, routings=routings):
                summary["cases"].append(case)
                log(parity.log_line(case))

    arm("parity", parity_arm)

    def finetune() -> None:
        from bridge_recipes.bench.runs import launch

        ckpt, export = scratch / "ft_ckpt", scratch / "ft_export"
        for p in (ckpt, export):
            subprocess.run(["rm", "-rf", str(p)], check=True)
        os.environ["QWEN35_RECIPES_CACHE"] = str(scratch / "cache")
        args = [
            *toy_run_args(ft_toy, specs["moe"]),
            "--export-hf", str(export), "--save-dir", str(ckpt), "--save-interval", str(FINETUNE_STEPS),
            "checkpoint.load=null", "checkpoint.async_save=false",
        ]  # fmt: skip
        r = launch("finetune", RECIPE, args, out / "hf_finetune.log", timeout_s=900)
        losses = r.losses
        info = {
            "returncode": r.returncode,
            "seconds": round(r.seconds),
            "finetune_entry": "starting finetune()" in r.log,
            "loss_first": losses.get(min(losses)) if losses else None,
            "loss_last": losses.get(max(losses)) if losses else None,
            "steps": len(losses),
            "export_files": sorted(p.name for p in export.glob("*")) if export.exists() else [],
        }
        summary["finetune"] = info
        log(f"finetune: {json.dumps(info)}")
        if r.returncode != 0:
            raise RuntimeError(f"the fine-tune run exited {r.returncode}")
        parity.init_single_gpu()
        for case in parity.parity_cases(
            "finetuned_moe", "moe", ckpt, export, tokens, routings=["all_experts", "topk"]
        ):
            case["layout"] += f", after {FINETUNE_STEPS} SFT steps (export vs trained checkpoint)"
            summary["cases"].append(case)
            log(parity.log_line(case))

    arm("finetune", finetune)

    def real_width() -> None:
        from bridge_recipes.hf.toy import real_width_sizes

        parity.init_single_gpu()
        for kind, recipe, routings in (("dense", DENSE_RECIPE, ["dense"]), ("moe", RECIPE, ["all_experts", "topk"])):
            hf_dir, mcore = scratch / f"real_width_{kind}", scratch / f"mcore_real_width_{kind}"
            log(f"real width {kind}: {shutil.disk_usage(scratch).free / 2**30:.1f} GiB free in {scratch}")
            if not (hf_dir / "config.json").exists():
                make_toy(hf_dir, kind, dtype="float32", max_shard_size="2GB", tokenizer_json=ROWS_TOKENIZER,
                         **real_width_sizes(kind))  # fmt: skip
            _convert(
                log, "import", "--hf", str(hf_dir), "--recipe", recipe, "--scaled", "--out", str(mcore), "--overwrite"
            )
            for case in parity.parity_cases(f"real_width_{kind}", kind, mcore, hf_dir, tokens, routings=routings):
                case["layout"] += ", the released model's widths at 4 layers"
                summary["cases"].append(case)
                log(parity.log_line(case))
            # Each real-width pair is tens of GB (FP32 toy and its import): freed before the next,
            # so both fit the host's disk.
            for p in (hf_dir, mcore):
                shutil.rmtree(p, ignore_errors=True)

    arm("real_width", real_width)

    def multi_gpu() -> None:
        if torch.cuda.device_count() < 2:
            raise RuntimeError("the multi-GPU parity arm needs two GPUs (nvidia-h200-x2)")
        from bridge_recipes.hf.checkpoint import is_megatron_checkpoint

        for kind, tp, ep, routing in MULTI_GPU_CASES:
            if not is_megatron_checkpoint(imported[kind]):
                raise RuntimeError(f"no one-GPU import in {imported[kind]}: run the round_trip arm first")
            name = f"{kind}_tp{tp}_ep{ep}"
            out_json = scratch / f"parity_{name}.json"
            out_json.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(free_port()), "-m", "bridge_recipes.hf.parity_mp", str(imported[kind]), str(toys[kind]),
                   str(out_json), "--tp", str(tp), "--ep", str(ep), "--routing", routing, "--name", name]  # fmt: skip
            run_child(log, cmd, f"parity at TP{tp} EP{ep}")
            if not out_json.exists():
                raise RuntimeError(f"parity at TP{tp} EP{ep} wrote no case into {out_json}")
            summary["cases"].append(json.loads(out_json.read_text()))

    arm("multi_gpu", multi_gpu)

    def lora() -> None:
        summary["lora"] = lora_arm(log, out, scratch, ft_toy, specs["moe"], tokens)
        log(f"lora: {json.dumps(summary['lora'], default=str)}")

    arm("lora", lora)
    failures = parity.gate_failures(summary["cases"])
    trips = summary["round_trip"]
    rt_ok = set(trips) == set(ROUND_TRIP_KINDS) and all(v.get("bit_identical") for v in trips.values())
    summary["gate_failures"] = failures
    summary["round_trip_ok"] = rt_ok
    log(f"gates: {'ok' if not failures else failures}; round trip bit-identical: {rt_ok}")
    save()
    return summary


# Tensors LoRA never touches (embeddings, head, norms, the router, the Gated DeltaNet convolution,
# decay and time-step parameters): a merged export must give them back bit for bit. Adapters sit
# on the projections of common.LORA_TARGETS only.
FROZEN_SUFFIXES = (
    "embed_tokens.weight",
    "lm_head.weight",
    "norm.weight",
    "mlp.gate.weight",
    "shared_expert_gate.weight",
    "conv1d.weight",
    "A_log",
    "dt_bias",
)


def lora_change_report(same: list[str], changed: list[str]) -> dict[str, Any]:
    """What a LoRA fine-tune changed, from the merged export against the base folder: frozen tensors
    (:data:`FROZEN_SUFFIXES`) that changed are failures; the changed projections are grouped by
    their module name."""
    frozen_changed = [n for n in changed if n.endswith(FROZEN_SUFFIXES)]
    groups: dict[str, int] = {}
    for n in changed:
        parts = n.split(".")
        key = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
        groups[key] = groups.get(key, 0) + 1
    return {
        "identical": len(same),
        "changed": len(changed),
        "changed_by_module": dict(sorted(groups.items())),
        "frozen_changed": frozen_changed,
        "frozen_identical": sum(n.endswith(FROZEN_SUFFIXES) for n in same),
        "passed": bool(changed) and not frozen_changed,
    }


def lora_failures(info: dict[str, Any]) -> list[str]:
    """What the LoRA arm's record (:func:`lora_arm`) fails of its checks, empty when it passed: the run
    trained its 10 steps, its checkpoint holds adapter tensors only, the merged export changed only
    adapted projections, loads in transformers and moves its logits, and the killed run resumed."""
    failures = []
    if info.get("returncode") != 0 or info.get("steps") != FINETUNE_STEPS:
        failures.append(f"the run exited {info.get('returncode')} after {info.get('steps')} of {FINETUNE_STEPS} steps")
    if not info.get("checkpoint_model_tensors") or info.get("checkpoint_non_adapter_tensors"):
        failures.append(f"the checkpoint holds non-adapter tensors: {info.get('checkpoint_non_adapter_tensors')}")
    export = info.get("export_vs_base") or {}
    if not export.get("passed"):
        failures.append(f"the merged export changed frozen tensors or nothing: {export.get('frozen_changed')}")
    if not info.get("export_loads") or not info.get("export_logits_max_abs_change"):
        failures.append("the merged export did not load in transformers, or its logits equal the base's")
    resume = info.get("resume") or {}
    if not resume.get("passed") or resume.get("resumed_returncode") != 0:
        failures.append(f"the killed run did not resume: {resume.get('reasons')}")
    return failures


def checkpoint_model_keys(iter_dir: Path) -> list[str]:
    """The model weights a torch_dist checkpoint holds (its metadata, read on the CPU): the keys
    ending in .weight or .bias outside the optimizer state."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(iter_dir)).read_metadata().state_dict_metadata
    return sorted(k for k in keys if not k.startswith("optimizer") and k.endswith((".weight", ".bias")))


LORA_RECIPE = "qwen35_35b_a3b_peft_1gpu_h200_bf16_lowmem_config"


def toy_run_args(toy: Path, spec: Any) -> list[str]:
    """Runner arguments of a 10-step run from the HF toy ``toy`` (its architecture ``spec``): the
    recipe scaled to the toy's layers (the rest of its shape comes from the toy's config.json), a
    raised learning rate, the committed SFT rows, ``--hf-checkpoint``."""
    return [
        "--scale-down", str(spec.num_layers),
        "-gb", "4", "--max-steps", str(FINETUNE_STEPS), "--lr", "3e-4", "--min-lr", "3e-5", "--warmup-iters", "1",
        "--dataset", "sft-rows", f"dataset.path={ROWS}", "--hf-checkpoint", str(toy),
    ]  # fmt: skip


def lora_arm(log: Log, out: Path, scratch: Path, toy: Path, spec: Any, tokens: Any) -> dict[str, Any]:
    """LoRA from the imported toy: 10 steps saving at 5 and 10 with a merged export; a second run
    killed after step 7 and restarted from its step-5 checkpoint (adapters and their optimizer
    state) must follow the first. Checks: the checkpoint holds adapter tensors only; the merged
    export loads in transformers, differs from the base only in adapted projections and moves its
    logits; the restart matches (``check_resume``)."""
    import torch

    from bridge_recipes.bench.runs import launch
    from bridge_recipes.training.saved_runs import iteration_folder
    from lab.evidence import RESUME_KILL_AFTER, RESUME_SAVE_INTERVAL, check_resume

    os.environ["QWEN35_RECIPES_CACHE"] = str(scratch / "cache")
    full, killed_ckpt, export = scratch / "lora_ckpt", scratch / "lora_killed_ckpt", scratch / "lora_export"
    for p in (full, killed_ckpt, export):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    base = [*toy_run_args(toy, spec), "--save-interval", str(RESUME_SAVE_INTERVAL), "checkpoint.async_save=false"]
    a = launch("lora", LORA_RECIPE, [*base, "--save-dir", str(full), "--export-hf", str(export)], out / "hf_lora.log")
    info: dict[str, Any] = {"returncode": a.returncode, "seconds": round(a.seconds), "steps": len(a.losses)}
    info["losses"] = a.losses
    if a.returncode != 0:
        raise RuntimeError(f"the LoRA run exited {a.returncode}")
    keys = checkpoint_model_keys(iteration_folder(full, FINETUNE_STEPS))
    info["checkpoint_model_tensors"] = len(keys)
    info["checkpoint_non_adapter_tensors"] = [k for k in keys if "adapter" not in k][:10]
    same, changed = parity.identical_names(toy, export)
    info["export_vs_base"] = lora_change_report(same, changed)

    def logits(folder: Path) -> Any:
        return parity.hf_logits(parity.load_hf(folder), tokens[:2, :128])

    tuned, original = logits(export), logits(toy)
    info["export_loads"] = bool(torch.isfinite(tuned).all())
    info["export_logits_max_abs_change"] = float((tuned - original).abs().max())
    # each stage's findings reach the log as they come: a host lost during the resume keeps them
    log(f"lora trained and exported: {json.dumps(info, default=str)}")
    save = ["--save-dir", str(killed_ckpt), "--load-dir", str(killed_ckpt)]
    killed = launch("lora_killed", LORA_RECIPE, [*base, *save], out / "hf_lora.log", kill_after_step=RESUME_KILL_AFTER)
    log(f"lora killed after step {len(killed.losses)} (exit {killed.returncode}); resuming")
    back = launch("lora_resumed", LORA_RECIPE, [*base, *save, "checkpoint.save=null"], out / "hf_lora.log")
    info["resume"] = check_resume(a.losses, killed.losses, back.losses, save_interval=RESUME_SAVE_INTERVAL).as_dict()
    info["resume"]["resumed_returncode"] = back.returncode
    return info


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    run(out_dir, Path(sys.argv[2]) if len(sys.argv) > 2 else out_dir / "scratch")
