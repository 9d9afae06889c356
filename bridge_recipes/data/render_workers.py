"""The worker processes that render conversations ahead of the packer (:func:`prepared`), handing the
results back in the records' order so the rows are the same whatever the number of workers, and the
error that stops a build when the work fails in a way no skip reason covers. The image dataset
builder (``bridge_recipes.vl.vl_dataset``) runs its per-conversation work through them too.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

from bridge_recipes.chat.conversations import JsonlSource, ParquetSource
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.utils.outputs import worker_count, worker_processes

WORK_CHUNK = 64  # conversations a worker renders per task
CHUNKS_AHEAD = 4  # tasks in flight per worker: the bound on what is read ahead of the packer


_WORK: Callable | None = None  # the forked workers' per-conversation function (inherited, never pickled)


def _work_chunk(chunk: list[tuple[int, Any]]) -> list[Any]:
    assert _WORK is not None
    return [_work_one(_WORK, index, raw) for index, raw in chunk]


def _work_one(work: Callable, index: int, raw: Any) -> Any:
    try:
        return work(index, raw)
    except Exception as e:  # handed back as text: an exception that cannot be pickled would stall the pool
        raise WorkerError(index, f"{type(e).__name__}: {e}") from None


class WorkerError(RuntimeError):
    """A conversation the rendering failed on in a way no skip reason covers (a bug, not bad data)."""

    def __init__(self, index: int, detail: str):
        super().__init__(f"source row {index}: {detail}")
        self.index, self.detail = index, detail

    def __reduce__(self):
        return type(self), (self.index, self.detail)


def default_workers() -> int:
    """The cores this process may run on."""
    return worker_count(None)[0]


def prepared(
    records: Iterator[tuple[int, Any]], work: Callable, workers: int, chunk: int | None = None
) -> Iterator[tuple[int, Any]]:
    """``(index, work(index, raw))`` for each record, in the records' order, ``workers`` processes
    rendering ahead of the packer: chunks of ``chunk`` (:data:`WORK_CHUNK`) conversations, at most
    :data:`CHUNKS_AHEAD` per worker in flight (memory bounded whatever the input's size). The workers
    are forked: they inherit the tokenizer and template instead of loading them again. One worker, or a
    platform without fork, renders in this process. A Ctrl-C stops the workers quietly
    (:func:`~bridge_recipes.utils.outputs.worker_processes`)."""
    global _WORK
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for index, raw in records:
            yield index, _work_one(work, index, raw)
        return
    _WORK = work
    pending: deque = deque()
    try:
        with worker_processes():
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_start)
            try:

                def drain(limit: int) -> Iterator[tuple[int, Any]]:
                    while len(pending) > limit:
                        indices, result = pending.popleft()
                        yield from zip(indices, result.get())

                while part := list(islice(records, chunk or WORK_CHUNK)):
                    pending.append(([index for index, _ in part], pool.apply_async(_work_chunk, (part,))))
                    yield from drain(CHUNKS_AHEAD * workers)
                yield from drain(0)
                # at the end of the work the workers take their end marker and exit: no signal is sent, since a
                # SIGTERM reaching a worker just forked can be lost, and Pool.terminate() then waits on it forever
                pool.close()
                pool.join()
            finally:
                # an error, an early stop or a Ctrl-C: no new work, and the chunks in flight (at most
                # CHUNKS_AHEAD per worker) finish before the workers take their end marker. Terminating would
                # send SIGTERM, which can end a worker while it holds the result queue's lock and leave the
                # pool's threads waiting on that lock forever. After a normal end both calls return at once.
                pool.close()
                pool.join()
    finally:
        _WORK = None


def _worker_start() -> None:
    """A worker process ends on SIGTERM at once: the command's own handler (which turns SIGTERM into a
    cleanup in the main process) has nothing to clean up in a worker."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def _stop_on_worker_error(reader: JsonlSource | ParquetSource) -> Iterator[None]:
    """A rendering failure no skip reason covers stops the build, naming the record (the staging folder
    goes with it, so nothing half-written is left)."""
    try:
        yield
    except WorkerError as e:
        raise SftRowsError(
            f"{getattr(reader, 'path', 'the input')}, {reader.location(e.index)}: {e.detail}; the build stopped and "
            "wrote nothing "
            "(remove or fix that record, and report the error if the record is valid)"
        ) from None
