"""Data side of the recipes: packed SFT rows through Megatron-Bridge, --dataset selection."""

from pathlib import Path

import pytest

from bridge_recipes.config import datasets
from bridge_recipes.data.packed_rows import PackedRowsDataset, PackedRowsError, PackedSFTRowsConfig
from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
ROWS = str(ROOT / "tests/fixtures/eos_joined_rows")
SFT = "qwen35_27b_sft_8gpu_h200_bf16_config"


@pytest.fixture(scope="module")
def rows():
    return PackedRowsDataset(ROWS, 8192, 100)


def test_sample_is_a_whole_row_with_shifted_labels_and_mask(rows):
    s = rows[3]
    ids, mask = rows.ids[3], rows.mask[3]
    assert s["tokens"].tolist() == ids.tolist()
    assert s["labels"][:-1].tolist() == ids[1:].tolist()
    assert s["loss_mask"][:-1].tolist() == mask[1:].tolist() and s["loss_mask"][-1] == 0
    assert s["position_ids"].tolist() == list(range(8192))


def test_only_assistant_targets_are_trained(rows):
    """The synthetic rows: answers follow '<|im_start|>assistant\\n'; system/user text never is a target."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ROOT / "tests/fixtures/chatml_tokenizer.json"))
    s = rows[0]
    trained = [int(t) for t, m in zip(s["labels"], s["loss_mask"]) if m]
    text = tok.decode(trained, skip_special_tokens=False)
    assert "=" in text and "What is" not in text and "calculator" not in text


def test_samples_cycle_over_rows_in_order(rows):
    assert rows[len(rows.ids)]["tokens"].tolist() == rows[0]["tokens"].tolist()
    assert len(rows) == 100


def test_row_length_must_match_the_model():
    with pytest.raises(PackedRowsError, match="set -sl 8192"):
        PackedRowsDataset(ROWS, 4096, 10)


def test_missing_rows_folder_names_the_fix(tmp_path):
    with pytest.raises(PackedRowsError, match="build it with scripts/build_sft_rows.py"):
        PackedRowsDataset(tmp_path, 8192, 10)


def test_provider_builds_the_train_split():
    from megatron.bridge.data.base import DatasetBuildContext

    cfg = PackedSFTRowsConfig(path=ROWS, seq_length=8192)
    train, valid, test = cfg.build_datasets(DatasetBuildContext(train_samples=16, valid_samples=0, test_samples=0))
    assert len(train) == 16 and valid is None and test is None


def test_dataset_sft_rows_through_the_runner(capsys):
    assert (
        main(["--recipe", SFT, "--dry-run", "--world-size", "8", "--dataset", "sft-rows", f"dataset.path={ROWS}"]) == 0
    )
    assert "checks: ok" in capsys.readouterr().out


def test_dataset_sft_rows_needs_a_path_and_matching_length(capsys):
    assert main(["--recipe", SFT, "--dry-run", "--world-size", "8", "--dataset", "sft-rows"]) == 2
    err = capsys.readouterr().err
    assert "dataset='sft-rows'" in err and "dataset.path=" in err
    assert (
        main(
            [
                "--recipe",
                SFT,
                "--dry-run",
                "--world-size",
                "8",
                "--dataset",
                "sft-rows",
                f"dataset.path={ROWS}",
                "-sl",
                "4096",
            ]
        )
        == 2
    )
    assert "set -sl 8192" in capsys.readouterr().err


def test_dataset_kinds_refuse_the_wrong_model_kind(capsys):
    assert main(["--recipe", SFT, "--dry-run", "--dataset", "energon"]) == 2
    err = capsys.readouterr().err
    assert "--dataset 'energon'" in err and "VL recipe" in err
    assert (
        main(["--recipe", "qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config", "--dry-run", "--dataset", "sft-rows"])
        == 2
    )
    assert main(["--recipe", SFT, "--dry-run", "--dataset", "csv"]) == 2
    err = capsys.readouterr().err
    assert "--dataset 'csv'" in err and "not known" in err and "sft-rows" in err


def test_energon_selection_keeps_the_execution_policy():
    from bridge_recipes.recipes.qwen_vl.gb300.qwen35_vl import (
        qwen35_vl_35b_a3b_pretrain_16gpu_gb300_bf16_config as build,
    )

    cfg = build()
    before = (cfg.model.expert_model_parallel_size, cfg.train.micro_batch_size, dict(cfg.env_vars))
    datasets.select(cfg, "energon")
    enc = cfg.dataset.task_encoder
    assert type(cfg.dataset).__name__ == "EnergonDatasetConfig" and enc.patch_size == 16
    assert enc.hf_processor_path == "Qwen/Qwen3.5-35B-A3B"
    assert (cfg.model.expert_model_parallel_size, cfg.train.micro_batch_size, dict(cfg.env_vars)) == before
