"""The save interval follows the run: about ten saves, the first before the end, at most about 30 minutes
apart at the recipe's measured rate; an interval given by a flag, an override or a config file is kept,
and one not shorter than the run is warned of; benchmarks save nothing; the fingerprint is the recipe's."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import yaml

import bridge_recipes
from bridge_recipes.config.fingerprint import config_text, digest
from bridge_recipes.config.run_length import duration
from bridge_recipes.config.save_interval import MINUTES_APART, SAVES_PER_RUN, save_count
from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

LORA_H100 = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"  # a recipe with a measured rate
SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"  # one without
BENCHMARKS = sorted(n for n, e in registry.discover().items() if e.tree == "perf_recipes")


def _interval(name: str = LORA_H100, **kw) -> int:
    return bridge_recipes.build(name, **kw).checkpoint.save_interval


def _step_seconds(name: str = LORA_H100) -> float:
    cfg = registry.load(name)()
    rate = registry.measured_rate(name)
    assert rate and registry.find(name).meta.gpus == 1
    return cfg.train.global_batch_size * cfg.model.seq_length / rate


def _save_line(out: str) -> str:
    return next(line[18:] for line in out.splitlines() if line.startswith("save              "))


@pytest.fixture
def base(tmp_path) -> Path:
    """A folder that passes for a Megatron checkpoint: the base weights a LoRA dry run names."""
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    (folder / "iter_0000001").mkdir()  # the step the tracker names
    return folder


@pytest.mark.parametrize("steps", [2, 3, 10, 59, 101])
def test_a_short_run_saves_about_ten_times_and_before_its_end(steps):
    """Megatron-Bridge saves at each multiple of the interval and at the end: an interval shorter than
    the run saves before its end, and at most a tenth of the steps (rounded up) saves about ten times."""
    for name in (LORA_H100, SFT):
        interval = _interval(name, flags={"max_steps": steps})
        assert interval < steps and interval <= math.ceil(steps / SAVES_PER_RUN), (name, steps, interval)
        assert save_count(steps, interval) >= min(steps, SAVES_PER_RUN)


def test_the_users_59_step_run_saves_every_6_steps_at_most():
    interval = _interval(flags={"max_steps": 59})
    assert interval <= 6 and save_count(59, interval) >= 10


def test_a_long_run_saves_at_most_30_minutes_apart_at_the_measured_rate():
    step = _step_seconds()
    interval = _interval(flags={"max_steps": 1000})
    assert interval * step <= MINUTES_APART * 60 < (interval + 1) * step  # the longest that keeps to it
    assert interval < math.ceil(1000 / SAVES_PER_RUN)


def test_the_rate_times_only_the_recipes_own_shape():
    """With other tokens per micro batch, or scaled down, the rate says nothing: a tenth of the steps."""
    assert _interval(flags={"max_steps": 1000, "sl": 4096}) == 100
    assert _interval(scale_down=4, flags={"max_steps": 1000}) == 100


def test_a_long_run_without_a_rate_keeps_the_recipes_interval():
    assert registry.measured_rate(SFT) is None
    assert _interval(SFT, flags={"max_steps": 5000}) == registry.load(SFT)().checkpoint.save_interval == 100
    assert _interval(SFT, flags={"max_steps": 300}) == 30


def test_the_interval_follows_the_steps_epochs_set(tmp_path):
    """--epochs sets the steps last; the interval follows them."""
    from bridge_recipes.config.fingerprint import boundaries_rows

    rows = boundaries_rows(tmp_path / "rows")  # one row: with -gb 1, N epochs are N steps
    cfg = bridge_recipes.build(SFT, dataset="sft-rows", flags={"gb": 1}, overrides=[f"dataset.path={rows}"], epochs=59)
    assert cfg.train.train_iters == 59 and cfg.checkpoint.save_interval == 6


@pytest.mark.parametrize(
    "given", [{"flags": {"save_interval": 500}}, {"overrides": ["checkpoint.save_interval=500"]}], ids=["flag", "key"]
)
def test_an_interval_the_user_gives_is_kept(given):
    extra = given.get("flags", {})
    cfg = bridge_recipes.build(LORA_H100, flags={"max_steps": 59, **extra}, overrides=given.get("overrides", []))
    assert cfg.checkpoint.save_interval == 500 and cfg.derived_save_interval is None


def test_a_config_file_records_the_derived_interval_and_keeps_its_own(tmp_path, base, capsys):
    saved = tmp_path / "run.yaml"
    common = ["--dry-run", "--pretrained-checkpoint", str(base)]
    assert main(["--recipe", LORA_H100, *common, "--max-steps", "59", "--save-config", str(saved)]) == 0
    capsys.readouterr()
    assert yaml.safe_load(saved.read_text())["checkpoint"]["save_interval"] == 6
    # a relaunch saves alike, whatever its length now; a value edited into the file is kept too
    assert (
        bridge_recipes.build(LORA_H100, config_file=str(saved), flags={"max_steps": 1000}).checkpoint.save_interval
        == 6
    )
    saved.write_text(saved.read_text().replace("save_interval: 6\n", "save_interval: 40\n"))
    assert bridge_recipes.build(LORA_H100, config_file=str(saved)).checkpoint.save_interval == 40
    assert main(["--config-file", str(saved), *common]) == 0
    line = _save_line(capsys.readouterr().out)
    assert re.search(r"\(every 40 steps: .*\bconfig file\b", line) and "warning" not in line


def test_the_summary_gives_the_interval_why_the_saves_and_the_first_ones_time(base, capsys):
    argv = ["--recipe", LORA_H100, "--dry-run", "--pretrained-checkpoint", str(base), "--max-steps", "59"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    line = _save_line(out)
    m = re.search(r"\(every (\d+) steps: (.*?)\); (\d+) saves, the first after step (\d+), about (.+?) in\b", line)
    assert m, line
    interval, why, count, first, when = int(m[1]), m[2], int(m[3]), int(m[4]), m[5]
    assert interval == first == 6 and count == save_count(59, 6) == 10
    assert "59 steps" in why  # derived from the run's steps
    assert when == duration(6 * _step_seconds())
    assert "warning" not in out.split("save              ", 1)[1].split("\nexport", 1)[0]


def test_an_interval_not_shorter_than_the_run_is_warned_not_refused(base, capsys):
    argv = ["--recipe", LORA_H100, "--dry-run", "--pretrained-checkpoint", str(base), "--max-steps", "59"]
    assert main([*argv, "--save-interval", "100"]) == 0
    out = capsys.readouterr().out
    block = out.split("save              ", 1)[1].split("\nexport", 1)[0]
    first, warning = block.splitlines()
    assert re.search(r"\(every 100 steps: set by --save-interval\); 1 save, at the end \(step 59\)", first), first
    assert re.search(r"warning: checkpoint\.save_interval 100\b.*\b59 steps\b.*\bset it to 6\b", warning), warning


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmarks_save_nothing(name):
    cfg = bridge_recipes.build(name)
    assert cfg.checkpoint.save is None and cfg.derived_save_interval is None
    assert cfg.checkpoint.save_interval == registry.load(name)().checkpoint.save_interval


def test_the_fingerprint_is_the_recipes_whatever_the_measured_rate(monkeypatch):
    """A derived interval is written as the recipe's own: measuring the recipe again, which changes the
    interval, leaves the fingerprint its result records; a given interval is fingerprinted as given."""
    before = bridge_recipes.build(LORA_H100)
    own = registry.load(LORA_H100)().checkpoint.save_interval
    figures = {**registry._measured_figures()}
    figures[LORA_H100] = {**figures[LORA_H100], "tokens_per_s_per_gpu": figures[LORA_H100]["tokens_per_s_per_gpu"] / 8}
    monkeypatch.setattr(registry, "_measured_figures", lambda: figures)
    after = bridge_recipes.build(LORA_H100, flags={"max_steps": 500})
    before_long = bridge_recipes.build(LORA_H100, flags={"max_steps": 500, "save_interval": own})
    assert after.checkpoint.save_interval < own
    assert digest(config_text(after, LORA_H100)) == digest(config_text(before_long, LORA_H100))
    assert before.checkpoint.save_interval != own and f"save_interval: {own}\n" in config_text(before, LORA_H100)
    given = bridge_recipes.build(LORA_H100, flags={"save_interval": 3})
    assert "save_interval: 3\n" in config_text(given, LORA_H100)


def test_megatron_bridge_saves_at_the_end_unless_the_last_step_was_saved():
    """The count of saves the summary gives is upstream's: each multiple of the interval, then a final save
    when training ends normally and its last step was not one (the module needs NVIDIA's resiliency package
    to import: its source is read instead)."""
    source = Path(importlib.util.find_spec("megatron.bridge.training.train").origin).read_text()
    assert re.search(r"state\.train_state\.step % state\.cfg\.checkpoint\.save_interval == 0", source)
    final = source[source.index("Save final checkpoint when training completes normally") :][:800]
    assert "global_state.train_state.step % ckpt_config.save_interval != 0" in final
    assert "save_checkpoint_and_time(" in final
