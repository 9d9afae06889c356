"""Megatron(-Bridge)'s training log: iteration lines, memory lines, timer blocks.

:func:`parse_megatron_log` reads the per-iteration lines Megatron-Bridge prints with
``log_interval = 1``; :func:`step_records_from_log` turns them (and the ``memory (GB)`` lines)
into the step records of :mod:`bridge_recipes.logs.stats`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bridge_recipes.logs.stats import BYTES_PER_GB, StepRecord


@dataclass(frozen=True)
class LogIteration:
    """One ``iteration N/ M | name: value | ...`` line; ``values`` holds every numeric field
    under its name as printed (``"lm loss"``, ``"elapsed time per iteration (ms)"``, ...)."""

    step: int
    train_iters: int
    time_s: float
    global_batch_size: int
    lm_loss: float | None
    grad_norm: float | None
    values: dict[str, float]
    timestamp: str | None = None


_ITERATION = re.compile(r"(?:\[(?P<ts>[^\]]+)\]\s*)?iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|(?P<rest>.*)$")
_VALIDATION = re.compile(r"validation loss at iteration\s+(?P<step>\d+)(?P<rest>.*)$")
_MEMORY = re.compile(r"\[Rank (?P<rank>\d+)\] \(after (?P<step>\d+) iterations\) memory \(GB\)\s*\|(?P<rest>.*)$")


def _fields(rest: str) -> dict[str, float]:
    values = {}
    for part in rest.split("|"):
        name, sep, value = part.partition(":")
        if not sep:
            continue
        try:
            values[name.strip()] = float(value.strip())
        except ValueError:  # a non-numeric field: not a measurement
            continue
    return values


def training_iteration(line: str) -> tuple[re.Match, dict[str, float]] | None:
    """(match, numeric fields) of a training-iteration line; None for any other line, including
    iteration lines without a step time and batch size (e.g. an evaluation summary). The one
    definition of a training-iteration line, for the parsers here and the run launcher."""
    m = _ITERATION.search(line)
    if not m:
        return None
    values = _fields(m.group("rest"))
    if "elapsed time per iteration (ms)" not in values or "global batch size" not in values:
        return None
    return m, values


def training_iteration_step(line: str) -> int | None:
    """The step of a training-iteration line (:func:`training_iteration`), None for any other line."""
    found = training_iteration(line)
    return int(found[0].group("step")) if found else None


def parse_megatron_log(text: str) -> list[LogIteration]:
    """Per-iteration records of a Megatron(-Bridge) training log, in the order printed.

    ``time_s`` is "elapsed time per iteration (ms)" / 1000: one step's time only when the log
    interval is 1 (otherwise Megatron prints the mean over the interval, every interval).
    """
    out = []
    for line in text.splitlines():
        found = training_iteration(line)
        if not found:
            continue
        m, values = found
        out.append(
            LogIteration(
                step=int(m.group("step")),
                train_iters=int(m.group("total")),
                time_s=values["elapsed time per iteration (ms)"] / 1000,
                global_batch_size=int(values["global batch size"]),
                lm_loss=values.get("lm loss"),
                grad_norm=values.get("grad norm"),
                values=values,
                timestamp=m.group("ts"),
            )
        )
    return out


def validation_losses(text: str) -> dict[int, float]:
    """``validation loss at iteration N ... | lm loss value: X`` lines: {N: X}, the last line of a
    step winning (Megatron-Bridge prints the step's evaluation, then the final one again)."""
    out = {}
    for line in text.splitlines():
        m = _VALIDATION.search(line)
        if m and "lm loss value" in (values := _fields(m.group("rest"))):
            out[int(m.group("step"))] = values["lm loss value"]
    return out


def parse_megatron_memory(text: str) -> dict[int, dict[int, dict[str, float]]]:
    """``[Rank r] (after N iterations) memory (GB) | ...`` lines: {step: {rank: {name: GB}}}."""
    out: dict[int, dict[int, dict[str, float]]] = {}
    for line in text.splitlines():
        m = _MEMORY.search(line)
        if m:
            out.setdefault(int(m.group("step")), {})[int(m.group("rank"))] = _fields(m.group("rest"))
    return out


_TIMER = re.compile(
    r"^\s*(?:\[[^\]]*\])?\s+(?P<name>[\w./-]+) \.+: (?:\((?P<min>[\d.]+), (?P<max>[\d.]+)\)|(?P<only>[\d.]+))\s*$"
)


def is_timer_line(line: str) -> bool:
    """A line of one of Megatron's timer blocks (``name ....: (min, max)`` or ``name ....: ms``)."""
    return _TIMER.match(line) is not None


def parse_megatron_timers(text: str) -> dict[int, dict[str, float]]:
    """Megatron's timer lines (``logger.timing_log_level >= 1``), each the block printed after an
    iteration line and given to that step: {step: {timer: ms}}, the max over ranks where
    min and max are printed. Timer blocks before the first iteration (set-up) are left out."""
    out: dict[int, dict[str, float]] = {}
    step = None
    for line in text.splitlines():
        found = training_iteration(line)
        if found:
            step = int(found[0].group("step"))
            continue
        m = _TIMER.match(line)
        if m and step is not None:
            out.setdefault(step, {})[m.group("name")] = float(m.group("max") or m.group("only"))
    return out


PHASE_TIMERS = ("forward-backward", "optimizer")  # the part that scales with micro batches, and the rest


def phase_time_means(text: str, window: tuple[int, int]) -> dict[str, float] | None:
    """Mean seconds per step of :data:`PHASE_TIMERS` over the window's steps; None when a log
    has no timer lines for every step of the window (timers off)."""
    timers = parse_megatron_timers(text)
    steps = range(window[0], window[1] + 1)
    if not all(all(name in timers.get(s, {}) for name in PHASE_TIMERS) for s in steps):
        return None
    return {name: sum(timers[s][name] for s in steps) / len(steps) / 1000 for name in PHASE_TIMERS}


def peak_allocated_gb_per_rank(text: str) -> dict[int, float]:
    """Each rank's largest ``mem-max-allocated-gigabytes`` over a log's memory lines."""
    out: dict[int, float] = {}
    for ranks in parse_megatron_memory(text).values():
        for rank, values in ranks.items():
            if "mem-max-allocated-gigabytes" in values:
                out[rank] = max(out.get(rank, 0.0), values["mem-max-allocated-gigabytes"])
    return out


def peak_allocated_gb(text: str) -> float | None:
    """The largest ``mem-max-allocated-gigabytes`` over a log's memory lines and ranks (None: none logged)."""
    return max(peak_allocated_gb_per_rank(text).values(), default=None)


def step_records_from_log(text: str, seq_length: int) -> list[StepRecord]:
    """Step records of a log: tokens = global batch size x ``seq_length`` (fixed-length rows),
    peak memory from the ``mem-max-allocated/reserved-gigabytes`` of the memory lines."""
    memory = parse_megatron_memory(text)

    def peaks(step: int, key: str) -> tuple[int, ...]:
        ranks = memory.get(step, {})
        return tuple(round(v[key] * BYTES_PER_GB) for _, v in sorted(ranks.items()) if key in v)

    return [
        StepRecord(
            step=it.step,
            time_s=it.time_s,
            tokens=it.global_batch_size * seq_length,
            peak_allocated_bytes=peaks(it.step, "mem-max-allocated-gigabytes"),
            peak_reserved_bytes=peaks(it.step, "mem-max-reserved-gigabytes"),
        )
        for it in parse_megatron_log(text)
    ]
