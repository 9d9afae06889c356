"""The errors of an SFT rows build: bad input that stops it, and a conversation it skips.

A leaf module: the sources, the record formats and the renderers all raise these, and import
nothing else of the library to do so.
"""

from __future__ import annotations


class SftRowsError(Exception):
    """Bad input to a build (missing file, unusable tokenizer, output folder in use, ...)."""


class MalformedConversation(ValueError):
    """A source conversation that cannot be rendered; ``index`` is its source row index."""

    def __init__(self, index: int | None, reason: str, detail: str, size: int = 0):
        self.index = index
        self.reason = reason
        self.detail = detail
        self.size = size  # bytes of a conversation skipped unread for its size (0: read)
        where = f"source row {index}" if index is not None else "conversation"
        super().__init__(f"{where}: {detail} [{reason}]")

    def at(self, where: str) -> str:
        """The message with the record named as a reader counts it (``line 12``: from 1, as an editor does)."""
        return f"{where}: {self.detail} [{self.reason}]"

    def __reduce__(self):  # rebuilt from its fields when a worker process hands it back
        return type(self), (self.index, self.reason, self.detail, self.size)
