"""Writing a script's output file: checked before any work, never onto an input, never half-written.

``output_problem`` says why a path cannot take a script's output (a folder, a missing or
unwritable folder, one of the files the script reads); scripts call it while validating their
arguments, before they run anything. ``write_text_atomic`` writes beside the target and
renames, so a reader sees the old file or the new one, never a partial one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def output_problem(path: str | os.PathLike, *, option: str, inputs: Iterable[str | os.PathLike] = ()) -> str | None:
    """Why ``path`` (given as ``option``) cannot be written, or None when it can."""
    p = Path(path)
    if p.is_dir():
        return f"{option} {p} is a folder; give a file path"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        return f"{option} {p}: the folder {parent} does not exist; create it first or choose another path"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{option} {p}: the folder {parent} is not writable"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{option} {p} is not writable"
    for source in inputs:
        if p.exists() and Path(source).exists() and os.path.samefile(p, source):
            return f"{option} {p} is one of the input files; write the result elsewhere"
    return None


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
