"""A line while a long training step runs: which micro batch of the step has started and how long
the step has taken, at most once every ``EVERY_S`` seconds.

Megatron prints a line per finished step. A one-GPU recipe's step of 128 rows is 64 or 128 micro
batches and takes minutes (the first one kernel compiles on top), so without this a healthy run
prints nothing for that long and reads as a hang. The training step calls :func:`micro_batch` as each
micro batch starts; only the first rank prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

EVERY_S = 60.0


class StepProgress:
    """Counts the micro batches of the current step and says so once ``every_s`` seconds have passed
    since the step began or since the last line."""

    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.step: int | None = None
        self.count = 0
        self.started = self.last = 0.0

    def micro_batch(self, step: int, of: int | None) -> str | None:
        """Micro batch started in step ``step`` (counted from 1) of ``of`` per step: the line to print,
        or None while the last one is recent."""
        now = self.clock()
        if step != self.step:
            self.step, self.count, self.started, self.last = step, 0, now, now
        self.count += 1
        if now - self.last < self.every_s:
            return None
        self.last = now
        total = f" of {of}" if of else ""
        return f"step {step}: micro batch {self.count}{total} started, {now - self.started:.0f} s into the step"


_progress = StepProgress()


def _first_rank() -> bool:
    import torch.distributed as dist

    return not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0


def _micro_batches() -> int | None:
    try:
        from megatron.core.num_microbatches_calculator import get_num_microbatches

        return get_num_microbatches()
    except (ImportError, AttributeError, AssertionError):  # no calculator set up (a unit test's state)
        return None


def micro_batch(state: Any) -> None:
    """Called by the training step as a micro batch starts (``state``: Megatron-Bridge's global state)."""
    done = getattr(getattr(state, "train_state", None), "step", 0) or 0  # steps finished so far
    line = _progress.micro_batch(int(done) + 1, _micro_batches())
    if line and _first_rank():
        print(f"[progress] {line}", flush=True)
