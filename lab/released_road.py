"""GPU proof of the released-checkpoint road (one GPU of 140 GB: the H200 recipe's full SFT).

    python -m lab.released_road [--out lab/results/released_checkpoint_road.json] [--scratch DIR]
                                [--cases moe_lora,dense_lora,moe_lora_48gb,moe_sft,dense_sft] [--steps 40]
                                [--sizes real|toy]

For each case (:data:`CASES`): a toy in the released form (VL, one MTP layer, a small vision tower)
at 4 layers of its family's shape (the 27B dense, the 35B-A3B MoE; ``--sizes real``: the released
models' own widths, ``toy``: the small toy widths), conversations of our own built into rows with a
validation split, then ``run_recipe.py --hf-checkpoint TOY --export-hf EXPORT`` with a text recipe
(LoRA on the 80 GB and 48 GB recipes, full SFT on an H200 recipe) for ``--steps`` steps. Each export is checked:
transformers loads it as the toy's class, the vision tower is byte for byte the toy's, the MTP layer
is there, its text logits (FP32, every expert routed) match the trained Megatron model's, a LoRA
run's adapter folder on the toy (loaded with PEFT as docs/lora.md says) gives the merged export's
logits, and the held-out loss (on conversations no build has seen, by transformers) falls from the
toy's to the export's. A LoRA run's adapter stream is recorded beside the result
(:func:`lab.lora_export_structure.stream_structure`), to check the CPU tests' fixture against.

The result file is a list of :func:`record` dicts, one per case and export (``merged``, and
``adapter`` for LoRA); a run replaces the records of its cases and keeps the others, so cases can
run on different machines or widths (``widths`` says which). :func:`failures` are the gates. The
parts a CPU can check (arguments, records, gates, the byte comparison) are tested in
lab/tests/test_released_road.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import struct
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_recipes.hf.parity import REL_ERR_MAX
from lab import ROOT

RESULT = ROOT / "lab/results/released_checkpoint_road.json"
TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer/tokenizer.json"
FIELDS = (
    "family",
    "recipe",
    "peft",
    "export",
    "transformers_class",
    "vision_bytes_equal",
    "mtp_present",
    "text_logits_rel_err",
    "adapter_vs_merged_max_abs_diff",
    "val_loss_start",
    "val_loss_end",
    "widths",
    "date",
    "hardware",
)
# Base + adapter against the merged export, FP32 logits: the same function up to rounding.
ADAPTER_MAX_ABS_DIFF = 1e-3
STEPS = 40
EVAL_INTERVAL = 10
HELD_OUT_CONVERSATIONS = 32
HELD_OUT_SEED = 7  # the training conversations use seed 0


@dataclass(frozen=True)
class Case:
    name: str
    family: str  # "dense" (the 27B shape) or "moe" (the 35B-A3B shape)
    recipe: str
    peft: bool
    lr: float
    run_args: tuple[str, ...] = ()  # e.g. the card's memory the run is capped at


# In the order users need them: the 80 GB LoRA recipes, the 48 GB one, then full SFT.
CASES = {
    c.name: c
    for c in (
        Case("moe_lora", "moe", "qwen35_35b_a3b_peft_1gpu_h100_bf16_config", True, 3e-4),
        Case("dense_lora", "dense", "qwen35_27b_peft_1gpu_h100_fp8base_config", True, 3e-4),
        Case(
            "moe_lora_48gb",
            "moe",
            "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config",
            True,
            3e-4,
            ("--gpu-memory-gb", "48"),
        ),
        Case("moe_sft", "moe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", False, 3e-5),
        Case("dense_sft", "dense", "qwen35_27b_sft_8gpu_h200_bf16_config", False, 3e-5),
    )
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab.released_road", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=RESULT, help="result file (a JSON list of records)")
    p.add_argument("--scratch", type=Path, default=Path("/tmp/released_road"), help="toys, rows, runs, exports")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--sizes", choices=("real", "toy"), default="real", help="the released widths or the toy's")
    args = p.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown or not args.cases:
        p.error(
            f"--cases {args.cases}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(CASES)}"
        )
    if args.steps < 2 * EVAL_INTERVAL:
        p.error(f"--steps {args.steps}: at least {2 * EVAL_INTERVAL}, so the run validates twice")
    if args.out.exists() and args.out.is_dir():
        p.error(f"--out {args.out} is a folder; give a file path")
    args.cases = [CASES[c] for c in args.cases.split(",")]
    return args


def previous_records(file: Path) -> list[dict[str, Any]]:
    """The records an earlier run wrote to ``file`` (none when it is missing or not a list)."""
    try:
        found = json.loads(file.read_text())
    except (OSError, ValueError):
        return []
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def record(
    case: Case, export: str, checks: dict[str, Any], *, date: str, hardware: str, widths: str = "real"
) -> dict[str, Any]:
    """One result: the case, the export (``merged`` / ``adapter``) and its checks, in :data:`FIELDS`."""
    rec = {
        "family": case.family,
        "recipe": case.recipe,
        "peft": "lora" if case.peft else None,
        "export": export,
        "widths": widths,
        "date": date,
        "hardware": hardware,
    }
    for name in FIELDS:
        rec.setdefault(name, checks.get(name))
    return {name: rec[name] for name in FIELDS}


def failures(records: list[dict[str, Any]]) -> list[str]:
    """The gates, one line per miss: every case has its merged export (and a LoRA case its adapter
    export), each of the input's class with the vision tower byte for byte and the MTP layer, text
    logits within :data:`REL_ERR_MAX` of Megatron's, adapter within :data:`ADAPTER_MAX_ABS_DIFF` of
    merged, and a held-out loss below the toy's."""
    out = []
    for r in records:
        where = f"{r.get('recipe')} {r.get('export')}"
        if missing := [f for f in FIELDS if f not in r]:
            out.append(f"{where}: lacks {', '.join(missing)}")
            continue
        if r["export"] == "merged":
            if not r["transformers_class"] or "ForConditionalGeneration" not in r["transformers_class"]:
                out.append(f"{where}: transformers loaded it as {r['transformers_class']}, not the released class")
            if r["vision_bytes_equal"] is not True:
                out.append(f"{where}: the vision tower is not byte for byte the input's")
            if r["mtp_present"] is not True:
                out.append(f"{where}: the MTP layer is missing")
        rel = r["text_logits_rel_err"]
        if rel is None or rel > REL_ERR_MAX:
            out.append(f"{where}: text logits rel err {rel} against Megatron's (gate {REL_ERR_MAX:g})")
        if r["peft"] and (d := r["adapter_vs_merged_max_abs_diff"]) is not None and d > ADAPTER_MAX_ABS_DIFF:
            out.append(f"{where}: base + adapter differs from the merged export by {d:.2e}")
        if r["peft"] and r["adapter_vs_merged_max_abs_diff"] is None:
            out.append(f"{where}: no adapter-against-merged comparison")
        start, end = r["val_loss_start"], r["val_loss_end"]
        if start is None or end is None or not end < start:
            out.append(f"{where}: held-out loss {start} -> {end} did not fall")
    for case in {(r.get("recipe"), r.get("peft")) for r in records}:
        exports = {r.get("export") for r in records if (r.get("recipe"), r.get("peft")) == case}
        need = {"merged", "adapter"} if case[1] else {"merged"}
        if need - exports:
            out.append(f"{case[0]}: no {', '.join(sorted(need - exports))} export")
    return out


# --------------------------------------------------------------------------- checks on folders (CPU)


def _index(folder: Path) -> dict[str, str]:
    """Tensor name -> shard file of ``folder`` as its index (or single shard) says, read as it is: a
    folder these checks compare may be incomplete, which they report rather than refuse."""
    from bridge_recipes.hf.files import INDEX_FILE, SINGLE_FILE, safetensors_header

    if (folder / INDEX_FILE).is_file():
        return dict(json.loads((folder / INDEX_FILE).read_text())["weight_map"])
    header, _ = safetensors_header(folder / SINGLE_FILE)
    return {name: SINGLE_FILE for name in header if name != "__metadata__"}


def _raw(folder: Path, file: str, names: list[str]) -> dict[str, tuple[str, bytes]]:
    from bridge_recipes.hf.files import safetensors_header

    header, _ = safetensors_header(folder / file)
    out = {}
    with open(folder / file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        for name in names:
            start, end = header[name]["data_offsets"]
            f.seek(8 + n + start)
            out[name] = (header[name]["dtype"], f.read(end - start))
    return out


def vision_bytes_equal(original: Path, export: Path) -> bool:
    """Every vision tensor of ``original`` in ``export`` with the same dtype and bytes, and the
    same ``vision_config``."""
    from bridge_recipes.hf.released import kind_of

    a, b = _index(original), _index(export)
    vision = [n for n in a if kind_of(n) == "vision"]
    if not vision or any(n not in b for n in vision):
        return False
    for file in {a[n] for n in vision}:
        names = [n for n in vision if a[n] == file]
        mine = _raw(original, file, names)
        for other in {b[n] for n in names}:
            theirs = _raw(export, other, [n for n in names if b[n] == other])
            if any(mine[n] != theirs[n] for n in theirs):
                return False
    configs = [json.loads((f / "config.json").read_text()).get("vision_config") for f in (original, export)]
    return configs[0] is not None and configs[0] == configs[1]


def mtp_present(original: Path, export: Path) -> bool:
    """Every MTP tensor of ``original`` (there is at least one) is in ``export``."""
    from bridge_recipes.hf.released import kind_of

    a, b = _index(original), _index(export)
    mtp = [n for n in a if kind_of(n) == "mtp"]
    return bool(mtp) and all(n in b for n in mtp)


# --------------------------------------------------------------------------- GPU side


def held_out_loss(model: Any, tokenizer: Any, conversations: list[dict]) -> float:
    """Mean next-token loss of ``model`` over ``conversations`` (records as the row builder reads
    them) rendered with the chat template, on the model's device."""
    import torch

    from bridge_recipes.chat.chat_template import normalize_conversation

    device = next(model.parameters()).device
    total, count = 0.0, 0
    for conv in conversations:
        messages, _ = normalize_conversation(conv["messages"])
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_tensors="pt")
        ids = (ids["input_ids"] if hasattr(ids, "keys") else ids).to(device)
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids)
        total += float(out.loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    return total / count


def _hf(cls: Any, folder: Path, experts: int | None, device: str = "cuda") -> Any:
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    if experts:  # every expert routed: no routing flip between the two sides
        config.text_config.num_experts_per_tok = experts
    return cls.from_pretrained(str(folder), config=config, dtype=torch.float32).to(device).eval()


def _megatron(ckpt: Path, template: Path, experts: int | None) -> Any:
    """The trained text model (a LoRA run: the toy's base with its adapters) in FP32 on the GPU."""
    import torch

    from bridge_recipes.hf import adapters
    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf.parity import _unwrap
    from bridge_recipes.hf.released_bridge import released_text_bridge

    overrides: dict[str, Any] = {"gradient_accumulation_fusion": False}
    if experts:
        overrides["moe_router_topk"] = experts
    bridge = released_text_bridge(ck.inspect_folder(template))
    settings = adapters.lora_settings(ckpt)
    if settings is None:
        models = bridge.load_megatron_model(str(ckpt), mp_overrides=overrides, wrap_with_ddp=False)
    else:
        models, _ = adapters.build_lora_model(bridge, ckpt, settings, overrides=overrides)
    return _unwrap(models[0]).to(torch.float32).cuda().eval()


def run_case(case: Case, args: argparse.Namespace, log: Any, date: str, hardware: str) -> list[dict[str, Any]]:
    import os
    import subprocess

    import torch

    from bridge_recipes.bench.runs import launch
    from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows
    from bridge_recipes.hf import parity
    from bridge_recipes.hf.released import adapter_folder
    from bridge_recipes.hf.toy import make_toy, real_width_sizes
    from bridge_recipes.logs.megatron_log import validation_losses

    scratch = args.scratch / args.sizes
    toy, rows = scratch / f"toy_{case.family}", scratch / f"rows_{case.family}"
    if not (toy / "config.json").is_file():
        sizes = real_width_sizes(case.family) if args.sizes == "real" else {}
        sizes["mtp_num_layers"] = 1
        make_toy(toy, case.family, vl=True, tokenizer_json=TOKENIZER, **sizes)
    if not (rows / "manifest.json").is_file():
        build_evidence_rows(rows, toy)  # our own conversations, 10% of them the validation split
    ckpt, export = scratch / f"{case.name}_ckpt", scratch / f"{case.name}_export"
    for p in (ckpt, export, adapter_folder(export)):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    os.environ["QWEN35_RECIPES_CACHE"] = str(scratch / "cache")
    run_args = [
        "--scale-down", "4", "-sl", str(EVIDENCE_ROW_TOKENS), "-gb", "4", "--max-steps", str(args.steps),
        "--lr", str(case.lr), "--min-lr", str(case.lr / 10), "--warmup-iters", "2",
        "--dataset", "sft-rows", f"dataset.path={rows}",
        "--hf-checkpoint", str(toy), "--save-dir", str(ckpt), "--save-interval", str(args.steps),
        "--export-hf", str(export),
        "checkpoint.load=null", "checkpoint.async_save=false",
        f"validation.eval_interval={EVAL_INTERVAL}", "validation.eval_iters=2",
    ]  # fmt: skip
    run_args += list(case.run_args)
    r = launch(case.name, case.recipe, run_args, args.out.parent / f"released_road_{case.name}.log", timeout_s=3000)
    log(f"{case.name}: exit {r.returncode}, {len(r.losses)} steps, validation {validation_losses(r.log)}")
    if r.returncode != 0:
        raise RuntimeError(f"{case.name}: the run exited {r.returncode}")

    experts = json.loads((toy / "config.json").read_text())["text_config"].get("num_experts")
    tokens = parity.parity_tokens()[:2, :256]
    parity.init_single_gpu()
    trained = _megatron(ckpt, toy, experts)
    megatron_logits = parity.megatron_logits(trained, tokens)
    if case.peft:
        from bridge_recipes.hf import checkpoint as ck
        from bridge_recipes.hf.released_bridge import released_text_bridge
        from lab.lora_export_structure import condensed, stream_structure

        try:  # a record beside the result, never a reason to lose the case
            bridge = released_text_bridge(ck.inspect_folder(toy))
            structure = stream_structure(bridge.export_adapter_weights([trained], cpu=True, show_progress=False))
            file = args.out.parent / f"released_road_{case.name}_adapter_stream.json"
            record_ = {"recipe": case.recipe, "widths": args.sizes, "hardware": hardware, **condensed(structure)}
            file.write_text(json.dumps(record_, indent=1) + "\n")
        except Exception:
            log(f"{case.name}: adapter stream not recorded:\n{traceback.format_exc()}")
    del trained
    checks = check_exports(case, toy, export, tokens, megatron_logits, device="cuda")
    torch.cuda.empty_cache()
    return [record(case, kind, c, date=date, hardware=hardware, widths=args.sizes) for kind, c in checks.items()]


def check_exports(case: Case, toy: Path, export: Path, tokens: Any, reference: Any, *, device: str) -> dict[str, dict]:
    """The checks of a case's exports against the input ``toy`` and the trained model's logits
    ``reference`` on ``tokens`` (every expert routed): ``merged`` and, for LoRA, ``adapter`` (PEFT over
    ``AutoModelForImageTextToText`` of the original, as docs/lora.md loads it). Transformers on ``device``
    (a CPU for the toys of the tests)."""
    import transformers
    from peft import PeftModel

    from bridge_recipes.data.synthetic_chat import conversations_jsonl
    from bridge_recipes.hf import parity
    from bridge_recipes.hf.released import adapter_folder

    experts = json.loads((toy / "config.json").read_text())["text_config"].get("num_experts")
    cls = transformers.AutoModelForImageTextToText
    merged = _hf(cls, export, experts, device)
    merged_logits = parity.hf_logits(merged, tokens)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(toy))
    held = [json.loads(line) for line in conversations_jsonl(HELD_OUT_CONVERSATIONS, seed=HELD_OUT_SEED).splitlines()]
    base = _hf(cls, toy, None, device)
    start = held_out_loss(base, tokenizer, held)
    out = {
        "merged": {
            "transformers_class": type(merged).__name__,
            "vision_bytes_equal": vision_bytes_equal(toy, export),
            "mtp_present": mtp_present(toy, export),
            "text_logits_rel_err": parity.compare_logits(merged_logits, reference)["rel_err"],
            "val_loss_start": round(start, 5),
            "val_loss_end": round(held_out_loss(_hf(cls, export, None, device), tokenizer, held), 5),
        }
    }
    del merged
    if case.peft:
        adapted = PeftModel.from_pretrained(_hf(cls, toy, experts, device), str(adapter_folder(export))).eval()
        adapter_logits = parity.hf_logits(adapted, tokens)
        diff = float((adapter_logits - merged_logits).abs().max())
        out["merged"]["adapter_vs_merged_max_abs_diff"] = diff
        del adapted
        plain = PeftModel.from_pretrained(base, str(adapter_folder(export))).eval()
        out["adapter"] = {
            "transformers_class": f"PeftModel({type(plain.get_base_model()).__name__})",
            "text_logits_rel_err": parity.compare_logits(adapter_logits, reference)["rel_err"],
            "adapter_vs_merged_max_abs_diff": diff,
            "val_loss_start": round(start, 5),
            "val_loss_end": round(held_out_loss(plain, tokenizer, held), 5),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import megatron.bridge  # noqa: F401  (before any cuDNN work)
    import torch

    from lab.hf_evidence import Log

    args.scratch.mkdir(parents=True, exist_ok=True)
    log = Log(args.scratch / "released_road.log")
    hardware = f"1x {torch.cuda.get_device_name(0)}"
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
    ran = {c.recipe for c in args.cases}
    records = [r for r in previous_records(args.out) if r.get("recipe") not in ran]
    for case in args.cases:
        try:
            records += run_case(case, args, log, date, hardware)
        except Exception:
            log(f"{case.name} failed:\n{traceback.format_exc()}")
        args.out.write_text(json.dumps(records, indent=1) + "\n")
    problems = failures(records) + [
        f"{c.recipe}: no result" for c in args.cases if not any(r["recipe"] == c.recipe for r in records)
    ]
    for line in problems:
        log(f"gate: {line}")
    log(f"{len(records)} record(s) in {args.out}; {'passed' if not problems else f'{len(problems)} gate(s) missed'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
