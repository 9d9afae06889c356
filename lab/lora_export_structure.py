"""Record, on a GPU, the structure of the two tensor streams a LoRA export writes, as a test fixture.

    python -m lab.lora_export_structure --out tests/fixtures/lora_export_structure.json [--scratch DIR]

For each family (``moe``: the 35B-A3B shape, ``dense``: the 27B) and each one-GPU LoRA recipe of it:
a CPU-sized toy in the released form (the sizes the CPU tests make their toys with), Megatron-Bridge's
text model of it with the recipe's LoRA wrapped around it (the released text bridge and the LoRA
settings a run saves, as the export builds them), its adapters set nonzero; then the streams the
export writes, ``export_adapter_weights`` and ``export_hf_weights(merge_adapter_weights=True)``,
recorded name by name: shape, dtype, and which names share one tensor's memory (a storage group,
with each name's offset and strides in it). The CPU tests rebuild tensors with this sharing and
put them through the export's writers; :func:`stream_structure` is also what the GPU proof of the
released road records of a real run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

from lab import ROOT

FIXTURE = ROOT / "tests/fixtures/lora_export_structure.json"
TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer/tokenizer.json"
# The one-GPU LoRA recipes of each family whose LoRA settings are recorded.
RECIPES = {
    "moe": ("qwen35_35b_a3b_peft_1gpu_h100_bf16_config", "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"),
    "dense": ("qwen35_27b_peft_1gpu_h100_fp8base_config",),
}


def stream_structure(stream: Any) -> list[dict[str, Any]]:
    """Each (name, tensor) of ``stream``: name, shape, dtype and storage group (names sharing one
    tensor's memory have one group; ``offset`` / ``stride`` place each in it, ``storage`` is the
    group's size in elements). Every tensor is held until the end, so no address is reused."""
    held, groups, out = [], {}, []
    for name, tensor in stream:
        held.append(tensor)
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        out.append(
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "group": groups.setdefault(key, len(groups)),
                "offset": int(tensor.storage_offset()),
                "stride": list(tensor.stride()),
                "storage": storage.nbytes() // tensor.element_size(),
            }
        )
    return out


_EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


def condensed(stream: list[dict[str, Any]], keep_experts: int = 2) -> dict[str, Any]:
    """A :func:`stream_structure` record with the routed experts past the first ``keep_experts`` left
    out (each expert's entries have the same form), and the expert count: a real model's record fits
    a file a test reads."""
    experts = [int(m.group(1)) for e in stream if (m := _EXPERT_INDEX.search(e["name"]))]
    kept = [e for e in stream if not (m := _EXPERT_INDEX.search(e["name"])) or int(m.group(1)) < keep_experts]
    return {"experts": max(experts) + 1 if experts else 0, "kept_experts": keep_experts, "adapter_stream": kept}


def sharing(stream: list[dict[str, Any]]) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Each name's partners in memory within its own module (the names of one projection's parent,
    e.g. one expert or one attention block, that share its tensor) and whether it starts inside the
    tensor (a slice): the part of the structure that does not depend on the model's widths or on
    where the tensors live (a model on the CPU hands the experts one tensor, one on the GPU a copy each)."""
    groups: dict[int, list[str]] = {}
    for e in stream:
        groups.setdefault(e["group"], []).append(e["name"])

    def parent(name: str) -> str:
        return name.rsplit(".", 3)[0]

    return {
        e["name"]: (
            tuple(sorted(n for n in groups[e["group"]] if n != e["name"] and parent(n) == parent(e["name"]))),
            e["offset"] > 0,
        )
        for e in stream
    }


def lora_settings_of(recipe: str) -> dict[str, Any]:
    """The LoRA fields of ``recipe``'s config, as a run saves them in its checkpoint."""
    import bridge_recipes

    peft = bridge_recipes.build(recipe).peft
    return {f.name: getattr(peft, f.name) for f in dataclasses.fields(peft) if f.init}


def capture(toy: Path, settings: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Both export streams of ``toy`` with the LoRA of ``settings`` around it, adapters nonzero."""
    import torch

    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf.adapters import lora_from_settings
    from bridge_recipes.hf.released_bridge import released_text_bridge

    bridge = released_text_bridge(ck.inspect_folder(toy))
    lora = lora_from_settings(settings)
    with ck._conversion_context():
        provider = bridge.to_megatron_provider(load_weights=True)
        ck._no_apex_fusion(provider)
        provider.finalize()
        provider.register_pre_wrap_hook(lambda chunks: lora(chunks, training=False))
        model = provider.provide_distributed_model(
            wrap_with_ddp=False, use_cpu_initialization=True, init_model_with_meta_device=False
        )
        g = torch.Generator(device="cpu").manual_seed(seed)
        adapters = [(n, p) for n, p in model[0].named_parameters() if "adapter" in n]
        with torch.no_grad():
            for _, p in adapters:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
        adapter_stream = stream_structure(bridge.export_adapter_weights(model, cpu=True, show_progress=False))
        merged_stream = stream_structure(
            bridge.export_hf_weights(model, cpu=True, show_progress=False, merge_adapter_weights=True)
        )
    return {
        "lora": {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items() if _plain(v)},
        "megatron_adapter_parameters": [n for n, _ in adapters],
        "adapter_stream": adapter_stream,
        "merged_stream": merged_stream,
    }


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, tuple))


def toy_kwargs(family: str) -> dict[str, Any]:
    """The CPU tests' released-form toy of ``family`` (tests/unit/test_released_folders.py)."""
    from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES

    kw: dict[str, Any] = dict(vl=True, mtp_num_layers=1, dtype="float32", tokenizer_json=TOKENIZER, **CPU_SIZES)
    kw.update(CPU_MOE_SIZES if family == "moe" else {"ffn_hidden_size": 128})
    return kw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.lora_export_structure", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=FIXTURE)
    p.add_argument("--scratch", type=Path, default=Path("/tmp/lora_export_structure"))
    args = p.parse_args(argv)
    import megatron.bridge  # noqa: F401  (before any cuDNN work)
    import torch

    from bridge_recipes.hf.toy import make_toy

    record: dict[str, Any] = {
        "what": "the tensor streams of a LoRA export, as Megatron-Bridge produces them",
        "command": "python -m lab.lora_export_structure",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "hardware": f"1x {torch.cuda.get_device_name(0)}",
        "cases": [],
    }
    for family, recipes in RECIPES.items():
        toy = args.scratch / family
        if not (toy / "config.json").is_file():
            make_toy(toy, family, **toy_kwargs(family))
        for recipe in recipes:
            case = {"family": family, "recipe": recipe, "toy": toy_kwargs(family) | {"tokenizer_json": None}}
            case.update(capture(toy, lora_settings_of(recipe)))
            record["cases"].append(case)
            counts = len(case["adapter_stream"]), len(case["merged_stream"])
            print(f"{family} {recipe}: {counts[0]} adapter tensors, {counts[1]} merged")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
