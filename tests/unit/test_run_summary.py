"""The dry run's summary names what the run reads and writes (data, PEFT, weights, save and
export folders); a fine-tuning run on mock data says so first; the YAML is printed only on request."""

import json

from bridge_recipes.runner.cli import main

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
DRY = ["--dry-run", "--world-size", "8"]


def _lines(out: str) -> dict[str, str]:
    return {
        line[:18].strip(): line[18:]
        for line in out.splitlines()
        if line[:18].strip() in {"data", "peft", "weights", "save", "export"}
    }


def test_mock_data_is_named_and_warned_of_before_the_summary(capsys):
    assert main(["--recipe", SFT, *DRY]) == 0
    cap = capsys.readouterr()
    assert "MOCK data" in cap.err and "--dataset sft-rows" in cap.err
    got = _lines(cap.out)
    assert got["data"].startswith("mock") and got["peft"].startswith("none") and got["export"] == "none"
    assert got["weights"].startswith("random initialization (--hf-checkpoint DIR starts from Qwen/Qwen3.5-35B-A3B")
    assert "_target_" not in cap.out  # no YAML without --show-yaml


def test_rows_peft_save_and_yaml_on_request(capsys, tmp_path):
    from pathlib import Path

    ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "eos_joined_rows"
    m = json.loads((ROWS / "manifest.json").read_text())
    argv = ["--recipe", SFT, *DRY, "--peft", "lora", "--save-dir", str(tmp_path / "ckpt"), "--show-yaml"]
    assert main([*argv, "--dataset", "sft-rows", f"dataset.path={ROWS}"]) == 0
    cap = capsys.readouterr()
    got = _lines(cap.out)
    assert got["data"].startswith(f"sft rows {ROWS}: {m['rows']} rows x {m['row_tokens']} tokens")
    assert got["peft"].startswith("LoRA rank 32, alpha 32 on linear_qkv")
    assert got["save"].startswith(str(tmp_path / "ckpt"))
    assert "MOCK" not in cap.err
    yaml_at = cap.out.index("_target_: bridge_recipes.recipe_config.RecipeConfig")
    assert cap.out.index("data              ") < yaml_at
    assert cap.out.index("features:", yaml_at) > yaml_at  # the YAML shows the run's features
