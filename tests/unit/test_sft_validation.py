"""Validation split of SFT rows, its wiring to Megatron-Bridge, and the epochs warning."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from bridge_recipes.chat.conversations import SftRowsError
from bridge_recipes.data.packed_rows import PackedSFTRowsConfig, RowsIntegrityError, dry_run_problems
from bridge_recipes.data.sft_rows import build_sft_rows

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 128


def write_convs(path: Path, n: int, tag: str = "") -> Path:
    lines = []
    for i in range(n):
        msgs = [
            {"role": "user", "content": f"{tag}What is the weather in Paris on day {i}?"},
            {"role": "assistant", "content": "It is sunny " * (1 + i % 4)},
        ]
        lines.append(json.dumps({"messages": msgs}) + "\n")
    path.write_text("".join(lines))
    return path


def build(src, out, **kw):
    return build_sft_rows(src, TOKENIZER, out, row_tokens=ROW, progress=False, **kw)


def test_val_fraction_takes_the_head_of_the_permutation(tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 40)
    m = build(src, tmp_path / "out", val_fraction=0.2)
    val = json.loads((tmp_path / "out" / "val" / "manifest.json").read_text())
    assert val["conversations"]["used"] == 8 and m["conversations"]["used"] == 32
    assert val["split_name"] == "validation" and val["permutation"].endswith("[:8]")
    assert m["permutation"].endswith("[8:]") and m["validation"]["rows"] == val["rows"] > 0
    assert m["validation"]["rows_sha256"] == val["rows_sha256"]
    whole = build(src, tmp_path / "whole")
    assert whole["validation"] is None and not (tmp_path / "whole" / "val").exists()
    assert whole["conversations"]["used"] == 40


def test_val_input_builds_the_validation_rows_from_another_file(tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 30)
    held = write_convs(tmp_path / "v.jsonl", 6, tag="held out: ")
    m = build(src, tmp_path / "out", val_input=held)
    val = json.loads((tmp_path / "out" / "val" / "manifest.json").read_text())
    assert m["conversations"]["used"] == 30 and val["conversations"]["used"] == 6
    assert val["source"] == str(held)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(val_fraction=1.0), "--val-fraction 1.0 is outside [0, 1)"),
        (dict(val_fraction=0.1, val_input="v.jsonl"), "either a validation fraction or a validation input"),
    ],
)
def test_bad_validation_settings_are_refused(tmp_path, kw, message):
    src = write_convs(tmp_path / "c.jsonl", 5)
    with pytest.raises(SftRowsError, match=message.replace("[", r"\[").replace(")", r"\)")):
        build(src, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_a_validation_split_without_rows_says_why_and_the_fix(tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 30)
    held = tmp_path / "v.jsonl"
    held.write_text(json.dumps({"messages": [{"role": "user", "content": [1, 2]}]}) + "\n")
    with pytest.raises(SftRowsError) as e:
        build(src, tmp_path / "out", val_input=held)
    msg = str(e.value)
    assert re.search(r"\b1 conversation\(s\) read\b.*\b0 used\b.*skipped: 1 ", msg), msg
    assert "--val-input" in msg and f"(now {held})" in msg and "fix the skipped" in msg
    assert not (tmp_path / "out").exists()  # nothing half-written
    # one held-out conversation of ~30 tokens fills no 4,096-token EOS-joined row
    with pytest.raises(SftRowsError, match=r"raise --val-fraction \(now 0.01\) or give --val-input$"):
        build_sft_rows(
            src, TOKENIZER, tmp_path / "out2", row_tokens=4096, packing="eos_joined", val_fraction=0.01, progress=False
        )


def test_provider_returns_the_validation_rows_when_asked(tmp_path):
    from megatron.bridge.data.base import DatasetBuildContext

    src = write_convs(tmp_path / "c.jsonl", 40)
    build(src, tmp_path / "out", val_fraction=0.25)
    cfg = PackedSFTRowsConfig(path=str(tmp_path / "out"), seq_length=ROW)
    train, valid, test = cfg.build_datasets(DatasetBuildContext(train_samples=4, valid_samples=6, test_samples=0))
    assert len(valid) == 6 and test is None
    assert {tuple(r) for r in valid.ids.tolist()}.isdisjoint({tuple(r) for r in train.ids.tolist()})
    _, none, _ = cfg.build_datasets(DatasetBuildContext(train_samples=4, valid_samples=0, test_samples=0))
    assert none is None


def test_rows_build_after_megatron_bridge_hands_the_dataset_its_tokenizer(tmp_path):
    """Megatron-Bridge's setup builds the recipe's tokenizer and assigns it to the dataset config's
    ``tokenizer`` field when one exists: the rows must still build (and still check the tokenizer
    named by ``tokenizer_path``)."""
    from megatron.bridge.data.base import DatasetBuildContext
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    import bridge_recipes

    build(write_convs(tmp_path / "c.jsonl", 40), tmp_path / "out")
    cfg = bridge_recipes.build(
        "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
        scale_down=4,
        dataset="sft-rows",
        flags={"sl": ROW},
        overrides=[f"dataset.path={tmp_path / 'out'}", f"dataset.tokenizer_path={TOKENIZER}"],
    )
    tokenizer = build_tokenizer(cfg.tokenizer)
    if hasattr(cfg.dataset, "tokenizer"):  # what Megatron-Bridge's setup does
        cfg.dataset.tokenizer = tokenizer
    train, _, _ = cfg.dataset.build_datasets(DatasetBuildContext(train_samples=4, valid_samples=0, test_samples=0))
    assert len(train) == 4
    cfg.dataset.tokenizer_path = str(REPO / "tests/fixtures/chatml_tokenizer.json")
    with pytest.raises(RowsIntegrityError, match="different tokenizer"):
        cfg.dataset.build_datasets(DatasetBuildContext(train_samples=4, valid_samples=0, test_samples=0))


def test_sft_rows_selection_turns_validation_on():
    from bridge_recipes.config import datasets
    from bridge_recipes.recipes.qwen.h200.qwen35 import qwen35_27b_sft_8gpu_h200_bf16_config as recipe

    cfg = recipe()
    assert cfg.validation.eval_iters == 0
    datasets.select(cfg, "sft-rows")
    assert cfg.validation.eval_iters == 1 and cfg.dataset.vocab_size == cfg.model.vocab_size


def test_a_run_reading_rows_many_times_is_warned_with_its_epochs(tmp_path, caplog):
    from types import SimpleNamespace as NS

    from megatron.bridge.data.base import DatasetBuildContext

    src = write_convs(tmp_path / "c.jsonl", 40)
    m = build(src, tmp_path / "out")
    rows = m["rows"]

    def cfg(iters, gbs):
        return NS(
            dataset=PackedSFTRowsConfig(path=str(tmp_path / "out"), seq_length=ROW),
            model=NS(seq_length=ROW, vocab_size=512, context_parallel_size=1, cuda_graph_impl="none"),
            train=NS(micro_batch_size=1, train_iters=iters, global_batch_size=gbs),
            tokenizer=NS(tokenizer_model=None),
        )

    assert dry_run_problems(cfg(1, rows)) == ([], [])
    assert dry_run_problems(cfg(5, rows)) == ([], [])  # a few epochs are the dry run's summary line, not a warning
    errors, warnings = dry_run_problems(cfg(11, rows))
    assert errors == [] and len(warnings) == 1 and "11.00 epochs" in warnings[0]
    errors, warnings = dry_run_problems(cfg(1, rows + 1))  # fewer rows than one step reads
    assert errors == [] and len(warnings) == 1 and f"one step takes {rows + 1} rows" in warnings[0]
    with caplog.at_level(logging.WARNING, logger="bridge_recipes.data.packed_rows"):
        cfg(1, 1).dataset.build_datasets(DatasetBuildContext(train_samples=12 * rows, valid_samples=0, test_samples=0))
    assert "12.00 epochs" in caplog.text


def test_runner_dry_run_prints_the_epochs_warning(capsys):
    from bridge_recipes.runner.cli import main

    rows = str(REPO / "tests/fixtures/eos_joined_rows")
    args = ["--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", "--dry-run", "--world-size", "8"]
    assert main([*args, "--dataset", "sft-rows", f"dataset.path={rows}"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"warning: .*\b6400 training samples\b.*\b46 rows\b.*\b139\.13 epochs", err), err
    assert "train.train_iters" in err


def test_runner_dry_run_passes_megatron_validation_with_boundaries_rows(tmp_path, capsys):
    from bridge_recipes.runner.cli import main

    src = write_convs(tmp_path / "c.jsonl", 20)
    build_sft_rows(src, TOKENIZER, tmp_path / "rows", row_tokens=8192, packing="boundaries", progress=False)
    args = ["--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", "--dry-run", "--world-size", "8"]
    rows = ["--dataset", "sft-rows", f"dataset.path={tmp_path / 'rows'}"]
    assert main([*args, *rows]) == 0
    assert "checks: ok" in capsys.readouterr().out
    # two rows per micro batch the recipe does not declare: refused, with the rows-per-sequence fix
    assert main([*args, *rows, "-mb", "2"]) == 2
    err = capsys.readouterr().err
    assert "train.micro_batch_size 2" in err and "dataset.rows_per_sample=2 model.seq_length=16384" in err
    joined = ["dataset.rows_per_sample=2", "model.seq_length=16384"]  # two rows a packed sequence, on request
    assert main([*args, *rows, *joined]) == 0
    assert "checks: ok" in capsys.readouterr().out
    assert main([*args, *rows, "dataset.rows_per_sample=2"]) == 2
    assert "model.seq_length=16384" in capsys.readouterr().err
    assert main([*args, *rows, "-cp", "2"]) == 2
    assert "set -cp 1" in capsys.readouterr().err
