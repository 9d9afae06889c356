"""Config files: every recipe built, written as YAML and built again from it is the same config;
the runner's --save-config / --config-file, and the errors for bad files (exit 2, file named)."""

import re

import pytest

import bridge_recipes
from bridge_recipes.config import files as config_files
from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_mock_config"
VL = "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config"
CASES = [(name, None) for name in sorted(registry.discover())] + [
    ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "sft-rows"),
    (VL, "energon"),
]


def _yaml(cfg) -> str:
    return config_files.to_text(cfg, "x")


@pytest.mark.parametrize("name,dataset", CASES)
def test_every_recipe_round_trips_through_its_config_file(tmp_path, name, dataset):
    cfg = bridge_recipes.build(name, dataset=dataset)
    path = tmp_path / "cfg.yaml"
    path.write_text(config_files.to_text(cfg, name))
    assert config_files.recipe_of(path) == name
    loaded = bridge_recipes.build(name, config_file=str(path))
    assert type(loaded.dataset) is type(cfg.dataset) and type(loaded.model) is type(cfg.model)
    assert _yaml(loaded) == _yaml(cfg)


def test_the_round_trip_sees_a_difference(tmp_path):
    cfg = bridge_recipes.build(SFT)
    path = tmp_path / "cfg.yaml"
    path.write_text(config_files.to_text(cfg, SFT).replace("train_iters: 20", "train_iters: 21"))
    assert _yaml(bridge_recipes.build(SFT, config_file=str(path))) != _yaml(cfg)


def test_save_config_writes_pure_yaml_and_config_file_builds_it(tmp_path, capsys):
    import yaml

    saved, again = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert main(["--recipe", SFT, "--dry-run", "--world-size", "8", "--save-config", str(saved)]) == 0
    assert "_target_" not in capsys.readouterr().out  # the YAML went to the file, not stdout
    assert yaml.safe_load(saved.read_text())["train"]["train_iters"] == 20
    args = ["--config-file", str(saved), "--dry-run", "--world-size", "8", "--save-config", str(again)]
    assert main([*args, "train.train_iters=7", "--max-steps", "9"]) == 0
    assert yaml.safe_load(again.read_text())["train"]["train_iters"] == 7  # overrides win over flags
    assert saved.read_text().replace("train_iters: 20", "train_iters: 7") == again.read_text()


def test_save_config_never_writes_over_a_file_or_its_input(tmp_path, capsys):
    saved = tmp_path / "a.yaml"
    saved.write_text("mine\n")
    base = ["--recipe", SFT, "--dry-run", "--world-size", "8", "--save-config", str(saved)]
    assert main(base) == 2
    assert "exists; pass --overwrite-config" in capsys.readouterr().err and saved.read_text() == "mine\n"
    assert main([*base, "--overwrite-config"]) == 0 and "_target_" in saved.read_text()
    args = ["--config-file", str(saved), "--dry-run", "--save-config", str(saved), "--overwrite-config"]
    before = saved.read_text()
    assert main([*args, "train.train_iters=3"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"--save-config {re.escape(str(saved))}\b.*\binput files\b", err)
    assert saved.read_text() == before
    assert main(["--recipe", SFT, "--save-config", str(tmp_path / "c.yaml")]) == 2
    assert "--save-config needs --dry-run" in capsys.readouterr().err


def _saved(tmp_path) -> str:
    cfg = bridge_recipes.build("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", dataset="sft-rows")
    return config_files.to_text(cfg, "qwen35_35b_a3b_sft_8gpu_h200_bf16_config")


@pytest.mark.parametrize(
    "edit,pattern",
    [
        (None, "does not exist"),
        (lambda t: "a: [\n", "not valid YAML"),
        (lambda t: "- 1\n", r"_target_: [\w.]+\.RecipeConfig\b.*--save-config FILE"),
        (lambda t: t.replace("\ntrain:\n", "\nbogus: 1\ntrain:\n"), r"RecipeConfig: \{'bogus'\}"),
        (lambda t: t.replace("\nfeatures:\n", "\nfeatures:\n  bogus: 1\n"), r"Features: \{'bogus'\}|bogus"),
        (lambda t: t.replace("\ntrain:\n", "\ntrain:\n  bogus_iters: 1\n"), "Unexpected config keys"),
        (
            lambda t: t.replace(
                "bridge_recipes.data.packed_rows.PackedSFTRowsConfig", "bridge_recipes.utils.outputs.os.system"
            ),
            r"key dataset\._target_",
        ),
        (lambda t: t.replace("  train_iters: ", "  train_iters: many", 1), r"train\.train_iters\b.*'many"),
        (lambda t: t.replace("# recipe: ", "# ").replace("_config\n", "\n", 1), r"'# recipe: NAME'.*--recipe NAME"),
        (
            lambda t: t.replace("# recipe: qwen35_35b", "# recipe: qwen35_27b"),
            r"from qwen35_27b\w+.*qwen35_35b\w+.*--recipe",
        ),
    ],
)
def test_bad_config_files_exit_2_naming_the_file(tmp_path, capsys, edit, pattern):
    path = tmp_path / "bad.yaml"
    if edit:
        path.write_text(edit(_saved(tmp_path)))
    recipe = ["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"] if "qwen35_27b" in pattern else []
    assert main(["--config-file", str(path), *recipe, "--dry-run", "dataset.path=/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert f"config file {path}" in err and re.search(pattern, err), err
    assert "Traceback" not in err


def test_config_file_refuses_reshaping_flags(tmp_path, capsys):
    path = tmp_path / "a.yaml"
    path.write_text(config_files.to_text(bridge_recipes.build(SFT), SFT))
    assert main(["--config-file", str(path), "--dataset", "mock", "--dry-run"]) == 2
    assert re.search(r"--dataset\b.*config file\b.*KEY=VALUE", capsys.readouterr().err)


def test_the_container_target_is_a_megatron_bridge_config_container_with_features():
    from megatron.bridge.training.config import ConfigContainer

    from bridge_recipes.recipe_config import RecipeConfig

    assert config_files.CONTAINER == f"{RecipeConfig.__module__}.{RecipeConfig.__qualname__}"
    assert issubclass(RecipeConfig, ConfigContainer)
    assert config_files.CONTAINERS[1] == f"{ConfigContainer.__module__}.{ConfigContainer.__qualname__}"


def test_the_features_go_through_the_file_and_a_plain_container_gets_the_recipes(tmp_path):
    name = "qwen35_27b_peft_1gpu_h100_fp8base_config"
    cfg = bridge_recipes.build(name, overrides=["features.gdn_warmup.enabled=true"])
    assert cfg.features.chunked_loss.enabled and cfg.features.gdn_warmup.enabled
    path = tmp_path / "run.yaml"
    path.write_text(config_files.to_text(cfg, name))
    again = bridge_recipes.build(name, config_file=str(path))
    assert again.features == cfg.features and again.recipe == name and again.meta.gpu == "h100"
    assert config_files.to_text(again, name) == config_files.to_text(cfg, name)
    plain = tmp_path / "plain.yaml"
    text = path.read_text().replace(config_files.CONTAINER, config_files.CONTAINERS[1])
    plain.write_text(text[: text.index("features:")] + text[text.index("\nft:") + 1 :])
    from bridge_recipes.features import Features

    said: list[str] = []
    features = bridge_recipes.build(name, config_file=str(plain), report=said.append).features
    assert features == registry.load(name)().features != Features()
    assert [line for line in said if "has no features" in line and "chunked_loss.enabled=true" in line], said


def test_overwrite_config_alone_is_refused(capsys):
    from bridge_recipes.runner.cli import main

    assert main(["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "--dry-run", "--overwrite-config"]) == 2
    assert re.search(r"--overwrite-config\b.*--save-config FILE", capsys.readouterr().err)
