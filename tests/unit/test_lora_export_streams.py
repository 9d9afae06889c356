"""A LoRA run's export, fed tensors shaped and shared as Megatron-Bridge really streams them.

tests/fixtures/lora_export_structure.json was recorded on a GPU (``python -m lab.lora_export_structure``):
for every one-GPU LoRA recipe, the names, shapes and memory sharing of the adapter stream
(one A for every part of a fused projection, slices of one B, one adapter shared by the experts,
the MTP layer's adapters) and of the merged stream, on the CPU-sized toys made here. The tensors
are rebuilt with that sharing and go through the writers the export runs after training, to the
merged folder and the adapter folder, and through the export's staging.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bridge_recipes.hf import checkpoint as ck
from bridge_recipes.hf import exporter, released
from bridge_recipes.hf.toy import toy_spec
from bridge_recipes.models.dims import spec_dims
from bridge_recipes.plan.params import adapter_folder_params

CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "lora_export_structure.json").read_text())[
    "cases"
]
TOY_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "linear_num_key_heads")
TOY_FIELDS += ("linear_num_value_heads", "vocab_size", "num_experts", "moe_router_topk", "moe_ffn_hidden_size")
TOY_FIELDS += ("moe_shared_expert_ffn_hidden_size", "ffn_hidden_size", "mtp_num_layers")


@pytest.fixture(scope="module")
def toys(tmp_path_factory, lora_streams):
    """The toys the fixture was recorded on (its ``toy`` arguments), one per family."""
    root = tmp_path_factory.mktemp("lora_streams")
    for family in {c["family"] for c in CASES}:
        lora_streams.make_toy(lora_streams.case(family), root / family)
    return root


def test_the_fixture_has_megatrons_sharing():
    """What the writers must survive is in the fixture: one A for several names, B slices, MTP adapters."""
    for case in CASES:
        groups: dict[int, list[str]] = {}
        for e in case["adapter_stream"]:
            groups.setdefault(e["group"], []).append(e["name"])
        shared_a = [names for names in groups.values() if len(names) > 1 and names[0].endswith("lora_A.weight")]
        assert shared_a, case["recipe"]
        assert any(e["name"].startswith(released.MTP_PREFIX) for e in case["adapter_stream"])
        assert any(e["offset"] > 0 for e in case["adapter_stream"])  # slices of one B
        if case["family"] == "dense":
            assert any("mlp.gate_proj" in n for names in shared_a for n in names)
        else:
            assert any("shared_expert.gate_proj" in n for names in shared_a for n in names)
            assert any(".experts.0." in n for names in shared_a for n in names)


@pytest.mark.parametrize("case", CASES, ids=[c["recipe"] for c in CASES])
def test_both_exports_are_written_from_megatrons_streams_and_the_adapter_serves(case, toys, tmp_path, lora_streams):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    src = toys / case["family"]
    folder = ck.inspect_folder(src)
    adapters = lora_streams.rebuild(case["adapter_stream"], seed=1)
    merged = lora_streams.merged_of(case, lora_streams.base_tensors(src), adapters)
    out, adapter_out = tmp_path / "export", tmp_path / "export-adapter"
    rank, alpha = case["lora"]["dim"], case["lora"]["alpha"]
    released.write_lora_exports(iter(merged), lambda: iter(adapters), folder, out, adapter_out, rank=rank, alpha=alpha)

    config = json.loads((adapter_out / released.ADAPTER_CONFIG).read_text())
    from safetensors import safe_open

    with safe_open(str(adapter_out / released.ADAPTER_WEIGHTS), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes and not any(".mtp." in k for k in shapes)
    spec = toy_spec(case["family"], **{k: v for k, v in case["toy"].items() if k in TOY_FIELDS})
    dims = spec_dims(spec)
    targets = frozenset(case["lora"]["target_modules"])
    assert sum(math.prod(s) for s in shapes.values()) == adapter_folder_params(
        dims, list(range(spec.num_layers)), targets, rank
    )  # the planner's count of the folder is what is written
    if case["family"] == "moe":  # the experts as PEFT's and vLLM's 3-D adapters on the stacked expert weights
        assert config["target_parameters"] == ["experts.down_proj", "experts.gate_up_proj"]
        e, h, i = spec.num_experts, spec.hidden_size, spec.moe_ffn_hidden_size
        layer = "base_model.model.model.language_model.layers.0.mlp.experts."
        assert shapes[layer + "base_layer.lora_A.weight"] == [e * rank, h]  # gate_up_proj, the inner wrapper
        assert shapes[layer + "base_layer.lora_B.weight"] == [2 * i, rank * e]
        assert shapes[layer + "lora_A.weight"] == [e * rank, i]  # down_proj, the outer one
        assert shapes[layer + "lora_B.weight"] == [h, rank * e]

    ids = torch.randint(0, 1024, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tuned = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32).eval()(input_ids=ids).logits
        base = AutoModelForImageTextToText.from_pretrained(src, dtype=torch.float32)
        served = PeftModel.from_pretrained(base, adapter_out).eval()(input_ids=ids).logits
    assert (served - tuned).abs().max().item() <= 1e-4
    with torch.no_grad():
        plain = AutoModelForImageTextToText.from_pretrained(src, dtype=torch.float32).eval()(input_ids=ids).logits
    assert (plain - tuned).abs().max().item() > 1e-2  # the adapters are in both


def test_an_adapter_failure_keeps_the_merged_export_and_says_so(toys, tmp_path, lora_streams):
    """Through the export's staging: the merged folder is complete and kept, the adapter folder
    absent, and the error names both."""
    case = next(c for c in CASES if c["family"] == "moe")
    src = toys / "moe"
    adapters = lora_streams.rebuild(case["adapter_stream"], seed=2)
    merged = lora_streams.merged_of(case, lora_streams.base_tensors(src), adapters)
    megatron = tmp_path / "ckpt"
    (megatron / "iter_0000002").mkdir(parents=True)
    (megatron / "latest_checkpointed_iteration.txt").write_text("2\n")
    (megatron / "iter_0000002" / "run_config.yaml").write_text(  # a LoRA run's saved config, as training writes it
        "peft:\n  _target_: megatron.bridge.peft.lora.LoRA\n  dim: 32\n  alpha: 32\nmodel:\n  num_layers: 4\n"
    )

    def broken_adapters():
        raise OSError(28, "No space left on device")

    def convert(megatron, template, out, *, text_only, adapter_out):
        released.write_lora_exports(
            iter(merged), broken_adapters, ck.inspect_folder(template), out, adapter_out, rank=32, alpha=32
        )

    out = tmp_path / "export"
    with pytest.raises(released.AdapterExportError, match="No space left") as err:
        exporter.export_checkpoint(megatron, src, out, text_model=True, released_convert=convert, progress=False)
    assert str(out) in str(err.value) and str(released.adapter_folder(out)) in str(err.value)
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))
    assert not released.adapter_folder(out).exists()
    assert not list(tmp_path.glob(".export*partial*"))
