"""--epochs: the steps from the rows folder's row count and the rows per step, on every recipe that
reads SFT rows; what is refused (train.num_epochs, a step count beside it, rows that cannot fill a step,
other data); the dry run's length, validation and time lines; validation at the end of a short run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.config import run_length
from bridge_recipes.config.datasets import rows_per_step
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.recipes import registry
from bridge_recipes.runner.arguments import build_parser, build_request
from bridge_recipes.runner.cli import main

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
ROW = 256
TEXT_SFT = sorted(
    name
    for name, e in registry.entries().items()
    if e.meta.task in ("sft", "peft") and "_vl_" not in name and not name.endswith("_mock_config")
)
SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
LORA_H100 = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"  # a recipe with a measured rate


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rows")
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"Weather on day {i}?"},
                {"role": "assistant", "content": "Sunny. " * (1 + i % 20)},
            ]
        }
        for i in range(600)
    ]
    (tmp / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    build_sft_rows(tmp / "c.jsonl", TOKENIZER, tmp / "rows", row_tokens=ROW, progress=False, val_fraction=0.05)
    return tmp / "rows"


def _rows_in(folder: Path) -> int:
    return json.loads((folder / "manifest.json").read_text())["rows"]


def _build(recipe: str, rows: Path, epochs: float, gb: int = 8, extra: tuple[str, ...] = ()):
    return bridge_recipes.build(
        recipe,
        dataset="sft-rows",
        flags={"sl": ROW, "gb": gb},
        overrides=[f"dataset.path={rows}", *extra],
        epochs=epochs,
    )


@pytest.mark.parametrize("recipe", TEXT_SFT)
def test_epochs_set_the_steps_on_every_recipe_that_reads_sft_rows(recipe, rows):
    """N passes fill whole steps: the steps read at most N x rows rows and less than one step fewer."""
    n = _rows_in(rows)
    for epochs in (1, 2.5):
        cfg = _build(recipe, rows, epochs)
        per_step, steps = rows_per_step(cfg), cfg.train.train_iters
        assert steps >= 1 and steps * per_step <= epochs * n < (steps + 1) * per_step, (recipe, steps, per_step)


def test_the_steps_follow_the_rows_a_packed_sequence_holds(rows):
    """Rows joined k to a sequence: a step reads k x the global batch rows, so there are k times fewer steps."""
    one = _build(SFT, rows, 2)
    four = _build(SFT, rows, 2, gb=2, extra=("dataset.rows_per_sample=4", "model.seq_length=1024"))
    assert rows_per_step(one) == rows_per_step(four) == 8
    assert one.train.train_iters == four.train.train_iters == math.floor(2 * _rows_in(rows) / 8)


def test_rows_that_cannot_fill_one_step_are_refused_with_the_fix(rows):
    n = _rows_in(rows)
    with pytest.raises(ValueError, match=rf"holds {n} rows and one step reads {n + 1}\b.*-gb {n} or lower.*add data"):
        _build(SFT, rows, 1, gb=n + 1)
    assert _build(SFT, rows, 1, gb=n).train.train_iters == 1


def test_epochs_need_sft_rows_and_a_number_of_passes(rows):
    with pytest.raises(ValueError, match="other data: pass --dataset sft-rows"):
        bridge_recipes.build(SFT, epochs=1)
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="must be a number of passes"):
            _build(SFT, rows, bad)


@pytest.mark.parametrize(
    "extra",
    [{"flags": {"max_steps": 3}}, {"overrides": ["train.train_iters=3"]}, {"overrides": ["train.train_samples=30"]}],
    ids=["max-steps", "train_iters", "train_samples"],
)
def test_a_step_count_beside_epochs_is_refused(extra):
    with pytest.raises(ValueError, match="pass one"):
        bridge_recipes.build(SFT, epochs=1, **extra)


def test_epochs_round_trip_through_the_runner_arguments():
    args = bridge_recipes.runner_args(epochs=2.5, dataset="sft-rows")
    parsed = build_request(build_parser().parse_intermixed_args(["--recipe", SFT, *args]))
    assert parsed["epochs"] == 2.5 and parsed["dataset"] == "sft-rows"
    assert "epochs" not in build_request(build_parser().parse_intermixed_args(["--recipe", SFT]))


def _summary(out: str) -> dict[str, str]:
    return {line[:18].strip(): line[18:] for line in out.splitlines() if line[:18].strip() and line[17:18] == " "}


def test_num_epochs_is_refused_naming_epochs(capsys):
    assert main(["--recipe", SFT, "--dry-run", "train.num_epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "train.num_epochs" in err and "--epochs N" in err and "Traceback" not in err


def test_the_dry_run_refuses_rows_too_small_for_one_step(rows, capsys):
    n = _rows_in(rows)
    argv = ["--recipe", SFT, "--dry-run", "--dataset", "sft-rows", f"dataset.path={rows}", "-sl", str(ROW)]
    assert main([*argv, "--epochs", "1", "-gb", str(8 * (n // 8 + 1))]) == 2
    err = capsys.readouterr().err
    assert "cannot fill one step" in err and "-gb" in err and "Traceback" not in err


def test_the_dry_run_shows_steps_epochs_tokens_validation_and_time(rows, tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "latest_checkpointed_iteration.txt").write_text("1")
    (base / "iter_0000001").mkdir()  # the step the tracker names
    n = _rows_in(rows)
    argv = [
        "--recipe",
        LORA_H100,
        "--dry-run",
        "--dataset",
        "sft-rows",
        f"dataset.path={rows}",
        "--epochs",
        "12",
        "-gb",
        "8",
        "--pretrained-checkpoint",
        str(base),
        "--save-dir",
        str(tmp_path / "run"),
    ]
    assert main([*argv, "-sl", str(ROW)]) == 0
    cap = capsys.readouterr()
    got = _summary(cap.out)
    steps = math.floor(12 * n / 8)
    assert re.match(rf"{steps} steps x 8 x {ROW} tokens = .* tokens; 1[12]\.\d\d epochs of {n} rows", got["length"])
    assert got["validation"].startswith(f"once, at the end (step {steps})"), got["validation"]
    # -sl changes the tokens per micro batch the rate was measured at: no estimate
    assert got["time"].startswith("not estimated") and "tokens per micro batch" in got["time"]
    assert re.search(rf"warning: .*\b{n} rows\b.*\bepochs\b", cap.err), cap.err  # many epochs: said before launch


def test_the_expected_time_follows_the_measured_rate_on_the_recipes_card():
    from argparse import Namespace

    from bridge_recipes.runner.summaries import time_line

    entry = registry.find(LORA_H100)
    cfg = registry.load(LORA_H100)()
    rate, t = registry.measured_rate(LORA_H100), cfg.train
    line = time_line(cfg, entry, 1, Namespace(scale_down=None))
    seconds = t.train_iters * t.global_batch_size * cfg.model.seq_length / rate
    where = registry.measured(LORA_H100).where
    shown = registry.measured(LORA_H100).shown
    assert rate and f"{shown:,.1f} useful tokens/s per GPU, measured on {where}" in line, line
    assert f"steps costed at {rate:,.1f} tokens/s per GPU, padding included" in line, line
    assert run_length.duration(seconds) in line
    t.train_iters *= 10
    assert run_length.duration(seconds * 10) in time_line(cfg, entry, 1, Namespace(scale_down=None))
    assert time_line(cfg, entry, 1, Namespace(scale_down=4)).startswith("not estimated")
    alias = registry.find(LORA_H100.replace("qwen35_", "qwen36_"))
    assert f"{rate:,.1f}" in time_line(registry.load(alias.name)(), alias, 1, Namespace(scale_down=None))
    unmeasured = registry.find(SFT)
    assert time_line(registry.load(SFT)(), unmeasured, 8, Namespace(scale_down=None)).startswith("not estimated")


def test_validation_lines(rows):
    cfg = _build(SFT, rows, 1)
    cfg.validation.eval_interval = 2
    assert run_length.validation_line(cfg).startswith(
        f"every 2 steps ({cfg.train.train_iters // 2} time(s)) and at the end"
    )
    cfg.validation.eval_interval = None
    assert run_length.validation_line(cfg).startswith("off")
    without_split = bridge_recipes.build(
        SFT, dataset="sft-rows", overrides=[f"dataset.path={rows}/val"], flags={"sl": ROW}
    )
    assert run_length.validation_line(without_split).startswith("none")


def test_a_run_shorter_than_its_eval_interval_validates_once_at_its_end(rows):
    """Megatron-Bridge sizes the validation data for the evaluations within the run plus one, and
    pretrain() evaluates once more after training: a run shorter than the interval validates at its end."""
    import importlib.util

    from megatron.bridge.data.base import DatasetBuildContext
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples

    cfg = _build(SFT, rows, 1)
    assert cfg.validation.eval_interval > cfg.train.train_iters and cfg.validation.eval_iters == 1
    _, valid, _ = get_train_valid_test_num_samples(cfg)
    assert valid == cfg.train.global_batch_size
    context = DatasetBuildContext(train_samples=8, valid_samples=valid, test_samples=0)
    _, val_set, _ = cfg.dataset.build_datasets(context)
    assert val_set is not None and len(val_set) == valid
    # the module needs NVIDIA's resiliency package to import: its source is read instead
    source = Path(importlib.util.find_spec("megatron.bridge.training.pretrain").origin).read_text()
    after_training = source[source.index("if state.train_state.do_train") :]
    assert re.search(
        r"if state\.train_state\.do_valid:\s+prefix = .*\n\s+evaluate_and_print_results\(", after_training
    )


def test_the_many_epochs_warning_says_the_numbers():
    from bridge_recipes.data.packed_rows import MANY_EPOCHS, epochs_warning

    assert epochs_warning("/r", 100, 100 * MANY_EPOCHS) is None
    assert epochs_warning("/r", 100, 100 * MANY_EPOCHS + 1)
    small = epochs_warning("/r", 100, 200, rows_per_step=128)
    assert small and "128 rows" in small and "2.00 epochs" in small


def test_plan_gives_the_measured_rate_and_says_why_there_is_none_at_another_row_length(rows, capsys):
    """--plan of a measured one-GPU recipe: its tokens/s on its card, and without rows where the epoch time
    would come from; at another row length no rate (the epoch time on rows: test_figures_for_the_card)."""
    recipe = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
    rate = registry.measured_rate(recipe)
    assert rate
    argv = ["--recipe", recipe, "--plan"]
    main([*argv, "--dataset", "sft-rows", f"dataset.path={rows}", "-sl", str(ROW)])
    out = capsys.readouterr().out
    speed = next(line for line in out.splitlines() if line.startswith("speed: "))
    # -sl changes the tokens per micro batch the rate was measured at: no rate, no epoch time
    assert speed.startswith("speed: not estimated") and "tokens per micro batch" in speed, speed
    main(argv)
    out = capsys.readouterr().out
    speed = next(line for line in out.splitlines() if line.startswith("speed: "))
    shown = registry.measured(LORA_H100).shown
    assert f"{shown:,.1f} useful tokens/s per GPU, measured on H100 80GB HBM3" in speed, speed
    assert "with an SFT rows folder (dataset.path=) also the time an epoch of it takes" in out
    main(["--recipe", "qwen35_27b_peft_1gpu_h200_bf16_32k_config", "--plan"])
    assert "has no measured rate" in capsys.readouterr().out
