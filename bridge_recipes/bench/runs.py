"""Launch recipe runs as separate processes and read their training logs.

Used by the GPU evidence suite and the benchmark script: each run is
``torchrun --nproc-per-node N scripts/run_recipe.py --recipe NAME ARGS...``, its output
streamed to a log file; a run can be killed hard (SIGKILL to its whole process group) once a
given step has been logged, to test resuming from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge_recipes.bench.megatron_log import (
    LogIteration,
    parse_megatron_log,
    peak_allocated_gb,
    training_iteration_step,
)

ROOT = Path(__file__).resolve().parents[2]


def loss_curve(iterations: list[LogIteration]) -> dict[int, float]:
    """step -> LM loss of the logged iterations that report one."""
    return {it.step: it.lm_loss for it in iterations if it.lm_loss is not None}


def log_losses(text: str) -> dict[int, float]:
    """step -> LM loss of a training log."""
    return loss_curve(parse_megatron_log(text))


# A plain loss line: a step and a loss, separated by spaces, a tab, a comma or a semicolon.
_PLAIN_LOSS = re.compile(r"^\s*(\d+)\s*[\s,;]\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


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


def any_losses(text: str) -> dict[int, float]:
    """step -> loss of a Megatron(-Bridge) training log, else of plain ``STEP LOSS`` text."""
    return log_losses(text) or plain_losses(text)


@dataclass
class Run:
    name: str
    returncode: int
    killed_at_step: int | None
    log: str
    seconds: float
    iterations: list[LogIteration] = field(default_factory=list)

    @property
    def losses(self) -> dict[int, float]:
        return loss_curve(self.iterations)

    @property
    def peak_allocated_gb(self) -> float | None:
        return peak_allocated_gb(self.log)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc): torchrun starts its workers in their own
    sessions, so killing torchrun's process group leaves the training process running."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started, training processes first."""
    for p in [*reversed(descendants(pid)), pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    """A TCP port free now on this host: runs started side by side (one per GPU) each get their own
    rendezvous port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(recipe: str, args: list[str], nproc: int = 1, port: int | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(port if port is not None else free_port()),
        str(ROOT / "scripts" / "run_recipe.py"),
        "--recipe",
        recipe,
        *args,
    ]


def launch(
    name: str,
    recipe: str,
    args: list[str],
    log_path: Path,
    *,
    kill_after_step: int | None = None,
    nproc: int = 1,
    timeout_s: float = 1800,
) -> Run:
    """Run to completion (or kill after ``kill_after_step`` is logged); append the output to ``log_path``."""
    cmd = torchrun_command(recipe, args, nproc)
    start = time.time()
    lines, killed = [], None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n===== run {name}: {' '.join(cmd[2:])}\n")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for line in proc.stdout:
            lines.append(line)
            log.write(f"[{time.time() - start:7.1f}s] {line}")  # seconds since launch: where start-up time goes
            step = training_iteration_step(line)
            if kill_after_step is not None and step is not None and step >= kill_after_step and killed is None:
                killed = step
                log.write(
                    f"===== killing run {name} (SIGKILL to torchrun and every process under it) after step {killed}\n"
                )
                kill_tree(proc.pid)
            if time.time() - start > timeout_s:
                kill_tree(proc.pid)
                log.write(f"===== run {name} timed out after {timeout_s} s\n")
                break
        proc.wait()
        log.write(f"===== run {name} exit status {proc.returncode} after {time.time() - start:.0f} s\n")
    text = "".join(lines)
    return Run(name, proc.returncode, killed, text, time.time() - start, parse_megatron_log(text))


def launch_kept(kept: Path, name: str, recipe: str, args: list[str], log_path: Path, **kw) -> Run:
    """:func:`launch`, unless ``kept`` holds the same run (recipe and arguments) finished earlier,
    e.g. by a previous command on the same host: then that run, its log appended to ``log_path``
    under a header that says so. A run that finished (or was killed on purpose) is kept."""
    if kept.exists():
        old = json.loads(kept.read_text())
        if old["recipe"] == recipe and old["args"] == list(args):
            with open(log_path, "a") as log:
                log.write(
                    f"\n===== run {name}: (kept from an earlier command) {recipe} {' '.join(args)}\n{old['log']}"
                )
            return Run(
                name,
                old["returncode"],
                old["killed_at_step"],
                old["log"],
                old["seconds"],
                parse_megatron_log(old["log"]),
            )
    run = launch(name, recipe, args, log_path, **kw)
    if run.returncode == 0 or run.killed_at_step:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(
            json.dumps(
                {
                    "recipe": recipe,
                    "args": list(args),
                    "returncode": run.returncode,
                    "killed_at_step": run.killed_at_step,
                    "seconds": run.seconds,
                    "log": run.log,
                }
            )
        )
    return run


_RUN_HEADER = re.compile(r"^===== run (\S+): (.*)$", re.M)


def compact_log(log_text: str) -> str:
    """The lines of a :func:`launch` log that its evidence is read from: run headers and exit
    lines, the runner's own lines, iteration, validation, memory and timer lines, Megatron-Bridge's
    conversion result (``Success: ...``), errors; runs kept from an earlier command appear once.
    Megatron's config dumps make a full log megabytes."""
    from bridge_recipes.bench.megatron_log import is_timer_line, training_iteration

    out, skip = [], False
    for line in log_text.splitlines():
        if line.startswith("===== run"):
            skip = "(kept from an earlier command)" in line
            if not skip:
                out.append(line)
            continue
        if skip:
            continue
        body = line.split("] ", 1)[-1] if line.startswith("[") else line
        if (
            line.startswith("=====")
            or body.startswith("[run_recipe]")
            or training_iteration(line)
            or "validation loss at" in line
            or "memory (GB)" in line
            or is_timer_line(line)
            or body.startswith("Success: All tensors")
            or "Error" in line
        ):
            out.append(line)
    return "\n".join(out) + "\n"


def split_runs(log_text: str) -> dict[str, str]:
    """The runs of a log written by :func:`launch` (several runs appended to one file)."""
    heads = list(_RUN_HEADER.finditer(log_text))
    return {
        h.group(1): log_text[h.start() : (heads[i + 1].start() if i + 1 < len(heads) else len(log_text))]
        for i, h in enumerate(heads)
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m bridge_recipes.bench.runs --name N --log F --recipe R [--kill-after S] -- ARGS``:
    one run through :func:`launch`, its loss per step printed at the end."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--log", required=True, type=Path)
    p.add_argument("--recipe", required=True)
    p.add_argument("--kill-after", type=int, default=None, help="SIGKILL the run once this step is logged")
    p.add_argument("args", nargs=argparse.REMAINDER, help="runner arguments, after --")
    ns = p.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    run = launch(ns.name, ns.recipe, args, ns.log, kill_after_step=ns.kill_after)
    print(
        f"{ns.name}: exit {run.returncode} after {run.seconds:.0f} s, killed at {run.killed_at_step}, "
        f"peak allocated {run.peak_allocated_gb} GB"
    )
    for step, loss in sorted(run.losses.items()):
        print(f"  step {step:3d}  lm loss {loss:.6g}")
    return 0 if run.returncode == 0 or run.killed_at_step else 1


if __name__ == "__main__":
    sys.exit(main())
