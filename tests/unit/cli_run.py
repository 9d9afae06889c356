"""The runner's command line called in the test's own process: its exit code and what it printed."""

from __future__ import annotations

import contextlib
import io


def run_cli(*argv) -> tuple[int, str]:
    """``run_recipe.py ARGV`` in this process: the exit code and stdout + stderr."""
    from bridge_recipes.runner.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()
