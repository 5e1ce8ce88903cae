"""Files a long-running coordinator writes, so that a crash or a full disk never leaves half of
one: a whole file through a temporary file and a rename, an append truncated back when it fails."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, TextIO

__all__ = ["write_atomically", "write_bytes_atomically", "appending", "rewriting"]


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader, a crash or a full
    disk never leaves half a file (the earlier one stays whole)."""
    with rewriting(path, newline=None) as fh:
        fh.write(text)


def write_bytes_atomically(path: Path, payload: bytes) -> None:
    """``payload`` into ``path`` through a synced temporary file and a rename (a checkpoint: the
    earlier file stays whole whatever happens while it is written)."""
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:  # a full disk: no half-written temporary file left
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def rewriting(path: Path, newline: str | None = "") -> Iterator[TextIO]:
    """A text file that replaces ``path`` only once it is whole (a temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline=newline) as fh:
            yield fh
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def appending(path: Path, newline: str | None = "") -> Iterator[TextIO]:
    """``path`` opened for appending; when a write fails (a full disk) the file is truncated back
    to what it held before, so no half row or half line stays, and the error propagates."""
    size = path.stat().st_size if path.exists() else 0
    fh = open(path, "a", newline=newline)  # noqa: SIM115 - closed below, and truncated back when a write fails
    try:
        yield fh
        fh.close()  # the buffered rest is written here: a full disk says so now
    except BaseException:
        with contextlib.suppress(OSError):
            fh.close()
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise
