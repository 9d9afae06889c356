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
