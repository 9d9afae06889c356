"""Writing a script's output file: checked before any work, never onto an input, never half-written.

``output_problem`` says why a path cannot take a script's output (a folder, a missing or
unwritable folder, one of the files the script reads); scripts call it while validating their
arguments, before they run anything. ``write_text_atomic`` writes beside the target and
renames, so a reader sees the old file or the new one, never a partial one (created with the
mode a plain ``open`` gives, the umask's); ``staged_output``
does the same for a folder. ``held_signals`` keeps a signal from cutting a few renames in two;
``worker_processes`` lets a Ctrl-C stop a command and its forked workers quietly.
``replace_problem`` and :data:`OUTPUT_MARKER` keep ``--overwrite`` to folders a command wrote
itself. ``file_sha256`` is the hash the written files are checked by. ``add_build_options`` gives the
dataset builders' command lines their shared --out, --overwrite, --workers and --no-progress, and
``worker_count`` caps --workers at the machine's cores. Standard
library only (the wheelhouse uses it before anything is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

Input = str | os.PathLike | tuple[str, str | os.PathLike]


def overlap_problem(
    out: str | os.PathLike, *, option: str, inputs: Iterable[Input], what: str | None = None
) -> str | None:
    """Why writing ``out`` (given as ``option``; named ``what`` in the message, default ``option out``)
    would touch an input, or None.

    ``inputs`` are paths, or ``(name, path)`` pairs naming the flag that gave each. Refused:
    the same path (through links too), an output folder that holds an input (replacing the
    folder, e.g. with ``--overwrite``, would delete it), and an output inside an input folder."""
    target = Path(out).expanduser().resolve()
    what = what or f"{option} {out}"
    for item in inputs:
        name, source = item if isinstance(item, tuple) else ("an input", item)
        if source is None or str(source) == "":
            continue
        src = Path(source).expanduser().resolve()
        if src == target:
            return f"{what} is the same path as {name} {source}; write the result elsewhere"
        if target in src.parents:
            return f"{what} holds {name} {source}; writing it would replace the input: choose another path"
        if src in target.parents:
            return f"{what} is inside {name} {source}; write the result outside it"
    return None


def output_problem(path: str | os.PathLike, *, option: str, inputs: Iterable[Input] = ()) -> str | None:
    """Why ``path`` (given as ``option``) cannot be written, or None when it can (see
    :func:`overlap_problem` for ``inputs``)."""
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
    inputs = list(inputs)
    for item in inputs:
        source = item[1] if isinstance(item, tuple) else item
        if p.exists() and Path(source).exists() and os.path.samefile(p, source):
            return f"{option} {p} is one of the input files; write the result elsewhere"
    return overlap_problem(p, option=option, inputs=inputs)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        # mkstemp makes the file its owner's only: give it the mode a plain open() would
        os.fchmod(fd, p.stat().st_mode & 0o7777 if p.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def exit_on_termination() -> None:
    """Turn SIGTERM and SIGHUP (``kill``, a closed terminal, a scheduler's stop) into SystemExit,
    so that a script's cleanup runs: a staged output folder is removed, not left beside the
    output. For the command lines' ``main``; a SIGKILL'd build's leftovers go at the next build."""
    import signal

    def stop(signum: int, frame) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


TERMINATING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM and SIGHUP wait until the block ends (a few renames that must not be cut in
    two); the list it gives holds those that came. Outside the main thread it holds nothing back."""
    import signal
    import threading

    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    signals = [getattr(signal, name) for name in TERMINATING_SIGNALS if hasattr(signal, name)]
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in signals}
    try:
        yield held
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def worker_processes() -> Iterator[None]:
    """For a block that forks worker processes (``multiprocessing`` pools): a Ctrl-C, which the
    terminal sends to every process of the job, interrupts this process only; the workers ignore it
    (no traceback from each) and, when the block ends with an error or an interrupt, the workers
    started in it that are still running are killed, so nothing waits on them."""
    import multiprocessing
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    previous = signal.getsignal(signal.SIGINT)

    def interrupt(signum: int, frame) -> None:
        if os.getpid() != owner:
            return  # a forked worker: the process that started it stops it
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt

    before = set(multiprocessing.active_children())
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    except BaseException:
        started = [p for p in multiprocessing.active_children() if p not in before]
        for p in started:
            with contextlib.suppress(OSError, ValueError):
                p.kill()
        for p in started:
            with contextlib.suppress(OSError, ValueError):
                p.join(5)
        raise
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def add_build_options(parser: argparse.ArgumentParser, *, work: str, result: str) -> None:
    """The options of a command that builds a dataset folder with :func:`staged_output` and worker
    processes: --out, --overwrite, --workers (None when not given: the caller picks the machine's
    cores) and --no-progress. ``work`` says what the workers do ("rendering conversations"),
    ``result`` what stays the same whatever their number ("the rows are")."""
    parser.add_argument("--out", required=True, help="output folder (must be empty or new unless --overwrite)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the dataset in --out once the new one is complete (a folder holding other files is refused)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"processes {work} (default: this machine's cores); {result} the same for any",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def worker_count(requested: int | None) -> tuple[int, str | None]:
    """The worker processes a build runs: ``requested`` (None: the cores this process may run on), at
    most those cores, and a note saying so when it asked for more (more processes than cores only
    share the same cores, and each holds its own copy of the tokenizer)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if requested is None:
        return cores, None
    if requested > cores:
        return cores, f"--workers {requested} is more than this machine's {cores} core(s): using {cores}"
    return requested, None


INTERRUPTED = 130  # a command's exit status after a Ctrl-C, as a shell reports one


def interrupted(out: str | os.PathLike) -> str:
    """The one line a build prints when a Ctrl-C stopped it (its staging folder is gone by then)."""
    return f"interrupted; nothing was written, {out} is as it was"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_partials(out: Path) -> None:
    """The ``.NAME.partial-PID`` folders that killed runs (PID gone) left beside ``out``."""
    if not out.parent.is_dir():
        return
    for path in out.parent.glob(f".{out.name}.partial-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


OUTPUT_MARKER = ".bridge_recipes_output"  # in every folder staged_output wrote: the one kind --overwrite replaces


def replace_problem(out: str | os.PathLike, *, option: str = "--out") -> str | None:
    """Why the folder ``out`` (given as ``option``) may never be replaced whole, or None: it is the
    current folder or one above it (replacing one pulls the folder out from under the shell)."""
    target = Path(os.path.abspath(Path(out).expanduser())).resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        where = "the current folder" if target == cwd else "a folder above the current folder"
        return (
            f"{option} {out} is {where}; a command replaces its {option} folder whole: "
            f"give a new folder, e.g. {option} {Path(out) / 'out'}"
        )
    return None


def written_here(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` was written by :func:`staged_output` (it holds :data:`OUTPUT_MARKER`)."""
    return (Path(folder) / OUTPUT_MARKER).is_file()


def folder_output_problem(
    out: str | os.PathLike,
    overwrite: bool = False,
    *,
    inputs: Iterable[Input] = (),
    option: str = "--out",
    what: str | None = None,
) -> str | None:
    """Why :func:`staged_output` would refuse ``out`` as ``option``, or None: for a command to check
    before it does any work. ``what`` names the folder in the message when it is not ``option`` itself
    (a folder written beside it: "the adapter folder DIR beside --out"). A folder of the user's is
    named as such at once: ``--overwrite`` is suggested only for a folder the tool wrote."""
    path = Path(out).expanduser().absolute()
    what = what or f"{option} {path}"
    if problem := replace_problem(out, option=option) or overlap_problem(out, option=option, inputs=inputs, what=what):
        return problem
    if path.exists() and not path.is_dir():
        return f"{what} is a file; choose another {option} (a folder)"
    entries = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if entries and not written_here(path):
        return (
            f"{what} is not empty: it holds files this tool did not write ({', '.join(entries[:5])}; no "
            f"{OUTPUT_MARKER} inside), and --overwrite replaces only a folder the tool wrote itself: move them "
            f"away, or choose another {option}"
        )
    if entries and not overwrite:
        return f"{what} is not empty (an earlier output of this tool); pass --overwrite to replace it"
    return None


@contextlib.contextmanager
def staged_output(
    out: str | os.PathLike,
    overwrite: bool = False,
    *,
    error: type[Exception] = OSError,
    inputs: Iterable[Input] = (),
) -> Iterator[Path]:
    """A temporary folder next to ``out``, renamed to ``out`` when the block succeeds.

    An existing non-empty ``out`` is refused unless ``overwrite`` and it holds the marker this
    function leaves in every folder it writes (:data:`OUTPUT_MARKER`): a folder of the user's is
    never replaced, nor the current folder, one above it, or one holding an input (``inputs``, see
    :func:`overlap_problem`). The old folder is kept until the new one is complete, and swapped out
    by two renames. On any failure the temporary folder (and parent folders made for it) are
    removed: nothing is left behind. A refusal is raised as ``error`` (the caller's own error type,
    which its command line reports)."""
    if problem := folder_output_problem(out, overwrite, inputs=inputs):
        raise error(problem)
    out = Path(out).expanduser().absolute()
    made, parent = [], out.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"cannot write under {parent} (read-only or no permission); choose another --out")
    _remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise error(f"cannot create {tmp}: {e.strerror}; choose another --out") from None
    try:
        yield tmp
        (tmp / OUTPUT_MARKER).write_text("written by bridge_recipes: --overwrite may replace this folder\n")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made:  # innermost first
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def file_sha256(path: str | os.PathLike, chunk: int = 16 * 2**20) -> str:
    """SHA-256 of a file's bytes, read ``chunk`` bytes at a time."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            hasher.update(block)
    return hasher.hexdigest()
