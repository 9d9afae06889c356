"""Launch recipe runs as separate processes and read their training logs.

Used by the GPU evidence suite and the benchmark script: each run is
``torchrun --nproc-per-node N scripts/run_recipe.py --recipe NAME ARGS...``, its output
streamed to a log file; a run can be killed hard (SIGKILL to its whole process group) once a
given step has been logged, to test resuming from the last checkpoint.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bridge_recipes.bench.stats import LogIteration, parse_megatron_log, parse_megatron_memory

ROOT = Path(__file__).resolve().parents[2]
_ITERATION = re.compile(r"iteration\s+(\d+)/")


def loss_curve(iterations: list[LogIteration]) -> dict[int, float]:
    """step -> LM loss of the logged iterations that report one."""
    return {it.step: it.lm_loss for it in iterations if it.lm_loss is not None}


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
        peaks = [v.get("mem-max-allocated-gigabytes") for ranks in parse_megatron_memory(self.log).values()
                 for v in ranks.values()]
        peaks = [p for p in peaks if p is not None]
        return max(peaks) if peaks else None


def torchrun_command(recipe: str, args: list[str], nproc: int = 1, port: int = 29511) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(port),
            str(ROOT / "scripts" / "run_recipe.py"), "--recipe", recipe, *args]


def launch(name: str, recipe: str, args: list[str], log_path: Path, *, kill_after_step: int | None = None,
           nproc: int = 1, timeout_s: float = 1800) -> Run:
    """Run to completion (or kill after ``kill_after_step`` is logged); append the output to ``log_path``."""
    cmd = torchrun_command(recipe, args, nproc)
    start = time.time()
    lines, killed = [], None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n===== run {name}: {' '.join(cmd[2:])}\n")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            m = _ITERATION.search(line)
            if kill_after_step is not None and m and int(m.group(1)) >= kill_after_step and killed is None:
                killed = int(m.group(1))
                log.write(f"===== killing run {name} (SIGKILL to its process group) after step {killed}\n")
                os.killpg(proc.pid, signal.SIGKILL)
            if time.time() - start > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)
                log.write(f"===== run {name} timed out after {timeout_s} s\n")
                break
        proc.wait()
        log.write(f"===== run {name} exit status {proc.returncode} after {time.time() - start:.0f} s\n")
    text = "".join(lines)
    return Run(name, proc.returncode, killed, text, time.time() - start, parse_megatron_log(text))


_RUN_HEADER = re.compile(r"^===== run (\S+): (.*)$", re.M)


def split_runs(log_text: str) -> dict[str, str]:
    """The runs of a log written by :func:`launch` (several runs appended to one file)."""
    heads = list(_RUN_HEADER.finditer(log_text))
    return {h.group(1): log_text[h.start():(heads[i + 1].start() if i + 1 < len(heads) else len(log_text))]
            for i, h in enumerate(heads)}
