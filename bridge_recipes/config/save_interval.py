"""How often a run saves: the recipe's interval, shortened to the run's length and its expected time.

Megatron-Bridge's ``train()`` saves a checkpoint at every step that is a multiple of
``checkpoint.save_interval`` and, when training ends normally, once more at its last step unless that
step was just saved. A run shorter than its interval therefore saves only at its end, and a crash
before then loses all of it. A run that saves, and whose interval nobody gave, saves every

    min(a tenth of its steps rounded up, the steps of about 30 minutes at the recipe's measured rate,
        the recipe's own interval)

steps: about ten saves, the first before the end for a run of 2 steps or more, and no more than about
30 minutes of training lost where the measured rate times the run
(:func:`bridge_recipes.recipes.rates.run_rate`). An interval given with ``--save-interval``,
``checkpoint.save_interval=`` or a config file (which records the interval of the run it was saved
from, so that a relaunch saves alike) is kept as given, and the summary warns when it is not shorter
than the run.

Importing this module imports neither torch nor Megatron.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SAVES_PER_RUN = 10  # a run saves about this many times: every tenth of its steps, rounded up
MINUTES_APART = 30  # and at most about this long apart at the recipe's measured rate


@dataclass(frozen=True)
class Derived:
    """A save interval set from the run: ``interval`` steps, in place of the recipe's ``own``, for ``why``."""

    own: int
    interval: int
    why: str


def tenth(steps: int) -> int:
    """The interval that saves a run of ``steps`` steps about :data:`SAVES_PER_RUN` times."""
    return max(1, math.ceil(steps / SAVES_PER_RUN))


def derive(steps: int, own: int, step_seconds: float | None) -> Derived:
    """The interval of a run of ``steps`` steps whose recipe saves every ``own`` steps, a step taking
    ``step_seconds`` at the measured rate (None: no rate applies); on a tie the run's reason is given."""
    from bridge_recipes.config.run_length import duration

    choices = [(tenth(steps), f"a tenth of the run's {steps} step{'s' * (steps != 1)}, rounded up")]
    if step_seconds:
        timed = max(1, math.floor(MINUTES_APART * 60 / step_seconds))
        choices.append(
            (timed, f"about {MINUTES_APART} min apart at the measured rate, {duration(step_seconds)} a step")
        )
    choices.append((own, "the recipe's own"))
    interval, why = min(choices, key=lambda c: c[0])
    return Derived(own, interval, why)


def follow_run(cfg: Any, step_seconds: float | None) -> list[str]:
    """Set ``cfg``'s save interval from its steps and ``step_seconds`` (:func:`derive`), when it saves and
    its length is a step count, and record how on it (``cfg.derived_save_interval``); returns the change."""
    c, steps = cfg.checkpoint, cfg.train.train_iters
    own = c.save_interval
    if not c.save or not isinstance(steps, int) or steps < 1 or not isinstance(own, int) or own < 1:
        return []
    rule = derive(steps, own, step_seconds)
    c.save_interval = rule.interval
    if hasattr(cfg, "record_save_interval"):  # a RecipeConfig (what the builder builds)
        cfg.record_save_interval(rule)
    if rule.interval == own:
        return []
    return [f"checkpoint.save_interval: {own} -> {rule.interval} ({rule.why})"]


def derived(cfg: Any) -> Derived | None:
    """How ``cfg``'s save interval was set from its run, or None: given, or left as the recipe's (a
    record that no longer matches the interval, changed since, counts as none)."""
    record = getattr(cfg, "derived_save_interval", None)
    return record if record is not None and record.interval == cfg.checkpoint.save_interval else None


def save_count(steps: int, interval: int) -> int:
    """The saves of a run of ``steps`` steps saving every ``interval``: each multiple, and the end."""
    return steps // interval + (1 if steps % interval else 0)


def saves_line(cfg: Any, source: str, step_seconds: float | None) -> list[str]:
    """The summary's account of the saves of ``cfg`` (which saves): the interval and why (derived, or
    ``source``, who set it), how many saves and, with ``step_seconds``, when the first comes; then a
    warning line when the interval is not shorter than the run (it saves only at its end)."""
    from bridge_recipes.config.run_length import duration

    interval, steps = cfg.checkpoint.save_interval, cfg.train.train_iters
    record = derived(cfg)
    why = record.why if record else source
    if not isinstance(steps, int) or steps < 1:
        return [f"(every {interval} steps: {why})" if interval else f"(only at the end: {why})"]
    if interval and interval < steps:
        count = save_count(steps, interval)
        when = f", about {duration(interval * step_seconds)} in" if step_seconds else ""
        first = f"the first after step {interval}{when}, the last at the end (step {steps})"
        return [f"(every {interval} steps: {why}); {count} saves, {first}"]
    every = f"every {interval} steps" if interval else "only at the end"
    lines = [f"({every}: {why}); 1 save, at the end (step {steps})"]
    if steps >= 2:
        lines.append(
            f"warning: checkpoint.save_interval {interval or 'null'} is not shorter than the run's {steps} steps: "
            f"the run saves only at its end, and a crash before then loses it; set it to {tenth(steps)} steps or "
            f"fewer to save about {SAVES_PER_RUN} times"
        )
    return lines
