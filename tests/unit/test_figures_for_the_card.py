"""Every rate names where it was measured, and --plan answers only what it can.

One figure per measured recipe, its result file's tokens/s per GPU with the GPU that run used, its
memory cap and the day (checked against the result files in lab/tests/test_figures_where_measured.py),
read by --list, --plan, the dry run, the README, the performance page and the docs' example; on a card
nothing ran on, an estimate scaled by the GPU table's compute and bandwidth, labelled with its basis; no
rate or epoch time for a configuration that does not fit or a shape never measured."""

from __future__ import annotations

import json
import re
from argparse import Namespace
from pathlib import Path

import pytest

from bridge_recipes.config.run_length import duration
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.hardware.gpus import GPUS, speed_ratio
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.rates import rate_on
from bridge_recipes.runner.arguments import USAGE_ERROR
from bridge_recipes.runner.cli import main
from bridge_recipes.runner.summaries import time_line

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
L40S_35B = "qwen35_35b_a3b_peft_1gpu_l40s_fp8base_config"  # measured on an H100 capped at the L40S's memory
H100_35B = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"  # measured on an H100, uncapped
ROW = 8192  # the row length the one-GPU LoRA recipes were measured at
FIGURE = re.compile(r"(\d[\d,]*\.\d) (?:useful )?tokens/s")


def measured_names() -> list[str]:
    return sorted(n for n, e in registry.discover().items() if e.meta.status == "measured" and e.meta.measured)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    """A rows folder at the measured row length."""
    tmp = tmp_path_factory.mktemp("rows")
    chats = [
        {"messages": [{"role": "user", "content": f"Day {i}?"}, {"role": "assistant", "content": "Sun. " * (i % 9)}]}
        for i in range(400)
    ]
    (tmp / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    build_sft_rows(tmp / "c.jsonl", TOKENIZER, tmp / "rows", row_tokens=ROW, progress=False)
    return tmp / "rows"


def speed_of(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("speed: "))


def figure_in(text: str) -> float:
    found = FIGURE.search(text)
    assert found, text
    return float(found.group(1).replace(",", ""))


# --- one figure, named with where it was measured ------------------------------------------------


def test_the_48gb_recipes_say_they_ran_on_a_capped_h100():
    for name in ("qwen35_27b_peft_1gpu_l40s_fp8base_config", L40S_35B):
        m = registry.measured(name)
        assert m and m.gpu == "H100 80GB HBM3" and m.gpu_type == "H100"
        assert m.memory_cap_gb and m.memory_cap_gb < 50 and f"capped at {m.memory_cap_gb:.1f} GB" in m.where


def test_list_shows_the_figure_with_where_it_was_measured():
    entries = registry.entries()
    rows = {line.split()[0]: line for line in registry.table(list(entries.values())).splitlines()[2:-1]}
    for name in measured_names():
        m = registry.measured(name)
        for listed in (name, name.replace("qwen35_", "qwen36_")):
            if listed in rows:
                assert f"{m.shown:,.1f} on {m.where}" in rows[listed], rows[listed]
    assert not any("L40S" in rows[n].split(" on ", 1)[-1] for n in measured_names() if "_l40s_" in n)


def _table_figures(text: str) -> dict[str, float]:
    """The figure of each measured recipe's row in a generated recipe table."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip(" `") for c in line.split("|")[1:-1]]
        if len(cells) == 6 and cells[0] in measured_names():
            out[cells[0]] = figure_in(cells[4])
            assert registry.measured(cells[0]).where in cells[4], cells[4]
    return out


@pytest.mark.parametrize("page", ["README.md", "docs/performance.md"])
def test_the_pages_show_the_same_one_figure(page):
    figures = _table_figures((ROOT / page).read_text())
    assert set(figures) == set(measured_names())
    for name, shown in figures.items():
        assert f"{shown:,.1f}" == f"{registry.measured(name).shown:,.1f}", (page, name)


def test_the_running_docs_example_time_is_the_figures():
    """docs/running.md's dry-run example: its rate, where and time are what the H100 recipe's figure gives
    for the steps its length line shows."""
    text = (ROOT / "docs" / "running.md").read_text()
    length = re.search(r"^\s+length\s+(\d+) steps x (\d+) x (\d+) tokens", text, re.M)
    time = re.search(r"^\s+time\s+about (.+?) of training steps on 1 GPU\(s\) at (.*)$", text, re.M)
    assert length and time, "the example lost its length or time line"
    recipe = re.search(r"--recipe (qwen3[56]_\S+) --dry-run", text).group(1)
    m = registry.measured(recipe)
    assert figure_in(time.group(2)) == round(m.shown, 1) and "useful tokens/s per GPU" in time.group(2)
    assert f"measured on {m.where}" in time.group(2)
    assert f"steps costed at {m.tokens_per_s_per_gpu:,.1f} tokens/s per GPU" in time.group(2)
    steps, batch, seq = (int(g) for g in length.groups())
    assert time.group(1) == duration(steps * batch * seq / m.tokens_per_s_per_gpu)
    # and its save line follows the same rate (bridge_recipes.config.save_interval)
    from bridge_recipes.config.save_interval import derive, save_count
    from bridge_recipes.recipes.resilience import SAVE_INTERVAL_STEPS

    save = re.search(r"^\s+save\s+\S+ \(every (\d+) steps: .*?\); (\d+) saves, the first after step", text, re.M)
    rule = derive(steps, SAVE_INTERVAL_STEPS, batch * seq / m.tokens_per_s_per_gpu)
    assert save and (int(save.group(1)), int(save.group(2))) == (rule.interval, save_count(steps, rule.interval))


# --- the GPU table's compute and bandwidth, and the estimate ------------------------------------


def test_every_card_has_its_compute_and_bandwidth():
    for name, g in GPUS.items():
        assert g.peak_bf16_flops > 1e14 and g.memory_bandwidth > 5e11, name
        assert (g.peak_fp8_flops is None) == (not g.fp8), name  # FP8 peak exactly where FP8 tensor cores are
        assert g.peak_fp8_flops is None or g.peak_fp8_flops >= 2 * g.peak_bf16_flops * 0.99, name


def test_the_speed_ratio_is_the_smallest_of_compute_and_bandwidth():
    h100, l40s = GPUS["H100"], GPUS["L40S"]
    ratio, why = speed_ratio("L40S", "H100", fp8_gemms=False)
    bf16, bandwidth = l40s.peak_bf16_flops / h100.peak_bf16_flops, l40s.memory_bandwidth / h100.memory_bandwidth
    assert ratio == pytest.approx(min(bf16, bandwidth)) and ratio < 0.4
    assert "memory bandwidth" in why.split(",")[0]
    fp8_ratio, fp8_why = speed_ratio("L40S", "H100", fp8_gemms=True)
    assert fp8_ratio <= ratio and "FP8 compute" in fp8_why
    assert speed_ratio("H100", "H100", fp8_gemms=True)[0] == 1.0
    assert speed_ratio("H200", "H100", fp8_gemms=False)[0] == pytest.approx(1.0)  # same compute, more bandwidth
    with pytest.raises(KeyError, match="no FP8 tensor cores"):
        speed_ratio("A100", "H100", fp8_gemms=True)


def test_on_the_measured_gpu_the_rate_is_the_figure_elsewhere_a_labelled_estimate():
    cfg = registry.load(L40S_35B)()
    m = registry.measured(L40S_35B)
    same = rate_on(L40S_35B, "H100", cfg)
    assert same.tokens_per_s_per_gpu == m.tokens_per_s_per_gpu and not same.estimate
    assert f"measured on {m.where}" in same.describe()
    est = rate_on(L40S_35B, "L40S", cfg)
    ratio, _ = speed_ratio("L40S", "H100", fp8_gemms=True)  # this recipe multiplies in FP8
    assert est.estimate and est.tokens_per_s_per_gpu == pytest.approx(m.tokens_per_s_per_gpu * ratio)
    text = est.describe()
    assert "an estimate for L40S" in text and f"{m.shown:,.1f} measured on {m.where}" in text
    assert figure_in(text) == round(m.shown * ratio, 1)  # the useful figure, scaled as the step time is
    assert f"x {ratio:.3f}" in text and "measured on L40S" not in text
    unknown = rate_on(L40S_35B, "NVIDIA RTX A6000", cfg)
    assert unknown.tokens_per_s_per_gpu is None and "GPU table" in unknown.describe()


# --- --plan and the dry run -----------------------------------------------------------------------


def test_plan_of_the_48gb_recipe_gives_an_estimate_for_the_l40s_and_the_figure_on_an_h100(rows, capsys):
    m = registry.measured(L40S_35B)
    argv = [
        "--recipe",
        L40S_35B.replace("qwen35_", "qwen36_"),
        "--plan",
        "--dataset",
        "sft-rows",
        f"dataset.path={rows}",
    ]
    assert main(argv) == 0
    speed = speed_of(capsys.readouterr().out)
    assert "an estimate for L40S" in speed and "measured on L40S" not in speed, speed
    estimate = figure_in(speed)
    assert estimate < 0.4 * m.shown
    costed = estimate * m.tokens_per_s_per_gpu / m.shown  # an epoch's padded tokens at the padded rate
    n = json.loads((rows / "manifest.json").read_text())["rows"]
    assert f"at that estimate an epoch of {n:,} rows takes about {duration(n * ROW / costed)}" in speed
    assert main([*argv, "--gpu", "h100"]) == 0
    speed = speed_of(capsys.readouterr().out)
    assert figure_in(speed) == round(m.shown, 1) and f"measured on {m.where}" in speed, speed
    assert "estimate" not in speed


def test_plan_gives_no_epoch_time_for_a_configuration_that_does_not_fit(rows, capsys):
    argv = ["--recipe", H100_35B, "--plan", "--dataset", "sft-rows", f"dataset.path={rows}"]
    assert main([*argv, "--gpu", "l40s"]) == USAGE_ERROR  # the exit status of a plan that does not fit
    out = capsys.readouterr().out
    speed = speed_of(out)
    assert "DOES NOT FIT" in out and speed.startswith("speed: not estimated") and "does not fit" in speed
    assert "epoch" not in speed.replace("no rate or epoch time", "") and not FIGURE.search(speed)
    assert main(argv) == 0  # on its own card it fits: the figure and the epoch's time
    speed = speed_of(capsys.readouterr().out)
    n, rate = json.loads((rows / "manifest.json").read_text())["rows"], registry.measured_rate(H100_35B)
    assert f"an epoch of {n:,} rows takes about {duration(n * ROW / rate)}" in speed and "estimate" not in speed


def test_plan_at_another_row_length_on_another_card_gives_no_rate(capsys):
    assert main(["--recipe", L40S_35B, "--plan", "--gpu", "h100", "-sl", "32768"]) == 0
    speed = speed_of(capsys.readouterr().out)
    assert speed.startswith("speed: not estimated") and "32,768" in speed and not FIGURE.search(speed), speed


def test_the_dry_runs_time_is_for_the_card_it_runs_on(monkeypatch):
    from bridge_recipes.hardware import gpu_memory

    cfg, entry = registry.load(L40S_35B)(), registry.find(L40S_35B)
    m = registry.measured(L40S_35B)
    monkeypatch.setattr(gpu_memory, "current_device", lambda: None)
    here = time_line(cfg, entry, 1, Namespace(scale_down=None, gpu=None))  # no GPU here: the recipe's L40S
    assert "an estimate for L40S" in here and "the recipe's GPU" in here and "measured on L40S" not in here
    assert "an estimate for L40S" in time_line(cfg, entry, 1, Namespace(scale_down=None, gpu="l40s"))
    on_h100 = time_line(cfg, entry, 1, Namespace(scale_down=None, gpu="h100"))
    assert f"at {m.shown:,.1f} useful tokens/s per GPU" in on_h100 and "estimate" not in on_h100
    seconds = cfg.train.train_iters * cfg.train.global_batch_size * cfg.model.seq_length / m.tokens_per_s_per_gpu
    assert on_h100.startswith(f"about {duration(seconds)} ")
    device = Namespace(name="NVIDIA L40S")
    monkeypatch.setattr(gpu_memory, "current_device", lambda: device)
    on_device = time_line(cfg, entry, 1, Namespace(scale_down=None, gpu="h100"))  # the GPU here wins
    assert "an estimate for L40S" in on_device and "this GPU, NVIDIA L40S" in on_device
