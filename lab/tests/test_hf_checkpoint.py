"""The Hugging Face evidence run's checks: a changed frozen tensor fails the LoRA report, and a
saved config relaunches the same run on the evidence rows."""

from __future__ import annotations

from bridge_recipes.hf import importer
from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy

MOE_RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
# CPU-sized toys: the family fields (head dims, GDN dims, interval) stay the catalog's.
TINY = dict(**CPU_SIZES, max_shard_size="300KB")
TINY_MOE = CPU_MOE_SIZES


def runner(argv):
    from bridge_recipes.runner.cli import main

    return main(argv)


def test_lora_change_report_fails_on_a_changed_frozen_tensor():
    from lab.hf_evidence import lora_change_report

    same = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]
    changed = ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.linear_attn.out_proj.weight"]
    ok = lora_change_report(same, changed)
    assert ok["passed"] and ok["changed_by_module"] == {"out_proj": 1, "q_proj": 1} and ok["frozen_identical"] == 2
    bad = lora_change_report(same[1:], [*changed, "model.embed_tokens.weight"])
    assert not bad["passed"] and bad["frozen_changed"] == ["model.embed_tokens.weight"]
    assert not lora_change_report(same, [])["passed"]  # an export equal to the base trained nothing


def test_saved_config_relaunches_the_same_run_with_weights_export_peft_and_data(tmp_path, capsys, monkeypatch):
    """--save-config records the HF checkpoint and the export folder beside the config (which holds
    PEFT and the dataset); --config-file builds the same config and starts from the same weights."""
    from bridge_recipes.config import files as config_files
    from bridge_recipes.runner.arguments import build_parser
    from bridge_recipes.runner.cli import build
    from lab.hf_evidence import ROWS, ROWS_TOKENIZER

    monkeypatch.setenv(importer.CACHE_ENV, str(tmp_path / "cache"))
    toy = tmp_path / "toy"
    make_toy(toy, "moe", tokenizer_json=ROWS_TOKENIZER, **TINY, **TINY_MOE)
    saved, export = tmp_path / "run.yaml", tmp_path / "export"
    argv = ["--recipe", MOE_RECIPE, "--scale-down", "4", "--peft", "lora", "--hf-checkpoint", str(toy)]
    argv += ["--dataset", "sft-rows", f"dataset.path={ROWS}", "--export-hf", str(export)]
    assert runner([*argv, "--dry-run", "--save-config", str(saved)]) == 0, capsys.readouterr().err
    first = build_parser().parse_intermixed_args(argv)
    _, cfg = build(first)
    again = build_parser().parse_intermixed_args(["--config-file", str(saved)])
    _, loaded = build(again)
    assert (again.hf_checkpoint, again.export_hf) == (str(toy), str(export))
    assert config_files.to_text(loaded, "x") == config_files.to_text(cfg, "x")
    assert loaded.peft is not None and str(loaded.dataset.path) == str(ROWS)
    capsys.readouterr()
    assert runner(["--config-file", str(saved), "--dry-run"]) == 0
    cap = capsys.readouterr()
    assert "random initialization" not in cap.err and f"weights           {toy} (Hugging Face" in cap.out
    assert f"export            {export}" in cap.out and "peft              LoRA rank 32" in cap.out
