"""The runner's command line: dry-run, errors and exit codes (no GPU needed)."""

import re

import pytest

from bridge_recipes.runner.cli import main

SMOKE = "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config"
SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"


def test_dry_run_prints_yaml_summary_and_checks(capsys):
    assert main(["--recipe", SFT, "--dry-run", "--world-size", "8", "--show-yaml", "train.train_iters=500"]) == 0
    out = capsys.readouterr().out
    assert "expert_model_parallel_size: 8" in out and "train_iters: 500" in out  # resolved YAML
    assert re.search(r"world size\s+8\s+->\s+TP1 PP1 EP8 ETP1 DP8\b", out)  # layout summary
    assert "checks: ok" in out


def test_dry_run_takes_world_size_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert main(["--recipe", SFT, "--dry-run"]) == 0
    assert re.search(r"\bEP8 ETP1 DP16\b", capsys.readouterr().out)


@pytest.mark.parametrize("mode", ["--dry-run", "--plan"])
def test_dry_run_and_plan_check_the_recipes_own_gpu_count(capsys, monkeypatch, mode):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--recipe", SFT, mode]) == 0
    assert "EP8 ETP1 DP8" in capsys.readouterr().out


def test_a_launch_without_torchrun_is_one_process(monkeypatch):
    from bridge_recipes.runner.arguments import build_parser, world_size_of

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = build_parser().parse_intermixed_args(["--recipe", SFT])
    assert world_size_of(args, 8) == 1
    scaled = build_parser().parse_intermixed_args(["--recipe", SFT, "--dry-run", "--scale-down", "4"])
    assert world_size_of(scaled, 8) == 1


def test_layout_error_exits_2_and_says_what_to_change(capsys):
    assert main(["--recipe", SFT, "--dry-run", "--world-size", "8", "-gb", "100"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"global batch 100\b.*\b1 x 8\b.*-gb\b.*-mb\b", err)  # value, micro batch x DP, the fix
    assert SFT in err and "8 GPU(s)" in err
    assert "Traceback" not in err


def test_bad_override_exits_2(capsys):
    assert main(["--recipe", SMOKE, "--dry-run", "train.micro_batch_sise=2"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"'train\.micro_batch_sise'.*Nearest.*\btrain\.micro_batch_size\b", err)


def test_megatron_validation_failure_exits_2(capsys):
    # passes our layout checks, but Megatron-Core refuses full recompute without a method
    assert main(["--recipe", SMOKE, "--dry-run", "model.recompute_method=null"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Megatron-Bridge" in err and "recompute_method" in err
    assert "Traceback" not in err


def test_recipe_is_required(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "--recipe NAME" in err and "--config-file" in err and "--list" in err


def test_unknown_flag_exits_2():
    with pytest.raises(SystemExit) as exc:
        main(["--recipe", SMOKE, "--tensor-parallel", "2"])
    assert exc.value.code == 2


def test_plan_prints_stages_and_exit_code_says_whether_it_fits(capsys):
    R27 = "qwen35_27b_sft_8gpu_h200_bf16_config"
    assert main(["--recipe", R27, "--plan", "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\bTP1 PP4 DP2\b.*\bh200\b", out) and "(fits)" in out
    assert main(["--recipe", R27, "--plan", "--world-size", "8", "model.recompute_num_layers=10"]) == 2
    assert re.search(r"DOES NOT FIT\W+stage 0\b", capsys.readouterr().out)


def test_plan_of_the_multi_node_and_lora_recipes(capsys):
    R122 = "qwen35_122b_a10b_sft_24gpu_h200_bf16_config"
    assert main(["--recipe", R122, "--plan", "--world-size", "24"]) == 0
    assert re.search(r"\bTP1 PP3 EP8 ETP1 DP8\b.*\bh200\b", capsys.readouterr().out)
    # two stages on two nodes: the same model does not fit with the optimizer on the GPU
    even_pp2 = [
        "model.pipeline_model_parallel_size=2",
        "model.num_layers_in_first_pipeline_stage=null",
        "model.num_layers_in_last_pipeline_stage=null",
    ]
    assert main(["--recipe", R122, "--plan", "--world-size", "16", *even_pp2]) == 2
    assert re.search(r"DOES NOT FIT\W+stage 0, 1\b", capsys.readouterr().out)  # stages 0 and 1 over
    L27 = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"
    assert main(["--recipe", L27, "--plan", "--world-size", "1"]) == 0
    assert re.search(r"^note: LoRA\b.*\bfrozen\b", capsys.readouterr().out, re.M)
    assert main(["--recipe", L27, "--plan", "--world-size", "1", "~peft"]) == 2  # every weight trained


def test_load_follows_save_unless_given(tmp_path):
    """A real-data recipe resumes from its save folder (load == save): moving only the save
    folder, by flag or KEY=VALUE, moves where it resumes from; an explicit load still wins."""
    import bridge_recipes

    def built(**request):
        return bridge_recipes.build("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", **request).checkpoint

    new, other = str(tmp_path / "run1"), str(tmp_path / "elsewhere")
    for request in ({"flags": {"save_dir": new}}, {"overrides": [f"checkpoint.save={new}"]}):
        c = built(**request)
        assert (c.save, c.load) == (new, new), request
    c = built(flags={"save_dir": new, "load_dir": other})
    assert (c.save, c.load) == (new, other)
    c = built(overrides=[f"checkpoint.save={new}", "checkpoint.load=null"])
    assert (c.save, c.load) == (new, None)


def test_a_lora_run_without_base_weights_is_refused(capsys):
    assert main(["--recipe", "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "needs base weights" in err and "--hf-checkpoint DIR" in err and "--lora-from-random-init" in err
    assert "Traceback" not in err
