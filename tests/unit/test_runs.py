"""Launching runs: a hard kill reaches the training process even when its launcher put it in
another session; a finished run is kept and reused by a later command."""

import subprocess
import sys
import time

from bridge_recipes.bench.runs import descendants, kill_tree
from bridge_recipes.logs.run_log import split_runs

# a "launcher" that starts its "worker" in a new session, as torchrun does, then waits on it
LAUNCHER = (
    "import subprocess, sys, time; "
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
    "print(w.pid, flush=True); w.wait()"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_tree_kills_a_worker_in_its_own_session():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    assert worker in descendants(launcher.pid)
    kill_tree(launcher.pid)
    launcher.wait(timeout=10)
    deadline = time.time() + 10
    while _alive(worker) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_a_finished_run_is_kept_and_reused(tmp_path, monkeypatch):
    from bridge_recipes.bench import runs

    log_text = (
        "[2026-11-29 10:00:00] iteration        1/       2 | elapsed time per iteration (ms): 900.0 | "
        "global batch size:     4 | lm loss: 1.200000E+01 |\n"
    )
    calls = []

    def fake_launch(name, recipe, args, log_path, **kw):
        calls.append(args)
        return runs.Run(name, 0, None, log_text, 5.0, runs.parse_megatron_log(log_text))

    monkeypatch.setattr(runs, "launch", fake_launch)
    kept, log = tmp_path / "kept" / "a.json", tmp_path / "out.log"
    first = runs.launch_kept(kept, "reference", "r", ["--x", "1"], log)
    again = runs.launch_kept(kept, "reference", "r", ["--x", "1"], log)
    assert len(calls) == 1 and again.losses == first.losses == {1: 12.0}
    assert split_runs(log.read_text())["reference"].count("lm loss") == 1  # the kept log, written again
    runs.launch_kept(kept, "reference", "r", ["--x", "2"], log)  # other arguments: a new run
    assert len(calls) == 2
