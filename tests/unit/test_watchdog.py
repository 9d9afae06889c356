"""The progress watch (bridge_recipes.training.watchdog): a training loop that stops making progress ends with
its last stage, every thread's stack and a non-zero exit; one that keeps going is left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_recipes.runner.cli import main
from bridge_recipes.training import watchdog

ROOT = Path(__file__).resolve().parents[2]

# A fake training loop driven through the same callbacks and forward-step wrapper the launch uses:
# STEPS steps of two micro-batches each, then, when HANG is set, a step that never ends (in its
# forward or its backward).
LOOP = textwrap.dedent(
    """
    import sys, time
    from types import SimpleNamespace
    from bridge_recipes.training import watchdog

    FIRST, STEP, STEPS, HANG = {first}, {step}, {steps}, {hang!r}
    dog = watchdog.Watchdog(watchdog.Budgets(first_step_s=FIRST, step_s=STEP), poll_s=0.05)
    events = watchdog.callbacks(dog)
    state = SimpleNamespace(train_state=SimpleNamespace(step=0))
    context = SimpleNamespace(state=state)

    def stuck_in_the_backward():  # where Megatron-Core's schedule runs the backward pass
        if HANG == "backward" and state.train_state.step == STEPS:
            time.sleep(60)

    def forward_step(state, data_iterator, model, return_schedule_plan=False):
        if HANG == "forward" and state.train_state.step == STEPS:
            time.sleep(60)
        return "output", lambda output: 0.0

    step = watchdog.watched_forward_step(forward_step, dog)
    events["on_train_start"](context)
    for _ in range(STEPS + (1 if HANG else 0)):
        events["on_train_step_start"](context)
        for _ in range(2):
            output, loss = step(state, None, None)
            loss(output)
            stuck_in_the_backward()
        time.sleep(0.02)
        events["on_train_step_end"](context)
        state.train_state.step += 1
    events["on_train_end"](context)
    print("finished", dog.steps_done)
    """
)


def _loop(first: float, step: float, steps: int, hang: str | None) -> subprocess.CompletedProcess:
    code = LOOP.format(first=first, step=step, steps=steps, hang=hang)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env()
    )


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_step_that_never_ends_is_reported_with_its_stage_and_stack():
    p = _loop(first=30, step=1.0, steps=2, hang="backward")
    assert p.returncode == watchdog.EXIT_CODE != 0
    assert "finished" not in p.stdout
    err = p.stderr
    assert "no progress for" in err and "since micro-batch 1 of step 3 started" in err
    assert "last stage: backward of micro-batch 1 of step 3" in err
    assert "in stuck_in_the_backward" in err  # the main thread's stack, where it hangs
    assert "in _watch" in err  # every thread's stack: the watch's own too
    assert err.count("Thread 0x") + err.count("Current thread 0x") >= 2


def test_a_first_step_that_never_ends_has_its_own_budget():
    p = _loop(first=1.0, step=30, steps=0, hang="forward")
    assert p.returncode == watchdog.EXIT_CODE
    assert "since the start of the training loop" in p.stderr
    assert "last stage: forward of micro-batch 1 of step 1" in p.stderr


def test_a_loop_that_keeps_making_progress_is_left_alone():
    # forty steps of ~0.03 s within a 1 s step budget, the whole loop longer than one budget would allow
    p = _loop(first=1.0, step=1.0, steps=40, hang=None)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "finished 40" in p.stdout and "[watchdog]" not in p.stderr


def test_the_budget_runs_from_the_last_step_and_zero_turns_it_off():
    now = [0.0]
    dog = watchdog.Watchdog(watchdog.Budgets(first_step_s=100, step_s=10), clock=lambda: now[0])
    dog.start()
    dog.stop()
    now[0] = 99
    assert dog.overdue() is None  # the first step's budget
    now[0] = 101
    assert "since the start of the training loop" in dog.overdue()
    dog.step_started(1)
    dog.step_finished()
    now[0] = 110
    assert dog.overdue() is None
    dog.stage("backward of micro-batch 1 of step 2")
    now[0] = 111.5
    line = dog.overdue()
    assert "since step 1 finished" in line and "budget 10 s" in line
    assert line.endswith("backward of micro-batch 1 of step 2")
    off = watchdog.Watchdog(watchdog.Budgets(first_step_s=0, step_s=0), clock=lambda: now[0])
    now[0] = 1e9
    assert off.overdue() is None
    assert watchdog.Budgets(0, 0).describe() == "off"


def test_a_resumed_run_names_its_own_step_numbers():
    dog = watchdog.Watchdog(watchdog.Budgets())
    events = watchdog.callbacks(dog)
    context = SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=500)))
    events["on_train_start"](context)
    dog.stop()
    events["on_train_step_start"](context)
    step = watchdog.watched_forward_step(lambda *a: ("out", lambda out: 0.5), dog)
    _, loss = step(None, None, None)
    assert dog.last_stage == "forward of micro-batch 1 of step 501"
    assert loss("out") == 0.5 and dog.last_stage.startswith("backward of micro-batch 1 of step 501")
    events["on_train_step_end"](context)
    assert dog.last_finished == 501 and dog.steps_done == 1


def test_the_launch_hands_megatron_bridge_a_step_it_gives_the_state_to():
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.utils.train_utils import needs_global_state_injection

    from bridge_recipes.runner import launch
    from bridge_recipes.training.train_step import forward_step

    step, manager = launch.watched(forward_step, watchdog.Budgets())
    assert needs_global_state_injection(step)
    assert isinstance(manager, CallbackManager)
    for event in ("on_train_start", "on_train_step_start", "on_train_step_end", "on_train_end"):
        assert manager.has_callbacks(event)


@pytest.mark.parametrize(
    "args",
    [["--step-timeout", "soon"], ["--step-timeout", "-5"], ["--first-step-timeout", "nan"], ["--step-timeout", "1"]],
)
def test_odd_budgets_are_refused_before_anything_is_built(capsys, args):
    assert main(["--recipe", "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert args[0] in err and args[1] in err and ("0 turns the watch off" in err or "or 0 for off" in err)
    assert "Traceback" not in err


def test_the_summary_and_a_saved_config_carry_the_budgets(capsys, tmp_path):
    recipe = "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config"
    saved = tmp_path / "run.yaml"
    argv = ["--recipe", recipe, "--dry-run", "--step-timeout", "900", "--save-config", str(saved)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "progress watch" in out and "900 s" in out and f"{watchdog.FIRST_STEP_S:g} s" in out
    text = saved.read_text()
    assert "# step-timeout: 900" in text and f"# first-step-timeout: {watchdog.FIRST_STEP_S:g}" in text
    assert main(["--config-file", str(saved), "--dry-run"]) == 0
    assert "900 s" in capsys.readouterr().out
    saved.write_text(text.replace("# step-timeout: 900", "# step-timeout: later"))
    assert main(["--config-file", str(saved), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--step-timeout later" in err and str(saved) in err


def test_a_long_step_of_many_micro_batches_is_progress_and_says_how_far_it_has_got():
    """A step of 64 micro-batches of 20 s (over 21 minutes) within a 600 s budget: each micro-batch
    starting is progress; only the first micro-batch has the first budget; a line at most a minute apart."""
    now = [0.0]
    dog = watchdog.Watchdog(watchdog.Budgets(first_step_s=300, step_s=60), clock=lambda: now[0], every_s=60)
    dog.start()
    dog.stop()
    dog.step_started(1)
    lines = []
    for _ in range(64):
        lines.append(dog.micro_batch_started(64))
        assert dog.overdue() is None
        now[0] += 250 if dog.micro_batch == 1 else 20  # the first micro-batch compiles kernels
    said = [line for line in lines if line]
    assert said[0].startswith("[progress] step 1: micro-batch 2 of 64 started, 250 s into it")
    assert len(said) == 1 + (64 - 2) * 20 // 60
    now[0] += 61  # then nothing: the micro-batch budget, not the first one, runs out
    assert "no progress for" in dog.overdue() and "since micro-batch 64 of step 1 started" in dog.overdue()


def test_the_first_micro_batch_alone_has_the_long_budget():
    now = [0.0]
    dog = watchdog.Watchdog(watchdog.Budgets(first_step_s=300, step_s=60), clock=lambda: now[0])
    dog.start()
    dog.stop()
    dog.step_started(1)
    assert dog.micro_batch_started() is None
    now[0] = 299
    assert dog.overdue() is None  # compiling: within the first budget
    dog.micro_batch_started()
    now[0] = 360
    assert dog.overdue() is not None and "since micro-batch 2 of step 1 started" in dog.overdue()


def test_the_forward_step_prints_the_progress_line_on_the_first_rank(capsys):
    dog = watchdog.Watchdog(watchdog.Budgets(), every_s=0)
    dog.step_started(3)
    step = watchdog.watched_forward_step(lambda *a: ("out", lambda out: 0.0), dog)
    step(None, None, None)
    assert "[progress] step 3: micro-batch 1 started" in capsys.readouterr().out


def test_each_step_prints_its_share_its_time_the_rate_and_the_time_left():
    now = [0.0]
    line = watchdog.StepLine(total_steps=140, tokens_per_step=128 * 8192, useful_share=0.974, clock=lambda: now[0])
    texts = []
    for step, took in ((1, 300.0), (2, 240.0), (3, 240.0)):
        line.started()
        now[0] += took
        texts.append(line.finished(step))
    assert texts[0].startswith("[step] 1 of 140 (0.7%): 300.0 s, ")
    pace = (300 + 240 + 240) / 3
    assert f"{128 * 8192 * 0.974 / pace:,.1f} useful tokens/s per GPU" in texts[2]
    assert texts[2].endswith(f"about {watchdog._left(137 * pace)} left") and "2 of 140" in texts[1]
    assert watchdog.StepLine(10, 1000).finished(1) is None  # its start not seen: no line
    plain = watchdog.StepLine(10, 1000, world=2, clock=lambda: now[0])
    plain.started()
    now[0] += 2.0
    text = plain.finished(10)
    assert "250.0 tokens/s per GPU" in text and "useful" not in text and text.endswith("about 0 s left")


def test_the_callbacks_print_the_step_line_on_rank_zero(monkeypatch, capsys):
    from megatron.bridge.utils import common_utils

    printed = []
    monkeypatch.setattr(common_utils, "print_rank_0", printed.append)
    now = [0.0]
    line = watchdog.StepLine(4, 100, clock=lambda: now[0])
    dog = watchdog.Watchdog(watchdog.Budgets(0, 0))
    events = watchdog.callbacks(dog, line)
    context = SimpleNamespace(state=SimpleNamespace(train_state=SimpleNamespace(step=0)))
    events["on_train_step_start"](context)
    now[0] += 5.0
    events["on_train_step_end"](context)
    assert printed == ["[step] 1 of 4 (25.0%): 5.0 s, 20.0 tokens/s per GPU, about 15 s left"]


def test_the_launch_reads_the_useful_share_from_the_rows(tmp_path):
    import json

    from bridge_recipes.data.sft_rows import build_sft_rows
    from bridge_recipes.runner import launch

    tokenizer = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
    m = build_sft_rows(
        ROOT / "examples" / "conversations.jsonl", tokenizer, tmp_path / "rows", row_tokens=512, progress=False
    )
    assert json.loads((tmp_path / "rows" / "manifest.json").read_text())["padding_tokens"] == m["padding_tokens"] > 0
    cfg = SimpleNamespace(
        train=SimpleNamespace(train_iters=7, global_batch_size=4),
        model=SimpleNamespace(seq_length=512),
        dataset=type("PackedSFTRowsConfig", (), {"path": str(tmp_path / "rows")})(),
    )
    line = launch.step_line(cfg, world=2)
    share = 1 - m["padding_tokens"] / (m["rows"] * 512)
    assert (line.total_steps, line.tokens_per_step, line.world) == (7, 2048, 2) and line.useful_share == share < 1


def test_megatron_bridges_list_of_non_default_values_waits_for_verbose(monkeypatch, capsys):
    import bridge_recipes
    from bridge_recipes.utils import quiet

    cfg = bridge_recipes.build("qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config")
    printed = []
    monkeypatch.setattr("megatron.bridge.training.config.print_rank_0", printed.append)
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    monkeypatch.setattr("sys.argv", ["run_recipe.py"])
    cfg.log_non_default_values()
    assert printed == []
    monkeypatch.setattr("sys.argv", ["run_recipe.py", "--verbose"])
    cfg.log_non_default_values()
    assert printed and "Mcore default" in printed[0]
