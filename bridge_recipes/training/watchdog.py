"""A training process that stops making progress ends with a report instead of sitting silent, and a
long step says how far it has got.

A thread of the training process watches for progress: a micro-batch starting (its predecessor's
forward and backward done), a step or an evaluation step finishing. The first micro-batch compiles
kernels and gets its own, longer budget (:data:`FIRST_STEP_S`, from the start of the training loop);
after it, progress must come within :data:`STEP_S` of the last. A one-GPU recipe's step of 128 rows
is dozens of micro-batches and takes minutes, so the watch counts micro-batches, not steps, and the
forward step prints a line (:data:`PROGRESS_EVERY_S` apart at the least) saying which micro-batch of
the step has started. When a budget runs out the thread writes the last stage the loop reached (the
step, the micro-batch and whether it was in its forward or its backward), a Python stack of every
thread, and ends the process with :data:`EXIT_CODE`: under torchrun the other ranks end with it.

nvidia-resiliency-ext's hang detection needs its own launcher (``ft_launcher``, whose rank monitors
hold the heartbeat timeouts) or an in-process restart wrapper, and the benchmark turns both off; this
watch runs in every launch, whatever started the process.

Both budgets are runner options (``--step-timeout``, ``--first-step-timeout``; 0 turns one off),
shown in the run's summary and recorded in a saved config file.

Each finished step prints one line a person reads (:class:`StepLine`): the step of the run and its
share, the seconds it took, the useful (non-padding) tokens/s per GPU of the last steps, and the time
left at their pace.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

FIRST_STEP_S = 1800.0  # the first micro-batch: kernel compiles (minutes on one GPU) and the first allocations
STEP_S = 600.0  # after it: from one micro-batch's start (or a step's end) to the next
PROGRESS_EVERY_S = 60.0  # the least time between two lines of a step's progress
EXIT_CODE = 124  # the exit status of a run ended for making no progress (as timeout(1) ends a command)
POLL_S = 5.0  # how often the thread looks


@dataclass(frozen=True)
class Budgets:
    """Seconds the first micro-batch may take from the start of the training loop, and the loop after it
    between two signs of progress (a micro-batch starting, a step ending); 0 turns a budget off."""

    first_step_s: float = FIRST_STEP_S
    step_s: float = STEP_S

    def describe(self) -> str:
        """The summary's line: what ends the run, or ``off``."""
        parts = [f"the first micro-batch takes over {self.first_step_s:g} s"] if self.first_step_s else []
        parts += [f"no later micro-batch starts or step ends for {self.step_s:g} s"] if self.step_s else []
        if not parts:
            return "off"
        when = " or ".join(parts)
        return f"ends the run (exit {EXIT_CODE}, with its last stage and every thread's stack) when {when}"


def budget_problem(option: str, value: Any) -> str | None:
    """Why ``value`` cannot be the budget of ``option`` (seconds, a number >= 0, 0 for off), or None."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return f"{option} {value}: give seconds, a number >= 0 (0 turns the watch off)"
    if 0 < seconds < POLL_S:
        return f"{option} {value}: the watch looks every {POLL_S:g} s; give at least {POLL_S:g} seconds, or 0 for off"
    return None


class Watchdog:
    """Ends the process when a budget of :class:`Budgets` runs out; the training loop calls :meth:`start`
    when it starts, :meth:`step_started` and :meth:`step_finished` around each step, :meth:`stage` as it
    goes and :meth:`progress` after each evaluation step (:func:`callbacks`, :func:`watched_forward_step`)."""

    def __init__(
        self,
        budgets: Budgets,
        *,
        stream: TextIO | None = None,
        end: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = POLL_S,
        every_s: float = PROGRESS_EVERY_S,
    ):
        self.budgets = budgets
        self.stream = stream
        self.end = end
        self.clock = clock
        self.poll_s = poll_s
        self.every_s = every_s
        self.steps_done = 0  # steps finished in this process
        self.warm = False  # past the first micro-batch (which has its own budget)
        self.last_progress = "the start of the training loop"
        self.step = 0  # the number of the step under way (a resumed run starts past 1)
        self.last_finished: int | None = None
        self.micro_batch = 0
        self.phase = "step 1"  # what the forward step's micro-batches belong to
        self.last_stage = "start of the training loop"
        self._since = self._step_began = self._said = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the budgets from now and the watching thread (once)."""
        self._since = self.clock()
        if self._thread is None and (self.budgets.first_step_s or self.budgets.step_s):
            self._thread = threading.Thread(target=self._watch, name="bridge_recipes.training.watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def stage(self, text: str) -> None:
        """Where the loop is now (kept for the report)."""
        self.last_stage = text

    def progress(self, what: str = "an evaluation step finished") -> None:
        """The loop moved on (``what``): the budget starts again."""
        self._since = self.clock()
        self.last_progress = what

    def step_started(self, step: int) -> None:
        self.step, self.micro_batch, self.phase = step, 0, f"step {step}"
        self._step_began = self._said = self.clock()
        self.stage(f"start of step {step}")

    def micro_batch_started(self, of: Callable[[], int | None] | int | None = None) -> str | None:
        """The next micro-batch of :attr:`phase` starts (the one before it done): progress after the first;
        the progress line to print when :attr:`every_s` has passed since the step began or the last line
        (``of``: the micro-batches per step, or what gives them, asked only then)."""
        self.micro_batch += 1
        self.stage(f"forward of micro-batch {self.micro_batch} of {self.phase}")
        if self.micro_batch > 1 or self.warm:
            self.warm = True
            self.progress(f"micro-batch {self.micro_batch} of {self.phase} started")
        now = self.clock()
        if now - self._said < self.every_s:
            return None
        self._said = now
        of = of() if callable(of) else of
        total = f" of {of}" if of else ""
        return (
            f"[progress] {self.phase}: micro-batch {self.micro_batch}{total} started, "
            f"{now - self._step_began:.0f} s into it"
        )

    def evaluation_started(self) -> None:
        self.micro_batch, self.phase = 0, f"the evaluation after step {self.last_finished}"
        self._step_began = self._said = self.clock()
        self.stage(f"start of {self.phase}")

    def step_finished(self) -> None:
        """Step :attr:`step` finished: the step budget starts again."""
        self.steps_done += 1
        self.warm = True
        self.last_finished = self.step
        self.stage(f"after step {self.step} (logging, evaluation or a checkpoint save)")
        self.progress(f"step {self.step} finished")

    def overdue(self) -> str | None:
        """The report's first line when the current budget has run out, else None."""
        budget = self.budgets.step_s if self.warm else self.budgets.first_step_s
        waited = self.clock() - self._since
        if not budget or waited < budget:
            return None
        return (
            f"[watchdog] no progress for {waited:.0f} s since {self.last_progress} (budget {budget:g} s); "
            f"last stage: {self.last_stage}"
        )

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if line := self.overdue():
                self.report_and_end(line)
                return

    def report_and_end(self, line: str) -> None:
        """Write ``line``, every thread's Python stack, ``line`` again (the end of a long log is what
        gets read), and end the process with :data:`EXIT_CODE`."""
        stream = self.stream or sys.stderr
        print(line, file=stream, flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
        print(line, file=stream, flush=True)
        self.end(EXIT_CODE)


RECENT_STEPS = 10  # the steps whose pace the rate and the time left are read from


@dataclass
class StepLine:
    """The line each finished step prints: ``[step] 12 of 140 (8.6%): 4.0 s, 4,317.8 useful tokens/s per
    GPU, about 8 min 32 s left``. ``tokens_per_step``: the sequences x tokens read per step; ``useful_share``:
    the non-padding share of them (the rows' manifest; 1.0 for other data); the rate is per GPU of
    ``world`` and read from the last :data:`RECENT_STEPS` steps, a step's time from its start to its end
    (evaluation and saving after it are not in it)."""

    total_steps: int
    tokens_per_step: int
    useful_share: float = 1.0
    world: int = 1
    clock: Callable[[], float] = time.monotonic
    _began: float | None = None
    _recent: list[float] = field(default_factory=list)

    def started(self) -> None:
        self._began = self.clock()

    def finished(self, step: int) -> str | None:
        """The line of step ``step`` (None when its start was not seen)."""
        if self._began is None:
            return None
        took = self.clock() - self._began
        self._began = None
        self._recent = [*self._recent, took][-RECENT_STEPS:]
        pace = sum(self._recent) / len(self._recent)
        share = step / self.total_steps if self.total_steps else 0.0
        unit = "useful tokens/s per GPU" if self.useful_share < 1.0 else "tokens/s per GPU"
        rate = self.tokens_per_step * self.useful_share / (pace * self.world) if pace > 0 else 0.0
        left = max(self.total_steps - step, 0) * pace
        return (
            f"[step] {step} of {self.total_steps} ({share:.1%}): {took:.1f} s, {rate:,.1f} {unit}, "
            f"about {_left(left)} left"
        )


def _left(seconds: float) -> str:
    """``2 h 05 min``, ``8 min 32 s`` or ``40 s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def watched_forward_step(forward_step: Callable, dog: Watchdog) -> Callable:
    """``forward_step`` reporting each micro-batch's forward and backward to ``dog``. The signature
    is the one Megatron-Bridge inspects to hand the training state over (``state`` first)."""

    def step(state: Any, data_iterator: Any, model: Any, return_schedule_plan: bool = False) -> Any:
        if line := dog.micro_batch_started(_micro_batches):
            from megatron.bridge.utils.common_utils import print_rank_0

            print_rank_0(line)
        where = f"micro-batch {dog.micro_batch} of {dog.phase}"
        output, loss_function = forward_step(state, data_iterator, model, return_schedule_plan)

        def loss(*args: Any, **kwargs: Any) -> Any:
            dog.stage(f"loss of {where}")
            result = loss_function(*args, **kwargs)
            dog.stage(f"backward of {where} (or, after the last micro-batch, the optimizer step)")
            return result

        return output, loss

    return step


def _micro_batches() -> int | None:
    """Micro-batches per step (Megatron-Core's calculator), None where it is not set up."""
    try:
        from megatron.core.num_microbatches_calculator import get_num_microbatches

        return get_num_microbatches()
    except (ImportError, AttributeError, AssertionError):
        return None


def callbacks(dog: Watchdog, line: StepLine | None = None) -> dict[str, Callable[[Any], None]]:
    """Megatron-Bridge training-loop events -> what each tells ``dog`` and, with ``line``, the line each
    finished step prints (register them with a ``CallbackManager``)."""

    def train_start(context: Any) -> None:
        dog.step = context.state.train_state.step  # 0, or the step a resumed run continues after
        dog.start()

    def step_start(context: Any) -> None:
        dog.step_started(context.state.train_state.step + 1)
        if line is not None:
            line.started()

    def step_end(context: Any) -> None:
        dog.step_finished()
        if line is not None and (text := line.finished(dog.step)):
            from megatron.bridge.utils.common_utils import print_rank_0

            print_rank_0(text)

    def eval_start(context: Any) -> None:
        dog.evaluation_started()

    def eval_step_end(context: Any) -> None:
        dog.progress()

    def train_end(context: Any) -> None:
        dog.stop()

    return {
        "on_train_start": train_start,
        "on_train_step_start": step_start,
        "on_train_step_end": step_end,
        "on_eval_start": eval_start,
        "on_eval_step_end": eval_step_end,
        "on_train_end": train_end,
    }
