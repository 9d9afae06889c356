"""A long training step says which micro batch it has reached, at most once a minute, so a step of
minutes does not read as a hang."""

from __future__ import annotations

from types import SimpleNamespace as NS

from bridge_recipes import step_progress
from bridge_recipes.step_progress import StepProgress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_once_the_interval_has_passed_then_not_again_until_it_passes_again():
    clock = _Clock()
    p = StepProgress(every_s=60, clock=clock)
    lines = []
    for _ in range(64):  # 64 micro batches of 2.5 s: a step of 160 s
        lines.append(p.micro_batch(1, 64))
        clock.now += 2.5
    said = [(i + 1, line) for i, line in enumerate(lines) if line]
    assert [n for n, _ in said] == [25, 49]  # started at 60 s and 120 s into the step
    assert "step 1: micro batch 25 of 64" in said[0][1] and "60 s into the step" in said[0][1]


def test_a_new_step_starts_the_count_and_the_clock_again():
    clock = _Clock()
    p = StepProgress(every_s=10, clock=clock)
    assert p.micro_batch(1, 4) is None
    clock.now += 30
    assert p.micro_batch(2, 4) is None  # the first micro batch of step 2: nothing to report yet
    clock.now += 11
    line = p.micro_batch(2, None)
    assert line is not None and line.startswith("step 2: micro batch 2 started, 11 s")


def test_the_training_step_hook_prints_on_the_first_rank(capsys, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(step_progress, "_progress", StepProgress(every_s=5, clock=clock))
    state = NS(train_state=NS(step=6))
    step_progress.micro_batch(state)
    clock.now += 6
    step_progress.micro_batch(state)
    out = capsys.readouterr().out
    assert out.count("[progress] step 7: micro batch 2") == 1
    step_progress.micro_batch(NS())  # a state without a train state (a test's) counts as step 1
