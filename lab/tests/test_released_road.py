"""The CPU-checkable parts of the released-checkpoint road's GPU proof: its arguments, its records
and gates, and the byte and MTP comparisons of an export with its input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab import released_road as road

DATE, HW = "2026-01-01T00:00Z", "1x NVIDIA H200"


def good(case: road.Case) -> list[dict]:
    checks = {
        "transformers_class": "Qwen3_5MoeForConditionalGeneration",
        "vision_bytes_equal": True,
        "mtp_present": True,
        "text_logits_rel_err": 1e-3,
        "adapter_vs_merged_max_abs_diff": 1e-5 if case.peft else None,
        "val_loss_start": 6.0,
        "val_loss_end": 4.0,
    }
    out = [road.record(case, "merged", checks, date=DATE, hardware=HW)]
    if case.peft:
        out.append(
            road.record(case, "adapter", {**checks, "transformers_class": "PeftModel(x)"}, date=DATE, hardware=HW)
        )
    return out


def test_arguments_default_to_every_case_and_refuse_unknown_ones(tmp_path, capsys):
    args = road.parse_args([])
    assert [c.name for c in args.cases] == list(road.CASES) and args.out == road.RESULT and args.steps == road.STEPS
    assert {c.family for c in args.cases} == {"dense", "moe"} and {c.peft for c in args.cases} == {True, False}
    with pytest.raises(SystemExit) as e:
        road.parse_args(["--cases", "moe_lora,nope"])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        road.parse_args(["--steps", str(road.EVAL_INTERVAL)])
    with pytest.raises(SystemExit):
        road.parse_args(["--out", str(tmp_path)])


def test_records_have_the_result_fields_in_order():
    rec = road.record(road.CASES["dense_sft"], "merged", {"val_loss_end": 1.0, "other": 2}, date=DATE, hardware=HW)
    assert tuple(rec) == road.FIELDS
    assert (rec["family"], rec["peft"], rec["val_loss_end"], rec["mtp_present"]) == ("dense", None, 1.0, None)
    assert road.record(road.CASES["moe_lora"], "adapter", {}, date=DATE, hardware=HW)["peft"] == "lora"


def test_the_gates_pass_good_records_and_name_each_miss():
    records = [r for c in road.CASES.values() for r in good(c)]
    assert road.failures(records) == []
    lora = good(road.CASES["moe_lora"])
    bad = [
        ({"vision_bytes_equal": False}, "vision tower"),
        ({"mtp_present": False}, "MTP"),
        ({"transformers_class": "Qwen3_5MoeForCausalLM"}, "released class"),
        ({"text_logits_rel_err": 2 * road.REL_ERR_MAX}, "rel err"),
        ({"adapter_vs_merged_max_abs_diff": 1.0}, "base + adapter"),
        ({"val_loss_end": 7.0}, "did not fall"),
    ]
    for change, words in bad:
        (line,) = road.failures([{**lora[0], **change}, lora[1]])
        assert words in line and "qwen35_35b_a3b_peft" in line
    (line,) = road.failures(lora[:1])
    assert "no adapter export" in line
    (line,) = road.failures([{k: v for k, v in lora[0].items() if k != "date"}, lora[1]])
    assert "lacks date" in line


@pytest.fixture(scope="module")
def toy_and_export(tmp_path_factory):
    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf.released import kind_of, weight_layout, write_export
    from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy

    root = tmp_path_factory.mktemp("road")
    make_toy(root / "toy", "moe", vl=True, mtp_num_layers=1, max_shard_size="300KB", **CPU_SIZES, **CPU_MOE_SIZES)
    folder = ck.inspect_folder(root / "toy")
    from safetensors import safe_open

    tensors = []
    for name, file in weight_layout(folder).items():
        if kind_of(name) != "vision":
            with safe_open(str(root / "toy" / file), framework="pt") as f:
                tensors.append((name, f.get_tensor(name) + 0.01))  # "trained"
    write_export(iter(tensors), folder, root / "export")
    return root


def test_the_vision_tower_and_mtp_layer_are_compared_with_the_input(toy_and_export, tmp_path):
    toy, export = toy_and_export / "toy", toy_and_export / "export"
    assert road.vision_bytes_equal(toy, export) and road.mtp_present(toy, export)
    changed = Path(shutil.copytree(export, tmp_path / "changed"))
    from safetensors.torch import load_file, save_file

    index = json.loads((changed / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(n for n in index if n.startswith("model.visual."))
    tensors = load_file(str(changed / index[name]))
    tensors[name] = tensors[name] + 1
    save_file(tensors, str(changed / index[name]), metadata={"format": "pt"})
    assert not road.vision_bytes_equal(toy, changed)
    doc = json.loads((changed / "model.safetensors.index.json").read_text())
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if not k.startswith("mtp.")}
    (changed / "model.safetensors.index.json").write_text(json.dumps(doc))
    assert not road.mtp_present(toy, changed)


def test_a_run_keeps_the_records_of_the_cases_it_did_not_run(tmp_path):
    """Cases run apart (LoRA on an 80 GB card, SFT where 140 GB is lent) add up in one result file."""
    out = tmp_path / "road.json"
    assert road.previous_records(out) == []
    sft = good(road.CASES["moe_sft"])
    out.write_text(json.dumps(sft + good(road.CASES["moe_lora"])))
    kept = [r for r in road.previous_records(out) if r["recipe"] not in {road.CASES["moe_lora"].recipe}]
    assert kept == sft
    out.write_text("{not json")
    assert road.previous_records(out) == []
    widths = road.record(road.CASES["moe_sft"], "merged", {}, date=DATE, hardware=HW, widths="toy")["widths"]
    assert widths == "toy"


def test_the_held_out_loss_reads_the_conversations_as_the_row_builder_does(tmp_path):
    """The held-out conversations are records of the evidence's own format (content parts, reasoning);
    the loss renders them with the toy's chat template, on the model's device."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from bridge_recipes.data.synthetic_chat import conversations_jsonl
    from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy

    toy = tmp_path / "toy"
    make_toy(
        toy,
        "moe",
        vl=True,
        mtp_num_layers=1,
        dtype="float32",
        tokenizer_json=road.TOKENIZER,
        **CPU_SIZES,
        **CPU_MOE_SIZES,
    )
    held = [json.loads(line) for line in conversations_jsonl(3, seed=road.HELD_OUT_SEED).splitlines()]
    assert any(not isinstance(m["content"], str) for c in held for m in c["messages"])
    model = AutoModelForImageTextToText.from_pretrained(toy, dtype=torch.float32).eval()
    loss = road.held_out_loss(model, AutoTokenizer.from_pretrained(toy), held)
    assert 0 < loss < 2 * torch.log(torch.tensor(float(model.config.text_config.vocab_size))).item()


@pytest.mark.parametrize("family", ["moe", "dense"])
def test_the_checks_of_the_exports_run_on_exports_shaped_as_megatron_writes_them(family, tmp_path):
    """check_exports, on a CPU, over the two folders the export writes from the streams Megatron-Bridge
    produced on a GPU (tests/fixtures/lora_export_structure.json); the reference logits are the
    merged folder's own here (the GPU compares them with the trained Megatron model's)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from tests.unit.conftest import LoraStreams

    streams = LoraStreams()
    fixture = streams.case(family)
    case = next(c for c in road.CASES.values() if c.recipe == fixture["recipe"])
    toy = streams.make_toy(fixture, tmp_path / "toy")
    export = tmp_path / "export"
    streams.write_exports(fixture, toy, export, seed=3)
    tokens = torch.randint(3, 1024, (2, 32), generator=torch.Generator().manual_seed(0))
    experts = json.loads((toy / "config.json").read_text())["text_config"].get("num_experts")
    with torch.no_grad():
        reference = road._hf(AutoModelForImageTextToText, export, experts, "cpu")(input_ids=tokens).logits
    checks = road.check_exports(case, toy, export, tokens, reference, device="cpu")
    assert set(checks) == {"merged", "adapter"}
    merged_checks, adapter_checks = checks["merged"], checks["adapter"]
    assert merged_checks["transformers_class"].endswith("ForConditionalGeneration")
    assert merged_checks["vision_bytes_equal"] is True and merged_checks["mtp_present"] is True
    assert merged_checks["text_logits_rel_err"] < 1e-6
    assert merged_checks["adapter_vs_merged_max_abs_diff"] <= road.ADAPTER_MAX_ABS_DIFF
    assert adapter_checks["text_logits_rel_err"] < 1e-4
    losses = [merged_checks["val_loss_start"], merged_checks["val_loss_end"], adapter_checks["val_loss_end"]]
    assert all(0 < x < 20 for x in losses) and abs(losses[1] - losses[2]) < 1e-3  # merged and adapter agree


def test_the_cpu_fixture_has_the_structure_of_a_real_runs_adapter_stream():
    """The adapter stream of the real-width 35B-A3B LoRA run on the GPU (its trained checkpoint, the
    released road's first case) names the same tensors as the fixture the CPU tests feed the export,
    and each of its shared tensors (one A for a fused projection, B slices) is shared in the fixture
    too (the toy's small Gated DeltaNet shares one more: its b and a parts of B)."""
    from lab.lora_export_structure import FIXTURE, condensed, sharing

    real = json.loads((road.ROOT / "lab/evidence/released_road/moe_lora_adapter_stream.json").read_text())
    fixture = next(c for c in json.loads(FIXTURE.read_text())["cases"] if c["recipe"] == real["recipe"])
    toy = condensed(fixture["adapter_stream"], real["kept_experts"])
    assert real["experts"] == 256 and toy["experts"] == fixture["toy"]["num_experts"]
    assert [e["name"] for e in toy["adapter_stream"]] == [e["name"] for e in real["adapter_stream"]]
    mine, theirs = sharing(toy["adapter_stream"]), sharing(real["adapter_stream"])
    for name, (partners, is_slice) in theirs.items():  # every sharing of the real stream is in the fixture's
        assert set(partners) <= set(mine[name][0]) and (mine[name][1] or not is_slice), name
    assert sum(bool(partners) for partners, _ in theirs.values()) > len(theirs) // 3
