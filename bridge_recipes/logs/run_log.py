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


# A plain loss line: a step and a loss, separated by spaces, a tab, a comma or a semicolon.
# A loss of inf or nan (a diverged run) is read as such, for the comparison to report.
_PLAIN_LOSS = re.compile(
    r"^\s*(\d+)\s*[\s,;]\s*([-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf(?:inity)?|nan))\s*$", re.IGNORECASE
)


def plain_losses(text: str) -> dict[int, float]:
    """step -> loss of plain text, one ``STEP LOSS`` pair a line (``10 2.345``, ``10,2.345``);
    blank lines, ``#`` comments and one header line (``step loss``) are skipped. ValueError
    naming the first other line."""
    out: dict[int, float] = {}
    lines = [(i, line.split("#", 1)[0].strip()) for i, line in enumerate(text.splitlines(), 1)]
    lines = [(i, line) for i, line in lines if line]
    if lines and not _PLAIN_LOSS.match(lines[0][1]) and not any(c.isdigit() for c in lines[0][1]):
        lines = lines[1:]  # a header
    for i, line in lines:
        m = _PLAIN_LOSS.match(line)
        if not m:
            raise ValueError(f"line {i} is not 'STEP LOSS': {line[:80]!r}")
        out[int(m.group(1))] = float(m.group(2))
    if not out:
        raise ValueError("it holds no 'STEP LOSS' line")
    return out


def complete_losses(text: str, label: str) -> dict[int, float]:
    """step -> LM loss of a run that is whole: each step logged once, and the last logged step
    the run's last (``iteration N/ TOTAL``). ValueError naming ``label`` otherwise: a run that
    died early, or a log holding a step twice (two runs or a resumed run in one file), would
    otherwise be compared over the steps it shares and could pass."""
    iterations = [it for it in parse_megatron_log(text) if it.lm_loss is not None]
    steps = [it.step for it in iterations]
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
        raise ValueError(
            f"{label} logs step(s) {', '.join(map(str, repeated[:5]))} more than once (two runs or a resumed run "
            "in one log?); give each run its own log, or one '===== run NAME:' section each"
        )
    if iterations and (last := iterations[-1]).step < last.train_iters:
        raise ValueError(
            f"{label} stopped at step {last.step} of {last.train_iters}: the run died or was cut short; "
            "compare runs that finished"
        )
    return loss_curve(iterations)


def run_names(log_text: str) -> list[str]:
    """The names of the ``===== run NAME:`` sections of a log, in order (repeats kept)."""
    return [h.group(1) for h in RUN_HEADER.finditer(log_text)]


def split_runs(log_text: str) -> dict[str, str]:
    """The runs of a log of several runs appended to one file, by name."""
    heads = list(RUN_HEADER.finditer(log_text))
    return {
        h.group(1): log_text[h.start() : (heads[i + 1].start() if i + 1 < len(heads) else len(log_text))]
        for i, h in enumerate(heads)
    }
