"""Logs of runs launched one after another into one file (``bench.runs.launch``): each run opens
with a ``===== run NAME: ...`` line; and the loss curve of a training log."""

from __future__ import annotations

import re

from bridge_recipes.logs.megatron_log import LogIteration, parse_megatron_log

RUN_HEADER = re.compile(r"^===== run (\S+): (.*)$", re.M)


def loss_curve(iterations: list[LogIteration]) -> dict[int, float]:
    """step -> LM loss of the logged iterations that report one."""
    return {it.step: it.lm_loss for it in iterations if it.lm_loss is not None}


def log_losses(text: str) -> dict[int, float]:
    """step -> LM loss of a training log."""
    return loss_curve(parse_megatron_log(text))


def split_runs(log_text: str) -> dict[str, str]:
    """The runs of a log of several runs appended to one file, by name."""
    heads = list(RUN_HEADER.finditer(log_text))
    return {
        h.group(1): log_text[h.start() : (heads[i + 1].start() if i + 1 < len(heads) else len(log_text))]
        for i, h in enumerate(heads)
    }
