"""Command line of scripts/convert_checkpoint.py.

    convert_checkpoint.py import --hf DIR --recipe NAME --out DIR [--scaled] [--overwrite]
    convert_checkpoint.py export --megatron DIR --hf-template DIR --recipe NAME --out DIR [--scaled] [--overwrite]
                                 [--export-text-only]
    convert_checkpoint.py toy --family moe|dense [--text-only] --out DIR
    convert_checkpoint.py safetensors --hf DIR --out DIR [--overwrite]

Runs offline (HF_HUB_OFFLINE=1; a hub id is used only when it is already in the local Hugging
Face cache). Exit status 0 on success, 2 on bad input (the message names the field or file and
the fix), 3 when a LoRA export wrote its merged folder but not its adapter folder, 1 on a failure
inside the conversion (one line; the stack in a file it names); nothing is written to --out unless
the whole conversion succeeded.
"""

from __future__ import annotations

import argparse
import os
import sys

from bridge_recipes.hf.files import EXPORT_FAILED
from bridge_recipes.utils import quiet

USAGE_ERROR = 2
RECIPE_HELP = (
    "recipe name as run_recipe.py takes it, qwen36_ and qwen38_ names included "
    "(or a catalog model, e.g. qwen35_35b_a3b)"
)
RELEASED_TOY_MTP_LAYERS = 1  # the MTP depth of every released Qwen3.5/3.6 checkpoint


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert Qwen3.5/3.6 checkpoints between Hugging Face folders and Megatron distributed "
        "checkpoints (Megatron-Bridge's AutoBridge), checked against a recipe's model first.",
    )
    quiet.add_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    scaled_help = (
        "toy or scaled-down checkpoint: compare only the family fields (model class, full-attention interval, "
        "head and GDN head dimensions, convolution width, rotary fraction, tied embeddings), not the sizes"
    )
    imp = sub.add_parser(
        "import", help="Hugging Face folder -> Megatron checkpoint (checkpoint.pretrained_checkpoint)"
    )
    imp.add_argument("--hf", required=True, metavar="DIR", help="local HF folder, or a hub id in the local HF cache")
    imp.add_argument("--recipe", required=True, help=RECIPE_HELP)
    imp.add_argument("--out", required=True, metavar="DIR", help="new Megatron checkpoint folder")
    imp.add_argument("--scaled", action="store_true", help=scaled_help)
    imp.add_argument("--overwrite", action="store_true", help="replace a non-empty --out once the new one is complete")
    imp.add_argument("--no-progress", action="store_true")
    exp = sub.add_parser("export", help="Megatron checkpoint -> Hugging Face folder")
    exp.add_argument("--megatron", required=True, metavar="DIR", help="a run's checkpoint.save folder (newest iter_*)")
    exp.add_argument(
        "--hf-template", required=True, metavar="DIR", help="the HF folder trained from (config and tokenizer)"
    )
    exp.add_argument("--recipe", required=True, help=RECIPE_HELP)
    exp.add_argument("--out", required=True, metavar="DIR", help="new Hugging Face folder")
    exp.add_argument("--scaled", action="store_true", help=scaled_help)
    exp.add_argument("--overwrite", action="store_true", help="replace a non-empty --out once the new one is complete")
    exp.add_argument(
        "--export-text-only",
        action="store_true",
        help="a text recipe trained from a released (VL) folder: the text form (no vision tower) instead",
    )
    exp.add_argument("--no-progress", action="store_true")
    st = sub.add_parser(
        "safetensors",
        help="a Hugging Face folder of PyTorch .bin weights -> the same folder with safetensors (every tensor kept)",
    )
    st.add_argument("--hf", required=True, metavar="DIR", help="local HF folder holding pytorch_model*.bin")
    st.add_argument("--out", required=True, metavar="DIR", help="new Hugging Face folder")
    st.add_argument("--overwrite", action="store_true", help="replace a non-empty --out this tool wrote")
    toy = sub.add_parser(
        "toy",
        help="save a small random-init HF checkpoint in the released form (VL with MTP; --text-only: the text form)",
    )
    toy.add_argument(
        "--family",
        choices=("moe", "dense"),
        default="moe",
        help="moe: a tiny 35B-A3B-like model (default); dense: 27B-like",
    )
    form = toy.add_mutually_exclusive_group()
    form.add_argument(
        "--text-only",
        action="store_true",
        help="the text form (Qwen3_5(Moe)ForCausalLM, no vision tower, no MTP) instead of the released form",
    )
    form.add_argument(
        "--vl", action="store_true", help="the released vision-language form with its MTP layer (the default)"
    )
    toy.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    toy.add_argument(
        "--tokenizer-json",
        help="tokenizer.json to ship, with the chat_template.jinja beside it if there is one "
        "(default: a small byte BPE trained here, no chat template)",
    )
    toy.add_argument("--out", required=True, metavar="DIR", help="new Hugging Face folder for the toy checkpoint")
    toy.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from bridge_recipes.hardware.installed import training_stack_problem

    if problem := training_stack_problem(f"convert_checkpoint.py {args.command}"):
        print(f"convert_checkpoint.py: error: {problem}", file=sys.stderr)
        return 2
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf import exporter, importer
    from bridge_recipes.hf.files import AdapterExportError, HfCheckpointError

    try:
        if args.command == "import":
            out = importer.import_checkpoint(
                args.hf,
                args.out,
                recipe=args.recipe,
                scaled=args.scaled,
                overwrite=args.overwrite,
                progress=not args.no_progress,
            )
            print(f"imported {args.hf} -> {out} (use as checkpoint.pretrained_checkpoint={out})")
        elif args.command == "export":
            out = exporter.export_checkpoint(
                args.megatron,
                args.hf_template,
                args.out,
                recipe=args.recipe,
                scaled=args.scaled,
                overwrite=args.overwrite,
                progress=not args.no_progress,
                text_only=args.export_text_only,
            )
            print(f"exported {args.megatron} -> {out} (transformers' from_pretrained loads it)")
        elif args.command == "safetensors":
            from bridge_recipes.hf.from_bin import convert_folder

            shards, tensors = convert_folder(args.hf, args.out, overwrite=args.overwrite)
            print(f"wrote {args.out}: {tensors} tensors in {shards} safetensors shard(s) (pass it as --hf-checkpoint)")
        else:
            from bridge_recipes.hf.toy import make_toy

            ck.refuse_overlap(args.out, ("--tokenizer-json", args.tokenizer_json), overwrite=args.overwrite)
            with ck.staged_output(args.out, args.overwrite) as tmp:
                vl = not args.text_only  # the released form: VL with its MTP layer
                spec = make_toy(
                    tmp,
                    args.family,
                    vl=vl,
                    seed=args.seed,
                    tokenizer_json=args.tokenizer_json,
                    mtp_num_layers=RELEASED_TOY_MTP_LAYERS if vl else 0,
                )
            form = "text form" if args.text_only else f"released form: VL with {RELEASED_TOY_MTP_LAYERS} MTP layer"
            print(f"saved toy {spec.name} ({form}) -> {args.out}")
            if vl and args.tokenizer_json:  # the VL builder needs the processor a toy otherwise ships
                print(
                    "note: with --tokenizer-json the toy has no image processor: text recipes take it; for "
                    "scripts/build_vl_dataset.py --processor make the toy without --tokenizer-json (it then ships "
                    "the offline Qwen-VL processor, image tokens included)",
                    file=sys.stderr,
                )
    except HfCheckpointError as e:
        print(f"convert_checkpoint.py: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except AdapterExportError as e:
        print(f"convert_checkpoint.py: error: {e}{_unchanged(args)}", file=sys.stderr)
        return EXPORT_FAILED
    except Exception as e:  # a failure inside Megatron-Bridge: one line, the partial output already removed
        from bridge_recipes.hf.run_hooks import stack_file

        print(
            f"convert_checkpoint.py: conversion failed: {type(e).__name__}: {e}{_unchanged(args)} "
            f"(stack: {stack_file(e)})",
            file=sys.stderr,
        )
        return 1
    return 0


def _unchanged(args: argparse.Namespace) -> str:
    """What a failed export leaves as it was: the checkpoint it reads."""
    return f"; the checkpoint in {args.megatron} is unchanged" if args.command == "export" else ""


if __name__ == "__main__":  # python -m bridge_recipes.hf.cli: scripts/convert_checkpoint.py from any folder
    from bridge_recipes.utils.outputs import exit_on_termination

    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    exit_on_termination()  # a kill removes the staging folder beside --out
    sys.exit(main())
