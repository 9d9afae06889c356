"""Writing rows to Parquet, hashed as they are written, and the life of a build's output folder:
one build at a time into it, staged beside it, put in place whole (:func:`staged_build`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data.integrity import CU_COLUMN, MANIFEST_FILE, ROWS_FILE, VAL_DIR, update_rows_hash
from bridge_recipes.utils.outputs import held_signals, pid_alive, replace_problem

PARQUET_COMPRESSION = "zstd"
ROWS_PER_BATCH = 128  # rows per Parquet row group: ~5 MB in memory at 8,192 tokens


class RowWriter:
    """Writes rows to Parquet in batches (one row group each) and hashes them as they go."""

    SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])
    SCHEMA_BOUNDARIES = SCHEMA.append(pa.field(CU_COLUMN, pa.list_(pa.int32())))

    def __init__(self, path: Path, row_tokens: int, rows_per_batch: int = ROWS_PER_BATCH, boundaries: bool = False):
        self.row_tokens = row_tokens
        self.rows_per_batch = rows_per_batch
        self.schema = self.SCHEMA_BOUNDARIES if boundaries else self.SCHEMA
        self._writer = pq.ParquetWriter(path, self.schema, compression=PARQUET_COMPRESSION)
        self._batch: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._hasher = hashlib.sha256()
        self.rows = 0
        self.supervised_tokens = 0

    def add(self, ids: np.ndarray, mask: np.ndarray, cu: np.ndarray | None = None) -> None:
        assert len(ids) == len(mask) == self.row_tokens, "rows are cut to exactly row_tokens"
        assert (cu is not None) == (self.schema is self.SCHEMA_BOUNDARIES), "boundaries rows carry cu_seqlens"
        update_rows_hash(self._hasher, ids, mask, cu)
        self._batch.append((ids, mask, cu))
        self.rows += 1
        self.supervised_tokens += int(mask.sum(dtype=np.int64))
        if len(self._batch) >= self.rows_per_batch:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def abandon(self) -> None:
        """Close after an error, raising nothing: the file is half-written and goes with the staging folder."""
        self._batch = []
        with contextlib.suppress(Exception):
            self._writer.close()

    @property
    def rows_sha256(self) -> str:
        return self._hasher.hexdigest()

    def _flush(self) -> None:
        if not self._batch:
            return
        offsets = pa.array(np.arange(len(self._batch) + 1, dtype=np.int32) * self.row_tokens)
        ids = pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[0] for r in self._batch]), pa.int32()))
        mask = pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[1] for r in self._batch]), pa.uint8()))
        columns = [ids, mask]
        if self.schema is self.SCHEMA_BOUNDARIES:
            cus = [r[2] for r in self._batch]
            cu_offsets = pa.array(np.concatenate([[0], np.cumsum([len(c) for c in cus])]).astype(np.int32))
            columns.append(pa.ListArray.from_arrays(cu_offsets, pa.array(np.concatenate(cus), pa.int32())))
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self._batch = []


DATASET_ENTRIES = {ROWS_FILE, MANIFEST_FILE, VAL_DIR}  # what a build writes into its --out folder
_STAGE = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def output_folder(out_dir: str | os.PathLike, *, error: type[Exception] = SftRowsError) -> Path:
    """``--out`` as the absolute folder a build replaces, or ``error`` saying why it cannot be one.

    A link to a folder stands for that folder (the link is kept); a link to nothing is refused, as
    are the current folder and the folders above it (replacing one would pull the folder out from
    under the shell that runs the build)."""
    given = Path(out_dir).expanduser()
    out = Path(os.path.abspath(given))
    if out.is_symlink():
        if not out.exists():
            raise error(
                f"--out {out_dir} is a link to {os.readlink(out)}, which does not exist; create that folder, "
                "or give another --out"
            )
        out = out.resolve()
    if problem := replace_problem(out_dir):
        raise error(problem)
    return out


def check_output_dir(
    out_dir: Path,
    overwrite: bool,
    *,
    ours: Callable[[str], bool] = DATASET_ENTRIES.__contains__,
    described: str = f"its {ROWS_FILE}, {MANIFEST_FILE} and {VAL_DIR}/",
    error: type[Exception] = SftRowsError,
) -> set[str]:
    """Refuse an output that is a file, or a folder that is not empty (without --overwrite) or
    that holds anything a build did not write (with it: those files are the user's). ``ours``
    tells a build's entries by name; ``described`` names them in the message. Returns the
    folder's entries, which the build may replace."""
    if out_dir.exists() and not out_dir.is_dir():
        raise error(f"output {out_dir} exists and is not a folder")
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not overwrite:
        raise error(f"output folder {out_dir} is not empty; pass --overwrite (overwrite=True) to replace {described}")
    foreign = [e for e in entries if not ours(e)]
    if foreign:
        raise error(
            f"output folder {out_dir} holds files a build did not write ({', '.join(foreign[:5])}); "
            "--overwrite replaces the whole folder, so move them away or choose another --out"
        )
    return set(entries)


def lock_path(out_dir: Path) -> Path:
    """The lock file of the builds into ``out_dir``: ``.NAME.lock`` beside it, holding the build's PID."""
    return out_dir.parent / f".{out_dir.name}.lock"


class OutputLock:
    """One build at a time into an output folder: an exclusive ``flock`` on :func:`lock_path`.

    The kernel releases the lock when its process dies, so a killed build's lock file is taken
    over by the next build; the file is removed when the build ends."""

    def __init__(self, out_dir: Path, error: type[Exception] = SftRowsError):
        self.path = lock_path(out_dir)
        self.out_dir = out_dir
        self.error = error
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise self.error(
                    f"--out {self.out_dir} is being written by another build (pid {holder}, lock {self.path}); "
                    "wait for it to finish, or give another --out"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:  # the previous holder removed it as we opened it
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # still held: a build that opens it now finds it gone and starts over
        os.close(self._fd)
        self._fd = None


def _remove_unheld_lock(path: Path) -> bool:
    """Remove a lock file no running build holds (one a killed build left)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    else:
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def clean_stale_stages(out_dir: Path) -> list[str]:
    """Remove what killed builds left beside ``out_dir``; returns what was done.

    A build stages into ``.NAME.tmp-PID`` beside ``out_dir`` and, when replacing a dataset,
    parks the old one as ``.NAME.old-PID`` for the instant between two renames. For a PID
    that is no longer running: a ``tmp`` folder is removed; an ``old`` folder is put back
    as ``out_dir`` if ``out_dir`` is missing (the kill fell between the renames), else removed.
    A lock file no build holds goes too.
    """
    done = []
    parent = out_dir.parent
    if not parent.is_dir():
        return done
    for path in sorted(parent.iterdir()):
        m = _STAGE.match(path.name)
        if not m or m["name"] != out_dir.name or pid_alive(int(m["pid"])):
            continue
        if m["kind"] == "old" and not out_dir.exists():
            os.replace(path, out_dir)
            done.append(f"restored {out_dir} from {path.name}")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path}")
    if lock_path(out_dir).exists() and _remove_unheld_lock(lock_path(out_dir)):
        done.append(f"removed {lock_path(out_dir)}")
    return done


def stage_dir(out_dir: Path, error: type[Exception] = SftRowsError) -> Path:
    """A fresh staging folder beside ``out_dir`` (same file system, so renames are atomic)."""
    stage = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir(parents=True)
    except OSError as e:
        raise error(
            f"cannot create the output folder's parent {out_dir.parent} ({e.strerror or e}); choose a writable --out"
        ) from None
    return stage


def publish(stage: Path, out_dir: Path) -> None:
    """Put a complete staged dataset in place of ``out_dir``; the old one stays until then."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(stage, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(stage, out_dir)


def _kept_beside(stage: Path, out_dir: Path) -> Path:
    """Move a finished dataset that cannot replace ``out_dir`` to ``NAME.new`` (``NAME.new-2``, ...) beside it."""
    for n in range(1, 1000):
        kept = out_dir.parent / (f"{out_dir.name}.new" + (f"-{n}" if n > 1 else ""))
        if not os.path.lexists(kept):
            os.rename(stage, kept)
            return kept
    raise FileExistsError(f"{out_dir}.new-999")


class StagedBuild:
    """A build's staging folder (``stage``) and its publication in place of ``out``."""

    def __init__(self, out: Path, stage: Path, expected: set[str], ours: Callable[[str], bool], error, log):
        self.out, self.stage, self.expected, self.ours, self.error, self.log = out, stage, expected, ours, error, log

    def changed(self) -> list[str]:
        """What is in ``out`` now that the build did not find there (or cannot replace)."""
        if os.path.islink(self.out) or (self.out.exists() and not self.out.is_dir()):
            return [self.out.name]
        entries = sorted(p.name for p in self.out.iterdir()) if self.out.is_dir() else []
        return [e for e in entries if e not in self.expected or not self.ours(e)]

    def publish(self) -> None:
        """Rename the staged dataset into place, unless ``out`` gained something while the build ran: then
        nothing in it is touched, the dataset is kept as ``NAME.new`` beside it, and ``error`` says so.
        Signals wait for the renames (a Ctrl-C then finds the dataset complete)."""
        foreign = self.changed()
        if foreign:
            kept = _kept_beside(self.stage, self.out)
            raise self.error(
                f"--out {self.out} changed while the build ran (it now holds {', '.join(foreign[:5])}); it was left "
                f"as it is, and the new dataset is in {kept}: move it where you want it, or build again"
            )
        with held_signals() as held:
            publish(self.stage, self.out)
        if held:
            self.log.warning("interrupted as the dataset was put in place; %s is complete", self.out)


@contextlib.contextmanager
def staged_build(
    out: Path,
    overwrite: bool,
    *,
    log: logging.Logger,
    ours: Callable[[str], bool] = DATASET_ENTRIES.__contains__,
    described: str = f"its {ROWS_FILE}, {MANIFEST_FILE} and {VAL_DIR}/",
    error: type[Exception] = SftRowsError,
) -> Iterator[StagedBuild]:
    """The life of a build into ``out`` (from :func:`output_folder`): one build at a time
    (:class:`OutputLock`), leftovers of killed builds cleaned, the folder checked, a staging folder
    beside it, removed whatever happens; :meth:`StagedBuild.publish` puts the dataset in place. A
    file system error (a full disk, a folder that turned read-only) becomes ``error``, naming the path."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create {e.filename or out.parent} ({e.strerror or e}); choose a writable --out") from None
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise error(f"cannot write under {out.parent} (read-only or no permission); choose another --out")
    lock = OutputLock(out, error)
    lock.acquire()
    stage = None
    try:
        for note in clean_stale_stages(out):
            log.warning("%s (left by a build that did not finish)", note)
        expected = check_output_dir(out, overwrite, ours=ours, described=described, error=error)
        stage = stage_dir(out, error=error)
        try:
            yield StagedBuild(out, stage, expected, ours, error, log)
        except OSError as e:
            raise error(file_system_problem(e, out)) from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        lock.release()


def file_system_problem(e: OSError, out: Path) -> str:
    """An OSError met while building ``out``, in a line: the path, the reason, the fix."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or any(
        words in str(e) for words in ("No space left", "File too large", "quota exceeded")
    ):
        why = {errno.EFBIG: "the file system refused a file this large", errno.EDQUOT: "the disk quota is used up"}
        return (
            f"{why.get(e.errno or 0, 'no space left on the device')}{where} while building {out} ({e.strerror or e}); "
            f"free some space (or give an --out on another disk) and build again; nothing was written, {out} is "
            "as it was"
        )
    return f"{e.strerror or e}{where} while building {out}; nothing was written, {out} is as it was"
