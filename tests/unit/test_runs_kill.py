"""A hard kill reaches the training process even when its launcher put it in another session."""

import subprocess
import sys
import time

from bridge_recipes.bench.runs import descendants, kill_tree

# a "launcher" that starts its "worker" in a new session, as torchrun does, then waits on it
LAUNCHER = ("import subprocess, sys, time; "
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "print(w.pid, flush=True); w.wait()")


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
