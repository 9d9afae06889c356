"""GPU evidence for VL fine-tuning from image conversations (one H200).

    python -m lab.vl_evidence OUT_DIR [SCRATCH]

1. toy: the VL MoE toy of ``convert_checkpoint.py toy`` without its MTP layer (4 layers, 16 experts, a 2-layer vision
   tower, the offline Qwen-VL processor), BF16;
2. data: coloured shapes (:mod:`bridge_recipes.vl.synthetic_images`) in every accepted record
   form, built into an Energon dataset with a validation split by scripts/build_vl_dataset.py's
   entry point, with the toy as the processor;
3. training: the VL SFT recipe scaled to the toy, ``--hf-checkpoint TOY --export-hf EXPORT
   --dataset energon dataset.path=DIR``, :data:`STEPS` steps with a validation pass every
   :data:`EVAL_INTERVAL`;
4. held-out images: :func:`held_out_loss` of the toy and of the export (loaded by transformers)
   on images no build has seen, and of the export with each image swapped for one of another
   answer (what the images themselves teach).

OUT_DIR gets vl_finetune.log (this driver), vl_finetune_run.log (the training run) and
vl_finetune_summary.json; :func:`failures` are the gates (``passed`` when it lists none).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from lab.evidence import MIN_STEPS, check_training
from lab.hf_evidence import Log, run_child

RECIPE = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"
STEPS = 30
EVAL_INTERVAL = 10
TRAIN_CONVERSATIONS = 600
VAL_FRACTION = 0.05
HELD_OUT = 48
# Images of 64 to 112 pixels a side, each 16 image tokens or fewer: short samples, a short sequence.
PIXELS = {"min_pixels": 64 * 64, "max_pixels": 128 * 128}
SEQ_LENGTH = 256
TRAIN_FLAGS = ["-gb", "8", "-sl", str(SEQ_LENGTH), "--max-steps", str(STEPS)]
TRAIN_FLAGS += ["--lr", "1e-3", "--min-lr", "1e-4", "--warmup-iters", "3"]


def run_args(toy: Path, spec: Any, dataset: Path, export: Path, ckpt: Path) -> list[str]:
    """Runner arguments of the training run: the VL SFT recipe scaled to the toy (its vision tower
    and token ids too), the built dataset with its validation split, the toy's weights and an export."""
    from bridge_recipes.hf.toy import model_overrides
    from bridge_recipes.vl.offline_vl_processor import vision_token_ids

    return [
        "--scale-down", str(spec.num_layers), "--scale-experts", str(spec.num_experts), *TRAIN_FLAGS,
        "--dataset", "energon", f"dataset.path={dataset}", "dataset.num_workers=1",
        *(f"dataset.task_encoder.{k}={v}" for k, v in PIXELS.items()),
        f"validation.eval_interval={EVAL_INTERVAL}", "validation.eval_iters=2",
        "--hf-checkpoint", str(toy), "--export-hf", str(export),
        "--save-dir", str(ckpt), "--save-interval", str(STEPS), "checkpoint.load=null", "checkpoint.async_save=false",
        *model_overrides(spec), *(f"model.{k}={v}" for k, v in vision_token_ids(toy).items()),
    ]  # fmt: skip


def swapped_images(examples: list[dict]) -> list[dict]:
    """``examples`` with each image replaced by the nearest following one of another answer: the
    same text, an image that says otherwise."""
    out = []
    for i, ex in enumerate(examples):
        other = next(
            examples[(i + k) % len(examples)]
            for k in range(1, len(examples))
            if (examples[(i + k) % len(examples)]["colour"], examples[(i + k) % len(examples)]["shape"])
            != (ex["colour"], ex["shape"])
        )
        user, reply = ex["conversation"]
        image = next(p for p in other["conversation"][0]["content"] if p["type"] == "image")
        content = [image if p["type"] == "image" else p for p in user["content"]]
        out.append({**ex, "conversation": [{**user, "content": content}, reply]})
    return out


def held_out_loss(
    model_dir: str | Path, processor_dir: str | Path, examples: list[dict], *, device: str = "cpu", **pixels: int
) -> dict[str, Any]:
    """Mean cross-entropy per supervised token of a Hugging Face VL model on ``examples`` (FP32): the
    tokens and images Megatron-Bridge's Qwen-VL collate gives training (the assistant's reply and its
    end-of-turn token; images under ``pixels``, the task encoder's ``min_pixels`` / ``max_pixels``)."""
    import torch
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(processor_dir), local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    total, tokens, per_example = 0.0, 0, []
    for ex in examples:
        batch = qwen2_5_collate_fn(
            [{"conversation": ex["conversation"]}], processor, require_assistant_matches=True, **pixels
        )
        visual = batch["visual_inputs"]
        with torch.no_grad():
            logits = model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                mm_token_type_ids=batch["mm_token_type_ids"].to(device),
                pixel_values=visual.pixel_values.to(device),
                image_grid_thw=visual.image_grid_thw.to(device),
            ).logits.float()
        mask = batch["loss_mask"].bool().to(device)
        ce = torch.nn.functional.cross_entropy(logits[mask], batch["labels"].to(device)[mask], reduction="sum")
        n = int(mask.sum())
        total, tokens = total + float(ce), tokens + n
        per_example.append(round(float(ce) / n, 6))
    return {"loss": total / tokens, "tokens": tokens, "examples": len(examples), "per_example": per_example}


def failures(summary: dict[str, Any]) -> list[str]:
    """What the summary of :func:`run` fails of the evidence: the run trained its steps and its loss
    fell (``check_training``), validation losses were reported, the export loads in transformers,
    and it answers the held-out images with a lower loss than the toy did."""
    out = []
    train = summary.get("training") or {}
    if train.get("returncode") != 0 or train.get("steps", 0) < MIN_STEPS:
        out.append(f"the training run exited {train.get('returncode')} after {train.get('steps')} step(s)")
    if not (train.get("check") or {}).get("passed"):
        out.append(f"the training loss did not fall: {(train.get('check') or {}).get('reasons')}")
    if not train.get("validation_losses"):
        out.append("no validation loss was reported")
    held = summary.get("held_out") or {}
    toy, tuned = (held.get("toy") or {}).get("loss"), (held.get("export") or {}).get("loss")
    if toy is None or tuned is None:
        out.append("the held-out loss of the toy or of the export is missing (the export did not load?)")
    elif not tuned < toy:
        out.append(f"the export's held-out loss {tuned:.4f} is not below the toy's {toy:.4f}")
    return out + [f"error: {e}" for e in summary.get("errors", [])]


def run(out: Path, scratch: Path) -> dict[str, Any]:
    """The four stages of the module docstring; the summary (also written to
    OUT/vl_finetune_summary.json after each stage)."""
    import torch

    from bridge_recipes.bench.runs import launch
    from bridge_recipes.hf.toy import make_toy, toy_spec
    from bridge_recipes.vl.synthetic_images import held_out_examples, write_conversations

    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    log = Log(out / "vl_finetune.log")
    log(f"device {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    summary: dict[str, Any] = {"recipe": RECIPE, "errors": []}

    def save() -> None:
        (out / "vl_finetune_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")

    toy, dataset = scratch / "toy_vl_moe_bf16", scratch / "dataset"
    ckpt, export = scratch / "ckpt", scratch / "export"
    try:
        spec = toy_spec("moe", vl=True)
        if not (toy / "config.json").exists():
            make_toy(toy, "moe", vl=True)
        log(f"toy: {toy} ({sum(f.stat().st_size for f in toy.glob('*.safetensors')) / 1e6:.1f} MB)")
        source = write_conversations(scratch / "conversations", TRAIN_CONVERSATIONS, seed=0)
        for folder in (dataset, ckpt, export):
            shutil.rmtree(folder, ignore_errors=True)
        cmd = [sys.executable, "-m", "bridge_recipes.vl.vl_cli", "--input", str(source), "--processor", str(toy),
               "--out", str(dataset), "--val-fraction", str(VAL_FRACTION), "--no-progress"]  # fmt: skip
        run_child(log, cmd, "the dataset build")
        manifest = json.loads((dataset / "manifest.json").read_text())
        summary["dataset"] = {k: manifest[k] for k in ("conversations", "splits")}
        save()
        os.environ["QWEN35_RECIPES_CACHE"] = str(scratch / "cache")
        r = launch("vl_finetune", RECIPE, run_args(toy, spec, dataset, export, ckpt), out / "vl_finetune_run.log")
        from bridge_recipes.logs.megatron_log import validation_losses

        summary["training"] = {
            "returncode": r.returncode,
            "seconds": round(r.seconds),
            "finetune_entry": "starting finetune()" in r.log,
            "steps": len(r.losses),
            "losses": r.losses,
            "check": check_training(r.losses).as_dict(),
            "validation_losses": validation_losses(r.log),
            "export_files": sorted(p.name for p in export.glob("*")) if export.exists() else [],
        }
        log(f"training: {json.dumps(summary['training'], default=str)}")
        save()
        examples = held_out_examples(HELD_OUT)
        score: dict[str, Any] = dict(device="cuda", **PIXELS)
        summary["held_out"] = {"toy": held_out_loss(toy, toy, examples, **score)}
        if r.returncode == 0:
            summary["held_out"]["export"] = held_out_loss(export, toy, examples, **score)
            swapped = swapped_images(examples)
            summary["held_out"]["export_swapped_images"] = held_out_loss(export, toy, swapped, **score)
        log(f"held out: {json.dumps({k: v['loss'] for k, v in summary['held_out'].items()})}")
    except Exception as e:
        summary["errors"].append(f"{type(e).__name__}: {e}")
        log(f"FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    summary["failures"] = failures(summary)
    summary["passed"] = not summary["failures"]
    log(f"gates: {'ok' if not summary['failures'] else summary['failures']}")
    save()
    return summary


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    run(out_dir, Path(sys.argv[2]) if len(sys.argv) > 2 else out_dir / "scratch")
