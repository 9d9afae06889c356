"""Window statistics over per-step records.

OpenRecipes measures a 20-step run over the window of steps 5..19 inclusive (``window: [5,
19]``): tokens/s/GPU is the window's tokens over the window's time over the GPUs, MFU is that
rate times the FLOPs per token over the GPU's dense BF16 peak. :func:`summarize` computes the
same from a list of :class:`StepRecord`, with:

- step time mean and coefficient of variation over the window, the standard deviation taken
  as the population one (ddof = 0: the window is every step described, not a sample of
  them); ``step_time_cv_percent`` is 100 x std / mean, a percentage as in OpenRecipes;
- peak memory: the maximum over ranks and over every record given (the whole run, since an
  allocation peak outside the window limits the layout just the same), in GB of 1e9 bytes as
  Megatron logs it.

Step records come from a run's log through
:func:`bridge_recipes.logs.megatron_log.step_records_from_log`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bridge_recipes.hardware.gpus import peak_bf16_flops

DEFAULT_WINDOW = (5, 19)  # OpenRecipes: steps 5..19 of a 20-step run, 1-based, inclusive
BYTES_PER_GB = 1e9  # Megatron-Bridge's report_memory divides bytes by 1e9


# --- step records and window statistics -------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """One training step: 1-based index, wall time, tokens of the step over all GPUs, and the
    optional peak allocated / reserved bytes per rank."""

    step: int
    time_s: float
    tokens: int
    peak_allocated_bytes: tuple[int, ...] = ()
    peak_reserved_bytes: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("peak_allocated_bytes", "peak_reserved_bytes"):
            value = getattr(self, name)
            ranks = (value,) if isinstance(value, (int, float)) else value  # one rank given as a number
            object.__setattr__(self, name, tuple(int(v) for v in ranks))
        if self.time_s <= 0 or not math.isfinite(self.time_s):
            raise ValueError(f"step {self.step}: step time must be a positive number of seconds, got {self.time_s}")
        if self.tokens < 0:
            raise ValueError(f"step {self.step}: tokens must be >= 0, got {self.tokens}")


@dataclass(frozen=True)
class WindowStats:
    window: tuple[int, int]
    world_size: int
    steps_recorded: int
    window_tokens: int
    window_time_s: float
    tokens_per_s_per_gpu: float
    step_time_mean_s: float
    step_time_std_s: float  # population (ddof = 0)
    step_time_cv_percent: float
    flops_per_token: float | None = None
    six_n_flops_per_token: float | None = None
    peak_flops: float | None = None
    tflops_per_s_per_gpu: float | None = None
    mfu: float | None = None
    mfu_6n: float | None = None
    peak_allocated_gb: float | None = None
    peak_reserved_gb: float | None = None
    step_times_s: tuple[float, ...] = field(default=(), repr=False)


def window_records(records: Sequence[StepRecord], window: tuple[int, int] = DEFAULT_WINDOW) -> list[StepRecord]:
    """The records of steps ``window[0]..window[1]`` (inclusive), every one of them present."""
    first, last = window
    if not (isinstance(first, int) and isinstance(last, int)) or first < 1 or last < first:
        raise ValueError(f"window must be two 1-based steps (first, last) with first <= last, got {window!r}")
    by_step: dict[int, StepRecord] = {}
    for r in records:
        if r.step in by_step:
            raise ValueError(f"step {r.step} is recorded twice; give one record per step")
        by_step[r.step] = r
    if not by_step:
        raise ValueError("no step records: nothing to measure")
    missing = [step for step in range(first, last + 1) if step not in by_step]
    if missing:
        have = f"steps {min(by_step)}..{max(by_step)} ({len(by_step)} recorded)"
        raise ValueError(
            f"window {first}..{last} is not covered by the records: missing steps {_ranges(missing)}; have {have}. "
            f"Run at least {last} steps with log_interval 1, or choose a window inside the recorded steps"
        )
    return [by_step[step] for step in range(first, last + 1)]


def summarize(
    records: Sequence[StepRecord],
    window: tuple[int, int] = DEFAULT_WINDOW,
    world_size: int = 1,
    flops_per_token: float | None = None,
    peak_flops: float | str | None = None,
    *,
    six_n_flops_per_token: float | None = None,
) -> WindowStats:
    """Throughput, MFU and step-time statistics of the window (module docstring).

    ``flops_per_token`` is the model's training FLOPs per token (``FlopsPerToken.training_total``),
    ``six_n_flops_per_token`` OpenRecipes' 6N; ``peak_flops`` the GPU's dense BF16 FLOP/s or a
    GPU name for :func:`peak_bf16_flops`. MFU fields are None when their inputs are.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    steps = window_records(records, window)
    times = tuple(r.time_s for r in steps)
    window_time = sum(times)
    window_tokens = sum(r.tokens for r in steps)
    mean = window_time / len(times)
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / len(times))
    tokens_per_s_per_gpu = window_tokens / window_time / world_size
    peak = peak_bf16_flops(peak_flops) if isinstance(peak_flops, str) else peak_flops

    def utilization(flops: float | None) -> float | None:
        return None if flops is None or not peak else tokens_per_s_per_gpu * flops / peak

    return WindowStats(
        window=(window[0], window[1]),
        world_size=world_size,
        steps_recorded=len(records),
        window_tokens=window_tokens,
        window_time_s=window_time,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        step_time_mean_s=mean,
        step_time_std_s=std,
        step_time_cv_percent=100 * std / mean,
        flops_per_token=flops_per_token,
        six_n_flops_per_token=six_n_flops_per_token,
        peak_flops=peak,
        tflops_per_s_per_gpu=None if flops_per_token is None else tokens_per_s_per_gpu * flops_per_token / 1e12,
        mfu=utilization(flops_per_token),
        mfu_6n=utilization(six_n_flops_per_token),
        peak_allocated_gb=_peak_gb(r.peak_allocated_bytes for r in records),
        peak_reserved_gb=_peak_gb(r.peak_reserved_bytes for r in records),
        step_times_s=times,
    )


def _peak_gb(per_step: Iterable[tuple[int, ...]]) -> float | None:
    values = [v for ranks in per_step for v in ranks]
    return max(values) / BYTES_PER_GB if values else None


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7' (steps sorted)."""
    spans, start, prev = [], steps[0], steps[0]
    for cur in steps[1:] + [None]:
        if cur is None or cur != prev + 1:
            spans.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = cur
        prev = cur
    return ", ".join(spans)
